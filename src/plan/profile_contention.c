/* How much slower a layer runs inside a stage of a running pipeline than the layer-alone profile
 * times it. The profile runs one micro-batch of the layer at a time, its parameters and state hot
 * in the caches, the machine to itself; a stage holds several micro-batches' state and many
 * layers' parameters (a Transformer stage: a dozen blocks' worth, past the core's own caches),
 * which stream through the caches at every action, while the other stages share the memory
 * system. So the run alone is the profile's, and the run together a stage's, or the factor would
 * divide out the very streaming it stands for. On the 2-core Xeon (T2, micro-batches of 1) the
 * factor came out 0.8-1.3 from round to round, the host's noise as large as the effect. */
#define _GNU_SOURCE /* sched_getaffinity, pthread_setaffinity_np */
#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>

#include "core/clock.h"
#include "model/param_store.h"
#include "model/sequence.h"
#include "model/shard.h"
#include "plan/cores.h"
#include "plan/profile.h"

#define ROUNDS 5

/* The contenders' start: each waits at the gate until every thread exists (go) or one could
 * not be started (stop), then the reps run in step through the barrier. */
typedef struct gate {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int state; /* 0 wait, 1 go, -1 stop */
    pthread_barrier_t step;
} gate;

typedef struct contender {
    const gp_model *m;
    int li, cpu, inflight, copies;
    bool lead;               /* also runs alone each round, the others waiting */
    int64_t mb;
    gate *g;
    double alone[ROUNDS + 1]; /* the lead's: before each round's together, and after the last */
    double together[ROUNDS];
    gp_status st;
    char msg[512]; /* a failure's message: errors are per thread */
} contender;

/* As a stage runs its layers: for each of `inflight` micro-batches, the forwards of the
 * `copies` copies (each its own parameters), all kept, then the backwards in reverse; or (alone)
 * as the profile runs the layer: one copy's forward and backward, as many times. The seconds per
 * forward and backward into *t (when s is still GP_OK). */
static gp_status one_run(contender *c, gp_device *dev, gp_model **copy, gp_seq_pass *pass,
                         const gp_tensor *x, const gp_tensor *dy, gp_tensor *dx, bool alone,
                         gp_status s, double *t) {
    if (s != GP_OK) return s;
    gp_run run = {.training = true, .seed = 1};
    const int n = c->inflight * c->copies;
    const double t0 = gp_thread_cpu_now();
    for (int r = 0; alone && r < n && s == GP_OK; r++) {
        if ((s = gp_seq_forward(copy[0], 0, 1, dev, &run, x, &pass[0])) != GP_OK) break;
        s = gp_seq_backward(copy[0], &pass[0], dy, c->li > 0 ? dx : NULL);
        gp_seq_release(&pass[0]);
    }
    int kept = 0;
    for (; !alone && kept < n && s == GP_OK; kept++)
        if ((s = gp_seq_forward(copy[kept % c->copies], 0, 1, dev, &run, x, &pass[kept])) != GP_OK)
            break;
    for (int i = kept - 1; i >= 0; i--) {
        if (s == GP_OK) s = gp_seq_backward(copy[i % c->copies], &pass[i], dy, c->li > 0 ? dx : NULL);
        gp_seq_release(&pass[i]);
    }
    *t = (gp_thread_cpu_now() - t0) / n;
    return s;
}

/* Rounds in step with the other contenders (the barrier, passed by all whether they failed or
 * not, so none is left waiting): the lead's run alone, then every contender's at once, and the
 * lead's alone once more after the last. Alone and together alternate, so a change in the
 * machine's load between them weighs on both. */
static gp_status contend(contender *c, gp_device *dev, gp_model **copy, gp_status s) {
    gp_shape in_shape = {0}, out_shape = {0};
    gp_tensor x = {0}, dy = {0}, dx = {0};
    gp_seq_pass *pass = calloc((size_t)(c->inflight * c->copies), sizeof *pass);
    if (s == GP_OK && !pass) s = gp_error(GP_OUT_OF_MEMORY, "contention: %d passes", c->inflight);
    if (s == GP_OK) s = gp_model_shape(copy[0], -1, c->mb, &in_shape);
    if (s == GP_OK) s = gp_model_shape(copy[0], 0, c->mb, &out_shape);
    for (int j = 0; j < c->copies && s == GP_OK; j++) {
        s = gp_model_init(copy[j], dev, 1);
        if (s == GP_OK) s = gp_store_train_begin(copy[j], copy[j]->store_of[0], 0);
    }
    if (s == GP_OK)
        s = gp_profile_stand_in(dev, in_shape, gp_model_input_dtype(copy[0]), (uint32_t)c->li, 0,
                                &x);
    if (s == GP_OK) s = gp_profile_stand_in(dev, out_shape, GP_F32, (uint32_t)c->li, 1, &dy);
    if (s == GP_OK && c->li > 0)
        s = gp_tensor_alloc(dev, GP_MEM_ACTIVATIONS, in_shape, GP_F32, &dx);
    for (int r = -1; r <= ROUNDS; r++) { /* r = -1: the warm-up; r = ROUNDS: the last alone */
        double t = 0;
        pthread_barrier_wait(&c->g->step);
        if (c->lead) s = one_run(c, dev, copy, pass, &x, &dy, &dx, true, s, &t);
        if (c->lead && r >= 0) c->alone[r] = t;
        if (r == ROUNDS) break;
        pthread_barrier_wait(&c->g->step);
        s = one_run(c, dev, copy, pass, &x, &dy, &dx, false, s, &t);
        if (r >= 0) c->together[r] = t;
    }
    free(pass);
    gp_tensor_release(&x);
    gp_tensor_release(&dy);
    gp_tensor_release(&dx);
    return s;
}

static void *contender_main(void *arg) {
    contender *c = arg;
    if (c->g) {
        pthread_mutex_lock(&c->g->mu);
        while (c->g->state == 0) pthread_cond_wait(&c->g->cv, &c->g->mu);
        const int state = c->g->state;
        pthread_mutex_unlock(&c->g->mu);
        if (state < 0) return NULL;
    }
    if (c->cpu >= 0) {
        cpu_set_t set;
        CPU_ZERO(&set);
        CPU_SET(c->cpu, &set);
        pthread_setaffinity_np(pthread_self(), sizeof set, &set); /* unpinned is still a run */
    }
    gp_model **copy = calloc((size_t)c->copies, sizeof *copy);
    gp_device *dev = NULL;
    gp_status s = copy ? GP_OK : gp_error(GP_OUT_OF_MEMORY, "contention: %d copies", c->copies);
    for (int j = 0; j < c->copies && s == GP_OK; j++)
        s = gp_model_layer_copy_new(c->m, c->li, &copy[j]);
    if (s == GP_OK) s = gp_device_cpu_new("contention", &dev);
    c->st = contend(c, dev, copy, s);
    if (c->st != GP_OK) snprintf(c->msg, sizeof c->msg, "%s", gp_last_error());
    for (int j = 0; copy && j < c->copies; j++) gp_model_free(copy[j]);
    free(copy);
    if (dev) gp_device_free(dev);
    return NULL;
}

gp_status gp_model_profile_contention(const gp_model *m, int li, int64_t micro_batch, int n,
                                      int copies, int inflight, double *factor) {
    if (!factor) return gp_error(GP_INVALID_ARGUMENT, "gp_model_profile_contention: NULL output");
    *factor = 1.0;
    if (!m || li < 0 || li >= gp_model_nlayers(m))
        return gp_error(GP_INVALID_ARGUMENT, "gp_model_profile_contention: layer %d of %d", li,
                        m ? gp_model_nlayers(m) : 0);
    if (micro_batch < 1 || n < 1 || n > 256 || copies < 1 || copies > 64 || inflight < 1 ||
        inflight > 64)
        return gp_error(GP_INVALID_ARGUMENT,
                        "gp_model_profile_contention: micro-batch %lld, %d devices, %d copies, %d in "
                        "flight; expected >= 1, 1 to 256, 1 to 64, 1 to 64",
                        (long long)micro_batch, n, copies, inflight);
    if (n == 1) return GP_OK;
    /* the cores the stages would get (launch_local.c's assignment): core k for device k */
    int cores[CPU_SETSIZE];
    const int ncores = gp_pinning_cores(cores, CPU_SETSIZE);
    contender *c = calloc((size_t)n, sizeof *c);
    pthread_t *th = calloc((size_t)n, sizeof *th);
    if (!c || !th) {
        free(c);
        free(th);
        return gp_error(GP_OUT_OF_MEMORY, "gp_model_profile_contention: %d threads", n);
    }
    for (int k = 0; k < n; k++)
        c[k] = (contender){.m = m, .li = li, .mb = micro_batch, .inflight = inflight,
                           .copies = copies, .lead = k == 0, .cpu = ncores >= n ? cores[k] : -1};
    gate g = {.mu = PTHREAD_MUTEX_INITIALIZER, .cv = PTHREAD_COND_INITIALIZER};
    gp_status s = GP_OK;
    int started = 0;
    if (pthread_barrier_init(&g.step, NULL, (unsigned)n) == 0) {
        for (int k = 0; k < n; k++) c[k].g = &g;
        for (; started < n; started++)
            if (pthread_create(&th[started], NULL, contender_main, &c[started]) != 0) break;
        pthread_mutex_lock(&g.mu);
        g.state = started == n ? 1 : -1;
        pthread_cond_broadcast(&g.cv);
        pthread_mutex_unlock(&g.mu);
        for (int k = 0; k < started; k++) pthread_join(th[k], NULL);
        pthread_barrier_destroy(&g.step);
        if (started < n)
            s = gp_error(GP_INTERNAL, "gp_model_profile_contention: cannot start %d threads", n);
    } else {
        s = gp_error(GP_INTERNAL, "gp_model_profile_contention: no barrier for %d threads", n);
    }
    /* each round's mean together over the lead's alone before and after it (all per forward and
     * backward: the machine's speed drifts, and the two alones bracket the drift), the median
     * over the rounds. The mean, though a pipeline keeps the pace of its slowest stage: the
     * slowest of a round's few runs is mostly noise on a shared host (with it T2's predicted
     * step moved between 4.0 and 8.2 s from run to run on the 2-core Xeon). */
    double ratio[ROUNDS];
    for (int k = 0; k < n && s == GP_OK; k++)
        if (c[k].st != GP_OK) s = gp_error(c[k].st, "contender %d: %s", k, c[k].msg);
    for (int r = 0; r < ROUNDS && s == GP_OK; r++) {
        double together = 0;
        for (int k = 0; k < n; k++) together += c[k].together[r] / n;
        const double alone = (c[0].alone[r] + c[0].alone[r + 1]) / 2;
        ratio[r] = alone > 0 ? together / alone : 1.0;
    }
    const double f = s == GP_OK ? gp_median(ratio, ROUNDS) : 1.0;
    free(c);
    free(th);
    if (s != GP_OK) return gp_error_context(s, "timing layer %d on %d devices at once", li, n);
    *factor = f;
    return GP_OK;
}

gp_status gp_layer_times_contend(const gp_model *m, int64_t micro_batch, int devices, int groups,
                                 double *times, double *factor) {
    if (factor) *factor = 1.0;
    if (!m || !times || groups < 2)
        return gp_error(GP_INVALID_ARGUMENT,
                        "gp_layer_times_contend: a model and at least 2 groups of layer times "
                        "(forward, backward) expected");
    if (micro_batch < 1 || devices < 1)
        return gp_error(GP_INVALID_ARGUMENT,
                        "gp_layer_times_contend: micro-batch %lld and %d devices; expected >= 1",
                        (long long)micro_batch, devices);
    /* more devices than this process has cores: measured as every core at work (a mesh that
     * large spans machines, each of whose cores contends with its own neighbours) */
    cpu_set_t set;
    CPU_ZERO(&set);
    const int cores = sched_getaffinity(0, sizeof set, &set) == 0 ? CPU_COUNT(&set) : 1;
    if (devices > cores) devices = cores;
    if (devices > 256) devices = 256;
    if (devices <= 1) return GP_OK;
    const int L = gp_model_nlayers(m);
    int heaviest = 0;
    for (int li = 1; li < L; li++) /* (a merge cannot run alone: its source is not there) */
        if (!gp_layer_merges(m->layers[li]) &&
            times[li] + times[L + li] > times[heaviest] + times[L + heaviest])
            heaviest = li;
    /* As many copies of the layer as a stage holds of its like (its share of the model's), at
     * most 4 and 64 MiB of parameters: enough that they pass a core's own caches, as a stage's
     * do, at the cost of a few runs; and enough micro-batches in flight for 16 examples (at most
     * 8) over the copies, whose state leaves the caches too. */
    const int alike = gp_profile_alike(m, heaviest, micro_batch);
    gp_shape in;
    GP_TRY(gp_model_cut_shape(m, heaviest, micro_batch, &in));
    const uint64_t pbytes = m->layers[heaviest]->ops->cost(m->layers[heaviest], &in).param_bytes;
    int copies = alike / devices > 4 ? 4 : alike / devices;
    while (copies > 1 && (uint64_t)copies * pbytes > ((uint64_t)64 << 20)) copies--;
    if (copies < 1) copies = 1;
    int inflight = micro_batch >= 16 ? 1 : (int)(16 / micro_batch < 8 ? 16 / micro_batch : 8);
    inflight = inflight / copies > 1 ? inflight / copies : 1;
    double f = 1.0;
    gp_status s =
        gp_model_profile_contention(m, heaviest, micro_batch, devices, copies, inflight, &f);
    if (s != GP_OK) return gp_error_context(s, "layer times on %d devices at once", devices);
    for (int i = 0; i < groups * L; i++) times[i] *= f;
    if (factor) *factor = f;
    return GP_OK;
}
