/* SGD with momentum and AdamW (PyTorch's update rules, so the reference test can compare step
 * by step) over flat arrays, the learning-rate schedule (linear warm-up, then cosine decay) and
 * clipping by global gradient norm. */
#include "optim/optim.h"

#include <math.h>

#include "core/error.h"
#include "kernels/kernels.h"

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
    if (o->lr_cycles < 0 || (o->lr_cycles > 1 && o->total_steps / o->lr_cycles <= o->warmup_steps))
        return gp_error(GP_CONFIG,
                        "optimizer: %d learning-rate cycles of %d steps: expected at least 1 (0: "
                        "one), each longer than the %d warm-up steps (a cosine schedule's steps "
                        "%d split evenly)",
                        o->lr_cycles, o->lr_cycles > 0 ? o->total_steps / o->lr_cycles : 0,
                        o->warmup_steps, o->total_steps);
    if (o->kind == GP_OPTIM_SGD && !(o->momentum >= 0 && o->momentum < 1))
        return gp_error(GP_CONFIG, "SGD: momentum %g must be in [0, 1)", o->momentum);
    if (o->kind == GP_OPTIM_ADAMW &&
        !(o->beta1 >= 0 && o->beta1 < 1 && o->beta2 >= 0 && o->beta2 < 1 && o->eps > 0))
        return gp_error(GP_CONFIG, "AdamW: beta1 %g and beta2 %g must be in [0, 1) and eps %g > 0",
                        o->beta1, o->beta2, o->eps);
    return GP_OK;
}

/* The first step of cycle c of n over total steps. */
static int cycle_start(int64_t total, int c, int n) { return (int)(total * c / n); }

float gp_optim_lr_at(const gp_optim_opts *o, int step) {
    if (step < o->warmup_steps) return o->lr * (float)(step + 1) / (float)o->warmup_steps;
    if (o->total_steps <= o->warmup_steps) return o->lr;
    const int n = o->lr_cycles > 1 ? o->lr_cycles : 1;
    int c = n - 1;
    while (c > 0 && step < cycle_start(o->total_steps, c, n)) c--;
    const int start = c == 0 ? o->warmup_steps : cycle_start(o->total_steps, c, n);
    const int end = cycle_start(o->total_steps, c + 1, n);
    if (end <= start) return o->lr;
    double progress = (double)(step - start) / (double)(end - start);
    if (progress > 1) progress = 1;
    return (float)(o->min_lr + 0.5 * (o->lr - o->min_lr) * (1.0 + cos(3.14159265358979323846 * progress)));
}

int gp_optim_state_count(const gp_optim_opts *o) {
    if (!o) return 0;
    return o->kind == GP_OPTIM_ADAMW ? 2 : (o->momentum > 0 ? 1 : 0);
}

float gp_clip_factor(float clip_norm, double total_norm) {
    if (clip_norm <= 0) return 1.0f;
    double f = clip_norm / (total_norm + 1e-6);
    return f < 1.0 ? (float)f : 1.0f;
}

gp_status gp_optim_update(const gp_optim_opts *o, gp_device *dev, int64_t n, float *w,
                          const float *g, float *const state[2], bool decay, float lr, int t) {
    const gp_kernels *k = gp_kernels_of(dev);
    const float wd = decay ? o->weight_decay : 0.0f;
    if (o->kind != GP_OPTIM_ADAMW) return k->sgd_update(dev, n, w, g, state[0], lr, wd, o->momentum);
    const gp_adamw_step s = {.decay = 1.0f - lr * wd,
                             .beta1 = o->beta1,
                             .beta2 = o->beta2,
                             .eps = o->eps,
                             .step_size = lr / (float)(1.0 - pow(o->beta1, t)),
                             .bc2_sqrt = (float)sqrt(1.0 - pow(o->beta2, t))};
    return k->adamw_update(dev, n, w, g, state[0], state[1], &s);
}
