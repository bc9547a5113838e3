/* The pipeline runtime on threads: K cells on K stage devices, one thread per stage per step,
 * each interpreting its validated action list over the in-process transport. Every step matches
 * the single-device trainer bit for bit (same per-micro-batch forward/backward, loss normalizer,
 * gradient-norm order, clipping and update), whatever K, schedule or re-materialization. Each
 * step's actions are recorded into a timeline (gp_trace) for its stats, trace and picture. */
#define _GNU_SOURCE /* sched_getaffinity, pthread_setaffinity_np: pinning stages to cores */
#include <math.h>
#include <pthread.h>
#include <sched.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "../comm/mpi_grid.h"
#include "../comm/transport.h"
#include "../trace/trace.h"
#include "../model/sequence.h"
#include "../optim/optim.h"
#include "../model/model_internal.h"
#include "partition.h"
#include "runtime_internal.h"
#include "schedule.h"

#define MAILBOX_CAPACITY 2

/* When a stage's transport call began and returned, per micro-batch and message kind. The
 * transport does not say how much of a call was spent blocked, so the split into WAIT and the
 * hand-over is made after the step from the peers' times (see trace_comm). */
typedef struct comm_times {
    double send_b[GP_MSG_NKINDS], send_e[GP_MSG_NKINDS];
    double recv_b[GP_MSG_NKINDS], recv_e[GP_MSG_NKINDS];
    int send_seq[GP_MSG_NKINDS]; /* position of the message on its link, in sending order */
} comm_times;

typedef struct stage {
    struct gp_pipeline *p;
    int k, first, last; /* layers [first, last) */
    gp_device *dev;
    /* Per micro-batch, between actions of one step (M entries each). */
    gp_tensor *in;      /* the cell's input: a view of x on stage 0, received otherwise */
    gp_seq_pass *pass;  /* remat NONE: the kept forward */
    gp_tensor *out;     /* the output waiting for SEND_ACT */
    gp_tensor *dy;      /* the received gradient of the output */
    gp_tensor *dx;      /* the gradient of the input waiting for SEND_GRAD */
    gp_shape in_shape, out_shape; /* this step's micro-batch shapes */
    double loss;        /* last stage: sum of micro-batch losses, micro-batch order */
    comm_times *ct;     /* (M) */
    int nsent[GP_MSG_NKINDS];
    int *sent_mb[GP_MSG_NKINDS]; /* (M): micro-batch of the n-th message sent of each kind */
    gp_status status;
    char msg[1024];
    pthread_t thread;
    int cpu;     /* the core this stage's thread runs on, -1: not pinned */
    bool pinned; /* the last step's thread did get that core */
} stage;

struct gp_pipeline {
    gp_model *m;
    gp_optim_opts o;
    int K, M;
    gp_remat remat;
    gp_schedule sched;
    uint64_t seed;
    int step;
    stage *st;
    /* This step's inputs (read by stage 0 and the last stage only). */
    gp_transport *tr;
    const gp_tensor *x, *y;
    int64_t b; /* micro-batch size */
    double normalizer;
    /* The timeline of the last step; see gp_pipeline_last_stats. */
    gp_trace trace;
    int *first;       /* (K) first layer of each cell */
    bool have_trace;  /* the last step succeeded and its timeline is complete */
    double bubble_replayed; /* the simulator replaying the last step's measured actions */
    double step_s;
    /* Processes (MPI, the end of this file): this process runs stage gp_grid_stage(grid) of
     * replica gp_grid_replica(grid) only; NULL grid: every stage, as threads. */
    gp_grid *grid;
    int D;              /* data-parallel replicas */
    int mb0;            /* global index of this replica's first micro-batch (RNG keys) */
    gp_tensor xv, yv;   /* this replica's rows of the step's mini-batch (views) */
    gp_device *mirror;  /* copies of the other stages' layers (gp_pipeline_sync_params) */
    gp_tensor dp_buf;   /* (stage's trainable elements) the data-parallel gradient buckets */
    int64_t *dp_off;    /* (L + 1) where each of the stage's layers starts in dp_buf */
    int dp_mark;        /* layers [dp_mark, last) are in buckets already started */
    int64_t dp_bucket;  /* floats that make a bucket */
    uint64_t *bytes;    /* (2 x world size) p2p and all-reduce bytes of each rank, last step */
    gp_mem_stats *rank_mem; /* (world size) each rank's stage counters, at the last gather */
};

static bool owns(const gp_pipeline *p, int k) { return !p->grid || gp_grid_stage(p->grid) == k; }
static gp_status backward_cell(struct stage *s, int mb, const gp_tensor *dy, gp_tensor *dx);
static gp_status finish_grad_reduce(struct stage *s);
static gp_status reduce_over_ranks(struct stage *s, double *v, int L);
static gp_status step_processes(gp_pipeline *p, const gp_tensor *x, const gp_tensor *y,
                                float *loss);
static gp_status init_processes(gp_pipeline *p, const gp_pipeline_opts *po);
static void free_processes(gp_pipeline *p);
static gp_status agree_partition(gp_pipeline *p, int *first);

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
static gp_tensor batch_slice(const gp_tensor *t, int64_t first, int64_t n) {
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
    if (s->k == 0) s->in[mb] = batch_slice(p->x, mb * p->b, p->b);
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
    gp_tensor yv = batch_slice(p->y, mb * p->b, p->b);
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
    if (st == GP_OK) st = backward_cell(s, mb, dy, dx);
    gp_tensor_release(&dlogits);
    gp_tensor_release(&s->dy[mb]);
    gp_tensor_release(&s->in[mb]); /* the stash is done with */
    return st;
}

#define FOR_EACH_OWN_TRAINABLE(s, li, q)                                               \
    for (int li = (s)->first; li < (s)->last; li++)                                   \
        for (int pj_ = 0; pj_ < (s)->p->m->layers[li]->nparams; pj_++)                 \
            if (((q) = &(s)->p->m->layers[li]->params[pj_])->trainable)

static void zero_grads(stage *s) {
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
    if (p->grid) GP_TRY(finish_grad_reduce(s));
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
        st = p->grid ? reduce_over_ranks(s, v, L) : gp_transport_allreduce_sum(p->tr, s->k, v, L + 1);
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
    zero_grads(s);
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

static void *stage_main(void *arg) {
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
    free_processes(p);
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
        if (!owns(p, k)) { /* another process runs it: a copy for evaluation only */
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
    gp_status s = init_processes(p, po); /* first: a mismatched launch fails before any work */
    if (s == GP_OK) s = choose_partition(p, po, first);
    if (s == GP_OK && p->grid) s = agree_partition(p, first);
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
    if (!owns(p, stage) && p->rank_mem) { /* replica 0's stage `stage` is world rank `stage` */
        *out = p->rank_mem[stage];
        return GP_OK;
    }
    if (!owns(p, stage))
        return gp_error(GP_INVALID_ARGUMENT,
                        "gp_pipeline_mem_stats: stage %d runs in another process (this is rank %d, "
                        "stage %d)",
                        stage, gp_grid_world_rank(p->grid), gp_grid_stage(p->grid));
    gp_device_mem_stats(p->st[stage].dev, out);
    return GP_OK;
}

/* ------------------------------------------------------------------- step */

static gp_status trace_comm(gp_pipeline *p);
static gp_status simulate_trace(gp_pipeline *p);

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
    if (p->grid) return step_processes(p, x, y, loss);
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
        if (pthread_create(&p->st[started].thread, NULL, stage_main, &p->st[started]) != 0) {
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
        for (int k = 0; k < p->K; k++) zero_grads(&p->st[k]);
        return s;
    }
    if (loss) *loss = (float)p->st[p->K - 1].loss;
    p->step++;
    s = trace_comm(p);
    if (s == GP_OK) s = simulate_trace(p);
    if (s != GP_OK) return gp_error_context(s, "pipeline step %d: the timeline", p->step - 1);
    p->have_trace = true;
    return GP_OK;
}

/* ------------------------------------------------------------------ timeline */

/* One transport call [b, e] as WAIT up to `ready` (when the peer made the call able to
 * proceed), then the hand-over itself. */
static gp_status add_comm(gp_pipeline *p, int k, gp_trace_kind kind, int mb, double b, double e,
                          double ready, const char *label) {
    double w = ready < b ? b : ready > e ? e : ready;
    if (w > b) GP_TRY(gp_trace_add(&p->trace, k, GP_TRACE_WAIT, mb, b, w, label));
    return gp_trace_add(&p->trace, k, kind, mb, w, e, label);
}

/* After a successful step (every action ran, the threads joined): a receive could proceed once
 * its message was sent (the end of the peer's send call, which only enqueues a pointer); a send
 * blocked on a full mailbox could proceed once the receiver had taken the message `capacity`
 * sends earlier on that link. The transport does not report these moments itself. */
static gp_status trace_comm(gp_pipeline *p) {
    static const char *const names[2][GP_MSG_NKINDS] = {{"SEND_ACT", "SEND_GRAD"},
                                                        {"RECV_ACT", "RECV_GRAD"}};
    for (int k = 0; k < p->K; k++) {
        stage *s = &p->st[k];
        for (int mb = 0; mb < p->M; mb++) {
            const comm_times *c = &s->ct[mb];
            for (int j = 0; j < GP_MSG_NKINDS; j++) {
                int to = j == GP_MSG_ACT ? k + 1 : k - 1; /* where this stage sends kind j */
                int from = j == GP_MSG_ACT ? k - 1 : k + 1;
                if (to >= 0 && to < p->K) {
                    int n = c->send_seq[j];
                    double ready = c->send_b[j];
                    if (n >= MAILBOX_CAPACITY)
                        ready = p->st[to].ct[s->sent_mb[j][n - MAILBOX_CAPACITY]].recv_e[j];
                    GP_TRY(add_comm(p, k, GP_TRACE_SEND, mb, c->send_b[j], c->send_e[j], ready,
                                    names[0][j]));
                }
                if (from >= 0 && from < p->K)
                    GP_TRY(add_comm(p, k, GP_TRACE_RECV, mb, c->recv_b[j], c->recv_e[j],
                                    p->st[from].ct[mb].send_e[j], names[1][j]));
            }
        }
    }
    return GP_OK;
}

/* The simulator's bubble for this schedule twice: with each cell's mean measured forward and
 * backward (without recomputation; the simulator adds a forward for it) and optimizer time, the
 * prediction a plan makes from per-cell figures; and replaying every action's own measured
 * duration (recomputations included), which keeps the step-to-step spread of the times. Idle time
 * the replay has too comes from the schedule's dependencies on those durations; what the
 * measurement has beyond it is the runtime's own (hand-overs, wake-ups). */
static gp_status simulate_trace(gp_pipeline *p) {
    const int K = p->K, M = p->M;
    gp_sim_cell *cells = calloc((size_t)K, sizeof *cells);
    gp_sim_stage *st = calloc((size_t)K, sizeof *st);
    double *per_mb = calloc(3 * (size_t)K * (size_t)M, sizeof *per_mb);
    gp_status s = GP_OK;
    if (!cells || !st || !per_mb)
        s = gp_error(GP_OUT_OF_MEMORY, "cannot allocate %d simulator cells", K);
    for (int k = 0; k < K && s == GP_OK; k++) {
        int n, nf = 0, nb = 0;
        double *f = per_mb + (size_t)3 * k * M, *b = f + M, *re = b + M;
        const gp_trace_event *ev = gp_trace_events(&p->trace, k, &n);
        for (int i = 0; i < n; i++) {
            double d = ev[i].t_end - ev[i].t_begin;
            int mb = ev[i].micro_batch;
            bool in = mb >= 0 && mb < M;
            if (ev[i].kind == GP_TRACE_FORWARD) cells[k].fwd_time += d, nf++, f[in ? mb : 0] += in ? d : 0;
            if (ev[i].kind == GP_TRACE_BACKWARD) cells[k].bwd_time += d, nb++, b[in ? mb : 0] += in ? d : 0;
            if (ev[i].kind == GP_TRACE_RECOMPUTE && in) re[mb] += d;
            if (ev[i].kind == GP_TRACE_OPTIMIZER) cells[k].opt_time += d;
        }
        if (nf) cells[k].fwd_time /= nf;
        if (nb) cells[k].bwd_time /= nb;
    }
    gp_sim_opts o = {.capacity = MAILBOX_CAPACITY,
                     .remat = p->remat == GP_REMAT_CELL ? GP_PLAN_REMAT_CELL : GP_PLAN_REMAT_NONE};
    gp_sim_result r = {0};
    if (s == GP_OK) s = gp_schedule_simulate(&p->sched, cells, &o, st, &r);
    p->trace.bubble_simulated = s == GP_OK ? r.bubble : -1.0;
    for (int k = 0; k < K && s == GP_OK; k++) {
        cells[k].fwd_mb = per_mb + (size_t)3 * k * M;
        cells[k].bwd_mb = cells[k].fwd_mb + M;
        cells[k].recompute_mb = cells[k].bwd_mb + M;
    }
    if (s == GP_OK) s = gp_schedule_simulate(&p->sched, cells, &o, st, &r);
    p->bubble_replayed = s == GP_OK ? r.bubble : -1.0;
    free(per_mb);
    free(cells);
    free(st);
    return s;
}

gp_status gp_pipeline_last_stats(const gp_pipeline *p, gp_pipeline_stats *out) {
    if (!p || !out) return gp_error(GP_INVALID_ARGUMENT, "gp_pipeline_last_stats: NULL argument");
    memset(out, 0, sizeof *out);
    if (!p->have_trace)
        return gp_error(GP_INVALID_ARGUMENT,
                        "gp_pipeline_last_stats: no timeline (no step has run, or the last one failed)");
    gp_trace_stage_stats *ss = calloc((size_t)p->trace.stages, sizeof *ss);
    if (!ss) return gp_error(GP_OUT_OF_MEMORY, "cannot allocate %d stage figures", p->K);
    gp_trace_stats ts;
    gp_status s = gp_trace_measure(&p->trace, ss, &ts);
    if (s == GP_OK) {
        out->stages = p->K;
        out->micro_batches = p->M;
        out->step_s = p->step_s;
        out->bubble_measured = ts.bubble;
        out->bubble_theory = (double)(p->K - 1) / (double)(p->M + p->K - 1);
        out->bubble_simulated = p->trace.bubble_simulated;
        out->bubble_replayed = p->bubble_replayed;
        out->pinned = true;
        for (int k = 0; k < p->K; k++) out->pinned = out->pinned && p->st[k].pinned;
        for (int k = 0; k < p->K && k < 64; k++) {
            out->busy_fraction[k] = ts.span > 0 ? ss[k].busy / ts.span : 0;
            out->partition[k] = p->first[k];
        }
    }
    free(ss);
    return s;
}

static gp_status check_written(const gp_pipeline *p, const char *path, const char *fn) {
    if (!p || !path) return gp_error(GP_INVALID_ARGUMENT, "%s: NULL argument", fn);
    if (!p->have_trace)
        return gp_error(GP_INVALID_ARGUMENT,
                        "%s %s: no timeline (no step has run, or the last one failed)", fn, path);
    return GP_OK;
}

gp_status gp_pipeline_write_trace(const gp_pipeline *p, const char *path) {
    GP_TRY(check_written(p, path, "gp_pipeline_write_trace"));
    return gp_trace_write_chrome(&p->trace, path);
}

gp_status gp_pipeline_write_timeline(const gp_pipeline *p, const char *path) {
    GP_TRY(check_written(p, path, "gp_pipeline_write_timeline"));
    return gp_trace_write_svg(&p->trace, path);
}

/* --------------------------------------------------------------- processes (MPI) */

/* Gradient buckets of at least a quarter of the stage's gradients (so that a bucket travels
 * while the stage's earlier layers still backpropagate) and at most this many floats (4 MiB:
 * big enough for the all-reduce to run at bandwidth); a bucket ends at a layer boundary. */
#define DP_BUCKET_FLOATS (1 << 20)

/* The grid (mpirun's world as D x K) and this process's stage; threads: nothing. */
static gp_status init_processes(gp_pipeline *p, const gp_pipeline_opts *po) {
    if (po->backend == GP_BACKEND_THREADS) {
        if (po->data_parallel > 1)
            return gp_error(GP_INVALID_ARGUMENT,
                            "pipeline: data_parallel %d needs the MPI backend (one process per "
                            "replica and stage)",
                            po->data_parallel);
        return GP_OK;
    }
    if (po->backend != GP_BACKEND_MPI)
        return gp_error(GP_INVALID_ARGUMENT, "pipeline: backend %d is neither threads (%d) nor mpi (%d)",
                        (int)po->backend, GP_BACKEND_THREADS, GP_BACKEND_MPI);
    if (po->data_parallel < 0 || !(po->comm_timeout_s >= 0))
        return gp_error(GP_INVALID_ARGUMENT,
                        "pipeline: data_parallel %d must be >= 1 and comm_timeout_s %g >= 0",
                        po->data_parallel, po->comm_timeout_s);
    p->D = po->data_parallel ? po->data_parallel : 1;
    GP_TRY(gp_grid_new(p->D, p->K, po->comm_timeout_s, &p->grid));
    p->tr = gp_grid_pipe(p->grid);
    p->bytes = calloc(2 * (size_t)gp_grid_world_size(p->grid), sizeof *p->bytes);
    if (!p->bytes) return gp_error(GP_OUT_OF_MEMORY, "pipeline: cannot allocate byte counters");
    char name[48];
    snprintf(name, sizeof name, "mirror%d", gp_grid_world_rank(p->grid));
    return gp_device_cpu_new(name, &p->mirror);
}

/* Every rank must cut the model at the same layers; a partition balanced on measured times
 * (--balance time) may differ from rank to rank, so rank 0's is used everywhere: one all-reduce
 * to which only rank 0 contributes. */
static gp_status agree_partition(gp_pipeline *p, int *first) {
    int rank = gp_grid_world_rank(p->grid);
    double *v = calloc((size_t)p->K, sizeof *v);
    if (!v) return gp_error(GP_OUT_OF_MEMORY, "pipeline: cannot allocate %d cell bounds", p->K);
    for (int k = 0; rank == 0 && k < p->K; k++) v[k] = first[k];
    gp_status s = gp_transport_allreduce_sum(gp_grid_world(p->grid), rank, v, p->K);
    for (int k = 0; s == GP_OK && k < p->K; k++) first[k] = (int)v[k];
    free(v);
    return s == GP_OK ? GP_OK : gp_error_context(s, "pipeline: agreeing on rank 0's cells");
}

static void free_processes(gp_pipeline *p) {
    if (!p->grid) return;
    if (p->st) gp_tensor_release(&p->dp_buf); /* on the stage device, before it goes */
    for (int k = 0; p->st && k < p->K; k++) /* the mirror's copies of the other stages */
        if (!owns(p, k)) gp_model_release_range(p->m, p->st[k].first, p->st[k].last);
    gp_grid_free(p->grid);
    p->grid = NULL;
    p->tr = NULL;
    if (p->mirror) gp_device_free(p->mirror);
    p->mirror = NULL;
    free(p->bytes);
    free(p->rank_mem);
    free(p->dp_off);
}

/* The stage's gradients in dp_buf, layer after layer (each layer's trainable parameters in
 * order); dp_off[li] is where layer li's start, for li in [first, last]. */
static gp_status dp_layout(stage *s) {
    gp_pipeline *p = s->p;
    if (p->dp_off) return GP_OK;
    p->dp_off = calloc((size_t)p->m->nlayers + 1, sizeof *p->dp_off);
    if (!p->dp_off) return gp_error(GP_OUT_OF_MEMORY, "pipeline: cannot allocate bucket offsets");
    int64_t n = 0;
    for (int li = s->first; li < s->last; li++) {
        p->dp_off[li] = n;
        for (int j = 0; j < p->m->layers[li]->nparams; j++) {
            const gp_param *q = &p->m->layers[li]->params[j];
            if (q->trainable) n += gp_tensor_nelem(&q->grad);
        }
    }
    p->dp_off[s->last] = n;
    p->dp_bucket = n / 4 < DP_BUCKET_FLOATS ? n / 4 : DP_BUCKET_FLOATS;
    return n ? gp_tensor_alloc(s->dev, GP_MEM_GRADS, gp_shape1(n), GP_F32, &p->dp_buf) : GP_OK;
}

/* Layer li's gradients are final (the stage's last backward runs its layers last to first):
 * copy them into their place and, once the layers not yet sent fill a bucket (or the cell's
 * first layer is done), start that bucket's all-reduce while the earlier layers backpropagate. */
static gp_status layer_grads_final(void *ctx, int li) {
    stage *s = ctx;
    gp_pipeline *p = s->p;
    if (!p->dp_buf.data) return GP_OK;
    float *b = p->dp_buf.data + p->dp_off[li];
    for (int j = 0; j < p->m->layers[li]->nparams; j++) {
        const gp_param *q = &p->m->layers[li]->params[j];
        if (!q->trainable) continue;
        memcpy(b, q->grad.data, gp_tensor_nbytes(&q->grad));
        b += gp_tensor_nelem(&q->grad);
    }
    int64_t lo = p->dp_off[li], hi = p->dp_off[p->dp_mark];
    if (hi > lo && (hi - lo >= p->dp_bucket || li == s->first)) {
        GP_TRY(gp_grid_grads_start(p->grid, p->dp_buf.data + lo, hi - lo));
        p->dp_mark = li;
    }
    return GP_OK;
}

/* Backward through the cell; with data-parallel replicas the last micro-batch's backward also
 * starts the gradient buckets as their layers finish. */
static gp_status backward_cell(stage *s, int mb, const gp_tensor *dy, gp_tensor *dx) {
    gp_pipeline *p = s->p;
    if (!p->grid || p->D < 2 || mb != p->M - 1)
        return gp_seq_backward(p->m, &s->pass[mb], dy, dx);
    gp_status st = dp_layout(s);
    p->dp_mark = s->last;
    if (st != GP_OK) {
        gp_seq_release(&s->pass[mb]);
        return st;
    }
    return gp_seq_backward_each(p->m, &s->pass[mb], dy, dx, layer_grads_final, s);
}

static gp_status finish_grad_reduce(stage *s) {
    gp_pipeline *p = s->p;
    if (p->D < 2 || !p->dp_buf.data) return GP_OK;
    GP_TRY(gp_trace_begin(&p->trace, s->k, GP_TRACE_WAIT, -1, "GRAD_ALLREDUCE"));
    gp_status st = gp_grid_grads_wait(p->grid);
    gp_trace_end(&p->trace, s->k);
    if (st != GP_OK) return st;
    const float *b = p->dp_buf.data;
    gp_param *q;
    FOR_EACH_OWN_TRAINABLE(s, li, q) {
        (void)li;
        memcpy(q->grad.data, b, gp_tensor_nbytes(&q->grad));
        b += gp_tensor_nelem(&q->grad);
    }
    return GP_OK;
}

/* v[0..L-1]: this stage's layers' squared gradient norms (zero elsewhere), v[L]: the last
 * stage's loss over its replica's rows. One all-reduce over every rank, in world order, of
 * L norms (replica 0's only: the replicas' reduced gradients are identical), D losses and each
 * rank's byte counts. Every entry has one contributor, so the sums are exact and identical
 * everywhere; the loss is then the replicas' losses added in replica order. */
static gp_status reduce_over_ranks(stage *s, double *v, int L) {
    gp_pipeline *p = s->p;
    int W = gp_grid_world_size(p->grid), rank = gp_grid_world_rank(p->grid);
    int d = gp_grid_replica(p->grid), n = L + p->D + 2 * W;
    double *w = calloc((size_t)n, sizeof *w);
    if (!w) return gp_error(GP_OUT_OF_MEMORY, "cannot allocate %d reduction values", n);
    if (d == 0) memcpy(w, v, (size_t)L * sizeof *w);
    w[L + d] = v[L];
    uint64_t p2p, ar;
    gp_grid_bytes(p->grid, &p2p, &ar);
    w[L + p->D + 2 * rank] = (double)p2p;
    w[L + p->D + 2 * rank + 1] = (double)ar;
    gp_status st = gp_transport_allreduce_sum(gp_grid_world(p->grid), rank, w, n);
    if (st == GP_OK) {
        memcpy(v, w, (size_t)L * sizeof *v);
        double loss = w[L];
        for (int r = 1; r < p->D; r++) loss += w[L + r];
        v[L] = loss;
        for (int i = 0; i < 2 * W; i++) p->bytes[i] = (uint64_t)w[L + p->D + i];
    }
    free(w);
    return st;
}

/* The stage's transport calls as WAIT events (named by what they moved): over MPI a call's
 * blocking and its transfer cannot be told apart, and the transfer through shared memory or a
 * NIC is the smaller part, so the whole call counts as idle time. */
static gp_status trace_calls(stage *s) {
    static const char *const names[2][GP_MSG_NKINDS] = {{"SEND_ACT", "SEND_GRAD"},
                                                        {"RECV_ACT", "RECV_GRAD"}};
    gp_pipeline *p = s->p;
    int k = s->k;
    bool sends[GP_MSG_NKINDS] = {k < p->K - 1, k > 0}, recvs[GP_MSG_NKINDS] = {k > 0, k < p->K - 1};
    for (int mb = 0; mb < p->M; mb++)
        for (int j = 0; j < GP_MSG_NKINDS; j++) {
            const comm_times *c = &s->ct[mb];
            if (sends[j])
                GP_TRY(gp_trace_add(&p->trace, k, GP_TRACE_WAIT, mb, c->send_b[j], c->send_e[j],
                                    names[0][j]));
            if (recvs[j])
                GP_TRY(gp_trace_add(&p->trace, k, GP_TRACE_WAIT, mb, c->recv_b[j], c->recv_e[j],
                                    names[1][j]));
        }
    return GP_OK;
}

/* One step on this process's stage, on the calling thread (MPI is initialized FUNNELED: only
 * this thread calls it). Every rank gets the global batch; this replica takes its rows. */
static gp_status step_processes(gp_pipeline *p, const gp_tensor *x, const gp_tensor *y,
                                float *loss) {
    int64_t B = x->shape.dim[0];
    if (B % ((int64_t)p->D * p->M))
        return gp_error(GP_INVALID_ARGUMENT,
                        "pipeline step: batch %lld is not divisible by %d replicas x %d "
                        "micro-batches",
                        (long long)B, p->D, p->M);
    int d = gp_grid_replica(p->grid), k = gp_grid_stage(p->grid);
    int64_t rows = B / p->D;
    p->xv = batch_slice(x, d * rows, rows);
    p->yv = batch_slice(y, d * rows, rows);
    p->x = &p->xv;
    p->y = &p->yv;
    p->b = rows / p->M;
    p->mb0 = d * p->M;
    double n = (double)gp_count_labels(y); /* the global batch's: replicas' gradients add up */
    p->normalizer = n > 0 ? n : 1;
    stage *s = &p->st[k];
    GP_TRY(gp_model_shape(p->m, s->first - 1, p->b, &s->in_shape));
    GP_TRY(gp_model_shape(p->m, s->last - 1, p->b, &s->out_shape));
    s->status = GP_OK;
    s->msg[0] = '\0';
    p->have_trace = false;
    gp_trace_reset(&p->trace);
    gp_grid_bytes_reset(p->grid);
    double t_start = gp_now();
    stage_main(s);
    p->step_s = gp_now() - t_start;
    if (s->status == GP_OK) s->status = trace_calls(s);
    if (s->status != GP_OK) {
        zero_grads(s);
        return gp_error(s->status, "%s", s->msg);
    }
    if (loss) *loss = (float)s->loss;
    p->step++;
    return GP_OK;
}

void gp_pipeline_place(const gp_pipeline *p, int *rank, int *nranks, int *stage, int *replica) {
    bool g = p && p->grid;
    if (rank) *rank = g ? gp_grid_world_rank(p->grid) : 0;
    if (nranks) *nranks = g ? gp_grid_world_size(p->grid) : 1;
    if (stage) *stage = g ? gp_grid_stage(p->grid) : -1;
    if (replica) *replica = g ? gp_grid_replica(p->grid) : 0;
}

gp_status gp_pipeline_sync_params(gp_pipeline *p) {
    if (!p) return gp_error(GP_INVALID_ARGUMENT, "gp_pipeline_sync_params: pipeline is NULL");
    if (!p->grid) return GP_OK;
    gp_model *m = p->m;
    for (int k = 0; k < p->K; k++)
        for (int li = p->st[k].first; li < p->st[k].last; li++)
            for (int j = 0; j < m->layers[li]->nparams; j++) {
                gp_tensor *v = &m->layers[li]->params[j].value;
                gp_status st = gp_grid_bcast(p->grid, k, v->data, gp_tensor_nbytes(v));
                if (st != GP_OK)
                    return gp_error_context(st, "gp_pipeline_sync_params: layer %d parameter %s",
                                            li, m->layers[li]->params[j].name);
            }
    return GP_OK;
}

gp_status gp_pipeline_bytes_sent(const gp_pipeline *p, uint64_t *p2p, uint64_t *allreduce, int n) {
    if (!p || !p2p || !allreduce)
        return gp_error(GP_INVALID_ARGUMENT, "gp_pipeline_bytes_sent: NULL argument");
    int W = p->grid ? gp_grid_world_size(p->grid) : 1;
    if (n < W)
        return gp_error(GP_INVALID_ARGUMENT, "gp_pipeline_bytes_sent: room for %d ranks, %d needed",
                        n, W);
    for (int r = 0; r < n; r++) {
        p2p[r] = r < W && p->grid ? p->bytes[2 * r] : 0;
        allreduce[r] = r < W && p->grid ? p->bytes[2 * r + 1] : 0;
    }
    return GP_OK;
}

/* What each rank contributes to a gather: its trace origin (CLOCK_MONOTONIC: comparable between
 * the ranks of one host), a host hash, its stage device's counters, then its events. */
typedef struct gather_head {
    double origin;
    uint64_t host;
    gp_mem_stats mem;
    int nevents;
} gather_head;

gp_status gp_pipeline_gather(gp_pipeline *p) {
    if (!p) return gp_error(GP_INVALID_ARGUMENT, "gp_pipeline_gather: pipeline is NULL");
    if (!p->grid) return GP_OK;
    int W = gp_grid_world_size(p->grid), k = gp_grid_stage(p->grid);
    int n = 0;
    const gp_trace_event *ev = gp_trace_events(&p->trace, k, &n);
    size_t nbytes = sizeof(gather_head) + (size_t)n * sizeof *ev;
    char *mine = malloc(nbytes);
    size_t *off = calloc((size_t)W + 1, sizeof *off);
    if (!p->rank_mem) p->rank_mem = calloc((size_t)W, sizeof *p->rank_mem);
    if (!mine || !off || !p->rank_mem) {
        free(mine);
        free(off);
        return gp_error(GP_OUT_OF_MEMORY, "gp_pipeline_gather: cannot allocate %zu bytes", nbytes);
    }
    gather_head h = {.origin = p->trace.origin, .nevents = n};
    char host[256] = "";
    gethostname(host, sizeof host - 1);
    h.host = gp_fnv1a64(GP_FNV1A64_INIT, host, strlen(host));
    gp_device_mem_stats(p->st[k].dev, &h.mem);
    memcpy(mine, &h, sizeof h);
    if (n) memcpy(mine + sizeof h, ev, (size_t)n * sizeof *ev);
    void *all = NULL;
    gp_status s = gp_grid_allgatherv(p->grid, mine, nbytes, &all, off);
    free(mine);
    if (s != GP_OK) {
        free(off);
        return gp_error_context(s, "gp_pipeline_gather");
    }
    /* One host: the monotonic clocks agree, so every track keeps its true offset. Several
     * hosts: each track starts at its own step start (the step began with the previous one's
     * all-reduce, on every rank within its latency). */
    bool one_host = true;
    gather_head h0;
    memcpy(&h0, all, sizeof h0);
    for (int r = 1; r < W; r++) {
        gather_head hr;
        memcpy(&hr, (char *)all + off[r], sizeof hr);
        one_host = one_host && hr.host == h0.host;
    }
    gp_trace_reset(&p->trace);
    for (int r = 0; r < W && s == GP_OK; r++) {
        gather_head hr;
        memcpy(&hr, (char *)all + off[r], sizeof hr);
        p->rank_mem[r] = hr.mem;
        double shift = one_host ? hr.origin - h0.origin : 0;
        for (int i = 0; i < hr.nevents && s == GP_OK; i++) {
            gp_trace_event e;
            memcpy(&e, (char *)all + off[r] + sizeof hr + (size_t)i * sizeof e, sizeof e);
            if (e.t_end < e.t_begin) continue; /* left open by a failure */
            s = gp_trace_add(&p->trace, r, e.kind, e.micro_batch, e.t_begin + shift,
                             e.t_end + shift, e.label);
        }
    }
    free(all);
    free(off);
    if (s == GP_OK) s = simulate_trace(p); /* tracks 0..K-1: replica 0's stages */
    p->have_trace = s == GP_OK;
    return s;
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
