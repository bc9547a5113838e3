/* What the Transformer family's layers share: the MLP's weight products, the attention core's
 * FLOPs, dropout streams and the input-rows check (the attention sublayer is in tp_ops.c). */
#include "layers/transformer_ops.h"

/* The CPU kernel's causal blocking (kernels/cpu/attention_kernels.c), which the FLOP count of
 * the cost model follows. */
#define ATTN_COST_BLOCK 64

gp_status gp_tl_rows(const gp_layer *l, const gp_shape *in, gp_dtype dtype, int64_t last,
                     const char *what, int64_t *rows) {
    char buf[96];
    GP_TRY(gp_expect_dtype(l, dtype, GP_F32));
    if (in->ndim < 2 || in->ndim > 4)
        return gp_error(GP_SHAPE,
                        "layer %d (%s): input shape %s has %d dimensions, expected 2 to 4 "
                        "(batch, ..., %s = %lld)",
                        l->index, l->ops->kind, gp_shape_str(in, buf, sizeof buf), in->ndim, what,
                        (long long)last);
    GP_TRY(gp_expect_dim(l, in, in->ndim - 1, last, what));
    int64_t r = 1;
    for (int i = 0; i < in->ndim - 1; i++) r *= in->dim[i];
    *rows = r;
    return GP_OK;
}

gp_status gp_tl_seq_shape(const gp_layer *l, const gp_shape *in, gp_dtype dtype, int64_t dim,
                          gp_shape *out) {
    GP_TRY(gp_expect_dtype(l, dtype, GP_F32));
    GP_TRY(gp_expect_ndim(l, in, 3, "(B, T, C)"));
    GP_TRY(gp_expect_dim(l, in, 2, dim, "C (dim)"));
    *out = *in;
    return GP_OK;
}

gp_attn_dims gp_tl_attn_dims(const gp_shape *in, int dim, int heads, int nshards) {
    return (gp_attn_dims){.batch = in->dim[0], .seq = in->dim[1], .dim = dim / nshards,
                          .heads = heads / nshards};
}

const gp_rng_stream *gp_tl_dropout(const gp_layer *l, const gp_ctx *c, float p, int site,
                                   gp_rng_stream *s) {
    if (!(p > 0.0f && c->run.training)) return NULL;
    *s = gp_op_dropout_stream(c->run.seed, l->index, site, c->run.step, c->run.micro_batch);
    return s;
}

gp_rng_stream gp_op_dropout_stream(uint64_t seed, int layer_index, int site, uint32_t step,
                                   uint32_t micro_batch) {
    return (gp_rng_stream){.seed = seed,
                           .purpose = GP_RNG_DROPOUT,
                           .a = (uint32_t)layer_index * 16u + (uint32_t)site,
                           .b = step,
                           .c = micro_batch};
}

gp_status gp_op_mlp_backward_weight(gp_device *dev, int64_t N, int64_t C, int64_t F,
                                   const float *g, const uint16_t *g16, const float *ln2,
                                   const uint16_t *ln2_16, const float *w_out,
                                   const uint16_t *w_out16, const float *w_fc,
                                   const uint16_t *w_fc16, const gp_rng_stream *drop, float p,
                                   const float *dy, const float *du, float *ws, float *gw_out,
                                   float *gb_out, float *gw_fc) {
    const gp_kernels *k = gp_kernels_of(dev);
    const float *dmo = dy;
    if (drop) {
        GP_TRY(k->dropout(dev, drop, p, N * C, dy, NULL, ws));
        dmo = ws;
    }
    GP_TRY(k->linear_backward(dev, N, F, C, g, g16, w_out, w_out16, dmo, NULL, gw_out, gb_out));
    return k->linear_backward(dev, N, C, F, ln2, ln2_16, w_fc, w_fc16, du, NULL, gw_fc, NULL);
}

/* ------------------------------------------------------- cost model */

double gp_op_attention_gemm_flops(const gp_attn_dims *d) {
    const double hd = (double)(d->dim / d->heads);
    double f = 0;
    for (int64_t r0 = 0; r0 < d->seq; r0 += ATTN_COST_BLOCK) {
        const int64_t r1 = r0 + ATTN_COST_BLOCK < d->seq ? r0 + ATTN_COST_BLOCK : d->seq;
        f += 2.0 * 2.0 * (double)(r1 - r0) * (double)r1 * hd; /* q k^T and P v */
    }
    return f * (double)d->batch * (double)d->heads;
}
