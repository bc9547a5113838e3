/* The parts of the layer interface that every layer shares: construction,
 * parameter declaration, contexts and shape-check messages. */
#include <stdlib.h>
#include <string.h>

#include "core/device.h"
#include "layers/layer_base.h"

gp_layer *gp_layer_new(const gp_layer_ops *ops, void *impl) {
    gp_layer *l = calloc(1, sizeof *l);
    if (!l) {
        free(impl);
        gp_error(GP_OUT_OF_MEMORY, "%s: cannot allocate the layer", ops->kind);
        return NULL;
    }
    l->ops = ops;
    l->impl = impl;
    l->index = -1;
    l->skip_from = -1;
    return l;
}

gp_layer *gp_layer_new_copy(const gp_layer_ops *ops, const void *impl, size_t nbytes) {
    void *q = malloc(nbytes);
    if (!q) {
        gp_error(GP_OUT_OF_MEMORY, "%s: cannot allocate the layer", ops->kind);
        return NULL;
    }
    memcpy(q, impl, nbytes);
    return gp_layer_new(ops, q);
}

gp_layer *gp_layer_copy(const gp_layer *l, size_t impl_nbytes) {
    void *impl = NULL;
    if (impl_nbytes) {
        impl = malloc(impl_nbytes);
        if (!impl) {
            gp_error(GP_OUT_OF_MEMORY, "%s: cannot copy the layer", l->ops->kind);
            return NULL;
        }
        memcpy(impl, l->impl, impl_nbytes);
    }
    gp_layer *c = gp_layer_new(l->ops, impl);
    if (!c) return NULL;
    c->index = l->index;
    c->skip_from = l->skip_from;
    c->nparams = l->nparams;
    for (int j = 0; j < l->nparams; j++) {
        const gp_param *p = &l->params[j];
        c->params[j] = (gp_param){.name = p->name, .shape = p->shape, .init = p->init,
                                  .init_scale = p->init_scale, .trainable = p->trainable,
                                  .decay = p->decay, .product = p->product};
    }
    return c;
}

gp_param *gp_layer_add_param(gp_layer *l, const char *name, gp_shape shape, gp_init_kind init,
                             float scale, bool decay) {
    GP_ASSERT(l->nparams < GP_LAYER_MAX_PARAMS);
    gp_param *p = &l->params[l->nparams++];
    memset(p, 0, sizeof *p);
    p->name = name;
    p->shape = shape;
    p->init = init;
    p->init_scale = scale;
    p->trainable = true;
    p->decay = decay;
    return p;
}

gp_param *gp_layer_add_buffer(gp_layer *l, const char *name, gp_shape shape, gp_init_kind init) {
    gp_param *p = gp_layer_add_param(l, name, shape, init, 0.0f, false);
    p->trainable = false;
    return p;
}

void gp_layer_free(gp_layer *l) {
    if (!l) return;
    for (int i = 0; i < l->nparams; i++) {
        gp_param *p = &l->params[i];
        gp_tensor_release(&p->value);
        gp_tensor_release(&p->grad);
        gp_tensor_release(&p->state[0]);
        gp_tensor_release(&p->state[1]);
    }
    if (l->ops->destroy)
        l->ops->destroy(l);
    else
        free(l->impl);
    free(l);
}

const char *gp_layer_kind(const gp_layer *l) { return l ? l->ops->kind : "(null)"; }

void gp_ctx_init(gp_ctx *c, gp_device *dev, const gp_run *run) {
    memset(c, 0, sizeof *c);
    c->dev = dev;
    if (run) c->run = *run;
}

gp_status gp_ctx_save(gp_ctx *c, int slot, gp_shape shape, gp_dtype dtype, gp_tensor **out) {
    GP_ASSERT(slot >= 0 && slot < GP_CTX_MAX_SAVED);
    gp_tensor_release(&c->saved[slot]);
    GP_TRY(gp_tensor_alloc(c->dev, GP_MEM_ACTIVATIONS, shape, dtype, &c->saved[slot]));
    if (out) *out = &c->saved[slot];
    return GP_OK;
}

gp_status gp_ctx_child(gp_ctx *c, int i, int n, gp_ctx **out) {
    GP_ASSERT(i >= 0 && i < n);
    if (!c->children) {
        c->children = calloc((size_t)n, sizeof *c->children);
        if (!c->children)
            return gp_error(GP_OUT_OF_MEMORY, "cannot allocate %d child contexts", n);
        c->nchildren = n;
        for (int k = 0; k < n; k++) gp_ctx_init(&c->children[k], c->dev, &c->run);
    }
    GP_ASSERT(n == c->nchildren);
    *out = &c->children[i];
    return GP_OK;
}

void gp_ctx_release(gp_ctx *c) {
    for (int i = 0; i < GP_CTX_MAX_SAVED; i++) gp_tensor_release(&c->saved[i]);
    for (int k = 0; k < c->nchildren; k++) gp_ctx_release(&c->children[k]);
    free(c->children);
    c->children = NULL;
    c->nchildren = 0;
    c->x = c->y = NULL;
    c->skip = NULL;
    c->dskip = NULL;
}

uint64_t gp_ctx_saved_bytes(const gp_ctx *c) {
    uint64_t n = 0;
    for (int i = 0; i < GP_CTX_MAX_SAVED; i++)
        if (c->saved[i].data) n += gp_tensor_nbytes(&c->saved[i]);
    for (int k = 0; k < c->nchildren; k++) n += gp_ctx_saved_bytes(&c->children[k]);
    return n;
}

gp_status gp_layer_backward_part(gp_layer *l, gp_ctx *c, const gp_tensor *dy, gp_tensor *dx,
                                 gp_bwd_part part) {
    if (l->ops->backward_part) return l->ops->backward_part(l, c, dy, dx, part);
    return part == GP_BWD_WEIGHT ? GP_OK : l->ops->backward(l, c, dy, dx);
}

gp_status gp_ctx_keep_begin(const gp_layer *l, gp_ctx *c, gp_bwd_part part, int first, int n,
                            const gp_shape *shapes) {
    gp_tensor *t;
    for (int i = 0; part == GP_BWD_INPUT && i < n; i++)
        GP_TRY(gp_ctx_save(c, first + i, shapes[i], GP_F32, &t));
    if (part == GP_BWD_WEIGHT && !c->saved[first].data)
        return gp_error(GP_INTERNAL, "layer %d (%s): weight gradients before the input part",
                        l->index, l->ops->kind);
    return GP_OK;
}

void gp_ctx_keep_end(gp_ctx *c, int first, int n) {
    for (int i = 0; i < n; i++) gp_tensor_release(&c->saved[first + i]);
}

gp_status gp_layer_check_params(const gp_layer *l, const gp_ctx *c, bool need_grads) {
    for (int i = 0; i < l->nparams; i++) {
        const gp_param *p = &l->params[i];
        if (!p->value.data)
            return gp_error(GP_INVALID_ARGUMENT,
                            "layer %d (%s): parameter %s is not allocated (initialize the model "
                            "first)",
                            l->index, l->ops->kind, p->name);
        if (need_grads && p->trainable && !p->grad.data)
            return gp_error(GP_INVALID_ARGUMENT,
                            "layer %d (%s): parameter %s has no gradient tensor for backward",
                            l->index, l->ops->kind, p->name);
        if (!gp_kernels_same_memory(p->value.dev, c->dev))
            return gp_error(GP_INVALID_ARGUMENT,
                            "layer %d (%s): parameter %s lives on device %s, the call runs on %s",
                            l->index, l->ops->kind, p->name, gp_device_name(p->value.dev),
                            gp_device_name(c->dev));
    }
    return GP_OK;
}

uint64_t gp_layer_param_bytes(const gp_layer *l) {
    uint64_t n = 0;
    for (int i = 0; i < l->nparams; i++)
        n += (uint64_t)gp_shape_nelem(&l->params[i].shape) * sizeof(float);
    return n;
}

const gp_bf16_switch gp_bf16_activations_env = {"GP_BF16_ACTIVATIONS", "bf16", "fp32"},
                     gp_bf16_weight_copy_env = {"GP_BF16_WEIGHT_COPY", "on", "off"};

int gp_bf16_env(const gp_bf16_switch *sw) {
    const char *e = getenv(sw->var);
    if (!e || strcmp(e, sw->on) == 0) return 1;
    if (strcmp(e, sw->off) == 0) return 0;
    gp_error(GP_INVALID_ARGUMENT, "%s=\"%s\" in the environment: expected %s (the default) or %s",
             sw->var, e, sw->on, sw->off);
    return -1;
}

bool gp_bf16_weight_copy(gp_device *dev) {
    return dev && gp_device_precision(dev) == GP_PRECISION_BF16 &&
           gp_bf16_env(&gp_bf16_weight_copy_env) != 0;
}

int64_t gp_param_bf16_copy_elems(const gp_param *p) {
    if (!p->product) return 0;
    const int64_t n = gp_shape_nelem(&p->shape);
    return (n + GP_BF16_COPY_ALIGN - 1) / GP_BF16_COPY_ALIGN * GP_BF16_COPY_ALIGN;
}

uint64_t gp_layer_bf16_copy_bytes(const gp_layer *l, gp_device *dev) {
    if (!gp_bf16_weight_copy(dev)) return 0;
    uint64_t n = 0;
    for (int i = 0; i < l->nparams; i++) n += (uint64_t)gp_param_bf16_copy_elems(&l->params[i]);
    return n * sizeof(uint16_t);
}

float *gp_ctx_workspace(const gp_layer *l, gp_ctx *c, int64_t nfloats, gp_status *st) {
    float *p = gp_device_alloc(c->dev, GP_MEM_WORKSPACE, (size_t)nfloats * sizeof(float), st);
    if (!p) gp_error_context(*st, "layer %d (%s): workspace", l->index, l->ops->kind);
    return p;
}

void gp_ctx_workspace_release(gp_ctx *c, void *p) { gp_device_release(c->dev, p); }

gp_status gp_expect_ndim(const gp_layer *l, const gp_shape *in, int ndim, const char *layout) {
    char buf[96];
    if (in->ndim != ndim)
        return gp_error(GP_SHAPE, "layer %d (%s): input shape %s has %d dimensions, expected %d %s",
                        l->index, l->ops->kind, gp_shape_str(in, buf, sizeof buf), in->ndim, ndim,
                        layout);
    return GP_OK;
}

gp_status gp_expect_dim(const gp_layer *l, const gp_shape *in, int axis, int64_t want,
                        const char *what) {
    char buf[96];
    if (axis >= in->ndim || in->dim[axis] != want)
        return gp_error(GP_SHAPE, "layer %d (%s): input shape %s: expected %s = %lld at axis %d",
                        l->index, l->ops->kind, gp_shape_str(in, buf, sizeof buf), what,
                        (long long)want, axis);
    return GP_OK;
}

gp_status gp_expect_dtype(const gp_layer *l, gp_dtype got, gp_dtype want) {
    if (got != want)
        return gp_error(GP_SHAPE, "layer %d (%s): input dtype %s, expected %s", l->index,
                        l->ops->kind, gp_dtype_name(got), gp_dtype_name(want));
    return GP_OK;
}
