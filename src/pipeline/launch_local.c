/* The launcher of a pipeline whose stages all run in this process. K = 1: the stage runs inline
 * on the caller's thread, with no stage thread and no transport (single-device training).
 * K > 1: one thread per stage per step over the threads transport, each pinned to a core of its
 * own when there are enough; each stage's kernels run on its device's threads. */
#define _GNU_SOURCE /* sched_getaffinity: the cores this process may use */
#include <pthread.h>
#include <sched.h>
#include <stdlib.h>
#include <string.h>

#include "core/clock.h"
#include "pipeline/pipeline_internal.h"

typedef struct local_launch {
    double timeout_s; /* the threads transport's longest wait */
} local_launch;

/* The norms of every stage meet in the transport's fixed-order all-reduce; with one stage there
 * is nothing to add. */
static gp_status reduce_norms(void *ctx, gp_stage *s, double *v, int L) {
    (void)ctx;
    gp_pipeline *p = s->p;
    return p->K == 1 ? GP_OK : gp_transport_allreduce_sum(p->tr, s->k, v, L + 1);
}

static void *stage_thread(void *arg) {
    gp_stage_run(arg);
    return NULL;
}

/* The first failure wins: the stage that aborted the transport, else the lowest one. */
static gp_status first_failure(gp_pipeline *p) {
    int culprit = -1;
    if (p->tr && gp_transport_aborted(p->tr, &culprit) && culprit >= 0 && culprit < p->K &&
        p->st[culprit].status != GP_OK)
        return gp_error(p->st[culprit].status, "%s", p->st[culprit].msg);
    for (int k = 0; k < p->K; k++)
        if (p->st[k].status != GP_OK) return gp_error(p->st[k].status, "%s", p->st[k].msg);
    return GP_OK;
}

/* K stage threads over a fresh transport (an aborted one stays aborted). */
static gp_status run_threads(gp_pipeline *p) {
    const local_launch *l = p->launch;
    gp_transport_opts to = {.nranks = p->K, .capacity = MAILBOX_CAPACITY, .timeout_s = l->timeout_s};
    GP_TRY(gp_transport_threads_new(&to, &p->tr));
    gp_status s = GP_OK;
    int started = 0;
    for (; started < p->K; started++) {
        if (pthread_create(&p->st[started].thread, NULL, stage_thread, &p->st[started]) != 0) {
            s = gp_error(GP_INTERNAL, "pipeline step: cannot start the thread of stage %d", started);
            gp_transport_abort(p->tr, started, s, "thread creation failed");
            break;
        }
    }
    for (int k = 0; k < started; k++) pthread_join(p->st[k].thread, NULL);
    if (s == GP_OK) s = first_failure(p);
    gp_transport_free(p->tr);
    p->tr = NULL;
    return s;
}

static gp_status local_step(gp_pipeline *p, const gp_tensor *x, const gp_tensor *y,
                            float *loss) {
    p->x = x;
    p->y = y;
    p->b = x->shape.dim[0] / p->M;
    p->mb0 = 0;
    for (int k = 0; k < p->K; k++) GP_TRY(gp_stage_begin_step(&p->st[k]));
    gp_trace_reset(&p->trace);
    const double t0 = gp_now();
    gp_status s = GP_OK;
    if (p->K == 1) {
        gp_stage_run(&p->st[0]);
        s = first_failure(p);
    } else {
        s = run_threads(p);
    }
    p->step_s = gp_now() - t0;
    GP_TRY(s);
    *loss = (float)p->st[p->K - 1].loss;
    s = gp_timeline_trace_comm(p);
    if (s == GP_OK) s = gp_timeline_simulate(p);
    if (s != GP_OK) return gp_error_context(s, "pipeline step %d: the timeline", p->step);
    p->have_trace = true;
    return GP_OK;
}

/* Every stage is here: the model's own eval forward runs stage after stage. */
static gp_status local_predict(gp_pipeline *p, const gp_tensor *x, gp_tensor *logits) {
    return gp_model_predict(p->m, x, logits);
}

static gp_status local_params_hash(gp_pipeline *p, uint64_t *h) {
    return gp_model_params_fnv1a64(p->m, h);
}

static gp_status local_allgather(gp_pipeline *p, const void *mine, size_t nbytes, void *all) {
    (void)p;
    memcpy(all, mine, nbytes);
    return GP_OK;
}

static gp_status local_gather(gp_pipeline *p) {
    (void)p; /* every track is recorded here already */
    return GP_OK;
}

static void local_free(gp_pipeline *p) {
    free(p->launch);
    p->launch = NULL;
}

static const gp_launcher_iface local_iface = {
    .name = "local",
    .step = local_step,
    .predict = local_predict,
    .params_hash = local_params_hash,
    .allgather = local_allgather,
    .gather = local_gather,
    .free = local_free,
};

/* Stage k's thread gets core k x T of those this process may run on (T: threads per stage
 * device), when there are at least K x T of them (with fewer, pinned stages would share cores
 * the scheduler could balance better); its device's other threads are left to the scheduler.
 * With K = 1 the stage runs on the caller's thread, which is never pinned. */
static void assign_cores(gp_pipeline *p, const gp_pipeline_opts *po) {
    cpu_set_t set;
    int cores[CPU_SETSIZE], n = 0;
    const int T = po->stage_threads > 0 ? po->stage_threads : 1;
    CPU_ZERO(&set);
    if (!po->no_pinning && p->K > 1 && sched_getaffinity(0, sizeof set, &set) == 0)
        for (int c = 0; c < CPU_SETSIZE; c++)
            if (CPU_ISSET(c, &set)) cores[n++] = c;
    for (int k = 0; k < p->K; k++) p->st[k].cpu = n >= p->K * T ? cores[k * T] : -1;
}

gp_status gp_launch_local_init(gp_pipeline *p, const gp_pipeline_opts *po) {
    local_launch *l = calloc(1, sizeof *l);
    if (!l) return gp_error(GP_OUT_OF_MEMORY, "pipeline: cannot allocate its launcher");
    l->timeout_s = po->comm_timeout_s > 0 ? po->comm_timeout_s : 60.0;
    p->launch = l;
    p->launcher = &local_iface;
    p->sync = (gp_stage_sync){.reduce_norms = reduce_norms};
    assign_cores(p, po);
    return GP_OK;
}
