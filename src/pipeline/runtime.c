/* The pipeline runtime on threads: K cells on K stage devices, one thread per stage per step,
 * each interpreting its validated action list over the in-process transport. Every step matches
 * the single-device trainer bit for bit (same per-micro-batch forward/backward, loss normalizer,
 * gradient-norm order, clipping and update), whatever K, schedule or re-materialization. Each
 * step's actions are recorded into a timeline (gp_trace) for its stats, trace and picture
 * (runtime_timeline.c); under MPI each process runs its own stage instead (runtime_mpi.c). */
#define _GNU_SOURCE /* sched_getaffinity, pthread_setaffinity_np: pinning stages to cores */
#include <math.h>
#include <pthread.h>
#include <sched.h>
#include <stdlib.h>
#include <string.h>

#include "../comm/mpi_grid.h"
#include "../comm/transport.h"
#include "../trace/trace.h"
#include "../model/sequence.h"
#include "../optim/optim.h"
#include "../model/model_internal.h"
#include "partition.h"
#include "runtime_internal.h"
#include "schedule.h"

/* Brackets call in a trace event on stage s's own buffer (one clock read at each end). The
 * event is closed whatever call returns, so a failed action leaves no open event behind. */
#define TRACED(s, kind, mb, label, call)                                                        \
    do {                                                                                       \
        GP_TRY(gp_trace_begin(&(s)->p->trace, (s)->k, (kind), (mb), (label)));                  \
        gp_status st_ = (call);                                                                 \
        gp_status se_ = gp_trace_end(&(s)->p->trace, (s)->k);                                    \
        if (st_ != GP_OK) return st_;                                                           \
        if (se_ != GP_OK) return se_;                                                           \
    } while (0)

static void release_mb_state(stage *s, int M) {
    for (int mb = 0; mb < M; mb++) {
        gp_seq_release(&s->pass[mb]);
        gp_tensor_release(&s->in[mb]);
        gp_tensor_release(&s->out[mb]);
        gp_tensor_release(&s->dy[mb]);
        gp_tensor_release(&s->dx[mb]);
    }
    /* Views (stage 0's inputs) are not zeroed by a release: nothing stale into the next step. */
    memset(s->in, 0, (size_t)M * sizeof *s->in);
}

/* Rows [first, first + n) of a batch-first tensor, as a view. */
gp_tensor gp_rt_batch_slice(const gp_tensor *t, int64_t first, int64_t n) {
    int64_t row = gp_tensor_nelem(t) / t->shape.dim[0];
    gp_shape s = t->shape;
    s.dim[0] = n;
    return gp_tensor_view((char *)t->data + (size_t)(first * row) * gp_dtype_nbytes(t->dtype), s,
                          t->dtype);
}

static gp_run run_for(const gp_pipeline *p, int mb, bool recompute) {
    gp_run r = {.training = true, .recompute = recompute, .seed = p->seed,
                .step = (uint32_t)p->step, .micro_batch = (uint32_t)(p->mb0 + mb)};
    return r;
}

static bool is_last(const stage *s) { return s->k == s->p->K - 1; }

static gp_status do_forward(stage *s, int mb) {
    gp_pipeline *p = s->p;
    if (s->k == 0) s->in[mb] = gp_rt_batch_slice(p->x, mb * p->b, p->b);
    if (!s->in[mb].data)
        return gp_error(GP_INTERNAL, "FORWARD(%d) before its input arrived", mb);
    gp_run run = run_for(p, mb, false);
    if (p->remat == GP_REMAT_NONE) {
        GP_TRY(gp_seq_forward(p->m, s->first, s->last, s->dev, &run, &s->in[mb], &s->pass[mb]));
        if (is_last(s)) return GP_OK;
        /* The pass keeps its output for backward: what is sent is a copy. */
        const gp_tensor *y = gp_seq_output(&s->pass[mb]);
        GP_TRY(gp_tensor_alloc(s->dev, GP_MEM_ACTIVATIONS, y->shape, GP_F32, &s->out[mb]));
        memcpy(s->out[mb].data, y->data, gp_tensor_nbytes(y));
        return GP_OK;
    }
    /* CELL: a training-mode run (batch-norm statistics update here, once) that keeps nothing
     * but the input; backward recomputes from it. */
    gp_tensor y;
    GP_TRY(gp_seq_infer(p->m, s->first, s->last, s->dev, &run, &s->in[mb], &y));
    if (is_last(s))
        gp_tensor_release(&y);
    else
        s->out[mb] = y;
    return GP_OK;
}

static gp_status last_stage_loss(stage *s, int mb, const gp_tensor *logits, gp_tensor *dlogits) {
    gp_pipeline *p = s->p;
    gp_tensor yv = gp_rt_batch_slice(p->y, mb * p->b, p->b);
    double l = 0;
    GP_TRY(gp_tensor_alloc(s->dev, GP_MEM_ACTIVATIONS, logits->shape, GP_F32, dlogits));
    gp_status st = gp_softmax_xent(logits, &yv, p->normalizer, &l, dlogits);
    if (st != GP_OK) return gp_error_context(st, "micro-batch %d loss", mb);
    s->loss += l;
    return GP_OK;
}

static gp_status backward_proper(stage *s, int mb);

/* The rebuild of a remat cell is its own RECOMPUTE event, apart from the BACKWARD proper. */
static gp_status do_backward(stage *s, int mb) {
    gp_pipeline *p = s->p;
    if (p->remat == GP_REMAT_CELL) {
        gp_run run = run_for(p, mb, true);
        TRACED(s, GP_TRACE_RECOMPUTE, mb, NULL,
               gp_seq_forward(p->m, s->first, s->last, s->dev, &run, &s->in[mb], &s->pass[mb]));
    }
    TRACED(s, GP_TRACE_BACKWARD, mb, NULL, backward_proper(s, mb));
    return GP_OK;
}

static gp_status backward_proper(stage *s, int mb) {
    if (!s->pass[mb].acts) return gp_error(GP_INTERNAL, "BACKWARD(%d) without its forward", mb);
    gp_tensor dlogits = {0};
    const gp_tensor *dy = &s->dy[mb];
    if (is_last(s)) {
        GP_TRY(last_stage_loss(s, mb, gp_seq_output(&s->pass[mb]), &dlogits));
        dy = &dlogits;
    } else if (!dy->data) {
        return gp_error(GP_INTERNAL, "BACKWARD(%d) before its output gradient arrived", mb);
    }
    gp_tensor *dx = NULL;
    gp_status st = GP_OK;
    if (s->k > 0) {
        st = gp_tensor_alloc(s->dev, GP_MEM_ACTIVATIONS, s->in_shape, GP_F32, &s->dx[mb]);
        dx = &s->dx[mb];
    }
    if (st == GP_OK) st = gp_rt_backward_cell(s, mb, dy, dx);
    gp_tensor_release(&dlogits);
    gp_tensor_release(&s->dy[mb]);
    gp_tensor_release(&s->in[mb]); /* the stash is done with */
    return st;
}


void gp_rt_zero_grads(stage *s) {
    gp_param *q;
    FOR_EACH_OWN_TRAINABLE(s, li, q) {
        (void)li;
        memset(q->grad.data, 0, gp_tensor_nbytes(&q->grad));
    }
}

/* One all-reduce of L + 1 doubles: each layer's squared gradient norm (filled by the stage that
 * owns it, zero elsewhere, so the sum has exactly the owner's bits) and the loss (last stage).
 * The norm is then combined in layer order, as the single-device trainer does. */
static gp_status do_optimizer_step(stage *s) {
    gp_pipeline *p = s->p;
    gp_model *m = p->m;
    int L = m->nlayers;
    gp_trace *t = &p->trace;
    /* Three events: the partials (OPTIMIZER), the all-reduce, which is mostly waiting for the
     * slowest stage (WAIT), then the clip and update (OPTIMIZER). */
    if (p->grid) GP_TRY(gp_rt_finish_grad_reduce(s));
    GP_TRY(gp_trace_begin(t, s->k, GP_TRACE_OPTIMIZER, -1, "NORMS"));
    double *v = calloc((size_t)L + 1, sizeof *v);
    if (!v) {
        gp_trace_end(t, s->k);
        return gp_error(GP_OUT_OF_MEMORY, "cannot allocate %d norm partials", L + 1);
    }
    for (int li = s->first; li < s->last; li++) v[li] = gp_layer_grad_sumsq(m->layers[li]);
    if (is_last(s)) v[L] = s->loss;
    gp_trace_end(t, s->k);
    gp_status st = gp_trace_begin(t, s->k, GP_TRACE_WAIT, -1, "ALLREDUCE");
    if (st == GP_OK) {
        st = p->grid ? gp_rt_reduce_over_ranks(s, v, L) : gp_transport_allreduce_sum(p->tr, s->k, v, L + 1);
        gp_trace_end(t, s->k);
    }
    double total = 0, loss = v[L];
    for (int li = 0; li < L; li++) total += v[li];
    free(v);
    if (st != GP_OK) return st;
    s->loss = loss;
    if (!isfinite(loss))
        return gp_error(GP_NUMERIC, "step %d: the loss is not finite (%g)", p->step, loss);
    double norm = sqrt(total);
    if (!isfinite(norm))
        return gp_error(GP_NUMERIC, "step %d: the gradient norm is not finite; no update made",
                        p->step);
    GP_TRY(gp_trace_begin(t, s->k, GP_TRACE_OPTIMIZER, -1, "UPDATE"));
    gp_optim_apply_layers(&p->o, m->layers, s->first, s->last, norm, p->step);
    gp_rt_zero_grads(s);
    return gp_trace_end(t, s->k);
}

/* Transport calls are timed here and turned into WAIT + SEND/RECV events after the step. */
static gp_status timed_send(stage *s, int peer, gp_msg_kind kind, int mb, gp_tensor *t) {
    comm_times *c = &s->ct[mb];
    c->send_seq[kind] = s->nsent[kind];
    s->sent_mb[kind][s->nsent[kind]++] = mb;
    c->send_b[kind] = gp_trace_time(&s->p->trace);
    gp_status st = gp_transport_send(s->p->tr, s->k, peer, (gp_msg_tag){kind, mb}, t);
    c->send_e[kind] = gp_trace_time(&s->p->trace);
    return st;
}

static gp_status timed_recv(stage *s, int peer, gp_msg_kind kind, int mb, gp_tensor *out) {
    comm_times *c = &s->ct[mb];
    c->recv_b[kind] = gp_trace_time(&s->p->trace);
    gp_status st = gp_transport_recv(s->p->tr, s->k, peer, (gp_msg_tag){kind, mb}, out);
    c->recv_e[kind] = gp_trace_time(&s->p->trace);
    return st;
}

static gp_status do_action(stage *s, gp_action a) {
    int k = s->k, mb = a.mb;
    switch (a.kind) {
    case GP_ACT_FORWARD: TRACED(s, GP_TRACE_FORWARD, mb, NULL, do_forward(s, mb)); return GP_OK;
    case GP_ACT_BACKWARD: return do_backward(s, mb);
    case GP_ACT_SEND_ACT: return timed_send(s, k + 1, GP_MSG_ACT, mb, &s->out[mb]);
    case GP_ACT_SEND_GRAD: return timed_send(s, k - 1, GP_MSG_GRAD, mb, &s->dx[mb]);
    case GP_ACT_RECV_ACT:
        GP_TRY(gp_tensor_alloc(s->dev, GP_MEM_ACTIVATIONS, s->in_shape, GP_F32, &s->in[mb]));
        return timed_recv(s, k - 1, GP_MSG_ACT, mb, &s->in[mb]);
    case GP_ACT_RECV_GRAD:
        GP_TRY(gp_tensor_alloc(s->dev, GP_MEM_ACTIVATIONS, s->out_shape, GP_F32, &s->dy[mb]));
        return timed_recv(s, k + 1, GP_MSG_GRAD, mb, &s->dy[mb]);
    case GP_ACT_OPTIMIZER_STEP: return do_optimizer_step(s);
    default: return gp_error(GP_INTERNAL, "unknown action kind %d", (int)a.kind);
    }
}

/* A stage that cannot have its core still runs, unpinned (the stats say so). */
static void pin_to_core(stage *s) {
    s->pinned = false;
    if (s->cpu < 0) return;
    cpu_set_t set;
    CPU_ZERO(&set);
    CPU_SET(s->cpu, &set);
    s->pinned = pthread_setaffinity_np(pthread_self(), sizeof set, &set) == 0;
}

void *gp_rt_stage_main(void *arg) {
    stage *s = arg;
    gp_pipeline *p = s->p;
    const gp_stage_actions *list = &p->sched.stage[s->k];
    gp_status st = GP_OK;
    pin_to_core(s);
    s->loss = 0;
    memset(s->nsent, 0, sizeof s->nsent);
    for (int i = 0; i < list->n && st == GP_OK; i++) {
        st = do_action(s, list->a[i]);
        if (st != GP_OK) {
            char what[48];
            gp_error_context(st, "stage %d (layers %d..%d), action %d %s", s->k, s->first,
                             s->last - 1, i, gp_action_str(list->a[i], what, sizeof what));
        }
    }
    if (st == GP_OK) st = gp_trace_begin(&p->trace, s->k, GP_TRACE_WAIT, -1, "FLUSH");
    if (st == GP_OK) {
        st = gp_transport_flush(p->tr, s->k);
        gp_trace_end(&p->trace, s->k);
    }
    if (st != GP_OK) {
        snprintf(s->msg, sizeof s->msg, "%s", gp_last_error());
        gp_transport_abort(p->tr, s->k, st, s->msg);
    }
    release_mb_state(s, p->M); /* on this stage's own thread: its device is touched by it alone */
    s->status = st;
    return NULL;
}

/* ------------------------------------------------------------------ set-up */

static void free_stage_state(gp_pipeline *p) {
    for (int k = 0; k < p->K; k++)
        if (p->st[k].dev) gp_model_release_range(p->m, p->st[k].first, p->st[k].last);
}

void gp_pipeline_free(gp_pipeline *p) {
    if (!p) return;
    gp_rt_free_processes(p);
    if (p->st) {
        free_stage_state(p);
        for (int k = 0; k < p->K; k++) {
            stage *s = &p->st[k];
            if (s->dev) {
                gp_mem_stats ms;
                gp_device_mem_stats(s->dev, &ms);
                GP_ASSERT(ms.live_total == 0); /* every byte a stage held was released */
                gp_device_free(s->dev);
            }
            free(s->in);
            free(s->pass);
            free(s->out);
            free(s->dy);
            free(s->dx);
            free(s->ct);
            for (int j = 0; j < GP_MSG_NKINDS; j++) free(s->sent_mb[j]);
        }
        free(p->st);
    }
    gp_trace_free(&p->trace);
    free(p->first);
    gp_schedule_free(&p->sched);
    free(p);
}

/* The first layer of each cell, as gp_plan_make would choose them for the same options: the
 * given partition (checked) or the exact balance of the layers' cost estimates or measured
 * times, at the micro-batch size of po->batch (one example when it is not given: every layer's
 * cost grows with the batch alike) and within the per-device memory limit. */
static gp_status choose_partition(gp_pipeline *p, const gp_pipeline_opts *po, int *first) {
    const int L = p->m->nlayers;
    /* po->batch is the global mini-batch: each of the D replicas takes 1/D of it. */
    const int64_t b = po->batch > 0 ? po->batch / ((int64_t)p->D * p->M) : 1;
    gp_layer_est *est = calloc((size_t)L, sizeof *est);
    double *times = NULL;
    gp_pipeline_opts o = *po;
    gp_status s = GP_OK;
    if (!est) s = gp_error(GP_OUT_OF_MEMORY, "cannot allocate %d layer estimates", L);
    if (s == GP_OK && o.balance == GP_BALANCE_TIME && !o.layer_times) {
        times = calloc(2 * (size_t)L, sizeof *times);
        s = times ? gp_model_profile_layers(p->m, b, 0, times)
                  : gp_error(GP_OUT_OF_MEMORY, "cannot allocate %d layer times", 2 * L);
        o.layer_times = times;
    }
    if (s == GP_OK) s = gp_cells_choose(p->m, b, gp_optim_state_count(&p->o), &o, p->K, p->M, est, first);
    free(times);
    free(est);
    return s;
}

static gp_status check_opts(const gp_model *m, const gp_pipeline_opts *po, int *K, int *M) {
    *K = po->stages ? po->stages : 1;
    *M = po->micro_batches ? po->micro_batches : 1;
    if (*K < 1) return gp_error(GP_INVALID_ARGUMENT, "pipeline: stages %d must be >= 1", *K);
    if (*M < 1) return gp_error(GP_INVALID_ARGUMENT, "pipeline: micro-batches %d must be >= 1", *M);
    if (*K > m->nlayers)
        return gp_error(GP_INVALID_ARGUMENT,
                        "pipeline: stages %d > %d layers (each stage needs at least one layer)", *K,
                        m->nlayers);
    if (po->schedule != GP_SCHEDULE_GPIPE && po->schedule != GP_SCHEDULE_1F1B)
        return gp_error(GP_INVALID_ARGUMENT, "pipeline: schedule %d is neither gpipe (%d) nor 1f1b (%d)",
                        (int)po->schedule, GP_SCHEDULE_GPIPE, GP_SCHEDULE_1F1B);
    if (po->remat != GP_REMAT_CELL && po->remat != GP_REMAT_NONE)
        return gp_error(GP_INVALID_ARGUMENT, "pipeline: remat %d is neither cell (%d) nor none (%d)",
                        (int)po->remat, GP_REMAT_CELL, GP_REMAT_NONE);
    if (po->balance != GP_BALANCE_COST && po->balance != GP_BALANCE_TIME)
        return gp_error(GP_INVALID_ARGUMENT, "pipeline: balance %d is neither cost (%d) nor time (%d)",
                        (int)po->balance, GP_BALANCE_COST, GP_BALANCE_TIME);
    if (po->batch < 0 || po->batch % *M)
        return gp_error(GP_INVALID_ARGUMENT,
                        "pipeline: batch %lld is not a multiple of %d micro-batches",
                        (long long)po->batch, *M);
    return GP_OK;
}

static gp_status init_stages(gp_pipeline *p, const int *first, uint64_t memory_limit) {
    gp_model *m = p->m;
    for (int k = 0; k < p->K; k++) {
        stage *s = &p->st[k];
        s->p = p;
        s->k = k;
        s->first = first[k];
        s->last = k + 1 < p->K ? first[k + 1] : m->nlayers;
        if (!gp_rt_owns(p, k)) { /* another process runs it: a copy for evaluation only */
            GP_TRY(gp_model_init_range(m, s->first, s->last, p->mirror, p->seed));
            continue;
        }
        size_t M = (size_t)p->M;
        s->in = calloc(M, sizeof *s->in);
        s->pass = calloc(M, sizeof *s->pass);
        s->out = calloc(M, sizeof *s->out);
        s->dy = calloc(M, sizeof *s->dy);
        s->dx = calloc(M, sizeof *s->dx);
        s->ct = calloc(M, sizeof *s->ct);
        for (int j = 0; j < GP_MSG_NKINDS; j++) s->sent_mb[j] = calloc(M, sizeof *s->sent_mb[j]);
        if (!s->in || !s->pass || !s->out || !s->dy || !s->dx || !s->ct || !s->sent_mb[GP_MSG_ACT] ||
            !s->sent_mb[GP_MSG_GRAD])
            return gp_error(GP_OUT_OF_MEMORY, "pipeline: cannot allocate stage %d's state", k);
        char name[32];
        snprintf(name, sizeof name, "stage%d", k);
        GP_TRY(gp_device_cpu_new(name, &s->dev));
        if (memory_limit) GP_TRY(gp_device_set_limit(s->dev, memory_limit));
        GP_TRY(gp_model_init_range(m, s->first, s->last, s->dev, p->seed));
        gp_param *q;
        FOR_EACH_OWN_TRAINABLE(s, li, q) {
            gp_status st = gp_tensor_zeros(s->dev, GP_MEM_GRADS, q->shape, GP_F32, &q->grad);
            if (st == GP_OK) st = gp_optim_state_init(&p->o, q, s->dev);
            if (st != GP_OK)
                return gp_error_context(st, "pipeline stage %d: layer %d parameter %s", k, li,
                                        q->name);
        }
    }
    return GP_OK;
}

/* Stage k gets the k-th core this process may run on, when there are at least K of them (with
 * fewer, pinned stages would share cores the scheduler could balance better). */
static void assign_cores(gp_pipeline *p, bool no_pinning) {
    cpu_set_t set;
    int cores[CPU_SETSIZE], n = 0;
    CPU_ZERO(&set);
    if (!no_pinning && sched_getaffinity(0, sizeof set, &set) == 0)
        for (int c = 0; c < CPU_SETSIZE; c++)
            if (CPU_ISSET(c, &set)) cores[n++] = c;
    for (int k = 0; k < p->K; k++) p->st[k].cpu = n >= p->K ? cores[k] : -1;
}

gp_status gp_pipeline_new(gp_model *m, const gp_optim_opts *o, const gp_pipeline_opts *po,
                          uint64_t seed, gp_pipeline **out) {
    if (!m || !o || !out) return gp_error(GP_INVALID_ARGUMENT, "gp_pipeline_new: NULL argument");
    *out = NULL;
    GP_TRY(gp_optim_check(o));
    gp_pipeline_opts dflt = {0};
    if (!po) po = &dflt;
    int K, M;
    GP_TRY(check_opts(m, po, &K, &M));
    for (int li = 0; li < m->nlayers; li++)
        for (int j = 0; j < m->layers[li]->nparams; j++)
            if (m->layers[li]->params[j].grad.data)
                return gp_error(GP_INVALID_ARGUMENT,
                                "gp_pipeline_new: the model already has a trainer or pipeline (layer "
                                "%d parameter %s has gradients); free it first",
                                li, m->layers[li]->params[j].name);
    /* Stages run single-threaded BLAS (a single-device reference must too, for equal bits). */
    gp_blas_set_threads(1);
    gp_pipeline *p = calloc(1, sizeof *p);
    int *first = calloc((size_t)K, sizeof *first);
    if (!p || !first) {
        free(p);
        free(first);
        return gp_error(GP_OUT_OF_MEMORY, "gp_pipeline_new: cannot allocate the pipeline");
    }
    p->m = m;
    p->first = first; /* freed with the pipeline */
    p->o = *o;
    p->K = K;
    p->M = M;
    p->remat = po->remat;
    p->seed = seed;
    p->D = 1;
    gp_status s = gp_rt_init_processes(p, po); /* first: a mismatched launch fails before any work */
    if (s == GP_OK) s = choose_partition(p, po, first);
    if (s == GP_OK && p->grid) s = gp_rt_agree_partition(p, first);
    if (s == GP_OK) s = gp_schedule_generate(gp_schedule_kind_name(po->schedule), K, M, &p->sched);
    if (s == GP_OK) s = gp_schedule_validate(&p->sched, MAILBOX_CAPACITY, NULL);
    if (s == GP_OK) {
        p->st = calloc((size_t)K, sizeof *p->st);
        if (!p->st) s = gp_error(GP_OUT_OF_MEMORY, "gp_pipeline_new: cannot allocate %d stages", K);
    }
    if (s == GP_OK) s = init_stages(p, first, po->memory_limit);
    /* Processes are bound by their launcher (mpirun --bind-to), not by the stage they run. */
    if (s == GP_OK) assign_cores(p, po->no_pinning || p->grid);
    /* With processes, one track per rank once gathered (gp_pipeline_gather). */
    if (s == GP_OK) s = gp_trace_init(&p->trace, p->grid ? gp_grid_world_size(p->grid) : K, M);
    if (s == GP_OK) gp_trace_set_info(&p->trace, p->sched.name, gp_remat_name(p->remat));
    p->trace.stages_per_replica = K;
    if (s != GP_OK) {
        gp_error_context(s, "gp_pipeline_new (K = %d, M = %d)", K, M);
        gp_pipeline_free(p);
        return s;
    }
    *out = p;
    return GP_OK;
}

int gp_pipeline_stages(const gp_pipeline *p) { return p ? p->K : 0; }

int gp_pipeline_cell_first(const gp_pipeline *p, int k) {
    return p && k >= 0 && k < p->K ? p->first[k] : -1;
}

gp_status gp_pipeline_mem_stats(const gp_pipeline *p, int stage, gp_mem_stats *out) {
    if (!p || !out) return gp_error(GP_INVALID_ARGUMENT, "gp_pipeline_mem_stats: NULL argument");
    if (stage < 0 || stage >= p->K)
        return gp_error(GP_INVALID_ARGUMENT, "gp_pipeline_mem_stats: stage %d outside 0..%d", stage,
                        p->K - 1);
    if (!gp_rt_owns(p, stage) && p->rank_mem) { /* replica 0's stage `stage` is world rank `stage` */
        *out = p->rank_mem[stage];
        return GP_OK;
    }
    if (!gp_rt_owns(p, stage))
        return gp_error(GP_INVALID_ARGUMENT,
                        "gp_pipeline_mem_stats: stage %d runs in another process (this is rank %d, "
                        "stage %d)",
                        stage, gp_grid_world_rank(p->grid), gp_grid_stage(p->grid));
    gp_device_mem_stats(p->st[stage].dev, out);
    return GP_OK;
}

/* ------------------------------------------------------------------- step */

static gp_status check_batch(const gp_pipeline *p, const gp_tensor *x, const gp_tensor *y) {
    char got[96], want[96];
    if (!x || !y || !x->data || !y->data)
        return gp_error(GP_INVALID_ARGUMENT, "pipeline step: x and y must be allocated tensors");
    int64_t b = x->shape.ndim ? x->shape.dim[0] : 0;
    if (b < 1) return gp_error(GP_SHAPE, "pipeline step: empty batch");
    gp_shape ws;
    GP_TRY(gp_model_shape(p->m, -1, b, &ws));
    if (!gp_shape_equal(&ws, &x->shape) || x->dtype != p->m->input_dtype)
        return gp_error(GP_SHAPE, "pipeline step: input %s %s, expected %s %s",
                        gp_shape_str(&x->shape, got, sizeof got), gp_dtype_name(x->dtype),
                        gp_shape_str(&ws, want, sizeof want), gp_dtype_name(p->m->input_dtype));
    if (y->dtype != GP_I32 || y->shape.ndim < 1 || y->shape.dim[0] != b)
        return gp_error(GP_SHAPE, "pipeline step: labels %s %s, expected int32 with batch %lld first",
                        gp_shape_str(&y->shape, got, sizeof got), gp_dtype_name(y->dtype),
                        (long long)b);
    if (b % p->M)
        return gp_error(GP_INVALID_ARGUMENT,
                        "pipeline step: batch %lld is not divisible by %d micro-batches",
                        (long long)b, p->M);
    return GP_OK;
}

gp_status gp_pipeline_step(gp_pipeline *p, const gp_tensor *x, const gp_tensor *y, float *loss) {
    if (!p) return gp_error(GP_INVALID_ARGUMENT, "pipeline step: pipeline is NULL");
    GP_TRY(check_batch(p, x, y));
    if (p->grid) return gp_rt_step_processes(p, x, y, loss);
    p->x = x;
    p->y = y;
    p->b = x->shape.dim[0] / p->M;
    double n = (double)gp_count_labels(y);
    p->normalizer = n > 0 ? n : 1;
    for (int k = 0; k < p->K; k++) {
        stage *s = &p->st[k];
        GP_TRY(gp_model_shape(p->m, s->first - 1, p->b, &s->in_shape));
        GP_TRY(gp_model_shape(p->m, s->last - 1, p->b, &s->out_shape));
        s->status = GP_OK;
        s->msg[0] = '\0';
    }
    /* A fresh transport per step: an aborted one stays aborted. */
    gp_transport_opts to = {.nranks = p->K, .capacity = MAILBOX_CAPACITY, .timeout_s = 300};
    p->have_trace = false;
    GP_TRY(gp_transport_threads_new(&to, &p->tr));
    gp_trace_reset(&p->trace);
    double t_start = gp_now();
    int started = 0;
    gp_status s = GP_OK;
    for (; started < p->K; started++) {
        if (pthread_create(&p->st[started].thread, NULL, gp_rt_stage_main, &p->st[started]) != 0) {
            s = gp_error(GP_INTERNAL, "pipeline step: cannot start the thread of stage %d", started);
            gp_transport_abort(p->tr, started, s, "thread creation failed");
            break;
        }
    }
    for (int k = 0; k < started; k++) pthread_join(p->st[k].thread, NULL);
    p->step_s = gp_now() - t_start;
    if (s == GP_OK) {
        /* The first failure wins: the stage that aborted the transport, else the lowest rank. */
        int culprit = -1;
        if (gp_transport_aborted(p->tr, &culprit) && culprit >= 0 && culprit < p->K &&
            p->st[culprit].status != GP_OK) {
            s = gp_error(p->st[culprit].status, "%s", p->st[culprit].msg);
        } else {
            for (int k = 0; k < p->K && s == GP_OK; k++)
                if (p->st[k].status != GP_OK) s = gp_error(p->st[k].status, "%s", p->st[k].msg);
        }
    }
    gp_transport_free(p->tr);
    p->tr = NULL;
    if (s != GP_OK) {
        /* No gradients left behind, so the next step can succeed. */
        for (int k = 0; k < p->K; k++) gp_rt_zero_grads(&p->st[k]);
        return s;
    }
    if (loss) *loss = (float)p->st[p->K - 1].loss;
    p->step++;
    s = gp_rt_trace_comm(p);
    if (s == GP_OK) s = gp_rt_simulate_trace(p);
    if (s != GP_OK) return gp_error_context(s, "pipeline step %d: the timeline", p->step - 1);
    p->have_trace = true;
    return GP_OK;
}

/* ------------------------------------------------------------- checkpoints */

int gp_pipeline_steps_done(const gp_pipeline *p) { return p ? p->step : 0; }

gp_status gp_pipeline_set_step(gp_pipeline *p, int steps_done) {
    if (!p) return gp_error(GP_INVALID_ARGUMENT, "gp_pipeline_set_step: pipeline is NULL");
    if (steps_done < 0)
        return gp_error(GP_INVALID_ARGUMENT, "gp_pipeline_set_step: %d steps, expected >= 0",
                        steps_done);
    p->step = steps_done;
    return GP_OK;
}

gp_model *gp_pipeline_model(const gp_pipeline *p) { return p ? p->m : NULL; }
const gp_optim_opts *gp_pipeline_optim(const gp_pipeline *p) { return p ? &p->o : NULL; }

gp_status gp_pipeline_allgather(gp_pipeline *p, const void *mine, size_t nbytes, void *all) {
    if (!p || !mine || !all)
        return gp_error(GP_INVALID_ARGUMENT, "gp_pipeline_allgather: NULL argument");
    if (!p->grid) {
        memcpy(all, mine, nbytes);
        return GP_OK;
    }
    int W = gp_grid_world_size(p->grid);
    size_t *off = calloc((size_t)W + 1, sizeof *off);
    void *got = NULL;
    if (!off) return gp_error(GP_OUT_OF_MEMORY, "gp_pipeline_allgather: %d ranks", W);
    gp_status s = gp_grid_allgatherv(p->grid, mine, nbytes, &got, off);
    for (int r = 0; r < W && s == GP_OK; r++)
        if (off[r + 1] - off[r] != nbytes)
            s = gp_error(GP_INTERNAL, "gp_pipeline_allgather: rank %d gave %zu bytes, not %zu", r,
                         off[r + 1] - off[r], nbytes);
    if (s == GP_OK) memcpy(all, got, (size_t)W * nbytes);
    free(got);
    free(off);
    return s;
}
