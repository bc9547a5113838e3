/* The pre-LayerNorm GPT block's sequence, written once for the whole block and its shard
 * (block_skeleton.h): the steps where a shard differs (a group's all-reduce, the replicated
 * output bias's gradient added in the input part) go by whether the call has a tensor-parallel
 * group, here and in the sublayers it calls (tp_ops.h); every other kernel call is the same. */
#include "layers/block_skeleton.h"

#define LN_FWD_FLOPS 8.0
#define LN_BWD_FLOPS 14.0
#define GELU_FWD_FLOPS 24.0
#define GELU_BWD_FLOPS 32.0
#define DROPOUT_FLOPS 16.0

/* Saved tensors. */
enum {
    S_LN1, S_STATS1, S_QKV, S_PROBS, S_ATT, S_H, S_LN2, S_STATS2, S_U, S_G,
    /* a split backward's, from its input part to its weight part: the gradients at the MLP's
     * hidden layer (N, F), at the attention projection's output (N, C) and at qkv (N, 3C) */
    S_KEEP_DU, S_KEEP_DA, S_KEEP_DQKV
};

#define VAL(i) GP_PVAL(l, i)
#define VAL16(i) GP_PVAL16(l, i)
/* A product weight as the linear ops' two arguments: its fp32 value and its bf16 copy (or NULL) */
#define WEIGHT(i) VAL(i), VAL16(i)
#define GRAD(i) GP_PGRAD(l, i)
#define SAVED(c, i) gp_f32(&(c)->saved[i])
/* A saved tensor that may be kept in bf16 (operands_bf16), as the two arguments of the kernel
 * ops (kernel_ops.def) that take it: its fp32 pointer and its bf16 one, one of them NULL. */
#define OPERAND(t) gp_f32_or_null(t), gp_bf16_or_null(t)
#define SAVED_OPERAND(c, i) OPERAND(&(c)->saved[i])

/* ln1(x), att, ln2(h) and gelu(u) are read only as operands of products: on a bf16 device they
 * are kept in bf16, rounded once where made rather than by every product that reads them, which
 * gives the same bits at half the memory. GP_BF16_ACTIVATIONS=fp32 in the environment keeps
 * them in fp32: the reference the tests compare with. */
static bool operands_bf16(gp_device *dev) {
    return gp_device_precision(dev) == GP_PRECISION_BF16 &&
           gp_bf16_env(&gp_bf16_activations_env) != 0;
}

/* Elements of those four: N C twice, N C/T and N F/T. */
static uint64_t operand_elems(const gp_block_impl *p, const gp_attn_dims *d) {
    return (uint64_t)(d->batch * d->seq) * (uint64_t)(2 * p->dim + d->dim + p->d_ff / p->nshards);
}

gp_status gp_block_out_shape(const gp_layer *l, const gp_shape *in, gp_dtype dtype,
                             gp_shape *out) {
    return gp_tl_seq_shape(l, in, dtype, ((const gp_block_impl *)l->impl)->dim, out);
}

static gp_attn_dims local_dims(const gp_block_impl *p, const gp_shape *in) {
    return gp_tl_attn_dims(in, p->dim, p->heads, p->nshards);
}

gp_cost gp_block_cost(const gp_layer *l, const gp_shape *in) {
    const gp_block_impl *p = l->impl;
    const gp_attn_dims d = local_dims(p, in);
    const double N = (double)(d.batch * d.seq), C = p->dim, F = (double)(p->d_ff / p->nshards);
    double af, ab;
    gp_mha_flops(&d, p->dim, p->dropout, &af, &ab);
    const double mlp = 2.0 * 2.0 * N * C * F; /* fc and proj products */
    const double drop = p->dropout > 0.0f ? DROPOUT_FLOPS * N * C : 0.0;
    gp_cost c = {.param_bytes = gp_layer_param_bytes(l)};
    c.fwd_flops = af + 2.0 * LN_FWD_FLOPS * N * C + mlp + GELU_FWD_FLOPS * N * F +
                  (N * F + 2.0 * N * C) /* fc bias, proj bias and residual */ + drop;
    c.bwd_flops = ab + 2.0 * LN_BWD_FLOPS * N * C + 2.0 * mlp + GELU_BWD_FLOPS * N * F +
                  (N * F + 2.0 * N * C) /* bias column sums, residual */ + drop;
    const uint64_t n = (uint64_t)(d.batch * d.seq), dc = (uint64_t)p->dim,
                   dl = (uint64_t)d.dim, df = (uint64_t)(p->d_ff / p->nshards);
    c.out_bytes = n * dc * sizeof(float);
    /* ln1(x), h, ln2(h): 3 NC; qkv 3 N C/T, att N C/T; probs B H/T T T; 2 x 2 N stats; fc
     * output before and after GELU: 2 N F/T. */
    c.saved_bytes = (3 * n * dc + 4 * n * dl + (uint64_t)(d.batch * d.heads * d.seq * d.seq) +
                     4 * n + 2 * n * df) *
                    sizeof(float);
    if (p->shard) c.tp_fwd_bytes = c.tp_bwd_bytes = 2 * n * dc * sizeof(float);
    /* the weight part: the MLP's and the attention projections' weight products, and in the
     * whole block the output biases' column sums (a shard adds them in its input part) */
    c.wgt_flops = mlp + 2.0 * N * C * 4.0 * (double)d.dim;
    if (!p->shard) c.wgt_flops += 2.0 * N * C;
    c.wgt_keep_bytes = n * (df + dc + 3 * dl) * sizeof(float);
    return c;
}

static gp_mha_weights attn_weights(gp_layer *l) {
    return (gp_mha_weights){
        .wqkv = VAL(GP_BLK_QKV_W), .bqkv = VAL(GP_BLK_QKV_B),
        .wproj = VAL(GP_BLK_PROJ_W), .bproj = VAL(GP_BLK_PROJ_B),
        .wqkv16 = VAL16(GP_BLK_QKV_W), .wproj16 = VAL16(GP_BLK_PROJ_W),
        .gwqkv = GRAD(GP_BLK_QKV_W), .gbqkv = GRAD(GP_BLK_QKV_B),
        .gwproj = GRAD(GP_BLK_PROJ_W), .gbproj = GRAD(GP_BLK_PROJ_B)};
}

static gp_mha_saved attn_saved(const gp_ctx *c) {
    return (gp_mha_saved){.qkv = SAVED(c, S_QKV), .probs = SAVED(c, S_PROBS),
                          .att = gp_f32_or_null(&c->saved[S_ATT]),
                          .att16 = gp_bf16_or_null(&c->saved[S_ATT])};
}

/* ---------------------------------------------------------------- forward */

gp_status gp_block_forward(gp_layer *l, gp_ctx *c, const gp_tensor *x, gp_tensor *y) {
    const gp_block_impl *p = l->impl;
    gp_shape os;
    const gp_coll_group *g;
    GP_TRY(gp_block_out_shape(l, &x->shape, x->dtype, &os));
    GP_TRY(gp_tp_begin(l, c, -1, p->shard, p->nshards, &g));
    const gp_kernels *k = gp_ctx_kernels(c);
    gp_device *dev = c->dev;
    const gp_attn_dims d = local_dims(p, &x->shape);
    const int64_t B = d.batch, T = d.seq, C = p->dim, Cl = d.dim,
                  F = p->d_ff / p->nshards, N = B * T;
    if (gp_device_precision(dev) == GP_PRECISION_BF16 && gp_bf16_env(&gp_bf16_activations_env) < 0)
        return gp_error_context(GP_INVALID_ARGUMENT, "layer %d (%s)", l->index, l->ops->kind);
    const gp_dtype op = operands_bf16(dev) ? GP_BF16 : GP_F32;
    gp_tensor *ln1, *st1, *qkv, *probs, *att, *h, *ln2, *st2, *u, *gl;
    GP_TRY(gp_ctx_save(c, S_LN1, gp_shape2(N, C), op, &ln1));
    GP_TRY(gp_ctx_save(c, S_STATS1, gp_shape2(2, N), GP_F32, &st1));
    GP_TRY(gp_ctx_save(c, S_QKV, gp_shape2(N, 3 * Cl), GP_F32, &qkv));
    GP_TRY(gp_ctx_save(c, S_PROBS, gp_shape1(k->attention_saved(dev, &d)), GP_F32, &probs));
    GP_TRY(gp_ctx_save(c, S_ATT, gp_shape2(N, Cl), op, &att));
    GP_TRY(gp_ctx_save(c, S_H, gp_shape2(N, C), GP_F32, &h));
    GP_TRY(gp_ctx_save(c, S_LN2, gp_shape2(N, C), op, &ln2));
    GP_TRY(gp_ctx_save(c, S_STATS2, gp_shape2(2, N), GP_F32, &st2));
    GP_TRY(gp_ctx_save(c, S_U, gp_shape2(N, F), GP_F32, &u));
    GP_TRY(gp_ctx_save(c, S_G, gp_shape2(N, F), op, &gl));
    gp_rng_stream s0, s1;
    const gp_rng_stream *drop0 = gp_tl_dropout(l, c, p->dropout, 0, &s0),
                        *drop1 = gp_tl_dropout(l, c, p->dropout, 1, &s1);

    /* h = x + drop0(attn(ln1(x))); a shard's attention all-reduces its output projection */
    GP_TRY(k->layernorm_forward(dev, N, C, gp_f32(x), VAL(GP_BLK_LN1_W), VAL(GP_BLK_LN1_B),
                                OPERAND(ln1), gp_f32(st1)));
    const gp_mha_weights w = attn_weights(l);
    const gp_mha_saved sv = attn_saved(c);
    GP_TRY(gp_mha_forward(l, g, dev, &d, C, &w, OPERAND(ln1), gp_f32(x), drop0, p->dropout, &sv,
                          gp_f32(h)));

    /* y = h + drop1(proj(gelu(fc(ln2(h))))); a shard all-reduces proj's partial product */
    GP_TRY(k->layernorm_forward(dev, N, C, gp_f32(h), VAL(GP_BLK_LN2_W), VAL(GP_BLK_LN2_B),
                                OPERAND(ln2), gp_f32(st2)));
    GP_TRY(k->linear_forward(dev, N, C, F, OPERAND(ln2), WEIGHT(GP_BLK_FC_W), VAL(GP_BLK_FC_B),
                             NULL, gp_f32(u)));
    GP_TRY(k->gelu_forward(dev, N * F, gp_f32(u), OPERAND(gl)));
    return gp_tp_row_output(l, g, dev, N, F, C, OPERAND(gl), WEIGHT(GP_BLK_MLP_W),
                            VAL(GP_BLK_MLP_B), gp_f32(h), drop1, p->dropout, gp_f32(y));
}

/* --------------------------------------------------------------- backward */

/* The attention sublayer's backward (or a part of it) on ln1(x). */
static gp_status attn_backward(gp_layer *l, const gp_coll_group *g, gp_ctx *c,
                               const gp_attn_dims *d, const gp_rng_stream *drop, const float *dy,
                               float *ws, float *dx, gp_bwd_part part) {
    const gp_block_impl *p = l->impl;
    const gp_mha_weights w = attn_weights(l);
    const gp_mha_saved sv = attn_saved(c);
    return gp_mha_backward_part(l, g, c->dev, d, p->dim, &w, SAVED_OPERAND(c, S_LN1), &sv, drop,
                                p->dropout, dy, ws, dx, part, SAVED(c, S_KEEP_DA),
                                SAVED(c, S_KEEP_DQKV));
}

/* The backward proper (or its INPUT part) in the workspace ws: dh (N, C) | small (N, C) | big,
 * shared by the MLP's (N, F) gradient and then the attention sublayer's workspace. */
static gp_status backward_input(gp_layer *l, gp_ctx *c, const gp_coll_group *g,
                                const gp_tensor *dy, gp_tensor *dx, float *ws,
                                const gp_rng_stream *drop0, const gp_rng_stream *drop1,
                                gp_bwd_part part) {
    const gp_block_impl *p = l->impl;
    const float *h = SAVED(c, S_H), *u = SAVED(c, S_U);
    const gp_kernels *k = gp_ctx_kernels(c);
    gp_device *dev = c->dev;
    const gp_attn_dims d = local_dims(p, &c->x->shape);
    const int64_t C = p->dim, F = p->d_ff / p->nshards, N = d.batch * d.seq;
    float *dh = ws, *small = ws + N * C, *big = ws + 2 * N * C;
    /* INPUT leaves the weight products (the bias of fc, inside gelu', and the layer norms are
     * cheap: done here) to WEIGHT, with copies of the gradients they read */
    const bool wt = part == GP_BWD_ALL;
    const gp_shape keep[3] = {gp_shape2(N, F), gp_shape2(N, C), gp_shape2(N, 3 * d.dim)};
    GP_TRY(gp_ctx_keep_begin(l, c, part, S_KEEP_DU, 3, keep));

    /* MLP branch: dmo = drop1'(dy); dU = dmo Wp (then * gelu'(u)); dln2 = dU Wfc. */
    const float *dmo = gp_f32(dy);
    if (drop1) {
        GP_TRY(k->dropout(dev, drop1, p->dropout, N * C, gp_f32(dy), NULL, small));
        dmo = small;
    }
    /* a shard's output bias is replicated: its gradient, the same on every shard, goes here */
    if (g) GP_TRY(k->sum_rows_add(dev, dmo, N, C, GRAD(GP_BLK_MLP_B)));
    GP_TRY(k->linear_backward(dev, N, F, C, SAVED_OPERAND(c, S_G), WEIGHT(GP_BLK_MLP_W), dmo,
                              big, wt ? GRAD(GP_BLK_MLP_W) : NULL,
                              wt && !g ? GRAD(GP_BLK_MLP_B) : NULL));
    GP_TRY(k->gelu_backward(dev, N, F, u, big, big, GRAD(GP_BLK_FC_B)));
    if (!wt)
        GP_TRY(gp_device_copy(dev, SAVED(c, S_KEEP_DU), big, (size_t)(N * F) * sizeof(float),
                              GP_COPY_DEVICE_TO_DEVICE));
    GP_TRY(k->linear_backward(dev, N, C, F, SAVED_OPERAND(c, S_LN2), WEIGHT(GP_BLK_FC_W), big,
                              small, wt ? GRAD(GP_BLK_FC_W) : NULL, NULL));
    /* a shard's dln2 is partial (its d_ff columns): summed over the group */
    if (g) GP_TRY(gp_tp_allreduce(l, g, dev, small, N * C, GP_REDUCE_SUM));
    /* dh = dy + ln2'(dln2): the residual's gradient joins here. */
    GP_TRY(k->layernorm_backward(dev, N, C, h, VAL(GP_BLK_LN2_W), SAVED(c, S_STATS2), small,
                                 gp_f32(dy), dh, GRAD(GP_BLK_LN2_W), GRAD(GP_BLK_LN2_B)));

    /* Attention branch: dln1 = attn'(dh) into small; dx = dh + ln1'(dln1). */
    GP_TRY(attn_backward(l, g, c, &d, drop0, dh, big, small, part));
    return k->layernorm_backward(dev, N, C, gp_f32(c->x), VAL(GP_BLK_LN1_W), SAVED(c, S_STATS1),
                                 small, dh, dx ? gp_f32(dx) : NULL, GRAD(GP_BLK_LN1_W),
                                 GRAD(GP_BLK_LN1_B));
}

/* Floats of backward_input's workspace. */
static int64_t backward_ws(const gp_block_impl *p, gp_device *dev, const gp_attn_dims *d,
                           bool dropout) {
    const int64_t C = p->dim, F = p->d_ff / p->nshards, N = d->batch * d->seq;
    const int64_t attn_ws = gp_mha_backward_ws(dev, d, C, dropout);
    return 2 * N * C + (attn_ws > N * F ? attn_ws : N * F);
}

/* The cost's fp32 figure, less what dev's attention and bf16 operands (operands_bf16) save. */
uint64_t gp_block_saved_bytes(const gp_layer *l, gp_device *dev, const gp_shape *in) {
    const gp_attn_dims d = local_dims(l->impl, in);
    const uint64_t b = gp_mha_saved_bytes(dev, &d, gp_block_cost(l, in).saved_bytes);
    return operands_bf16(dev) ? b - operand_elems(l->impl, &d) * (sizeof(float) - sizeof(uint16_t))
                              : b;
}

uint64_t gp_block_workspace(const gp_layer *l, gp_device *dev, const gp_shape *in,
                            bool input_grad) {
    (void)input_grad;
    const gp_block_impl *p = l->impl;
    const gp_attn_dims d = local_dims(p, in);
    return (uint64_t)backward_ws(p, dev, &d, p->dropout > 0.0f) * sizeof(float);
}

/* The WEIGHT part: the MLP's products from the saved activations and dy (its dropout applied
 * again, in ws: N C floats), the attention projections' from the copies INPUT kept, which are
 * then released. */
static gp_status backward_weight(gp_layer *l, gp_ctx *c, const gp_coll_group *g,
                                 const gp_tensor *dy, float *ws, const gp_rng_stream *drop0,
                                 const gp_rng_stream *drop1) {
    const gp_block_impl *p = l->impl;
    const gp_attn_dims d = local_dims(p, &c->x->shape);
    const int64_t C = p->dim, F = p->d_ff / p->nshards, N = d.batch * d.seq;
    GP_TRY(gp_ctx_keep_begin(l, c, GP_BWD_WEIGHT, S_KEEP_DU, 3, NULL));
    /* (a shard's output bias gradient was added in the input part) */
    GP_TRY(gp_op_mlp_backward_weight(c->dev, N, C, F, SAVED_OPERAND(c, S_G), SAVED_OPERAND(c, S_LN2),
                                     WEIGHT(GP_BLK_MLP_W), WEIGHT(GP_BLK_FC_W), drop1, p->dropout,
                                     gp_f32(dy), SAVED(c, S_KEEP_DU), ws, GRAD(GP_BLK_MLP_W),
                                     g ? NULL : GRAD(GP_BLK_MLP_B), GRAD(GP_BLK_FC_W)));
    GP_TRY(attn_backward(l, g, c, &d, drop0, NULL, NULL, NULL, GP_BWD_WEIGHT));
    gp_ctx_keep_end(c, S_KEEP_DU, 3);
    return GP_OK;
}

gp_status gp_block_backward_part(gp_layer *l, gp_ctx *c, const gp_tensor *dy, gp_tensor *dx,
                                 gp_bwd_part part) {
    const gp_block_impl *p = l->impl;
    const gp_coll_group *g;
    GP_TRY(gp_tp_begin(l, c, S_G, p->shard, p->nshards, &g));
    const gp_attn_dims d = local_dims(p, &c->x->shape);
    gp_rng_stream s0, s1;
    const gp_rng_stream *drop0 = gp_tl_dropout(l, c, p->dropout, 0, &s0),
                        *drop1 = gp_tl_dropout(l, c, p->dropout, 1, &s1);
    gp_status st;
    const int64_t nws = part == GP_BWD_WEIGHT ? d.batch * d.seq * (int64_t)p->dim
                                              : backward_ws(p, c->dev, &d, drop0 != NULL);
    float *ws = gp_ctx_workspace(l, c, nws, &st);
    if (!ws) return st;
    st = part == GP_BWD_WEIGHT ? backward_weight(l, c, g, dy, ws, drop0, drop1)
                               : backward_input(l, c, g, dy, dx, ws, drop0, drop1, part);
    gp_ctx_workspace_release(c, ws);
    return st;
}

gp_status gp_block_backward(gp_layer *l, gp_ctx *c, const gp_tensor *dy, gp_tensor *dx) {
    return gp_block_backward_part(l, c, dy, dx, GP_BWD_ALL);
}

/* ------------------------------------------------------------ construction */

gp_layer *gp_block_new(const gp_layer_ops *ops, const gp_block_impl *p) {
    gp_layer *l = gp_layer_new_copy(ops, p, sizeof *p);
    if (!l) return NULL;
    const int dim = p->dim, Cl = p->dim / p->nshards, F = p->d_ff / p->nshards;
    gp_layer_add_param(l, "ln1.weight", gp_shape1(dim), GP_INIT_ONES, 0.0f, false);
    gp_layer_add_param(l, "ln1.bias", gp_shape1(dim), GP_INIT_ZEROS, 0.0f, false);
    gp_layer_add_param(l, "attn.qkv.weight", gp_shape2(3 * Cl, dim), GP_INIT_NORMAL, 0.02f, true)
        ->product = true;
    gp_layer_add_param(l, "attn.qkv.bias", gp_shape1(3 * Cl), GP_INIT_ZEROS, 0.0f, false);
    gp_layer_add_param(l, "attn.proj.weight", gp_shape2(dim, Cl), GP_INIT_NORMAL, 0.02f, true)
        ->product = true;
    gp_layer_add_param(l, "attn.proj.bias", gp_shape1(dim), GP_INIT_ZEROS, 0.0f, false);
    gp_layer_add_param(l, "ln2.weight", gp_shape1(dim), GP_INIT_ONES, 0.0f, false);
    gp_layer_add_param(l, "ln2.bias", gp_shape1(dim), GP_INIT_ZEROS, 0.0f, false);
    gp_layer_add_param(l, "mlp.fc.weight", gp_shape2(F, dim), GP_INIT_NORMAL, 0.02f, true)
        ->product = true;
    gp_layer_add_param(l, "mlp.fc.bias", gp_shape1(F), GP_INIT_ZEROS, 0.0f, false);
    gp_layer_add_param(l, "mlp.proj.weight", gp_shape2(dim, F), GP_INIT_NORMAL, 0.02f, true)
        ->product = true;
    gp_layer_add_param(l, "mlp.proj.bias", gp_shape1(dim), GP_INIT_ZEROS, 0.0f, false);
    return l;
}
