/* The learning curve of `gpipe train --curve FILE.svg`: series of (step, value) points drawn as
 * polylines over a step axis, with a left value axis and optionally a right one, ticks at 1, 2
 * and 5 times powers of ten, and a legend; one self-contained SVG file (no script, no external
 * style), written atomically so a curve refreshed during a run is never seen half-written. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "curve_svg.h"
#include "gpipe.h"

enum { W = 860, H = 460, LEFT = 78, RIGHT = 78, TOP = 44, BOTTOM = 58 };

typedef struct axis {
    double lo, hi;
    bool used;
} axis;

static void widen(axis *a, double v) {
    if (!isfinite(v)) return;
    if (!a->used) {
        a->lo = a->hi = v;
        a->used = true;
    }
    if (v < a->lo) a->lo = v;
    if (v > a->hi) a->hi = v;
}

/* A span that is never empty: a constant series gets a band around its value. */
static void pad(axis *a) {
    if (!a->used) a->lo = 0, a->hi = 1;
    if (a->hi - a->lo <= 1e-12 * fmax(1.0, fabs(a->hi))) {
        double d = fabs(a->hi) > 0 ? 0.05 * fabs(a->hi) : 0.5;
        a->lo -= d;
        a->hi += d;
    }
}

/* Tick spacing: 1, 2 or 5 times a power of ten giving about `want` ticks. */
static double tick_step(double span, int want) {
    double raw = span / want, p = pow(10.0, floor(log10(raw))), m = raw / p;
    return (m < 1.5 ? 1 : m < 3.5 ? 2 : m < 7.5 ? 5 : 10) * p;
}

static double px_x(const axis *a, double v) { return LEFT + (v - a->lo) / (a->hi - a->lo) * (W - LEFT - RIGHT); }
static double px_y(const axis *a, double v) { return H - BOTTOM - (v - a->lo) / (a->hi - a->lo) * (H - TOP - BOTTOM); }

static void text_escaped(gp_file_out *o, const char *s) {
    for (; *s; s++) {
        switch (*s) {
        case '<': gp_file_out_write(o, "&lt;"); break;
        case '>': gp_file_out_write(o, "&gt;"); break;
        case '&': gp_file_out_write(o, "&amp;"); break;
        case '"': gp_file_out_write(o, "&quot;"); break;
        default: gp_file_out_printf(o, "%c", *s);
        }
    }
}

static void ticks(gp_file_out *o, const axis *a, bool vertical, bool right) {
    const double step = tick_step(a->hi - a->lo, vertical ? 6 : 8);
    for (double v = ceil(a->lo / step) * step; v <= a->hi + 1e-9 * step; v += step) {
        double shown = fabs(v) < 1e-12 * step ? 0 : v;
        if (!vertical) {
            double x = px_x(a, v);
            gp_file_out_printf(o, "<line x1='%.1f' y1='%d' x2='%.1f' y2='%d' stroke='#ddd'/>\n", x, TOP, x, H - BOTTOM);
            gp_file_out_printf(o, "<text x='%.1f' y='%d' text-anchor='middle'>%g</text>\n", x, H - BOTTOM + 18, shown);
        } else {
            double y = px_y(a, v);
            if (!right)
                gp_file_out_printf(o, "<line x1='%d' y1='%.1f' x2='%d' y2='%.1f' stroke='#ddd'/>\n", LEFT, y, W - RIGHT, y);
            gp_file_out_printf(o, "<text x='%d' y='%.1f' text-anchor='%s'>%g</text>\n",
                               right ? W - RIGHT + 6 : LEFT - 6, y + 4, right ? "start" : "end", shown);
        }
    }
}

gp_status gp_cli_curve_write(const char *path, const gp_cli_curve *c) {
    axis ax = {.used = false}, ay[2] = {{.used = false}, {.used = false}};
    for (int i = 0; i < c->nseries; i++) {
        const gp_cli_series *s = &c->series[i];
        for (int j = 0; j < s->n; j++)
            if (isfinite(s->x[j]) && isfinite(s->y[j])) {
                widen(&ax, s->x[j]);
                widen(&ay[s->right ? 1 : 0], s->y[j]);
            }
    }
    pad(&ax);
    pad(&ay[0]);
    pad(&ay[1]);
    gp_file_out o;
    gp_status st = gp_file_out_open(&o, path);
    if (st != GP_OK) return st;
    gp_file_out_printf(&o, "<?xml version='1.0' encoding='UTF-8'?>\n"
                           "<svg xmlns='http://www.w3.org/2000/svg' width='%d' height='%d' "
                           "viewBox='0 0 %d %d' font-family='sans-serif' font-size='12'>\n"
                           "<rect width='%d' height='%d' fill='white'/>\n", W, H, W, H, W, H);
    gp_file_out_printf(&o, "<text x='%d' y='24' font-size='15' font-weight='bold'>", LEFT);
    text_escaped(&o, c->title ? c->title : "");
    gp_file_out_write(&o, "</text>\n");
    ticks(&o, &ax, false, false);
    ticks(&o, &ay[0], true, false);
    if (ay[1].used) ticks(&o, &ay[1], true, true);
    gp_file_out_printf(&o, "<rect x='%d' y='%d' width='%d' height='%d' fill='none' stroke='#444'/>\n",
                       LEFT, TOP, W - LEFT - RIGHT, H - TOP - BOTTOM);
    gp_file_out_printf(&o, "<text x='%d' y='%d' text-anchor='middle'>", (W + LEFT - RIGHT) / 2, H - 14);
    text_escaped(&o, c->x_label ? c->x_label : "step");
    gp_file_out_printf(&o, "</text>\n<text transform='translate(18,%d) rotate(-90)' text-anchor='middle'>",
                       (H + TOP - BOTTOM) / 2);
    text_escaped(&o, c->left_label ? c->left_label : "");
    gp_file_out_write(&o, "</text>\n");
    if (ay[1].used) {
        gp_file_out_printf(&o, "<text transform='translate(%d,%d) rotate(90)' text-anchor='middle'>",
                           W - 16, (H + TOP - BOTTOM) / 2);
        text_escaped(&o, c->right_label ? c->right_label : "");
        gp_file_out_write(&o, "</text>\n");
    }
    for (int i = 0; i < c->nseries; i++) {
        const gp_cli_series *s = &c->series[i];
        const axis *a = &ay[s->right ? 1 : 0];
        /* One polyline per run of finite points: a NaN or infinite value leaves a gap. */
        bool open = false;
        for (int j = 0; j <= s->n; j++) {
            bool ok = j < s->n && isfinite(s->x[j]) && isfinite(s->y[j]);
            if (ok && !open) {
                gp_file_out_printf(&o, "<polyline class='series%d' fill='none' stroke='%s' stroke-width='%s' points='",
                                   i, s->color, s->markers ? "2" : "1.2");
                open = true;
            }
            if (ok) gp_file_out_printf(&o, "%.1f,%.1f ", px_x(&ax, s->x[j]), px_y(a, s->y[j]));
            if (!ok && open) {
                gp_file_out_write(&o, "'/>\n");
                open = false;
            }
        }
        if (s->markers)
            for (int j = 0; j < s->n; j++)
                if (isfinite(s->x[j]) && isfinite(s->y[j]))
                    gp_file_out_printf(&o, "<circle cx='%.1f' cy='%.1f' r='3.5' fill='%s'/>\n",
                                       px_x(&ax, s->x[j]), px_y(a, s->y[j]), s->color);
        /* Legend, top right inside the plot, with the last finite value. */
        double last = NAN;
        for (int j = s->n - 1; j >= 0 && !isfinite(last); j--)
            if (isfinite(s->y[j])) last = s->y[j];
        const int ly = TOP + 18 + 18 * i, lx = W - RIGHT - 250;
        gp_file_out_printf(&o, "<line x1='%d' y1='%d' x2='%d' y2='%d' stroke='%s' stroke-width='3'/>\n",
                           lx, ly - 4, lx + 22, ly - 4, s->color);
        gp_file_out_printf(&o, "<text x='%d' y='%d'>", lx + 28, ly);
        text_escaped(&o, s->name);
        if (isfinite(last)) gp_file_out_printf(&o, " (last %.4g)", last);
        gp_file_out_printf(&o, "%s</text>\n", s->right ? " [right axis]" : "");
    }
    gp_file_out_write(&o, "</svg>\n");
    return gp_file_out_close(&o, true);
}
