/* SGD with momentum and AdamW (PyTorch's update rules, so the reference
 * test can compare step by step), the learning-rate schedule (linear
 * warm-up, then cosine decay) and clipping by global gradient norm. */
#include "optim.h"

#include <math.h>
#include <string.h>

gp_optim_opts gp_sgd_defaults(float lr, float momentum) {
    return (gp_optim_opts){.kind = GP_OPTIM_SGD, .lr = lr, .momentum = momentum};
}

gp_optim_opts gp_adamw_defaults(float lr, float weight_decay) {
    return (gp_optim_opts){.kind = GP_OPTIM_ADAMW, .lr = lr, .beta1 = 0.9f, .beta2 = 0.999f,
                           .eps = 1e-8f, .weight_decay = weight_decay};
}

gp_status gp_optim_check(const gp_optim_opts *o) {
    if (!o) return gp_error(GP_INVALID_ARGUMENT, "optimizer options are NULL");
    if (o->kind != GP_OPTIM_SGD && o->kind != GP_OPTIM_ADAMW)
        return gp_error(GP_CONFIG, "optimizer: unknown kind %d (expected SGD or AdamW)", (int)o->kind);
    if (!(o->lr > 0) || !isfinite(o->lr))
        return gp_error(GP_CONFIG, "optimizer: learning rate %g must be a finite number > 0", o->lr);
    if (!(o->min_lr >= 0) || o->min_lr > o->lr)
        return gp_error(GP_CONFIG, "optimizer: min_lr %g must be in [0, lr = %g]", o->min_lr, o->lr);
    if (!(o->weight_decay >= 0) || !isfinite(o->weight_decay))
        return gp_error(GP_CONFIG, "optimizer: weight decay %g must be >= 0", o->weight_decay);
    if (!(o->clip_norm >= 0) || !isfinite(o->clip_norm))
        return gp_error(GP_CONFIG, "optimizer: clip norm %g must be >= 0 (0: off)", o->clip_norm);
    if (o->warmup_steps < 0 || o->total_steps < 0)
        return gp_error(GP_CONFIG, "optimizer: warm-up %d and total steps %d must be >= 0",
                        o->warmup_steps, o->total_steps);
    if (o->kind == GP_OPTIM_SGD && !(o->momentum >= 0 && o->momentum < 1))
        return gp_error(GP_CONFIG, "SGD: momentum %g must be in [0, 1)", o->momentum);
    if (o->kind == GP_OPTIM_ADAMW &&
        !(o->beta1 >= 0 && o->beta1 < 1 && o->beta2 >= 0 && o->beta2 < 1 && o->eps > 0))
        return gp_error(GP_CONFIG, "AdamW: beta1 %g and beta2 %g must be in [0, 1) and eps %g > 0",
                        o->beta1, o->beta2, o->eps);
    return GP_OK;
}

float gp_optim_lr_at(const gp_optim_opts *o, int step) {
    if (step < o->warmup_steps) return o->lr * (float)(step + 1) / (float)o->warmup_steps;
    if (o->total_steps <= o->warmup_steps) return o->lr;
    double progress = (double)(step - o->warmup_steps) / (double)(o->total_steps - o->warmup_steps);
    if (progress > 1) progress = 1;
    return (float)(o->min_lr + 0.5 * (o->lr - o->min_lr) * (1.0 + cos(3.14159265358979323846 * progress)));
}

int gp_optim_state_count(const gp_optim_opts *o) {
    if (!o) return 0;
    return o->kind == GP_OPTIM_ADAMW ? 2 : (o->momentum > 0 ? 1 : 0);
}

gp_status gp_optim_state_init(const gp_optim_opts *o, gp_param *p, gp_device *dev) {
    int nstate = gp_optim_state_count(o);
    for (int i = 0; i < nstate; i++) {
        gp_tensor_release(&p->state[i]);
        GP_TRY(gp_tensor_zeros(dev, GP_MEM_OPTIM, p->shape, GP_F32, &p->state[i]));
    }
    return GP_OK;
}

static void sgd_update(const gp_optim_opts *o, gp_param *p, float lr) {
    float *w = p->value.data, *g = p->grad.data, *buf = p->state[0].data;
    int64_t n = gp_tensor_nelem(&p->value);
    float wd = p->decay ? o->weight_decay : 0.0f, mu = o->momentum;
    if (buf) {
        for (int64_t i = 0; i < n; i++) {
            float d = g[i] + wd * w[i];
            buf[i] = mu * buf[i] + d;
            w[i] -= lr * buf[i];
        }
    } else {
        for (int64_t i = 0; i < n; i++) w[i] -= lr * (g[i] + wd * w[i]);
    }
}

static void adamw_update(const gp_optim_opts *o, gp_param *p, float lr, int t) {
    float *w = p->value.data, *g = p->grad.data;
    float *m = p->state[0].data, *v = p->state[1].data;
    int64_t n = gp_tensor_nelem(&p->value);
    float b1 = o->beta1, b2 = o->beta2;
    float decay = 1.0f - lr * (p->decay ? o->weight_decay : 0.0f);
    float step_size = lr / (float)(1.0 - pow(b1, t));
    float bc2_sqrt = (float)sqrt(1.0 - pow(b2, t));
    for (int64_t i = 0; i < n; i++) {
        float wi = w[i] * decay;
        m[i] = m[i] * b1 + g[i] * (1.0f - b1);
        v[i] = v[i] * b2 + g[i] * g[i] * (1.0f - b2);
        float denom = sqrtf(v[i]) / bc2_sqrt + o->eps;
        w[i] = wi - step_size * (m[i] / denom);
    }
}

void gp_optim_update(const gp_optim_opts *o, gp_param *p, float lr, int t) {
    if (o->kind == GP_OPTIM_ADAMW)
        adamw_update(o, p, lr, t);
    else
        sgd_update(o, p, lr);
}

double gp_grad_sumsq(const gp_param *p) {
    const float *g = p->grad.data;
    int64_t n = gp_tensor_nelem(&p->grad);
    double s = 0;
    for (int64_t i = 0; i < n; i++) s += (double)g[i] * g[i];
    return s;
}

void gp_grad_scale(gp_param *p, float scale) {
    float *g = p->grad.data;
    int64_t n = gp_tensor_nelem(&p->grad);
    for (int64_t i = 0; i < n; i++) g[i] *= scale;
}

float gp_clip_factor(float clip_norm, double total_norm) {
    if (clip_norm <= 0) return 1.0f;
    double f = clip_norm / (total_norm + 1e-6);
    return f < 1.0 ? (float)f : 1.0f;
}

double gp_layer_grad_sumsq(const gp_layer *l) {
    double sum = 0;
    for (int j = 0; j < l->nparams; j++)
        if (l->params[j].trainable) sum += gp_grad_sumsq(&l->params[j]);
    return sum;
}

void gp_optim_apply_layers(const gp_optim_opts *o, gp_layer *const *layers, int first, int last,
                           double global_norm, int step) {
    float clip = gp_clip_factor(o->clip_norm, global_norm);
    float lr = gp_optim_lr_at(o, step);
    for (int li = first; li < last; li++)
        for (int j = 0; j < layers[li]->nparams; j++) {
            gp_param *p = &layers[li]->params[j];
            if (!p->trainable) continue;
            if (clip < 1.0f) gp_grad_scale(p, clip);
            gp_optim_update(o, p, lr, step + 1);
        }
}
