/* What the Transformer family's layers share: the attention sublayer's weights and saved
 * tensors, the MLP's weight products, the cost model of the attention core, dropout streams,
 * and small helpers (input checks naming the layer). */
#ifndef GP_LAYERS_TRANSFORMER_OPS_H
#define GP_LAYERS_TRANSFORMER_OPS_H

#include <stdint.h>

#include "kernels/kernels.h"
#include "layers/layer_base.h"

/* ---- dropout: the stream of dropout site `site` of the layer at `layer_index` for one call;
 * the mask is regenerated from it in backward (the kernels' dropout op). */
gp_rng_stream gp_op_dropout_stream(uint64_t seed, int layer_index, int site, uint32_t step,
                                   uint32_t micro_batch);

/* ---- cost model of causal attention */

/* FLOPs of the attention core's forward matrix products as the CPU kernel computes them (its
 * causal blocking of 64 query rows skips most of the masked triangle); backward does twice
 * this. */
double gp_op_attention_gemm_flops(const gp_attn_dims *d);

/* ---- the multi-head attention sublayer's weights and saved tensors (its ops: tp_ops.h) */

typedef struct gp_mha_weights {
    const float *wqkv, *bqkv, *wproj, *bproj; /* (3C, C), (3C), (C, C), (C) */
    const uint16_t *wqkv16, *wproj16;         /* their bf16 copies, or NULL (GP_PVAL16) */
    float *gwqkv, *gbqkv, *gwproj, *gbproj;   /* their gradients, added into */
} gp_mha_weights;

/* What forward keeps for backward. */
typedef struct gp_mha_saved {
    float *qkv;   /* (B, T, 3C) */
    float *probs; /* the device's attention_saved floats (the CPU's: (B, H, T, T)) */
    float *att;   /* (B, T, C), or */
    uint16_t *att16; /* in bf16 (kernel_ops.def) when not NULL */
} gp_mha_saved;

/* A Transformer block's MLP weight products, its split backward's WEIGHT part: dW_out (C, F)
 * += dmo^T g with dmo = drop(dy) rebuilt in ws (N C floats) when drop is not NULL, db_out += the
 * column sums of dmo when gb_out is not NULL (a shard adds them in its input part), and
 * dW_fc (F, C) += du^T ln2 from the gradient du (N, F) its input part kept. The same kernel calls
 * as the whole backward's. g and ln2 in fp32, or in bf16 (g16, ln2_16 when not NULL); the
 * weights' bf16 copies w_out16, w_fc16 where not NULL (kernel_ops.def's w16). */
gp_status gp_op_mlp_backward_weight(gp_device *dev, int64_t N, int64_t C, int64_t F,
                                   const float *g, const uint16_t *g16, const float *ln2,
                                   const uint16_t *ln2_16, const float *w_out,
                                   const uint16_t *w_out16, const float *w_fc,
                                   const uint16_t *w_fc16, const gp_rng_stream *drop, float p,
                                   const float *dy, const float *du, float *ws, float *gw_out,
                                   float *gb_out, float *gw_fc);

/* ---- helpers shared by the layers of this family (transformer_ops.c) */

/* Checks a float32 input of 2 to 4 dimensions whose last one is `last`
 * (named `what` in the message); *rows = product of the other dimensions. */
gp_status gp_tl_rows(const gp_layer *l, const gp_shape *in, gp_dtype dtype, int64_t last,
                     const char *what, int64_t *rows);
/* Checks a float32 (B, T, C) input with C = dim; *out = *in. */
gp_status gp_tl_seq_shape(const gp_layer *l, const gp_shape *in, gp_dtype dtype, int64_t dim,
                          gp_shape *out);
/* The heads one of nshards holds of a (B, T, dim) input with `heads` heads: dim / nshards,
 * heads / nshards (all of them for nshards = 1). */
gp_attn_dims gp_tl_attn_dims(const gp_shape *in, int dim, int heads, int nshards);
/* The stream of dropout site `site` of l for this call in *s, or NULL when p is 0 or the call
 * does not train. A shard's is its whole layer's: the masks do not depend on the shards. */
const gp_rng_stream *gp_tl_dropout(const gp_layer *l, const gp_ctx *c, float p, int site,
                                   gp_rng_stream *s);

#endif
