/* 2-D convolution, NCHW float32, as PyTorch's Conv2d: per example, im2col into a
 * workspace (in bands of output rows for large images), then GEMM with the (OC, C*k*k)
 * weight; backward rebuilds the columns instead of saving them, and col2im's W^T dy. */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "../core/device.h"
#include "../kernels/conv_kernels.h"
#include "../kernels/kernels.h"
#include "layer.h"

typedef struct conv_cfg {
    int in_ch, out_ch, kernel, stride, pad;
    bool bias;
} conv_cfg;

enum { P_WEIGHT = 0, P_BIAS = 1 };

/* Checks the input and fills the per-example geometry. */
static gp_status conv_geom(const gp_layer *l, const gp_shape *in, gp_dtype dtype, gp_conv_geom *g) {
    const conv_cfg *cf = l->impl;
    char buf[96];
    GP_TRY(gp_expect_dtype(l, dtype, GP_F32));
    GP_TRY(gp_expect_ndim(l, in, 4, "(B, C, H, W)"));
    GP_TRY(gp_expect_dim(l, in, 1, cf->in_ch, "input channels C"));
    int64_t h = in->dim[2], w = in->dim[3];
    if (h < 1 || w < 1)
        return gp_error(GP_SHAPE,
                        "layer %d (conv2d): input shape %s: height and width must be >= 1",
                        l->index, gp_shape_str(in, buf, sizeof buf));
    if (h + 2 * (int64_t)cf->pad < cf->kernel || w + 2 * (int64_t)cf->pad < cf->kernel)
        return gp_error(GP_SHAPE,
                        "layer %d (conv2d): input shape %s: kernel %d is larger than the padded "
                        "input %lldx%lld (pad %d); expected H + 2*pad >= kernel and W + 2*pad >= "
                        "kernel",
                        l->index, gp_shape_str(in, buf, sizeof buf), cf->kernel,
                        (long long)(h + 2 * (int64_t)cf->pad), (long long)(w + 2 * (int64_t)cf->pad), cf->pad);
    *g = (gp_conv_geom){.channels = cf->in_ch,
                        .height = h,
                        .width = w,
                        .kernel = cf->kernel,
                        .stride = cf->stride,
                        .pad = cf->pad,
                        .out_h = (h + 2 * (int64_t)cf->pad - cf->kernel) / cf->stride + 1,
                        .out_w = (w + 2 * (int64_t)cf->pad - cf->kernel) / cf->stride + 1};
    return GP_OK;
}

static gp_status conv_out_shape(const gp_layer *l, const gp_shape *in, gp_dtype dtype,
                                gp_shape *out) {
    gp_conv_geom g = {0};
    GP_TRY(conv_geom(l, in, dtype, &g));
    const conv_cfg *cf = l->impl;
    *out = gp_shape4(in->dim[0], cf->out_ch, g.out_h, g.out_w);
    return GP_OK;
}

static uint64_t param_bytes(const gp_layer *l) {
    uint64_t n = 0;
    for (int i = 0; i < l->nparams; i++) n += (uint64_t)gp_shape_nelem(&l->params[i].shape) * 4;
    return n;
}

static gp_cost conv_cost(const gp_layer *l, const gp_shape *in) {
    gp_cost c = {.param_bytes = param_bytes(l)};
    gp_shape out;
    if (in->ndim != 4 || conv_out_shape(l, in, GP_F32, &out) != GP_OK) return c;
    const conv_cfg *cf = l->impl;
    double outs = (double)gp_shape_nelem(&out); /* B * OC * OH * OW */
    double macs = outs * (double)cf->in_ch * cf->kernel * cf->kernel;
    /* backward: weight GEMM + input GEMM, each as large as the forward one */
    c.fwd_flops = 2 * macs + (cf->bias ? outs : 0);
    c.bwd_flops = 4 * macs + (cf->bias ? outs : 0);
    c.out_bytes = (uint64_t)outs * 4;
    c.saved_bytes = 0; /* the columns are rebuilt from the input in backward */
    return c;
}

/* The checks every call makes: shapes agree with out_shape, parameters exist. */
static gp_status check_call(const gp_layer *l, const gp_tensor *x, const gp_tensor *y,
                            gp_conv_geom *g) {
    char a[96], b[96];
    gp_shape want;
    GP_TRY(conv_geom(l, &x->shape, x->dtype, g));
    GP_TRY(conv_out_shape(l, &x->shape, x->dtype, &want));
    if (!gp_shape_equal(&want, &y->shape))
        return gp_error(
            GP_SHAPE, "layer %d (conv2d): output/gradient tensor has shape %s, expected %s",
            l->index, gp_shape_str(&y->shape, a, sizeof a), gp_shape_str(&want, b, sizeof b));
    for (int i = 0; i < l->nparams; i++)
        if (!l->params[i].value.data)
            return gp_error(
                GP_INVALID_ARGUMENT,
                "layer %d (conv2d): parameter %s is not allocated (initialize the model first)",
                l->index, l->params[i].name);
    return GP_OK;
}

/* 1x1, stride 1, no padding: the input plane already is the column matrix. */
static bool is_direct(const gp_conv_geom *g) {
    return g->kernel == 1 && g->stride == 1 && g->pad == 0;
}

/* Output rows per im2col band: the whole image when its columns fit in
 * GP_CONV_COL_MAX floats (every C1 layer), fewer for large images so the
 * workspace stays bounded. Measured: banding C1's layers is no faster. */
#define GP_CONV_COL_MAX ((int64_t)1 << 20)
static int64_t band_rows(const gp_conv_geom *g) {
    int64_t row = g->channels * g->kernel * g->kernel * g->out_w; /* floats per output row */
    int64_t r = GP_CONV_COL_MAX / (row > 0 ? row : 1);
    return r < 1 ? 1 : r > g->out_h ? g->out_h : r;
}

static gp_status conv_forward(gp_layer *l, gp_ctx *ctx, const gp_tensor *x, gp_tensor *y) {
    const conv_cfg *cf = l->impl;
    gp_conv_geom g = {0};
    GP_TRY(check_call(l, x, y, &g));
    const int64_t batch = x->shape.dim[0], oc = cf->out_ch;
    const int64_t npix = g.out_h * g.out_w;                /* P */
    const int64_t kdim = g.channels * g.kernel * g.kernel; /* K = C*k*k */
    const int64_t in_elems = g.channels * g.height * g.width;
    const bool direct = is_direct(&g);
    const int64_t band = band_rows(&g);
    float *col = NULL; /* (K, band * OW) */
    if (!direct && batch > 0) {
        gp_status st;
        col = gp_device_alloc(ctx->dev, GP_MEM_WORKSPACE,
                              (size_t)(kdim * band * g.out_w) * sizeof(float), &st);
        if (!col) return gp_error_context(st, "layer %d (conv2d): im2col workspace", l->index);
    }
    const float *w = l->params[P_WEIGHT].value.data; /* (OC, K) */
    const float *bias = cf->bias ? l->params[P_BIAS].value.data : NULL;
    for (int64_t b = 0; b < batch; b++) {
        const float *xb = x->data + b * in_elems; /* (C, H, W) */
        float *yb = y->data + b * oc * npix;      /* (OC, P) */
        if (direct) {
            gp_gemm(false, false, oc, npix, kdim, 1.0f, w, kdim, xb, npix, 0.0f, yb, npix);
        } else {
            for (int64_t r0 = 0; r0 < g.out_h; r0 += band) {
                int64_t r1 = r0 + band < g.out_h ? r0 + band : g.out_h, n = (r1 - r0) * g.out_w;
                gp_im2col(&g, xb, r0, r1, col);
                /* y_b[:, rows r0..r1) (OC, n; row stride P) = W (OC, K) . col (K, n) */
                gp_gemm(false, false, oc, n, kdim, 1.0f, w, kdim, col, n, 0.0f, yb + r0 * g.out_w,
                        npix);
            }
        }
        if (bias)
            for (int64_t o = 0; o < oc; o++) {
                float bv = bias[o], *row = yb + o * npix;
                for (int64_t p = 0; p < npix; p++) row[p] += bv;
            }
    }
    gp_device_release(ctx->dev, col);
    return GP_OK;
}

static gp_status conv_backward(gp_layer *l, gp_ctx *ctx, const gp_tensor *dy, gp_tensor *dx) {
    const conv_cfg *cf = l->impl;
    const gp_tensor *x = ctx->x;
    if (!x)
        return gp_error(GP_INTERNAL, "layer %d (conv2d): backward without the forward input",
                        l->index);
    gp_conv_geom g = {0};
    GP_TRY(check_call(l, x, dy, &g));
    if (dx && !gp_shape_equal(&dx->shape, &x->shape)) {
        char a[96], b[96];
        return gp_error(GP_SHAPE, "layer %d (conv2d): input gradient has shape %s, expected %s",
                        l->index, gp_shape_str(&dx->shape, a, sizeof a),
                        gp_shape_str(&x->shape, b, sizeof b));
    }
    for (int i = 0; i < l->nparams; i++)
        if (!l->params[i].grad.data)
            return gp_error(GP_INVALID_ARGUMENT,
                            "layer %d (conv2d): gradient of %s is not allocated", l->index,
                            l->params[i].name);
    const int64_t batch = x->shape.dim[0], oc = cf->out_ch;
    const int64_t npix = g.out_h * g.out_w;
    const int64_t kdim = g.channels * g.kernel * g.kernel;
    const int64_t in_elems = g.channels * g.height * g.width;
    const bool direct = is_direct(&g);
    const int64_t band = band_rows(&g);
    if (batch == 0) return GP_OK;

    /* one block: bias sums (OC) in double, col (K, band*OW), dcol (same) when dx is wanted */
    size_t ncol = direct ? 0 : (size_t)(kdim * band * g.out_w);
    size_t ndcol = dx ? ncol : 0;
    size_t nbias = cf->bias ? (size_t)oc : 0;
    size_t nbytes = nbias * sizeof(double) + (ncol + ndcol) * sizeof(float);
    void *ws = NULL;
    if (nbytes) {
        gp_status st;
        ws = gp_device_alloc(ctx->dev, GP_MEM_WORKSPACE, nbytes, &st);
        if (!ws) return gp_error_context(st, "layer %d (conv2d): backward workspace", l->index);
    }
    double *dbias = nbias ? ws : NULL; /* first, so 8-byte aligned */
    float *col = ncol ? (float *)((char *)ws + nbias * sizeof(double)) : NULL;
    float *dcol = ndcol ? col + ncol : NULL;
    if (dbias) memset(dbias, 0, nbias * sizeof(double));

    const float *w = l->params[P_WEIGHT].value.data; /* (OC, K) */
    float *dw = l->params[P_WEIGHT].grad.data;       /* (OC, K) */
    for (int64_t b = 0; b < batch; b++) {
        const float *xb = x->data + b * in_elems;
        const float *dyb = dy->data + b * oc * npix; /* (OC, P) */
        float *dxb = dx ? dx->data + b * in_elems : NULL;
        if (dbias)
            for (int64_t o = 0; o < oc; o++) dbias[o] += gp_sum_f64(dyb + o * npix, npix);
        if (direct) {
            /* dW (OC, C) += dy_b (OC, P) . x_b^T (P, C);  dx_b (C, P) = W^T . dy_b */
            gp_gemm(false, true, oc, kdim, npix, 1.0f, dyb, npix, xb, npix, 1.0f, dw, kdim);
            if (dxb)
                gp_gemm(true, false, kdim, npix, oc, 1.0f, w, kdim, dyb, npix, 0.0f, dxb, npix);
            continue;
        }
        if (dxb) memset(dxb, 0, (size_t)in_elems * sizeof *dxb);
        for (int64_t r0 = 0; r0 < g.out_h; r0 += band) {
            int64_t r1 = r0 + band < g.out_h ? r0 + band : g.out_h, n = (r1 - r0) * g.out_w;
            const float *dyr = dyb + r0 * g.out_w; /* (OC, n), row stride P */
            gp_im2col(&g, xb, r0, r1, col);
            /* dW (OC, K) += dy (OC, n) . col^T (n, K), examples and bands in order */
            gp_gemm(false, true, oc, kdim, n, 1.0f, dyr, npix, col, n, 1.0f, dw, kdim);
            if (dxb) {
                /* dcol (K, n) = W^T (K, OC) . dy (OC, n), scattered back onto dx */
                gp_gemm(true, false, kdim, n, oc, 1.0f, w, kdim, dyr, npix, 0.0f, dcol, n);
                gp_col2im_add(&g, dcol, r0, r1, dxb);
            }
        }
    }
    if (cf->bias) {
        float *db = l->params[P_BIAS].grad.data;
        for (int64_t o = 0; o < oc; o++) db[o] += (float)dbias[o];
    }
    gp_device_release(ctx->dev, ws);
    return GP_OK;
}

static const gp_layer_ops conv_ops = {
    .kind = "conv2d",
    .out_shape = conv_out_shape,
    .cost = conv_cost,
    .forward = conv_forward,
    .backward = conv_backward,
};

gp_layer *gp_conv2d(int in_ch, int out_ch, int kernel, int stride, int pad, bool bias) {
    const char *bad = NULL;
    int got = 0;
    if (in_ch < 1)
        bad = "in_ch must be >= 1", got = in_ch;
    else if (out_ch < 1)
        bad = "out_ch must be >= 1", got = out_ch;
    else if (kernel < 1)
        bad = "kernel must be >= 1", got = kernel;
    else if (stride < 1)
        bad = "stride must be >= 1", got = stride;
    else if (pad < 0)
        bad = "pad must be >= 0", got = pad;
    else if ((int64_t)in_ch * kernel * kernel > INT32_MAX)
        bad = "in_ch * kernel^2 too large", got = kernel;
    if (bad) {
        gp_error(GP_INVALID_ARGUMENT,
                 "conv2d(in_ch %d, out_ch %d, kernel %d, stride %d, pad %d): %s, got %d", in_ch,
                 out_ch, kernel, stride, pad, bad, got);
        return NULL;
    }
    conv_cfg *cf = calloc(1, sizeof *cf);
    if (!cf) {
        gp_error(GP_OUT_OF_MEMORY, "conv2d: cannot allocate the layer");
        return NULL;
    }
    *cf = (conv_cfg){in_ch, out_ch, kernel, stride, pad, bias};
    gp_layer *l = gp_layer_new(&conv_ops, cf);
    if (!l) return NULL;
    /* Kaiming normal (fan_in, ReLU gain), as torchvision's ResNets. */
    float scale = (float)sqrt(2.0 / ((double)in_ch * kernel * kernel));
    gp_layer_add_param(l, "weight", gp_shape4(out_ch, in_ch, kernel, kernel), GP_INIT_NORMAL, scale,
                       true);
    if (bias) gp_layer_add_param(l, "bias", gp_shape1(out_ch), GP_INIT_ZEROS, 0.0f, false);
    return l;
}
