/* Schedules as data: building action lists, the GPipe and 1F1B generators, and text rendering
 * (actions, stages, and the message that points at a faulty action). The validator
 * (validate.c) and the replay engine (replay.c) build on this file; it calls neither. */
#include "plan/schedule.h"

#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"

static const char *const kind_names[GP_ACT_NKINDS] = {
    "FORWARD",   "BACKWARD",  "SEND_ACT",       "RECV_ACT",       "SEND_GRAD",
    "RECV_GRAD", "OPTIMIZER_STEP", "BACKWARD_INPUT", "BACKWARD_WEIGHT"};
static const char *const kind_short[GP_ACT_NKINDS] = {"F",  "B",    "SA", "RA", "SG",
                                                      "RG", "STEP", "BI", "W"};

gp_status gp_schedule_init_chunks(gp_schedule *s, int stages, int micro_batches, int chunks,
                                  gp_placement placement) {
    if (!s) return gp_error(GP_INVALID_ARGUMENT, "schedule: NULL output");
    memset(s, 0, sizeof *s);
    if (stages < 1)
        return gp_error(GP_INVALID_ARGUMENT, "schedule: K = %d stages, expected >= 1", stages);
    if (micro_batches < 1)
        return gp_error(GP_INVALID_ARGUMENT, "schedule: M = %d micro-batches, expected >= 1",
                        micro_batches);
    if (chunks < 1 || chunks > GP_SCHEDULE_MAX_CHUNKS || (placement == GP_PLACE_V_SHAPE && chunks != 2) ||
        (placement != GP_PLACE_LOOP && placement != GP_PLACE_V_SHAPE))
        return gp_error(GP_INVALID_ARGUMENT,
                        "schedule: V = %d cells per stage placed %s; expected 1 to 64 in a loop, "
                        "or 2 in a V",
                        chunks, placement == GP_PLACE_LOOP ? "in a loop" : "in a V");
    s->stage = calloc((size_t)stages, sizeof *s->stage);
    if (!s->stage) return gp_error(GP_OUT_OF_MEMORY, "schedule: no memory for %d stages", stages);
    s->stages = stages;
    s->micro_batches = micro_batches;
    s->chunks = chunks;
    s->placement = placement;
    snprintf(s->name, sizeof s->name, "custom");
    return GP_OK;
}

gp_status gp_schedule_init(gp_schedule *s, int stages, int micro_batches) {
    return gp_schedule_init_chunks(s, stages, micro_batches, 1, GP_PLACE_LOOP);
}

int gp_schedule_cells(const gp_schedule *s) {
    return s->stages * (s->chunks > 1 ? s->chunks : 1);
}

int gp_schedule_cell(const gp_schedule *s, int k, int chunk) {
    if (s->placement == GP_PLACE_V_SHAPE && chunk % 2 == 1)
        return chunk * s->stages + (s->stages - 1 - k);
    return chunk * s->stages + k;
}

void gp_schedule_place(const gp_schedule *s, int cell, int *k, int *chunk) {
    *chunk = cell / s->stages;
    *k = cell % s->stages;
    if (s->placement == GP_PLACE_V_SHAPE && *chunk % 2 == 1) *k = s->stages - 1 - *k;
}

gp_status gp_schedule_push(gp_schedule *s, int k, gp_action_kind kind, int mb) {
    return gp_schedule_push_chunk(s, k, 0, kind, mb);
}

gp_status gp_schedule_push_chunk(gp_schedule *s, int k, int chunk, gp_action_kind kind, int mb) {
    if (!s || !s->stage || k < 0 || k >= s->stages)
        return gp_error(GP_INVALID_ARGUMENT, "schedule: push to stage %d of %d", k,
                        s ? s->stages : 0);
    gp_stage_actions *st = &s->stage[k];
    if (st->n == st->cap) {
        int cap = st->cap ? 2 * st->cap : 16;
        gp_action *a = realloc(st->a, (size_t)cap * sizeof *a);
        if (!a) return gp_error(GP_OUT_OF_MEMORY, "schedule: no memory for %d actions", cap);
        st->a = a;
        st->cap = cap;
    }
    st->a[st->n++] = (gp_action){.kind = kind, .mb = mb, .chunk = chunk};
    return GP_OK;
}

void gp_schedule_free(gp_schedule *s) {
    if (!s) return;
    for (int k = 0; s->stage && k < s->stages; k++) free(s->stage[k].a);
    free(s->stage);
    memset(s, 0, sizeof *s);
}

/* ------------------------------------------------------------ generators */

/* The stage of cell c (-1 outside the cells). */
static int stage_of(const gp_schedule *s, int c) {
    int k, v;
    if (c < 0 || c >= gp_schedule_cells(s)) return -1;
    gp_schedule_place(s, c, &k, &v);
    return k;
}

/* A forward of stage k's chunk v with its receive before and its send after, as its cell
 * needs them (the first cell reads the inputs, the last sends nothing). A message between two
 * cells of one stage is taken back at once, right after its send: left in the stage's own
 * mailbox while the stage sends more, it would fill it and block the stage for good. */
static gp_status push_forward_chunk(gp_schedule *s, int k, int v, int m) {
    const int c = gp_schedule_cell(s, k, v), last = gp_schedule_cells(s) - 1;
    if (c > 0 && stage_of(s, c - 1) != k) GP_TRY(gp_schedule_push_chunk(s, k, v, GP_ACT_RECV_ACT, m));
    GP_TRY(gp_schedule_push_chunk(s, k, v, GP_ACT_FORWARD, m));
    if (c < last) GP_TRY(gp_schedule_push_chunk(s, k, v, GP_ACT_SEND_ACT, m));
    if (c < last && stage_of(s, c + 1) == k) {
        int kn, vn;
        gp_schedule_place(s, c + 1, &kn, &vn);
        GP_TRY(gp_schedule_push_chunk(s, k, vn, GP_ACT_RECV_ACT, m));
    }
    return GP_OK;
}

/* The last cell computes the loss inside BACKWARD, so it receives no gradient. kind: BACKWARD,
 * or BACKWARD_INPUT for a split one. */
static gp_status push_backward_chunk(gp_schedule *s, int k, int v, int m, gp_action_kind kind) {
    const int c = gp_schedule_cell(s, k, v), last = gp_schedule_cells(s) - 1;
    if (c < last && stage_of(s, c + 1) != k)
        GP_TRY(gp_schedule_push_chunk(s, k, v, GP_ACT_RECV_GRAD, m));
    GP_TRY(gp_schedule_push_chunk(s, k, v, kind, m));
    if (c > 0) GP_TRY(gp_schedule_push_chunk(s, k, v, GP_ACT_SEND_GRAD, m));
    if (c > 0 && stage_of(s, c - 1) == k) {
        int kp, vp;
        gp_schedule_place(s, c - 1, &kp, &vp);
        GP_TRY(gp_schedule_push_chunk(s, k, vp, GP_ACT_RECV_GRAD, m));
    }
    return GP_OK;
}

static gp_status push_forward(gp_schedule *s, int k, int m) {
    return push_forward_chunk(s, k, 0, m);
}

static gp_status push_backward_kind(gp_schedule *s, int k, int m, gp_action_kind kind) {
    return push_backward_chunk(s, k, 0, m, kind);
}

static gp_status push_backward(gp_schedule *s, int k, int m) {
    return push_backward_kind(s, k, m, GP_ACT_BACKWARD);
}

static gp_status gen_gpipe(gp_schedule *s) {
    for (int k = 0; k < s->stages; k++) {
        for (int m = 0; m < s->micro_batches; m++) GP_TRY(push_forward(s, k, m));
        /* Backwards in micro-batch order (not reversed): gradients accumulate 0..M-1. */
        for (int m = 0; m < s->micro_batches; m++) GP_TRY(push_backward(s, k, m));
        GP_TRY(gp_schedule_push(s, k, GP_ACT_OPTIMIZER_STEP, -1));
    }
    return GP_OK;
}

static gp_status gen_1f1b(gp_schedule *s) {
    int K = s->stages, M = s->micro_batches;
    for (int k = 0; k < K; k++) {
        int warm = K - k - 1 < M ? K - k - 1 : M;
        for (int m = 0; m < warm; m++) GP_TRY(push_forward(s, k, m));
        for (int i = 0; i < M - warm; i++) {
            GP_TRY(push_forward(s, k, warm + i));
            GP_TRY(push_backward(s, k, i));
        }
        for (int m = M - warm; m < M; m++) GP_TRY(push_backward(s, k, m));
        GP_TRY(gp_schedule_push(s, k, GP_ACT_OPTIMIZER_STEP, -1));
    }
    return GP_OK;
}

/* Zero-bubble schedules by list scheduling at unit costs (see schedule.h): ZB-H1 (one cell per
 * stage) and ZBV (two cells per stage in a V). Time advances in units; whenever a stage is free
 * it runs, in this order of preference, the next input backward of one of its cells whose
 * output gradient is there (bounds allowing), the next forward whose input is there (bounds
 * allowing), the next weight part. in_cap: a stage's most micro-batches (summed over its
 * cells) between forward and input backward, less k on stage k when tapered (1F1B's K - k);
 * wcap: each cell's most between input backward and weight part. Among a stage's cells, `order` gives the preference (first: most preferred).
 * A cell sends a message only while fewer than `capacity` of its earlier ones on that link
 * wait for their receiver (whose receive comes right before the forward or input backward that
 * reads it), so that no send ever blocks: with the stages' orders fixed, the schedule is then
 * deadlock-free at that capacity, whatever the times. done[(c * 3 + part) * M + m]: the time
 * cell c finished part (0 forward, 1 input backward, 2 weight) of micro-batch m, or -1. */
typedef struct list_sched {
    int in_cap;
    bool tapered;
    int wcap;
    int capacity; /* 0: no bound on messages waiting */
    int order[2]; /* chunks of a stage, most preferred first */
} list_sched;

static gp_status gen_list(gp_schedule *s, const list_sched *ls) {
    const int K = s->stages, M = s->micro_batches, C = gp_schedule_cells(s);
    const int V = s->chunks > 1 ? s->chunks : 1;
    long *done = malloc((size_t)C * 3 * (size_t)M * sizeof *done);
    int *next = calloc((size_t)C * 3, sizeof *next); /* next[c * 3 + part]: next micro-batch */
    long *free_at = calloc((size_t)K, sizeof *free_at);
    gp_status st = GP_OK;
    if (!done || !next || !free_at) {
        st = gp_error(GP_OUT_OF_MEMORY, "schedule %s: no memory for K = %d, M = %d", s->name, K,
                      M);
        goto out;
    }
    for (size_t i = 0; i < (size_t)C * 3 * (size_t)M; i++) done[i] = -1;
#define DONE(c, part, m) done[((size_t)(c) * 3 + (part)) * (size_t)M + (size_t)(m)]
#define READY(c, part, m, t) (DONE(c, part, m) >= 0 && DONE(c, part, m) <= (t))
    long left = 3L * C * M;
    for (long t = 0; left > 0 && st == GP_OK; t++) {
        for (int k = 0; k < K && st == GP_OK; k++) {
            if (free_at[k] > t) continue;
            const int cap = ls->tapered && ls->in_cap > K - k ? K - k : ls->in_cap;
            int in_flight = 0;
            for (int v = 0; v < V; v++) {
                const int c = gp_schedule_cell(s, k, v);
                in_flight += next[c * 3] - next[c * 3 + 1];
            }
            int part = -1, cell = -1;
            for (int pass = 0; pass < 3 && part < 0; pass++)
                for (int j = 0; j < V && part < 0; j++) {
                    const int v = V > 1 ? ls->order[j] : 0, c = gp_schedule_cell(s, k, v);
                    const int nf = next[c * 3], nb = next[c * 3 + 1], nw = next[c * 3 + 2];
                    /* messages sent on and not yet received: gradients down, activations up */
                    const bool grad_room = !ls->capacity || c == 0 || stage_of(s, c - 1) == k ||
                                           nb - next[(c - 1) * 3 + 1] < ls->capacity;
                    const bool act_room = !ls->capacity || c == C - 1 ||
                                          stage_of(s, c + 1) == k ||
                                          nf - next[(c + 1) * 3] < ls->capacity;
                    if (pass == 0 && nb < nf && nb - nw < ls->wcap && grad_room &&
                        (c == C - 1 ? READY(c, 0, nb, t) : READY(c + 1, 1, nb, t)))
                        part = 1, cell = c;
                    else if (pass == 1 && nf < M && in_flight < cap && act_room &&
                             (c == 0 || READY(c - 1, 0, nf, t)))
                        part = 0, cell = c;
                    else if (pass == 2 && nw < nb)
                        part = 2, cell = c;
                }
            if (part < 0) continue;
            int k_, v;
            gp_schedule_place(s, cell, &k_, &v);
            const int m = next[cell * 3 + part]++;
            DONE(cell, part, m) = t + 1;
            free_at[k] = t + 1;
            left--;
            st = part == 0 ? push_forward_chunk(s, k, v, m)
                 : part == 1 ? push_backward_chunk(s, k, v, m, GP_ACT_BACKWARD_INPUT)
                             : gp_schedule_push_chunk(s, k, v, GP_ACT_BACKWARD_WEIGHT, m);
        }
        if (t > 64L * (3L * C * M + K) && left > 0) /* a bound the rules above never reach */
            st = gp_error(GP_INTERNAL, "schedule %s (K = %d, M = %d): list scheduling stalled",
                          s->name, K, M);
    }
#undef READY
#undef DONE
    for (int k = 0; k < K && st == GP_OK; k++)
        st = gp_schedule_push(s, k, GP_ACT_OPTIMIZER_STEP, -1);
out:
    free(done);
    free(next);
    free(free_at);
    return st;
}

/* ZB-H1: 1F1B's bound of min(K - k, M) micro-batches between forward and input backward on
 * stage k, up to min(K, M) waiting for their weight parts. */
static gp_status gen_zbh1(gp_schedule *s) {
    const int K = s->stages, M = s->micro_batches;
    const list_sched ls = {.in_cap = K < M ? K : M, .tapered = true, .wcap = K < M ? K : M};
    return gen_list(s, &ls);
}

/* ZBV: two cells per stage in a V, each half a 1F1B cell: every stage may hold 2K micro-batches
 * of half cells between forward and input backward (1F1B's first stage's memory, on every
 * stage), each cell up to min(K, M) waiting for their weight parts; input backwards of the cell
 * nearer the model's end first (the V's second leg), forwards of the first leg first. */
static gp_status gen_zbv(gp_schedule *s) {
    const int K = s->stages, M = s->micro_batches;
    const list_sched ls = {.in_cap = 2 * (K < M ? K : M),
                           .wcap = K < M ? K : M,
                           .capacity = GP_MAILBOX_CAPACITY,
                           .order = {1, 0}};
    return gen_list(s, &ls);
}

/* Interleaved 1F1B (see schedule.h). The i-th forward of a stage runs chunk (i / K) mod V of
 * micro-batch (i / (K V)) K + i mod K; the i-th backward the same micro-batch of chunk
 * V - 1 - (i / K) mod V. */
static gp_status gen_interleaved(gp_schedule *s) {
    const int K = s->stages, M = s->micro_batches, V = s->chunks, total = M * V;
    if (M % K != 0)
        return gp_error(GP_INVALID_ARGUMENT,
                        "schedule interleaved: M = %d micro-batches is not a multiple of K = %d "
                        "stages (the chunks run in rounds of K micro-batches)",
                        M, K);
    for (int k = 0; k < K; k++) {
        int warm = (K - k - 1) * 2 + (V - 1) * K;
        if (warm > total) warm = total;
#define MB_OF(i) (((i) / (K * V)) * K + (i) % K)
#define FWD(i) push_forward_chunk(s, k, ((i) / K) % V, MB_OF(i))
#define BWD(i) push_backward_chunk(s, k, V - 1 - ((i) / K) % V, MB_OF(i), GP_ACT_BACKWARD)
        for (int i = 0; i < warm; i++) GP_TRY(FWD(i));
        for (int i = 0; i < total - warm; i++) {
            GP_TRY(FWD(warm + i));
            GP_TRY(BWD(i));
        }
        for (int i = total - warm; i < total; i++) GP_TRY(BWD(i));
#undef BWD
#undef FWD
#undef MB_OF
        GP_TRY(gp_schedule_push(s, k, GP_ACT_OPTIMIZER_STEP, -1));
    }
    return GP_OK;
}

static gp_status generate_chunks(const char *name, gp_status (*gen)(gp_schedule *), int K, int M,
                                 int V, gp_placement place, gp_schedule *out) {
    GP_TRY(gp_schedule_init_chunks(out, K, M, V, place));
    snprintf(out->name, sizeof out->name, "%s", name);
    gp_status st = gen(out);
    if (st != GP_OK) gp_schedule_free(out);
    return st;
}

static gp_status generate(const char *name, gp_status (*gen)(gp_schedule *), int K, int M,
                          gp_schedule *out) {
    GP_TRY(gp_schedule_init(out, K, M));
    snprintf(out->name, sizeof out->name, "%s", name);
    gp_status st = gen(out);
    if (st != GP_OK) gp_schedule_free(out);
    return st;
}

gp_status gp_schedule_gpipe(int stages, int micro_batches, gp_schedule *out) {
    return generate("gpipe", gen_gpipe, stages, micro_batches, out);
}

gp_status gp_schedule_1f1b(int stages, int micro_batches, gp_schedule *out) {
    return generate("1f1b", gen_1f1b, stages, micro_batches, out);
}

gp_status gp_schedule_zbh1(int stages, int micro_batches, gp_schedule *out) {
    return generate("zbh1", gen_zbh1, stages, micro_batches, out);
}

gp_status gp_schedule_zbv(int stages, int micro_batches, gp_schedule *out) {
    return generate_chunks("zbv", gen_zbv, stages, micro_batches, 2, GP_PLACE_V_SHAPE, out);
}

gp_status gp_schedule_interleaved(int stages, int micro_batches, int chunks, gp_schedule *out) {
    return generate_chunks("interleaved", gen_interleaved, stages, micro_batches, chunks,
                           GP_PLACE_LOOP, out);
}

bool gp_schedule_kind_splits(gp_schedule_kind kind) {
    return kind == GP_SCHEDULE_ZBH1 || kind == GP_SCHEDULE_ZBV;
}

gp_status gp_schedule_kind_chunks(gp_schedule_kind kind, int chunks, int *out) {
    const int dflt = kind == GP_SCHEDULE_INTERLEAVED || kind == GP_SCHEDULE_ZBV ? 2 : 1;
    *out = chunks > 0 ? chunks : dflt;
    const bool ok = kind == GP_SCHEDULE_INTERLEAVED ? *out >= 1 && *out <= 64 : *out == dflt;
    if (!ok)
        return gp_error(GP_INVALID_ARGUMENT,
                        "schedule %s with %d cells per stage (chunks); expected %s",
                        gp_schedule_kind_name(kind), chunks,
                        kind == GP_SCHEDULE_INTERLEAVED ? "1 to 64"
                        : kind == GP_SCHEDULE_ZBV       ? "2 (its V)"
                                                        : "1 (only interleaved and zbv run several)");
    return GP_OK;
}

const char *gp_schedule_kind_name(gp_schedule_kind s) {
    return s == GP_SCHEDULE_GPIPE         ? "gpipe"
           : s == GP_SCHEDULE_1F1B        ? "1f1b"
           : s == GP_SCHEDULE_ZBH1        ? "zbh1"
           : s == GP_SCHEDULE_INTERLEAVED ? "interleaved"
           : s == GP_SCHEDULE_ZBV         ? "zbv"
                                          : "?";
}

gp_status gp_schedule_kind_parse(const char *name, gp_schedule_kind *kind) {
    if (!name || !kind)
        return gp_error(GP_INVALID_ARGUMENT, "gp_schedule_kind_parse: name or kind is NULL");
    for (int k = GP_SCHEDULE_GPIPE; k <= GP_SCHEDULE_ZBV; k++)
        if (strcmp(name, gp_schedule_kind_name((gp_schedule_kind)k)) == 0) {
            *kind = (gp_schedule_kind)k;
            return GP_OK;
        }
    return gp_error(GP_INVALID_ARGUMENT,
                    "schedule '%s': unknown; expected gpipe, 1f1b, zbh1, interleaved or zbv", name);
}

gp_status gp_schedule_generate(gp_schedule_kind kind, int stages, int micro_batches, int chunks,
                               gp_schedule *out) {
    if ((unsigned)kind > GP_SCHEDULE_ZBV)
        return gp_error(GP_INVALID_ARGUMENT,
                        "schedule %d: expected gpipe (%d), 1f1b (%d), zbh1 (%d), interleaved (%d) "
                        "or zbv (%d)",
                        (int)kind, GP_SCHEDULE_GPIPE, GP_SCHEDULE_1F1B, GP_SCHEDULE_ZBH1,
                        GP_SCHEDULE_INTERLEAVED, GP_SCHEDULE_ZBV);
    int V;
    GP_TRY(gp_schedule_kind_chunks(kind, chunks, &V));
    switch (kind) {
    case GP_SCHEDULE_GPIPE: return gp_schedule_gpipe(stages, micro_batches, out);
    case GP_SCHEDULE_1F1B: return gp_schedule_1f1b(stages, micro_batches, out);
    case GP_SCHEDULE_ZBH1: return gp_schedule_zbh1(stages, micro_batches, out);
    case GP_SCHEDULE_ZBV: return gp_schedule_zbv(stages, micro_batches, out);
    default: return gp_schedule_interleaved(stages, micro_batches, V, out);
    }
}

/* ------------------------------------------------------------ text */

char *gp_action_str(gp_action a, char *buf, size_t n) {
    if ((int)a.kind < 0 || a.kind >= GP_ACT_NKINDS)
        snprintf(buf, n, "UNKNOWN_KIND_%d(%d)", (int)a.kind, a.mb);
    else if (a.kind == GP_ACT_OPTIMIZER_STEP)
        snprintf(buf, n, "%s", kind_names[a.kind]);
    else if (a.chunk != 0)
        snprintf(buf, n, "%s(%d, chunk %d)", kind_names[a.kind], a.mb, a.chunk);
    else
        snprintf(buf, n, "%s(%d)", kind_names[a.kind], a.mb);
    return buf;
}

static void append(char *buf, size_t n, size_t *len, const char *text) {
    if (*len >= n) return;
    int w = snprintf(buf + *len, n - *len, "%s", text);
    *len += (size_t)(w > 0 ? w : 0);
}

static void short_str(gp_action a, char *tok, size_t n) {
    if ((int)a.kind < 0 || a.kind >= GP_ACT_NKINDS)
        snprintf(tok, n, "?%d", a.mb);
    else if (a.kind == GP_ACT_OPTIMIZER_STEP)
        snprintf(tok, n, "STEP");
    else if (a.chunk != 0) /* chunk 1 as "F3b", 2 as "F3c": "F3" is chunk 0's */
        snprintf(tok, n, "%s%d%c", kind_short[a.kind], a.mb,
                 a.chunk > 0 && a.chunk < 26 ? 'a' + a.chunk : '?');
    else
        snprintf(tok, n, "%s%d", kind_short[a.kind], a.mb);
}

/* Actions [from, to) of stage k, with action `mark` in brackets (mark < 0: none). */
static char *range_str(const gp_schedule *s, int k, int from, int to, int mark, char *buf,
                       size_t n) {
    size_t len = 0;
    buf[0] = '\0';
    const gp_stage_actions *st = &s->stage[k];
    if (from > 0) append(buf, n, &len, "... ");
    for (int i = from; i < to && i < st->n; i++) {
        char tok[40];
        short_str(st->a[i], tok, sizeof tok);
        if (i > from) append(buf, n, &len, " ");
        if (i == mark) append(buf, n, &len, "[");
        append(buf, n, &len, tok);
        if (i == mark) append(buf, n, &len, "]");
    }
    if (mark >= st->n) append(buf, n, &len, from < st->n ? " [end]" : "[end]");
    else if (to < st->n) append(buf, n, &len, " ...");
    if (len >= n && n > 4) memcpy(buf + n - 4, "...", 4);
    return buf;
}

char *gp_schedule_stage_str(const gp_schedule *s, int k, char *buf, size_t n) {
    if (!buf || n == 0) return buf;
    if (!s || !s->stage || k < 0 || k >= s->stages) {
        snprintf(buf, n, "(no stage %d)", k);
        return buf;
    }
    return range_str(s, k, 0, s->stage[k].n, -1, buf, n);
}

void gp_schedule_print(const gp_schedule *s, FILE *f) {
    if (!s || !s->stage || !f) return;
    if (s->chunks > 1)
        fprintf(f, "schedule %s: K = %d stages, M = %d micro-batches, V = %d cells per stage "
                   "(chunk 1's actions marked b, 2's c, ...)\n",
                s->name, s->stages, s->micro_batches, s->chunks);
    else
        fprintf(f, "schedule %s: K = %d stages, M = %d micro-batches\n", s->name, s->stages,
                s->micro_batches);
    for (int k = 0; k < s->stages; k++) {
        const gp_stage_actions *st = &s->stage[k];
        fprintf(f, "stage %d:", k);
        for (int i = 0; i < st->n; i++) {
            char tok[40];
            short_str(st->a[i], tok, sizeof tok);
            fprintf(f, " %s", tok);
        }
        fprintf(f, "\n");
    }
}

/* Here rather than in validate.c: it renders the stage around the action (range_str), and the
 * replay engine reports its faults with it too. */
gp_status gp_schedule_fault_error(const gp_schedule *s, int k, int i, gp_schedule_fault *where,
                                  const char *fmt, ...) {
    char why[640], act[48], ctx[200];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(why, sizeof why, fmt, ap);
    va_end(ap);
    const gp_stage_actions *st = &s->stage[k];
    if (i < st->n)
        gp_action_str(st->a[i], act, sizeof act);
    else
        snprintf(act, sizeof act, "(end of list)");
    int from = i - 6 > 0 ? i - 6 : 0;
    range_str(s, k, from, i + 4, i, ctx, sizeof ctx);
    if (where) *where = (gp_schedule_fault){.stage = k, .index = i};
    return gp_error(GP_INVALID_ARGUMENT, "schedule %s (K = %d, M = %d): stage %d, action %d %s: %s "
                    "[stage %d: %s]",
                    s->name, s->stages, s->micro_batches, k, i, act, why, k, ctx);
}
