/* --tta and --ensemble: a classifier's evaluation with test-time augmentation, and over several
 * models. Each test image goes through the pipeline once per view of the mode (as it is first,
 * then mirrored and/or moved by a pixel; one more batch per batch and view, the stages at once
 * as in plain evaluation), and through each member of the ensemble the same way. The plain
 * figures come from the first model's first view alone, so they are the bits an evaluation
 * without --tta gives; the augmented figures from the mean of every model's and view's softmax
 * (gp_score_views). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"

typedef struct view {
    bool flip;
    int dx, dy;
} view;

/* flip: the image and its mirror image; flip-shift: each of them as it is and moved by one
 * pixel left, right, up and down. */
static const view flip_views[] = {{false, 0, 0}, {true, 0, 0}};
static const view flip_shift_views[] = {{false, 0, 0}, {true, 0, 0},   {false, 1, 0}, {true, 1, 0},
                                        {false, -1, 0}, {true, -1, 0}, {false, 0, 1}, {true, 0, 1},
                                        {false, 0, -1}, {true, 0, -1}};
static const struct {
    const char *name;
    const view *views;
    int nviews;
} modes[] = {
    [GP_CLI_TTA_NONE] = {"none", flip_views, 1},
    [GP_CLI_TTA_FLIP] = {"flip", flip_views, 2},
    [GP_CLI_TTA_FLIP_SHIFT] = {"flip-shift", flip_shift_views, 10},
};
#define NMODES ((int)(sizeof modes / sizeof modes[0]))

bool gp_cli_tta_parse(const char *s, gp_cli_tta *out) {
    for (int m = 0; m < NMODES; m++)
        if (strcmp(s, modes[m].name) == 0) {
            *out = (gp_cli_tta)m;
            return true;
        }
    return false;
}

const char *gp_cli_tta_name(gp_cli_tta m) {
    return (int)m >= 0 && (int)m < NMODES ? modes[m].name : "none";
}

int gp_cli_tta_views(gp_cli_tta m) { return (int)m >= 0 && (int)m < NMODES ? modes[m].nviews : 1; }

/* out (B, C, H, W) = x seen as v. */
static void make_view(const gp_tensor *x, const view *v, float *out) {
    const float *in = gp_tensor_host_data(x);
    const int64_t H = x->shape.dim[2], W = x->shape.dim[3];
    const int64_t planes = gp_tensor_nelem(x) / (H * W);
    for (int64_t p = 0; p < planes; p++)
        gp_cli_move_image(in + p * H * W, H, W, v->dx, v->dy, v->flip,
                          -GP_CLI_IMAGE_MEAN / GP_CLI_IMAGE_STD, out + p * H * W);
}

int gp_cli_eval_views(gp_cli_train *t, int n, const gp_tensor *xs, const gp_tensor *ys,
                      const char *what, gp_cli_tally *plain, gp_cli_tally *augmented) {
    const char *cmd = t->cmd ? t->cmd : "train";
    const int V = gp_cli_tta_views(t->tta), E = 1 + t->nmembers;
    const view *vs = modes[t->tta].views;
    int64_t nimg = 0, nlogit = 0;
    gp_shape *ws = calloc((size_t)n + 1, sizeof *ws);
    if (!ws) return gp_cli_fail(cmd, "--tta: out of host memory");
    for (int i = 0; i < n; i++) {
        if (!gp_tensor_host_data(&xs[i]) || xs[i].dtype != GP_F32 || xs[i].shape.ndim != 4) {
            fprintf(stderr, "gpipe %s: --tta %s: %s: batch %d is not (B, C, H, W) float32 images "
                            "in host memory\n",
                    cmd, gp_cli_tta_name(t->tta), what, i);
            free(ws);
            return GP_CLI_EXIT_RUNTIME;
        }
        if (gp_model_shape(t->model, gp_model_nlayers(t->model) - 1, xs[i].shape.dim[0], &ws[i]) !=
            GP_OK) {
            free(ws);
            return gp_cli_fail(cmd, what);
        }
        nimg += (V - 1) * gp_tensor_nelem(&xs[i]);
        nlogit += E * V * gp_shape_nelem(&ws[i]);
    }
    /* batch i's view v at V i + v: the first view the batch itself, the others made here; its
     * logits by model e at (E i + e) V + v, then those of one model (the pipeline's argument) */
    gp_tensor *views = calloc((size_t)((2 + E) * V * n + 1), sizeof *views);
    gp_tensor *logits = views + V * n, *mine = logits + E * V * n;
    float *images = malloc((size_t)(nimg + 1) * sizeof *images);
    float *out = malloc((size_t)(nlogit + 1) * sizeof *out);
    int rc = GP_CLI_EXIT_OK;
    if (!views || !images || !out) {
        rc = gp_cli_fail(cmd, "--tta: out of host memory");
        goto done;
    }
    float *img = images, *lg = out;
    for (int i = 0; i < n; i++) {
        for (int v = 0; v < V; v++) {
            if (v == 0) {
                views[V * i] = gp_tensor_view(gp_tensor_host_data(&xs[i]), xs[i].shape, GP_F32);
            } else {
                make_view(&xs[i], &vs[v], img);
                views[V * i + v] = gp_tensor_view(img, xs[i].shape, GP_F32);
                img += gp_tensor_nelem(&xs[i]);
            }
        }
        for (int k = 0; k < E * V; k++, lg += gp_shape_nelem(&ws[i]))
            logits[E * V * i + k] = gp_tensor_view(lg, ws[i], GP_F32);
    }
    gp_status s = GP_OK;
    for (int e = 0; e < E && s == GP_OK; e++) {
        for (int i = 0; i < n; i++)
            for (int v = 0; v < V; v++) mine[V * i + v] = logits[(E * i + e) * V + v];
        s = gp_pipeline_predict_batches(e == 0 ? t->pipeline : t->members[e - 1], V * n, views,
                                        mine);
    }
    *plain = *augmented = (gp_cli_tally){0};
    for (int i = 0; i < n && s == GP_OK; i++) {
        gp_cli_tally a = {0}, b = {0};
        s = gp_score_views(1, &logits[E * V * i], &ys[i], &a.loss, &a.correct, &a.count);
        if (s == GP_OK)
            s = gp_score_views(E * V, &logits[E * V * i], &ys[i], &b.loss, &b.correct, &b.count);
        plain->loss += a.loss, plain->correct += a.correct, plain->count += a.count;
        augmented->loss += b.loss, augmented->correct += b.correct, augmented->count += b.count;
    }
    if (s != GP_OK) rc = gp_cli_fail(cmd, what);
done:
    free(ws);
    free(views);
    free(images);
    free(out);
    return rc;
}
