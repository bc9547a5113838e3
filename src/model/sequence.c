/* Forward and backward over a range of layers, with activation memory
 * counted on the device and freed as soon as backward no longer needs it. */
#include "model/sequence.h"
#include "model/skips.h"

#include <stdlib.h>
#include <string.h>

void gp_seq_release(gp_seq_pass *p) {
    int n = p->last - p->first;
    if (p->ctxs)
        for (int k = 0; k < n; k++) gp_ctx_release(&p->ctxs[k]);
    if (p->acts)
        for (int k = 1; k <= n; k++) gp_tensor_release(&p->acts[k]);
    if (p->dys)
        for (int k = 0; k < n; k++) gp_tensor_release(&p->dys[k]);
    if (p->skip_grad)
        for (int k = 0; k < p->last; k++) gp_tensor_release(&p->skip_grad[k]);
    free(p->ctxs);
    free(p->acts);
    free(p->dys);
    free(p->skip_in);
    free(p->skip_grad);
    p->ctxs = NULL;
    p->acts = NULL;
    p->dys = NULL;
    p->skip_in = p->skip_grad = NULL;
}

static gp_status check_range(const gp_model *m, int first, int last) {
    if (first < 0 || last > m->nlayers || first >= last)
        return gp_error(GP_INVALID_ARGUMENT, "layer range [%d, %d): expected 0 <= first < last <= %d",
                        first, last, m->nlayers);
    return GP_OK;
}

/* One entry per layer of m for each array asked for (NULL pointers skipped), zeroed; none
 * (all NULL) for a model without skips. */
static gp_status skip_arrays(const gp_model *m, gp_tensor **a, gp_tensor **b) {
    *a = NULL;
    if (b) *b = NULL;
    if (!gp_model_has_skips(m)) return GP_OK;
    *a = calloc((size_t)m->nlayers, sizeof **a);
    if (b) *b = calloc((size_t)m->nlayers, sizeof **b);
    if (!*a || (b && !*b)) {
        free(*a);
        if (b) free(*b);
        *a = NULL;
        if (b) *b = NULL;
        return gp_error(GP_OUT_OF_MEMORY, "cannot allocate the skips of %d layers", m->nlayers);
    }
    return GP_OK;
}

static gp_status layer_forward(gp_model *m, int li, gp_device *dev, const gp_run *run,
                               const gp_tensor *x, gp_tensor *y, gp_ctx *c,
                               const gp_tensor *skip) {
    gp_layer *l = m->layers[li];
    gp_ctx_init(c, dev, run);
    c->skip = skip;
    memset(y, 0, sizeof *y);
    gp_shape os;
    GP_TRY(l->ops->out_shape(l, &x->shape, x->dtype, &os));
    GP_TRY(gp_tensor_alloc(dev, GP_MEM_ACTIVATIONS, os, GP_F32, y));
    c->x = x;
    c->y = y;
    gp_status s = l->ops->forward(l, c, x, y);
    if (s != GP_OK) return gp_error_context(s, "layer %d (%s) forward", li, l->ops->kind);
    return GP_OK;
}

gp_status gp_seq_forward(gp_model *m, int first, int last, gp_device *dev, const gp_run *run,
                         const gp_tensor *x, gp_seq_pass *p) {
    memset(p, 0, sizeof *p);
    GP_TRY(check_range(m, first, last));
    int n = last - first;
    p->first = first;
    p->last = last;
    p->dev = dev;
    p->acts = calloc((size_t)n + 1, sizeof *p->acts);
    p->ctxs = calloc((size_t)n, sizeof *p->ctxs);
    if (!p->acts || !p->ctxs) {
        gp_seq_release(p);
        return gp_error(GP_OUT_OF_MEMORY, "cannot allocate the state of %d layers", n);
    }
    gp_status st = skip_arrays(m, &p->skip_in, &p->skip_grad);
    if (st == GP_OK) st = gp_cut_views(m, first, x, &p->acts[0], p->skip_in);
    if (st != GP_OK) {
        gp_seq_release(p);
        return st;
    }
    for (int k = 0; k < n; k++) {
        const int src = m->layers[first + k]->skip_from;
        const gp_tensor *skip = src < 0       ? NULL
                                : src >= first ? &p->acts[src - first + 1]
                                               : &p->skip_in[src];
        gp_status s = layer_forward(m, first + k, dev, run, &p->acts[k], &p->acts[k + 1],
                                    &p->ctxs[k], skip);
        if (s != GP_OK) {
            gp_seq_release(p);
            return s;
        }
    }
    return GP_OK;
}

const gp_tensor *gp_seq_output(const gp_seq_pass *p) { return &p->acts[p->last - p->first]; }

gp_status gp_seq_cut_output(gp_model *m, const gp_seq_pass *p, gp_tensor *out) {
    const gp_tensor *y = gp_seq_output(p);
    if (!p->skip_in || gp_skips_across(m, p->last, NULL) == 0) {
        GP_TRY(gp_tensor_alloc(p->dev, GP_MEM_ACTIVATIONS, y->shape, GP_F32, out));
        gp_status s = gp_tensor_copy(out, y);
        if (s != GP_OK) gp_tensor_release(out);
        return s;
    }
    const gp_tensor **vals = calloc((size_t)p->last, sizeof *vals);
    if (!vals) return gp_error(GP_OUT_OF_MEMORY, "cannot allocate %d skips", p->last);
    for (int src = 0; src < p->last; src++)
        vals[src] = src >= p->first ? &p->acts[src - p->first + 1] : &p->skip_in[src];
    gp_status s = gp_cut_pack(m, p->last, p->dev, y, vals, out);
    free(vals);
    return s;
}

/* y += the sum of layer li's skip gradients, when it has one: right before li's backward. */
static gp_status add_skip_grad(gp_seq_pass *p, int li, gp_tensor *y) {
    gp_tensor *g = p->skip_grad ? &p->skip_grad[li] : NULL;
    if (!g || !g->data) return GP_OK;
    gp_status s = gp_kernels_of(p->dev)->axpy(p->dev, gp_tensor_nelem(y), 1.0f, gp_f32(g),
                                              gp_f32(y));
    gp_tensor_release(g);
    return s;
}

/* A merge's gradient of its skip into its source's sum: the first as it is, the later (earlier
 * merges) added. */
static gp_status take_skip_grad(gp_seq_pass *p, int src, gp_tensor *d) {
    gp_tensor *g = &p->skip_grad[src];
    if (!g->data) {
        *g = *d;
        d->owned = false;
        return GP_OK;
    }
    gp_status s = gp_kernels_of(p->dev)->axpy(p->dev, gp_tensor_nelem(g), 1.0f, gp_f32(d),
                                              gp_f32(g));
    gp_tensor_release(d);
    return s;
}

/* What the backward of layer first + k may need for a merge: its skip's gradient, allocated at
 * the skip's shape. */
static gp_status skip_grad_for(gp_seq_pass *p, gp_model *m, int k, gp_tensor *d) {
    memset(d, 0, sizeof *d);
    const int src = m->layers[p->first + k]->skip_from;
    if (src < 0) return GP_OK;
    const gp_tensor *v = src >= p->first ? &p->acts[src - p->first + 1] : &p->skip_in[src];
    gp_shape sh;
    if (v->data)
        sh = v->shape;
    else
        GP_TRY(gp_model_shape(m, src, p->acts[k].shape.dim[0], &sh));
    GP_TRY(gp_tensor_alloc(p->dev, GP_MEM_ACTIVATIONS, sh, GP_F32, d));
    p->ctxs[k].dskip = d;
    return GP_OK;
}

/* After the first layer's backward: the skip gradients the input's cut carries back, into dx's
 * places (copies), when dx is wanted. */
static gp_status skip_grads_out(gp_model *m, gp_seq_pass *p, gp_tensor *dx) {
    if (!dx || !p->skip_grad) return GP_OK;
    gp_tensor act, *views = calloc((size_t)m->nlayers, sizeof *views);
    if (!views) return gp_error(GP_OUT_OF_MEMORY, "cannot allocate %d skips", m->nlayers);
    gp_status s = gp_cut_views(m, p->first, dx, &act, views);
    for (int src = 0; src < p->first && s == GP_OK; src++) {
        if (!views[src].data) continue;
        s = p->skip_grad[src].data
                ? gp_tensor_copy(&views[src], &p->skip_grad[src])
                : gp_error(GP_INTERNAL, "layer %d's skip gradient is missing", src);
    }
    free(views);
    return s;
}

gp_status gp_seq_backward(gp_model *m, gp_seq_pass *p, const gp_tensor *dy, gp_tensor *dx) {
    return gp_seq_backward_each(m, p, dy, dx, NULL, NULL);
}

/* Backward through the pass, last layer to first: each layer's whole backward (then done(ctx,
 * li) and everything of it released), or (split) its INPUT part, keeping what its WEIGHT part
 * reads (its context, its input, its output gradient) and releasing the rest. */
static gp_status backward_loop(gp_model *m, gp_seq_pass *p, const gp_tensor *dy, gp_tensor *dx,
                               bool split, gp_seq_layer_done done, void *ctx) {
    const int n = p->last - p->first;
    if (split && !p->dys && !(p->dys = calloc((size_t)n, sizeof *p->dys))) {
        gp_seq_release(p);
        return gp_error(GP_OUT_OF_MEMORY, "cannot allocate the output gradients of %d layers", n);
    }
    gp_tensor grad_out; /* gradient of the current layer's output */
    gp_tensor dx_act = {0}; /* dx's activation part */
    gp_status s = gp_cut_views(m, p->last, dy, &grad_out, p->skip_grad);
    if (s == GP_OK && dx) s = gp_cut_views(m, p->first, dx, &dx_act, NULL);
    for (int k = n - 1; k >= 0 && s == GP_OK; k--) {
        const int li = p->first + k;
        gp_layer *l = m->layers[li];
        const gp_tensor *in = &p->acts[k];
        gp_tensor grad_in = {0}, *gi = NULL, dskip = {0};
        s = add_skip_grad(p, li, &grad_out);
        if (s == GP_OK && k > 0) {
            s = gp_tensor_alloc(p->dev, GP_MEM_ACTIVATIONS, in->shape, GP_F32, &grad_in);
            gi = &grad_in;
        } else if (dx && in->dtype == GP_F32) {
            gi = &dx_act;
        }
        if (s == GP_OK) s = skip_grad_for(p, m, k, &dskip);
        if (s == GP_OK) {
            s = split ? gp_layer_backward_part(l, &p->ctxs[k], &grad_out, gi, GP_BWD_INPUT)
                      : l->ops->backward(l, &p->ctxs[k], &grad_out, gi);
            if (s != GP_OK) s = gp_error_context(s, "layer %d (%s) backward", li, l->ops->kind);
        }
        if (dskip.data) {
            p->ctxs[k].dskip = NULL;
            if (s == GP_OK) s = take_skip_grad(p, l->skip_from, &dskip);
            gp_tensor_release(&dskip);
        }
        if (!split && s == GP_OK && done) s = done(ctx, li);
        if (split && gp_layer_splits_backward(l)) {
            p->dys[k] = grad_out; /* its WEIGHT part reads its context and this gradient */
        } else {
            gp_ctx_release(&p->ctxs[k]);
            gp_tensor_release(&grad_out);
        }
        /* The output is the next layer's input: kept while that one's WEIGHT part is due. */
        if (!split || k + 1 == n || !gp_layer_splits_backward(m->layers[li + 1]))
            gp_tensor_release(&p->acts[k + 1]);
        grad_out = grad_in;
    }
    gp_tensor_release(&grad_out);
    if (s == GP_OK) s = skip_grads_out(m, p, dx);
    if (p->skip_grad)
        for (int src = 0; src < p->last; src++) gp_tensor_release(&p->skip_grad[src]);
    if (!split || s != GP_OK) gp_seq_release(p);
    return s;
}

gp_status gp_seq_backward_each(gp_model *m, gp_seq_pass *p, const gp_tensor *dy, gp_tensor *dx,
                               gp_seq_layer_done done, void *ctx) {
    return backward_loop(m, p, dy, dx, false, done, ctx);
}

gp_status gp_seq_backward_input(gp_model *m, gp_seq_pass *p, const gp_tensor *dy, gp_tensor *dx) {
    return backward_loop(m, p, dy, dx, true, NULL, NULL);
}

bool gp_seq_holds_output_grad(const gp_seq_pass *p) {
    return p->dys && p->last > p->first && p->dys[p->last - p->first - 1].data;
}

gp_status gp_seq_backward_weight_each(gp_model *m, gp_seq_pass *p, gp_seq_layer_done done,
                                      void *ctx) {
    const int n = p->last - p->first;
    gp_status s = p->dys ? GP_OK
                         : gp_error(GP_INTERNAL, "the weight gradients of layers %d..%d before "
                                                 "their input gradients",
                                    p->first, p->last - 1);
    for (int k = n - 1; k >= 0 && s == GP_OK; k--) {
        const int li = p->first + k;
        gp_layer *l = m->layers[li];
        if (gp_layer_splits_backward(l)) {
            /* (dys[n - 1] is a view of the caller's dy, kept by the caller until now) */
            s = gp_layer_backward_part(l, &p->ctxs[k], &p->dys[k], NULL, GP_BWD_WEIGHT);
            if (s != GP_OK) s = gp_error_context(s, "layer %d (%s) backward", li, l->ops->kind);
            gp_ctx_release(&p->ctxs[k]);
            gp_tensor_release(&p->dys[k]);
            if (k > 0) gp_tensor_release(&p->acts[k]); /* its input, kept for this part */
        }
        if (s == GP_OK && done) s = done(ctx, li);
    }
    gp_seq_release(p);
    return s;
}

/* Keeps nothing for backward, but the outputs of skip sources until their last merge (held,
 * per layer of the model), and the cut's skips for the output. */
gp_status gp_seq_forward_output(gp_model *m, int first, int last, gp_device *dev,
                                const gp_run *run, const gp_tensor *x, gp_tensor *y) {
    memset(y, 0, sizeof *y);
    GP_TRY(check_range(m, first, last));
    gp_tensor cur, next, *skip_in, *held;
    GP_TRY(skip_arrays(m, &skip_in, &held));
    gp_status s = gp_cut_views(m, first, x, &cur, skip_in);
    for (int li = first; li < last && s == GP_OK; li++) {
        const int src = m->layers[li]->skip_from;
        const gp_tensor *skip = src < 0        ? NULL
                                : src == li - 1 ? &cur
                                : src >= first  ? &held[src]
                                                : &skip_in[src];
        gp_ctx c;
        s = layer_forward(m, li, dev, run, &cur, &next, &c, skip);
        gp_ctx_release(&c);
        if (li > first && held && gp_skip_last_use(m, li - 1) > li)
            held[li - 1] = cur; /* a later merge, or the next cell, reads it */
        else
            gp_tensor_release(&cur);
        if (src >= first && src < li - 1 && gp_skip_last_use(m, src) == li)
            gp_tensor_release(&held[src]);
        if (s != GP_OK) {
            gp_tensor_release(&next);
            break;
        }
        cur = next;
    }
    if (s == GP_OK && held && gp_skips_across(m, last, NULL) > 0) {
        const gp_tensor **vals = calloc((size_t)last, sizeof *vals);
        if (vals) {
            for (int j = 0; j < last; j++) vals[j] = j >= first ? &held[j] : &skip_in[j];
            vals[last - 1] = &cur;
            s = gp_cut_pack(m, last, dev, &cur, vals, y);
        } else {
            s = gp_error(GP_OUT_OF_MEMORY, "cannot allocate %d skips", last);
        }
        free(vals);
        gp_tensor_release(&cur);
    } else if (s == GP_OK) {
        *y = cur;
    }
    if (held)
        for (int j = 0; j < m->nlayers; j++) gp_tensor_release(&held[j]);
    free(held);
    free(skip_in);
    return s;
}
