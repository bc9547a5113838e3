/* 2-D convolution, NCHW float32, as PyTorch's Conv2d, through the device's conv2d kernels
 * (their paths: kernels/cpu/conv_kernels.c), which it hands the transform of the weights they
 * would make at each call, made once per generation of the weights (model/store.h). */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "layers/layer_base.h"

/* A transform of the weights the kernels take made beforehand (conv2d_wt), and the weights it
 * was made from: their generation (gp_param.gen) and address. */
typedef struct conv_wt {
    gp_tensor t; /* GP_MEM_WORKSPACE, on the device of the calls that made it */
    uint64_t gen;
    const float *w;
} conv_wt;

typedef struct conv_cfg {
    int in_ch, out_ch, kernel, stride, pad;
    bool bias;
    conv_wt wt[2]; /* the forward's and the input gradient's; none in a copy (conv_shard) */
} conv_cfg;

enum { P_WEIGHT = 0, P_BIAS = 1 };

static void conv_drop_derived(gp_layer *l) {
    conv_cfg *cf = l->impl;
    for (int i = 0; i < 2; i++) {
        gp_tensor_release(&cf->wt[i].t);
        cf->wt[i] = (conv_wt){0};
    }
}

/* The transform of the weights for the forward (flipped false) or the input gradient that the
 * kernels take made beforehand, made once per generation of the weights: while a training run
 * holds them still (gp_param.gen), every micro-batch's forward, recomputation and input
 * gradient reads the same transform, which the update's drop_derived releases. *wt NULL where
 * there is none (outside such a run, or where the kernels' path transforms nothing): the
 * kernels then transform the weights themselves, to the same bits. */
static gp_status weights_transform(gp_layer *l, gp_ctx *ctx, const gp_conv_geom *g,
                                   bool flipped, const float **wt) {
    *wt = NULL;
    conv_cfg *cf = l->impl;
    const uint64_t gen = l->params[P_WEIGHT].gen;
    if (!gen) return GP_OK;
    const gp_kernels *k = gp_ctx_kernels(ctx);
    const int64_t n = k->conv2d_wt_floats(ctx->dev, g, cf->out_ch, flipped);
    if (!n) return GP_OK;
    conv_wt *c = &cf->wt[flipped];
    const float *w = GP_PVAL(l, P_WEIGHT);
    const bool fits = c->t.data && c->t.dev == ctx->dev && gp_tensor_nelem(&c->t) == n;
    if (fits && c->gen == gen && c->w == w) {
        *wt = c->t.data;
        return GP_OK;
    }
    if (!fits) {
        gp_tensor_release(&c->t);
        GP_TRY(gp_tensor_alloc(ctx->dev, GP_MEM_WORKSPACE, gp_shape1(n), GP_F32, &c->t));
    }
    c->gen = 0; /* (until made) */
    GP_TRY(k->conv2d_wt(ctx->dev, g, cf->out_ch, w, flipped, gp_f32(&c->t)));
    c->gen = gen, c->w = w;
    *wt = c->t.data;
    return GP_OK;
}

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

static gp_cost conv_cost(const gp_layer *l, const gp_shape *in) {
    gp_cost c = {.param_bytes = gp_layer_param_bytes(l)};
    gp_shape out;
    if (in->ndim != 4 || conv_out_shape(l, in, GP_F32, &out) != GP_OK) return c;
    const conv_cfg *cf = l->impl;
    double outs = (double)gp_shape_nelem(&out); /* B * OC * OH * OW */
    double macs = outs * (double)cf->in_ch * cf->kernel * cf->kernel;
    /* backward: weight GEMM + input GEMM, each as large as the forward one */
    c.fwd_flops = 2 * macs + (cf->bias ? outs : 0);
    c.bwd_flops = 4 * macs + (cf->bias ? outs : 0);
    c.wgt_flops = 2 * macs + (cf->bias ? outs : 0);
    c.out_bytes = (uint64_t)outs * 4;
    c.saved_bytes = 0; /* the columns are rebuilt from the input in backward */
    return c;
}

/* The geometry of a float32 NCHW input the layer accepts (false: none, so no bytes). */
static bool planned_geom(const gp_layer *l, const gp_shape *in, gp_conv_geom *g) {
    *g = (gp_conv_geom){0};
    return in->ndim == 4 && conv_geom(l, in, GP_F32, g) == GP_OK;
}

/* The larger of the forward's and the backward's kernel workspace. */
static uint64_t conv_workspace(const gp_layer *l, gp_device *dev, const gp_shape *in,
                               bool input_grad) {
    gp_conv_geom g;
    if (!planned_geom(l, in, &g)) return 0;
    const conv_cfg *cf = l->impl;
    const gp_kernels *k = gp_kernels_of(dev);
    const int64_t f = k->conv2d_ws(dev, &g, in->dim[0], cf->out_ch, false, false);
    const int64_t b = k->conv2d_ws(dev, &g, in->dim[0], cf->out_ch, true, input_grad);
    return (uint64_t)(f > b ? f : b) * sizeof(float);
}

static uint64_t conv_derived(const gp_layer *l, gp_device *dev, const gp_shape *in,
                             bool input_grad) {
    gp_conv_geom g;
    if (!planned_geom(l, in, &g)) return 0;
    const conv_cfg *cf = l->impl;
    const gp_kernels *k = gp_kernels_of(dev);
    int64_t n = k->conv2d_wt_floats(dev, &g, cf->out_ch, false);
    if (input_grad) n += k->conv2d_wt_floats(dev, &g, cf->out_ch, true);
    return (uint64_t)n * sizeof(float);
}

/* The checks every call makes: shapes agree with out_shape, parameters exist on the call's
 * device. */
static gp_status check_call(const gp_layer *l, const gp_ctx *c, const gp_tensor *x,
                            const gp_tensor *y, gp_conv_geom *g) {
    char a[96], b[96];
    gp_shape want;
    GP_TRY(conv_geom(l, &x->shape, x->dtype, g));
    GP_TRY(conv_out_shape(l, &x->shape, x->dtype, &want));
    if (!gp_shape_equal(&want, &y->shape))
        return gp_error(
            GP_SHAPE, "layer %d (conv2d): output/gradient tensor has shape %s, expected %s",
            l->index, gp_shape_str(&y->shape, a, sizeof a), gp_shape_str(&want, b, sizeof b));
    return gp_layer_check_params(l, c, false);
}

static gp_status conv_forward(gp_layer *l, gp_ctx *ctx, const gp_tensor *x, gp_tensor *y) {
    gp_conv_geom g = {0};
    GP_TRY(check_call(l, ctx, x, y, &g));
    const conv_cfg *cf = l->impl;
    const gp_kernels *k = gp_ctx_kernels(ctx);
    const int64_t batch = x->shape.dim[0];
    if (batch == 0) return GP_OK;
    gp_status st = GP_OK;
    const float *wt;
    GP_TRY(weights_transform(l, ctx, &g, false, &wt));
    const int64_t nws = k->conv2d_ws(ctx->dev, &g, batch, cf->out_ch, false, false);
    float *ws = NULL;
    if (nws && !(ws = gp_ctx_workspace(l, ctx, nws, &st))) return st;
    st = k->conv2d_forward(ctx->dev, &g, batch, cf->out_ch, gp_f32(x), GP_PVAL(l, P_WEIGHT), wt,
                           gp_f32(y), ws);
    gp_ctx_workspace_release(ctx, ws);
    GP_TRY(st);
    if (cf->bias)
        GP_TRY(k->channel_bias_add(ctx->dev, batch, cf->out_ch, g.out_h * g.out_w,
                                   GP_PVAL(l, P_BIAS), gp_f32(y)));
    return GP_OK;
}

/* INPUT: dx; WEIGHT: dW and the bias's gradient. */
static gp_status conv_backward_part(gp_layer *l, gp_ctx *ctx, const gp_tensor *dy, gp_tensor *dx,
                                    gp_bwd_part part) {
    if (part == GP_BWD_WEIGHT) dx = NULL;
    const bool wt = part != GP_BWD_INPUT;
    if (!wt && !dx) return GP_OK;
    const gp_tensor *x = ctx->x;
    if (!x)
        return gp_error(GP_INTERNAL, "layer %d (conv2d): backward without the forward input",
                        l->index);
    gp_conv_geom g = {0};
    GP_TRY(check_call(l, ctx, x, dy, &g));
    GP_TRY(gp_layer_check_params(l, ctx, true));
    if (dx && !gp_shape_equal(&dx->shape, &x->shape)) {
        char a[96], b[96];
        return gp_error(GP_SHAPE, "layer %d (conv2d): input gradient has shape %s, expected %s",
                        l->index, gp_shape_str(&dx->shape, a, sizeof a),
                        gp_shape_str(&x->shape, b, sizeof b));
    }
    const conv_cfg *cf = l->impl;
    const gp_kernels *k = gp_ctx_kernels(ctx);
    const int64_t batch = x->shape.dim[0];
    if (batch == 0) return GP_OK;
    if (cf->bias && wt)
        GP_TRY(k->channel_bias_grad(ctx->dev, batch, cf->out_ch, g.out_h * g.out_w, gp_f32(dy),
                                    GP_PGRAD(l, P_BIAS)));
    gp_status st = GP_OK;
    const float *wdx = NULL;
    if (dx) GP_TRY(weights_transform(l, ctx, &g, true, &wdx));
    const int64_t nws = k->conv2d_ws(ctx->dev, &g, batch, cf->out_ch, true, dx != NULL);
    float *ws = NULL;
    if (nws && !(ws = gp_ctx_workspace(l, ctx, nws, &st))) return st;
    st = k->conv2d_backward(ctx->dev, &g, batch, cf->out_ch, gp_f32(x), GP_PVAL(l, P_WEIGHT), wdx,
                            gp_f32(dy), dx ? gp_f32(dx) : NULL,
                            wt ? GP_PGRAD(l, P_WEIGHT) : NULL, ws);
    gp_ctx_workspace_release(ctx, ws);
    return st;
}

static gp_status conv_backward(gp_layer *l, gp_ctx *ctx, const gp_tensor *dy, gp_tensor *dx) {
    return conv_backward_part(l, ctx, dy, dx, GP_BWD_ALL);
}

/* Replicated over the tensor axis: every shard holds the whole layer (and makes its own
 * transforms). */
static gp_layer *conv_shard(const gp_layer *l, int nshards) {
    (void)nshards;
    gp_layer *c = gp_layer_copy(l, sizeof(conv_cfg));
    if (c) memset(((conv_cfg *)c->impl)->wt, 0, sizeof ((conv_cfg *)c->impl)->wt);
    return c;
}

static void conv_destroy(gp_layer *l) {
    if (l->impl) conv_drop_derived(l);
    free(l->impl);
}

static const gp_layer_ops conv_ops = {
    .kind = "conv2d",
    .out_shape = conv_out_shape,
    .cost = conv_cost,
    .workspace_bytes = conv_workspace,
    .derived_bytes = conv_derived,
    .forward = conv_forward,
    .backward = conv_backward,
    .backward_part = conv_backward_part,
    .destroy = conv_destroy,
    .shard = conv_shard,
    .drop_derived = conv_drop_derived,
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
    *cf = (conv_cfg){.in_ch = in_ch, .out_ch = out_ch, .kernel = kernel, .stride = stride,
                     .pad = pad, .bias = bias};
    gp_layer *l = gp_layer_new(&conv_ops, cf);
    if (!l) return NULL;
    /* Kaiming normal (fan_in, ReLU gain), as torchvision's ResNets. */
    float scale = (float)sqrt(2.0 / ((double)in_ch * kernel * kernel));
    gp_layer_add_param(l, "weight", gp_shape4(out_ch, in_ch, kernel, kernel), GP_INIT_NORMAL, scale,
                       true);
    if (bias) gp_layer_add_param(l, "bias", gp_shape1(out_ch), GP_INIT_ZEROS, 0.0f, false);
    return l;
}
