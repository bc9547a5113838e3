/* Token embedding (int32 ids -> rows of a (vocab, dim) table) and learned
 * positional embedding (adds row t of a (max_len, dim) table at position t). */
#include <stdlib.h>
#include <string.h>

#include "transformer_ops.h"

typedef struct embed_impl {
    int n;   /* vocab, or max_len */
    int dim;
} embed_impl;

static gp_layer *embed_new(const gp_layer_ops *ops, const char *fn, const char *what, int n,
                           int dim) {
    if (n < 1 || dim < 1) {
        gp_error(GP_INVALID_ARGUMENT, "%s: %s = %d and dim = %d must both be >= 1", fn, what, n,
                 dim);
        return NULL;
    }
    embed_impl *p = malloc(sizeof *p);
    if (!p) {
        gp_error(GP_OUT_OF_MEMORY, "%s: cannot allocate the layer", fn);
        return NULL;
    }
    *p = (embed_impl){.n = n, .dim = dim};
    gp_layer *l = gp_layer_new(ops, p);
    if (l) gp_layer_add_param(l, "weight", gp_shape2(n, dim), GP_INIT_NORMAL, 0.02f, true);
    return l;
}

/* ------------------------------------------------------------- embedding */

static gp_status emb_out_shape(const gp_layer *l, const gp_shape *in, gp_dtype dtype,
                               gp_shape *out) {
    const embed_impl *p = l->impl;
    char buf[96];
    GP_TRY(gp_expect_dtype(l, dtype, GP_I32));
    if (in->ndim < 1 || in->ndim > 3)
        return gp_error(GP_SHAPE,
                        "layer %d (%s): input shape %s has %d dimensions, expected 1 to 3 "
                        "(token ids, e.g. (B, T))",
                        l->index, l->ops->kind, gp_shape_str(in, buf, sizeof buf), in->ndim);
    *out = *in;
    out->dim[out->ndim++] = p->dim;
    return GP_OK;
}

static gp_cost emb_cost(const gp_layer *l, const gp_shape *in) {
    const embed_impl *p = l->impl;
    const double n = (double)gp_shape_nelem(in) * p->dim;
    return (gp_cost){.fwd_flops = n, /* a copy per output element */
                     .bwd_flops = n, /* an add per output element */
                     .param_bytes = gp_tl_param_bytes(l),
                     .out_bytes = (uint64_t)n * sizeof(float),
                     .saved_bytes = 0};
}

/* Validates every id before anything is read with it. */
static gp_status emb_check_ids(const gp_layer *l, const gp_tensor *x) {
    const embed_impl *p = l->impl;
    const int32_t *ids = (const int32_t *)x->data;
    const int64_t n = gp_tensor_nelem(x);
    const int64_t T = x->shape.ndim >= 2 ? x->shape.dim[x->shape.ndim - 1] : n;
    for (int64_t i = 0; i < n; i++)
        if (ids[i] < 0 || ids[i] >= p->n)
            return gp_error(GP_INVALID_ARGUMENT,
                            "layer %d (%s): token id %d at position %lld (row %lld, column %lld) "
                            "is out of range: expected 0 <= id < vocab = %d",
                            l->index, l->ops->kind, (int)ids[i], (long long)i, (long long)(i / T),
                            (long long)(i % T), p->n);
    return GP_OK;
}

static gp_status emb_forward(gp_layer *l, gp_ctx *c, const gp_tensor *x, gp_tensor *y) {
    const embed_impl *p = l->impl;
    gp_shape os;
    GP_TRY(emb_out_shape(l, &x->shape, x->dtype, &os));
    GP_TRY(gp_tl_check_params(l, false));
    GP_TRY(emb_check_ids(l, x));
    const int32_t *ids = (const int32_t *)x->data;
    const float *w = l->params[0].value.data; // (vocab, dim)
    const int64_t n = gp_tensor_nelem(x);
    for (int64_t i = 0; i < n; i++)
        memcpy(y->data + i * p->dim, w + (int64_t)ids[i] * p->dim, (size_t)p->dim * sizeof(float));
    return GP_OK;
}

static gp_status emb_backward(gp_layer *l, gp_ctx *c, const gp_tensor *dy, gp_tensor *dx) {
    const embed_impl *p = l->impl;
    GP_TRY(gp_tl_check_params(l, true));
    GP_TRY(emb_check_ids(l, c->x));
    const int32_t *ids = (const int32_t *)c->x->data;
    float *dw = l->params[0].grad.data; // (vocab, dim)
    const int64_t n = gp_tensor_nelem(c->x);
    /* Scatter-add in position order: a fixed order, so the sums are deterministic. */
    for (int64_t i = 0; i < n; i++) {
        float *row = dw + (int64_t)ids[i] * p->dim;
        const float *g = dy->data + i * p->dim;
        for (int j = 0; j < p->dim; j++) row[j] += g[j];
    }
    return GP_OK; /* int32 input: no dx */
}

static const gp_layer_ops embedding_ops = {
    .kind = "embedding",
    .out_shape = emb_out_shape,
    .cost = emb_cost,
    .forward = emb_forward,
    .backward = emb_backward,
};

gp_layer *gp_embedding(int vocab, int dim) {
    return embed_new(&embedding_ops, "gp_embedding", "vocab", vocab, dim);
}

/* --------------------------------------------------- positional embedding */

static gp_status pos_out_shape(const gp_layer *l, const gp_shape *in, gp_dtype dtype,
                               gp_shape *out) {
    const embed_impl *p = l->impl;
    char buf[96];
    GP_TRY(gp_expect_dtype(l, dtype, GP_F32));
    GP_TRY(gp_expect_ndim(l, in, 3, "(B, T, dim)"));
    GP_TRY(gp_expect_dim(l, in, 2, p->dim, "dim"));
    if (in->dim[1] > p->n)
        return gp_error(GP_SHAPE,
                        "layer %d (%s): input shape %s: sequence length T = %lld exceeds max_len "
                        "= %d",
                        l->index, l->ops->kind, gp_shape_str(in, buf, sizeof buf),
                        (long long)in->dim[1], p->n);
    *out = *in;
    return GP_OK;
}

static gp_cost pos_cost(const gp_layer *l, const gp_shape *in) {
    const double n = (double)gp_shape_nelem(in);
    return (gp_cost){.fwd_flops = n,
                     .bwd_flops = 2.0 * n, /* dx copy and the weight sum */
                     .param_bytes = gp_tl_param_bytes(l),
                     .out_bytes = (uint64_t)n * sizeof(float),
                     .saved_bytes = 0};
}

static gp_status pos_forward(gp_layer *l, gp_ctx *c, const gp_tensor *x, gp_tensor *y) {
    gp_shape os;
    GP_TRY(pos_out_shape(l, &x->shape, x->dtype, &os));
    GP_TRY(gp_tl_check_params(l, false));
    const int64_t B = x->shape.dim[0], T = x->shape.dim[1], D = x->shape.dim[2];
    const float *w = l->params[0].value.data; // (max_len, dim)
    for (int64_t b = 0; b < B; b++)
        for (int64_t t = 0; t < T; t++) {
            const float *xr = x->data + (b * T + t) * D, *wr = w + t * D;
            float *yr = y->data + (b * T + t) * D;
            for (int64_t j = 0; j < D; j++) yr[j] = xr[j] + wr[j];
        }
    return GP_OK;
}

static gp_status pos_backward(gp_layer *l, gp_ctx *c, const gp_tensor *dy, gp_tensor *dx) {
    GP_TRY(gp_tl_check_params(l, true));
    const int64_t B = dy->shape.dim[0], T = dy->shape.dim[1], D = dy->shape.dim[2];
    float *dw = l->params[0].grad.data; // (max_len, dim)
    /* Rows of dw receive the batch in order b = 0, 1, ...: deterministic. */
    for (int64_t b = 0; b < B; b++)
        for (int64_t t = 0; t < T; t++) {
            const float *g = dy->data + (b * T + t) * D;
            float *wr = dw + t * D;
            for (int64_t j = 0; j < D; j++) wr[j] += g[j];
        }
    if (dx && dx->data != dy->data)
        memcpy(dx->data, dy->data, (size_t)gp_tensor_nelem(dy) * sizeof(float));
    return GP_OK;
}

static const gp_layer_ops pos_embedding_ops = {
    .kind = "pos_embedding",
    .out_shape = pos_out_shape,
    .cost = pos_cost,
    .forward = pos_forward,
    .backward = pos_backward,
};

gp_layer *gp_pos_embedding(int max_len, int dim) {
    return embed_new(&pos_embedding_ops, "gp_pos_embedding", "max_len", max_len, dim);
}
