/* The launcher of a pipeline whose stages all run in this process. One cell (K = 1, T = 1): it
 * runs inline on the caller's thread, with no stage thread and no transport (single-device
 * training). Otherwise one thread per stage shard per step (the workers: stages x T; a stage
 * with V cells runs them all on its thread), each pinned to a core of its own when there are
 * enough, over threads transports: one per shard index along the pipeline (its K cells), one
 * per cell across its T shards (the tensor axis), and one over all workers for the norms; each
 * shard's kernels run on its device's threads. */
#define _GNU_SOURCE /* CPU_SETSIZE: the most cores there can be */
#include <pthread.h>
#include <sched.h>
#include <stdlib.h>
#include <string.h>

#include "core/clock.h"
#include "core/hash.h"
#include "core/thread_name.h"
#include "plan/cores.h"
#include "pipeline/launch_local.h"
#include "pipeline/launcher.h"
#include "pipeline/mesh.h"
#include "pipeline/stage.h"
#include "pipeline/timeline.h"

typedef struct local_launch {
    double timeout_s;       /* the threads transports' longest wait */
    gp_transport **pipes;   /* (T) along the pipeline, shard t's K stages */
    gp_transport **tensors; /* (K) across stage k's T shards (T > 1) */
    gp_transport *all;      /* every worker, w = k T + t: the norms (T = V = 1: pipes[0]) */
    pthread_t *threads;     /* (workers) during a step */
} local_launch;

/* The norms of every stage shard meet in the transport's fixed-order all-reduce over the K x T
 * workers in mesh order; with one worker there is nothing to add. */
static gp_status reduce_norms(void *ctx, gp_stage *s, double *v, int L) {
    const local_launch *l = ctx;
    gp_pipeline *p = s->p;
    return gp_workers(p) == 1 ? GP_OK : gp_transport_allreduce_sum(l->all, s->w, v, L + 1);
}

/* One worker failed: every transport of the step stops, so no other waits for it. The one
 * spanning all workers first: it records who failed first, and a worker woken by the others
 * (which then fails too, waiting for a message) must not get there before the culprit. */
static void abort_all(void *ctx, gp_stage *s, gp_status st, const char *why) {
    const local_launch *l = ctx;
    const gp_pipeline *p = s->p;
    if (l->all) gp_transport_abort(l->all, s->w, st, why);
    for (int t = 0; l->pipes && t < p->T; t++)
        if (l->pipes[t]) gp_transport_abort(l->pipes[t], s->k, st, why);
    for (int k = 0; l->tensors && k < p->K; k++)
        if (l->tensors[k]) gp_transport_abort(l->tensors[k], s->t, st, why);
}

static void *stage_thread(void *arg) {
    const gp_stage *s = arg;
    if (s->p->T > 1) gp_thread_name("gp-stage-%d.%d", s->dk, s->t);
    else gp_thread_name("gp-stage-%d", s->dk);
    gp_stage_run(arg);
    return NULL;
}

/* The first failure wins: the worker that aborted a transport first, else the lowest one. */
static gp_status first_failure(gp_pipeline *p) {
    const local_launch *l = p->launch;
    int culprit = -1;
    if (l->all && gp_transport_aborted(l->all, &culprit) && culprit >= 0 &&
        culprit < gp_workers(p) && p->st[culprit].status != GP_OK)
        return gp_error(p->st[culprit].status, "%s", p->st[culprit].msg);
    for (int w = 0; w < p->K * p->T; w++)
        if (p->st[w].status != GP_OK) return gp_error(p->st[w].status, "%s", p->st[w].msg);
    return GP_OK;
}

static void free_transports(gp_pipeline *p) {
    local_launch *l = p->launch;
    if (l->all != (l->pipes ? l->pipes[0] : NULL)) gp_transport_free(l->all);
    for (int t = 0; l->pipes && t < p->T; t++) gp_transport_free(l->pipes[t]);
    for (int k = 0; l->tensors && k < p->K; k++) gp_transport_free(l->tensors[k]);
    free(l->pipes);
    free(l->tensors);
    l->pipes = l->tensors = NULL;
    l->all = NULL;
    gp_pipeline_bind_transport(p, NULL);
    for (int w = 0; w < p->K * p->T; w++) gp_stage_bind_transports(&p->st[w], NULL, NULL);
}

/* Fresh transports for one step or evaluation (an aborted one stays aborted); tensors only for
 * `tensor` (an evaluation needs no pipeline transport: it runs stage after stage). */
static gp_status make_transports(gp_pipeline *p, bool pipes) {
    local_launch *l = p->launch;
    const int K = p->K, T = p->T;
    gp_transport_opts to = {.capacity = MAILBOX_CAPACITY, .timeout_s = l->timeout_s};
    l->pipes = calloc((size_t)T, sizeof *l->pipes);
    l->tensors = calloc((size_t)K, sizeof *l->tensors);
    gp_status s = l->pipes && l->tensors
                      ? GP_OK
                      : gp_error(GP_OUT_OF_MEMORY, "pipeline: cannot allocate transports");
    to.nranks = K;
    for (int t = 0; pipes && t < T && s == GP_OK; t++)
        s = gp_transport_threads_new(&to, &l->pipes[t]);
    to.nranks = T;
    for (int k = 0; T > 1 && k < K && s == GP_OK; k++)
        s = gp_transport_threads_new(&to, &l->tensors[k]);
    to.nranks = gp_workers(p);
    if (s == GP_OK && pipes) {
        /* one stage per cell and one shard: the workers are the pipe's ranks (with V cells and
         * T shards, T = V gives as many workers as cells, but not the same ones) */
        if (T == 1 && p->V == 1)
            l->all = l->pipes[0];
        else
            s = gp_transport_threads_new(&to, &l->all);
    }
    if (s != GP_OK) {
        free_transports(p);
        return s;
    }
    gp_pipeline_bind_transport(p, pipes ? l->pipes[0] : NULL);
    for (int w = 0; w < K * T; w++)
        gp_stage_bind_transports(&p->st[w], pipes ? l->pipes[w % T] : NULL, l->tensors[w / T]);
    return GP_OK;
}

/* A thread per worker over fresh transports. */
static gp_status run_threads(gp_pipeline *p) {
    local_launch *l = p->launch;
    GP_TRY(make_transports(p, true));
    gp_status s = GP_OK;
    int started = 0;
    for (; started < gp_workers(p); started++) {
        if (pthread_create(&l->threads[started], NULL, stage_thread, &p->st[started]) != 0) {
            s = gp_error(GP_INTERNAL, "pipeline step: cannot start the thread of stage %d",
                         started / p->T);
            abort_all(p->launch, &p->st[started], s, "thread creation failed");
            break;
        }
    }
    for (int w = 0; w < started; w++) pthread_join(l->threads[w], NULL);
    if (s == GP_OK) s = first_failure(p);
    free_transports(p);
    return s;
}

static gp_status local_step(gp_pipeline *p, const gp_tensor *x, const gp_tensor *y,
                            float *loss) {
    GP_TRY(gp_pipeline_begin_step(p, x, y, 0));
    const double t0 = gp_now();
    gp_status s = GP_OK;
    if (p->K * p->T == 1) {
        gp_stage_run(&p->st[0]);
        s = first_failure(p);
    } else {
        s = run_threads(p);
    }
    gp_pipeline_end_step(p, gp_now() - t0);
    for (int w = 0; w < gp_workers(p); w++)
        gp_pipeline_set_bytes(p, w, 0, 0, gp_worker_tp_bytes(p, &p->st[w]));
    GP_TRY(s);
    *loss = (float)gp_worker(p, p->K - 1, 0)->loss;
    s = gp_timeline_trace_comm(p);
    if (s == GP_OK) s = gp_timeline_simulate(p);
    if (s != GP_OK) return gp_error_context(s, "pipeline step %d: the timeline", p->step);
    return GP_OK; /* the timeline is complete (gp_timeline_simulate) */
}

/* ------------------------------------------------------ evaluation with shards */

/* One shard's eval forward of its stage's layers, on its thread (the shard layers' collectives
 * need all T at once). */
typedef struct eval_job {
    gp_stage *s;
    const gp_tensor *x;
    gp_tensor y;
    gp_status st;
    char msg[512];
} eval_job;

static void *eval_thread(void *arg) {
    eval_job *j = arg;
    gp_stage *s = j->s;
    gp_thread_name("gp-eval-%d.%d", s->dk, s->t);
    const gp_run run = {.training = false, .seed = s->m->seed, .tp = &s->tp};
    gp_tensor in = {0};
    j->st = gp_stage_input_rows(s, j->x, 0, j->x->shape.dim[0], &in);
    if (j->st == GP_OK) j->st = gp_seq_forward_output(s->m, s->first, s->last, s->dev, &run, &in, &j->y);
    gp_tensor_release(&in);
    if (j->st != GP_OK) {
        snprintf(j->msg, sizeof j->msg, "%s", gp_last_error());
        gp_transport_abort(s->tensor, s->t, j->st, j->msg);
    }
    return NULL;
}

/* The logits from the shards' outputs: their columns side by side when the head is split,
 * else shard 0's (every shard's are the same bits). */
static gp_status put_logits(gp_pipeline *p, const eval_job *jobs, gp_tensor *logits) {
    if (!p->vocab_split) return gp_tensor_copy(logits, &jobs[0].y);
    const int64_t lc = jobs[0].y.shape.dim[jobs[0].y.shape.ndim - 1], V = lc * p->T;
    const int64_t rows = gp_tensor_nelem(&jobs[0].y) / lc;
    float *all = malloc((size_t)(rows * V) * sizeof *all), *part = malloc((size_t)(rows * lc) * sizeof *part);
    gp_status s = all && part ? GP_OK : gp_error(GP_OUT_OF_MEMORY, "logits: %lld rows", (long long)rows);
    for (int t = 0; t < p->T && s == GP_OK; t++) {
        s = gp_tensor_to_host(&jobs[t].y, part, (size_t)(rows * lc) * sizeof *part);
        for (int64_t r = 0; r < rows && s == GP_OK; r++)
            memcpy(all + r * V + t * lc, part + r * lc, (size_t)lc * sizeof *part);
    }
    if (s == GP_OK) s = gp_tensor_from_host(logits, all, (size_t)(rows * V) * sizeof *all);
    free(all);
    free(part);
    return s;
}

/* Stage after stage, the stage's T shards on T threads; shard 0's output (every shard has the
 * same bits) goes on to the next stage. */
static gp_status shard_predict(gp_pipeline *p, const gp_tensor *x, gp_tensor *logits) {
    const int T = p->T;
    eval_job *jobs = calloc((size_t)T, sizeof *jobs);
    pthread_t *th = calloc((size_t)T, sizeof *th);
    gp_status s = jobs && th ? make_transports(p, false)
                             : gp_error(GP_OUT_OF_MEMORY, "evaluation: %d shards", T);
    gp_tensor cur = *x;
    cur.owned = false;
    for (int k = 0; k < p->K && s == GP_OK; k++) {
        int started = 0;
        for (int t = 0; t < T; t++) {
            jobs[t] = (eval_job){.s = gp_worker(p, k, t), .x = &cur};
            if (pthread_create(&th[t], NULL, eval_thread, &jobs[t]) != 0) {
                s = gp_error(GP_INTERNAL, "evaluation: cannot start shard %d's thread", t);
                gp_transport_abort(gp_worker(p, k, 0)->tensor, t, s, "thread creation failed");
                break;
            }
            started++;
        }
        for (int t = 0; t < started; t++) pthread_join(th[t], NULL);
        for (int t = 0; t < started && s == GP_OK; t++)
            if (jobs[t].st != GP_OK) s = gp_error(jobs[t].st, "%s", jobs[t].msg);
        gp_tensor_release(&cur);
        if (s == GP_OK && k == p->K - 1) s = put_logits(p, jobs, logits);
        cur = jobs[0].y;
        for (int t = 1; t < started; t++) gp_tensor_release(&jobs[t].y);
    }
    gp_tensor_release(&cur);
    if (jobs && th) free_transports(p);
    free(jobs);
    free(th);
    return s == GP_OK ? GP_OK : gp_error_context(s, "gp_pipeline_predict (T = %d)", T);
}

/* Every stage is here: the model's own eval forward runs stage after stage; with shards, each
 * stage's shards together. */
static gp_status local_predict(gp_pipeline *p, const gp_tensor *x, gp_tensor *logits) {
    if (p->T == 1) return gp_model_predict(p->m, x, logits);
    return shard_predict(p, x, logits);
}

/* With shards the hash is the whole model's: its layers put together, stage by stage. */
static gp_status local_params_hash(gp_pipeline *p, uint64_t *h) {
    if (p->T == 1) return gp_model_params_fnv1a64(p->m, h);
    uint64_t state = GP_FNV1A64_INIT;
    for (int k = 0; k < p->K; k++) {
        const gp_stage *s = gp_worker(p, k, 0);
        GP_TRY(gp_mesh_whole_begin(p, s->first, s->last, false, true));
        gp_status st = gp_model_params_fnv1a64_range(p->m, s->first, s->last, &state);
        gp_mesh_whole_end(p, s->first, s->last);
        GP_TRY(st);
    }
    *h = state;
    return GP_OK;
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
    local_launch *l = p->launch;
    if (!l) return;
    free_transports(p);
    free(l->threads);
    free(l);
    const gp_stage_sync none = {0};
    gp_pipeline_bind_launcher(p, p->launcher, NULL, &none);
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

/* Worker w (stage shard w of the workers) gets the w-th of the cores this process may run on, in
 * cores.h's order (one hardware thread of every physical core first, so the workers' threads
 * have a physical core each while there are enough), when there are at least workers x S of them
 * (S: threads per stage device; with fewer, pinned workers would share cores the scheduler could
 * balance better); its device's other threads are left to the scheduler, on the cores no worker
 * holds. With one cell the stage runs on the caller's thread, never pinned. */
static void assign_cores(gp_pipeline *p, const gp_pipeline_opts *po) {
    int cores[CPU_SETSIZE], n = 0;
    const int S = po->stage_threads > 0 ? po->stage_threads : 1, W = gp_workers(p);
    if (!po->no_pinning && W > 1) n = gp_pinning_cores(cores, CPU_SETSIZE);
    for (int w = 0; w < W; w++) gp_stage_set_cpu(&p->st[w], n >= W * S ? cores[w] : -1);
    for (int w = W; w < p->K * p->T; w++) gp_stage_set_cpu(&p->st[w], -1); /* led by another */
}

gp_status gp_launch_local_init(gp_pipeline *p, const gp_pipeline_opts *po) {
    local_launch *l = calloc(1, sizeof *l);
    if (!l) return gp_error(GP_OUT_OF_MEMORY, "pipeline: cannot allocate its launcher");
    l->timeout_s = po->comm_timeout_s > 0 ? po->comm_timeout_s : 60.0;
    const gp_stage_sync sync = {.reduce_norms = reduce_norms, .abort = abort_all, .ctx = l};
    gp_pipeline_bind_launcher(p, &local_iface, l, &sync); /* from here its free releases l */
    if (!(l->threads = calloc((size_t)gp_workers(p), sizeof *l->threads)))
        return gp_error(GP_OUT_OF_MEMORY, "pipeline: %d stage threads", gp_workers(p));
    assign_cores(p, po);
    return GP_OK;
}
