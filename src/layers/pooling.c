/* Pooling over NCHW planes: max pooling without padding (PyTorch's MaxPool2d,
 * the first maximum in row-major window order wins, NaN propagates) and global
 * average pooling (B, C, H, W) -> (B, C). */
#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "../kernels/conv_kernels.h"
#include "layer.h"

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

static gp_status maxpool_forward(gp_layer *l, gp_ctx *ctx, const gp_tensor *x, gp_tensor *y) {
    const maxpool_cfg *cf = l->impl;
    gp_shape want;
    GP_TRY(maxpool_out_shape(l, &x->shape, x->dtype, &want));
    GP_TRY(check_out(l, &y->shape, &want, "output"));
    gp_tensor *arg;
    GP_TRY(gp_ctx_save(ctx, SLOT_ARGMAX, want, GP_I32, &arg));
    const int64_t planes = x->shape.dim[0] * x->shape.dim[1];
    const int64_t h = x->shape.dim[2], w = x->shape.dim[3], oh_n = want.dim[2], ow_n = want.dim[3];
    const int64_t k = cf->kernel, s = cf->stride;
    int32_t *am = (int32_t *)arg->data;
    for (int64_t p = 0; p < planes; p++) {
        const float *xp = x->data + p * h * w;
        float *yp = y->data + p * oh_n * ow_n;
        int32_t *ap = am + p * oh_n * ow_n;
        for (int64_t oh = 0; oh < oh_n; oh++)
            for (int64_t ow = 0; ow < ow_n; ow++) {
                int64_t first = oh * s * w + ow * s, idx = first;
                float best = -INFINITY;
                for (int64_t ki = 0; ki < k; ki++)
                    for (int64_t kj = 0; kj < k; kj++) {
                        int64_t i = first + ki * w + kj;
                        float v = xp[i];
                        /* branch-free select: random data mispredicts an if */
                        bool take = (v > best) | (v != v); /* NaN propagates, as PyTorch */
                        best = take ? v : best;
                        idx = take ? i : idx;
                    }
                yp[oh * ow_n + ow] = best;
                ap[oh * ow_n + ow] = (int32_t)idx;
            }
    }
    return GP_OK;
}

static gp_status maxpool_backward(gp_layer *l, gp_ctx *ctx, const gp_tensor *dy, gp_tensor *dx) {
    const gp_tensor *x = ctx->x, *arg = &ctx->saved[SLOT_ARGMAX];
    if (!x || !arg->data)
        return gp_error(GP_INTERNAL, "layer %d (maxpool2d): backward without its forward",
                        l->index);
    GP_TRY(check_out(l, &dy->shape, &arg->shape, "output gradient"));
    if (!dx) return GP_OK; /* no parameters: nothing else to do */
    GP_TRY(check_out(l, &dx->shape, &x->shape, "input gradient"));
    const int64_t planes = x->shape.dim[0] * x->shape.dim[1];
    const int64_t hw = x->shape.dim[2] * x->shape.dim[3];
    const int64_t ohw = arg->shape.dim[2] * arg->shape.dim[3];
    const int32_t *am = (const int32_t *)arg->data;
    memset(dx->data, 0, gp_tensor_nbytes(dx));
    for (int64_t p = 0; p < planes; p++) {
        float *dxp = dx->data + p * hw;
        const float *dyp = dy->data + p * ohw;
        const int32_t *ap = am + p * ohw;
        /* overlapping windows (stride < kernel) add in output order */
        for (int64_t i = 0; i < ohw; i++) dxp[ap[i]] += dyp[i];
    }
    return GP_OK;
}

static const gp_layer_ops maxpool_ops = {
    .kind = "maxpool2d",
    .out_shape = maxpool_out_shape,
    .cost = maxpool_cost,
    .forward = maxpool_forward,
    .backward = maxpool_backward,
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
    for (int64_t p = 0; p < planes; p++)
        y->data[p] = (float)(gp_sum_f64(x->data + p * hw, hw) / (double)hw);
    return GP_OK;
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
    for (int64_t p = 0; p < planes; p++) {
        float g = dy->data[p] / (float)hw, *dxp = dx->data + p * hw;
        for (int64_t i = 0; i < hw; i++) dxp[i] = g;
    }
    return GP_OK;
}

static const gp_layer_ops gap_ops = {
    .kind = "global_avgpool",
    .out_shape = gap_out_shape,
    .cost = gap_cost,
    .forward = gap_forward,
    .backward = gap_backward,
};

gp_layer *gp_global_avgpool(void) { return gp_layer_new(&gap_ops, NULL); }
