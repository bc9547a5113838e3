/* BatchNorm2d as PyTorch's (eps 1e-5, momentum 0.1, unbiased running variance), NCHW.
 * Statistics are summed in double in a fixed order; running statistics change on a
 * first forward only, never on a pipeline's recomputation of it. */
#include <math.h>
#include <stdlib.h>

#include "../kernels/conv_kernels.h"
#include "layer.h"

#define BN_EPS 1e-5
#define BN_MOMENTUM 0.1

typedef struct bn_cfg {
    int channels;
} bn_cfg;

enum { P_WEIGHT = 0, P_BIAS, P_RUNNING_MEAN, P_RUNNING_VAR };
enum { SLOT_STATS = 0 };      /* (2, C): the mean and 1/sqrt(var + eps) used by forward */
enum { AUX_BATCH_STATS = 0 }; /* 1: forward normalized with the batch's own statistics */

static gp_status bn_out_shape(const gp_layer *l, const gp_shape *in, gp_dtype dtype,
                              gp_shape *out) {
    const bn_cfg *cf = l->impl;
    GP_TRY(gp_expect_dtype(l, dtype, GP_F32));
    GP_TRY(gp_expect_ndim(l, in, 4, "(B, C, H, W)"));
    GP_TRY(gp_expect_dim(l, in, 1, cf->channels, "channels C"));
    *out = *in;
    return GP_OK;
}

static gp_cost bn_cost(const gp_layer *l, const gp_shape *in) {
    const bn_cfg *cf = l->impl;
    double n = in->ndim == 4 ? (double)gp_shape_nelem(in) : 0;
    return (gp_cost){.fwd_flops = 6 * n, /* sum, squared deviations, normalize and scale */
                     .bwd_flops = 9 * n, /* two reductions, then the input gradient */
                     .param_bytes = 4ull * (uint64_t)cf->channels * sizeof(float),
                     .out_bytes = (uint64_t)n * sizeof(float),
                     .saved_bytes = 2ull * (uint64_t)cf->channels * sizeof(float)};
}

static gp_status check_call(const gp_layer *l, const gp_tensor *x, const gp_tensor *y,
                            const char *what) {
    char a[96], b[96];
    gp_shape want;
    GP_TRY(bn_out_shape(l, &x->shape, x->dtype, &want));
    if (!gp_shape_equal(&want, &y->shape))
        return gp_error(GP_SHAPE, "layer %d (batchnorm2d): %s has shape %s, expected %s", l->index,
                        what, gp_shape_str(&y->shape, a, sizeof a),
                        gp_shape_str(&want, b, sizeof b));
    for (int i = 0; i < l->nparams; i++)
        if (!l->params[i].value.data)
            return gp_error(GP_INVALID_ARGUMENT,
                            "layer %d (batchnorm2d): parameter %s is not allocated (initialize the "
                            "model first)",
                            l->index, l->params[i].name);
    return GP_OK;
}

static gp_status bn_forward(gp_layer *l, gp_ctx *ctx, const gp_tensor *x, gp_tensor *y) {
    GP_TRY(check_call(l, x, y, "output"));
    const int64_t batch = x->shape.dim[0], nch = x->shape.dim[1];
    const int64_t hw = x->shape.dim[2] * x->shape.dim[3];
    const int64_t count = batch * hw; /* values per channel */
    const bool batch_stats = ctx->run.training;
    if (batch_stats && count < 2) {
        char a[96];
        return gp_error(GP_SHAPE,
                        "layer %d (batchnorm2d): training needs more than 1 value per channel, "
                        "got input shape %s",
                        l->index, gp_shape_str(&x->shape, a, sizeof a));
    }
    gp_tensor *stats;
    GP_TRY(gp_ctx_save(ctx, SLOT_STATS, gp_shape2(2, nch), GP_F32, &stats));
    ctx->aux[AUX_BATCH_STATS] = batch_stats;
    float *mean_out = stats->data, *invstd_out = stats->data + nch; /* (C), (C) */
    float *rmean = l->params[P_RUNNING_MEAN].value.data,
          *rvar = l->params[P_RUNNING_VAR].value.data;
    const float *gamma = l->params[P_WEIGHT].value.data, *beta = l->params[P_BIAS].value.data;

    for (int64_t c = 0; c < nch; c++) {
        double mean, invstd;
        if (batch_stats) {
            double sum = 0, ss = 0;
            for (int64_t b = 0; b < batch; b++) sum += gp_sum_f64(x->data + (b * nch + c) * hw, hw);
            mean = sum / (double)count;
            for (int64_t b = 0; b < batch; b++)
                ss += gp_sumsq_dev_f64(x->data + (b * nch + c) * hw, hw, mean);
            double var = ss / (double)count; /* biased: normalizes */
            invstd = 1.0 / sqrt(var + BN_EPS);
            if (!ctx->run.recompute) {
                double unbiased = ss / (double)(count - 1);
                rmean[c] = (float)((1.0 - BN_MOMENTUM) * rmean[c] + BN_MOMENTUM * mean);
                rvar[c] = (float)((1.0 - BN_MOMENTUM) * rvar[c] + BN_MOMENTUM * unbiased);
            }
        } else {
            mean = rmean[c];
            invstd = 1.0 / sqrt((double)rvar[c] + BN_EPS);
        }
        const float m = (float)mean, is = (float)invstd;
        const float scale = gamma[c] * is, shift = beta[c];
        mean_out[c] = m;
        invstd_out[c] = is;
        for (int64_t b = 0; b < batch; b++) {
            const float *xp = x->data + (b * nch + c) * hw;
            float *yp = y->data + (b * nch + c) * hw;
            for (int64_t i = 0; i < hw; i++) yp[i] = (xp[i] - m) * scale + shift;
        }
    }
    return GP_OK;
}

static gp_status bn_backward(gp_layer *l, gp_ctx *ctx, const gp_tensor *dy, gp_tensor *dx) {
    const gp_tensor *x = ctx->x;
    const gp_tensor *stats = &ctx->saved[SLOT_STATS];
    if (!x || !stats->data)
        return gp_error(GP_INTERNAL, "layer %d (batchnorm2d): backward without its forward",
                        l->index);
    GP_TRY(check_call(l, x, dy, "output gradient"));
    if (dx) GP_TRY(check_call(l, x, dx, "input gradient"));
    for (int i = P_WEIGHT; i <= P_BIAS; i++)
        if (!l->params[i].grad.data)
            return gp_error(GP_INVALID_ARGUMENT,
                            "layer %d (batchnorm2d): gradient of %s is not allocated", l->index,
                            l->params[i].name);
    const int64_t batch = x->shape.dim[0], nch = x->shape.dim[1];
    const int64_t hw = x->shape.dim[2] * x->shape.dim[3];
    const double count = (double)(batch * hw);
    const bool batch_stats = ctx->aux[AUX_BATCH_STATS] != 0;
    const float *mean_in = stats->data, *invstd_in = stats->data + nch;
    const float *gamma = l->params[P_WEIGHT].value.data;
    float *dgamma = l->params[P_WEIGHT].grad.data, *dbeta = l->params[P_BIAS].grad.data;

    for (int64_t c = 0; c < nch; c++) {
        const float m = mean_in[c], is = invstd_in[c];
        double sdy = 0, sdy_xc = 0; /* sum dy, sum dy * (x - mean) */
        for (int64_t b = 0; b < batch; b++) {
            const float *xp = x->data + (b * nch + c) * hw, *dyp = dy->data + (b * nch + c) * hw;
            sdy += gp_sum_f64(dyp, hw);
            sdy_xc += gp_dot_dev_f64(dyp, xp, hw, (double)m);
        }
        const double sdy_xhat = sdy_xc * is; /* sum dy * xhat */
        dgamma[c] += (float)sdy_xhat;
        dbeta[c] += (float)sdy;
        if (!dx) continue;
        const float k1 = gamma[c] * is;
        /* batch statistics: dx = gamma*invstd * (dy - mean(dy) - xhat * mean(dy*xhat));
         * running statistics are constants: dx = gamma*invstd * dy. */
        const float a = batch_stats ? (float)(sdy / count) : 0.0f;
        const float bc = batch_stats ? (float)(sdy_xhat / count * is) : 0.0f;
        for (int64_t b = 0; b < batch; b++) {
            const float *xp = x->data + (b * nch + c) * hw, *dyp = dy->data + (b * nch + c) * hw;
            float *dxp = dx->data + (b * nch + c) * hw;
            for (int64_t i = 0; i < hw; i++) dxp[i] = k1 * (dyp[i] - a - (xp[i] - m) * bc);
        }
    }
    return GP_OK;
}

static const gp_layer_ops bn_ops = {
    .kind = "batchnorm2d",
    .out_shape = bn_out_shape,
    .cost = bn_cost,
    .forward = bn_forward,
    .backward = bn_backward,
};

gp_layer *gp_batchnorm2d(int channels) {
    if (channels < 1) {
        gp_error(GP_INVALID_ARGUMENT, "batchnorm2d(channels %d): channels must be >= 1, got %d",
                 channels, channels);
        return NULL;
    }
    bn_cfg *cf = calloc(1, sizeof *cf);
    if (!cf) {
        gp_error(GP_OUT_OF_MEMORY, "batchnorm2d: cannot allocate the layer");
        return NULL;
    }
    cf->channels = channels;
    gp_layer *l = gp_layer_new(&bn_ops, cf);
    if (!l) return NULL;
    gp_shape s = gp_shape1(channels);
    gp_layer_add_param(l, "weight", s, GP_INIT_ONES, 0.0f, false);
    gp_layer_add_param(l, "bias", s, GP_INIT_ZEROS, 0.0f, false);
    gp_layer_add_buffer(l, "running_mean", s, GP_INIT_ZEROS);
    gp_layer_add_buffer(l, "running_var", s, GP_INIT_ONES);
    return l;
}
