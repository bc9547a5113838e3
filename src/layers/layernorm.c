/* gp_layernorm: normalization over the last dimension (eps 1e-5) with a
 * learned scale (ones) and shift (zeros), as torch.nn.LayerNorm. */
#include <stdlib.h>

#include "layers/transformer_ops.h"

/* Rough FLOPs per element, for the cost model. */
#define LN_FWD_FLOPS 8.0
#define LN_BWD_FLOPS 14.0

typedef struct layernorm_impl {
    int dim;
} layernorm_impl;

static gp_status ln_out_shape(const gp_layer *l, const gp_shape *in, gp_dtype dtype,
                              gp_shape *out) {
    const layernorm_impl *p = l->impl;
    int64_t rows;
    GP_TRY(gp_tl_rows(l, in, dtype, p->dim, "dim", &rows));
    *out = *in;
    return GP_OK;
}

static gp_cost ln_cost(const gp_layer *l, const gp_shape *in) {
    const layernorm_impl *p = l->impl;
    const double n = (double)gp_shape_nelem(in);
    const uint64_t rows = (uint64_t)gp_shape_nelem(in) / (uint64_t)p->dim;
    return (gp_cost){.fwd_flops = LN_FWD_FLOPS * n,
                     .bwd_flops = LN_BWD_FLOPS * n,
                     .param_bytes = gp_layer_param_bytes(l),
                     .out_bytes = (uint64_t)n * sizeof(float),
                     .saved_bytes = 2 * rows * sizeof(float)}; /* mean and 1/std per row */
}

static gp_status ln_forward(gp_layer *l, gp_ctx *c, const gp_tensor *x, gp_tensor *y) {
    const layernorm_impl *p = l->impl;
    int64_t rows;
    GP_TRY(gp_tl_rows(l, &x->shape, x->dtype, p->dim, "dim", &rows));
    GP_TRY(gp_layer_check_params(l, c, false));
    gp_tensor *stats;
    GP_TRY(gp_ctx_save(c, 0, gp_shape2(2, rows), GP_F32, &stats)); // (2, rows)
    return gp_ctx_kernels(c)->layernorm_forward(c->dev, rows, p->dim, gp_f32(x), GP_PVAL(l, 0),
                                                GP_PVAL(l, 1), gp_f32(y), NULL,
                                                gp_f32(stats));
}

static gp_status ln_backward(gp_layer *l, gp_ctx *c, const gp_tensor *dy, gp_tensor *dx) {
    const layernorm_impl *p = l->impl;
    int64_t rows;
    GP_TRY(gp_tl_rows(l, &c->x->shape, c->x->dtype, p->dim, "dim", &rows));
    GP_TRY(gp_layer_check_params(l, c, true));
    if (!c->saved[0].data)
        return gp_error(GP_INVALID_ARGUMENT, "layer %d (%s): backward without a saved forward",
                        l->index, l->ops->kind);
    return gp_ctx_kernels(c)->layernorm_backward(c->dev, rows, p->dim, gp_f32(c->x),
                                                 GP_PVAL(l, 0), gp_f32(&c->saved[0]), gp_f32(dy),
                                                 NULL, dx ? gp_f32(dx) : NULL, GP_PGRAD(l, 0),
                                                 GP_PGRAD(l, 1));
}

/* Replicated over the tensor axis: every shard holds the whole layer. */
static gp_layer *ln_shard(const gp_layer *l, int nshards) {
    (void)nshards;
    return gp_layer_copy(l, sizeof(layernorm_impl));
}

static const gp_layer_ops layernorm_ops = {
    .kind = "layernorm",
    .out_shape = ln_out_shape,
    .cost = ln_cost,
    .forward = ln_forward,
    .backward = ln_backward,
    .shard = ln_shard,
};

gp_layer *gp_layernorm(int dim) {
    if (dim < 1) {
        gp_error(GP_INVALID_ARGUMENT, "gp_layernorm: dim = %d must be >= 1", dim);
        return NULL;
    }
    layernorm_impl *p = malloc(sizeof *p);
    if (!p) {
        gp_error(GP_OUT_OF_MEMORY, "gp_layernorm: cannot allocate the layer");
        return NULL;
    }
    p->dim = dim;
    gp_layer *l = gp_layer_new(&layernorm_ops, p);
    if (!l) return NULL;
    gp_layer_add_param(l, "weight", gp_shape1(dim), GP_INIT_ONES, 0.0f, false);
    gp_layer_add_param(l, "bias", gp_shape1(dim), GP_INIT_ZEROS, 0.0f, false);
    return l;
}
