/* Small helpers shared by the Transformer family's layers: input checks with
 * the layer named in the message, parameter presence, workspace. */
#include "transformer_ops.h"

#include "../core/device.h"

gp_status gp_tl_rows(const gp_layer *l, const gp_shape *in, gp_dtype dtype, int64_t last,
                     const char *what, int64_t *rows) {
    char buf[96];
    GP_TRY(gp_expect_dtype(l, dtype, GP_F32));
    if (in->ndim < 2 || in->ndim > 4)
        return gp_error(GP_SHAPE,
                        "layer %d (%s): input shape %s has %d dimensions, expected 2 to 4 "
                        "(batch, ..., %s = %lld)",
                        l->index, l->ops->kind, gp_shape_str(in, buf, sizeof buf), in->ndim, what,
                        (long long)last);
    GP_TRY(gp_expect_dim(l, in, in->ndim - 1, last, what));
    int64_t r = 1;
    for (int i = 0; i < in->ndim - 1; i++) r *= in->dim[i];
    *rows = r;
    return GP_OK;
}

gp_status gp_tl_check_params(const gp_layer *l, bool need_grads) {
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
    }
    return GP_OK;
}

uint64_t gp_tl_param_bytes(const gp_layer *l) {
    uint64_t n = 0;
    for (int i = 0; i < l->nparams; i++)
        n += (uint64_t)gp_shape_nelem(&l->params[i].shape) * sizeof(float);
    return n;
}

float *gp_tl_workspace(const gp_layer *l, gp_ctx *c, int64_t nfloats, gp_status *st) {
    float *p = gp_device_alloc(c->dev, GP_MEM_WORKSPACE, (size_t)nfloats * sizeof(float), st);
    if (!p) gp_error_context(*st, "layer %d (%s): workspace", l->index, l->ops->kind);
    return p;
}

void gp_tl_workspace_release(gp_ctx *c, float *p) { gp_device_release(c->dev, p); }
