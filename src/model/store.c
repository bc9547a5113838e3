/* Flat parameter, gradient and optimizer blocks of a range of layers (see store.h). */
#include "model/store.h"

#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "core/tensor.h"
#include "model/ties.h"
#include "optim/optim.h"

/* Visits every parameter of layers [first, last) with its offset: trainable ones at their place
 * in the trainable part, buffers after all trainable elements. */
typedef gp_status (*param_fn)(void *ctx, int li, int j, gp_param *p, int64_t off);

static gp_status for_each_param(gp_model *m, int first, int last, param_fn fn, void *ctx) {
    int64_t ntrain = 0, nbuf = 0;
    for (int li = first; li < last; li++)
        for (int j = 0; j < m->layers[li]->nparams; j++) {
            const gp_param *p = &m->layers[li]->params[j];
            if (p->trainable) ntrain += gp_shape_nelem(&p->shape);
        }
    int64_t toff = 0;
    for (int li = first; li < last; li++)
        for (int j = 0; j < m->layers[li]->nparams; j++) {
            gp_param *p = &m->layers[li]->params[j];
            const int64_t n = gp_shape_nelem(&p->shape);
            const int64_t off = p->trainable ? toff : ntrain + nbuf;
            if (p->trainable)
                toff += n;
            else
                nbuf += n;
            if (fn) GP_TRY(fn(ctx, li, j, p, off));
        }
    return GP_OK;
}

static void store_free(gp_store *s) {
    if (!s) return;
    gp_tensor_release(&s->params);
    gp_tensor_release(&s->grads);
    gp_tensor_release(&s->optim);
    gp_tensor_release(&s->w16);
    free(s->layer_off);
    free(s);
}

/* Sizes first: the trainable and buffer counts and where each layer's trainable part starts. */
static gp_status store_layout(const gp_model *m, int first, int last, gp_device *dev,
                              gp_store **out) {
    gp_store *s = calloc(1, sizeof *s);
    if (s) s->layer_off = calloc((size_t)(last - first) + 1, sizeof *s->layer_off);
    if (!s || !s->layer_off) {
        store_free(s);
        return gp_error(GP_OUT_OF_MEMORY, "cannot allocate the store of layers %d..%d", first,
                        last - 1);
    }
    s->dev = dev;
    s->first = first;
    s->last = last;
    for (int li = first; li < last; li++) {
        s->layer_off[li - first] = s->ntrain;
        for (int j = 0; j < m->layers[li]->nparams; j++) {
            const gp_param *p = &m->layers[li]->params[j];
            *(p->trainable ? &s->ntrain : &s->nbuf) += gp_shape_nelem(&p->shape);
        }
    }
    s->layer_off[last - first] = s->ntrain;
    *out = s;
    return GP_OK;
}

static gp_tensor block_view(const gp_tensor *block, int64_t off, gp_shape shape,
                            gp_mem_category cat) {
    return gp_tensor_view_on(block->dev, gp_ptr_offset(block->data, off, GP_F32), shape, GP_F32,
                             cat);
}

/* Copies a parameter's current values into its place in the new block. */
static gp_status copy_in(void *ctx, int li, int j, gp_param *p, int64_t off) {
    gp_store *s = ctx;
    gp_tensor dst = block_view(&s->params, off, p->shape, GP_MEM_PARAMS);
    gp_status st = gp_tensor_copy(&dst, &p->value);
    return st == GP_OK ? GP_OK : gp_error_context(st, "layer %d parameter %s", li, p->name);
}

static gp_status set_value_view(void *ctx, int li, int j, gp_param *p, int64_t off) {
    (void)li, (void)j;
    p->value = block_view(&((gp_store *)ctx)->params, off, p->shape, GP_MEM_PARAMS);
    return GP_OK;
}

/* Layer li leaves its store (if any): the last layer out frees it. */
static void leave_store(gp_model *m, int li) {
    gp_store *old = m->store_of[li];
    m->store_of[li] = NULL;
    if (old && --old->nlive == 0) store_free(old);
}

static void clear_views(gp_layer *l) {
    for (int j = 0; j < l->nparams; j++) {
        gp_param *p = &l->params[j];
        gp_tensor_release(&p->value); /* a view: only cleared; a layer's own tensor: freed */
        gp_tensor_release(&p->grad);
        gp_tensor_release(&p->state[0]);
        gp_tensor_release(&p->state[1]);
        p->value16 = (gp_tensor){0}; /* a view into the bf16 copy, if any */
    }
}

gp_status gp_store_place(gp_model *m, int first, int last, gp_device *dev, bool copy,
                         gp_store **out) {
    if (out) *out = NULL;
    if (!m || !dev || first < 0 || last > m->nlayers || first >= last)
        return gp_error(GP_INVALID_ARGUMENT, "placing layers [%d, %d) of %d on %s", first, last,
                        m ? m->nlayers : 0, gp_device_name(dev));
    for (int li = first; li < last; li++) {
        const gp_store *old = m->store_of[li];
        if (old && old->grads.data)
            return gp_error(GP_INVALID_ARGUMENT,
                            "layer %d (%s) is being trained (it has gradients): free its "
                            "pipeline before moving or re-initializing it",
                            li, m->layers[li]->ops->kind);
        if (copy && !old)
            return gp_error(GP_INVALID_ARGUMENT,
                            "layer %d (%s) is not initialized: initialize the whole model, or "
                            "none of it",
                            li, m->layers[li]->ops->kind);
    }
    gp_store *s = NULL;
    GP_TRY(store_layout(m, first, last, dev, &s));
    gp_status st = GP_OK;
    if (s->ntrain + s->nbuf > 0)
        st = gp_tensor_alloc(dev, GP_MEM_PARAMS, gp_shape1(s->ntrain + s->nbuf), GP_F32,
                             &s->params);
    /* Every copy before any view changes: on failure the model is as it was. */
    if (st == GP_OK && copy) st = for_each_param(m, first, last, copy_in, s);
    if (st != GP_OK) {
        store_free(s);
        return gp_error_context(st, "placing layers %d..%d on %s", first, last - 1,
                                gp_device_name(dev));
    }
    for (int li = first; li < last; li++) {
        clear_views(m->layers[li]);
        leave_store(m, li);
        m->store_of[li] = s;
    }
    for_each_param(m, first, last, set_value_view, s);
    s->nlive = last - first;
    if (out) *out = s;
    return GP_OK;
}

void gp_param_init_host(const gp_param *p, uint64_t seed, int layer, int index, float *v) {
    const int64_t n = gp_shape_nelem(&p->shape);
    gp_rng_stream s = {.seed = seed, .purpose = GP_RNG_INIT, .a = (uint32_t)layer,
                       .b = (uint32_t)index};
    switch (p->init) {
    case GP_INIT_ZEROS:
        memset(v, 0, (size_t)n * sizeof *v);
        break;
    case GP_INIT_ONES:
        for (int64_t i = 0; i < n; i++) v[i] = 1.0f;
        break;
    case GP_INIT_NORMAL:
        gp_rng_normal(&s, 0, v, n);
        for (int64_t i = 0; i < n; i++) v[i] *= p->init_scale;
        break;
    case GP_INIT_UNIFORM:
        gp_rng_uniform(&s, 0, v, n);
        for (int64_t i = 0; i < n; i++) v[i] = (2.0f * v[i] - 1.0f) * p->init_scale;
        break;
    }
}

gp_status gp_store_init_values(gp_model *m, gp_store *s, uint64_t seed) {
    int64_t most = 0;
    for (int li = s->first; li < s->last; li++)
        for (int j = 0; j < m->layers[li]->nparams; j++) {
            int64_t n = gp_shape_nelem(&m->layers[li]->params[j].shape);
            most = n > most ? n : most;
        }
    /* Values are made on the host (the same bits for every device) and copied over. */
    float *host = malloc((size_t)(most ? most : 1) * sizeof *host);
    if (!host) return gp_error(GP_OUT_OF_MEMORY, "initialization: %lld floats", (long long)most);
    gp_status st = GP_OK;
    for (int li = s->first; li < s->last && st == GP_OK; li++)
        for (int j = 0; j < m->layers[li]->nparams && st == GP_OK; j++) {
            gp_param *p = &m->layers[li]->params[j];
            int sl, sj; /* a tie's copy starts as its owner */
            gp_model_init_source(m, li, j, &sl, &sj);
            gp_param_init_host(&m->layers[sl]->params[sj], seed, sl, sj, host);
            st = gp_tensor_from_host(&p->value, host, gp_tensor_nbytes(&p->value));
        }
    free(host);
    gp_store_values_release(m, s);
    return st;
}

void gp_store_release_layers(gp_model *m, int first, int last) {
    for (int li = first; li < last; li++) {
        clear_views(m->layers[li]);
        leave_store(m, li);
    }
}

/* ------------------------------------------------------------------- training */

static gp_status set_train_views(void *ctx, int li, int j, gp_param *p, int64_t off) {
    (void)li, (void)j;
    const gp_store *s = ctx;
    if (!p->trainable) return GP_OK;
    p->grad = block_view(&s->grads, off, p->shape, GP_MEM_GRADS);
    for (int k = 0; k < s->nstates; k++)
        p->state[k] = block_view(&s->optim, k * s->ntrain + off, p->shape, GP_MEM_OPTIM);
    return GP_OK;
}

gp_status gp_store_train_begin(gp_model *m, gp_store *s, int nstates) {
    if (nstates < 0 || nstates > 2)
        return gp_error(GP_INVALID_ARGUMENT, "optimizer states %d: expected 0 to 2", nstates);
    for (int li = s->first; li < s->last; li++)
        if (m->store_of[li] != s)
            return gp_error(GP_INVALID_ARGUMENT, "layer %d is no longer held by its store",
                            li);
    if (s->grads.data)
        return gp_error(GP_INVALID_ARGUMENT,
                        "layers %d..%d are already being trained (they have gradients)", s->first,
                        s->last - 1);
    s->n16 = 0;
    if (gp_bf16_weight_copy(s->dev))
        for (int li = s->first; li < s->last; li++)
            for (int j = 0; j < m->layers[li]->nparams; j++)
                s->n16 += gp_param_bf16_copy_elems(&m->layers[li]->params[j]);
    if (s->n16 > 0)
        GP_TRY(gp_tensor_alloc(s->dev, GP_MEM_PARAMS, gp_shape1(s->n16), GP_BF16, &s->w16));
    s->w16_valid = false;
    if (s->ntrain > 0) {
        gp_status sg = gp_tensor_zeros(s->dev, GP_MEM_GRADS, gp_shape1(s->ntrain), GP_F32,
                                       &s->grads);
        if (sg != GP_OK) {
            gp_tensor_release(&s->w16);
            return sg;
        }
        if (nstates) {
            gp_status st = gp_tensor_zeros(s->dev, GP_MEM_OPTIM, gp_shape2(nstates, s->ntrain),
                                           GP_F32, &s->optim);
            if (st != GP_OK) {
                gp_tensor_release(&s->grads);
                gp_tensor_release(&s->w16);
                return st;
            }
        }
    }
    s->nstates = nstates;
    return for_each_param(m, s->first, s->last, set_train_views, s);
}

void gp_store_train_end(gp_model *m, gp_store *s) {
    if (!s) return;
    for (int li = s->first; li < s->last; li++) {
        if (m->store_of[li] != s) continue;
        gp_layer *l = m->layers[li];
        for (int j = 0; j < l->nparams; j++) {
            l->params[j].grad = (gp_tensor){0};
            l->params[j].state[0] = l->params[j].state[1] = (gp_tensor){0};
        }
    }
    gp_store_values_release(m, s);
    gp_tensor_release(&s->grads);
    gp_tensor_release(&s->optim);
    gp_tensor_release(&s->w16);
    s->n16 = 0;
    s->nstates = 0;
}

/* Each product parameter rounded into its place in the copy, in layer and parameter order (the
 * order gp_store_train_begin sized it in). */
gp_status gp_store_bf16_refresh(gp_model *m, gp_store *s) {
    /* (the device's precision, or the switch, may have changed since the block was made) */
    if (!s || !s->w16.data || s->w16_valid || gp_device_precision(s->dev) != GP_PRECISION_BF16)
        return GP_OK;
    const int on = gp_bf16_env(&gp_bf16_weight_copy_env);
    if (on < 0)
        return gp_error_context(GP_INVALID_ARGUMENT, "stage device %s: the bf16 weight copy",
                                gp_device_name(s->dev));
    if (!on) return GP_OK;
    const gp_kernels *k = gp_kernels_of(s->dev);
    int64_t at = 0;
    for (int li = s->first; li < s->last; li++) {
        if (m->store_of[li] != s) continue;
        gp_layer *l = m->layers[li];
        for (int j = 0; j < l->nparams; j++) {
            gp_param *p = &l->params[j];
            const int64_t n16 = gp_param_bf16_copy_elems(p);
            if (!n16) continue;
            uint16_t *dst = gp_ptr_offset(s->w16.data, at, GP_BF16);
            GP_TRY(k->bf16_store(s->dev, (const float *)p->value.data, dst,
                                 gp_tensor_nelem(&p->value)));
            p->value16 = gp_tensor_view_on(s->dev, dst, p->shape, GP_BF16, GP_MEM_PARAMS);
            at += n16;
        }
    }
    s->w16_valid = true;
    return GP_OK;
}

/* Generations are unique in the process: a layer's derived copy made under one can never pass
 * for another value's, whichever store, model or thread (stages run at once) made it. */
static _Atomic uint64_t g_generations;

void gp_store_values_hold(gp_model *m, gp_store *s) {
    if (!s) return;
    const uint64_t gen = atomic_fetch_add(&g_generations, 1) + 1;
    for (int li = s->first; li < s->last; li++) {
        if (m->store_of[li] != s) continue;
        gp_layer *l = m->layers[li];
        for (int j = 0; j < l->nparams; j++) l->params[j].gen = gen;
    }
}

void gp_store_values_release(gp_model *m, gp_store *s) {
    if (!s) return;
    for (int li = s->first; li < s->last; li++) {
        if (m->store_of[li] != s) continue;
        gp_layer *l = m->layers[li];
        for (int j = 0; j < l->nparams; j++) {
            l->params[j].value16 = (gp_tensor){0};
            l->params[j].gen = 0;
        }
        if (l->ops->drop_derived) l->ops->drop_derived(l);
    }
    s->w16_valid = false;
}

gp_status gp_store_zero_grads(gp_store *s) {
    return s->grads.data ? gp_tensor_fill_zero(&s->grads) : GP_OK;
}

gp_status gp_store_layer_sumsq(const gp_model *m, const gp_store *s, int li, double *out) {
    const gp_kernels *k = gp_kernels_of(s->dev);
    const gp_layer *l = m->layers[li];
    double sum = 0;
    for (int j = 0; j < l->nparams; j++) {
        const gp_param *p = &l->params[j];
        /* a tie's copy holds the owner's gradient, which the owner's layer counts */
        if (!p->trainable || gp_model_tie_copy(m, li, j) >= 0) continue;
        double v = 0;
        GP_TRY(k->sumsq(s->dev, (const float *)p->grad.data, gp_tensor_nelem(&p->grad), &v));
        sum += v;
    }
    *out = sum;
    return GP_OK;
}

/* A run of consecutive trainable parameters that share their weight-decay rule. */
typedef struct update_run {
    const gp_store *s;
    const gp_optim_opts *o;
    float lr;
    int t;
    int64_t begin, end;
    bool decay, open;
} update_run;

static gp_status flush_run(update_run *r) {
    if (!r->open || r->end == r->begin) return GP_OK;
    const gp_store *s = r->s;
    float *w = gp_ptr_offset(s->params.data, r->begin, GP_F32);
    const float *g = gp_ptr_offset(s->grads.data, r->begin, GP_F32);
    float *state[2] = {NULL, NULL};
    for (int k = 0; k < s->nstates; k++)
        state[k] = gp_ptr_offset(s->optim.data, k * s->ntrain + r->begin, GP_F32);
    r->open = false;
    return gp_optim_update(r->o, s->dev, r->end - r->begin, w, g, state, r->decay, r->lr, r->t);
}

static gp_status extend_run(void *ctx, int li, int j, gp_param *p, int64_t off) {
    (void)li, (void)j;
    update_run *r = ctx;
    if (!p->trainable) return GP_OK;
    if (r->open && p->decay != r->decay) GP_TRY(flush_run(r));
    if (!r->open) *r = (update_run){r->s, r->o, r->lr, r->t, off, off, p->decay, true};
    r->end = off + gp_shape_nelem(&p->shape);
    return GP_OK;
}

gp_status gp_store_apply(const gp_model *m, gp_store *s, const gp_optim_opts *o,
                         double global_norm, int step) {
    gp_store_values_release((gp_model *)m, s); /* the values change */
    if (!s->ntrain) return GP_OK;
    const float clip = gp_clip_factor(o->clip_norm, global_norm);
    if (clip < 1.0f)
        GP_TRY(gp_kernels_of(s->dev)->scale(s->dev, s->grads.data, s->ntrain, clip));
    update_run r = {.s = s, .o = o, .lr = gp_optim_lr_at(o, step), .t = step + 1};
    GP_TRY(for_each_param((gp_model *)m, s->first, s->last, extend_run, &r));
    return flush_run(&r);
}

gp_tensor gp_store_grad_slice(const gp_store *s, int first, int last) {
    const int64_t a = s->layer_off[first - s->first], b = s->layer_off[last - s->first];
    return block_view(&s->grads, a, gp_shape1(b - a), GP_MEM_GRADS);
}
