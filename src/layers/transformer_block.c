/* gp_transformer_block: one pre-LayerNorm GPT block as a single layer,
 *   h = x + drop0(attn(ln1(x)));  y = h + drop1(proj(gelu(fc(ln2(h))))),
 * residuals inside, built from the shared kernels of transformer_ops.h. */
#include <stdlib.h>

#include "layers/tp_ops.h"

#define LN_FWD_FLOPS 8.0
#define LN_BWD_FLOPS 14.0
#define GELU_FWD_FLOPS 24.0
#define GELU_BWD_FLOPS 32.0
#define DROPOUT_FLOPS 16.0

typedef struct block_impl {
    int dim, heads, d_ff;
    float dropout;
} block_impl;

/* Parameter indices, in the order the public names list them. */
enum {
    P_LN1_W, P_LN1_B, P_QKV_W, P_QKV_B, P_PROJ_W, P_PROJ_B,
    P_LN2_W, P_LN2_B, P_FC_W, P_FC_B, P_MLP_W, P_MLP_B
};
/* Saved tensors. */
enum {
    S_LN1, S_STATS1, S_QKV, S_PROBS, S_ATT, S_H, S_LN2, S_STATS2, S_U, S_G,
    /* a split backward's, from its input part to its weight part: the gradients at the MLP's
     * hidden layer (N, F), at the attention projection's output (N, C) and at qkv (N, 3C) */
    S_KEEP_DU, S_KEEP_DA, S_KEEP_DQKV
};

static gp_status block_out_shape(const gp_layer *l, const gp_shape *in, gp_dtype dtype,
                                 gp_shape *out) {
    const block_impl *p = l->impl;
    GP_TRY(gp_expect_dtype(l, dtype, GP_F32));
    GP_TRY(gp_expect_ndim(l, in, 3, "(B, T, C)"));
    GP_TRY(gp_expect_dim(l, in, 2, p->dim, "C (dim)"));
    *out = *in;
    return GP_OK;
}

static gp_attn_dims block_dims(const block_impl *p, const gp_shape *in) {
    return (gp_attn_dims){.batch = in->dim[0], .seq = in->dim[1], .dim = p->dim,
                          .heads = p->heads};
}

static gp_cost block_cost(const gp_layer *l, const gp_shape *in) {
    const block_impl *p = l->impl;
    gp_attn_dims d = block_dims(p, in);
    const double N = (double)(d.batch * d.seq), C = p->dim, F = p->d_ff;
    double af, ab;
    gp_op_mha_flops(&d, p->dropout, &af, &ab);
    const double mlp = 2.0 * 2.0 * N * C * F; /* fc and proj products */
    const double drop = p->dropout > 0.0f ? DROPOUT_FLOPS * N * C : 0.0;
    gp_cost c = {.param_bytes = gp_layer_param_bytes(l)};
    c.fwd_flops = af + 2.0 * LN_FWD_FLOPS * N * C + mlp + GELU_FWD_FLOPS * N * F +
                  (N * F + 2.0 * N * C) /* fc bias, proj bias and residual */ + drop;
    c.bwd_flops = ab + 2.0 * LN_BWD_FLOPS * N * C + 2.0 * mlp + GELU_BWD_FLOPS * N * F +
                  (N * F + 2.0 * N * C) /* bias column sums, residual */ + drop;
    const uint64_t n = (uint64_t)(d.batch * d.seq), dc = (uint64_t)p->dim, df = (uint64_t)p->d_ff;
    c.out_bytes = n * dc * sizeof(float);
    /* ln1(x), att, h, ln2(h): 4 NC; qkv 3 NC; probs B H T T; 2 x 2 N stats;
     * fc output before and after GELU: 2 N F. */
    c.saved_bytes = (4 * n * dc + 3 * n * dc + (uint64_t)(d.batch * d.heads * d.seq * d.seq) +
                     4 * n + 2 * n * df) *
                    sizeof(float);
    /* the weight part: the MLP's and the attention projections' weight products, bias sums */
    c.wgt_flops = mlp + 8.0 * N * C * C + 2.0 * N * C;
    c.wgt_keep_bytes = n * (df + 4 * dc) * sizeof(float);
    return c;
}

static gp_mha_weights block_attn_weights(gp_layer *l) {
    return (gp_mha_weights){
        .wqkv = GP_PVAL(l, P_QKV_W), .bqkv = GP_PVAL(l, P_QKV_B),
        .wproj = GP_PVAL(l, P_PROJ_W), .bproj = GP_PVAL(l, P_PROJ_B),
        .gwqkv = GP_PGRAD(l, P_QKV_W), .gbqkv = GP_PGRAD(l, P_QKV_B),
        .gwproj = GP_PGRAD(l, P_PROJ_W), .gbproj = GP_PGRAD(l, P_PROJ_B)};
}

/* The dropout stream of `site` for this call, or NULL when dropout is off. */
static const gp_rng_stream *block_drop(const gp_layer *l, const gp_ctx *c, int site,
                                       gp_rng_stream *s) {
    const block_impl *p = l->impl;
    if (!(p->dropout > 0.0f && c->run.training)) return NULL;
    *s = gp_op_dropout_stream(c->run.seed, l->index, site, c->run.step, c->run.micro_batch);
    return s;
}

#define VAL(i) GP_PVAL(l, i)
#define GRAD(i) GP_PGRAD(l, i)

static gp_status block_forward(gp_layer *l, gp_ctx *c, const gp_tensor *x, gp_tensor *y) {
    const block_impl *p = l->impl;
    gp_shape os;
    GP_TRY(block_out_shape(l, &x->shape, x->dtype, &os));
    GP_TRY(gp_layer_check_params(l, c, false));
    const gp_kernels *k = gp_ctx_kernels(c);
    gp_device *dev = c->dev;
    gp_attn_dims d = block_dims(p, &x->shape);
    const int64_t B = d.batch, T = d.seq, C = d.dim, H = d.heads, F = p->d_ff, N = B * T;
    gp_tensor *ln1, *st1, *qkv, *probs, *att, *h, *ln2, *st2, *u, *g;
    GP_TRY(gp_ctx_save(c, S_LN1, gp_shape2(N, C), GP_F32, &ln1));
    GP_TRY(gp_ctx_save(c, S_STATS1, gp_shape2(2, N), GP_F32, &st1));
    GP_TRY(gp_ctx_save(c, S_QKV, gp_shape2(N, 3 * C), GP_F32, &qkv));
    GP_TRY(gp_ctx_save(c, S_PROBS, gp_shape4(B, H, T, T), GP_F32, &probs));
    GP_TRY(gp_ctx_save(c, S_ATT, gp_shape2(N, C), GP_F32, &att));
    GP_TRY(gp_ctx_save(c, S_H, gp_shape2(N, C), GP_F32, &h));
    GP_TRY(gp_ctx_save(c, S_LN2, gp_shape2(N, C), GP_F32, &ln2));
    GP_TRY(gp_ctx_save(c, S_STATS2, gp_shape2(2, N), GP_F32, &st2));
    GP_TRY(gp_ctx_save(c, S_U, gp_shape2(N, F), GP_F32, &u));
    GP_TRY(gp_ctx_save(c, S_G, gp_shape2(N, F), GP_F32, &g));
    gp_rng_stream s0, s1;
    const gp_rng_stream *drop0 = block_drop(l, c, 0, &s0), *drop1 = block_drop(l, c, 1, &s1);

    /* h = x + drop0(attn(ln1(x))) */
    GP_TRY(k->layernorm_forward(dev, N, C, gp_f32(x), VAL(P_LN1_W), VAL(P_LN1_B), gp_f32(ln1),
                                gp_f32(st1)));
    gp_mha_weights w = block_attn_weights(l);
    gp_mha_saved sv = {.qkv = gp_f32(qkv), .probs = gp_f32(probs), .att = gp_f32(att)};
    GP_TRY(gp_op_mha_forward(dev, &d, &w, gp_f32(ln1), gp_f32(x), drop0, p->dropout, &sv,
                             gp_f32(h)));

    /* y = h + drop1(proj(gelu(fc(ln2(h))))) */
    GP_TRY(k->layernorm_forward(dev, N, C, gp_f32(h), VAL(P_LN2_W), VAL(P_LN2_B), gp_f32(ln2),
                                gp_f32(st2)));
    GP_TRY(k->linear_forward(dev, N, C, F, gp_f32(ln2), VAL(P_FC_W), VAL(P_FC_B), NULL,
                             gp_f32(u)));
    GP_TRY(k->gelu_forward(dev, N * F, gp_f32(u), gp_f32(g)));
    if (drop1) {
        GP_TRY(k->linear_forward(dev, N, F, C, gp_f32(g), VAL(P_MLP_W), VAL(P_MLP_B), NULL,
                                 gp_f32(y)));
        return k->dropout(dev, drop1, p->dropout, N * C, gp_f32(y), gp_f32(h), gp_f32(y));
    }
    return k->linear_forward(dev, N, F, C, gp_f32(g), VAL(P_MLP_W), VAL(P_MLP_B), gp_f32(h),
                             gp_f32(y));
}

/* The backward proper (or its INPUT part) in the workspace ws: dh (N, C) | small (N, C) | big,
 * shared by the MLP's
 * (N, F) gradient and then the attention sublayer's workspace. */
static gp_status block_backward_ws(gp_layer *l, gp_ctx *c, const gp_tensor *dy, gp_tensor *dx,
                                   float *ws, const gp_rng_stream *drop0,
                                   const gp_rng_stream *drop1, gp_bwd_part part) {
    const block_impl *p = l->impl;
    const float *ln1 = gp_f32(&c->saved[S_LN1]), *h = gp_f32(&c->saved[S_H]);
    const float *ln2 = gp_f32(&c->saved[S_LN2]), *u = gp_f32(&c->saved[S_U]);
    const float *g = gp_f32(&c->saved[S_G]);
    const gp_kernels *k = gp_ctx_kernels(c);
    gp_device *dev = c->dev;
    gp_attn_dims d = block_dims(p, &c->x->shape);
    const int64_t C = d.dim, F = p->d_ff, N = d.batch * d.seq;
    float *dh = ws, *small = ws + N * C, *big = ws + 2 * N * C;
    /* INPUT leaves the weight products (the bias of fc, inside gelu', and the layer norms are
     * cheap: done here) to WEIGHT, with copies of the gradients they read */
    const bool wt = part == GP_BWD_ALL;
    const gp_shape keep[3] = {gp_shape2(N, F), gp_shape2(N, C), gp_shape2(N, 3 * C)};
    GP_TRY(gp_ctx_keep_begin(l, c, part, S_KEEP_DU, 3, keep));
    float *keep_du = gp_f32(&c->saved[S_KEEP_DU]), *keep_da = gp_f32(&c->saved[S_KEEP_DA]);
    float *keep_dqkv = gp_f32(&c->saved[S_KEEP_DQKV]);

    /* MLP branch: dmo = drop1'(dy); dU = dmo Wp (then * gelu'(u)); dln2 = dU Wfc. */
    const float *dmo = gp_f32(dy);
    if (drop1) {
        GP_TRY(k->dropout(dev, drop1, p->dropout, N * C, gp_f32(dy), NULL, small));
        dmo = small;
    }
    GP_TRY(k->linear_backward(dev, N, F, C, g, VAL(P_MLP_W), dmo, big, wt ? GRAD(P_MLP_W) : NULL,
                              wt ? GRAD(P_MLP_B) : NULL));
    GP_TRY(k->gelu_backward(dev, N, F, u, big, big, GRAD(P_FC_B)));
    if (!wt)
        GP_TRY(gp_device_copy(dev, keep_du, big, (size_t)(N * F) * sizeof(float),
                              GP_COPY_DEVICE_TO_DEVICE));
    GP_TRY(k->linear_backward(dev, N, C, F, ln2, VAL(P_FC_W), big, small,
                              wt ? GRAD(P_FC_W) : NULL, NULL));
    /* dh = dy + ln2'(dln2): the residual's gradient joins here. */
    GP_TRY(k->layernorm_backward(dev, N, C, h, VAL(P_LN2_W), gp_f32(&c->saved[S_STATS2]), small,
                                 gp_f32(dy), dh, GRAD(P_LN2_W), GRAD(P_LN2_B)));

    /* Attention branch: dln1 = attn'(dh) into small; dx = dh + ln1'(dln1). */
    gp_mha_weights w = block_attn_weights(l);
    gp_mha_saved sv = {.qkv = gp_f32(&c->saved[S_QKV]), .probs = gp_f32(&c->saved[S_PROBS]),
                       .att = gp_f32(&c->saved[S_ATT])};
    GP_TRY(gp_op_mha_backward_part(dev, &d, &w, ln1, &sv, drop0, p->dropout, dh, big, small,
                                   part, keep_da, keep_dqkv));
    return k->layernorm_backward(dev, N, C, gp_f32(c->x), VAL(P_LN1_W),
                                 gp_f32(&c->saved[S_STATS1]), small, dh, dx ? gp_f32(dx) : NULL,
                                 GRAD(P_LN1_W), GRAD(P_LN1_B));
}

/* Floats of block_backward_ws's workspace. */
static int64_t backward_ws(const block_impl *p, gp_device *dev, const gp_attn_dims *d,
                           bool dropout) {
    const int64_t C = d->dim, F = p->d_ff, N = d->batch * d->seq;
    const int64_t attn_ws = gp_op_mha_backward_ws(dev, d, dropout);
    return 2 * N * C + (attn_ws > N * F ? attn_ws : N * F);
}

static uint64_t block_workspace(const gp_layer *l, gp_device *dev, const gp_shape *in,
                               bool input_grad) {
    const block_impl *p = l->impl;
    const gp_attn_dims d = block_dims(p, in);
    return (uint64_t)backward_ws(p, dev, &d, p->dropout > 0.0f) * sizeof(float);
}

/* The WEIGHT part: the MLP's products from the saved activations and dy (its dropout applied
 * again, in ws: N C floats), the attention projections' from the copies INPUT kept, which are
 * then released. */
static gp_status block_backward_weight(gp_layer *l, gp_ctx *c, const gp_tensor *dy, float *ws,
                                       const gp_rng_stream *drop0, const gp_rng_stream *drop1) {
    const block_impl *p = l->impl;
    gp_device *dev = c->dev;
    gp_attn_dims d = block_dims(p, &c->x->shape);
    const int64_t C = d.dim, F = p->d_ff, N = d.batch * d.seq;
    GP_TRY(gp_ctx_keep_begin(l, c, GP_BWD_WEIGHT, S_KEEP_DU, 3, NULL));
    GP_TRY(gp_op_mlp_backward_weight(dev, N, C, F, gp_f32(&c->saved[S_G]),
                                     gp_f32(&c->saved[S_LN2]), VAL(P_MLP_W), VAL(P_FC_W), drop1,
                                     p->dropout, gp_f32(dy), gp_f32(&c->saved[S_KEEP_DU]), ws,
                                     GRAD(P_MLP_W), GRAD(P_MLP_B), GRAD(P_FC_W)));
    gp_mha_weights w = block_attn_weights(l);
    gp_mha_saved sv = {.qkv = gp_f32(&c->saved[S_QKV]), .probs = gp_f32(&c->saved[S_PROBS]),
                       .att = gp_f32(&c->saved[S_ATT])};
    GP_TRY(gp_op_mha_backward_part(dev, &d, &w, gp_f32(&c->saved[S_LN1]), &sv, drop0,
                                   p->dropout, NULL, NULL, NULL, GP_BWD_WEIGHT,
                                   gp_f32(&c->saved[S_KEEP_DA]), gp_f32(&c->saved[S_KEEP_DQKV])));
    gp_ctx_keep_end(c, S_KEEP_DU, 3);
    return GP_OK;
}

static gp_status block_backward_part(gp_layer *l, gp_ctx *c, const gp_tensor *dy, gp_tensor *dx,
                                     gp_bwd_part part) {
    const block_impl *p = l->impl;
    GP_TRY(gp_layer_check_params(l, c, true));
    if (!c->saved[S_G].data)
        return gp_error(GP_INVALID_ARGUMENT, "layer %d (%s): backward without a saved forward",
                        l->index, l->ops->kind);
    gp_attn_dims d = block_dims(p, &c->x->shape);
    gp_rng_stream s0, s1;
    const gp_rng_stream *drop0 = block_drop(l, c, 0, &s0), *drop1 = block_drop(l, c, 1, &s1);
    gp_status st;
    const int64_t nws = part == GP_BWD_WEIGHT ? d.batch * d.seq * d.dim
                                              : backward_ws(p, c->dev, &d, drop0 != NULL);
    float *ws = gp_ctx_workspace(l, c, nws, &st);
    if (!ws) return st;
    st = part == GP_BWD_WEIGHT ? block_backward_weight(l, c, dy, ws, drop0, drop1)
                               : block_backward_ws(l, c, dy, dx, ws, drop0, drop1, part);
    gp_ctx_workspace_release(c, ws);
    return st;
}

static gp_status block_backward(gp_layer *l, gp_ctx *c, const gp_tensor *dy, gp_tensor *dx) {
    return block_backward_part(l, c, dy, dx, GP_BWD_ALL);
}

/* Megatron's layout: attention by heads (qkv by rows, q, k and v alike; the output projection
 * by columns), the MLP by d_ff (fc by rows, its bias too; the output projection by columns);
 * layer norms and the output biases replicated. */
static void block_layout(const gp_layer *l, gp_layout *out) {
    const block_impl *p = l->impl;
    *out = (gp_layout){.ndims = 2,
                       .dims = {{"heads", p->heads, "tensor"}, {"d_ff", p->d_ff, "tensor"}},
                       .nsplits = 6,
                       .splits = {{P_QKV_W, 0, 3, 0},
                                  {P_QKV_B, 0, 3, 0},
                                  {P_PROJ_W, 1, 1, 0},
                                  {P_FC_W, 0, 1, 1},
                                  {P_FC_B, 0, 1, 1},
                                  {P_MLP_W, 1, 1, 1}}};
}

static gp_layer *block_shard(const gp_layer *l, int nshards) {
    if (nshards == 1) return gp_layer_copy(l, sizeof(block_impl)); /* replicated */
    const block_impl *p = l->impl;
    return gp_transformer_block_shard(p->dim, p->heads, p->d_ff, p->dropout, nshards);
}

static const gp_layer_ops block_ops = {
    .kind = "transformer_block",
    .out_shape = block_out_shape,
    .cost = block_cost,
    .workspace_bytes = block_workspace,
    .forward = block_forward,
    .backward = block_backward,
    .backward_part = block_backward_part,
    .layout = block_layout,
    .shard = block_shard,
};

gp_layer *gp_transformer_block(int dim, int heads, int d_ff, float dropout) {
    if (dim < 1 || heads < 1 || dim % heads != 0 || d_ff < 1) {
        gp_error(GP_INVALID_ARGUMENT,
                 "gp_transformer_block: dim = %d must be a positive multiple of heads = %d, "
                 "and d_ff = %d must be >= 1",
                 dim, heads, d_ff);
        return NULL;
    }
    if (!(dropout >= 0.0f && dropout < 1.0f)) {
        gp_error(GP_INVALID_ARGUMENT,
                 "gp_transformer_block: dropout = %g must satisfy 0 <= p < 1", (double)dropout);
        return NULL;
    }
    block_impl *p = malloc(sizeof *p);
    if (!p) {
        gp_error(GP_OUT_OF_MEMORY, "gp_transformer_block: cannot allocate the layer");
        return NULL;
    }
    *p = (block_impl){.dim = dim, .heads = heads, .d_ff = d_ff, .dropout = dropout};
    gp_layer *l = gp_layer_new(&block_ops, p);
    if (!l) return NULL;
    gp_layer_add_param(l, "ln1.weight", gp_shape1(dim), GP_INIT_ONES, 0.0f, false);
    gp_layer_add_param(l, "ln1.bias", gp_shape1(dim), GP_INIT_ZEROS, 0.0f, false);
    gp_layer_add_param(l, "attn.qkv.weight", gp_shape2(3 * dim, dim), GP_INIT_NORMAL, 0.02f, true);
    gp_layer_add_param(l, "attn.qkv.bias", gp_shape1(3 * dim), GP_INIT_ZEROS, 0.0f, false);
    gp_layer_add_param(l, "attn.proj.weight", gp_shape2(dim, dim), GP_INIT_NORMAL, 0.02f, true);
    gp_layer_add_param(l, "attn.proj.bias", gp_shape1(dim), GP_INIT_ZEROS, 0.0f, false);
    gp_layer_add_param(l, "ln2.weight", gp_shape1(dim), GP_INIT_ONES, 0.0f, false);
    gp_layer_add_param(l, "ln2.bias", gp_shape1(dim), GP_INIT_ZEROS, 0.0f, false);
    gp_layer_add_param(l, "mlp.fc.weight", gp_shape2(d_ff, dim), GP_INIT_NORMAL, 0.02f, true);
    gp_layer_add_param(l, "mlp.fc.bias", gp_shape1(d_ff), GP_INIT_ZEROS, 0.0f, false);
    gp_layer_add_param(l, "mlp.proj.weight", gp_shape2(dim, d_ff), GP_INIT_NORMAL, 0.02f, true);
    gp_layer_add_param(l, "mlp.proj.bias", gp_shape1(dim), GP_INIT_ZEROS, 0.0f, false);
    return l;
}
