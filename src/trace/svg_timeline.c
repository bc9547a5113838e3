/* --timeline FILE.svg: the recorded timeline as a self-contained SVG picture: one row per stage,
 * one box per event coloured by kind with its micro-batch number, idle time left blank so the
 * bubble shows, a legend, a time axis in ms and a title with the measured and theoretical bubble. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "trace/svg_timeline.h"

/* Layout in SVG user units (px). Computation fills the upper part of a row; transfers and waits
 * are a thin strip under it, so a short send never hides the box it follows. */
enum {
    WIDTH = 1200,
    LEFT = 110,  /* stage names and busy fractions */
    RIGHT = 24,
    TITLE_Y = 26,
    LEGEND_Y = 44,
    ROWS_TOP = 74,
    ROW_H = 40,
    ROW_GAP = 8,
    BOX_TOP = 3,   /* computation boxes: [BOX_TOP, BOX_TOP + BOX_H) within the row */
    BOX_H = 25,
    STRIP_TOP = 31,
    STRIP_H = 7,
    AXIS_GAP = 10,
    BOTTOM = 52,
};

static const char *const fill[GP_TRACE_NKINDS] = {
    "#4e79a7", "#f28e2b", "#b07aa1", "#59a14f", "#59a14f", "#bab0ac", "#e15759", "#edc948",
};
static const char *const ink[GP_TRACE_NKINDS] = {
    "#ffffff", "#1a1a1a", "#ffffff", "#ffffff", "#ffffff", "#1a1a1a", "#ffffff", "#1a1a1a",
};
#define ROW_FILL "#f3f3f3"
#define SKIP_FILL "#9c755f" /* transfers that carry skips beside the activation */
#define FONT "font-family=\"DejaVu Sans, Verdana, Arial, sans-serif\""

static bool is_strip(gp_trace_kind k) {
    return k == GP_TRACE_SEND || k == GP_TRACE_RECV || k == GP_TRACE_WAIT;
}

static bool carries_skips(const gp_trace_event *e) {
    return is_strip(e->kind) && strstr(e->label, GP_TRACE_SKIP_MARK) != NULL;
}

/* Writes s as XML character data / attribute text: markup characters as entities, and control
 * characters that XML 1.0 does not allow as '?'. */
static void put_escaped(gp_file_out *o, const char *s) {
    char buf[256];
    size_t n = 0;
    for (; *s; s++) {
        const char *rep = NULL;
        char one[2] = {*s, 0};
        switch (*s) {
        case '&': rep = "&amp;"; break;
        case '<': rep = "&lt;"; break;
        case '>': rep = "&gt;"; break;
        case '"': rep = "&quot;"; break;
        case '\'': rep = "&apos;"; break;
        default:
            if ((unsigned char)*s < 0x20 && *s != '\t' && *s != '\n' && *s != '\r') one[0] = '?';
            rep = one;
        }
        size_t len = strlen(rep);
        if (n + len >= sizeof buf) {
            buf[n] = '\0';
            gp_file_out_write(o, buf);
            n = 0;
        }
        memcpy(buf + n, rep, len);
        n += len;
    }
    buf[n] = '\0';
    gp_file_out_write(o, buf);
}

/* A tick step of 1, 2 or 5 times a power of ten giving about `target` ticks over span. */
static double tick_step(double span, int target) {
    double raw = span / target;
    double mag = pow(10.0, floor(log10(raw)));
    double norm = raw / mag;
    return (norm < 1.5 ? 1.0 : norm < 3.0 ? 2.0 : norm < 7.0 ? 5.0 : 10.0) * mag;
}

static void title_line(gp_file_out *o, const gp_trace *t, const gp_trace_stats *st, int nev) {
    char head[96];
    snprintf(head, sizeof head, "K = %d stage%s, M = %d micro-batch%s", t->stages,
             t->stages == 1 ? "" : "s", t->micro_batches, t->micro_batches == 1 ? "" : "es");
    gp_file_out_printf(o, "<text x=\"%d\" y=\"%d\" font-size=\"16\" font-weight=\"bold\" %s>%s",
                        LEFT, TITLE_Y, FONT, head);
    if (t->schedule[0]) {
        gp_file_out_write(o, ", ");
        put_escaped(o, t->schedule);
    }
    if (t->chunks > 1) gp_file_out_printf(o, " (V = %d)", t->chunks);
    if (t->remat[0]) {
        gp_file_out_write(o, ", remat ");
        put_escaped(o, t->remat);
    }
    if (nev == 0)
        gp_file_out_write(o, ": no events recorded");
    else
        gp_file_out_printf(o, ": bubble measured %.2f, theory %.2f", st->bubble,
                            st->bubble_theory);
    if (nev && t->bubble_simulated >= 0.0)
        gp_file_out_printf(o, ", simulated %.2f", t->bubble_simulated);
    gp_file_out_write(o, "</text>\n");
}

/* weights: whether the trace has split backwards (then "backward" is their input part); skips:
 * whether transfers carry skips. */
static void legend(gp_file_out *o, bool weights, bool skips) {
    /* each kind in its colour of fill[]; the idle row's (-1) last */
    static const struct {
        const char *name;
        int kind;
    } items[] = {
        {"forward", GP_TRACE_FORWARD}, {"backward", GP_TRACE_BACKWARD},
        {"weight gradients", GP_TRACE_WEIGHT}, {"recompute", GP_TRACE_RECOMPUTE},
        {"send/recv", GP_TRACE_SEND}, {"wait", GP_TRACE_WAIT},
        {"optimizer", GP_TRACE_OPTIMIZER}, {"idle (bubble)", -1},
        {"send/recv with skips", GP_TRACE_NKINDS},
    };
    int x = LEFT;
    gp_file_out_printf(o, "<g id=\"legend\" font-size=\"12\" %s>\n", FONT);
    for (size_t i = 0; i < sizeof items / sizeof items[0]; i++) {
        const int kind = items[i].kind;
        if (!weights && kind == GP_TRACE_WEIGHT) continue;
        if (!skips && kind == GP_TRACE_NKINDS) continue;
        const bool skip = kind == GP_TRACE_NKINDS;
        /* the kinds drawn as thin strips in the rows are strips in the legend too */
        int h = skip || (kind >= 0 && is_strip((gp_trace_kind)kind)) ? 6 : 14;
        gp_file_out_printf(o,
                            "<rect x=\"%d\" y=\"%d\" width=\"14\" height=\"%d\" fill=\"%s\" "
                            "stroke=\"#888888\" stroke-width=\"0.5\"/>"
                            "<text x=\"%d\" y=\"%d\">%s</text>\n",
                            x, LEGEND_Y + 14 - h, h,
                            skip ? SKIP_FILL : kind >= 0 ? fill[kind] : ROW_FILL, x + 19,
                            LEGEND_Y + 11, items[i].name);
        x += 19 + 7 * (int)strlen(items[i].name) + 22;
    }
    gp_file_out_write(o, "</g>\n");
}

static void event_box(gp_file_out *o, const gp_trace_event *e, double x0, double scale,
                      double t0, int row_y) {
    double x = x0 + (e->t_begin - t0) * scale;
    double w = (e->t_end - e->t_begin) * scale;
    if (w < 0.5) w = 0.5; /* keep very short events visible */
    bool strip = is_strip(e->kind);
    int y = row_y + (strip ? STRIP_TOP : BOX_TOP);
    int h = strip ? STRIP_H : BOX_H;
    gp_file_out_printf(o, "<rect x=\"%.2f\" y=\"%d\" width=\"%.2f\" height=\"%d\" fill=\"%s\"",
                        x, y, w, h, carries_skips(e) ? SKIP_FILL : fill[e->kind]);
    if (!strip) gp_file_out_write(o, " stroke=\"#ffffff\" stroke-width=\"0.6\"");
    gp_file_out_printf(o, "><title>stage %d %s", e->stage, gp_trace_kind_name(e->kind));
    if (e->micro_batch >= 0) gp_file_out_printf(o, " micro-batch %d", e->micro_batch);
    if (e->chunk > 0) gp_file_out_printf(o, " chunk %d", e->chunk);
    if (e->label[0]) {
        gp_file_out_write(o, " (");
        put_escaped(o, e->label);
        gp_file_out_write(o, ")");
    }
    gp_file_out_printf(o, ": %.3f to %.3f ms</title></rect>\n", (e->t_begin - t0) * 1e3,
                        (e->t_end - t0) * 1e3);
    if (strip) return;
    char text[16] = "";
    if (e->micro_batch >= 0 && e->chunk > 0 && e->chunk < 26)
        snprintf(text, sizeof text, "%d%c", e->micro_batch, 'a' + e->chunk);
    else if (e->micro_batch >= 0)
        snprintf(text, sizeof text, "%d", e->micro_batch);
    else if (e->kind == GP_TRACE_OPTIMIZER) snprintf(text, sizeof text, "opt");
    double need = 7.0 * (double)strlen(text) + 4.0; /* about 7 px a glyph at 12 px */
    if (text[0] && w >= need)
        gp_file_out_printf(o,
                            "<text x=\"%.2f\" y=\"%d\" fill=\"%s\" font-size=\"12\" "
                            "text-anchor=\"middle\">%s</text>\n",
                            x + w / 2, y + BOX_H / 2 + 4, ink[e->kind], text);
}

static void axis(gp_file_out *o, double span, double x0, double plot_w, int y) {
    double span_ms = span * 1e3;
    double step = tick_step(span_ms, 10);
    int decimals = step >= 1.0 ? 0 : (int)ceil(-log10(step) - 1e-9);
    gp_file_out_printf(o, "<g id=\"axis\" font-size=\"11\" %s fill=\"#333333\">\n", FONT);
    gp_file_out_printf(o,
                        "<line x1=\"%.2f\" y1=\"%d\" x2=\"%.2f\" y2=\"%d\" stroke=\"#333333\" "
                        "stroke-width=\"1\"/>\n",
                        x0, y, x0 + plot_w, y);
    for (int i = 0;; i++) {
        double v = i * step;
        if (v > span_ms * (1.0 + 1e-9)) break;
        double x = x0 + v / span_ms * plot_w;
        gp_file_out_printf(o,
                            "<line x1=\"%.2f\" y1=\"%d\" x2=\"%.2f\" y2=\"%d\" stroke=\"#333333\"/>"
                            "<text x=\"%.2f\" y=\"%d\" text-anchor=\"middle\">%.*f</text>\n",
                            x, y, x, y + 5, x, y + 18, decimals, v);
    }
    gp_file_out_printf(o, "<text x=\"%.2f\" y=\"%d\" text-anchor=\"middle\">time (ms)</text>\n",
                        x0 + plot_w / 2, y + 36);
    gp_file_out_write(o, "</g>\n");
}

static bool trace_has_skips(const gp_trace *t) {
    for (int k = 0; k < t->stages; k++)
        for (int i = 0; i < t->stage[k].n; i++)
            if (carries_skips(&t->stage[k].ev[i])) return true;
    return false;
}

static bool ss_has_weights(const gp_trace_stage_stats *ss, int stages) {
    for (int k = 0; k < stages; k++)
        if (ss[k].by_kind[GP_TRACE_WEIGHT] > 0) return true;
    return false;
}

gp_status gp_trace_write_svg(const gp_trace *t, const char *path) {
    gp_trace_stats st;
    GP_TRY(gp_trace_measure(t, NULL, &st));
    gp_trace_stage_stats *ss = calloc((size_t)t->stages, sizeof *ss);
    if (!ss) return gp_error(GP_OUT_OF_MEMORY, "cannot write '%s': out of host memory", path);
    gp_status s = gp_trace_measure(t, ss, &st);
    if (s != GP_OK) {
        free(ss);
        return s;
    }
    int nev = 0;
    for (int k = 0; k < t->stages; k++) nev += ss[k].nevents;
    gp_file_out o;
    s = gp_file_out_open(&o, path);
    if (s != GP_OK) {
        free(ss);
        return s;
    }
    const int rows_h = t->stages * (ROW_H + ROW_GAP) - ROW_GAP;
    const int axis_y = ROWS_TOP + rows_h + AXIS_GAP;
    const int height = axis_y + BOTTOM;
    const double plot_w = WIDTH - LEFT - RIGHT;
    const double span = st.span > 0.0 ? st.span : 1e-3; /* empty trace: a 1 ms axis */
    const double scale = plot_w / span;

    gp_file_out_printf(&o,
                        "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n"
                        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%d\" height=\"%d\" "
                        "viewBox=\"0 0 %d %d\">\n"
                        "<rect x=\"0\" y=\"0\" width=\"%d\" height=\"%d\" fill=\"#ffffff\"/>\n",
                        WIDTH, height, WIDTH, height, WIDTH, height);
    title_line(&o, t, &st, nev);
    legend(&o, ss_has_weights(ss, t->stages), trace_has_skips(t));
    for (int k = 0; k < t->stages; k++) {
        int y = ROWS_TOP + k * (ROW_H + ROW_GAP);
        gp_file_out_printf(&o, "<g id=\"stage%d\" %s>\n", k, FONT);
        char name[32];
        gp_trace_track_name(t, k, name, sizeof name);
        gp_file_out_printf(&o,
                            "<text x=\"%d\" y=\"%d\" font-size=\"13\" text-anchor=\"end\">%s"
                            "</text>\n<text x=\"%d\" y=\"%d\" font-size=\"10\" "
                            "text-anchor=\"end\" fill=\"#666666\">busy %.0f%%</text>\n",
                            LEFT - 10, y + 17, name, LEFT - 10, y + 31,
                            st.span > 0.0 ? 100.0 * ss[k].busy / st.span : 0.0);
        gp_file_out_printf(&o,
                            "<rect x=\"%d\" y=\"%d\" width=\"%.2f\" height=\"%d\" fill=\"%s\"/>\n",
                            LEFT, y, plot_w, ROW_H, ROW_FILL);
        /* Waits first, so that anything recorded over them is drawn on top. */
        for (int pass = 0; pass < 2; pass++)
            for (int i = 0; i < t->stage[k].n; i++) {
                const gp_trace_event *e = &t->stage[k].ev[i];
                if (e->t_end < e->t_begin || (e->kind == GP_TRACE_WAIT) != (pass == 0)) continue;
                event_box(&o, e, LEFT, scale, st.t0, y);
            }
        gp_file_out_write(&o, "</g>\n");
    }
    axis(&o, span, LEFT, plot_w, axis_y);
    gp_file_out_write(&o, "</svg>\n");
    free(ss);
    return gp_file_out_close(&o, true);
}
