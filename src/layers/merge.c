/* Merge layers: a layer's input joined with the output of a named earlier layer (a skip
 * connection), by addition or by concatenation along dimension 1 (the channels of a feature
 * map, the features of a vector). The skip arrives in the call's context (ctx->skip, its
 * gradient into ctx->dskip): where it comes from, and how its gradient is added to its source's,
 * is the sequence runner's business (model/sequence.c). */
#include <stdlib.h>
#include <string.h>

#include "core/tensor.h"
#include "layers/merge.h"

typedef struct merge_impl {
    bool concat;
    bool bound;
    gp_shape skip; /* one example of the skip, batch 1 in front (gp_merge_bind) */
} merge_impl;

gp_status gp_merge_bind(gp_layer *l, const gp_shape *skip) {
    merge_impl *mi = l->impl;
    mi->skip = *skip;
    mi->bound = true;
    return GP_OK;
}

/* The skip's shape at the input's batch size. */
static gp_shape skip_at(const merge_impl *mi, int64_t batch) {
    gp_shape s = mi->skip;
    s.dim[0] = batch;
    return s;
}

static gp_status merge_out_shape(const gp_layer *l, const gp_shape *in, gp_dtype dtype,
                                 gp_shape *out) {
    const merge_impl *mi = l->impl;
    char a[96], b[96];
    GP_TRY(gp_expect_dtype(l, dtype, GP_F32));
    if (!mi->bound)
        return gp_error(GP_INVALID_ARGUMENT, "layer %d (%s): reads layer %d's output but is "
                        "in no model: add it to one with gp_model_add", l->index, l->ops->kind,
                        l->skip_from);
    if (in->ndim < 1)
        return gp_error(GP_SHAPE, "layer %d (%s): input shape %s has no dimensions", l->index,
                        l->ops->kind, gp_shape_str(in, a, sizeof a));
    const gp_shape sk = skip_at(mi, in->dim[0]);
    gp_shape_str(in, a, sizeof a);
    gp_shape_str(&sk, b, sizeof b);
    if (!mi->concat) {
        if (!gp_shape_equal(in, &sk))
            return gp_error(GP_SHAPE, "layer %d (add): input %s and layer %d's output %s: "
                            "expected the same shape", l->index, a, l->skip_from, b);
        *out = *in;
        return GP_OK;
    }
    bool same = in->ndim == sk.ndim && in->ndim >= 2;
    for (int d = 2; same && d < in->ndim; d++) same = in->dim[d] == sk.dim[d];
    if (!same)
        return gp_error(GP_SHAPE, "layer %d (concat): input %s and layer %d's output %s: "
                        "expected shapes that differ in dimension 1 at most (B, C, ...)",
                        l->index, a, l->skip_from, b);
    *out = *in;
    out->dim[1] = in->dim[1] + sk.dim[1];
    return GP_OK;
}

static gp_cost merge_cost(const gp_layer *l, const gp_shape *in) {
    const merge_impl *mi = l->impl;
    gp_shape os;
    const double n = (double)gp_shape_nelem(in);
    if (merge_out_shape(l, in, GP_F32, &os) != GP_OK) os = *in;
    return (gp_cost){.fwd_flops = mi->concat ? 0 : n,
                     .out_bytes = (uint64_t)gp_shape_nelem(&os) * sizeof(float)};
}

static gp_status check_skip(const gp_layer *l, const gp_tensor *skip, int64_t batch,
                            const char *what) {
    const merge_impl *mi = l->impl;
    const gp_shape want = skip_at(mi, batch);
    char a[96], b[96];
    if (!skip || !skip->data)
        return gp_error(GP_INTERNAL, "layer %d (%s): no %s for layer %d's output", l->index,
                        l->ops->kind, what, l->skip_from);
    if (!gp_shape_equal(&skip->shape, &want))
        return gp_error(GP_SHAPE, "layer %d (%s): %s %s, expected %s", l->index, l->ops->kind,
                        what, gp_shape_str(&skip->shape, a, sizeof a),
                        gp_shape_str(&want, b, sizeof b));
    return GP_OK;
}

/* A part of each example: n floats at offset off of an example of `stride` floats. */
static gp_tensor part_of(const gp_tensor *t, int64_t b, int64_t stride, int64_t off, int64_t n) {
    return gp_tensor_view_on(t->dev, gp_ptr_offset(t->data, b * stride + off, GP_F32),
                             gp_shape1(n), GP_F32, t->cat);
}

/* Every example of whole (B, n1 + n2 per example) to or from its parts a (n1) and b (n2): one
 * copy per example and part. */
static gp_status split_join(const gp_tensor *whole, const gp_tensor *a, const gp_tensor *b,
                            bool join) {
    const int64_t B = whole->shape.dim[0], n1 = gp_tensor_nelem(a) / B,
                  n2 = gp_tensor_nelem(b) / B, n = n1 + n2;
    for (int64_t e = 0; e < B; e++) {
        gp_tensor w1 = part_of(whole, e, n, 0, n1), w2 = part_of(whole, e, n, n1, n2);
        gp_tensor p1 = part_of(a, e, n1, 0, n1), p2 = part_of(b, e, n2, 0, n2);
        GP_TRY(join ? gp_tensor_copy(&w1, &p1) : gp_tensor_copy(&p1, &w1));
        GP_TRY(join ? gp_tensor_copy(&w2, &p2) : gp_tensor_copy(&p2, &w2));
    }
    return GP_OK;
}

static gp_status merge_forward(gp_layer *l, gp_ctx *c, const gp_tensor *x, gp_tensor *y) {
    const merge_impl *mi = l->impl;
    GP_TRY(check_skip(l, c->skip, x->shape.dim[0], "skip"));
    if (mi->concat) return split_join(y, x, c->skip, true);
    GP_TRY(gp_tensor_copy(y, x));
    /* x + skip: one rounding, the same bits whichever is added to which */
    return gp_ctx_kernels(c)->axpy(c->dev, gp_tensor_nelem(y), 1.0f, gp_f32(c->skip), gp_f32(y));
}

/* Reads neither input (the runner may have released them): only dy. */
static gp_status merge_backward(gp_layer *l, gp_ctx *c, const gp_tensor *dy, gp_tensor *dx) {
    const merge_impl *mi = l->impl;
    GP_TRY(check_skip(l, c->dskip, dy->shape.dim[0], "skip gradient"));
    if (!mi->concat) {
        if (dx) GP_TRY(gp_tensor_copy(dx, dy));
        return gp_tensor_copy(c->dskip, dy);
    }
    if (dx) return split_join(dy, dx, c->dskip, false);
    /* no input gradient wanted: the skip's part alone, into a scratch for the input's */
    gp_tensor scratch;
    gp_shape xs = dy->shape;
    xs.dim[1] -= c->dskip->shape.dim[1];
    GP_TRY(gp_tensor_alloc(c->dev, GP_MEM_ACTIVATIONS, xs, GP_F32, &scratch));
    gp_status s = split_join(dy, &scratch, c->dskip, false);
    gp_tensor_release(&scratch);
    return s;
}

static gp_layer *merge_shard(const gp_layer *l, int nshards) {
    (void)nshards;
    return gp_layer_copy(l, sizeof(merge_impl));
}

static const gp_layer_ops add_ops = {
    .kind = "add",
    .out_shape = merge_out_shape,
    .cost = merge_cost,
    .forward = merge_forward,
    .backward = merge_backward,
    .shard = merge_shard,
};

static const gp_layer_ops concat_ops = {
    .kind = "concat",
    .out_shape = merge_out_shape,
    .cost = merge_cost,
    .forward = merge_forward,
    .backward = merge_backward,
    .shard = merge_shard,
};

static gp_layer *merge_new(const gp_layer_ops *ops, int from) {
    if (from < 0) {
        gp_error(GP_INVALID_ARGUMENT, "gp_%s_from: layer %d, expected the index of an earlier "
                 "layer (>= 0)", ops->kind, from);
        return NULL;
    }
    merge_impl *mi = calloc(1, sizeof *mi);
    if (!mi) {
        gp_error(GP_OUT_OF_MEMORY, "gp_%s_from: cannot allocate the layer", ops->kind);
        return NULL;
    }
    mi->concat = ops == &concat_ops;
    gp_layer *l = gp_layer_new(ops, mi);
    if (l) l->skip_from = from;
    return l;
}

gp_layer *gp_add_from(int layer) { return merge_new(&add_ops, layer); }
gp_layer *gp_concat_from(int layer) { return merge_new(&concat_ops, layer); }
