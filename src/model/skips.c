/* Which skips cross a cut, and the packed cut tensor that carries them beside the activation
 * (skips.h). Every function is a scan over the layers: models have tens to thousands of layers,
 * and these run once per micro-batch and cell, beside whole layers' work. */
#include <stdlib.h>

#include "core/tensor.h"
#include "model/skips.h"

bool gp_model_has_skips(const gp_model *m) {
    for (int i = 0; i < m->nlayers; i++)
        if (gp_layer_merges(m->layers[i])) return true;
    return false;
}

int gp_skip_last_use(const gp_model *m, int src) {
    int last = -1;
    for (int i = src + 1; i < m->nlayers; i++)
        if (m->layers[i]->skip_from == src) last = i;
    return last;
}

int gp_skips_across(const gp_model *m, int b, int *srcs) {
    int n = 0;
    for (int src = 0; src < b && src < m->nlayers; src++)
        if (gp_skip_last_use(m, src) >= b) {
            if (srcs) srcs[n] = src;
            n++;
        }
    return n;
}

gp_status gp_model_cut_shape(const gp_model *m, int b, int64_t batch, gp_shape *out) {
    if (b < 0 || b > m->nlayers)
        return gp_error(GP_INVALID_ARGUMENT, "cut %d outside 0..%d", b, m->nlayers);
    GP_TRY(gp_model_shape(m, b - 1, batch, out));
    int *srcs = malloc((size_t)(b ? b : 1) * sizeof *srcs);
    if (!srcs) return gp_error(GP_OUT_OF_MEMORY, "cut %d: %d sources", b, b);
    const int n = gp_skips_across(m, b, srcs);
    int64_t per = gp_shape_nelem(out) / batch;
    gp_status s = GP_OK;
    for (int j = 0; j < n && s == GP_OK; j++) {
        gp_shape sk;
        s = gp_model_shape(m, srcs[j], 1, &sk);
        per += gp_shape_nelem(&sk);
    }
    free(srcs);
    if (s == GP_OK && n) *out = gp_shape2(batch, per);
    return s;
}

/* Walks the parts of cut b of a batch of `batch`: fn(part index, source (-1: the activation),
 * shape, offset in floats). */
typedef gp_status (*part_fn)(void *ctx, int src, gp_shape shape, int64_t off);
static gp_status each_part(const gp_model *m, int b, int64_t batch, part_fn fn, void *ctx) {
    gp_shape s;
    GP_TRY(gp_model_shape(m, b - 1, batch, &s));
    GP_TRY(fn(ctx, -1, s, 0));
    int64_t off = gp_shape_nelem(&s);
    for (int src = 0; src < b; src++) {
        if (gp_skip_last_use(m, src) < b) continue;
        GP_TRY(gp_model_shape(m, src, batch, &s));
        GP_TRY(fn(ctx, src, s, off));
        off += gp_shape_nelem(&s);
    }
    return GP_OK;
}

typedef struct views_ctx {
    const gp_tensor *t;
    gp_tensor *act, *skips;
} views_ctx;

static gp_status view_part(void *ctx, int src, gp_shape shape, int64_t off) {
    views_ctx *v = ctx;
    gp_tensor view = gp_tensor_view_on(v->t->dev, gp_ptr_offset(v->t->data, off, v->t->dtype),
                                       shape, v->t->dtype, v->t->cat);
    if (src < 0)
        *v->act = view;
    else if (v->skips)
        v->skips[src] = view;
    return GP_OK;
}

gp_status gp_cut_views(const gp_model *m, int b, const gp_tensor *t, gp_tensor *act,
                       gp_tensor *skips) {
    if (gp_skips_across(m, b, NULL) == 0) {
        *act = *t;
        act->owned = false;
        return GP_OK;
    }
    char got[96], want[96];
    gp_shape ws;
    GP_TRY(gp_model_cut_shape(m, b, t->shape.dim[0], &ws));
    if (!gp_shape_equal(&ws, &t->shape))
        return gp_error(GP_SHAPE, "the input of layer %d with its skips: %s, expected %s", b,
                        gp_shape_str(&t->shape, got, sizeof got),
                        gp_shape_str(&ws, want, sizeof want));
    views_ctx v = {t, act, skips};
    return each_part(m, b, t->shape.dim[0], view_part, &v);
}

typedef struct pack_ctx {
    gp_tensor *out;
    const gp_tensor *act;
    const gp_tensor *const *vals;
} pack_ctx;

static gp_status pack_part(void *ctx, int src, gp_shape shape, int64_t off) {
    pack_ctx *c = ctx;
    gp_tensor dst = gp_tensor_view_on(c->out->dev, gp_ptr_offset(c->out->data, off, GP_F32),
                                      shape, GP_F32, c->out->cat);
    const gp_tensor *v = src < 0 ? c->act : c->vals[src];
    if (!v || !v->data)
        return gp_error(GP_INTERNAL, "cut: layer %d's output is not held", src);
    return gp_tensor_copy(&dst, v);
}

gp_status gp_cut_pack(const gp_model *m, int b, gp_device *dev, const gp_tensor *act,
                      const gp_tensor *const *vals, gp_tensor *out) {
    gp_shape s;
    GP_TRY(gp_model_cut_shape(m, b, act->shape.dim[0], &s));
    GP_TRY(gp_tensor_alloc(dev, GP_MEM_ACTIVATIONS, s, GP_F32, out));
    pack_ctx c = {out, act, vals};
    gp_status st = each_part(m, b, act->shape.dim[0], pack_part, &c);
    if (st != GP_OK) gp_tensor_release(out);
    return st;
}
