/* gp_causal_attention: multi-head causal self-attention on (B, T, C) with a fused qkv
 * projection, an output projection and optional output dropout (site 0), and its shards over
 * the tensor axis (its heads): one layer code for both, the sublayer of tp_ops.h, with the
 * call's group for a shard and none for the whole layer. */
#include "layers/tp_ops.h"

typedef struct attention_impl {
    int dim, heads; /* the whole layer's */
    float dropout;
    int nshards; /* 1: the whole layer; T: one of T shards (its heads; see tp_ops.h) */
    bool shard;  /* runs in a tensor-parallel group of nshards (even of 1) */
} attention_impl;

/* saved tensors; the last two from a split backward's input part to its weight part */
enum { SLOT_QKV, SLOT_PROBS, SLOT_ATT, SLOT_KEEP_DA, SLOT_KEEP_DQKV };

static gp_status attn_out_shape(const gp_layer *l, const gp_shape *in, gp_dtype dtype,
                                gp_shape *out) {
    return gp_tl_seq_shape(l, in, dtype, ((const attention_impl *)l->impl)->dim, out);
}

static gp_attn_dims attn_dims(const attention_impl *p, const gp_shape *in) {
    return gp_tl_attn_dims(in, p->dim, p->heads, p->nshards);
}

static gp_cost attn_cost(const gp_layer *l, const gp_shape *in) {
    const attention_impl *p = l->impl;
    const gp_attn_dims d = attn_dims(p, in);
    gp_cost c = {.param_bytes = gp_layer_param_bytes(l)};
    gp_mha_flops(&d, p->dim, p->dropout, &c.fwd_flops, &c.bwd_flops);
    const uint64_t N = (uint64_t)(d.batch * d.seq), C = (uint64_t)p->dim, Cl = (uint64_t)d.dim;
    c.out_bytes = N * C * sizeof(float);
    c.saved_bytes = (N * 3 * Cl + (uint64_t)(d.batch * d.heads * d.seq * d.seq) + N * Cl) *
                    sizeof(float); /* qkv, probabilities, head outputs */
    if (p->shard) c.tp_fwd_bytes = c.tp_bwd_bytes = N * C * sizeof(float);
    /* the projections, and in the whole layer the output bias's column sums (a shard adds them
     * in its input part) */
    c.wgt_flops = 2.0 * (double)N * (double)C * 4.0 * (double)Cl;
    if (!p->shard) c.wgt_flops += (double)(N * C);
    /* the gradients at the projection and qkv */
    c.wgt_keep_bytes = N * (C + 3 * Cl) * sizeof(float);
    return c;
}

static uint64_t attn_workspace(const gp_layer *l, gp_device *dev, const gp_shape *in,
                               bool input_grad) {
    (void)input_grad;
    const attention_impl *p = l->impl;
    const gp_attn_dims d = attn_dims(p, in);
    return (uint64_t)gp_mha_backward_ws(dev, &d, p->dim, p->dropout > 0.0f) * sizeof(float);
}

static gp_mha_weights attn_weights(gp_layer *l) {
    return (gp_mha_weights){.wqkv = GP_PVAL(l, 0), .bqkv = GP_PVAL(l, 1),
                            .wproj = GP_PVAL(l, 2), .bproj = GP_PVAL(l, 3),
                            .wqkv16 = GP_PVAL16(l, 0), .wproj16 = GP_PVAL16(l, 2),
                            .gwqkv = GP_PGRAD(l, 0), .gbqkv = GP_PGRAD(l, 1),
                            .gwproj = GP_PGRAD(l, 2), .gbproj = GP_PGRAD(l, 3)};
}

static gp_status attn_forward(gp_layer *l, gp_ctx *c, const gp_tensor *x, gp_tensor *y) {
    const attention_impl *p = l->impl;
    gp_shape os;
    const gp_coll_group *g;
    GP_TRY(attn_out_shape(l, &x->shape, x->dtype, &os));
    GP_TRY(gp_tp_begin(l, c, -1, p->shard, p->nshards, &g));
    const gp_attn_dims d = attn_dims(p, &x->shape);
    const int64_t B = d.batch, T = d.seq, Cl = d.dim;
    gp_tensor *qkv, *probs, *att;
    GP_TRY(gp_ctx_save(c, SLOT_QKV, gp_shape3(B, T, 3 * Cl), GP_F32, &qkv));
    GP_TRY(gp_ctx_save(c, SLOT_PROBS, gp_shape1(gp_ctx_kernels(c)->attention_saved(c->dev, &d)),
                       GP_F32, &probs));
    GP_TRY(gp_ctx_save(c, SLOT_ATT, gp_shape3(B, T, Cl), GP_F32, &att));
    const gp_mha_weights w = attn_weights(l);
    const gp_mha_saved sv = {.qkv = gp_f32(qkv), .probs = gp_f32(probs), .att = gp_f32(att)};
    gp_rng_stream s;
    return gp_mha_forward(l, g, c->dev, &d, p->dim, &w, gp_f32(x), NULL, NULL,
                          gp_tl_dropout(l, c, p->dropout, 0, &s), p->dropout, &sv, gp_f32(y));
}

/* INPUT keeps the gradients at the output projection (N, C) and at qkv (N, 3 C/T) for WEIGHT;
 * a shard's input gradient is all-reduced in INPUT. */
static gp_status attn_backward_part(gp_layer *l, gp_ctx *c, const gp_tensor *dy, gp_tensor *dx,
                                    gp_bwd_part part) {
    const attention_impl *p = l->impl;
    const gp_coll_group *g;
    GP_TRY(gp_tp_begin(l, c, SLOT_ATT, p->shard, p->nshards, &g));
    const gp_attn_dims d = attn_dims(p, &c->x->shape);
    gp_rng_stream s;
    const gp_rng_stream *drop = gp_tl_dropout(l, c, p->dropout, 0, &s);
    const int64_t N = d.batch * d.seq;
    const gp_shape keep[2] = {gp_shape2(N, p->dim), gp_shape2(N, 3 * d.dim)};
    GP_TRY(gp_ctx_keep_begin(l, c, part, SLOT_KEEP_DA, 2, keep));
    gp_status st = GP_OK;
    float *ws =
        part == GP_BWD_WEIGHT
            ? NULL
            : gp_ctx_workspace(l, c, gp_mha_backward_ws(c->dev, &d, p->dim, drop != NULL), &st);
    if (!ws && part != GP_BWD_WEIGHT) return st;
    const gp_mha_weights w = attn_weights(l);
    const gp_mha_saved sv = {.qkv = gp_f32(&c->saved[SLOT_QKV]),
                             .probs = gp_f32(&c->saved[SLOT_PROBS]),
                             .att = gp_f32(&c->saved[SLOT_ATT])};
    st = gp_mha_backward_part(l, g, c->dev, &d, p->dim, &w, gp_f32(c->x), NULL, &sv, drop,
                              p->dropout, gp_f32(dy), ws, dx && part != GP_BWD_WEIGHT ? gp_f32(dx) : NULL,
                              part, gp_f32(&c->saved[SLOT_KEEP_DA]),
                              gp_f32(&c->saved[SLOT_KEEP_DQKV]));
    gp_ctx_workspace_release(c, ws);
    if (part == GP_BWD_WEIGHT) gp_ctx_keep_end(c, SLOT_KEEP_DA, 2);
    return st;
}

static gp_status attn_backward(gp_layer *l, gp_ctx *c, const gp_tensor *dy, gp_tensor *dx) {
    return attn_backward_part(l, c, dy, dx, GP_BWD_ALL);
}

/* By heads: qkv by rows (q, k and v alike), the output projection by columns, its bias
 * replicated. */
static void attn_layout(const gp_layer *l, gp_layout *out) {
    const attention_impl *p = l->impl;
    *out = (gp_layout){.ndims = 1,
                       .dims = {{"heads", p->heads, "tensor"}},
                       .nsplits = 3,
                       .splits = {{0, 0, 3, 0}, {1, 0, 3, 0}, {2, 1, 1, 0}}};
}

/* The shard attention layer of gp_causal_attention(dim, heads, dropout) for nshards. */
static gp_layer *attn_shard_new(int dim, int heads, float dropout, int nshards);

static gp_layer *attn_shard(const gp_layer *l, int nshards) {
    if (nshards == 1) return gp_layer_copy(l, sizeof(attention_impl)); /* replicated */
    const attention_impl *p = l->impl;
    return attn_shard_new(p->dim, p->heads, p->dropout, nshards);
}

static uint64_t attn_saved_bytes(const gp_layer *l, gp_device *dev, const gp_shape *in) {
    const gp_attn_dims d = attn_dims(l->impl, in);
    return gp_mha_saved_bytes(dev, &d, attn_cost(l, in).saved_bytes);
}

#define ATTENTION_OPS                                                                           \
    .kind = "causal_attention", .out_shape = attn_out_shape, .cost = attn_cost,               \
    .workspace_bytes = attn_workspace, .saved_bytes = attn_saved_bytes,                        \
    .forward = attn_forward, .backward = attn_backward, .backward_part = attn_backward_part

static const gp_layer_ops attention_ops = {ATTENTION_OPS, .layout = attn_layout,
                                           .shard = attn_shard};
/* a shard has no layout or shards of its own */
static const gp_layer_ops attention_shard_ops = {ATTENTION_OPS};

/* A layer of ops with impl *p and its four parameters at its shard's shapes. */
static gp_layer *attn_new(const gp_layer_ops *ops, const attention_impl *p) {
    gp_layer *l = gp_layer_new_copy(ops, p, sizeof *p);
    if (!l) return NULL;
    const int dim = p->dim, Cl = p->dim / p->nshards;
    gp_layer_add_param(l, "qkv.weight", gp_shape2(3 * Cl, dim), GP_INIT_NORMAL, 0.02f, true)
        ->product = true;
    gp_layer_add_param(l, "qkv.bias", gp_shape1(3 * Cl), GP_INIT_ZEROS, 0.0f, false);
    gp_layer_add_param(l, "proj.weight", gp_shape2(dim, Cl), GP_INIT_NORMAL, 0.02f, true)
        ->product = true;
    gp_layer_add_param(l, "proj.bias", gp_shape1(dim), GP_INIT_ZEROS, 0.0f, false);
    return l;
}

static gp_layer *attn_shard_new(int dim, int heads, float dropout, int nshards) {
    if (nshards < 1 || heads % nshards || dim % heads) {
        gp_error(GP_CONFIG, "causal_attention: heads = %d must divide by %d shards (dim %d)",
                 heads, nshards, dim);
        return NULL;
    }
    const attention_impl p = {.dim = dim, .heads = heads, .dropout = dropout,
                              .nshards = nshards, .shard = true};
    return attn_new(&attention_shard_ops, &p);
}

gp_layer *gp_causal_attention(int dim, int heads, float dropout) {
    if (dim < 1 || heads < 1 || dim % heads != 0) {
        gp_error(GP_INVALID_ARGUMENT,
                 "gp_causal_attention: dim = %d must be a positive multiple of heads = %d", dim,
                 heads);
        return NULL;
    }
    if (!(dropout >= 0.0f && dropout < 1.0f)) {
        gp_error(GP_INVALID_ARGUMENT, "gp_causal_attention: dropout = %g must satisfy 0 <= p < 1",
                 (double)dropout);
        return NULL;
    }
    const attention_impl p = {.dim = dim, .heads = heads, .dropout = dropout, .nshards = 1};
    return attn_new(&attention_ops, &p);
}
