/* The one forward and backward of a pre-LayerNorm GPT block, which the whole block
 * (transformer_block.c) and its tensor-parallel shard (transformer_block_tp.c) both run:
 *   h = x + drop0(attn(ln1(x)));  y = h + drop1(proj(gelu(fc(ln2(h))))).
 * A shard holds H/T heads and d_ff/T hidden units; where its products are partial it
 * all-reduces over its group (after each row-parallel projection forward, after the
 * column-parallel fc's and qkv's input gradients backward), and nowhere else does it differ. */
#ifndef GP_LAYERS_BLOCK_SKELETON_H
#define GP_LAYERS_BLOCK_SKELETON_H

#include "layers/tp_ops.h"

typedef struct gp_block_impl {
    int dim, heads, d_ff; /* the whole block's */
    float dropout;
    int nshards; /* 1 for the whole block */
    bool shard;  /* runs in a tensor-parallel group of nshards (even of 1) and all-reduces */
} gp_block_impl;

/* Parameter indices, in the order the public names list them (at shard shapes in a shard). */
enum {
    GP_BLK_LN1_W, GP_BLK_LN1_B, GP_BLK_QKV_W, GP_BLK_QKV_B, GP_BLK_PROJ_W, GP_BLK_PROJ_B,
    GP_BLK_LN2_W, GP_BLK_LN2_B, GP_BLK_FC_W, GP_BLK_FC_B, GP_BLK_MLP_W, GP_BLK_MLP_B
};

/* A layer of ops with impl *p (copied) and the twelve parameters at its shard's shapes (qkv's
 * rows and the attention projection's columns over nshards, fc's rows and the MLP
 * projection's columns too); p's sizes are the caller's to check. NULL with the error set. */
gp_layer *gp_block_new(const gp_layer_ops *ops, const gp_block_impl *p);

/* The members of both layers' ops tables, and their initializers in a gp_layer_ops. */
gp_status gp_block_out_shape(const gp_layer *l, const gp_shape *in, gp_dtype dtype,
                             gp_shape *out);
gp_cost gp_block_cost(const gp_layer *l, const gp_shape *in);
uint64_t gp_block_saved_bytes(const gp_layer *l, gp_device *dev, const gp_shape *in);
uint64_t gp_block_workspace(const gp_layer *l, gp_device *dev, const gp_shape *in,
                            bool input_grad);
gp_status gp_block_forward(gp_layer *l, gp_ctx *c, const gp_tensor *x, gp_tensor *y);
gp_status gp_block_backward(gp_layer *l, gp_ctx *c, const gp_tensor *dy, gp_tensor *dx);
gp_status gp_block_backward_part(gp_layer *l, gp_ctx *c, const gp_tensor *dy, gp_tensor *dx,
                                 gp_bwd_part part);
#define GP_BLOCK_OPS                                                                               \
    .kind = "transformer_block", .out_shape = gp_block_out_shape, .cost = gp_block_cost,           \
    .workspace_bytes = gp_block_workspace, .saved_bytes = gp_block_saved_bytes,                    \
    .forward = gp_block_forward,                                                                   \
    .backward = gp_block_backward, .backward_part = gp_block_backward_part

#endif
