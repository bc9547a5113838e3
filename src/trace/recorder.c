/* Timeline recording: per-stage growable event buffers filled without locks by each stage's own
 * thread, and the busy/idle/bubble measure over them. (Both writers write through gp_file_out.) */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "trace/recorder.h"

static const char *const kind_names[GP_TRACE_NKINDS] = {
    "forward", "backward", "recompute", "send", "recv", "wait", "optimizer", "weight",
};

const char *gp_trace_kind_name(gp_trace_kind kind) {
    return (unsigned)kind < GP_TRACE_NKINDS ? kind_names[kind] : "unknown";
}

gp_status gp_trace_init(gp_trace *t, int stages, int micro_batches) {
    memset(t, 0, sizeof *t);
    if (stages < 1)
        return gp_error(GP_INVALID_ARGUMENT, "trace: stages must be >= 1, got %d", stages);
    if (micro_batches < 1)
        return gp_error(GP_INVALID_ARGUMENT, "trace: micro-batches must be >= 1, got %d",
                        micro_batches);
    t->stage = calloc((size_t)stages, sizeof *t->stage);
    if (!t->stage)
        return gp_error(GP_OUT_OF_MEMORY, "trace: cannot allocate %d stage buffers", stages);
    t->stages = stages;
    t->micro_batches = micro_batches;
    t->bubble_simulated = -1.0;
    t->origin = gp_now();
    return GP_OK;
}

void gp_trace_free(gp_trace *t) {
    if (t->stage)
        for (int k = 0; k < t->stages; k++) free(t->stage[k].ev);
    free(t->stage);
    memset(t, 0, sizeof *t);
}

void gp_trace_track_name(const gp_trace *t, int k, char *buf, size_t n) {
    const int K = t->stages_per_replica, T = t->shards_per_stage > 1 ? t->shards_per_stage : 1;
    char shard[24] = "";
    if (T > 1) snprintf(shard, sizeof shard, " t%d", k % T);
    const int ks = k / T; /* the stage's index among every replica's stages */
    if (K > 0 && K * T < t->stages)
        snprintf(buf, n, "d%d stage %d%s", ks / K, ks % K, shard);
    else
        snprintf(buf, n, "stage %d%s", ks, shard);
}

void gp_trace_reset(gp_trace *t) {
    for (int k = 0; k < t->stages; k++) {
        t->stage[k].n = 0;
        t->stage[k].nopen = 0;
        t->stage[k].chunk = 0;
    }
    t->origin = gp_now();
}

/* Copies at most n-1 bytes, never cutting a UTF-8 sequence in two (the writers emit the text
 * as JSON and XML, where a broken sequence would make the file invalid). */
static void copy_text(char *dst, size_t n, const char *src) {
    size_t len = src ? strlen(src) : 0;
    if (len >= n) {
        len = n - 1;
        while (len > 0 && ((unsigned char)src[len] & 0xC0) == 0x80) len--;
    }
    if (len) memcpy(dst, src, len);
    dst[len] = '\0';
}

void gp_trace_set_info(gp_trace *t, const char *schedule, const char *remat) {
    if (schedule) copy_text(t->schedule, sizeof t->schedule, schedule);
    if (remat) copy_text(t->remat, sizeof t->remat, remat);
}

double gp_trace_time(const gp_trace *t) {
    return gp_now() - t->origin;
}

static gp_status check_stage(const gp_trace *t, int k, const char *fn) {
    if (!t->stage)
        return gp_error(GP_INVALID_ARGUMENT, "trace: %s on a trace that was not initialized", fn);
    if (k < 0 || k >= t->stages)
        return gp_error(GP_INVALID_ARGUMENT, "trace: %s: stage %d out of range [0, %d)", fn, k,
                        t->stages);
    return GP_OK;
}

/* Appends one event to stage k's buffer (doubling it when full); returns its index in *idx. */
static gp_status push(gp_trace *t, int k, gp_trace_kind kind, int micro_batch, const char *label,
                      int *idx) {
    if ((unsigned)kind >= GP_TRACE_NKINDS)
        return gp_error(GP_INVALID_ARGUMENT, "trace: stage %d: unknown event kind %d", k,
                        (int)kind);
    if (micro_batch < -1)
        return gp_error(GP_INVALID_ARGUMENT,
                        "trace: stage %d: micro-batch must be >= 0 or -1 for none, got %d", k,
                        micro_batch);
    gp_trace_stage *s = &t->stage[k];
    if (s->n == s->cap) {
        int cap = s->cap ? s->cap * 2 : 256;
        if (cap < s->cap)
            return gp_error(GP_OUT_OF_MEMORY, "trace: stage %d: too many events (%d)", k, s->n);
        gp_trace_event *ev = realloc(s->ev, (size_t)cap * sizeof *ev);
        if (!ev)
            return gp_error(GP_OUT_OF_MEMORY, "trace: stage %d: cannot grow the buffer to %d events",
                            k, cap);
        s->ev = ev;
        s->cap = cap;
    }
    gp_trace_event *e = &s->ev[s->n];
    memset(e, 0, sizeof *e);
    e->kind = kind;
    e->stage = k;
    e->micro_batch = micro_batch;
    e->chunk = s->chunk;
    copy_text(e->label, sizeof e->label, label);
    *idx = s->n++;
    return GP_OK;
}

void gp_trace_set_chunk(gp_trace *t, int k, int chunk) {
    if (t->stage && k >= 0 && k < t->stages) t->stage[k].chunk = chunk;
}

gp_status gp_trace_begin(gp_trace *t, int k, gp_trace_kind kind, int micro_batch,
                         const char *label) {
    GP_TRY(check_stage(t, k, "begin"));
    gp_trace_stage *s = &t->stage[k];
    if (s->nopen == GP_TRACE_MAX_OPEN)
        return gp_error(GP_INVALID_ARGUMENT,
                        "trace: stage %d: begin %s(%d): already %d events open (end missing?)", k,
                        gp_trace_kind_name(kind), micro_batch, GP_TRACE_MAX_OPEN);
    int idx = 0;
    GP_TRY(push(t, k, kind, micro_batch, label, &idx));
    gp_trace_event *e = &s->ev[idx];
    e->t_begin = gp_trace_time(t);
    e->t_end = -INFINITY; /* open */
    s->open[s->nopen++] = idx;
    return GP_OK;
}

gp_status gp_trace_end(gp_trace *t, int k) {
    double now = gp_trace_time(t);
    GP_TRY(check_stage(t, k, "end"));
    gp_trace_stage *s = &t->stage[k];
    if (s->nopen == 0)
        return gp_error(GP_INVALID_ARGUMENT, "trace: stage %d: end without a matching begin", k);
    gp_trace_event *e = &s->ev[s->open[--s->nopen]];
    e->t_end = now < e->t_begin ? e->t_begin : now;
    return GP_OK;
}

gp_status gp_trace_add(gp_trace *t, int k, gp_trace_kind kind, int micro_batch, double t_begin,
                       double t_end, const char *label) {
    GP_TRY(check_stage(t, k, "add"));
    if (!isfinite(t_begin) || !isfinite(t_end) || t_end < t_begin)
        return gp_error(GP_INVALID_ARGUMENT,
                        "trace: stage %d: %s(%d): expected finite times with begin <= end, got "
                        "[%g, %g]",
                        k, gp_trace_kind_name(kind), micro_batch, t_begin, t_end);
    int idx = 0;
    GP_TRY(push(t, k, kind, micro_batch, label, &idx));
    t->stage[k].ev[idx].t_begin = t_begin;
    t->stage[k].ev[idx].t_end = t_end;
    return GP_OK;
}

const gp_trace_event *gp_trace_events(const gp_trace *t, int k, int *n) {
    if (!t->stage || k < 0 || k >= t->stages) {
        *n = 0;
        return NULL;
    }
    *n = t->stage[k].n;
    return t->stage[k].ev;
}

/* ---------------------------------------------------------------- measure */

typedef struct interval {
    double a, b;
} interval;

static int interval_cmp(const void *pa, const void *pb) {
    const interval *x = pa, *y = pb;
    if (x->a != y->a) return x->a < y->a ? -1 : 1;
    return (x->b > y->b) - (x->b < y->b);
}

static bool is_closed(const gp_trace_event *e) {
    return e->t_end >= e->t_begin;
}

/* Length of the union of busy intervals of one stage, clipped to [t0, t1]. scratch holds at
 * least the stage's event count. */
static double busy_union(const gp_trace_stage *s, double t0, double t1, interval *scratch,
                         gp_trace_stage_stats *st) {
    int n = 0;
    for (int i = 0; i < s->n; i++) {
        const gp_trace_event *e = &s->ev[i];
        if (!is_closed(e) || e->t_end < t0 || e->t_begin > t1) continue;
        double a = e->t_begin < t0 ? t0 : e->t_begin;
        double b = e->t_end > t1 ? t1 : e->t_end;
        if (st) {
            st->nevents++;
            st->by_kind[e->kind] += b - a;
        }
        if (GP_TRACE_IS_BUSY(e->kind) && b > a) scratch[n++] = (interval){a, b};
    }
    qsort(scratch, (size_t)n, sizeof *scratch, interval_cmp);
    double busy = 0.0;
    int i = 0;
    while (i < n) {
        double a = scratch[i].a, b = scratch[i].b;
        for (i++; i < n && scratch[i].a <= b; i++)
            if (scratch[i].b > b) b = scratch[i].b;
        busy += b - a;
    }
    return busy;
}

gp_status gp_trace_measure_window(const gp_trace *t, double t0, double t1,
                                  gp_trace_stage_stats *stages, gp_trace_stats *out) {
    if (!t->stage)
        return gp_error(GP_INVALID_ARGUMENT, "trace: measure on a trace that was not initialized");
    if (!isfinite(t0) || !isfinite(t1) || t1 < t0)
        return gp_error(GP_INVALID_ARGUMENT,
                        "trace: measure: expected a finite window with t0 <= t1, got [%g, %g]", t0,
                        t1);
    int most = 0;
    for (int k = 0; k < t->stages; k++)
        if (t->stage[k].n > most) most = t->stage[k].n;
    interval *scratch = malloc((size_t)(most ? most : 1) * sizeof *scratch);
    if (!scratch)
        return gp_error(GP_OUT_OF_MEMORY, "trace: measure: cannot allocate %d intervals", most);
    const double span = t1 - t0;
    double idle = 0.0;
    for (int k = 0; k < t->stages; k++) {
        gp_trace_stage_stats st;
        memset(&st, 0, sizeof st);
        st.busy = busy_union(&t->stage[k], t0, t1, scratch, &st);
        st.idle = span - st.busy;
        idle += st.idle;
        if (stages) stages[k] = st;
    }
    free(scratch);
    memset(out, 0, sizeof *out);
    out->t0 = t0;
    out->t1 = t1;
    out->span = span;
    out->bubble = span > 0.0 ? idle / ((double)t->stages * span) : 0.0;
    const int V = t->chunks > 1 ? t->chunks : 1;
    out->bubble_theory =
        (double)(t->stages - 1) / (double)(V * t->micro_batches + t->stages - 1);
    return GP_OK;
}

gp_status gp_trace_measure(const gp_trace *t, gp_trace_stage_stats *stages, gp_trace_stats *out) {
    if (!t->stage)
        return gp_error(GP_INVALID_ARGUMENT, "trace: measure on a trace that was not initialized");
    double t0 = INFINITY, t1 = -INFINITY;
    for (int k = 0; k < t->stages; k++)
        for (int i = 0; i < t->stage[k].n; i++) {
            const gp_trace_event *e = &t->stage[k].ev[i];
            if (!is_closed(e)) continue;
            if (e->t_begin < t0) t0 = e->t_begin;
            if (e->t_end > t1) t1 = e->t_end;
        }
    if (t1 < t0) t0 = t1 = 0.0; /* no closed events: an empty window */
    return gp_trace_measure_window(t, t0, t1, stages, out);
}
