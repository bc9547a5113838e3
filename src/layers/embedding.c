/* Token embedding (int32 ids -> rows of a (vocab, dim) table) and learned
 * positional embedding (adds row t of a (max_len, dim) table at position t). The token
 * embedding splits over the tensor axis by vocabulary rows: a shard looks up the ids it holds
 * (zero rows elsewhere) and one all-reduce, exact since each position has one non-zero term,
 * gives every shard the whole embedding. */
#include <stdlib.h>

#include "layers/tp_ops.h"

typedef struct embed_impl {
    int n;   /* vocab, or max_len (a shard's: the whole vocabulary) */
    int dim;
    int nshards; /* 1: the whole table; T: one of T shards of vocab / T rows */
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
    *p = (embed_impl){.n = n, .dim = dim, .nshards = 1};
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
                     .wgt_flops = n, /* all of it: token ids have no gradient */
                     .param_bytes = gp_layer_param_bytes(l),
                     .out_bytes = (uint64_t)n * sizeof(float),
                     .saved_bytes = 0};
}

static gp_status emb_forward(gp_layer *l, gp_ctx *c, const gp_tensor *x, gp_tensor *y) {
    const embed_impl *p = l->impl;
    gp_shape os;
    GP_TRY(emb_out_shape(l, &x->shape, x->dtype, &os));
    GP_TRY(gp_layer_check_params(l, c, false));
    const int64_t n = gp_tensor_nelem(x), T = x->shape.dim[x->shape.ndim - 1];
    gp_status s = gp_ctx_kernels(c)->embedding_forward(c->dev, n, T, p->dim, p->n, gp_i32(x),
                                                       GP_PVAL(l, 0), gp_f32(y));
    return s == GP_OK ? GP_OK : gp_error_context(s, "layer %d (%s)", l->index, l->ops->kind);
}

/* Token ids have no gradient: the whole backward is the table's, the WEIGHT part. */
static gp_status emb_backward(gp_layer *l, gp_ctx *c, const gp_tensor *dy, gp_tensor *dx);
static gp_status emb_backward_part(gp_layer *l, gp_ctx *c, const gp_tensor *dy, gp_tensor *dx,
                                   gp_bwd_part part) {
    return part == GP_BWD_INPUT ? GP_OK : emb_backward(l, c, dy, dx);
}

static gp_status emb_backward(gp_layer *l, gp_ctx *c, const gp_tensor *dy, gp_tensor *dx) {
    const embed_impl *p = l->impl;
    GP_TRY(gp_layer_check_params(l, c, true));
    const gp_tensor *x = c->x;
    const int64_t n = gp_tensor_nelem(x), T = x->shape.dim[x->shape.ndim - 1];
    gp_status s = gp_ctx_kernels(c)->embedding_backward(c->dev, n, T, p->dim, p->n, gp_i32(x),
                                                        gp_f32(dy), GP_PGRAD(l, 0));
    /* int32 input: no dx */
    return s == GP_OK ? GP_OK : gp_error_context(s, "layer %d (%s)", l->index, l->ops->kind);
}

static void emb_layout(const gp_layer *l, gp_layout *out) {
    const embed_impl *p = l->impl;
    *out = (gp_layout){.ndims = 1, .dims = {{"vocab", p->n, "tensor"}}, .nsplits = 1,
                       .splits = {{0, 0, 1, 0}}};
}

static gp_layer *emb_shard(const gp_layer *l, int nshards);

static const gp_layer_ops embedding_ops = {
    .kind = "embedding",
    .out_shape = emb_out_shape,
    .cost = emb_cost,
    .forward = emb_forward,
    .backward = emb_backward,
    .backward_part = emb_backward_part,
    .layout = emb_layout,
    .shard = emb_shard,
};

/* A shard: rows [t vocab / T, (t + 1) vocab / T) of the table, t from the call's group. */
static gp_cost emb_shard_cost(const gp_layer *l, const gp_shape *in) {
    gp_cost c = emb_cost(l, in);
    c.tp_fwd_bytes = c.out_bytes;
    return c;
}

static gp_status emb_shard_forward(gp_layer *l, gp_ctx *c, const gp_tensor *x, gp_tensor *y) {
    const embed_impl *p = l->impl;
    gp_shape os;
    const gp_coll_group *g;
    GP_TRY(emb_out_shape(l, &x->shape, x->dtype, &os));
    GP_TRY(gp_layer_check_params(l, c, false));
    GP_TRY(gp_tp_group(l, c, p->nshards, &g));
    const int64_t n = gp_tensor_nelem(x), T = x->shape.dim[x->shape.ndim - 1];
    const int64_t rows = p->n / p->nshards, first = (int64_t)g->rank * rows;
    gp_status s = gp_ctx_kernels(c)->embedding_shard_forward(c->dev, n, T, p->dim, p->n, first,
                                                             rows, gp_i32(x), GP_PVAL(l, 0),
                                                             gp_f32(y));
    if (s != GP_OK) return gp_error_context(s, "layer %d (%s)", l->index, l->ops->kind);
    return gp_tp_allreduce(l, g, c->dev, gp_f32(y), n * p->dim, GP_REDUCE_SUM);
}

static gp_status emb_shard_backward(gp_layer *l, gp_ctx *c, const gp_tensor *dy, gp_tensor *dx);
static gp_status emb_shard_backward_part(gp_layer *l, gp_ctx *c, const gp_tensor *dy,
                                         gp_tensor *dx, gp_bwd_part part) {
    return part == GP_BWD_INPUT ? GP_OK : emb_shard_backward(l, c, dy, dx);
}

static gp_status emb_shard_backward(gp_layer *l, gp_ctx *c, const gp_tensor *dy, gp_tensor *dx) {
    const embed_impl *p = l->impl;
    const gp_coll_group *g;
    GP_TRY(gp_layer_check_params(l, c, true));
    GP_TRY(gp_tp_group(l, c, p->nshards, &g));
    const gp_tensor *x = c->x;
    const int64_t n = gp_tensor_nelem(x), T = x->shape.dim[x->shape.ndim - 1];
    const int64_t rows = p->n / p->nshards, first = (int64_t)g->rank * rows;
    gp_status s = gp_ctx_kernels(c)->embedding_shard_backward(c->dev, n, T, p->dim, p->n, first,
                                                              rows, gp_i32(x), gp_f32(dy),
                                                              GP_PGRAD(l, 0));
    return s == GP_OK ? GP_OK : gp_error_context(s, "layer %d (%s)", l->index, l->ops->kind);
}

static const gp_layer_ops embedding_shard_ops = {
    .kind = "embedding",
    .out_shape = emb_out_shape,
    .cost = emb_shard_cost,
    .forward = emb_shard_forward,
    .backward = emb_shard_backward,
    .backward_part = emb_shard_backward_part,
};

static gp_layer *emb_shard(const gp_layer *l, int nshards) {
    if (nshards == 1) return gp_layer_copy(l, sizeof(embed_impl)); /* replicated */
    const embed_impl *w = l->impl;
    if (nshards < 1 || w->n % nshards) {
        gp_error(GP_CONFIG, "embedding: vocab = %d must divide by %d shards", w->n, nshards);
        return NULL;
    }
    embed_impl *p = malloc(sizeof *p);
    if (!p) {
        gp_error(GP_OUT_OF_MEMORY, "embedding shard: cannot allocate the layer");
        return NULL;
    }
    *p = (embed_impl){.n = w->n, .dim = w->dim, .nshards = nshards};
    gp_layer *s = gp_layer_new(&embedding_shard_ops, p);
    if (s)
        gp_layer_add_param(s, "weight", gp_shape2(w->n / nshards, w->dim), GP_INIT_NORMAL, 0.02f,
                           true);
    return s;
}

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
                     .wgt_flops = n,
                     .param_bytes = gp_layer_param_bytes(l),
                     .out_bytes = (uint64_t)n * sizeof(float),
                     .saved_bytes = 0};
}

static gp_status pos_forward(gp_layer *l, gp_ctx *c, const gp_tensor *x, gp_tensor *y) {
    gp_shape os;
    GP_TRY(pos_out_shape(l, &x->shape, x->dtype, &os));
    GP_TRY(gp_layer_check_params(l, c, false));
    const int64_t B = x->shape.dim[0], T = x->shape.dim[1], D = x->shape.dim[2];
    return gp_ctx_kernels(c)->pos_embedding_forward(c->dev, B, T, D, gp_f32(x), GP_PVAL(l, 0),
                                                    gp_f32(y));
}

/* INPUT: dx = dy; WEIGHT: the rows' gradient, dy summed over the batch. */
static gp_status pos_backward_part(gp_layer *l, gp_ctx *c, const gp_tensor *dy, gp_tensor *dx,
                                   gp_bwd_part part) {
    GP_TRY(gp_layer_check_params(l, c, true));
    const int64_t B = dy->shape.dim[0], T = dy->shape.dim[1], D = dy->shape.dim[2];
    if (part != GP_BWD_INPUT)
        GP_TRY(gp_ctx_kernels(c)->pos_embedding_backward(c->dev, B, T, D, gp_f32(dy),
                                                         GP_PGRAD(l, 0)));
    return dx && part != GP_BWD_WEIGHT ? gp_tensor_copy(dx, dy) : GP_OK;
}

static gp_status pos_backward(gp_layer *l, gp_ctx *c, const gp_tensor *dy, gp_tensor *dx) {
    return pos_backward_part(l, c, dy, dx, GP_BWD_ALL);
}

/* Replicated over the tensor axis: every shard holds the whole layer. */
static gp_layer *pos_shard(const gp_layer *l, int nshards) {
    (void)nshards;
    return gp_layer_copy(l, sizeof(embed_impl));
}

static const gp_layer_ops pos_embedding_ops = {
    .kind = "pos_embedding",
    .out_shape = pos_out_shape,
    .cost = pos_cost,
    .forward = pos_forward,
    .backward = pos_backward,
    .backward_part = pos_backward_part,
    .shard = pos_shard,
};

gp_layer *gp_pos_embedding(int max_len, int dim) {
    return embed_new(&pos_embedding_ops, "gp_pos_embedding", "max_len", max_len, dim);
}
