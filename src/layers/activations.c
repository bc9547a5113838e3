/* Elementwise layers without parameters: GELU (tanh form), ReLU, and dropout
 * whose mask is regenerated from the counter-based RNG instead of stored. */
#include <stdlib.h>

#include "layers/transformer_ops.h"

/* Rough FLOPs per element, for the cost model (tanh from exp and a divide;
 * dropout's Philox rounds are counted as work of similar size). */
#define GELU_FWD_FLOPS 24.0
#define GELU_BWD_FLOPS 32.0
#define DROPOUT_FLOPS 16.0

static gp_status elementwise_out_shape(const gp_layer *l, const gp_shape *in, gp_dtype dtype,
                                       gp_shape *out) {
    char buf[96];
    GP_TRY(gp_expect_dtype(l, dtype, GP_F32));
    if (in->ndim < 1)
        return gp_error(GP_SHAPE, "layer %d (%s): input shape %s has no dimensions", l->index,
                        l->ops->kind, gp_shape_str(in, buf, sizeof buf));
    *out = *in;
    return GP_OK;
}

static gp_cost elementwise_cost(const gp_shape *in, double fwd, double bwd) {
    const double n = (double)gp_shape_nelem(in);
    return (gp_cost){.fwd_flops = fwd * n,
                     .bwd_flops = bwd * n,
                     .param_bytes = 0,
                     .out_bytes = (uint64_t)n * sizeof(float),
                     .saved_bytes = 0}; /* backward reads ctx->x / regenerates the mask */
}

static gp_status check_io(const gp_layer *l, const gp_tensor *x, const gp_tensor *y) {
    gp_shape os;
    GP_TRY(elementwise_out_shape(l, &x->shape, x->dtype, &os));
    char a[96], b[96];
    if (gp_tensor_nelem(y) != gp_shape_nelem(&os))
        return gp_error(GP_SHAPE, "layer %d (%s): output shape %s, expected %s", l->index,
                        l->ops->kind, gp_shape_str(&y->shape, a, sizeof a),
                        gp_shape_str(&os, b, sizeof b));
    return GP_OK;
}

static gp_layer *simple_new(const gp_layer_ops *ops, const char *fn, size_t impl_nbytes) {
    void *p = calloc(1, impl_nbytes);
    if (!p) {
        gp_error(GP_OUT_OF_MEMORY, "%s: cannot allocate the layer", fn);
        return NULL;
    }
    return gp_layer_new(ops, p);
}

/* ------------------------------------------------------------------ GELU */

static gp_cost gelu_cost(const gp_layer *l, const gp_shape *in) {
    return elementwise_cost(in, GELU_FWD_FLOPS, GELU_BWD_FLOPS);
}

static gp_status gelu_forward(gp_layer *l, gp_ctx *c, const gp_tensor *x, gp_tensor *y) {
    GP_TRY(check_io(l, x, y));
    return gp_ctx_kernels(c)->gelu_forward(c->dev, gp_tensor_nelem(x), gp_f32(x), gp_f32(y),
                                           NULL);
}

static gp_status gelu_backward(gp_layer *l, gp_ctx *c, const gp_tensor *dy, gp_tensor *dx) {
    if (!dx) return GP_OK;
    GP_TRY(check_io(l, c->x, dy));
    return gp_ctx_kernels(c)->gelu_backward(c->dev, 1, gp_tensor_nelem(dy), gp_f32(c->x),
                                            gp_f32(dy), gp_f32(dx), NULL);
}

/* Replicated over the tensor axis: every shard holds the whole layer. */
static gp_layer *gelu_shard(const gp_layer *l, int nshards) {
    (void)nshards;
    return gp_layer_copy(l, 1);
}

static const gp_layer_ops gelu_ops = {
    .kind = "gelu",
    .out_shape = elementwise_out_shape,
    .cost = gelu_cost,
    .forward = gelu_forward,
    .backward = gelu_backward,
    .shard = gelu_shard,
};

gp_layer *gp_gelu(void) { return simple_new(&gelu_ops, "gp_gelu", 1); }

/* ------------------------------------------------------------------ ReLU */

static gp_cost relu_cost(const gp_layer *l, const gp_shape *in) {
    return elementwise_cost(in, 1.0, 1.0);
}

static gp_status relu_forward(gp_layer *l, gp_ctx *c, const gp_tensor *x, gp_tensor *y) {
    GP_TRY(check_io(l, x, y));
    return gp_ctx_kernels(c)->relu_forward(c->dev, gp_tensor_nelem(x), gp_f32(x), gp_f32(y));
}

static gp_status relu_backward(gp_layer *l, gp_ctx *c, const gp_tensor *dy, gp_tensor *dx) {
    if (!dx) return GP_OK;
    GP_TRY(check_io(l, c->x, dy));
    return gp_ctx_kernels(c)->relu_backward(c->dev, gp_tensor_nelem(dy), gp_f32(c->x),
                                            gp_f32(dy), gp_f32(dx));
}

/* Replicated over the tensor axis: every shard holds the whole layer. */
static gp_layer *relu_shard(const gp_layer *l, int nshards) {
    (void)nshards;
    return gp_layer_copy(l, 1);
}

static const gp_layer_ops relu_ops = {
    .kind = "relu",
    .out_shape = elementwise_out_shape,
    .cost = relu_cost,
    .forward = relu_forward,
    .backward = relu_backward,
    .shard = relu_shard,
};

gp_layer *gp_relu(void) { return simple_new(&relu_ops, "gp_relu", 1); }

/* --------------------------------------------------------------- dropout */

typedef struct dropout_impl {
    float p;
} dropout_impl;

static bool dropout_active(const gp_layer *l, const gp_ctx *c) {
    const dropout_impl *p = l->impl;
    return p->p > 0.0f && c->run.training;
}

static gp_cost dropout_cost(const gp_layer *l, const gp_shape *in) {
    const dropout_impl *p = l->impl;
    return p->p > 0.0f ? elementwise_cost(in, DROPOUT_FLOPS, DROPOUT_FLOPS)
                       : elementwise_cost(in, 0.0, 0.0);
}

/* out = mask(in): the same mask forward (on x) and backward (on dy), regenerated from the
 * call's stream; a copy when dropout is off. */
static gp_status dropout_apply(const gp_layer *l, const gp_ctx *c, const gp_tensor *in,
                               gp_tensor *out) {
    const dropout_impl *p = l->impl;
    if (!dropout_active(l, c)) return gp_tensor_copy(out, in);
    const gp_run *r = &c->run;
    gp_rng_stream s = gp_op_dropout_stream(r->seed, l->index, 0, r->step, r->micro_batch);
    return gp_ctx_kernels(c)->dropout(c->dev, &s, p->p, gp_tensor_nelem(in), gp_f32(in), NULL,
                                      gp_f32(out));
}

static gp_status dropout_forward(gp_layer *l, gp_ctx *c, const gp_tensor *x, gp_tensor *y) {
    GP_TRY(check_io(l, x, y));
    return dropout_apply(l, c, x, y);
}

static gp_status dropout_backward(gp_layer *l, gp_ctx *c, const gp_tensor *dy, gp_tensor *dx) {
    if (!dx) return GP_OK;
    GP_TRY(check_io(l, c->x, dy));
    return dropout_apply(l, c, dy, dx);
}

/* Replicated over the tensor axis: every shard holds the whole layer. */
static gp_layer *dropout_shard(const gp_layer *l, int nshards) {
    (void)nshards;
    return gp_layer_copy(l, sizeof(dropout_impl));
}

static const gp_layer_ops dropout_ops = {
    .kind = "dropout",
    .out_shape = elementwise_out_shape,
    .cost = dropout_cost,
    .forward = dropout_forward,
    .backward = dropout_backward,
    .shard = dropout_shard,
};

gp_layer *gp_dropout(float p) {
    if (!(p >= 0.0f && p < 1.0f)) {
        gp_error(GP_INVALID_ARGUMENT, "gp_dropout: p = %g must satisfy 0 <= p < 1", (double)p);
        return NULL;
    }
    gp_layer *l = simple_new(&dropout_ops, "gp_dropout", sizeof(dropout_impl));
    if (l) ((dropout_impl *)l->impl)->p = p;
    return l;
}
