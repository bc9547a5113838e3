/* The schedule validator: the per-stage rules, the FIFO matching of each link's messages, then a
 * replay (replay.c) that proves the schedule deadlock-free with bounded mailboxes. */
#include "pipeline/schedule.h"

#include <stdlib.h>

#define FAULT(...) gp_schedule_fault_error(s, k, i, where, __VA_ARGS__)

/* Per-stage rules. seen[kind][mb]: index of the action of that kind for mb on this stage. */
static gp_status check_stage(const gp_schedule *s, int k, int *seen, gp_schedule_fault *where) {
    int K = s->stages, M = s->micro_batches;
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
        if (step_at >= 0)
            return FAULT("comes after OPTIMIZER_STEP (action %d); the step must be the stage's "
                         "last action",
                         step_at);
        if ((int)a.kind < 0 || a.kind >= GP_ACT_NKINDS) return FAULT("unknown action kind");
        if (a.kind != GP_ACT_OPTIMIZER_STEP && (m < 0 || m >= M))
            return FAULT("micro-batch %d is outside 0..%d", m, M - 1);
        if (a.kind != GP_ACT_OPTIMIZER_STEP && seen[a.kind * M + m] >= 0)
            return FAULT("micro-batch %d already had this action at action %d; each happens "
                         "exactly once per stage",
                         m, seen[a.kind * M + m]);
        switch (a.kind) {
        case GP_ACT_FORWARD:
            if (k > 0 && ra[m] < 0)
                return FAULT("needs RECV_ACT(%d) before it (its input comes from stage %d)", m,
                             k - 1);
            break;
        case GP_ACT_BACKWARD:
        case GP_ACT_BACKWARD_INPUT:
            if (fwd[m] < 0) return FAULT("comes before FORWARD(%d) on this stage", m);
            if ((a.kind == GP_ACT_BACKWARD ? bi[m] : bwd[m]) >= 0)
                return FAULT("micro-batch %d already had %s at action %d; a backward runs whole "
                             "or split, once",
                             m, a.kind == GP_ACT_BACKWARD ? "BACKWARD_INPUT" : "BACKWARD",
                             a.kind == GP_ACT_BACKWARD ? bi[m] : bwd[m]);
            if (m != next_bwd)
                return FAULT("backwards must run in micro-batch order 0..%d on every stage "
                             "(gradients accumulate in that order, for bitwise-identical "
                             "results); expected %s(%d) here",
                             M - 1, a.kind == GP_ACT_BACKWARD ? "BACKWARD" : "BACKWARD_INPUT",
                             next_bwd);
            if (k < K - 1 && rg[m] < 0)
                return FAULT("needs RECV_GRAD(%d) before it (its output gradient comes from "
                             "stage %d)",
                             m, k + 1);
            next_bwd++;
            break;
        case GP_ACT_BACKWARD_WEIGHT:
            if (bi[m] < 0)
                return FAULT("comes before BACKWARD_INPUT(%d), whose output gradients it reads", m);
            if (m != next_wgt)
                return FAULT("weight gradients must run in micro-batch order 0..%d on every "
                             "stage (they accumulate in that order); expected "
                             "BACKWARD_WEIGHT(%d) here",
                             M - 1, next_wgt);
            next_wgt++;
            break;
        case GP_ACT_SEND_ACT:
            if (k == K - 1)
                return FAULT("the last stage has no next stage to send activations to");
            if (fwd[m] < 0) return FAULT("comes before FORWARD(%d), which produces it", m);
            break;
        case GP_ACT_RECV_ACT:
            if (k == 0)
                return FAULT("the first stage reads the inputs; it receives no activations");
            break;
        case GP_ACT_SEND_GRAD:
            if (k == 0) return FAULT("the first stage has no previous stage to send gradients to");
            if (bwd[m] < 0 && bi[m] < 0)
                return FAULT("comes before BACKWARD(%d), which produces it", m);
            break;
        case GP_ACT_RECV_GRAD:
            if (k == K - 1)
                return FAULT("the last stage computes the loss inside BACKWARD; it receives no "
                             "gradients");
            break;
        case GP_ACT_OPTIMIZER_STEP:
            for (int j = 0; j < M; j++) {
                if (fwd[j] < 0) return FAULT("comes before FORWARD(%d), which is missing", j);
                if (bwd[j] < 0 && bi[j] < 0)
                    return FAULT("comes before BACKWARD(%d), which is missing", j);
                if (bi[j] >= 0 && bw[j] < 0)
                    return FAULT("comes before BACKWARD_WEIGHT(%d), which is missing (the split "
                                 "backward's weight gradients)",
                                 j);
                if (k < K - 1 && sa[j] < 0)
                    return FAULT("comes before SEND_ACT(%d), which is missing (stage %d needs "
                                 "every micro-batch's activation)",
                                 j, k + 1);
                if (k > 0 && sg[j] < 0)
                    return FAULT("comes before SEND_GRAD(%d), which is missing (stage %d needs "
                                 "every micro-batch's gradient)",
                                 j, k - 1);
            }
            step_at = i;
            break;
        default:
            break;
        }
        if (a.kind != GP_ACT_OPTIMIZER_STEP) seen[a.kind * M + m] = i;
    }
    if (step_at < 0) {
        int i = st->n;
        return FAULT("the list ends without an OPTIMIZER_STEP");
    }
    return GP_OK;
}

/* The j-th message of one direction of a link: the mb of the j-th action of `kind` on stage k,
 * and that action's index. Returns -1 past the end. */
static int nth_of_kind(const gp_stage_actions *st, gp_action_kind kind, int j, int *index) {
    for (int i = 0; i < st->n; i++)
        if (st->a[i].kind == kind && j-- == 0) {
            *index = i;
            return st->a[i].mb;
        }
    return -1;
}

/* The first receive on stage k (of `recv`, fed by `send` on stage from) that would take a
 * message for another micro-batch: mailboxes deliver in send order. Sets *at to its index, or
 * leaves it when none. */
static void first_mismatch(const gp_schedule *s, int k, int from, gp_action_kind recv,
                           gp_action_kind send, int *at, int *got, int *pos) {
    for (int j = 0; j < s->micro_batches; j++) {
        int ri = 0, si = 0;
        int rm = nth_of_kind(&s->stage[k], recv, j, &ri);
        int sm = nth_of_kind(&s->stage[from], send, j, &si);
        if (rm != sm) {
            if (ri < *at) *at = ri, *got = sm, *pos = j;
            return;
        }
    }
}

static gp_status check_links(const gp_schedule *s, gp_schedule_fault *where) {
    int K = s->stages;
    for (int k = 0; k < K; k++) {
        int i = s->stage[k].n + 1, got = 0, pos = 0, from = 0;
        if (k > 0) {
            first_mismatch(s, k, k - 1, GP_ACT_RECV_ACT, GP_ACT_SEND_ACT, &i, &got, &pos);
            if (i <= s->stage[k].n) from = k - 1;
        }
        if (k < K - 1) {
            int before = i;
            first_mismatch(s, k, k + 1, GP_ACT_RECV_GRAD, GP_ACT_SEND_GRAD, &i, &got, &pos);
            if (i != before) from = k + 1;
        }
        if (i <= s->stage[k].n) {
            const char *what = from < k ? "SEND_ACT" : "SEND_GRAD";
            return FAULT("takes message #%d from stage %d, which is %s(%d): mailboxes deliver in "
                         "send order, so receives must follow stage %d's sends",
                         pos, from, what, got, from);
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
    for (int k = 0; k < s->stages && st == GP_OK; k++) st = check_stage(s, k, seen, where);
    free(seen);
    if (st == GP_OK) st = check_links(s, where);
    if (st == GP_OK) st = gp_schedule_replay(s, capacity, NULL, NULL, NULL, NULL, where);
    return st;
}
