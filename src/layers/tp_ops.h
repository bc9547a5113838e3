/* What the tensor-parallel shard layers share (Megatron's split of a Transformer; tp_ops.c): the
 * group check and its all-reduce, and the attention sublayer, whole or on a shard's heads (qkv
 * column-parallel: no communication forward; output projection row-parallel: an all-reduce of
 * its output forward, and the all-reduce of the input's gradient after the qkv backward). The
 * softmax cross-entropy over a vocabulary split by shard comes with it (loss_shard.h), for the
 * pipeline's last stage. */
#ifndef GP_LAYERS_TP_OPS_H
#define GP_LAYERS_TP_OPS_H

#include "layers/loss_shard.h"
#include "layers/transformer_ops.h"

/* The call's tensor-parallel group, which a shard of nshards needs: GP_INVALID_ARGUMENT naming
 * the layer when it has none or one of another size. */
gp_status gp_tp_group(const gp_layer *l, const gp_ctx *c, int nshards, const gp_coll_group **out);
/* The checks every call of a layer that may be a shard makes first: its parameters (and their
 * gradients in backward), the call's group (a shard's, gp_tp_group; NULL for a whole layer)
 * and in backward the slot `saved` that forward fills (-1: forward). */
gp_status gp_tp_begin(const gp_layer *l, const gp_ctx *c, int saved, bool shard, int nshards,
                      const gp_coll_group **g);
/* g's all-reduce of x (n floats on dev), the error naming the layer. */
gp_status gp_tp_allreduce(const gp_layer *l, const gp_coll_group *g, gp_device *dev, float *x,
                          int64_t n, gp_reduce_op op);

/* A row-parallel projection's output on shard g->rank: y (N, C) = [res +] drop(all-reduce(x W^T)
 * + b), x (N, in) the shard's part of the input features, w (C, in) its columns, b (C) whole;
 * the same bits on every shard. res must not alias y. g NULL: the whole projection's output.
 * x in bf16 instead: x16 not NULL; w's bf16 copy: w16 not NULL (kernel_ops.def). */
gp_status gp_tp_row_output(const gp_layer *l, const gp_coll_group *g, gp_device *dev,
                           int64_t N, int64_t in, int64_t C, const float *x,
                           const uint16_t *x16, const float *w, const uint16_t *w16,
                           const float *b, const float *res, const gp_rng_stream *drop, float p,
                           float *y);
/* The multi-head attention sublayer (qkv projection, causal core, output projection,
 * optional dropout at the caller's stream), whole (g NULL: d holds every head, C = d->dim) or
 * on one shard of g: d holds the shard's heads (dim = C / T, heads = H / T) and C the whole
 * width; w: wqkv (3 C/T, C) and bqkv (3 C/T) the shard's rows of q, k and v, wproj (C, C/T) its
 * columns, bproj (C) whole (replicated; added once, see gp_tp_row_output).
 * y (B, T, C) = [res +] drop(all-reduce(att Wproj^T) + bproj), every shard the same bits; res
 * must not alias y. Without a group the same kernel calls, less the all-reduces. The input x,
 * or x16 in bf16 when not NULL; att written in bf16 where sv->att16 is not NULL. */
gp_status gp_mha_forward(const gp_layer *l, const gp_coll_group *g, gp_device *dev,
                         const gp_attn_dims *d, int64_t C, const gp_mha_weights *w,
                         const float *x, const uint16_t *x16, const float *res, const gp_rng_stream *drop, float p,
                         const gp_mha_saved *sv, float *y);
/* A layer's saved bytes on dev from its cost's, which count attention's B H T T probabilities:
 * those replaced by what dev's attention keeps (kernel op attention_saved). */
uint64_t gp_mha_saved_bytes(gp_device *dev, const gp_attn_dims *d, uint64_t cost_saved);
/* Workspace floats gp_mha_backward_part needs on dev. */
int64_t gp_mha_backward_ws(gp_device *dev, const gp_attn_dims *d, int64_t C, bool dropout);
/* dy (B, T, C), the same on every shard -> dx (B, T, C) written when not NULL (all-reduced over
 * the shards: the whole input gradient); weight gradients added (a shard's own, and the
 * replicated bproj's, every shard the same); ws: gp_mha_backward_ws floats, not overlapping dy
 * or dx. In parts (gp_bwd_part): INPUT writes dx, adds the qkv bias gradient (and a shard's
 * bproj's) and copies what WEIGHT's two projection products read into keep_da (N, C: the
 * gradient at the projection's output, after dropout) and keep_dqkv (N, 3 C/T); WEIGHT adds
 * them (dy, ws, dx unused). INPUT then WEIGHT adds the bits of GP_BWD_ALL. x (or x16): the
 * forward's input. */
gp_status gp_mha_backward_part(const gp_layer *l, const gp_coll_group *g, gp_device *dev,
                               const gp_attn_dims *d, int64_t C, const gp_mha_weights *w,
                               const float *x, const uint16_t *x16, const gp_mha_saved *sv, const gp_rng_stream *drop,
                               float p, const float *dy, float *ws, float *dx, gp_bwd_part part,
                               float *keep_da, float *keep_dqkv);
/* Forward and backward FLOPs of the sublayer (a shard's: the whole one's over T, the output
 * bias and dropout on the whole width), for the cost models. */
void gp_mha_flops(const gp_attn_dims *d, int64_t C, float p, double *fwd, double *bwd);

#endif
