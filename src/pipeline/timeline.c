/* The pipeline step's timeline: after a successful step, every transport call is split into
 * WAIT and its hand-over from the peers' times, and the simulator predicts the bubble from the
 * measured per-cell times (and replays the measured actions); then the stats, the Chrome trace
 * and the SVG picture of that step. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "pipeline/stage.h"
#include "pipeline/timeline.h"
#include "plan/simulate.h"

/* One transport call [b, e] as WAIT up to `ready` (when the peer made the call able to
 * proceed), then the hand-over itself. */
static gp_status add_comm(gp_pipeline *p, int k, gp_trace_kind kind, int mb, double b, double e,
                          double ready, const char *label) {
    double w = ready < b ? b : ready > e ? e : ready;
    if (w > b) GP_TRY(gp_trace_add(&p->trace, k, GP_TRACE_WAIT, mb, b, w, label));
    return gp_trace_add(&p->trace, k, kind, mb, w, e, label);
}

void gp_timeline_reset(gp_pipeline *p) {
    gp_trace_reset(&p->trace);
    p->have_trace = false;
}

/* After a successful step (every action ran, the threads joined): a receive could proceed once
 * its message was sent (the end of the peer's send call, which only enqueues a pointer); a send
 * blocked on a full mailbox could proceed once the receiver had taken the message `capacity`
 * sends earlier on that link. The transport does not report these moments itself. */
gp_status gp_timeline_trace_comm(gp_pipeline *p) {
    char label[GP_TRACE_LABEL_NBYTES];
    for (int w = 0; w < p->K * p->T; w++) {
        gp_stage *s = &p->st[w];
        const int k = s->k;
        gp_trace_set_chunk(&p->trace, s->w, s->chunk);
        for (int mb = 0; mb < p->M; mb++) {
            const comm_times *c = &s->ct[mb];
            for (int j = GP_MSG_ACT; j <= GP_MSG_GRAD; j++) {
                int to = j == GP_MSG_ACT ? k + 1 : k - 1; /* where this stage sends kind j */
                int from = j == GP_MSG_ACT ? k - 1 : k + 1;
                if (to >= 0 && to < p->K) {
                    int n = c->send_seq[j];
                    double ready = c->send_b[j];
                    if (n >= MAILBOX_CAPACITY)
                        ready = gp_worker(p, to, s->t)
                                    ->ct[s->sent_mb[j][n - MAILBOX_CAPACITY]]
                                    .recv_e[j];
                    gp_stage_msg_label(s, true, (gp_msg_kind)j, label, sizeof label);
                    GP_TRY(add_comm(p, s->w, GP_TRACE_SEND, mb, c->send_b[j], c->send_e[j],
                                    ready, label));
                }
                if (from >= 0 && from < p->K) {
                    gp_stage_msg_label(s, false, (gp_msg_kind)j, label, sizeof label);
                    GP_TRY(add_comm(p, s->w, GP_TRACE_RECV, mb, c->recv_b[j], c->recv_e[j],
                                    gp_worker(p, from, s->t)->ct[mb].send_e[j], label));
                }
            }
        }
        gp_trace_set_chunk(&p->trace, s->w, 0);
    }
    return GP_OK;
}

/* Over MPI a call's blocking and its transfer cannot be told apart, and the transfer through
 * shared memory or a NIC is the smaller part, so the whole call counts as idle time. */
gp_status gp_timeline_trace_calls(gp_stage *s) {
    char label[GP_TRACE_LABEL_NBYTES];
    gp_pipeline *p = s->p;
    int k = s->k;
    bool sends[GP_MSG_NKINDS] = {k < p->K - 1, k > 0}, recvs[GP_MSG_NKINDS] = {k > 0, k < p->K - 1};
    gp_trace_set_chunk(&p->trace, s->w, s->chunk);
    for (int mb = 0; mb < p->M; mb++)
        for (int j = 0; j < GP_MSG_NKINDS; j++) {
            const comm_times *c = &s->ct[mb];
            if (sends[j]) {
                gp_stage_msg_label(s, true, (gp_msg_kind)j, label, sizeof label);
                GP_TRY(gp_trace_add(&p->trace, s->w, GP_TRACE_WAIT, mb, c->send_b[j],
                                    c->send_e[j], label));
            }
            if (recvs[j]) {
                gp_stage_msg_label(s, false, (gp_msg_kind)j, label, sizeof label);
                GP_TRY(gp_trace_add(&p->trace, s->w, GP_TRACE_WAIT, mb, c->recv_b[j],
                                    c->recv_e[j], label));
            }
        }
    gp_trace_set_chunk(&p->trace, s->w, 0);
    return GP_OK;
}

gp_status gp_timeline_add_track(gp_pipeline *p, int r, const gp_trace_event *ev, int n,
                                double shift) {
    for (int i = 0; i < n; i++) {
        if (ev[i].t_end < ev[i].t_begin) continue; /* left open by a failure */
        gp_trace_set_chunk(&p->trace, r, ev[i].chunk);
        GP_TRY(gp_trace_add(&p->trace, r, ev[i].kind, ev[i].micro_batch, ev[i].t_begin + shift,
                            ev[i].t_end + shift, ev[i].label));
    }
    return GP_OK;
}

/* The simulator's bubble for this schedule twice: with each cell's mean measured forward and
 * backward (without recomputation; the simulator adds a forward for it) and optimizer time, the
 * prediction a plan makes from per-cell figures; and replaying every action's own measured
 * duration (recomputations included), which keeps the step-to-step spread of the times. Idle time
 * the replay has too comes from the schedule's dependencies on those durations; what the
 * measurement has beyond it is the runtime's own (hand-overs, wake-ups). */
gp_status gp_timeline_simulate(gp_pipeline *p) {
    const int K = p->K, M = p->M;
    gp_sim_cell *cells = calloc((size_t)K, sizeof *cells);
    gp_sim_stage *st = calloc((size_t)K, sizeof *st);
    double *per_mb = calloc(4 * (size_t)K * (size_t)M, sizeof *per_mb);
    gp_status s = GP_OK;
    if (!cells || !st || !per_mb)
        s = gp_error(GP_OUT_OF_MEMORY, "cannot allocate %d simulator cells", K);
    for (int k = 0; k < K && s == GP_OK; k++) {
        int n, nf = 0, nb = 0, nw = 0;
        /* per micro-batch: forward, whole backward (both parts of a split one), its weight
         * part, recomputation */
        double *f = per_mb + (size_t)4 * k * M, *b = f + M, *w = b + M, *re = w + M;
        /* Cell k's shard 0 (with processes: replica 0's, world rank k T) stands for it; its
         * events are those of its chunk on its stage's track. */
        const gp_stage *cell = gp_worker(p, k, 0);
        const gp_trace_event *ev = gp_trace_events(&p->trace, cell->w, &n);
        for (int i = 0; i < n; i++) {
            if (ev[i].chunk != cell->chunk) continue;
            double d = ev[i].t_end - ev[i].t_begin;
            int mb = ev[i].micro_batch;
            bool in = mb >= 0 && mb < M;
            if (ev[i].kind == GP_TRACE_FORWARD) cells[k].fwd_time += d, nf++, f[in ? mb : 0] += in ? d : 0;
            if (ev[i].kind == GP_TRACE_BACKWARD) cells[k].bwd_time += d, nb++, b[in ? mb : 0] += in ? d : 0;
            if (ev[i].kind == GP_TRACE_WEIGHT) {
                cells[k].wgt_time += d, nw++;
                if (in) w[mb] += d, b[mb] += d;
            }
            if (ev[i].kind == GP_TRACE_RECOMPUTE && in) re[mb] += d;
            if (ev[i].kind == GP_TRACE_OPTIMIZER) cells[k].opt_time += d;
        }
        if (nf) cells[k].fwd_time /= nf;
        if (nb) cells[k].bwd_time /= nb;
        if (nw) cells[k].wgt_time /= nw;
        cells[k].bwd_time += cells[k].wgt_time; /* the whole backward */
    }
    gp_sim_opts o = {.capacity = MAILBOX_CAPACITY, .cell_remat = p->cell_remat};
    gp_sim_result r = {0};
    if (s == GP_OK) s = gp_schedule_simulate(&p->sched, cells, &o, st, &r);
    p->trace.bubble_simulated = s == GP_OK ? r.bubble : -1.0;
    for (int k = 0; k < K && s == GP_OK; k++) {
        cells[k].fwd_mb = per_mb + (size_t)4 * k * M;
        cells[k].bwd_mb = cells[k].fwd_mb + M;
        cells[k].wgt_mb = cells[k].bwd_mb + M;
        cells[k].recompute_mb = cells[k].wgt_mb + M;
    }
    if (s == GP_OK) s = gp_schedule_simulate(&p->sched, cells, &o, st, &r);
    p->bubble_replayed = s == GP_OK ? r.bubble : -1.0;
    free(per_mb);
    free(cells);
    free(st);
    p->have_trace = s == GP_OK;
    return s;
}

gp_status gp_pipeline_last_stats(const gp_pipeline *p, gp_pipeline_stats *out,
                                 gp_stage_stats *stages) {
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
        out->stages = p->nstages;
        out->micro_batches = p->M;
        out->step_s = p->step_s;
        out->bubble_measured = ts.bubble;
        out->bubble_theory =
            (double)(p->nstages - 1) / (double)(p->V * p->M + p->nstages - 1);
        out->bubble_simulated = p->trace.bubble_simulated;
        out->bubble_replayed = p->bubble_replayed;
        out->pinned = true;
        for (int w = 0; w < gp_workers(p); w++) out->pinned = out->pinned && p->st[w].pinned;
        for (int k = 0; stages && k < p->nstages; k++)
            stages[k] = (gp_stage_stats){
                .busy_fraction = ts.span > 0 ? ss[k * p->T].busy / ts.span : 0,
                .first_layer = p->first[k],
                .remat = p->cell_remat[k]};
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
