/* Times an optimizer step per trainable element, for the planner: the optimizer step is part of
 * every pipeline step (each stage updates its own cells after its last backward), and a plan
 * that leaves it out predicts steps too short by its share (2-3% of a T2 step with AdamW). */
#include <stdlib.h>

#include "core/clock.h"
#include "core/device.h"
#include "core/error.h"
#include "kernels/kernels.h"
#include "optim/optim.h"

/* What a stage does with its gradients after the last backward (pipeline/stage.c): their sum
 * of squares (the global norm), the clip's scaling when clipping is on (counted always: an upper
 * bound), the update with weight decay, and the gradients cleared for the next step. */
static gp_status one_step(const gp_optim_opts *o, gp_device *dev, int64_t n, float *w, float *g,
                          float *const state[2], int t) {
    const gp_kernels *k = gp_kernels_of(dev);
    double sumsq = 0;
    GP_TRY(k->sumsq(dev, g, n, &sumsq));
    if (o->clip_norm > 0) GP_TRY(k->scale(dev, g, n, 1.0f));
    GP_TRY(gp_optim_update(o, dev, n, w, g, state, true, o->lr, t));
    return gp_device_fill(dev, g, (size_t)n * sizeof *g, 0);
}

gp_status gp_optim_profile(const gp_optim_opts *o, int64_t n, int reps, double *s_per_elem) {
    if (!s_per_elem) return gp_error(GP_INVALID_ARGUMENT, "gp_optim_profile: NULL output");
    *s_per_elem = 0;
    GP_TRY(gp_optim_check(o));
    if (n < 0 || n > ((int64_t)1 << 28))
        return gp_error(GP_INVALID_ARGUMENT,
                        "gp_optim_profile: %lld elements; expected 0 (default 2^22) to 2^28",
                        (long long)n);
    /* 16 MiB an array: past the caches, as a stage's parameters of any size worth planning */
    if (n == 0) n = (int64_t)1 << 22;
    if (reps < 0 || reps > 1000)
        return gp_error(GP_INVALID_ARGUMENT,
                        "gp_optim_profile: %d repetitions; expected 0 (default 3) to 1000", reps);
    if (reps == 0) reps = 3;
    const int nstate = gp_optim_state_count(o);
    gp_device *dev = NULL;
    GP_TRY(gp_device_cpu_new("optim-profile", &dev));
    gp_status s = GP_OK;
    /* w | g | state 0 | state 1 */
    const size_t nbytes = (size_t)(2 + nstate) * (size_t)n * sizeof(float);
    float *buf = gp_device_alloc(dev, GP_MEM_WORKSPACE, nbytes, &s);
    double *times = calloc((size_t)reps, sizeof *times);
    if (s == GP_OK && !times)
        s = gp_error(GP_OUT_OF_MEMORY, "gp_optim_profile: %d timings", reps);
    if (s == GP_OK) s = gp_device_fill(dev, buf, nbytes, 0);
    float *const state[2] = {buf && nstate > 0 ? buf + 2 * n : NULL,
                             buf && nstate > 1 ? buf + 3 * n : NULL};
    for (int r = -1; r < reps && s == GP_OK; r++) { /* r = -1: the warm-up (first touch) */
        const double t0 = gp_thread_cpu_now();
        s = one_step(o, dev, n, buf, buf + n, state, r + 2);
        if (r >= 0) times[r] = gp_thread_cpu_now() - t0;
    }
    if (s == GP_OK) {
        *s_per_elem = gp_median(times, reps) / (double)n;
    }
    free(times);
    gp_device_release(dev, buf);
    gp_device_free(dev);
    return s == GP_OK ? GP_OK
                      : gp_error_context(s, "gp_optim_profile (%lld elements)", (long long)n);
}
