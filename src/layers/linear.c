/* gp_linear: y = x W^T + b on the last dimension of a 2-4 dimensional input,
 * PyTorch layout (W is (out, in)) and PyTorch's default initialization. */
#include <math.h>
#include <stdlib.h>

#include "layers/transformer_ops.h"

typedef struct linear_impl {
    int in, out;
    bool bias;
} linear_impl;

static gp_status linear_out_shape(const gp_layer *l, const gp_shape *in, gp_dtype dtype,
                                  gp_shape *out) {
    const linear_impl *p = l->impl;
    int64_t rows;
    GP_TRY(gp_tl_rows(l, in, dtype, p->in, "in_features", &rows));
    *out = *in;
    out->dim[in->ndim - 1] = p->out;
    return GP_OK;
}

static gp_cost linear_cost(const gp_layer *l, const gp_shape *in) {
    const linear_impl *p = l->impl;
    const double rows = (double)gp_shape_nelem(in) / p->in;
    const double gemm = 2.0 * rows * p->in * p->out;
    const double bias = p->bias ? rows * p->out : 0.0;
    return (gp_cost){.fwd_flops = gemm + bias,
                     .bwd_flops = 2.0 * gemm + bias, /* dx and dW products, bias column sums */
                     .param_bytes = gp_layer_param_bytes(l),
                     .out_bytes = (uint64_t)(rows * p->out) * sizeof(float),
                     .saved_bytes = 0}; /* backward reads ctx->x */
}

static gp_status linear_forward(gp_layer *l, gp_ctx *c, const gp_tensor *x, gp_tensor *y) {
    const linear_impl *p = l->impl;
    int64_t rows;
    GP_TRY(gp_tl_rows(l, &x->shape, x->dtype, p->in, "in_features", &rows));
    GP_TRY(gp_layer_check_params(l, c, false));
    return gp_ctx_kernels(c)->linear_forward(c->dev, rows, p->in, p->out, gp_f32(x),
                                             GP_PVAL(l, 0), p->bias ? GP_PVAL(l, 1) : NULL, NULL,
                                             gp_f32(y));
}

static gp_status linear_backward(gp_layer *l, gp_ctx *c, const gp_tensor *dy, gp_tensor *dx) {
    const linear_impl *p = l->impl;
    const gp_tensor *x = c->x;
    int64_t rows;
    GP_TRY(gp_tl_rows(l, &x->shape, x->dtype, p->in, "in_features", &rows));
    GP_TRY(gp_layer_check_params(l, c, true));
    return gp_ctx_kernels(c)->linear_backward(c->dev, rows, p->in, p->out, gp_f32(x),
                                              GP_PVAL(l, 0), gp_f32(dy), dx ? gp_f32(dx) : NULL,
                                              GP_PGRAD(l, 0), p->bias ? GP_PGRAD(l, 1) : NULL);
}

static const gp_layer_ops linear_ops = {
    .kind = "linear",
    .out_shape = linear_out_shape,
    .cost = linear_cost,
    .forward = linear_forward,
    .backward = linear_backward,
};

gp_layer *gp_linear(int in_features, int out_features, bool bias) {
    if (in_features < 1 || out_features < 1) {
        gp_error(GP_INVALID_ARGUMENT,
                 "gp_linear: in_features = %d and out_features = %d must both be >= 1",
                 in_features, out_features);
        return NULL;
    }
    linear_impl *p = malloc(sizeof *p);
    if (!p) {
        gp_error(GP_OUT_OF_MEMORY, "gp_linear: cannot allocate the layer");
        return NULL;
    }
    *p = (linear_impl){.in = in_features, .out = out_features, .bias = bias};
    gp_layer *l = gp_layer_new(&linear_ops, p);
    if (!l) return NULL;
    const float bound = 1.0f / sqrtf((float)in_features); /* PyTorch: U(-1/sqrt(in), 1/sqrt(in)) */
    gp_layer_add_param(l, "weight", gp_shape2(out_features, in_features), GP_INIT_UNIFORM, bound,
                       true);
    if (bias) gp_layer_add_param(l, "bias", gp_shape1(out_features), GP_INIT_UNIFORM, bound, false);
    return l;
}
