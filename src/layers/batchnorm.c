/* BatchNorm2d as PyTorch's (eps 1e-5, momentum 0.1, unbiased running variance), NCHW.
 * Statistics are summed in double in a fixed order; running statistics change on a
 * first forward only, never on a pipeline's recomputation of it. */
#include <math.h>
#include <stdlib.h>

#include "layers/layer_base.h"

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

static gp_status check_call(const gp_layer *l, const gp_ctx *c, const gp_tensor *x,
                            const gp_tensor *y, const char *what) {
    char a[96], b[96];
    gp_shape want;
    GP_TRY(bn_out_shape(l, &x->shape, x->dtype, &want));
    if (!gp_shape_equal(&want, &y->shape))
        return gp_error(GP_SHAPE, "layer %d (batchnorm2d): %s has shape %s, expected %s", l->index,
                        what, gp_shape_str(&y->shape, a, sizeof a),
                        gp_shape_str(&want, b, sizeof b));
    return gp_layer_check_params(l, c, false);
}

static gp_bn_dims bn_dims(const gp_tensor *x) {
    return (gp_bn_dims){.batch = x->shape.dim[0], .channels = x->shape.dim[1],
                        .hw = x->shape.dim[2] * x->shape.dim[3], .eps = BN_EPS,
                        .momentum = BN_MOMENTUM};
}

static gp_status bn_forward(gp_layer *l, gp_ctx *ctx, const gp_tensor *x, gp_tensor *y) {
    GP_TRY(check_call(l, ctx, x, y, "output"));
    const gp_bn_dims d = bn_dims(x);
    const bool batch_stats = ctx->run.training;
    if (batch_stats && d.batch * d.hw < 2) {
        char a[96];
        return gp_error(GP_SHAPE,
                        "layer %d (batchnorm2d): training needs more than 1 value per channel, "
                        "got input shape %s",
                        l->index, gp_shape_str(&x->shape, a, sizeof a));
    }
    gp_tensor *stats;
    GP_TRY(gp_ctx_save(ctx, SLOT_STATS, gp_shape2(2, d.channels), GP_F32, &stats));
    ctx->aux[AUX_BATCH_STATS] = batch_stats;
    /* Running statistics move on a first forward only, never on a recomputation of it. */
    return gp_ctx_kernels(ctx)->batchnorm_forward(
        ctx->dev, &d, gp_f32(x), GP_PVAL(l, P_WEIGHT), GP_PVAL(l, P_BIAS),
        GP_PVAL(l, P_RUNNING_MEAN), GP_PVAL(l, P_RUNNING_VAR), batch_stats,
        batch_stats && !ctx->run.recompute, gp_f32(stats), gp_f32(y));
}

static gp_status bn_backward(gp_layer *l, gp_ctx *ctx, const gp_tensor *dy, gp_tensor *dx) {
    const gp_tensor *x = ctx->x;
    const gp_tensor *stats = &ctx->saved[SLOT_STATS];
    if (!x || !stats->data)
        return gp_error(GP_INTERNAL, "layer %d (batchnorm2d): backward without its forward",
                        l->index);
    GP_TRY(check_call(l, ctx, x, dy, "output gradient"));
    if (dx) GP_TRY(check_call(l, ctx, x, dx, "input gradient"));
    GP_TRY(gp_layer_check_params(l, ctx, true));
    const gp_bn_dims d = bn_dims(x);
    return gp_ctx_kernels(ctx)->batchnorm_backward(
        ctx->dev, &d, gp_f32(x), gp_f32(dy), gp_f32(stats), GP_PVAL(l, P_WEIGHT),
        ctx->aux[AUX_BATCH_STATS] != 0, dx ? gp_f32(dx) : NULL, GP_PGRAD(l, P_WEIGHT),
        GP_PGRAD(l, P_BIAS));
}

/* Replicated over the tensor axis: every shard holds the whole layer. */
static gp_layer *bn_shard(const gp_layer *l, int nshards) {
    (void)nshards;
    return gp_layer_copy(l, sizeof(bn_cfg));
}

static const gp_layer_ops bn_ops = {
    .kind = "batchnorm2d",
    .out_shape = bn_out_shape,
    .cost = bn_cost,
    .forward = bn_forward,
    .backward = bn_backward,
    .shard = bn_shard,
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
