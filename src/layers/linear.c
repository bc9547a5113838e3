/* gp_linear: y = x W^T + b on the last dimension of a 2-4 dimensional input,
 * PyTorch layout (W is (out, in)) and PyTorch's default initialization. A padded head
 * (gp_linear_padded) holds more weight rows than it has outputs: a vocabulary table padded for
 * speed and tied to an embedding, whose padding rows then never reach the loss or sampling. As a
 * model's last layer
 * (the vocabulary head) it splits over the tensor axis by output features, column-parallel:
 * each shard computes its block of the logits (the split cross-entropy takes them as they are)
 * and its part of the input gradient, added over the shards by one all-reduce. */
#include <math.h>
#include <stdlib.h>

#include "layers/tp_ops.h"

typedef struct linear_impl {
    int in, out; /* a shard's out: its block of out_features */
    int rows;    /* the weight's rows: out, or more for a padded head (the first out are used) */
    bool bias;
    int nshards; /* 1: the whole layer */
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
                     .wgt_flops = gemm + bias,
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
                                             NULL, GP_PVAL(l, 0), GP_PVAL16(l, 0),
                                             p->bias ? GP_PVAL(l, 1) : NULL, NULL, gp_f32(y));
}

/* INPUT: dx = dy W; WEIGHT: dW += dy^T x, db += the column sums of dy. */
static gp_status linear_backward_part(gp_layer *l, gp_ctx *c, const gp_tensor *dy, gp_tensor *dx,
                                      gp_bwd_part part) {
    const linear_impl *p = l->impl;
    const gp_tensor *x = c->x;
    int64_t rows;
    GP_TRY(gp_tl_rows(l, &x->shape, x->dtype, p->in, "in_features", &rows));
    GP_TRY(gp_layer_check_params(l, c, true));
    const bool in = part != GP_BWD_WEIGHT, wt = part != GP_BWD_INPUT;
    return gp_ctx_kernels(c)->linear_backward(
        c->dev, rows, p->in, p->out, gp_f32(x), NULL, GP_PVAL(l, 0), GP_PVAL16(l, 0), gp_f32(dy),
        in && dx ? gp_f32(dx) : NULL, wt ? GP_PGRAD(l, 0) : NULL,
        wt && p->bias ? GP_PGRAD(l, 1) : NULL);
}

static gp_status linear_backward(gp_layer *l, gp_ctx *c, const gp_tensor *dy, gp_tensor *dx) {
    return linear_backward_part(l, c, dy, dx, GP_BWD_ALL);
}

/* A padded head has no layout: its weight's rows are not out_features, so it is replicated. */
static void linear_layout(const gp_layer *l, gp_layout *out) {
    const linear_impl *p = l->impl;
    if (p->rows != p->out) {
        *out = (gp_layout){0};
        return;
    }
    *out = (gp_layout){.ndims = 1, .dims = {{"out_features", p->out, "tensor"}},
                       .nsplits = p->bias ? 2 : 1, .splits = {{0, 0, 1, 0}, {1, 0, 1, 0}},
                       .output_split = true};
}

static gp_layer *linear_shard(const gp_layer *l, int nshards);

static const gp_layer_ops linear_ops = {
    .kind = "linear",
    .out_shape = linear_out_shape,
    .cost = linear_cost,
    .forward = linear_forward,
    .backward = linear_backward,
    .backward_part = linear_backward_part,
    .layout = linear_layout,
    .shard = linear_shard,
};

static gp_cost shard_cost(const gp_layer *l, const gp_shape *in) {
    const linear_impl *p = l->impl;
    gp_cost c = linear_cost(l, in);
    c.tp_bwd_bytes = (uint64_t)(gp_shape_nelem(in) / p->in) * (uint64_t)p->in * sizeof(float);
    return c;
}

static gp_status shard_forward(gp_layer *l, gp_ctx *c, const gp_tensor *x, gp_tensor *y) {
    const linear_impl *p = l->impl;
    const gp_coll_group *g;
    GP_TRY(gp_tp_group(l, c, p->nshards, &g));
    return linear_forward(l, c, x, y);
}

/* The input gradient is summed over the shards (the INPUT part's collective). */
static gp_status shard_backward_part(gp_layer *l, gp_ctx *c, const gp_tensor *dy, gp_tensor *dx,
                                     gp_bwd_part part) {
    const linear_impl *p = l->impl;
    const gp_coll_group *g;
    GP_TRY(gp_tp_group(l, c, p->nshards, &g));
    GP_TRY(linear_backward_part(l, c, dy, dx, part));
    return dx && part != GP_BWD_WEIGHT
               ? gp_tp_allreduce(l, g, c->dev, gp_f32(dx), gp_tensor_nelem(dx), GP_REDUCE_SUM)
               : GP_OK;
}

static gp_status shard_backward(gp_layer *l, gp_ctx *c, const gp_tensor *dy, gp_tensor *dx) {
    return shard_backward_part(l, c, dy, dx, GP_BWD_ALL);
}

static const gp_layer_ops linear_shard_ops = {
    .kind = "linear",
    .out_shape = linear_out_shape,
    .cost = shard_cost,
    .forward = shard_forward,
    .backward = shard_backward,
    .backward_part = shard_backward_part,
};

static gp_layer *linear_shard(const gp_layer *l, int nshards) {
    if (nshards == 1) return gp_layer_copy(l, sizeof(linear_impl)); /* replicated */
    const linear_impl *w = l->impl;
    if (w->rows != w->out) return gp_layer_copy(l, sizeof(linear_impl));
    if (nshards < 1 || w->out % nshards) {
        gp_error(GP_CONFIG, "linear: out_features = %d must divide by %d shards", w->out, nshards);
        return NULL;
    }
    linear_impl *p = malloc(sizeof *p);
    if (!p) {
        gp_error(GP_OUT_OF_MEMORY, "linear shard: cannot allocate the layer");
        return NULL;
    }
    *p = (linear_impl){.in = w->in, .out = w->out / nshards, .rows = w->out / nshards,
                       .bias = w->bias, .nshards = nshards};
    gp_layer *s = gp_layer_new(&linear_shard_ops, p);
    if (!s) return NULL;
    const float bound = 1.0f / sqrtf((float)w->in);
    gp_layer_add_param(s, "weight", gp_shape2(p->out, w->in), GP_INIT_UNIFORM, bound, true)
        ->product = true;
    if (w->bias) gp_layer_add_param(s, "bias", gp_shape1(p->out), GP_INIT_UNIFORM, bound, false);
    return s;
}

gp_layer *gp_linear_padded(int in_features, int out_features, bool bias, int rows) {
    if (in_features < 1 || out_features < 1 || rows < out_features) {
        gp_error(GP_INVALID_ARGUMENT,
                 "gp_linear: in_features = %d and out_features = %d must both be >= 1, and the "
                 "weight's rows = %d at least out_features",
                 in_features, out_features, rows);
        return NULL;
    }
    linear_impl *p = malloc(sizeof *p);
    if (!p) {
        gp_error(GP_OUT_OF_MEMORY, "gp_linear: cannot allocate the layer");
        return NULL;
    }
    *p = (linear_impl){
        .in = in_features, .out = out_features, .rows = rows, .bias = bias, .nshards = 1};
    gp_layer *l = gp_layer_new(&linear_ops, p);
    if (!l) return NULL;
    const float bound = 1.0f / sqrtf((float)in_features); /* PyTorch: U(-1/sqrt(in), 1/sqrt(in)) */
    gp_layer_add_param(l, "weight", gp_shape2(rows, in_features), GP_INIT_UNIFORM, bound, true)
        ->product = true;
    if (bias) gp_layer_add_param(l, "bias", gp_shape1(out_features), GP_INIT_UNIFORM, bound, false);
    return l;
}

gp_layer *gp_linear(int in_features, int out_features, bool bias) {
    return gp_linear_padded(in_features, out_features, bias, out_features);
}
