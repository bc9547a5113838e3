/* One shard of a pre-LN Transformer block split over the tensor axis (Megatron's layout): the
 * shard holds H/T heads (its rows of qkv, its columns of the attention's output projection) and
 * d_ff/T hidden units (its rows of fc, its columns of the MLP's output projection); layer norms
 * and the two output biases are replicated. Forward: two all-reduces of (B, T, C) (after each
 * row-parallel projection); backward: two more (the partial input gradients of the attention's
 * qkv and of the MLP's fc, before their layer norms). Every shard holds the whole activation
 * between blocks, the same bits on every shard. */
#include <stdlib.h>

#include "layers/tp_ops.h"

#define LN_FWD_FLOPS 8.0
#define LN_BWD_FLOPS 14.0
#define GELU_FWD_FLOPS 24.0
#define GELU_BWD_FLOPS 32.0
#define DROPOUT_FLOPS 16.0

typedef struct shard_impl {
    int dim, heads, d_ff; /* the whole block's */
    float dropout;
    int nshards;
} shard_impl;

/* The whole block's parameter order (transformer_block.c), at shard shapes. */
enum {
    P_LN1_W, P_LN1_B, P_QKV_W, P_QKV_B, P_PROJ_W, P_PROJ_B,
    P_LN2_W, P_LN2_B, P_FC_W, P_FC_B, P_MLP_W, P_MLP_B
};
enum {
    S_LN1, S_STATS1, S_QKV, S_PROBS, S_ATT, S_H, S_LN2, S_STATS2, S_U, S_G,
    /* a split backward's, from its input part to its weight part (as the whole block's) */
    S_KEEP_DU, S_KEEP_DA, S_KEEP_DQKV
};

static gp_status shard_out_shape(const gp_layer *l, const gp_shape *in, gp_dtype dtype,
                                 gp_shape *out) {
    const shard_impl *p = l->impl;
    GP_TRY(gp_expect_dtype(l, dtype, GP_F32));
    GP_TRY(gp_expect_ndim(l, in, 3, "(B, T, C)"));
    GP_TRY(gp_expect_dim(l, in, 2, p->dim, "C (dim)"));
    *out = *in;
    return GP_OK;
}

/* The shard's heads: dim C / T, heads H / T. */
static gp_attn_dims local_dims(const shard_impl *p, const gp_shape *in) {
    return (gp_attn_dims){.batch = in->dim[0], .seq = in->dim[1], .dim = p->dim / p->nshards,
                          .heads = p->heads / p->nshards};
}

static gp_cost shard_cost(const gp_layer *l, const gp_shape *in) {
    const shard_impl *p = l->impl;
    const gp_attn_dims d = local_dims(p, in);
    const double N = (double)(d.batch * d.seq), C = p->dim, F = (double)(p->d_ff / p->nshards);
    double af, ab;
    gp_tp_mha_flops(&d, p->dim, p->dropout, &af, &ab);
    const double mlp = 2.0 * 2.0 * N * C * F;
    const double drop = p->dropout > 0.0f ? DROPOUT_FLOPS * N * C : 0.0;
    gp_cost c = {.param_bytes = gp_layer_param_bytes(l)};
    c.fwd_flops = af + 2.0 * LN_FWD_FLOPS * N * C + mlp + GELU_FWD_FLOPS * N * F +
                  (N * F + 2.0 * N * C) + drop;
    c.bwd_flops = ab + 2.0 * LN_BWD_FLOPS * N * C + 2.0 * mlp + GELU_BWD_FLOPS * N * F +
                  (N * F + 2.0 * N * C) + drop;
    const uint64_t n = (uint64_t)(d.batch * d.seq), dc = (uint64_t)p->dim,
                   dl = (uint64_t)d.dim, df = (uint64_t)(p->d_ff / p->nshards);
    c.out_bytes = n * dc * sizeof(float);
    /* ln1, h, ln2: 3 NC; qkv 3 N C/T, att N C/T; probs B H/T T T; stats 4 N; u, g: 2 N F/T */
    c.saved_bytes = (3 * n * dc + 4 * n * dl + (uint64_t)(d.batch * d.heads * d.seq * d.seq) +
                     4 * n + 2 * n * df) *
                    sizeof(float);
    c.tp_fwd_bytes = c.tp_bwd_bytes = 2 * n * dc * sizeof(float);
    /* the weight part: the MLP's and the attention projections' weight products */
    c.wgt_flops = mlp + 2.0 * N * C * 4.0 * (double)d.dim;
    c.wgt_keep_bytes = n * (df + dc + 3 * dl) * sizeof(float);
    return c;
}

static gp_mha_weights shard_attn_weights(gp_layer *l) {
    return (gp_mha_weights){
        .wqkv = GP_PVAL(l, P_QKV_W), .bqkv = GP_PVAL(l, P_QKV_B),
        .wproj = GP_PVAL(l, P_PROJ_W), .bproj = GP_PVAL(l, P_PROJ_B),
        .gwqkv = GP_PGRAD(l, P_QKV_W), .gbqkv = GP_PGRAD(l, P_QKV_B),
        .gwproj = GP_PGRAD(l, P_PROJ_W), .gbproj = GP_PGRAD(l, P_PROJ_B)};
}

/* The whole block's dropout streams: the masks do not depend on the number of shards. */
static const gp_rng_stream *shard_drop(const gp_layer *l, const gp_ctx *c, int site,
                                       gp_rng_stream *s) {
    const shard_impl *p = l->impl;
    if (!(p->dropout > 0.0f && c->run.training)) return NULL;
    *s = gp_op_dropout_stream(c->run.seed, l->index, site, c->run.step, c->run.micro_batch);
    return s;
}

#define VAL(i) GP_PVAL(l, i)
#define GRAD(i) GP_PGRAD(l, i)

static gp_status shard_forward(gp_layer *l, gp_ctx *c, const gp_tensor *x, gp_tensor *y) {
    const shard_impl *p = l->impl;
    gp_shape os;
    const gp_coll_group *g;
    GP_TRY(shard_out_shape(l, &x->shape, x->dtype, &os));
    GP_TRY(gp_layer_check_params(l, c, false));
    GP_TRY(gp_tp_group(l, c, p->nshards, &g));
    const gp_kernels *k = gp_ctx_kernels(c);
    gp_device *dev = c->dev;
    const gp_attn_dims d = local_dims(p, &x->shape);
    const int64_t B = d.batch, T = d.seq, C = p->dim, Cl = d.dim, Hl = d.heads,
                  F = p->d_ff / p->nshards, N = B * T;
    gp_tensor *ln1, *st1, *qkv, *probs, *att, *h, *ln2, *st2, *u, *gl;
    GP_TRY(gp_ctx_save(c, S_LN1, gp_shape2(N, C), GP_F32, &ln1));
    GP_TRY(gp_ctx_save(c, S_STATS1, gp_shape2(2, N), GP_F32, &st1));
    GP_TRY(gp_ctx_save(c, S_QKV, gp_shape2(N, 3 * Cl), GP_F32, &qkv));
    GP_TRY(gp_ctx_save(c, S_PROBS, gp_shape4(B, Hl, T, T), GP_F32, &probs));
    GP_TRY(gp_ctx_save(c, S_ATT, gp_shape2(N, Cl), GP_F32, &att));
    GP_TRY(gp_ctx_save(c, S_H, gp_shape2(N, C), GP_F32, &h));
    GP_TRY(gp_ctx_save(c, S_LN2, gp_shape2(N, C), GP_F32, &ln2));
    GP_TRY(gp_ctx_save(c, S_STATS2, gp_shape2(2, N), GP_F32, &st2));
    GP_TRY(gp_ctx_save(c, S_U, gp_shape2(N, F), GP_F32, &u));
    GP_TRY(gp_ctx_save(c, S_G, gp_shape2(N, F), GP_F32, &gl));
    gp_rng_stream s0, s1;
    const gp_rng_stream *drop0 = shard_drop(l, c, 0, &s0), *drop1 = shard_drop(l, c, 1, &s1);

    /* h = x + drop0(attn(ln1(x))) */
    GP_TRY(k->layernorm_forward(dev, N, C, gp_f32(x), VAL(P_LN1_W), VAL(P_LN1_B), gp_f32(ln1),
                                gp_f32(st1)));
    gp_mha_weights w = shard_attn_weights(l);
    gp_mha_saved sv = {.qkv = gp_f32(qkv), .probs = gp_f32(probs), .att = gp_f32(att)};
    GP_TRY(gp_tp_mha_forward(l, g, dev, &d, C, &w, gp_f32(ln1), gp_f32(x), drop0, p->dropout, &sv,
                             gp_f32(h)));

    /* y = h + drop1(all-reduce(gelu(fc(ln2(h))) Wp^T) + bp) */
    GP_TRY(k->layernorm_forward(dev, N, C, gp_f32(h), VAL(P_LN2_W), VAL(P_LN2_B), gp_f32(ln2),
                                gp_f32(st2)));
    GP_TRY(k->linear_forward(dev, N, C, F, gp_f32(ln2), VAL(P_FC_W), VAL(P_FC_B), NULL,
                             gp_f32(u)));
    GP_TRY(k->gelu_forward(dev, N * F, gp_f32(u), gp_f32(gl)));
    return gp_tp_row_output(l, g, dev, N, F, C, gp_f32(gl), VAL(P_MLP_W), VAL(P_MLP_B), gp_f32(h),
                            drop1, p->dropout, gp_f32(y));
}

/* ws: dh (N, C) | small (N, C) | big: the MLP's (N, F/T) gradient, then the attention's. */
static gp_status shard_backward_ws(gp_layer *l, gp_ctx *c, const gp_coll_group *g,
                                   const gp_tensor *dy, gp_tensor *dx, float *ws,
                                   const gp_rng_stream *drop0, const gp_rng_stream *drop1,
                                   gp_bwd_part part) {
    const shard_impl *p = l->impl;
    const float *ln1 = gp_f32(&c->saved[S_LN1]), *h = gp_f32(&c->saved[S_H]);
    const float *ln2 = gp_f32(&c->saved[S_LN2]), *u = gp_f32(&c->saved[S_U]);
    const float *gl = gp_f32(&c->saved[S_G]);
    const gp_kernels *k = gp_ctx_kernels(c);
    gp_device *dev = c->dev;
    const gp_attn_dims d = local_dims(p, &c->x->shape);
    const int64_t C = p->dim, F = p->d_ff / p->nshards, N = d.batch * d.seq;
    float *dh = ws, *small = ws + N * C, *big = ws + 2 * N * C;
    const bool wt = part == GP_BWD_ALL;
    const gp_shape keep[3] = {gp_shape2(N, F), gp_shape2(N, C), gp_shape2(N, 3 * d.dim)};
    GP_TRY(gp_ctx_keep_begin(l, c, part, S_KEEP_DU, 3, keep));
    float *keep_du = gp_f32(&c->saved[S_KEEP_DU]), *keep_da = gp_f32(&c->saved[S_KEEP_DA]);
    float *keep_dqkv = gp_f32(&c->saved[S_KEEP_DQKV]);

    const float *dmo = gp_f32(dy);
    if (drop1) {
        GP_TRY(k->dropout(dev, drop1, p->dropout, N * C, gp_f32(dy), NULL, small));
        dmo = small;
    }
    GP_TRY(k->sum_rows_add(dev, dmo, N, C, GRAD(P_MLP_B)));
    GP_TRY(k->linear_backward(dev, N, F, C, gl, VAL(P_MLP_W), dmo, big,
                              wt ? GRAD(P_MLP_W) : NULL, NULL));
    GP_TRY(k->gelu_backward(dev, N, F, u, big, big, GRAD(P_FC_B)));
    if (!wt)
        GP_TRY(gp_device_copy(dev, keep_du, big, (size_t)(N * F) * sizeof(float),
                              GP_COPY_DEVICE_TO_DEVICE));
    GP_TRY(k->linear_backward(dev, N, C, F, ln2, VAL(P_FC_W), big, small,
                              wt ? GRAD(P_FC_W) : NULL, NULL));
    GP_TRY(gp_tp_allreduce(l, g, dev, small, N * C, GP_REDUCE_SUM));
    GP_TRY(k->layernorm_backward(dev, N, C, h, VAL(P_LN2_W), gp_f32(&c->saved[S_STATS2]), small,
                                 gp_f32(dy), dh, GRAD(P_LN2_W), GRAD(P_LN2_B)));

    gp_mha_weights w = shard_attn_weights(l);
    gp_mha_saved sv = {.qkv = gp_f32(&c->saved[S_QKV]), .probs = gp_f32(&c->saved[S_PROBS]),
                       .att = gp_f32(&c->saved[S_ATT])};
    GP_TRY(gp_tp_mha_backward_part(l, g, dev, &d, C, &w, ln1, &sv, drop0, p->dropout, dh, big,
                                   small, part, keep_da, keep_dqkv));
    return k->layernorm_backward(dev, N, C, gp_f32(c->x), VAL(P_LN1_W),
                                 gp_f32(&c->saved[S_STATS1]), small, dh, dx ? gp_f32(dx) : NULL,
                                 GRAD(P_LN1_W), GRAD(P_LN1_B));
}

/* Floats of shard_backward_ws's workspace. */
static int64_t backward_ws(const shard_impl *p, gp_device *dev, const gp_attn_dims *d,
                           bool dropout) {
    const int64_t C = p->dim, F = p->d_ff / p->nshards, N = d->batch * d->seq;
    const int64_t attn_ws = gp_tp_mha_backward_ws(dev, d, C, dropout);
    return 2 * N * C + (attn_ws > N * F ? attn_ws : N * F);
}

static uint64_t shard_workspace(const gp_layer *l, gp_device *dev, const gp_shape *in,
                               bool input_grad) {
    const shard_impl *p = l->impl;
    const gp_attn_dims d = local_dims(p, in);
    return (uint64_t)backward_ws(p, dev, &d, p->dropout > 0.0f) * sizeof(float);
}

/* The WEIGHT part (ws: N C floats for dy's dropout again): the MLP's products from the saved
 * activations and dy, the attention projections' from the copies the INPUT part kept. */
static gp_status shard_backward_weight(gp_layer *l, gp_ctx *c, const gp_coll_group *g,
                                       const gp_tensor *dy, float *ws,
                                       const gp_rng_stream *drop0, const gp_rng_stream *drop1) {
    const shard_impl *p = l->impl;
    gp_device *dev = c->dev;
    const gp_attn_dims d = local_dims(p, &c->x->shape);
    const int64_t C = p->dim, F = p->d_ff / p->nshards, N = d.batch * d.seq;
    GP_TRY(gp_ctx_keep_begin(l, c, GP_BWD_WEIGHT, S_KEEP_DU, 3, NULL));
    /* (the output bias's gradient was added in the input part) */
    GP_TRY(gp_op_mlp_backward_weight(dev, N, C, F, gp_f32(&c->saved[S_G]),
                                     gp_f32(&c->saved[S_LN2]), VAL(P_MLP_W), VAL(P_FC_W), drop1,
                                     p->dropout, gp_f32(dy), gp_f32(&c->saved[S_KEEP_DU]), ws,
                                     GRAD(P_MLP_W), NULL, GRAD(P_FC_W)));
    gp_mha_weights w = shard_attn_weights(l);
    gp_mha_saved sv = {.qkv = gp_f32(&c->saved[S_QKV]), .probs = gp_f32(&c->saved[S_PROBS]),
                       .att = gp_f32(&c->saved[S_ATT])};
    GP_TRY(gp_tp_mha_backward_part(l, g, dev, &d, C, &w, gp_f32(&c->saved[S_LN1]), &sv, drop0,
                                   p->dropout, NULL, NULL, NULL, GP_BWD_WEIGHT,
                                   gp_f32(&c->saved[S_KEEP_DA]), gp_f32(&c->saved[S_KEEP_DQKV])));
    gp_ctx_keep_end(c, S_KEEP_DU, 3);
    return GP_OK;
}

static gp_status shard_backward_part(gp_layer *l, gp_ctx *c, const gp_tensor *dy, gp_tensor *dx,
                                     gp_bwd_part part) {
    const shard_impl *p = l->impl;
    const gp_coll_group *g;
    GP_TRY(gp_layer_check_params(l, c, true));
    GP_TRY(gp_tp_group(l, c, p->nshards, &g));
    if (!c->saved[S_G].data)
        return gp_error(GP_INVALID_ARGUMENT, "layer %d (%s): backward without a saved forward",
                        l->index, l->ops->kind);
    const gp_attn_dims d = local_dims(p, &c->x->shape);
    gp_rng_stream s0, s1;
    const gp_rng_stream *drop0 = shard_drop(l, c, 0, &s0), *drop1 = shard_drop(l, c, 1, &s1);
    gp_status st;
    const int64_t nws = part == GP_BWD_WEIGHT ? d.batch * d.seq * (int64_t)p->dim
                                              : backward_ws(p, c->dev, &d, drop0 != NULL);
    float *ws = gp_ctx_workspace(l, c, nws, &st);
    if (!ws) return st;
    st = part == GP_BWD_WEIGHT ? shard_backward_weight(l, c, g, dy, ws, drop0, drop1)
                               : shard_backward_ws(l, c, g, dy, dx, ws, drop0, drop1, part);
    gp_ctx_workspace_release(c, ws);
    return st;
}

static gp_status shard_backward(gp_layer *l, gp_ctx *c, const gp_tensor *dy, gp_tensor *dx) {
    return shard_backward_part(l, c, dy, dx, GP_BWD_ALL);
}

static const gp_layer_ops shard_ops = {
    .kind = "transformer_block",
    .out_shape = shard_out_shape,
    .cost = shard_cost,
    .workspace_bytes = shard_workspace,
    .forward = shard_forward,
    .backward = shard_backward,
    .backward_part = shard_backward_part,
};

gp_layer *gp_transformer_block_shard(int dim, int heads, int d_ff, float dropout, int nshards) {
    if (nshards < 1 || heads % nshards || d_ff % nshards || dim % heads) {
        gp_error(GP_CONFIG,
                 "transformer_block: heads = %d and d_ff = %d must divide by %d shards (dim %d)",
                 heads, d_ff, nshards, dim);
        return NULL;
    }
    shard_impl *p = malloc(sizeof *p);
    if (!p) {
        gp_error(GP_OUT_OF_MEMORY, "transformer_block shard: cannot allocate the layer");
        return NULL;
    }
    *p = (shard_impl){.dim = dim, .heads = heads, .d_ff = d_ff, .dropout = dropout,
                      .nshards = nshards};
    gp_layer *l = gp_layer_new(&shard_ops, p);
    if (!l) return NULL;
    const int Cl = dim / nshards, F = d_ff / nshards;
    gp_layer_add_param(l, "ln1.weight", gp_shape1(dim), GP_INIT_ONES, 0.0f, false);
    gp_layer_add_param(l, "ln1.bias", gp_shape1(dim), GP_INIT_ZEROS, 0.0f, false);
    gp_layer_add_param(l, "attn.qkv.weight", gp_shape2(3 * Cl, dim), GP_INIT_NORMAL, 0.02f, true);
    gp_layer_add_param(l, "attn.qkv.bias", gp_shape1(3 * Cl), GP_INIT_ZEROS, 0.0f, false);
    gp_layer_add_param(l, "attn.proj.weight", gp_shape2(dim, Cl), GP_INIT_NORMAL, 0.02f, true);
    gp_layer_add_param(l, "attn.proj.bias", gp_shape1(dim), GP_INIT_ZEROS, 0.0f, false);
    gp_layer_add_param(l, "ln2.weight", gp_shape1(dim), GP_INIT_ONES, 0.0f, false);
    gp_layer_add_param(l, "ln2.bias", gp_shape1(dim), GP_INIT_ZEROS, 0.0f, false);
    gp_layer_add_param(l, "mlp.fc.weight", gp_shape2(F, dim), GP_INIT_NORMAL, 0.02f, true);
    gp_layer_add_param(l, "mlp.fc.bias", gp_shape1(F), GP_INIT_ZEROS, 0.0f, false);
    gp_layer_add_param(l, "mlp.proj.weight", gp_shape2(dim, F), GP_INIT_NORMAL, 0.02f, true);
    gp_layer_add_param(l, "mlp.proj.bias", gp_shape1(dim), GP_INIT_ZEROS, 0.0f, false);
    return l;
}
