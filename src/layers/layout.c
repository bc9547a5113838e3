/* Layouts over the tensor axis: which layout a layer runs with, the divisibility check, and the
 * index arithmetic between a whole parameter and one shard's part of it. A split dimension of
 * length n is `groups` blocks of n / groups (qkv's q, k and v); shard t takes part t of each
 * block, so every shard gets whole heads, whole hidden units or whole vocabulary rows. */
#include <string.h>

#include "layers/layout.h"

void gp_layout_of(const gp_layer *l, bool last, gp_layout *out) {
    memset(out, 0, sizeof *out);
    if (l->ops->layout) l->ops->layout(l, out);
    if (out->output_split && !last) memset(out, 0, sizeof *out);
}

gp_status gp_layout_check(const gp_layer *l, const gp_layout *lo, int T) {
    for (int i = 0; i < lo->ndims; i++) {
        const gp_layout_dim *d = &lo->dims[i];
        if (d->size % T != 0)
            return gp_error(GP_CONFIG,
                            "layer %d (%s): %s = %lld does not divide evenly over mesh axis "
                            "\"%s\" of size %d (the layout splits %s over it)",
                            l->index, l->ops->kind, d->name, (long long)d->size, d->axis, T,
                            d->name);
    }
    for (int i = 0; i < lo->nsplits; i++) {
        const gp_layout_split *sp = &lo->splits[i];
        const gp_param *p = &l->params[sp->param];
        const int64_t n = p->shape.dim[sp->dim];
        if (n % ((int64_t)sp->groups * T) != 0)
            return gp_error(GP_CONFIG,
                            "layer %d (%s): parameter %s: dimension %d of length %lld is not %d "
                            "block(s) that divide evenly over mesh axis \"%s\" of size %d",
                            l->index, l->ops->kind, p->name, sp->dim, (long long)n, sp->groups,
                            lo->dims[sp->of].axis, T);
    }
    return GP_OK;
}

const gp_layout_split *gp_layout_split_of(const gp_layout *lo, int j) {
    for (int i = 0; i < lo->nsplits; i++)
        if (lo->splits[i].param == j) return &lo->splits[i];
    return NULL;
}

gp_shape gp_layout_shard_shape(const gp_shape *full, const gp_layout_split *sp, int T) {
    gp_shape s = *full;
    if (sp) s.dim[sp->dim] /= T;
    return s;
}

void gp_layout_copy(const gp_layout_split *sp, const gp_shape *shape, int T, int t, float *full,
                    float *shard, bool to_shard) {
    if (!sp) {
        const size_t n = (size_t)gp_shape_nelem(shape) * sizeof *full;
        memcpy(to_shard ? shard : full, to_shard ? full : shard, n);
        return;
    }
    int64_t outer = 1, inner = 1;
    for (int d = 0; d < sp->dim; d++) outer *= shape->dim[d];
    for (int d = sp->dim + 1; d < shape->ndim; d++) inner *= shape->dim[d];
    const int64_t len = shape->dim[sp->dim], block = len / sp->groups, part = block / T;
    const size_t run = (size_t)(part * inner) * sizeof *full;
    for (int64_t o = 0; o < outer; o++)
        for (int64_t g = 0; g < sp->groups; g++) {
            float *f = full + (o * len + g * block + t * part) * inner;
            float *s = shard + (o * sp->groups * part + g * part) * inner;
            memcpy(to_shard ? s : f, to_shard ? f : s, run);
        }
}
