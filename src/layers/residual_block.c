/* gp_residual_block: the basic block of a ResNet (He et al.) as one layer,
 *   y = relu(bn2(conv2(relu(bn1(conv1(x))))) + shortcut(x)),
 * conv1 3x3 with the block's stride, conv2 3x3, both without bias; the shortcut is x itself, or
 * bn(conv 1x1 with the stride)(x) when the stride or the channel count changes. The block is
 * composed from the conv2d and batchnorm2d layers: it owns their parameters (under its own names,
 * "conv1.weight", "bn1.running_mean", "shortcut.conv.weight", ...) and binds them to its parts
 * before every call, so the parts compute exactly as the same layers in a sequence would. */
#include <stdlib.h>
#include <string.h>

#include "layers/layer_base.h"

typedef struct block_cfg {
    int in_ch, out_ch, stride;
} block_cfg;

/* The parts, in the order their parameters are the block's. */
enum { CONV1, BN1, CONV2, BN2, SC_CONV, SC_BN, NPARTS };

typedef struct block_impl {
    block_cfg cfg;
    gp_layer *part[NPARTS]; /* SC_CONV and SC_BN NULL for an identity shortcut */
    int first[NPARTS];      /* index of the part's first parameter among the block's */
} block_impl;

/* Saved tensors of a call: the inputs of the parts that need them in backward; then, from a
 * split backward's input part to its weight part, the output gradients of the convolutions. */
enum { S_A, S_R, S_D, S_SC, S_KEEP_DCONV1, S_KEEP_DCONV2, S_KEEP_DSC };

/* Names must be static strings: "<prefix><part's name>" for every parameter a part declares. */
static const char *param_name(int part, const char *name) {
    static const char *const conv[] = {"conv1.weight", NULL, "conv2.weight", NULL,
                                       "shortcut.conv.weight", NULL};
    static const char *const bn[][4] = {
        {0}, {"bn1.weight", "bn1.bias", "bn1.running_mean", "bn1.running_var"},
        {0}, {"bn2.weight", "bn2.bias", "bn2.running_mean", "bn2.running_var"},
        {0}, {"shortcut.bn.weight", "shortcut.bn.bias", "shortcut.bn.running_mean",
              "shortcut.bn.running_var"}};
    static const char *const bn_names[4] = {"weight", "bias", "running_mean", "running_var"};
    if (conv[part]) return conv[part];
    for (int i = 0; i < 4; i++)
        if (strcmp(name, bn_names[i]) == 0) return bn[part][i];
    return NULL;
}

static bool projection(const block_cfg *cf) { return cf->stride != 1 || cf->in_ch != cf->out_ch; }

/* The parts see the block's parameters (values, gradients) as their own, without owning them. */
static void bind(gp_layer *l) {
    block_impl *b = l->impl;
    for (int p = 0; p < NPARTS; p++) {
        gp_layer *part = b->part[p];
        if (!part) continue;
        part->index = l->index;
        for (int j = 0; j < part->nparams; j++) {
            const gp_param *own = &l->params[b->first[p] + j];
            gp_param *q = &part->params[j];
            q->value = own->value;
            q->grad = own->grad;
            q->gen = own->gen;
            q->value.owned = false;
            q->grad.owned = false;
        }
    }
}

static gp_status block_geom(const gp_layer *l, const gp_shape *in, gp_dtype dtype, gp_shape *mid) {
    const block_impl *b = l->impl;
    return b->part[CONV1]->ops->out_shape(b->part[CONV1], in, dtype, mid);
}

static gp_status block_out_shape(const gp_layer *l, const gp_shape *in, gp_dtype dtype,
                                 gp_shape *out) {
    char buf[96];
    if (in->ndim == 4 && in->dim[1] != ((const block_impl *)l->impl)->cfg.in_ch)
        return gp_error(GP_SHAPE,
                        "layer %d (residual_block): input shape %s: expected %d channels "
                        "(dim 1 of (B, C, H, W))",
                        l->index, gp_shape_str(in, buf, sizeof buf),
                        ((const block_impl *)l->impl)->cfg.in_ch);
    return block_geom(l, in, dtype, out);
}

static gp_cost block_cost(const gp_layer *l, const gp_shape *in) {
    const block_impl *b = l->impl;
    gp_cost c = {.param_bytes = gp_layer_param_bytes(l)};
    gp_shape mid;
    if (in->ndim != 4 || block_geom(l, in, GP_F32, &mid) != GP_OK) return c;
    const gp_shape *ins[NPARTS] = {in, &mid, &mid, &mid, in, &mid};
    for (int p = 0; p < NPARTS; p++) {
        if (!b->part[p]) continue;
        gp_cost pc = b->part[p]->ops->cost(b->part[p], ins[p]);
        c.fwd_flops += pc.fwd_flops;
        c.bwd_flops += pc.bwd_flops;
        c.wgt_flops += pc.wgt_flops;
        c.saved_bytes += pc.saved_bytes;
    }
    const double n = (double)gp_shape_nelem(&mid);
    c.fwd_flops += 4 * n; /* the two ReLUs and the sum */
    c.bwd_flops += 3 * n;
    c.out_bytes = (uint64_t)n * sizeof(float);
    /* conv1's, bn1's (kept as its ReLU's output), conv2's outputs, and the shortcut conv's. */
    c.saved_bytes += (uint64_t)n * sizeof(float) * (projection(&b->cfg) ? 4 : 3);
    c.wgt_keep_bytes = (uint64_t)n * sizeof(float) * (projection(&b->cfg) ? 3 : 2);
    return c;
}

/* The parts' workspace (the most one holds) or, derived, what they keep derived from the
 * block's values (all of it at once). */
static uint64_t parts_bytes(const gp_layer *l, gp_device *dev, const gp_shape *in,
                            bool input_grad, bool derived) {
    const block_impl *b = l->impl;
    gp_shape mid;
    if (in->ndim != 4 || block_geom(l, in, GP_F32, &mid) != GP_OK) return 0;
    const gp_shape *ins[NPARTS] = {in, &mid, &mid, &mid, in, &mid};
    uint64_t bytes = 0;
    for (int p = 0; p < NPARTS; p++) {
        const gp_layer *part = b->part[p];
        if (!part) continue;
        uint64_t (*fn)(const gp_layer *, gp_device *, const gp_shape *, bool) =
            derived ? part->ops->derived_bytes : part->ops->workspace_bytes;
        if (!fn) continue;
        /* the parts on the block's input get its input gradient; the others always do */
        const bool part_dx = input_grad || (p != CONV1 && p != SC_CONV);
        const uint64_t w = fn(part, dev, ins[p], part_dx);
        bytes = derived ? bytes + w : (w > bytes ? w : bytes);
    }
    return bytes;
}

/* The backward's own workspace (the larger: the forward's is one of its three planes) plus the
 * most any part's convolution holds inside it. */
static uint64_t block_workspace(const gp_layer *l, gp_device *dev, const gp_shape *in,
                               bool input_grad) {
    const block_impl *b = l->impl;
    gp_shape mid;
    if (in->ndim != 4 || block_geom(l, in, GP_F32, &mid) != GP_OK) return 0;
    const uint64_t parts = parts_bytes(l, dev, in, input_grad, false);
    const uint64_t n = (uint64_t)gp_shape_nelem(&mid), nx = (uint64_t)gp_shape_nelem(in);
    return (3 * n + (b->part[SC_CONV] && input_grad ? nx : 0)) * sizeof(float) + parts;
}

static uint64_t block_derived(const gp_layer *l, gp_device *dev, const gp_shape *in,
                              bool input_grad) {
    return parts_bytes(l, dev, in, input_grad, true);
}

/* A float tensor at p on the call's device (part of the layer's workspace). */
static gp_tensor ws_tensor(const gp_ctx *c, float *p, gp_shape s) {
    return (gp_tensor){.data = p, .shape = s, .dtype = GP_F32, .dev = c->dev,
                       .cat = GP_MEM_WORKSPACE, .owned = false};
}

/* Runs part p forward with its own child context: input x, output y. */
static gp_status part_forward(gp_layer *l, gp_ctx *c, int p, const gp_tensor *x, gp_tensor *y) {
    block_impl *b = l->impl;
    gp_ctx *pc;
    GP_TRY(gp_ctx_child(c, p, NPARTS, &pc));
    pc->x = x;
    pc->y = y;
    return b->part[p]->ops->forward(b->part[p], pc, x, y);
}

/* Part p's backward (a convolution's in parts: INPUT also keeps a copy of dy in saved slot
 * `keep` for the WEIGHT part). */
static gp_status part_backward_as(gp_layer *l, gp_ctx *c, int p, const gp_tensor *dy,
                                  gp_tensor *dx, gp_bwd_part part, int keep) {
    block_impl *b = l->impl;
    if (part == GP_BWD_INPUT && keep >= 0) {
        gp_tensor *t;
        GP_TRY(gp_ctx_save(c, keep, dy->shape, GP_F32, &t));
        GP_TRY(gp_tensor_copy(t, dy));
    }
    return gp_layer_backward_part(b->part[p], &c->children[p], dy, dx, part);
}

static gp_status block_forward(gp_layer *l, gp_ctx *c, const gp_tensor *x, gp_tensor *y) {
    const block_impl *b = l->impl;
    gp_shape mid;
    GP_TRY(block_out_shape(l, &x->shape, x->dtype, &mid));
    GP_TRY(gp_layer_check_params(l, c, false));
    bind(l);
    const gp_kernels *k = gp_ctx_kernels(c);
    const int64_t n = gp_shape_nelem(&mid);
    gp_tensor *a, *r, *d, *sc = NULL;
    GP_TRY(gp_ctx_save(c, S_A, mid, GP_F32, &a));
    GP_TRY(gp_ctx_save(c, S_R, mid, GP_F32, &r));
    GP_TRY(gp_ctx_save(c, S_D, mid, GP_F32, &d));
    if (b->part[SC_CONV]) GP_TRY(gp_ctx_save(c, S_SC, mid, GP_F32, &sc));
    gp_status st = GP_OK;
    float *tmp = gp_ctx_workspace(l, c, n, &st);
    if (!tmp) return st;
    gp_tensor t = ws_tensor(c, tmp, mid);
    /* main path: a = conv1(x), t = bn1(a), r = relu(t), d = conv2(r), y = bn2(d) */
    if ((st = part_forward(l, c, CONV1, x, a)) == GP_OK &&
        (st = part_forward(l, c, BN1, a, &t)) == GP_OK &&
        (st = k->relu_forward(c->dev, n, tmp, gp_f32(r))) == GP_OK &&
        (st = part_forward(l, c, CONV2, r, d)) == GP_OK)
        st = part_forward(l, c, BN2, d, y);
    /* y += shortcut(x), then y = relu(y) */
    if (st == GP_OK && sc) {
        if ((st = part_forward(l, c, SC_CONV, x, sc)) == GP_OK &&
            (st = part_forward(l, c, SC_BN, sc, &t)) == GP_OK)
            st = k->axpy(c->dev, n, 1.0f, tmp, gp_f32(y));
    } else if (st == GP_OK) {
        st = k->axpy(c->dev, n, 1.0f, gp_f32(x), gp_f32(y));
    }
    gp_ctx_workspace_release(c, tmp);
    GP_TRY(st);
    return k->relu_forward(c->dev, n, gp_f32(y), gp_f32(y));
}

/* The WEIGHT part: the convolutions' weight gradients from the copies the INPUT part kept. */
static gp_status block_backward_weight(gp_layer *l, gp_ctx *c) {
    const block_impl *b = l->impl;
    if (!c->saved[S_KEEP_DCONV1].data)
        return gp_error(GP_INTERNAL, "layer %d (residual_block): weight gradients before the "
                                     "input part", l->index);
    bind(l);
    gp_status st = part_backward_as(l, c, CONV2, &c->saved[S_KEEP_DCONV2], NULL, GP_BWD_WEIGHT, -1);
    if (st == GP_OK)
        st = part_backward_as(l, c, CONV1, &c->saved[S_KEEP_DCONV1], NULL, GP_BWD_WEIGHT, -1);
    if (st == GP_OK && b->part[SC_CONV])
        st = part_backward_as(l, c, SC_CONV, &c->saved[S_KEEP_DSC], NULL, GP_BWD_WEIGHT, -1);
    for (int i = S_KEEP_DCONV1; i <= S_KEEP_DSC; i++) gp_tensor_release(&c->saved[i]);
    return st;
}

static gp_status block_backward_part(gp_layer *l, gp_ctx *c, const gp_tensor *dy, gp_tensor *dx,
                                     gp_bwd_part part) {
    if (part == GP_BWD_WEIGHT) return block_backward_weight(l, c);
    const block_impl *b = l->impl;
    const gp_tensor *x = c->x, *y = c->y;
    if (!x || !y || !c->saved[S_D].data || !c->children)
        return gp_error(GP_INTERNAL, "layer %d (residual_block): backward without its forward",
                        l->index);
    gp_shape mid;
    GP_TRY(block_out_shape(l, &x->shape, x->dtype, &mid));
    char s1[96], s2[96];
    if (!gp_shape_equal(&dy->shape, &mid) || (dx && !gp_shape_equal(&dx->shape, &x->shape)))
        return gp_error(GP_SHAPE,
                        "layer %d (residual_block): gradients of shapes %s (output) and %s "
                        "(input), expected the output's and the input's",
                        l->index, gp_shape_str(&dy->shape, s1, sizeof s1),
                        dx ? gp_shape_str(&dx->shape, s2, sizeof s2) : "none");
    GP_TRY(gp_layer_check_params(l, c, true));
    bind(l);
    const gp_kernels *k = gp_ctx_kernels(c);
    const int64_t n = gp_shape_nelem(&mid), nx = gp_shape_nelem(&x->shape);
    /* g: the gradient at the sum | u, v: the parts' gradients | w: the shortcut's dx */
    const bool proj = b->part[SC_CONV] != NULL;
    gp_status st = GP_OK;
    float *ws = gp_ctx_workspace(l, c, 3 * n + (proj && dx ? nx : 0), &st);
    if (!ws) return st;
    gp_tensor g = ws_tensor(c, ws, mid), u = ws_tensor(c, ws + n, mid),
              v = ws_tensor(c, ws + 2 * n, mid), w = ws_tensor(c, ws + 3 * n, x->shape);
    const gp_tensor *r = &c->saved[S_R];
    /* The output ReLU: y > 0 exactly where the sum was. */
    if ((st = k->relu_backward(c->dev, n, gp_f32(y), gp_f32(dy), ws)) == GP_OK &&
        (st = part_backward_as(l, c, BN2, &g, &u, part, -1)) == GP_OK &&
        (st = part_backward_as(l, c, CONV2, &u, &v, part, S_KEEP_DCONV2)) == GP_OK &&
        /* bn1's output was > 0 exactly where r = relu(it) is */
        (st = k->relu_backward(c->dev, n, gp_f32(r), gp_f32(&v), gp_f32(&v))) == GP_OK &&
        (st = part_backward_as(l, c, BN1, &v, &u, part, -1)) == GP_OK)
        st = part_backward_as(l, c, CONV1, &u, dx, part, S_KEEP_DCONV1);
    if (st == GP_OK && proj) {
        if ((st = part_backward_as(l, c, SC_BN, &g, &v, part, -1)) == GP_OK)
            st = part_backward_as(l, c, SC_CONV, &v, dx ? &w : NULL, part, S_KEEP_DSC);
        if (st == GP_OK && dx) st = k->axpy(c->dev, nx, 1.0f, gp_f32(&w), gp_f32(dx));
    } else if (st == GP_OK && dx) {
        st = k->axpy(c->dev, n, 1.0f, ws, gp_f32(dx));
    }
    gp_ctx_workspace_release(c, ws);
    return st;
}

static gp_status block_backward(gp_layer *l, gp_ctx *c, const gp_tensor *dy, gp_tensor *dx) {
    return block_backward_part(l, c, dy, dx, GP_BWD_ALL);
}

static void block_destroy(gp_layer *l) {
    block_impl *b = l->impl;
    if (!b) return;
    for (int p = 0; p < NPARTS; p++) {
        if (!b->part[p]) continue;
        /* The parts' parameter tensors are views of the block's: not theirs to release. */
        for (int j = 0; j < b->part[p]->nparams; j++) {
            b->part[p]->params[j].value = (gp_tensor){0};
            b->part[p]->params[j].grad = (gp_tensor){0};
        }
        gp_layer_free(b->part[p]);
    }
    free(b);
}

/* What the parts derived from the block's values (their transformed weights). */
static void block_drop_derived(gp_layer *l) {
    block_impl *b = l->impl;
    for (int p = 0; p < NPARTS; p++)
        if (b->part[p] && b->part[p]->ops->drop_derived) b->part[p]->ops->drop_derived(b->part[p]);
}

/* Replicated over the tensor axis: every shard holds the whole block. */
static gp_layer *block_shard(const gp_layer *l, int nshards) {
    (void)nshards;
    const block_cfg *cf = &((const block_impl *)l->impl)->cfg;
    gp_layer *s = gp_residual_block(cf->in_ch, cf->out_ch, cf->stride);
    if (s) s->index = l->index;
    return s;
}

static const gp_layer_ops block_ops = {
    .kind = "residual_block",
    .out_shape = block_out_shape,
    .cost = block_cost,
    .workspace_bytes = block_workspace,
    .derived_bytes = block_derived,
    .forward = block_forward,
    .backward = block_backward,
    .backward_part = block_backward_part,
    .destroy = block_destroy,
    .shard = block_shard,
    .drop_derived = block_drop_derived,
};

gp_layer *gp_residual_block(int in_ch, int out_ch, int stride) {
    if (in_ch < 1 || out_ch < 1 || stride < 1) {
        gp_error(GP_INVALID_ARGUMENT,
                 "residual_block(in_ch %d, out_ch %d, stride %d): channels and stride must be "
                 ">= 1",
                 in_ch, out_ch, stride);
        return NULL;
    }
    block_impl *b = calloc(1, sizeof *b);
    if (!b) {
        gp_error(GP_OUT_OF_MEMORY, "residual_block: cannot allocate the layer");
        return NULL;
    }
    b->cfg = (block_cfg){in_ch, out_ch, stride};
    gp_layer *part[NPARTS] = {gp_conv2d(in_ch, out_ch, 3, stride, 1, false), gp_batchnorm2d(out_ch),
                              gp_conv2d(out_ch, out_ch, 3, 1, 1, false), gp_batchnorm2d(out_ch),
                              NULL, NULL};
    if (projection(&b->cfg)) {
        part[SC_CONV] = gp_conv2d(in_ch, out_ch, 1, stride, 0, false);
        part[SC_BN] = gp_batchnorm2d(out_ch);
    }
    bool ok = true;
    for (int p = 0; p < NPARTS; p++) {
        b->part[p] = part[p];
        if ((p < SC_CONV || projection(&b->cfg)) && !part[p]) ok = false;
    }
    gp_layer *l = ok ? gp_layer_new(&block_ops, b) : NULL; /* frees b on failure */
    if (!l) {
        if (ok) gp_error(GP_OUT_OF_MEMORY, "residual_block: cannot allocate the layer");
        else free(b);
        for (int p = 0; p < NPARTS; p++) gp_layer_free(part[p]);
        return NULL;
    }
    for (int p = 0; p < NPARTS; p++) {
        const gp_layer *part = b->part[p];
        if (!part) continue;
        b->first[p] = l->nparams;
        for (int j = 0; j < part->nparams; j++) {
            const gp_param *q = &part->params[j];
            const char *name = param_name(p, q->name);
            if (q->trainable)
                gp_layer_add_param(l, name, q->shape, q->init, q->init_scale, q->decay);
            else
                gp_layer_add_buffer(l, name, q->shape, q->init);
        }
    }
    return l;
}
