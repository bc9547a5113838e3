/* Shard models and the copies between whole parameters and shards' parts (see shard.h). A shard
 * model is built layer by layer from the kinds' shard ops, so a layer never needs to know that
 * it is one of several; the layout alone says how its parameters are cut. */
#include <stdlib.h>
#include <string.h>

#include "model/shard.h"
#include "model/ties.h"

void gp_model_layout(const gp_model *m, int li, gp_layout *out) {
    gp_layout_of(m->layers[li], li == m->nlayers - 1, out);
}

bool gp_model_output_split(const gp_model *m) {
    if (!m || m->nlayers < 1) return false;
    gp_layout lo;
    gp_model_layout(m, m->nlayers - 1, &lo);
    return lo.output_split;
}

gp_status gp_model_check_layouts(const gp_model *m, int T) {
    if (T < 1) return gp_error(GP_INVALID_ARGUMENT, "tensor-parallel size %d, expected >= 1", T);
    if (T == 1) return GP_OK;
    for (int li = 0; li < m->nlayers; li++) {
        const gp_layer *l = m->layers[li];
        if (!l->ops->shard)
            return gp_error(GP_CONFIG,
                            "layer %d (%s) cannot be placed on mesh axis \"%s\" of size %d: its "
                            "kind has no shard op",
                            li, l->ops->kind, GP_TENSOR_AXIS, T);
        gp_layout lo;
        gp_model_layout(m, li, &lo);
        GP_TRY(gp_layout_check(l, &lo, T));
    }
    return GP_OK;
}

gp_status gp_model_shard_new(const gp_model *m, int T, gp_model **out) {
    *out = NULL;
    if (!m || T < 2)
        return gp_error(GP_INVALID_ARGUMENT, "shard model: a model and T >= 2 expected (T = %d)",
                        T);
    GP_TRY(gp_model_check_layouts(m, T));
    gp_model *s;
    GP_TRY(gp_model_new(m->example_shape, m->input_dtype, &s));
    for (int li = 0; li < m->nlayers; li++) {
        const gp_layer *l = m->layers[li];
        gp_layout lo;
        gp_model_layout(m, li, &lo);
        const bool split = lo.nsplits > 0;
        gp_layer *c = l->ops->shard(l, split ? T : 1);
        gp_status st = c ? GP_OK : gp_error_context(GP_CONFIG, "layer %d (%s): its shard", li,
                                                    l->ops->kind);
        /* The kind's shard must have the layout's shapes: the copies below rely on it. */
        for (int j = 0; st == GP_OK && j < l->nparams; j++) {
            const gp_shape want =
                gp_layout_shard_shape(&l->params[j].shape, gp_layout_split_of(&lo, j), T);
            if (c->nparams != l->nparams || strcmp(c->params[j].name, l->params[j].name) ||
                !gp_shape_equal(&c->params[j].shape, &want))
                st = gp_error(GP_INTERNAL,
                              "layer %d (%s): its shard's parameter %d does not follow the "
                              "layout",
                              li, l->ops->kind, j);
        }
        if (st != GP_OK) {
            gp_layer_free(c);
            gp_model_free(s);
            return st;
        }
        if ((st = gp_model_add(s, c)) != GP_OK) {
            gp_model_free(s);
            return gp_error_context(st, "shard model of %d", T);
        }
    }
    s->seed = m->seed;
    /* Both uses of a tie split alike (an embedding's vocabulary rows are a head's output rows),
     * so shard t's parts are tied as the whole parameters are. */
    for (int i = 0; i < m->nties; i++) {
        const gp_tie *t = &m->ties[i];
        gp_status st = gp_model_tie(s, t->layer[0], t->param[0], t->layer[1], t->param[1]);
        if (st != GP_OK) {
            gp_model_free(s);
            return gp_error_context(st, "shard model of %d", T);
        }
    }
    *out = s;
    return GP_OK;
}

gp_status gp_model_layer_copy_new(const gp_model *m, int li, gp_model **out) {
    *out = NULL;
    if (!m || li < 0 || li >= m->nlayers)
        return gp_error(GP_INVALID_ARGUMENT, "layer copy: layer %d of a model of %d", li,
                        m ? m->nlayers : 0);
    gp_shape in = m->example_shape;
    if (li > 0) { /* (1, example...) out of the layer before: drop the batch */
        gp_shape b;
        GP_TRY(gp_model_shape(m, li - 1, 1, &b));
        in.ndim = b.ndim - 1;
        for (int d = 1; d < b.ndim; d++) in.dim[d - 1] = b.dim[d];
    }
    gp_model *c;
    GP_TRY(gp_model_new(in, li == 0 ? m->input_dtype : GP_F32, &c));
    gp_layer *l = m->layers[li]->ops->shard(m->layers[li], 1);
    gp_status st = l ? gp_model_add(c, l)
                     : gp_error(GP_CONFIG, "layer %d (%s): no copy", li, m->layers[li]->ops->kind);
    if (st != GP_OK) {
        gp_model_free(c);
        return gp_error_context(st, "layer copy of layer %d", li);
    }
    c->seed = m->seed;
    *out = c;
    return GP_OK;
}

gp_status gp_shard_init_values(const gp_model *m, gp_model *ms, gp_store *s, int T, int t,
                               uint64_t seed) {
    int64_t most = 0;
    for (int li = s->first; li < s->last; li++)
        for (int j = 0; j < m->layers[li]->nparams; j++) {
            const int64_t n = gp_shape_nelem(&m->layers[li]->params[j].shape);
            most = n > most ? n : most;
        }
    float *host = malloc((size_t)(most ? most : 1) * sizeof *host);
    if (!host) return gp_error(GP_OUT_OF_MEMORY, "shard initialization: %lld floats", (long long)most);
    gp_status st = GP_OK;
    for (int li = s->first; li < s->last && st == GP_OK; li++)
        for (int j = 0; j < m->layers[li]->nparams && st == GP_OK; j++) {
            int sl, sj;
            gp_model_init_source(m, li, j, &sl, &sj);
            gp_param_init_host(&m->layers[sl]->params[sj], seed, sl, sj, host);
            st = gp_shard_scatter(m, li, j, T, t, host, &ms->layers[li]->params[j].value);
        }
    free(host);
    return st;
}

/* Parameter j's split (copied into *buf; *sp NULL when replicated), and the part's shape checked
 * against it. */
static gp_status part_shape(const gp_model *m, int li, int j, int T, const gp_tensor *part,
                            gp_layout_split *buf, const gp_layout_split **sp) {
    gp_layout lo;
    gp_model_layout(m, li, &lo);
    const gp_layout_split *found = gp_layout_split_of(&lo, j);
    if (found) *buf = *found;
    *sp = found ? buf : NULL;
    const gp_shape want = gp_layout_shard_shape(&m->layers[li]->params[j].shape, *sp, T);
    char a[96], b[96];
    if (!part->data || !gp_shape_equal(&part->shape, &want))
        return gp_error(GP_INTERNAL, "layer %d parameter %s: shard tensor %s, expected %s", li,
                        m->layers[li]->params[j].name, gp_shape_str(&part->shape, a, sizeof a),
                        gp_shape_str(&want, b, sizeof b));
    return GP_OK;
}

gp_status gp_shard_gather(const gp_model *m, int li, int j, int T, int t, const gp_tensor *part,
                          float *whole) {
    gp_layout_split buf;
    const gp_layout_split *sp;
    GP_TRY(part_shape(m, li, j, T, part, &buf, &sp));
    const size_t nbytes = gp_tensor_nbytes(part);
    float *host = malloc(nbytes ? nbytes : 1);
    if (!host) return gp_error(GP_OUT_OF_MEMORY, "gathering a shard: %zu bytes", nbytes);
    gp_status st = gp_tensor_to_host(part, host, nbytes);
    if (st == GP_OK)
        gp_layout_copy(sp, &m->layers[li]->params[j].shape, T, t, whole, host, false);
    free(host);
    return st;
}

gp_status gp_shard_scatter(const gp_model *m, int li, int j, int T, int t, const float *whole,
                           gp_tensor *part) {
    gp_layout_split buf;
    const gp_layout_split *sp;
    GP_TRY(part_shape(m, li, j, T, part, &buf, &sp));
    const size_t nbytes = gp_tensor_nbytes(part);
    float *host = malloc(nbytes ? nbytes : 1);
    if (!host) return gp_error(GP_OUT_OF_MEMORY, "scattering a shard: %zu bytes", nbytes);
    gp_layout_copy(sp, &m->layers[li]->params[j].shape, T, t, (float *)whole, host, true);
    gp_status st = gp_tensor_from_host(part, host, nbytes);
    free(host);
    return st;
}
