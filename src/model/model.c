/* A model: a sequence of layers with shape inference at construction,
 * parameter allocation and keyed initialization, enumeration and hashing. */
#include <inttypes.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/hash.h"
#include "model/model.h"
#include "model/store.h"

static gp_shape with_batch(const gp_shape *ex, int64_t batch) {
    gp_shape s = {ex->ndim + 1, {batch, 0, 0, 0}};
    for (int i = 0; i < ex->ndim; i++) s.dim[i + 1] = ex->dim[i];
    return s;
}

gp_status gp_model_new(gp_shape example_shape, gp_dtype input_dtype, gp_model **out) {
    char buf[96];
    if (!out) return gp_error(GP_INVALID_ARGUMENT, "gp_model_new: out is NULL");
    *out = NULL;
    if (example_shape.ndim < 0 || example_shape.ndim > GP_MAX_DIMS - 1)
        return gp_error(GP_SHAPE, "gp_model_new: example shape has %d dimensions, expected 0 to %d "
                                  "(the batch dimension is added in front)",
                        example_shape.ndim, GP_MAX_DIMS - 1);
    int64_t n = 1;
    for (int i = 0; i < example_shape.ndim; i++) {
        if (example_shape.dim[i] <= 0 || example_shape.dim[i] > ((int64_t)1 << 40) / n)
            return gp_error(GP_SHAPE,
                            "gp_model_new: example shape %s: every dimension must be > 0 and one "
                            "example at most 2^40 elements",
                            gp_shape_str(&example_shape, buf, sizeof buf));
        n *= example_shape.dim[i];
    }
    if (input_dtype != GP_F32 && input_dtype != GP_I32)
        return gp_error(GP_INVALID_ARGUMENT, "gp_model_new: unknown input dtype %d", (int)input_dtype);
    gp_model *m = calloc(1, sizeof *m);
    if (!m) return gp_error(GP_OUT_OF_MEMORY, "gp_model_new: cannot allocate the model");
    m->example_shape = example_shape;
    m->input_dtype = input_dtype;
    m->out_example = with_batch(&example_shape, 1);
    *out = m;
    return GP_OK;
}

void gp_model_free(gp_model *m) {
    if (!m) return;
    gp_store_release_layers(m, 0, m->nlayers);
    for (int i = 0; i < m->nlayers; i++) gp_layer_free(m->layers[i]);
    free(m->layers);
    free(m->store_of);
    free(m);
}

/* Shapes through layers [0, upto), stopping at the first failure. */
static gp_status infer(const gp_model *m, int upto, int64_t batch, gp_shape *out) {
    gp_shape s = with_batch(&m->example_shape, batch);
    gp_dtype t = m->input_dtype;
    for (int i = 0; i < upto; i++) {
        gp_shape o;
        gp_layer *l = m->layers[i];
        GP_TRY(l->ops->out_shape(l, &s, t, &o));
        s = o;
        t = GP_F32;
    }
    *out = s;
    return GP_OK;
}

/* Every dimension positive and one example's output small enough that a
 * batch of them cannot overflow 64-bit byte counts. */
static gp_status check_extent(const gp_layer *l, const gp_shape *s) {
    char buf[96];
    const int64_t max_elems = (int64_t)1 << 40;
    int64_t n = 1;
    for (int i = 0; i < s->ndim; i++) {
        if (s->dim[i] < 1 || s->dim[i] > max_elems / n)
            return gp_error(GP_SHAPE,
                            "layer %d (%s): output shape %s per example: expected every dimension "
                            ">= 1 and at most 2^40 elements",
                            l->index, l->ops->kind, gp_shape_str(s, buf, sizeof buf));
        n *= s->dim[i];
    }
    return GP_OK;
}

gp_status gp_model_add(gp_model *m, gp_layer *layer) {
    if (!layer) {
        /* The constructor failed and left its message; keep it. */
        return gp_error_context(GP_INVALID_ARGUMENT, "gp_model_add: layer %d could not be built",
                                m ? m->nlayers : -1);
    }
    if (!m) {
        gp_layer_free(layer);
        return gp_error(GP_INVALID_ARGUMENT, "gp_model_add: model is NULL");
    }
    if (m->nlayers == m->cap) {
        int cap = m->cap ? 2 * m->cap : 16;
        gp_layer **l = realloc(m->layers, (size_t)cap * sizeof *l);
        if (l) m->layers = l;
        gp_store **d = l ? realloc(m->store_of, (size_t)cap * sizeof *d) : NULL;
        if (d) m->store_of = d;
        if (!l || !d) {
            gp_layer_free(layer);
            return gp_error(GP_OUT_OF_MEMORY, "gp_model_add: cannot grow the layer list to %d", cap);
        }
        m->cap = cap;
    }
    layer->index = m->nlayers;
    gp_shape out;
    gp_dtype t = m->nlayers ? GP_F32 : m->input_dtype;
    gp_status s = GP_OK;
    if (gp_layer_merges(layer)) { /* its skip: an earlier layer's output, one example */
        if (m->nlayers == 0)
            s = gp_error(GP_INVALID_ARGUMENT,
                         "gp_model_add: layer 0 (%s) reads layer %d's output: expected an "
                         "earlier layer, and the model has none yet",
                         layer->ops->kind, layer->skip_from);
        else if (layer->skip_from >= m->nlayers)
            s = gp_error(GP_INVALID_ARGUMENT,
                         "gp_model_add: layer %d (%s) reads layer %d's output: expected an "
                         "earlier layer (0..%d)",
                         m->nlayers, layer->ops->kind, layer->skip_from, m->nlayers - 1);
        gp_shape sk;
        if (s == GP_OK) s = infer(m, layer->skip_from + 1, 1, &sk);
        if (s == GP_OK) s = gp_merge_bind(layer, &sk);
    }
    if (s == GP_OK) s = layer->ops->out_shape(layer, &m->out_example, t, &out);
    if (s == GP_OK) s = check_extent(layer, &out);
    if (s != GP_OK) {
        gp_layer_free(layer);
        return s;
    }
    m->out_example = out;
    m->layers[m->nlayers] = layer;
    m->store_of[m->nlayers] = NULL;
    m->nlayers++;
    return GP_OK;
}

int gp_model_nlayers(const gp_model *m) { return m ? m->nlayers : 0; }

gp_dtype gp_model_input_dtype(const gp_model *m) { return m ? m->input_dtype : GP_F32; }

gp_shape gp_model_example_shape(const gp_model *m) {
    return m ? m->example_shape : (gp_shape){0};
}

gp_layer *gp_model_layer(gp_model *m, int i) {
    return (m && i >= 0 && i < m->nlayers) ? m->layers[i] : NULL;
}

gp_status gp_model_init_range(gp_model *m, int first, int last, gp_device *dev, uint64_t seed) {
    if (!m || !dev) return gp_error(GP_INVALID_ARGUMENT, "gp_model_init: model or device is NULL");
    if (first < 0 || last > m->nlayers || first > last)
        return gp_error(GP_INVALID_ARGUMENT, "gp_model_init_range: range [%d, %d) outside 0..%d",
                        first, last, m->nlayers);
    if (first == last) return GP_OK;
    gp_store *s;
    GP_TRY(gp_store_place(m, first, last, dev, false, &s));
    gp_status st = gp_store_init_values(m, s, seed);
    if (st != GP_OK) {
        gp_store_release_layers(m, first, last);
        return gp_error_context(st, "gp_model_init_range");
    }
    m->seed = seed;
    return GP_OK;
}

gp_status gp_model_init(gp_model *m, gp_device *dev, uint64_t seed) {
    return gp_model_init_range(m, 0, m ? m->nlayers : 0, dev, seed);
}

gp_device *gp_model_layer_device(const gp_model *m, int li) {
    return m->store_of[li] ? m->store_of[li]->dev : NULL;
}

gp_device *gp_model_range_device(const gp_model *m, int first, int last) {
    gp_device *d = NULL;
    for (int i = first; i < last; i++) {
        gp_device *di = gp_model_layer_device(m, i);
        if (!di) {
            gp_error(GP_INVALID_ARGUMENT, "layer %d (%s) is not initialized: call gp_model_init first",
                     i, m->layers[i]->ops->kind);
            return NULL;
        }
        if (d && di != d) {
            gp_error(GP_INVALID_ARGUMENT, "layers %d..%d live on more than one device (%s and %s)",
                     first, last - 1, gp_device_name(d), gp_device_name(di));
            return NULL;
        }
        d = di;
    }
    if (!d) gp_error(GP_INVALID_ARGUMENT, "the model has no layers");
    return d;
}

gp_status gp_model_shape(const gp_model *m, int i, int64_t batch, gp_shape *out) {
    if (!m || !out) return gp_error(GP_INVALID_ARGUMENT, "gp_model_shape: NULL argument");
    if (i < -1 || i >= m->nlayers)
        return gp_error(GP_INVALID_ARGUMENT, "gp_model_shape: layer %d outside -1..%d", i,
                        m->nlayers - 1);
    if (batch < 1)
        return gp_error(GP_INVALID_ARGUMENT, "gp_model_shape: batch %lld must be >= 1",
                        (long long)batch);
    return infer(m, i + 1, batch, out);
}

gp_status gp_model_cost(const gp_model *m, int i, int64_t batch, gp_cost *out) {
    if (!m || !out) return gp_error(GP_INVALID_ARGUMENT, "gp_model_cost: NULL argument");
    if (i < 0 || i >= m->nlayers)
        return gp_error(GP_INVALID_ARGUMENT, "gp_model_cost: layer %d outside 0..%d", i,
                        m->nlayers - 1);
    gp_shape in;
    GP_TRY(gp_model_shape(m, i - 1, batch, &in));
    *out = m->layers[i]->ops->cost(m->layers[i], &in);
    return GP_OK;
}

int64_t gp_model_nparams(const gp_model *m) {
    int64_t n = 0;
    for (int i = 0; m && i < m->nlayers; i++)
        for (int j = 0; j < m->layers[i]->nparams; j++)
            if (m->layers[i]->params[j].trainable) n += gp_shape_nelem(&m->layers[i]->params[j].shape);
    return n;
}

gp_status gp_model_params_fnv1a64(const gp_model *m, uint64_t *out) {
    if (!out) return gp_error(GP_INVALID_ARGUMENT, "gp_model_params_fnv1a64: out is NULL");
    *out = GP_FNV1A64_INIT;
    return gp_model_params_fnv1a64_range(m, 0, m ? m->nlayers : 0, out);
}

gp_status gp_model_params_fnv1a64_range(const gp_model *m, int first, int last, uint64_t *h) {
    if (!m || !h) return gp_error(GP_INVALID_ARGUMENT, "gp_model_params_fnv1a64: NULL argument");
    void *host = NULL;
    size_t cap = 0;
    gp_status s = GP_OK;
    for (int i = first; i < last && s == GP_OK; i++)
        for (int j = 0; j < m->layers[i]->nparams && s == GP_OK; j++) {
            const gp_tensor *v = &m->layers[i]->params[j].value;
            if (!v->data) continue;
            size_t n = gp_tensor_nbytes(v);
            const void *bytes = gp_tensor_host_data(v);
            if (!bytes) { /* device memory: hashed from a host copy */
                if (n > cap) {
                    void *b = realloc(host, n);
                    if (!b) {
                        s = gp_error(GP_OUT_OF_MEMORY, "gp_model_params_fnv1a64: %zu bytes", n);
                        break;
                    }
                    host = b, cap = n;
                }
                s = gp_tensor_to_host(v, host, n);
                bytes = host;
            }
            if (s == GP_OK) *h = gp_fnv1a64(*h, bytes, n);
        }
    free(host);
    return s;
}

int gp_model_nparam_tensors(const gp_model *m) {
    int n = 0;
    for (int i = 0; m && i < m->nlayers; i++) n += m->layers[i]->nparams;
    return n;
}

gp_status gp_model_param(gp_model *m, int k, gp_param_info *out) {
    if (!m || !out) return gp_error(GP_INVALID_ARGUMENT, "gp_model_param: NULL argument");
    int base = 0;
    for (int i = 0; i < m->nlayers; i++) {
        gp_layer *l = m->layers[i];
        if (k >= base && k < base + l->nparams) {
            gp_param *p = &l->params[k - base];
            out->layer = i;
            out->name = p->name;
            out->value = &p->value;
            out->grad = p->trainable ? &p->grad : NULL;
            out->trainable = p->trainable;
            return GP_OK;
        }
        base += l->nparams;
    }
    return gp_error(GP_INVALID_ARGUMENT, "gp_model_param: index %d outside 0..%d", k, base - 1);
}

void gp_model_print(const gp_model *m, int64_t batch, FILE *f) {
    char buf[96];
    gp_shape s = with_batch(&m->example_shape, batch);
    fprintf(f, "  input   %-18s %s %s\n", "", gp_shape_str(&s, buf, sizeof buf),
            gp_dtype_name(m->input_dtype));
    for (int i = 0; i < m->nlayers; i++) {
        gp_layer *l = m->layers[i];
        int64_t np = 0;
        for (int j = 0; j < l->nparams; j++)
            if (l->params[j].trainable) np += gp_shape_nelem(&l->params[j].shape);
        if (infer(m, i + 1, batch, &s) != GP_OK) break;
        fprintf(f, "  %-7d %-18s %-22s %12" PRId64 " params\n", i, l->ops->kind,
                gp_shape_str(&s, buf, sizeof buf), np);
    }
    fprintf(f, "  total %" PRId64 " parameters\n", gp_model_nparams(m));
}
