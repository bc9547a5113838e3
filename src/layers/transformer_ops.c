/* What the Transformer family's layers share: the attention sublayer composed from the device's
 * kernel ops, the attention cost model, dropout streams and the input-rows check. */
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

gp_rng_stream gp_op_dropout_stream(uint64_t seed, int layer_index, int site, uint32_t step,
                                   uint32_t micro_batch) {
    return (gp_rng_stream){.seed = seed,
                           .purpose = GP_RNG_DROPOUT,
                           .a = (uint32_t)layer_index * 16u + (uint32_t)site,
                           .b = step,
                           .c = micro_batch};
}

/* ------------------------------------------------- attention sublayer */

gp_status gp_op_mha_forward(gp_device *dev, const gp_attn_dims *d, const gp_mha_weights *w,
                            const float *x, const float *res, const gp_rng_stream *drop, float p,
                            const gp_mha_saved *sv, float *y) {
    const gp_kernels *k = gp_kernels_of(dev);
    const int64_t N = d->batch * d->seq, C = d->dim;
    GP_TRY(k->linear_forward(dev, N, C, 3 * C, x, w->wqkv, w->bqkv, NULL, sv->qkv));
    GP_TRY(k->attention_forward(dev, d, sv->qkv, sv->probs, sv->att));
    if (drop && p > 0.0f) {
        /* The projection goes to y first, then y = res + mask(y) in place. */
        GP_TRY(k->linear_forward(dev, N, C, C, sv->att, w->wproj, w->bproj, NULL, y));
        return k->dropout(dev, drop, p, N * C, y, res, y);
    }
    return k->linear_forward(dev, N, C, C, sv->att, w->wproj, w->bproj, res, y);
}

int64_t gp_op_mha_backward_ws(gp_device *dev, const gp_attn_dims *d, bool dropout) {
    const int64_t N = d->batch * d->seq, C = d->dim;
    /* datt (N, C) | dqkv (N, 3C) | the attention kernel's | da (N, C) with dropout */
    return N * 4 * C + gp_kernels_of(dev)->attention_backward_ws(dev, d) + (dropout ? N * C : 0);
}

gp_status gp_op_mha_backward_part(gp_device *dev, const gp_attn_dims *d, const gp_mha_weights *w,
                                  const float *x, const gp_mha_saved *sv,
                                  const gp_rng_stream *drop, float p, const float *dy, float *ws,
                                  float *dx, gp_bwd_part part, float *keep_da, float *keep_dqkv) {
    const gp_kernels *k = gp_kernels_of(dev);
    const int64_t N = d->batch * d->seq, C = d->dim;
    const bool in = part != GP_BWD_WEIGHT, wt = part != GP_BWD_INPUT;
    if (!in) {
        GP_TRY(k->linear_backward(dev, N, C, C, sv->att, w->wproj, keep_da, NULL, w->gwproj,
                                  w->gbproj));
        return k->linear_backward(dev, N, C, 3 * C, x, w->wqkv, keep_dqkv, NULL, w->gwqkv, NULL);
    }
    float *datt = ws;                  // (N, C)
    float *dqkv = datt + N * C;        // (N, 3C)
    float *attn_ws = dqkv + 3 * N * C; // the attention kernel's workspace
    const float *da = dy;
    if (drop && p > 0.0f) {
        float *buf = attn_ws + k->attention_backward_ws(dev, d); // (N, C)
        GP_TRY(k->dropout(dev, drop, p, N * C, dy, NULL, buf));
        da = buf;
    }
    GP_TRY(k->linear_backward(dev, N, C, C, sv->att, w->wproj, da, datt, wt ? w->gwproj : NULL,
                              wt ? w->gbproj : NULL));
    GP_TRY(k->attention_backward(dev, d, sv->qkv, sv->probs, datt, dqkv, w->gbqkv, attn_ws));
    GP_TRY(k->linear_backward(dev, N, C, 3 * C, x, w->wqkv, dqkv, dx, wt ? w->gwqkv : NULL, NULL));
    if (wt) return GP_OK;
    GP_TRY(gp_device_copy(dev, keep_da, da, (size_t)(N * C) * sizeof(float), GP_COPY_DEVICE_TO_DEVICE));
    return gp_device_copy(dev, keep_dqkv, dqkv, (size_t)(3 * N * C) * sizeof(float), GP_COPY_DEVICE_TO_DEVICE);
}

gp_status gp_op_mlp_backward_weight(gp_device *dev, int64_t N, int64_t C, int64_t F,
                                   const float *g, const float *ln2, const float *w_out,
                                   const float *w_fc, const gp_rng_stream *drop, float p,
                                   const float *dy, const float *du, float *ws, float *gw_out,
                                   float *gb_out, float *gw_fc) {
    const gp_kernels *k = gp_kernels_of(dev);
    const float *dmo = dy;
    if (drop) {
        GP_TRY(k->dropout(dev, drop, p, N * C, dy, NULL, ws));
        dmo = ws;
    }
    GP_TRY(k->linear_backward(dev, N, F, C, g, w_out, dmo, NULL, gw_out, gb_out));
    return k->linear_backward(dev, N, C, F, ln2, w_fc, du, NULL, gw_fc, NULL);
}

gp_status gp_op_mha_backward(gp_device *dev, const gp_attn_dims *d, const gp_mha_weights *w,
                             const float *x, const gp_mha_saved *sv, const gp_rng_stream *drop,
                             float p, const float *dy, float *ws, float *dx) {
    return gp_op_mha_backward_part(dev, d, w, x, sv, drop, p, dy, ws, dx, GP_BWD_ALL, NULL, NULL);
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

void gp_op_mha_flops(const gp_attn_dims *d, float p, double *fwd, double *bwd) {
    const double N = (double)(d->batch * d->seq), C = (double)d->dim;
    const double lin = 2.0 * N * C * 3.0 * C + 2.0 * N * C * C;
    const double core = gp_op_attention_gemm_flops(d);
    /* Softmax: ~8 operations per unmasked score forward (max, exp, sum,
     * scale), ~4 backward (dot, multiply-subtract). */
    const double scores = (double)(d->batch * d->heads) * (double)d->seq * (double)(d->seq + 1) / 2.0;
    const double drop = p > 0.0f ? 16.0 * N * C : 0.0;
    *fwd = lin + core + 8.0 * scores + 4.0 * N * C + drop;
    *bwd = 2.0 * lin + 2.0 * core + 4.0 * scores + 4.0 * N * C + drop;
}
