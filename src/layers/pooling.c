/* Pooling over NCHW planes: max pooling without padding (PyTorch's MaxPool2d,
 * the first maximum in row-major window order wins, NaN propagates) and global
 * average pooling (B, C, H, W) -> (B, C). */
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>

#include "layers/layer_base.h"

static gp_status check_out(const gp_layer *l, const gp_shape *got, const gp_shape *want,
                           const char *what) {
    char a[96], b[96];
    if (!gp_shape_equal(got, want))
        return gp_error(GP_SHAPE, "layer %d (%s): %s has shape %s, expected %s", l->index,
                        l->ops->kind, what, gp_shape_str(got, a, sizeof a),
                        gp_shape_str(want, b, sizeof b));
    return GP_OK;
}

/* ------------------------------------------------------------- max pooling */

typedef struct maxpool_cfg {
    int kernel, stride;
} maxpool_cfg;

enum { SLOT_ARGMAX = 0 }; /* (B, C, OH, OW) int32: index h*W + w of each maximum in its plane */

static gp_status maxpool_out_shape(const gp_layer *l, const gp_shape *in, gp_dtype dtype,
                                   gp_shape *out) {
    const maxpool_cfg *cf = l->impl;
    char buf[96];
    GP_TRY(gp_expect_dtype(l, dtype, GP_F32));
    GP_TRY(gp_expect_ndim(l, in, 4, "(B, C, H, W)"));
    if (in->dim[2] < cf->kernel || in->dim[3] < cf->kernel)
        return gp_error(GP_SHAPE,
                        "layer %d (maxpool2d): input shape %s: kernel %d is larger than the input "
                        "%lldx%lld; expected H >= kernel and W >= kernel (no padding)",
                        l->index, gp_shape_str(in, buf, sizeof buf), cf->kernel,
                        (long long)in->dim[2], (long long)in->dim[3]);
    if (in->dim[2] * in->dim[3] > INT32_MAX)
        return gp_error(GP_SHAPE, "layer %d (maxpool2d): input shape %s: planes over 2^31 values",
                        l->index, gp_shape_str(in, buf, sizeof buf));
    *out = gp_shape4(in->dim[0], in->dim[1], (in->dim[2] - cf->kernel) / cf->stride + 1,
                     (in->dim[3] - cf->kernel) / cf->stride + 1);
    return GP_OK;
}

static gp_cost maxpool_cost(const gp_layer *l, const gp_shape *in) {
    const maxpool_cfg *cf = l->impl;
    gp_shape out;
    if (in->ndim != 4 || maxpool_out_shape(l, in, GP_F32, &out) != GP_OK) return (gp_cost){0};
    double n = (double)gp_shape_nelem(&out);
    return (gp_cost){.fwd_flops = n * cf->kernel * cf->kernel,
                     .bwd_flops = n + (double)gp_shape_nelem(in), /* zero dx, scatter */
                     .out_bytes = (uint64_t)n * sizeof(float),
                     .saved_bytes = (uint64_t)n * sizeof(int32_t)};
}

static gp_pool_dims pool_dims(const maxpool_cfg *cf, const gp_shape *in, const gp_shape *out) {
    return (gp_pool_dims){.planes = in->dim[0] * in->dim[1], .height = in->dim[2],
                          .width = in->dim[3], .out_h = out->dim[2], .out_w = out->dim[3],
                          .kernel = cf->kernel, .stride = cf->stride};
}

static gp_status maxpool_forward(gp_layer *l, gp_ctx *ctx, const gp_tensor *x, gp_tensor *y) {
    const maxpool_cfg *cf = l->impl;
    gp_shape want;
    GP_TRY(maxpool_out_shape(l, &x->shape, x->dtype, &want));
    GP_TRY(check_out(l, &y->shape, &want, "output"));
    gp_tensor *arg;
    GP_TRY(gp_ctx_save(ctx, SLOT_ARGMAX, want, GP_I32, &arg));
    const gp_pool_dims d = pool_dims(cf, &x->shape, &want);
    return gp_ctx_kernels(ctx)->maxpool_forward(ctx->dev, &d, gp_f32(x), gp_f32(y),
                                                (int32_t *)arg->data);
}

static gp_status maxpool_backward(gp_layer *l, gp_ctx *ctx, const gp_tensor *dy, gp_tensor *dx) {
    const maxpool_cfg *cf = l->impl;
    const gp_tensor *x = ctx->x, *arg = &ctx->saved[SLOT_ARGMAX];
    if (!x || !arg->data)
        return gp_error(GP_INTERNAL, "layer %d (maxpool2d): backward without its forward",
                        l->index);
    GP_TRY(check_out(l, &dy->shape, &arg->shape, "output gradient"));
    if (!dx) return GP_OK; /* no parameters: nothing else to do */
    GP_TRY(check_out(l, &dx->shape, &x->shape, "input gradient"));
    const gp_pool_dims d = pool_dims(cf, &x->shape, &arg->shape);
    return gp_ctx_kernels(ctx)->maxpool_backward(ctx->dev, &d, gp_i32(arg), gp_f32(dy),
                                                 gp_f32(dx));
}

/* Replicated over the tensor axis: every shard holds the whole layer. */
static gp_layer *maxpool_shard(const gp_layer *l, int nshards) {
    (void)nshards;
    return gp_layer_copy(l, sizeof(maxpool_cfg));
}

static const gp_layer_ops maxpool_ops = {
    .kind = "maxpool2d",
    .out_shape = maxpool_out_shape,
    .cost = maxpool_cost,
    .forward = maxpool_forward,
    .backward = maxpool_backward,
    .shard = maxpool_shard,
};

gp_layer *gp_maxpool2d(int kernel, int stride) {
    if (kernel < 1 || stride < 1) {
        gp_error(GP_INVALID_ARGUMENT, "maxpool2d(kernel %d, stride %d): %s must be >= 1, got %d",
                 kernel, stride, kernel < 1 ? "kernel" : "stride", kernel < 1 ? kernel : stride);
        return NULL;
    }
    maxpool_cfg *cf = calloc(1, sizeof *cf);
    if (!cf) {
        gp_error(GP_OUT_OF_MEMORY, "maxpool2d: cannot allocate the layer");
        return NULL;
    }
    *cf = (maxpool_cfg){kernel, stride};
    return gp_layer_new(&maxpool_ops, cf);
}

/* ------------------------------------------------------ global average pool */

static gp_status gap_out_shape(const gp_layer *l, const gp_shape *in, gp_dtype dtype,
                               gp_shape *out) {
    char buf[96];
    GP_TRY(gp_expect_dtype(l, dtype, GP_F32));
    GP_TRY(gp_expect_ndim(l, in, 4, "(B, C, H, W)"));
    if (in->dim[2] < 1 || in->dim[3] < 1)
        return gp_error(GP_SHAPE,
                        "layer %d (global_avgpool): input shape %s: height and width must be >= 1",
                        l->index, gp_shape_str(in, buf, sizeof buf));
    *out = gp_shape2(in->dim[0], in->dim[1]);
    return GP_OK;
}

static gp_cost gap_cost(const gp_layer *l, const gp_shape *in) {
    if (in->ndim != 4) return (gp_cost){0};
    double n = (double)gp_shape_nelem(in);
    return (gp_cost){.fwd_flops = n,
                     .bwd_flops = n,
                     .out_bytes = (uint64_t)(in->dim[0] * in->dim[1]) * sizeof(float)};
}

static gp_status gap_forward(gp_layer *l, gp_ctx *ctx, const gp_tensor *x, gp_tensor *y) {
    gp_shape want;
    GP_TRY(gap_out_shape(l, &x->shape, x->dtype, &want));
    GP_TRY(check_out(l, &y->shape, &want, "output"));
    const int64_t planes = want.dim[0] * want.dim[1], hw = x->shape.dim[2] * x->shape.dim[3];
    return gp_ctx_kernels(ctx)->avgpool_forward(ctx->dev, planes, hw, gp_f32(x), gp_f32(y));
}

static gp_status gap_backward(gp_layer *l, gp_ctx *ctx, const gp_tensor *dy, gp_tensor *dx) {
    const gp_tensor *x = ctx->x;
    if (!x)
        return gp_error(GP_INTERNAL, "layer %d (global_avgpool): backward without its forward",
                        l->index);
    gp_shape want;
    GP_TRY(gap_out_shape(l, &x->shape, x->dtype, &want));
    GP_TRY(check_out(l, &dy->shape, &want, "output gradient"));
    if (!dx) return GP_OK;
    GP_TRY(check_out(l, &dx->shape, &x->shape, "input gradient"));
    const int64_t planes = want.dim[0] * want.dim[1], hw = x->shape.dim[2] * x->shape.dim[3];
    return gp_ctx_kernels(ctx)->avgpool_backward(ctx->dev, planes, hw, gp_f32(dy), gp_f32(dx));
}

/* Replicated over the tensor axis: every shard holds the whole layer. */
static gp_layer *gap_shard(const gp_layer *l, int nshards) {
    (void)nshards;
    return gp_layer_copy(l, 0);
}

static const gp_layer_ops gap_ops = {
    .kind = "global_avgpool",
    .out_shape = gap_out_shape,
    .cost = gap_cost,
    .forward = gap_forward,
    .backward = gap_backward,
    .shard = gap_shard,
};

gp_layer *gp_global_avgpool(void) { return gp_layer_new(&gap_ops, NULL); }
