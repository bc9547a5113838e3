/* The attention sublayer, whole or on a shard's heads, the group's checked all-reduce, the
 * row-parallel output, and the sublayer's cost (see tp_ops.h). Collectives sit where Megatron
 * puts them: the output projection's partial products are added over the shards (shard 0's
 * carrying the bias, so that no shard adds it after), then dropout; the qkv backward's partial
 * input gradients are added after it. Dropout runs on the whole width after the all-reduce with
 * the same keyed stream as the whole layer, so the masks do not depend on the number of shards. */
#include "layers/tp_ops.h"

gp_status gp_tp_group(const gp_layer *l, const gp_ctx *c, int nshards, const gp_coll_group **out) {
    const gp_coll_group *g = c->run.tp;
    if (!g || g->size != nshards || g->rank < 0 || g->rank >= nshards || !g->allreduce)
        return gp_error(GP_INVALID_ARGUMENT,
                        "layer %d (%s): a shard of %d runs with its tensor-parallel group of %d "
                        "(the pipeline gives it), got %s of %d",
                        l->index, l->ops->kind, nshards, nshards, g ? "a group" : "none",
                        g ? g->size : 0);
    *out = g;
    return GP_OK;
}

gp_status gp_tp_begin(const gp_layer *l, const gp_ctx *c, int saved, bool shard, int nshards,
                      const gp_coll_group **g) {
    *g = NULL;
    GP_TRY(gp_layer_check_params(l, c, saved >= 0));
    if (shard) GP_TRY(gp_tp_group(l, c, nshards, g));
    if (saved >= 0 && !c->saved[saved].data)
        return gp_error(GP_INVALID_ARGUMENT, "layer %d (%s): backward without a saved forward",
                        l->index, l->ops->kind);
    return GP_OK;
}

gp_status gp_tp_allreduce(const gp_layer *l, const gp_coll_group *g, gp_device *dev, float *x,
                          int64_t n, gp_reduce_op op) {
    gp_status s = g->allreduce(g->ctx, dev, x, n, op);
    if (s != GP_OK)
        return gp_error_context(s, "layer %d (%s), shard %d of %d: all-reduce of %lld floats",
                                l->index, l->ops->kind, g->rank, g->size, (long long)n);
    return GP_OK;
}

/* The row-parallel output y = [res +] drop(all-reduce(partial) + b): shard 0 adds the bias to
 * its partial product (and, without dropout, the residual), so the all-reduce's sum is already
 * the whole output; dropout, on the whole width with the whole layer's mask, comes after it.
 * Without a group the same calls make the whole layer's output. */
gp_status gp_tp_row_output(const gp_layer *l, const gp_coll_group *g, gp_device *dev,
                           int64_t N, int64_t in, int64_t C, const float *x,
                           const uint16_t *x16, const float *w, const uint16_t *w16,
                           const float *b, const float *res, const gp_rng_stream *drop, float p,
                           float *y) {
    const gp_kernels *k = gp_kernels_of(dev);
    const bool lead = !g || g->rank == 0, dropping = drop && p > 0.0f;
    GP_TRY(k->linear_forward(dev, N, in, C, x, x16, w, w16, lead ? b : NULL,
                             lead && !dropping ? res : NULL, y));
    if (g) GP_TRY(gp_tp_allreduce(l, g, dev, y, N * C, GP_REDUCE_SUM));
    return dropping ? k->dropout(dev, drop, p, N * C, y, res, y) : GP_OK;
}

gp_status gp_mha_forward(const gp_layer *l, const gp_coll_group *g, gp_device *dev,
                         const gp_attn_dims *d, int64_t C, const gp_mha_weights *w,
                         const float *x, const uint16_t *x16, const float *res,
                         const gp_rng_stream *drop, float p, const gp_mha_saved *sv, float *y) {
    const gp_kernels *k = gp_kernels_of(dev);
    const int64_t N = d->batch * d->seq, Cl = d->dim;
    GP_TRY(k->linear_forward(dev, N, C, 3 * Cl, x, x16, w->wqkv, w->wqkv16, w->bqkv, NULL,
                             sv->qkv));
    GP_TRY(k->attention_forward(dev, d, sv->qkv, sv->probs, sv->att, sv->att16));
    return gp_tp_row_output(l, g, dev, N, Cl, C, sv->att, sv->att16, w->wproj, w->wproj16,
                            w->bproj, res, drop, p, y);
}

uint64_t gp_mha_saved_bytes(gp_device *dev, const gp_attn_dims *d, uint64_t cost_saved) {
    const uint64_t probs = (uint64_t)(d->batch * d->heads * d->seq * d->seq) * sizeof(float);
    const uint64_t kept = (uint64_t)gp_kernels_of(dev)->attention_saved(dev, d) * sizeof(float);
    return cost_saved - probs + kept;
}

int64_t gp_mha_backward_ws(gp_device *dev, const gp_attn_dims *d, int64_t C, bool dropout) {
    const int64_t N = d->batch * d->seq, Cl = d->dim;
    /* datt (N, Cl) | dqkv (N, 3 Cl) | the attention kernel's | da (N, C) with dropout */
    return N * 4 * Cl + gp_kernels_of(dev)->attention_backward_ws(dev, d) + (dropout ? N * C : 0);
}

/* A shard's output bias is replicated: its gradient, the same on every shard, is added in the
 * input part; the whole sublayer adds it with its weight's. */
gp_status gp_mha_backward_part(const gp_layer *l, const gp_coll_group *g, gp_device *dev,
                               const gp_attn_dims *d, int64_t C, const gp_mha_weights *w,
                               const float *x, const uint16_t *x16, const gp_mha_saved *sv,
                               const gp_rng_stream *drop,
                               float p, const float *dy, float *ws, float *dx, gp_bwd_part part,
                               float *keep_da, float *keep_dqkv) {
    const gp_kernels *k = gp_kernels_of(dev);
    const int64_t N = d->batch * d->seq, Cl = d->dim;
    const bool wt = part != GP_BWD_INPUT;
    float *gbproj = g ? NULL : w->gbproj; /* with the weight's gradient */
    if (part == GP_BWD_WEIGHT) {
        GP_TRY(k->linear_backward(dev, N, Cl, C, sv->att, sv->att16, w->wproj, w->wproj16,
                                  keep_da, NULL, w->gwproj, gbproj));
        return k->linear_backward(dev, N, C, 3 * Cl, x, x16, w->wqkv, w->wqkv16, keep_dqkv, NULL,
                                  w->gwqkv, NULL);
    }
    float *datt = ws, *dqkv = datt + N * Cl, *attn_ws = dqkv + 3 * N * Cl;
    const float *da = dy;
    if (drop && p > 0.0f) {
        float *buf = attn_ws + k->attention_backward_ws(dev, d);
        GP_TRY(k->dropout(dev, drop, p, N * C, dy, NULL, buf));
        da = buf;
    }
    if (g) GP_TRY(k->sum_rows_add(dev, da, N, C, w->gbproj));
    GP_TRY(k->linear_backward(dev, N, Cl, C, sv->att, sv->att16, w->wproj, w->wproj16, da, datt,
                              wt ? w->gwproj : NULL, wt ? gbproj : NULL));
    GP_TRY(k->attention_backward(dev, d, sv->qkv, sv->probs, sv->att, sv->att16, datt, dqkv,
                                 w->gbqkv, attn_ws));
    GP_TRY(k->linear_backward(dev, N, C, 3 * Cl, x, x16, w->wqkv, w->wqkv16, dqkv, dx,
                              wt ? w->gwqkv : NULL, NULL));
    if (!wt) {
        GP_TRY(gp_device_copy(dev, keep_da, da, (size_t)(N * C) * sizeof(float),
                              GP_COPY_DEVICE_TO_DEVICE));
        GP_TRY(gp_device_copy(dev, keep_dqkv, dqkv, (size_t)(3 * N * Cl) * sizeof(float),
                              GP_COPY_DEVICE_TO_DEVICE));
    }
    return dx && g ? gp_tp_allreduce(l, g, dev, dx, N * C, GP_REDUCE_SUM) : GP_OK;
}

void gp_mha_flops(const gp_attn_dims *d, int64_t C, float p, double *fwd, double *bwd) {
    const double N = (double)(d->batch * d->seq), Cl = (double)d->dim, Cw = (double)C;
    const double lin = 2.0 * N * Cw * 3.0 * Cl + 2.0 * N * Cl * Cw;
    const double core = gp_op_attention_gemm_flops(d);
    /* Softmax: ~8 operations per unmasked score forward (max, exp, sum, scale), ~4 backward
     * (dot, multiply-subtract). */
    const double scores =
        (double)(d->batch * d->heads) * (double)d->seq * (double)(d->seq + 1) / 2.0;
    const double drop = p > 0.0f ? 16.0 * N * Cw : 0.0;
    *fwd = lin + core + 8.0 * scores + 4.0 * N * Cw + drop;
    *bwd = 2.0 * lin + 2.0 * core + 4.0 * scores + 4.0 * N * Cw + drop;
}
