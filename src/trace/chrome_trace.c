/* --trace FILE.json: the recorded timeline in Chrome's Trace Event Format (one track per stage),
 * for Perfetto and chrome://tracing. Events are streamed one per line, each rendered by cJSON so
 * that labels are escaped correctly, then the file is committed atomically. */
#include <cjson/cJSON.h>
#include <stdlib.h>
#include <string.h>

#include "trace/chrome_trace.h"

/* "F3", "B3", "R3", "W3" for computation (chunk 1's "F3b", 2's "F3c", ...); "send 3",
 * "optimizer" ... (or the label) for the rest. */
static void event_name(const gp_trace_event *e, char *buf, size_t n) {
    static const char letter[GP_TRACE_NKINDS] = {'F', 'B', 'R', 0, 0, 0, 0, 'W'};
    const char *base = e->label[0] ? e->label : gp_trace_kind_name(e->kind);
    char chunk[2] = {e->chunk > 0 && e->chunk < 26 ? (char)('a' + e->chunk) : '\0', '\0'};
    if (letter[e->kind] && e->micro_batch >= 0)
        snprintf(buf, n, "%c%d%s", letter[e->kind], e->micro_batch, chunk);
    else if (e->micro_batch >= 0)
        snprintf(buf, n, "%s %d%s", base, e->micro_batch, chunk);
    else
        snprintf(buf, n, "%s", base);
}

/* Renders obj unformatted, appends it (with sep before it) and deletes obj. */
static bool emit(gp_file_out *o, cJSON *obj, const char *sep) {
    char *text = obj ? cJSON_PrintUnformatted(obj) : NULL;
    cJSON_Delete(obj);
    if (!text) return false;
    gp_file_out_write(o, sep);
    gp_file_out_write(o, text);
    cJSON_free(text);
    return true;
}

static cJSON *metadata(const char *name, int tid, const char *key, const char *sval, int ival) {
    cJSON *m = cJSON_CreateObject();
    cJSON *args = cJSON_CreateObject();
    if (!m || !args) {
        cJSON_Delete(m);
        cJSON_Delete(args);
        return NULL;
    }
    cJSON_AddStringToObject(m, "name", name);
    cJSON_AddStringToObject(m, "ph", "M");
    cJSON_AddNumberToObject(m, "pid", 0);
    cJSON_AddNumberToObject(m, "tid", tid);
    if (sval) cJSON_AddStringToObject(args, key, sval);
    else cJSON_AddNumberToObject(args, key, ival);
    cJSON_AddItemToObject(m, "args", args);
    return m;
}

static cJSON *complete_event(const gp_trace_event *e) {
    cJSON *x = cJSON_CreateObject();
    cJSON *args = cJSON_CreateObject();
    if (!x || !args) {
        cJSON_Delete(x);
        cJSON_Delete(args);
        return NULL;
    }
    char name[GP_TRACE_LABEL_NBYTES + 16];
    event_name(e, name, sizeof name);
    cJSON_AddStringToObject(x, "name", name);
    cJSON_AddStringToObject(x, "cat", gp_trace_kind_name(e->kind));
    cJSON_AddStringToObject(x, "ph", "X");
    cJSON_AddNumberToObject(x, "ts", e->t_begin * 1e6);
    cJSON_AddNumberToObject(x, "dur", (e->t_end - e->t_begin) * 1e6);
    cJSON_AddNumberToObject(x, "pid", 0);
    cJSON_AddNumberToObject(x, "tid", e->stage);
    cJSON_AddNumberToObject(args, "micro_batch", e->micro_batch);
    if (e->chunk) cJSON_AddNumberToObject(args, "chunk", e->chunk);
    if (e->label[0]) cJSON_AddStringToObject(args, "label", e->label);
    cJSON_AddItemToObject(x, "args", args);
    return x;
}

/* The run's description, kept beside the events (viewers ignore otherData). */
static cJSON *other_data(const gp_trace *t, const gp_trace_stats *st) {
    cJSON *d = cJSON_CreateObject();
    if (!d) return NULL;
    cJSON_AddNumberToObject(d, "stages", t->stages);
    cJSON_AddNumberToObject(d, "micro_batches", t->micro_batches);
    cJSON_AddStringToObject(d, "schedule", t->schedule);
    cJSON_AddStringToObject(d, "remat", t->remat);
    cJSON_AddNumberToObject(d, "bubble_measured", st->bubble);
    cJSON_AddNumberToObject(d, "bubble_theory", st->bubble_theory);
    if (t->bubble_simulated >= 0.0)
        cJSON_AddNumberToObject(d, "bubble_simulated", t->bubble_simulated);
    return d;
}

gp_status gp_trace_write_chrome(const gp_trace *t, const char *path) {
    gp_trace_stats st;
    GP_TRY(gp_trace_measure(t, NULL, &st));
    gp_file_out o;
    GP_TRY(gp_file_out_open(&o, path));
    bool ok = true;
    gp_file_out_write(&o, "{\"traceEvents\":[\n");
    ok = ok && emit(&o, metadata("process_name", 0, "name", "gpipe", 0), "");
    for (int k = 0; ok && k < t->stages; k++) {
        char track[32];
        gp_trace_track_name(t, k, track, sizeof track);
        ok = emit(&o, metadata("thread_name", k, "name", track, 0), ",\n") &&
             emit(&o, metadata("thread_sort_index", k, "sort_index", NULL, k), ",\n");
    }
    for (int k = 0; ok && k < t->stages; k++)
        for (int i = 0; ok && i < t->stage[k].n; i++) {
            const gp_trace_event *e = &t->stage[k].ev[i];
            if (e->t_end < e->t_begin) continue; /* still open: no duration to show */
            ok = emit(&o, complete_event(e), ",\n");
        }
    if (ok) {
        gp_file_out_write(&o, "\n],\"displayTimeUnit\":\"ms\",\"otherData\":");
        ok = emit(&o, other_data(t, &st), "");
        gp_file_out_write(&o, "}\n");
    }
    if (!ok) {
        gp_file_out_close(&o, false);
        return gp_error(GP_OUT_OF_MEMORY, "cannot write '%s': out of host memory rendering JSON",
                        path);
    }
    return gp_file_out_close(&o, true);
}
