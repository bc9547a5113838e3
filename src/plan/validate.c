/* The validator: the per-cell rules, the FIFO matching of each link's messages, then a replay
 * (replay.c) that proves the schedule deadlock-free with bounded mailboxes. With V cells per
 * stage, each cell's rules read the actions of its chunk in its stage's list. */
#include "plan/validate.h"

#include <stdlib.h>

#include "plan/replay.h"

#define FAULT(...) gp_schedule_fault_error(s, k, i, where, __VA_ARGS__)

/* "stage 2", or "cell 5 (stage 1, chunk 1)" when stages run several cells. */
static const char *cell_str(const gp_schedule *s, int c, char *buf, size_t n) {
    int k, v;
    gp_schedule_place(s, c, &k, &v);
    if (s->chunks > 1)
        snprintf(buf, n, "cell %d (stage %d, chunk %d)", c, k, v);
    else
        snprintf(buf, n, "stage %d", c);
    return buf;
}

/* Per-cell rules for stage k's chunk v. seen[kind][mb]: index of the action of that kind for mb
 * of this cell. OPTIMIZER_STEP belongs to the stage: every chunk's rules see it. */
static gp_status check_cell(const gp_schedule *s, int k, int v, int *seen,
                            gp_schedule_fault *where) {
    const int M = s->micro_batches, V = s->chunks > 1 ? s->chunks : 1;
    const int c = gp_schedule_cell(s, k, v), C = gp_schedule_cells(s);
    const char *unit = V > 1 ? "cell" : "stage";
    char prev[48], next[48];
    cell_str(s, c - 1, prev, sizeof prev);
    cell_str(s, c + 1, next, sizeof next);
    const gp_stage_actions *st = &s->stage[k];
    for (int x = 0; x < GP_ACT_NKINDS * M; x++) seen[x] = -1;
    int *fwd = seen + GP_ACT_FORWARD * M, *bwd = seen + GP_ACT_BACKWARD * M;
    int *sa = seen + GP_ACT_SEND_ACT * M, *ra = seen + GP_ACT_RECV_ACT * M;
    int *sg = seen + GP_ACT_SEND_GRAD * M, *rg = seen + GP_ACT_RECV_GRAD * M;
    int *bi = seen + GP_ACT_BACKWARD_INPUT * M, *bw = seen + GP_ACT_BACKWARD_WEIGHT * M;
    int next_bwd = 0, next_wgt = 0, step_at = -1;
    for (int i = 0; i < st->n; i++) {
        gp_action a = st->a[i];
        int m = a.mb;
        if (a.chunk < 0 || a.chunk >= V)
            return FAULT("chunk %d is outside 0..%d (the stage runs %d cell%s)", a.chunk, V - 1,
                         V, V > 1 ? "s" : "");
        if (a.chunk != v && a.kind != GP_ACT_OPTIMIZER_STEP) continue;
        if (step_at >= 0)
            return FAULT("comes after OPTIMIZER_STEP (action %d); the step must be the stage's "
                         "last action",
                         step_at);
        if ((int)a.kind < 0 || a.kind >= GP_ACT_NKINDS) return FAULT("unknown action kind");
        if (a.kind != GP_ACT_OPTIMIZER_STEP && (m < 0 || m >= M))
            return FAULT("micro-batch %d is outside 0..%d", m, M - 1);
        if (a.kind != GP_ACT_OPTIMIZER_STEP && seen[a.kind * M + m] >= 0)
            return FAULT("micro-batch %d already had this action at action %d; each happens "
                         "exactly once per %s",
                         m, seen[a.kind * M + m], unit);
        switch (a.kind) {
        case GP_ACT_FORWARD:
            if (c > 0 && ra[m] < 0)
                return FAULT("needs RECV_ACT(%d) before it (its input comes from %s)", m, prev);
            break;
        case GP_ACT_BACKWARD:
        case GP_ACT_BACKWARD_INPUT:
            if (fwd[m] < 0) return FAULT("comes before FORWARD(%d) on this %s", m, unit);
            if ((a.kind == GP_ACT_BACKWARD ? bi[m] : bwd[m]) >= 0)
                return FAULT("micro-batch %d already had %s at action %d; a backward runs whole "
                             "or split, once",
                             m, a.kind == GP_ACT_BACKWARD ? "BACKWARD_INPUT" : "BACKWARD",
                             a.kind == GP_ACT_BACKWARD ? bi[m] : bwd[m]);
            if (m != next_bwd)
                return FAULT("backwards must run in micro-batch order 0..%d on every %s "
                             "(gradients accumulate in that order, for bitwise-identical "
                             "results); expected %s(%d) here",
                             M - 1, unit, a.kind == GP_ACT_BACKWARD ? "BACKWARD" : "BACKWARD_INPUT",
                             next_bwd);
            if (c < C - 1 && rg[m] < 0)
                return FAULT("needs RECV_GRAD(%d) before it (its output gradient comes from "
                             "%s)",
                             m, next);
            next_bwd++;
            break;
        case GP_ACT_BACKWARD_WEIGHT:
            if (bi[m] < 0)
                return FAULT("comes before BACKWARD_INPUT(%d), whose output gradients it reads", m);
            if (m != next_wgt)
                return FAULT("weight gradients must run in micro-batch order 0..%d on every "
                             "%s (they accumulate in that order); expected "
                             "BACKWARD_WEIGHT(%d) here",
                             M - 1, unit, next_wgt);
            next_wgt++;
            break;
        case GP_ACT_SEND_ACT:
            if (c == C - 1)
                return FAULT("the last %s has no next %s to send activations to", unit, unit);
            if (fwd[m] < 0) return FAULT("comes before FORWARD(%d), which produces it", m);
            break;
        case GP_ACT_RECV_ACT:
            if (c == 0)
                return FAULT("the first %s reads the inputs; it receives no activations", unit);
            break;
        case GP_ACT_SEND_GRAD:
            if (c == 0)
                return FAULT("the first %s has no previous %s to send gradients to", unit, unit);
            if (bwd[m] < 0 && bi[m] < 0)
                return FAULT("comes before BACKWARD(%d), which produces it", m);
            break;
        case GP_ACT_RECV_GRAD:
            if (c == C - 1)
                return FAULT("the last %s computes the loss inside BACKWARD; it receives no "
                             "gradients",
                             unit);
            break;
        case GP_ACT_OPTIMIZER_STEP:
            for (int j = 0; j < M; j++) {
                const char *of = V > 1 ? " of this chunk" : "";
                if (fwd[j] < 0)
                    return FAULT("comes before FORWARD(%d)%s, which is missing", j, of);
                if (bwd[j] < 0 && bi[j] < 0)
                    return FAULT("comes before BACKWARD(%d)%s, which is missing", j, of);
                if (bi[j] >= 0 && bw[j] < 0)
                    return FAULT("comes before BACKWARD_WEIGHT(%d), which is missing (the split "
                                 "backward's weight gradients)",
                                 j);
                if (c < C - 1 && sa[j] < 0)
                    return FAULT("comes before SEND_ACT(%d)%s, which is missing (%s needs "
                                 "every micro-batch's activation)",
                                 j, of, next);
                if (c > 0 && sg[j] < 0)
                    return FAULT("comes before SEND_GRAD(%d)%s, which is missing (%s needs "
                                 "every micro-batch's gradient)",
                                 j, of, prev);
            }
            step_at = i;
            break;
        default:
            break;
        }
        if (a.kind != GP_ACT_OPTIMIZER_STEP) seen[a.kind * M + m] = i;
        (void)bw;
    }
    if (step_at < 0) {
        int i = st->n;
        return FAULT("the list ends without an OPTIMIZER_STEP");
    }
    return GP_OK;
}

/* The j-th message of one direction of a link: the mb of the j-th action of `kind` of chunk v
 * on stage k, and that action's index. Returns -1 past the end. */
static int nth_of_kind(const gp_stage_actions *st, int v, gp_action_kind kind, int j, int *index) {
    for (int i = 0; i < st->n; i++)
        if (st->a[i].kind == kind && st->a[i].chunk == v && j-- == 0) {
            *index = i;
            return st->a[i].mb;
        }
    return -1;
}

/* The first receive of cell c (of `recv`, fed by `send` of cell from) that would take a
 * message for another micro-batch: mailboxes deliver in send order. Sets *at to its index in
 * c's stage list, or leaves it when none. */
static void first_mismatch(const gp_schedule *s, int c, int from, gp_action_kind recv,
                           gp_action_kind send, int *at, int *got, int *pos) {
    int k, v, fk, fv;
    gp_schedule_place(s, c, &k, &v);
    gp_schedule_place(s, from, &fk, &fv);
    for (int j = 0; j < s->micro_batches; j++) {
        int ri = 0, si = 0;
        int rm = nth_of_kind(&s->stage[k], v, recv, j, &ri);
        int sm = nth_of_kind(&s->stage[fk], fv, send, j, &si);
        if (rm != sm) {
            if (ri < *at) *at = ri, *got = sm, *pos = j;
            return;
        }
    }
}

static gp_status check_links(const gp_schedule *s, gp_schedule_fault *where) {
    const int C = gp_schedule_cells(s);
    for (int c = 0; c < C; c++) {
        int k, v;
        gp_schedule_place(s, c, &k, &v);
        int i = s->stage[k].n + 1, got = 0, pos = 0, from = 0;
        if (c > 0) {
            first_mismatch(s, c, c - 1, GP_ACT_RECV_ACT, GP_ACT_SEND_ACT, &i, &got, &pos);
            if (i <= s->stage[k].n) from = c - 1;
        }
        if (c < C - 1) {
            int before = i;
            first_mismatch(s, c, c + 1, GP_ACT_RECV_GRAD, GP_ACT_SEND_GRAD, &i, &got, &pos);
            if (i != before) from = c + 1;
        }
        if (i <= s->stage[k].n) {
            const char *what = from < c ? "SEND_ACT" : "SEND_GRAD";
            char peer[48];
            cell_str(s, from, peer, sizeof peer);
            return FAULT("takes message #%d from %s, which is %s(%d): mailboxes deliver in "
                         "send order, so receives must follow %s's sends",
                         pos, peer, what, got, peer);
        }
    }
    return GP_OK;
}

gp_status gp_schedule_validate(const gp_schedule *s, int capacity, gp_schedule_fault *where) {
    if (!s || !s->stage || s->stages < 1 || s->micro_batches < 1)
        return gp_error(GP_INVALID_ARGUMENT, "schedule: NULL or empty schedule");
    if (capacity < 1)
        return gp_error(GP_INVALID_ARGUMENT,
                        "schedule: mailbox capacity %d; expected at least 1 message", capacity);
    int *seen = malloc((size_t)GP_ACT_NKINDS * (size_t)s->micro_batches * sizeof *seen);
    if (!seen) return gp_error(GP_OUT_OF_MEMORY, "schedule: no memory to validate");
    gp_status st = GP_OK;
    const int V = s->chunks > 1 ? s->chunks : 1;
    for (int k = 0; k < s->stages && st == GP_OK; k++)
        for (int v = 0; v < V && st == GP_OK; v++) st = check_cell(s, k, v, seen, where);
    free(seen);
    if (st == GP_OK) st = check_links(s, where);
    if (st == GP_OK) st = gp_schedule_replay(s, capacity, NULL, NULL, NULL, NULL, where);
    return st;
}
