/* The learning-curve SVG of `gpipe train --curve`. Private to tools/. */
#ifndef GP_TOOLS_CURVE_SVG_H
#define GP_TOOLS_CURVE_SVG_H

#include <stdbool.h>

#include "gpipe.h"

typedef struct gp_cli_series {
    const char *name;   /* legend text */
    const char *color;  /* an SVG color, e.g. "#1f77b4" */
    const double *x, *y; /* n points; a non-finite x or y leaves a gap */
    int n;
    bool right;   /* on the right value axis */
    bool markers; /* a dot at every point (evaluations) */
} gp_cli_series;

typedef struct gp_cli_curve {
    const char *title, *x_label, *left_label, *right_label;
    const gp_cli_series *series;
    int nseries;
} gp_cli_curve;

/* Writes the curve to path atomically (gp_file_out); an axis with no finite value gets [0, 1],
 * a constant one a band around its value. Errors name the path. */
gp_status gp_cli_curve_write(const char *path, const gp_cli_curve *c);

#endif
