/* The replay engine: plays a schedule stage by stage with bounded FIFO mailboxes, which proves
 * it deadlock-free (the validator's last check) and, given per-cell times and bytes, gives each
 * stage's busy and idle time, the step time, the bubble and each stage's peak activation memory
 * (the simulator). */
#include "plan/replay.h"

#include <stdlib.h>
#include <string.h>

/* One direction of one link: M messages in order; a mailbox of `capacity` holds those sent and
 * not yet taken. */
typedef struct channel {
    int sent, taken;
    int *mb;        /* (M) micro-batch of each message */
    double *arrive; /* (M) when message j can be received */
    double *took;   /* (M) when message j left the mailbox */
} channel;

typedef struct stage_state {
    int pc;
    double clock;
    int in_flight;
    uint64_t stash; /* activation bytes held between forward and backward */
    uint64_t chunk_stash[GP_SCHEDULE_MAX_CHUNKS]; /* each of its cells' part of stash */
} stage_state;

/* A new peak of stage x's activations: the stash plus `top` bytes of its chunk v. */
static void note_peak(const stage_state *x, int chunks, int v, uint64_t top, gp_sim_stage *r) {
    if (!r || x->stash + top <= r->peak_act_bytes) return;
    r->peak_act_bytes = x->stash + top;
    memcpy(r->peak_chunk_bytes, x->chunk_stash, (size_t)chunks * sizeof *x->chunk_stash);
    r->peak_chunk_bytes[v] += top;
}

/* Adds (sign 1) or takes (-1) n bytes of chunk v to or from the stage's stash. */
static void stash_move(stage_state *x, int v, int sign, uint64_t n) {
    if (sign > 0) {
        x->stash += n;
        x->chunk_stash[v] += n;
    } else {
        x->stash -= n;
        x->chunk_stash[v] -= n;
    }
}

/* Channels between the C cells: act[c] carries cell c -> c+1, grad[c] carries cell c+1 -> c,
 * c in 0..C-2. c: the acting cell. */
static channel *chan_of(channel *chans, int C, gp_action_kind kind, int c) {
    switch (kind) {
    case GP_ACT_SEND_ACT: return &chans[c];
    case GP_ACT_RECV_ACT: return &chans[c - 1];
    case GP_ACT_SEND_GRAD: return &chans[(C - 1) + (c - 1)];
    case GP_ACT_RECV_GRAD: return &chans[(C - 1) + c];
    default: return NULL;
    }
}

static bool can_run(const gp_action *a, channel *ch, int capacity) {
    if (!ch) return true;
    if (a->kind == GP_ACT_SEND_ACT || a->kind == GP_ACT_SEND_GRAD)
        return ch->sent - ch->taken < capacity;
    return ch->taken < ch->sent;
}

/* Why stage k is blocked, for the deadlock message. */
static int blocked_str(const gp_schedule *s, int k, const stage_state *st, char *buf, size_t n) {
    char act[48];
    const gp_action *a = &s->stage[k].a[st[k].pc];
    gp_action_str(*a, act, sizeof act);
    bool send = a->kind == GP_ACT_SEND_ACT || a->kind == GP_ACT_SEND_GRAD;
    const int c = gp_schedule_cell(s, k, a->chunk);
    int peer, chunk;
    gp_schedule_place(s, (a->kind == GP_ACT_SEND_ACT || a->kind == GP_ACT_RECV_GRAD) ? c + 1 : c - 1,
                      &peer, &chunk);
    return snprintf(buf, n, "stage %d at action %d %s waits for stage %d (%s)", k, st[k].pc, act,
                    peer, send ? "mailbox full" : "nothing sent yet");
}

static gp_status deadlock(const gp_schedule *s, int capacity, const stage_state *st,
                          gp_schedule_fault *where) {
    char why[600];
    size_t len = 0;
    int first = -1;
    why[0] = '\0';
    for (int k = 0; k < s->stages; k++) {
        if (st[k].pc >= s->stage[k].n) continue;
        if (first < 0) first = k;
        if (len < sizeof why) {
            len += (size_t)snprintf(why + len, sizeof why - len, "%s", first == k ? "" : "; ");
            if (len < sizeof why) len += (size_t)blocked_str(s, k, st, why + len, sizeof why - len);
        }
    }
    return gp_schedule_fault_error(s, first, st[first].pc, where,
                                   "deadlock with mailboxes of capacity %d: every stage with "
                                   "actions left is blocked: %s",
                                   capacity, why);
}

gp_status gp_schedule_replay(const gp_schedule *s, int capacity, const gp_sim_cell *cells,
                             const gp_sim_opts *o, gp_sim_stage *stages, gp_sim_result *out,
                             gp_schedule_fault *where) {
    const int K = s->stages, M = s->micro_batches, C = gp_schedule_cells(s);
    const int chunks = s->chunks > 1 ? s->chunks : 1;
    int nch = 2 * (C - 1);
    double latency = o ? o->latency : 0;
    channel *chans = calloc((size_t)(nch > 0 ? nch : 1), sizeof *chans);
    stage_state *st = calloc((size_t)K, sizeof *st);
    int *mbs = malloc((size_t)(nch > 0 ? nch : 1) * (size_t)M * sizeof *mbs);
    double *times = malloc((size_t)(nch > 0 ? nch : 1) * 2 * (size_t)M * sizeof *times);
    gp_status status = GP_OK;
    if (!chans || !st || !mbs || !times) {
        status = gp_error(GP_OUT_OF_MEMORY, "schedule: no memory to replay");
        goto done;
    }
    for (int c = 0; c < nch; c++) {
        chans[c].mb = mbs + (size_t)c * (size_t)M;
        chans[c].arrive = times + (size_t)c * 2 * (size_t)M;
        chans[c].took = chans[c].arrive + M;
    }
    if (stages) memset(stages, 0, (size_t)K * sizeof *stages);
    long remaining = 0;
    for (int k = 0; k < K; k++) remaining += s->stage[k].n;
    /* Each stage runs until it blocks, in turn. With one sender and one receiver per mailbox
     * and fixed per-stage orders this is a Kahn network: whether it deadlocks, and every time
     * computed here, do not depend on the order stages are visited in. */
    while (remaining > 0) {
        long progress = 0;
        for (int k = 0; k < K; k++) {
            stage_state *x = &st[k];
            while (x->pc < s->stage[k].n) {
                const gp_action *a = &s->stage[k].a[x->pc];
                /* the optimizer step is the stage's: its first cell's figure stands for it */
                const int cell = gp_schedule_cell(s, k, a->kind == GP_ACT_OPTIMIZER_STEP ? 0 : a->chunk);
                channel *ch = chan_of(chans, C, a->kind, cell);
                if (!can_run(a, ch, capacity)) break;
                const gp_sim_cell *c = cells ? &cells[cell] : NULL;
                const gp_remat remat = !o ? GP_REMAT_CELL : o->cell_remat ? o->cell_remat[cell] : o->remat;
                gp_sim_stage *r = stages ? &stages[k] : NULL;
                double dur = 0;
                switch (a->kind) {
                case GP_ACT_FORWARD:
                    dur = !c ? 0 : c->fwd_mb ? c->fwd_mb[a->mb] : c->fwd_time;
                    x->in_flight++;
                    if (c)
                        stash_move(x, a->chunk, 1,
                                   c->in_bytes + (remat == GP_REMAT_NONE ? c->state_bytes : 0));
                    break;
                case GP_ACT_BACKWARD:
                case GP_ACT_BACKWARD_INPUT: {
                    const bool split = a->kind == GP_ACT_BACKWARD_INPUT;
                    double re = !c || remat != GP_REMAT_CELL ? 0
                                : c->recompute_mb                        ? c->recompute_mb[a->mb]
                                                                         : c->fwd_time;
                    const double whole = !c ? 0 : c->bwd_mb ? c->bwd_mb[a->mb] : c->bwd_time;
                    const double wgt = !c || !split ? 0 : c->wgt_mb ? c->wgt_mb[a->mb] : c->wgt_time;
                    dur = whole - wgt + re;
                    if (r) r->recompute += re;
                    /* CELL rebuilds one micro-batch's full state on top of the stash; a split
                     * backward ends holding, beside it, what its weight parts read */
                    const uint64_t top = !c ? 0
                                         : (remat == GP_REMAT_CELL ? c->state_bytes : 0) +
                                               (split ? c->keep_bytes : 0);
                    if (c) note_peak(x, chunks, a->chunk, top, r);
                    x->in_flight--;
                    if (c)
                        stash_move(x, a->chunk, -1,
                                   (split ? 0 : c->in_bytes) +
                                       (remat == GP_REMAT_NONE ? c->state_bytes : 0));
                    /* split: the input and what the weight parts read stay to the weight part */
                    if (c && split) stash_move(x, a->chunk, 1, c->keep_bytes);
                    break;
                }
                case GP_ACT_BACKWARD_WEIGHT:
                    dur = !c ? 0 : c->wgt_mb ? c->wgt_mb[a->mb] : c->wgt_time;
                    if (c) stash_move(x, a->chunk, -1, c->in_bytes + c->keep_bytes);
                    break;
                case GP_ACT_OPTIMIZER_STEP:
                    for (int v = 0; cells && v < (s->chunks > 1 ? s->chunks : 1); v++)
                        dur += cells[gp_schedule_cell(s, k, v)].opt_time;
                    break;
                case GP_ACT_SEND_ACT:
                case GP_ACT_SEND_GRAD: {
                    int j = ch->sent;
                    if (j >= capacity && ch->took[j - capacity] > x->clock)
                        x->clock = ch->took[j - capacity];
                    ch->mb[j] = a->mb;
                    ch->arrive[j] = x->clock + latency;
                    ch->sent++;
                    break;
                }
                case GP_ACT_RECV_ACT:
                case GP_ACT_RECV_GRAD: {
                    int j = ch->taken;
                    if (ch->mb[j] != a->mb) {
                        status = gp_schedule_fault_error(
                            s, k, x->pc, where,
                            "the next message in its mailbox is for micro-batch %d", ch->mb[j]);
                        goto done;
                    }
                    if (ch->arrive[j] > x->clock) x->clock = ch->arrive[j];
                    ch->took[j] = x->clock;
                    ch->taken++;
                    break;
                }
                default: break;
                }
                x->clock += dur;
                if (r) {
                    r->busy += dur;
                    if (x->in_flight > r->peak_in_flight) r->peak_in_flight = x->in_flight;
                    note_peak(x, chunks, 0, 0, r);
                }
                x->pc++;
                progress++;
                remaining--;
            }
        }
        if (remaining > 0 && progress == 0) {
            status = deadlock(s, capacity, st, where);
            goto done;
        }
    }
    double step = 0;
    for (int k = 0; k < K; k++)
        if (st[k].clock > step) step = st[k].clock;
    double idle = 0;
    for (int k = 0; stages && k < K; k++) {
        stages[k].end = st[k].clock;
        stages[k].idle = step - stages[k].busy;
        idle += stages[k].idle;
    }
    if (out) {
        out->step_time = step;
        out->bubble = step > 0 ? idle / ((double)K * step) : 0;
    }
done:
    free(chans);
    free(st);
    free(mbs);
    free(times);
    return status;
}
