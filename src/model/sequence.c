/* Forward and backward over a range of layers, with activation memory
 * counted on the device and freed as soon as backward no longer needs it. */
#include "model/sequence.h"

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
    free(p->ctxs);
    free(p->acts);
    free(p->dys);
    p->ctxs = NULL;
    p->acts = NULL;
    p->dys = NULL;
}

static gp_status check_range(const gp_model *m, int first, int last) {
    if (first < 0 || last > m->nlayers || first >= last)
        return gp_error(GP_INVALID_ARGUMENT, "layer range [%d, %d): expected 0 <= first < last <= %d",
                        first, last, m->nlayers);
    return GP_OK;
}

static gp_status layer_forward(gp_model *m, int li, gp_device *dev, const gp_run *run,
                               const gp_tensor *x, gp_tensor *y, gp_ctx *c) {
    gp_layer *l = m->layers[li];
    gp_ctx_init(c, dev, run);
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
    p->acts[0] = *x;
    p->acts[0].owned = false;
    for (int k = 0; k < n; k++) {
        gp_status s = layer_forward(m, first + k, dev, run, &p->acts[k], &p->acts[k + 1], &p->ctxs[k]);
        if (s != GP_OK) {
            gp_seq_release(p);
            return s;
        }
    }
    return GP_OK;
}

const gp_tensor *gp_seq_output(const gp_seq_pass *p) { return &p->acts[p->last - p->first]; }

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
    gp_tensor grad_out = *dy; /* gradient of the current layer's output */
    grad_out.owned = false;
    gp_status s = GP_OK;
    for (int k = n - 1; k >= 0 && s == GP_OK; k--) {
        const int li = p->first + k;
        gp_layer *l = m->layers[li];
        const gp_tensor *in = &p->acts[k];
        gp_tensor grad_in = {0}, *gi = NULL;
        if (k > 0) {
            s = gp_tensor_alloc(p->dev, GP_MEM_ACTIVATIONS, in->shape, GP_F32, &grad_in);
            gi = &grad_in;
        } else if (dx && in->dtype == GP_F32) {
            gi = dx;
        }
        if (s == GP_OK) {
            s = split ? gp_layer_backward_part(l, &p->ctxs[k], &grad_out, gi, GP_BWD_INPUT)
                      : l->ops->backward(l, &p->ctxs[k], &grad_out, gi);
            if (s != GP_OK) s = gp_error_context(s, "layer %d (%s) backward", li, l->ops->kind);
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

gp_status gp_seq_forward_output(gp_model *m, int first, int last, gp_device *dev,
                                const gp_run *run, const gp_tensor *x, gp_tensor *y) {
    memset(y, 0, sizeof *y);
    GP_TRY(check_range(m, first, last));
    gp_tensor cur = *x, next;
    cur.owned = false;
    for (int li = first; li < last; li++) {
        gp_ctx c;
        gp_status s = layer_forward(m, li, dev, run, &cur, &next, &c);
        gp_ctx_release(&c);
        gp_tensor_release(&cur);
        if (s != GP_OK) {
            gp_tensor_release(&next);
            return s;
        }
        cur = next;
    }
    *y = cur;
    return GP_OK;
}
