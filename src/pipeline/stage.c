/* The stage interpreter: one stage runs its validated action list for one step. It talks only
 * to the transport (activations and gradients between stages) and to the launcher's
 * gradient-sync hooks (data-parallel sums, the norm all-reduce), so the same code runs a stage
 * inline, on a thread, or in an MPI process. Every step matches the single-device run bit for
 * bit: the same per-micro-batch forward and backward, loss normalizer, gradient-norm order,
 * clipping and update, whatever K, schedule or re-materialization. */
#define _GNU_SOURCE /* pthread_setaffinity_np: pinning a stage thread to its core */
#include <math.h>
#include <pthread.h>
#include <sched.h>
#include <stdlib.h>
#include <string.h>

#include "layers/tp_ops.h"
#include "model/skips.h"
#include "pipeline/grad_tree.h"
#include "pipeline/mesh.h"
#include "pipeline/stage.h"
#include "pipeline/tie_grads.h"

/* Brackets call in a trace event on stage s's own buffer (one clock read at each end). The
 * event is closed whatever call returns, so a failed action leaves no open event behind. */
#define TRACED(s, kind, mb, label, call)                                                        \
    do {                                                                                       \
        GP_TRY(gp_trace_begin(&(s)->p->trace, (s)->w, (kind), (mb), (label)));                  \
        gp_status st_ = (call);                                                                 \
        gp_status se_ = gp_trace_end(&(s)->p->trace, (s)->w);                                    \
        if (st_ != GP_OK) return st_;                                                           \
        if (se_ != GP_OK) return se_;                                                           \
    } while (0)

gp_status gp_stage_alloc_state(gp_stage *s, int M) {
    s->in = calloc((size_t)M, sizeof *s->in);
    s->pass = calloc((size_t)M, sizeof *s->pass);
    s->out = calloc((size_t)M, sizeof *s->out);
    s->dy = calloc((size_t)M, sizeof *s->dy);
    s->dx = calloc((size_t)M, sizeof *s->dx);
    s->ct = calloc((size_t)M, sizeof *s->ct);
    for (int j = 0; j < GP_MSG_NKINDS; j++) s->sent_mb[j] = calloc((size_t)M, sizeof *s->sent_mb[j]);
    if (!s->in || !s->pass || !s->out || !s->dy || !s->dx || !s->ct || !s->sent_mb[GP_MSG_ACT] ||
        !s->sent_mb[GP_MSG_GRAD])
        return gp_error(GP_OUT_OF_MEMORY, "pipeline: cannot allocate stage %d's state", s->k);
    return GP_OK;
}

void gp_stage_free_state(gp_stage *s) {
    free(s->in);
    free(s->pass);
    free(s->out);
    free(s->dy);
    free(s->dx);
    free(s->ct);
    for (int j = 0; j < GP_MSG_NKINDS; j++) free(s->sent_mb[j]);
}

gp_status gp_stage_begin_step(gp_stage *s) {
    /* what crosses the cell's cuts: the activation, and the skips that cross there with it */
    GP_TRY(gp_model_cut_shape(s->m, s->first, s->p->b, &s->in_shape));
    GP_TRY(gp_model_cut_shape(s->m, s->last, s->p->b, &s->out_shape));
    s->status = GP_OK;
    s->tp_bytes = 0;
    s->msg[0] = '\0';
    return GP_OK;
}

static void release_mb_state(gp_stage *s, int M) {
    for (int mb = 0; mb < M; mb++) {
        gp_seq_release(&s->pass[mb]);
        gp_tensor_release(&s->in[mb]);
        gp_tensor_release(&s->out[mb]);
        gp_tensor_release(&s->dy[mb]);
        gp_tensor_release(&s->dx[mb]);
    }
}

gp_status gp_stage_input_rows(gp_stage *s, const gp_tensor *t, int64_t first, int64_t n,
                              gp_tensor *out) {
    gp_tensor rows = gp_tensor_rows(t, first, n);
    if (gp_kernels_same_memory(s->dev, t->dev)) {
        *out = rows;
        return GP_OK;
    }
    GP_TRY(gp_tensor_alloc(s->dev, GP_MEM_ACTIVATIONS, rows.shape, rows.dtype, out));
    gp_status st = gp_tensor_copy(out, &rows);
    if (st != GP_OK) gp_tensor_release(out);
    return st;
}

/* Keys of the micro-batch's dropout are global (mb0: the replica's first), whatever K, T or D;
 * a shard's layers get its stage's tensor-parallel group. */
static gp_run run_for(const gp_stage *s, int mb, bool recompute) {
    const gp_pipeline *p = s->p;
    gp_run r = {.training = true, .recompute = recompute, .seed = p->seed,
                .step = (uint32_t)p->step, .micro_batch = (uint32_t)(p->mb0 + mb),
                .tp = p->T > 1 ? &s->tp : NULL};
    return r;
}

static bool is_last(const gp_stage *s) { return s->k == s->p->K - 1; }

static gp_status do_forward(gp_stage *s, int mb) {
    gp_pipeline *p = s->p;
    if (s->k == 0) GP_TRY(gp_stage_input_rows(s, p->x, mb * p->b, p->b, &s->in[mb]));
    if (!s->in[mb].data)
        return gp_error(GP_INTERNAL, "FORWARD(%d) before its input arrived", mb);
    gp_run run = run_for(s, mb, false);
    if (p->cell_remat[s->k] == GP_REMAT_NONE) {
        GP_TRY(gp_seq_forward(s->m, s->first, s->last, s->dev, &run, &s->in[mb], &s->pass[mb]));
        if (is_last(s)) return GP_OK;
        /* The pass keeps its output for backward: what is sent is a copy. */
        return gp_seq_cut_output(s->m, &s->pass[mb], &s->out[mb]);
    }
    /* CELL: a training-mode run (batch-norm statistics update here, once) that keeps nothing
     * but the input; backward recomputes from it. */
    gp_tensor y;
    GP_TRY(gp_seq_forward_output(s->m, s->first, s->last, s->dev, &run, &s->in[mb], &y));
    if (is_last(s))
        gp_tensor_release(&y);
    else
        s->out[mb] = y;
    return GP_OK;
}

static gp_status last_stage_loss(gp_stage *s, int mb, const gp_tensor *logits,
                                 gp_tensor *dlogits) {
    gp_pipeline *p = s->p;
    gp_tensor yv = {0};
    double l = 0;
    GP_TRY(gp_stage_input_rows(s, p->y, mb * p->b, p->b, &yv));
    gp_status st = gp_tensor_alloc(s->dev, GP_MEM_ACTIVATIONS, logits->shape, GP_F32, dlogits);
    /* A vocabulary head split over the shards: each has its columns of the logits. */
    const int64_t cols = logits->shape.dim[logits->shape.ndim - 1];
    if (st == GP_OK && p->vocab_split)
        st = gp_softmax_xent_shard(logits, &yv, p->vocab, (int64_t)s->t * cols, &s->tp,
                                   p->normalizer, p->label_smoothing, &l, dlogits);
    else if (st == GP_OK)
        st = gp_softmax_xent_smoothed(logits, &yv, p->normalizer, p->label_smoothing, &l,
                                      dlogits);
    gp_tensor_release(&yv);
    if (st != GP_OK) return gp_error_context(st, "micro-batch %d loss", mb);
    s->loss += l;
    return GP_OK;
}

/* gp_seq_backward_each's callback: the launcher's hook for layer li. */
static gp_status layer_done(void *ctx, int li) {
    gp_stage *s = ctx;
    return s->p->sync.layer_grads_final(s->p->sync.ctx, s, li);
}

/* What a backward of mb starts from: its output gradient in s->dy[mb] (the last stage's loss
 * gradient put there too) and, but on the first stage, s->dx[mb] allocated for its input
 * gradient (*dx; NULL on the first stage). On failure the pass is released. */
static gp_status backward_begin(gp_stage *s, int mb, gp_tensor **dx) {
    *dx = NULL;
    if (!s->pass[mb].acts) return gp_error(GP_INTERNAL, "BACKWARD(%d) without its forward", mb);
    gp_status st = GP_OK;
    if (is_last(s))
        st = last_stage_loss(s, mb, gp_seq_output(&s->pass[mb]), &s->dy[mb]);
    else if (!s->dy[mb].data)
        st = gp_error(GP_INTERNAL, "BACKWARD(%d) before its output gradient arrived", mb);
    if (st == GP_OK && s->k > 0) {
        st = gp_tensor_alloc(s->dev, GP_MEM_ACTIVATIONS, s->in_shape, GP_F32, &s->dx[mb]);
        *dx = &s->dx[mb];
    }
    if (st != GP_OK) gp_seq_release(&s->pass[mb]);
    return st;
}

/* The tree's last leaf folded into layer li's gradients, which are then final. */
static gp_status tree_layer_done(void *ctx, int li) {
    gp_stage *s = ctx;
    GP_TRY(gp_grad_tree_layer_final(s, li));
    const gp_pipeline *p = s->p;
    return p->sync.layer_grads_final && !p->no_update ? layer_done(ctx, li) : GP_OK;
}

/* The last micro-batch's backward (its weight part, when split) makes each layer's gradients
 * final as it goes: the launcher's hook then (after the tree's fold), or none. */
static gp_seq_layer_done final_hook(const gp_stage *s, int mb) {
    const gp_pipeline *p = s->p;
    if (gp_grad_tree_folds(s, mb)) return tree_layer_done;
    return p->sync.layer_grads_final && mb == p->M - 1 && !p->no_update ? layer_done : NULL;
}

/* A whole backward, or (split) its input part, which leaves the pass, the output gradient and
 * the stash to the weight part. */
static gp_status backward_proper(gp_stage *s, int mb, bool split) {
    gp_tensor *dx;
    gp_status st = backward_begin(s, mb, &dx);
    if (st == GP_OK && (st = gp_grad_tree_enter(s, mb)) == GP_OK) {
        st = split ? gp_seq_backward_input(s->m, &s->pass[mb], &s->dy[mb], dx)
                   : gp_seq_backward_each(s->m, &s->pass[mb], &s->dy[mb], dx,
                                          final_hook(s, mb), s);
        gp_status sl = gp_grad_tree_leave(s, mb, !split);
        if (st == GP_OK) st = sl;
    }
    if (!split || st != GP_OK) {
        gp_tensor_release(&s->dy[mb]);
        gp_tensor_release(&s->in[mb]); /* the stash is done with */
    } else if (!gp_seq_holds_output_grad(&s->pass[mb])) {
        gp_tensor_release(&s->dy[mb]); /* the weight parts do not read it */
    }
    return st;
}

/* A split backward's weight part: the pass, its output gradient and the stash are done with. */
static gp_status backward_weight(gp_stage *s, int mb) {
    gp_status st = s->pass[mb].dys ? gp_grad_tree_enter(s, mb)
                                   : gp_error(GP_INTERNAL, "BACKWARD_WEIGHT(%d) without its "
                                                           "input part", mb);
    if (st == GP_OK) {
        st = gp_seq_backward_weight_each(s->m, &s->pass[mb], final_hook(s, mb), s);
        gp_status sl = gp_grad_tree_leave(s, mb, true);
        if (st == GP_OK) st = sl;
    }
    gp_tensor_release(&s->dy[mb]);
    gp_tensor_release(&s->in[mb]);
    return st;
}

/* The rebuild of a remat cell is its own RECOMPUTE event, apart from the BACKWARD proper (or
 * its input part: split). */
static gp_status do_backward(gp_stage *s, int mb, bool split) {
    gp_pipeline *p = s->p;
    if (p->cell_remat[s->k] == GP_REMAT_CELL) {
        gp_run run = run_for(s, mb, true);
        TRACED(s, GP_TRACE_RECOMPUTE, mb, NULL,
               gp_seq_forward(s->m, s->first, s->last, s->dev, &run, &s->in[mb], &s->pass[mb]));
    }
    TRACED(s, GP_TRACE_BACKWARD, mb, NULL, backward_proper(s, mb, split));
    return GP_OK;
}

/* v[li] for the cell's layers: their squared gradient norms. */
static gp_status stage_norms(gp_stage *s, double *v) {
    for (int li = s->first; li < s->last; li++) GP_TRY(gp_mesh_layer_sumsq(s->p, s, li, &v[li]));
    return GP_OK;
}

/* The same for every cell of lead s's stage. */
static gp_status stage_cells_norms(gp_stage *s, double *v) {
    for (int c = 0; c < s->p->V; c++) GP_TRY(stage_norms(gp_chunk_of(s->p, s, c), v));
    return GP_OK;
}

/* Clip by the global norm (the per-layer squares added in layer order), update, clear. */
static gp_status stage_update(gp_stage *s, double total) {
    gp_pipeline *p = s->p;
    double norm = sqrt(total);
    if (!isfinite(norm))
        return gp_error(GP_NUMERIC, "step %d: the gradient norm is not finite; no update made",
                        p->step);
    GP_TRY(gp_store_apply(s->m, s->store, &p->o, norm, p->step));
    return gp_store_zero_grads(s->store);
}

static gp_status stage_cells_update(gp_stage *s, double total) {
    for (int c = 0; c < s->p->V; c++) GP_TRY(stage_update(gp_chunk_of(s->p, s, c), total));
    return GP_OK;
}

static double layer_order_sum(const double *v, int L) {
    double total = 0;
    for (int li = 0; li < L; li++) total += v[li];
    return total;
}

/* Three events: the partials (OPTIMIZER), the all-reduce of L + 1 doubles, which is mostly
 * waiting for the slowest stage (WAIT), then the clip and update (OPTIMIZER). Each layer's norm
 * is filled by the stage that owns it (zero elsewhere, so the sum has exactly the owner's bits)
 * and combined in layer order, as a single device does. */
static gp_status do_optimizer_step(gp_stage *s) {
    gp_pipeline *p = s->p;
    if (p->no_update) return GP_OK;
    gp_trace *t = &p->trace;
    const int L = p->m->nlayers;
    if (p->sync.grads_wait) TRACED(s, GP_TRACE_WAIT, -1, "GRAD_ALLREDUCE", p->sync.grads_wait(p->sync.ctx, s));
    if (s->m->nties) TRACED(s, GP_TRACE_WAIT, -1, "TIE_SUM", gp_ties_sum(p, s));
    double *v = calloc((size_t)L + 1, sizeof *v);
    if (!v) return gp_error(GP_OUT_OF_MEMORY, "cannot allocate %d norm partials", L + 1);
    gp_status st = gp_trace_begin(t, s->w, GP_TRACE_OPTIMIZER, -1, "NORMS");
    if (st == GP_OK) {
        st = stage_cells_norms(s, v);
        /* every shard has the loss: one adds it */
        for (int c = 0; c < p->V; c++)
            if (is_last(gp_chunk_of(p, s, c)) && s->t == 0) v[L] = gp_chunk_of(p, s, c)->loss;
        gp_trace_end(t, s->w);
    }
    if (st == GP_OK && (st = gp_trace_begin(t, s->w, GP_TRACE_WAIT, -1, "ALLREDUCE")) == GP_OK) {
        st = p->sync.reduce_norms(p->sync.ctx, s, v, L);
        gp_trace_end(t, s->w);
    }
    const double total = layer_order_sum(v, L), loss = v[L];
    free(v);
    GP_TRY(st);
    for (int c = 0; c < p->V; c++) gp_chunk_of(p, s, c)->loss = loss;
    if (!isfinite(loss))
        return gp_error(GP_NUMERIC, "step %d: the loss is not finite (%g)", p->step, loss);
    TRACED(s, GP_TRACE_OPTIMIZER, -1, "UPDATE", stage_cells_update(s, total));
    return GP_OK;
}

gp_status gp_pipeline_apply(gp_pipeline *p) {
    if (!p) return gp_error(GP_INVALID_ARGUMENT, "gp_pipeline_apply: pipeline is NULL");
    if (p->my_stage >= 0)
        return gp_error(GP_UNSUPPORTED, "gp_pipeline_apply: in-process pipelines only");
    const int L = p->m->nlayers;
    double *v = calloc((size_t)L + 1, sizeof *v);
    if (!v) return gp_error(GP_OUT_OF_MEMORY, "cannot allocate %d norm partials", L + 1);
    gp_status st = gp_ties_sum_local(p);
    /* The workers' partials in mesh order, as the all-reduce of a step adds them. */
    double *part = calloc((size_t)L, sizeof *part);
    if (!part) st = gp_error(GP_OUT_OF_MEMORY, "cannot allocate %d norm partials", L);
    for (int w = 0; w < p->K * p->T && st == GP_OK; w++) {
        memset(part, 0, (size_t)L * sizeof *part);
        st = stage_norms(&p->st[w], part);
        for (int li = 0; li < L; li++) v[li] = w ? v[li] + part[li] : part[li];
    }
    free(part);
    const double total = layer_order_sum(v, L);
    free(v);
    for (int w = 0; w < p->K * p->T && st == GP_OK; w++) st = stage_update(&p->st[w], total);
    for (int w = 0; w < p->K * p->T; w++) gp_store_zero_grads(p->st[w].store); /* also after a failure */
    if (st == GP_OK) p->step++;
    return st;
}

/* Transport calls are timed here and turned into WAIT + SEND/RECV events after the step. */
static gp_status timed_send(gp_stage *s, int peer, gp_msg_kind kind, int mb, gp_tensor *t) {
    comm_times *c = &s->ct[mb];
    c->send_seq[kind] = s->nsent[kind];
    s->sent_mb[kind][s->nsent[kind]++] = mb;
    c->send_b[kind] = gp_trace_time(&s->p->trace);
    gp_status st = gp_transport_send(s->pipe, s->k, peer, (gp_msg_tag){kind, mb, 0}, t);
    c->send_e[kind] = gp_trace_time(&s->p->trace);
    return st;
}

static gp_status timed_recv(gp_stage *s, int peer, gp_msg_kind kind, int mb, gp_tensor *out) {
    comm_times *c = &s->ct[mb];
    c->recv_b[kind] = gp_trace_time(&s->p->trace);
    gp_status st = gp_transport_recv(s->pipe, s->k, peer, (gp_msg_tag){kind, mb, 0}, out);
    c->recv_e[kind] = gp_trace_time(&s->p->trace);
    return st;
}

static gp_status do_action(gp_stage *s, gp_action a) {
    int k = s->k, mb = a.mb;
    switch (a.kind) {
    case GP_ACT_FORWARD: TRACED(s, GP_TRACE_FORWARD, mb, NULL, do_forward(s, mb)); return GP_OK;
    case GP_ACT_BACKWARD: return do_backward(s, mb, false);
    case GP_ACT_BACKWARD_INPUT: return do_backward(s, mb, true);
    case GP_ACT_BACKWARD_WEIGHT:
        TRACED(s, GP_TRACE_WEIGHT, mb, NULL, backward_weight(s, mb));
        return GP_OK;
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

void gp_stage_msg_label(const gp_stage *s, bool send, gp_msg_kind j, char *buf, size_t n) {
    static const char *const names[2][GP_MSG_NKINDS] = {{"RECV_ACT", "RECV_GRAD"},
                                                        {"SEND_ACT", "SEND_GRAD"}};
    /* activations leave by the cell's last cut and arrive by its first; gradients the reverse */
    const bool last_cut = send == (j == GP_MSG_ACT);
    const int nskips = gp_skips_across(s->m, last_cut ? s->last : s->first, NULL);
    if (nskips)
        snprintf(buf, n, "%s%s%d", names[send][j], GP_TRACE_SKIP_MARK, nskips);
    else
        snprintf(buf, n, "%s", names[send][j]);
}

/* A stage that cannot have its core still runs, unpinned (the stats say so). */
void gp_stage_pin_thread(gp_stage *s) {
    s->pinned = false;
    if (s->cpu < 0) return;
    cpu_set_t set;
    CPU_ZERO(&set);
    CPU_SET(s->cpu, &set);
    s->pinned = pthread_setaffinity_np(pthread_self(), sizeof set, &set) == 0;
}

/* The transport hands a rank's sent buffers back in its calls: each cell's, at the end. */
static gp_status flush_cells(gp_stage *s) {
    for (int c = 0; c < s->p->V; c++) GP_TRY(gp_transport_flush(s->pipe, gp_chunk_of(s->p, s, c)->k));
    return GP_OK;
}

void gp_stage_run(gp_stage *s) {
    gp_pipeline *p = s->p;
    const gp_stage_actions *list = &p->sched.stage[s->dk];
    gp_status st = GP_OK;
    gp_stage_pin_thread(s);
    for (int c = 0; c < p->V; c++) {
        gp_stage *cell = gp_chunk_of(p, s, c);
        cell->loss = 0;
        memset(cell->nsent, 0, sizeof cell->nsent);
        gp_grad_tree_begin_step(cell);
    }
    /* the bf16 copy of the weights the run's products read: made once here, the parameters
     * having last changed before the run; and their generation, under which the layers keep
     * what they derive from them until the update (model/store.h) */
    for (int c = 0; c < p->V && st == GP_OK; c++) {
        gp_stage *cell = gp_chunk_of(p, s, c);
        st = gp_store_bf16_refresh(cell->m, cell->store);
        if (st != GP_OK)
            gp_error_context(st, "the bf16 copy of layers %d..%d's weights", cell->first,
                             cell->last - 1);
        else
            gp_store_values_hold(cell->m, cell->store);
    }
    for (int i = 0; i < list->n && st == GP_OK; i++) {
        const gp_action a = list->a[i];
        /* the optimizer step is the stage's, run by its lead for all its cells */
        gp_stage *cell = a.kind == GP_ACT_OPTIMIZER_STEP ? s : gp_chunk_of(p, s, a.chunk);
        if (p->V > 1) gp_trace_set_chunk(&p->trace, s->w, cell->chunk);
        st = do_action(cell, a);
        if (st != GP_OK) {
            char what[48], where[32] = "";
            if (p->V > 1) snprintf(where, sizeof where, " cell %d", cell->k);
            if (p->T > 1)
                gp_error_context(st, "stage %d%s shard %d (layers %d..%d), action %d %s", s->dk,
                                 where, s->t, cell->first, cell->last - 1, i,
                                 gp_action_str(a, what, sizeof what));
            else
                gp_error_context(st, "stage %d%s (layers %d..%d), action %d %s", s->dk, where,
                                 cell->first, cell->last - 1, i,
                                 gp_action_str(a, what, sizeof what));
        }
    }
    if (p->V > 1) gp_trace_set_chunk(&p->trace, s->w, 0);
    if (st == GP_OK && s->pipe) {
        st = gp_trace_begin(&p->trace, s->w, GP_TRACE_WAIT, -1, "FLUSH");
        if (st == GP_OK) {
            st = flush_cells(s);
            gp_trace_end(&p->trace, s->w);
        }
    }
    if (st != GP_OK) {
        snprintf(s->msg, sizeof s->msg, "%s", gp_last_error());
        if (p->sync.abort)
            p->sync.abort(p->sync.ctx, s, st, s->msg);
        else if (s->pipe)
            gp_transport_abort(s->pipe, s->k, st, s->msg);
    }
    /* on this stage's own thread: its device is touched by it alone; outside a run the
     * parameters may be written by anything, so the copies live no longer than the run */
    for (int c = 0; c < p->V; c++) {
        gp_stage *cell = gp_chunk_of(p, s, c);
        gp_store_values_release(cell->m, cell->store);
        release_mb_state(cell, p->M);
    }
    s->status = st;
}
