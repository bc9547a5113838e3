/* The profiling pass behind balance-by-time: each layer timed alone, as a stage runs it (a
 * training-mode forward keeping its state, then its backward), on a one-thread CPU device, in the
 * thread's CPU time. Layers are initialized one at a time on a scratch device and released again,
 * so a model too big for one device can still be profiled; only the layer's own figures matter
 * to the partitioner. */
#include <stdlib.h>
#include <string.h>

#include "core/clock.h"
#include "model/param_store.h"
#include "model/sequence.h"
#include "model/skips.h"
#include "plan/profile.h"

/* Token 0 for integer inputs (always a valid id), small random values otherwise (no layer's
 * time depends on the values). */
gp_status gp_profile_stand_in(gp_device *dev, gp_shape shape, gp_dtype dt, uint32_t layer,
                              uint32_t which, gp_tensor *t) {
    GP_TRY(gp_tensor_zeros(dev, GP_MEM_ACTIVATIONS, shape, dt, t));
    if (dt != GP_F32) return GP_OK;
    const int64_t n = gp_tensor_nelem(t);
    float *host = malloc((size_t)(n ? n : 1) * sizeof *host);
    if (!host) return gp_error(GP_OUT_OF_MEMORY, "profiling: %lld stand-in values", (long long)n);
    gp_rng_stream r = {.seed = 1, .purpose = GP_RNG_PROFILE, .a = layer, .b = which};
    gp_rng_normal(&r, 0, host, n);
    gp_status s = gp_tensor_from_host(t, host, (size_t)n * sizeof *host);
    free(host);
    return s;
}

/* One forward + backward of layer li: the two times into f and b; with split (not NULL), a
 * second forward then the backward split in two, its input part's and its weight part's times
 * into split[0] and split[1] (what a zero-bubble schedule runs: the parts cost more than the
 * whole, since the input part keeps what the weight part reads and each part makes its own
 * pass). */
static gp_status run_once(gp_model *m, int li, gp_device *dev, const gp_tensor *x,
                          const gp_tensor *dy, gp_tensor *dx, double *f, double *b,
                          double *split) {
    gp_run run = {.training = true, .seed = 1};
    gp_seq_pass pass = {0};
    double t0 = gp_thread_cpu_now();
    GP_TRY(gp_seq_forward(m, li, li + 1, dev, &run, x, &pass));
    double t1 = gp_thread_cpu_now();
    gp_status s = gp_seq_backward(m, &pass, dy, dx);
    double t2 = gp_thread_cpu_now();
    gp_seq_release(&pass);
    *f = t1 - t0;
    *b = t2 - t1;
    if (s != GP_OK || !split) return s;
    GP_TRY(gp_seq_forward(m, li, li + 1, dev, &run, x, &pass));
    t0 = gp_thread_cpu_now();
    s = gp_seq_backward_input(m, &pass, dy, dx);
    t1 = gp_thread_cpu_now();
    if (s == GP_OK) s = gp_seq_backward_weight_each(m, &pass, NULL, NULL);
    t2 = gp_thread_cpu_now();
    gp_seq_release(&pass);
    split[0] = t1 - t0;
    split[1] = t2 - t1;
    return s;
}

/* Runs r0..r1-1 of layer li (after a warm-up run) into runs, the figures of run r of group g
 * (forward, backward, input part, weight part) at runs[(g * L + li) * reps + r]; with parts, a
 * split backward's too. The layer is initialized for the runs and released again. */
static gp_status profile_layer(gp_model *m, int li, int64_t mb, int r0, int r1, int reps,
                               gp_device *dev, double *runs, bool parts) {
    gp_shape in_shape, out_shape;
    /* the layer's cuts: a merge's skip comes in with its input, as in a cell of its own */
    GP_TRY(gp_model_cut_shape(m, li, mb, &in_shape));
    GP_TRY(gp_model_cut_shape(m, li + 1, mb, &out_shape));
    gp_dtype in_dt = li == 0 ? gp_model_input_dtype(m) : GP_F32;
    gp_tensor x = {0}, dy = {0}, dx = {0};
    GP_TRY(gp_model_init_range(m, li, li + 1, dev, 1));
    gp_layer *l = m->layers[li];
    gp_status s = gp_store_train_begin(m, m->store_of[li], 0);
    if (s == GP_OK) s = gp_profile_stand_in(dev, in_shape, in_dt, (uint32_t)li, 0, &x);
    if (s == GP_OK) s = gp_profile_stand_in(dev, out_shape, GP_F32, (uint32_t)li, 1, &dy);
    /* As in a pipeline, the first layer computes no input gradient (it has no one to send it). */
    if (s == GP_OK && li > 0) s = gp_tensor_alloc(dev, GP_MEM_ACTIVATIONS, in_shape, GP_F32, &dx);
    const int L = m->nlayers;
    for (int r = r0 - 1; r < r1 && s == GP_OK; r++) { /* r = r0 - 1: the warm-up run */
        double f = 0, b = 0, split[2] = {0, 0};
        s = run_once(m, li, dev, &x, &dy, li > 0 ? &dx : NULL, &f, &b, parts ? split : NULL);
        const double got[4] = {f, b, split[0], split[1]};
        for (int g = 0; g < 4 && r >= r0; g++) runs[((size_t)g * L + li) * reps + r] = got[g];
    }
    gp_tensor_release(&x);
    gp_tensor_release(&dy);
    gp_tensor_release(&dx);
    gp_store_release_layers(m, li, li + 1); /* the layer's store goes, gradients and all */
    if (s != GP_OK) return gp_error_context(s, "profiling layer %d (%s)", li, l->ops->kind);
    return GP_OK;
}

/* Whether layers a and b are alike: the same kind, input and output shapes, parameters and cost
 * (the same work). First layers and merges are like no other: they differ in what they compute
 * (no input gradient; a skip beside the input). */
static bool alike(const gp_model *m, int a, int b, int64_t mb) {
    const gp_layer *l = m->layers[a], *o = m->layers[b];
    gp_shape in, out, jin, jout;
    if (a == 0 || b == 0 || gp_layer_merges(l) || gp_layer_merges(o) || o->ops != l->ops ||
        o->nparams != l->nparams || gp_model_cut_shape(m, a, mb, &in) != GP_OK ||
        gp_model_cut_shape(m, a + 1, mb, &out) != GP_OK ||
        gp_model_cut_shape(m, b, mb, &jin) != GP_OK ||
        gp_model_cut_shape(m, b + 1, mb, &jout) != GP_OK || !gp_shape_equal(&in, &jin) ||
        !gp_shape_equal(&out, &jout))
        return false;
    const gp_cost c = l->ops->cost(l, &in), d = o->ops->cost(o, &jin);
    return c.fwd_flops == d.fwd_flops && c.bwd_flops == d.bwd_flops &&
           c.wgt_flops == d.wgt_flops && c.param_bytes == d.param_bytes &&
           c.out_bytes == d.out_bytes && c.saved_bytes == d.saved_bytes;
}

/* The first layer before li alike to it, or -1. */
static int same_as_before(const gp_model *m, int li, int64_t mb) {
    for (int j = 1; j < li; j++)
        if (alike(m, li, j, mb)) return j;
    return -1;
}

int gp_profile_alike(const gp_model *m, int li, int64_t micro_batch) {
    int n = 1;
    for (int j = 0; j < m->nlayers; j++) n += j != li && alike(m, li, j, micro_batch);
    return n;
}

/* Passes over the layers that the runs of each are spread across (fewer when fewer runs). */
#define PROFILE_PASSES 3

static gp_status profile(gp_model *m, int64_t micro_batch, int reps, double *times, bool parts);

gp_status gp_model_profile_layers(gp_model *m, int64_t micro_batch, int reps, double *times) {
    return profile(m, micro_batch, reps, times, false);
}

gp_status gp_model_profile_layers_split(gp_model *m, int64_t micro_batch, int reps,
                                        double *times) {
    return profile(m, micro_batch, reps, times, true);
}

static gp_status profile(gp_model *m, int64_t micro_batch, int reps, double *times, bool parts) {
    if (!m || !times) return gp_error(GP_INVALID_ARGUMENT, "gp_model_profile_layers: NULL argument");
    if (micro_batch < 1)
        return gp_error(GP_INVALID_ARGUMENT,
                        "gp_model_profile_layers: micro-batch of %lld examples; expected >= 1",
                        (long long)micro_batch);
    if (reps < 0 || reps > 1000)
        return gp_error(GP_INVALID_ARGUMENT,
                        "gp_model_profile_layers: %d repetitions; expected 0 (default 6) to 1000",
                        reps);
    if (reps == 0) reps = 6;
    const int L = m->nlayers;
    for (int li = 0; li < L; li++)
        if (m->store_of[li])
            return gp_error(GP_INVALID_ARGUMENT,
                            "gp_model_profile_layers: layer %d is initialized on device %s; "
                            "profile the model before initializing it or creating its pipeline",
                            li, gp_device_name(gp_model_layer_device(m, li)));
    const uint64_t seed = m->seed; /* initialization records its seed; keep the model's */
    gp_device *dev = NULL;
    double *runs = calloc(4 * (size_t)L * (size_t)reps, sizeof *runs);
    int *twin = calloc((size_t)L, sizeof *twin);
    gp_status s = runs && twin ? gp_device_cpu_new("profile", &dev)
                               : gp_error(GP_OUT_OF_MEMORY, "cannot allocate %d timings of %d "
                                                            "layers", reps, L);
    /* a layer like one timed before (a Transformer's blocks) takes its times: the same kernels
     * on the same shapes */
    for (int li = 0; li < L && s == GP_OK; li++) twin[li] = same_as_before(m, li, micro_batch);
    /* The runs in passes over the layers: the machine's speed drifts (other work on the host),
     * and a layer timed in one stretch would carry whatever the speed was then; over the
     * passes every layer sees the same drift. Their mean, not their median: a step is a sum of
     * many runs, and a slow stretch of the machine lengthens the step it falls in. */
    const int passes = reps < PROFILE_PASSES ? reps : PROFILE_PASSES;
    for (int p = 0; p < passes && s == GP_OK; p++)
        for (int li = 0; li < L && s == GP_OK; li++)
            if (twin[li] < 0)
                s = profile_layer(m, li, micro_batch, reps * p / passes, reps * (p + 1) / passes,
                                  reps, dev, runs, parts);
    for (int li = 0; li < L && s == GP_OK; li++)
        for (int g = 0; g < (parts ? 4 : 2); g++)
            times[g * L + li] = twin[li] >= 0
                                    ? times[g * L + twin[li]]
                                    : gp_mean(runs + ((size_t)g * L + li) * reps, reps);
    if (dev) gp_device_free(dev);
    free(runs);
    free(twin);
    m->seed = seed;
    return s;
}
