/* Single-device training: M micro-batches through the whole model,
 * gradients summed in micro-batch order, one synchronous update. The
 * pipeline runs the same steps per cell. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "../optim/optim.h"
#include "sequence.h"
#include "trainer_internal.h"

struct gp_trainer {
    gp_model *m;
    gp_device *dev;
    gp_optim_opts o;
    int micro_batches;
    uint64_t seed;
    int step;
    float last_grad_norm;
};

#define FOR_EACH_TRAINABLE(m, p)                                                   \
    for (int li_ = 0; li_ < (m)->nlayers; li_++)                                   \
        for (int pj_ = 0; pj_ < (m)->layers[li_]->nparams; pj_++)                  \
            if (((p) = &(m)->layers[li_]->params[pj_])->trainable)

static void free_state(gp_model *m) {
    gp_param *p;
    FOR_EACH_TRAINABLE(m, p) {
        gp_tensor_release(&p->grad);
        gp_tensor_release(&p->state[0]);
        gp_tensor_release(&p->state[1]);
    }
}

gp_status gp_trainer_new(gp_model *m, const gp_optim_opts *o, const gp_trainer_opts *to,
                         gp_trainer **out) {
    if (!m || !o || !out) return gp_error(GP_INVALID_ARGUMENT, "gp_trainer_new: NULL argument");
    *out = NULL;
    GP_TRY(gp_optim_check(o));
    int mb = to && to->micro_batches ? to->micro_batches : 1;
    if (mb < 1)
        return gp_error(GP_INVALID_ARGUMENT, "gp_trainer_new: micro_batches %d must be >= 1", mb);
    gp_device *dev = gp_model_range_device(m, 0, m->nlayers);
    if (!dev) return gp_error_context(GP_INVALID_ARGUMENT, "gp_trainer_new");
    gp_trainer *t = calloc(1, sizeof *t);
    if (!t) return gp_error(GP_OUT_OF_MEMORY, "gp_trainer_new: cannot allocate the trainer");
    t->m = m;
    t->dev = dev;
    t->o = *o;
    t->micro_batches = mb;
    t->seed = to && to->seed ? to->seed : m->seed;
    gp_param *p;
    FOR_EACH_TRAINABLE(m, p) {
        if (p->grad.data) {
            free(t);
            return gp_error(GP_INVALID_ARGUMENT,
                            "gp_trainer_new: the model already has a trainer (layer %d parameter %s "
                            "has gradients); free it first",
                            li_, p->name);
        }
    }
    FOR_EACH_TRAINABLE(m, p) {
        gp_status s = gp_tensor_zeros(dev, GP_MEM_GRADS, p->shape, GP_F32, &p->grad);
        if (s == GP_OK) s = gp_optim_state_init(o, p, dev);
        if (s != GP_OK) {
            free_state(m);
            free(t);
            return gp_error_context(s, "gp_trainer_new: layer %d parameter %s", li_, p->name);
        }
    }
    *out = t;
    return GP_OK;
}

void gp_trainer_free(gp_trainer *t) {
    if (!t) return;
    free_state(t->m);
    free(t);
}

int gp_trainer_steps_done(const gp_trainer *t) { return t ? t->step : 0; }
gp_status gp_trainer_set_step(gp_trainer *t, int steps_done) {
    if (!t) return gp_error(GP_INVALID_ARGUMENT, "gp_trainer_set_step: trainer is NULL");
    if (steps_done < 0)
        return gp_error(GP_INVALID_ARGUMENT, "gp_trainer_set_step: %d steps, expected >= 0",
                        steps_done);
    t->step = steps_done;
    return GP_OK;
}

float gp_trainer_last_grad_norm(const gp_trainer *t) { return t ? t->last_grad_norm : 0.0f; }

void gp_trainer_zero_grads(gp_trainer *t) {
    gp_param *p;
    FOR_EACH_TRAINABLE(t->m, p) memset(p->grad.data, 0, gp_tensor_nbytes(&p->grad));
}

/* Rows [first, first + n) of a batch-first tensor, as a view. */
static gp_tensor batch_slice(const gp_tensor *t, int64_t first, int64_t n) {
    int64_t row = gp_tensor_nelem(t) / t->shape.dim[0];
    gp_shape s = t->shape;
    s.dim[0] = n;
    gp_tensor v = gp_tensor_view((char *)t->data + (size_t)(first * row) * gp_dtype_nbytes(t->dtype),
                                 s, t->dtype);
    return v;
}

static gp_status check_batch(const gp_trainer *t, const gp_tensor *x, const gp_tensor *y) {
    char got[96], want[96];
    if (!x || !y || !x->data || !y->data)
        return gp_error(GP_INVALID_ARGUMENT, "training step: x and y must be allocated tensors");
    gp_shape ws;
    int64_t b = x->shape.ndim ? x->shape.dim[0] : 0;
    if (b < 1) return gp_error(GP_SHAPE, "training step: empty batch");
    GP_TRY(gp_model_shape(t->m, -1, b, &ws));
    if (!gp_shape_equal(&ws, &x->shape) || x->dtype != t->m->input_dtype)
        return gp_error(GP_SHAPE, "training step: input %s %s, expected %s %s",
                        gp_shape_str(&x->shape, got, sizeof got), gp_dtype_name(x->dtype),
                        gp_shape_str(&ws, want, sizeof want), gp_dtype_name(t->m->input_dtype));
    if (y->dtype != GP_I32 || y->shape.ndim < 1 || y->shape.dim[0] != b)
        return gp_error(GP_SHAPE, "training step: labels %s %s, expected int32 with batch %lld first",
                        gp_shape_str(&y->shape, got, sizeof got), gp_dtype_name(y->dtype),
                        (long long)b);
    if (b % t->micro_batches)
        return gp_error(GP_INVALID_ARGUMENT,
                        "training step: batch %lld is not divisible by %d micro-batches", (long long)b,
                        t->micro_batches);
    return GP_OK;
}

gp_status gp_trainer_accumulate(gp_trainer *t, const gp_tensor *x, const gp_tensor *y,
                                float *loss) {
    if (!t) return gp_error(GP_INVALID_ARGUMENT, "training step: trainer is NULL");
    GP_TRY(check_batch(t, x, y));
    int M = t->micro_batches;
    int64_t b = x->shape.dim[0] / M;
    double normalizer = (double)gp_count_labels(y);
    double total = 0;
    gp_model *m = t->m;
    for (int mb = 0; mb < M; mb++) {
        gp_run run = {.training = true, .recompute = false, .seed = t->seed,
                      .step = (uint32_t)t->step, .micro_batch = (uint32_t)mb};
        gp_tensor xv = batch_slice(x, mb * b, b), yv = batch_slice(y, mb * b, b);
        gp_seq_pass pass;
        GP_TRY(gp_seq_forward(m, 0, m->nlayers, t->dev, &run, &xv, &pass));
        const gp_tensor *logits = gp_seq_output(&pass);
        gp_tensor dlogits;
        double l = 0;
        gp_status s = gp_tensor_alloc(t->dev, GP_MEM_ACTIVATIONS, logits->shape, GP_F32, &dlogits);
        if (s == GP_OK) s = gp_softmax_xent(logits, &yv, normalizer > 0 ? normalizer : 1, &l, &dlogits);
        if (s == GP_OK) {
            s = gp_seq_backward(m, &pass, &dlogits, NULL);
        } else {
            gp_tensor_release(&dlogits);
            gp_seq_release(&pass);
            return gp_error_context(s, "micro-batch %d loss", mb);
        }
        gp_tensor_release(&dlogits);
        if (s != GP_OK) return s;
        total += l;
    }
    if (!isfinite(total))
        return gp_error(GP_NUMERIC, "step %d: the loss is not finite (%g)", t->step, total);
    if (loss) *loss = (float)total;
    return GP_OK;
}

gp_status gp_trainer_apply(gp_trainer *t) {
    gp_model *m = t->m;
    /* Global norm: per-layer partial sums combined in layer order, so the
     * result does not depend on how layers are split across stages. */
    double total = 0;
    for (int li = 0; li < m->nlayers; li++) total += gp_layer_grad_sumsq(m->layers[li]);
    double norm = sqrt(total);
    t->last_grad_norm = (float)norm;
    if (!isfinite(norm)) {
        gp_trainer_zero_grads(t); /* so the next step starts clean */
        return gp_error(GP_NUMERIC, "step %d: the gradient norm is not finite; no update made",
                        t->step);
    }
    gp_optim_apply_layers(&t->o, m->layers, 0, m->nlayers, norm, t->step);
    gp_trainer_zero_grads(t);
    t->step++;
    return GP_OK;
}

gp_status gp_trainer_step(gp_trainer *t, const gp_tensor *x, const gp_tensor *y, float *loss) {
    float l = 0;
    gp_status s = gp_trainer_accumulate(t, x, y, &l);
    if (s == GP_OK) s = gp_trainer_apply(t);
    if (s != GP_OK) {
        /* A failed step leaves no gradients behind, so the next can succeed. */
        if (t) gp_trainer_zero_grads(t);
        return s;
    }
    if (loss) *loss = l;
    return GP_OK;
}
