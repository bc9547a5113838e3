/* --tta flip: a classifier's evaluation with test-time mirroring. Each test image goes through
 * the pipeline twice, as it is and mirrored left-right (one more batch per batch, the stages at
 * once as in plain evaluation); the plain figures come from the first view's logits alone, so
 * they are the bits an evaluation without --tta gives, and the mirrored figures from the mean of
 * both views' softmax (gp_score_views). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"

bool gp_cli_tta_parse(const char *s, bool *flip) {
    if (strcmp(s, "none") != 0 && strcmp(s, "flip") != 0) return false;
    *flip = strcmp(s, "flip") == 0;
    return true;
}

/* out (B, C, H, W) = x mirrored along its last axis. */
static void mirror_images(const gp_tensor *x, float *out) {
    const float *in = gp_tensor_host_data(x);
    const int64_t W = x->shape.dim[x->shape.ndim - 1];
    const int64_t rows = gp_tensor_nelem(x) / W;
    for (int64_t r = 0; r < rows; r++)
        for (int64_t j = 0; j < W; j++) out[r * W + j] = in[r * W + W - 1 - j];
}

int gp_cli_eval_mirrored(gp_cli_train *t, int n, const gp_tensor *xs, const gp_tensor *ys,
                         const char *what, gp_cli_tally *plain, gp_cli_tally *mirrored) {
    const char *cmd = t->cmd ? t->cmd : "train";
    int64_t nimg = 0, nlogit = 0;
    gp_shape *ws = calloc((size_t)n + 1, sizeof *ws);
    if (!ws) return gp_cli_fail(cmd, "--tta flip: out of host memory");
    for (int i = 0; i < n; i++) {
        if (!gp_tensor_host_data(&xs[i]) || xs[i].dtype != GP_F32 || xs[i].shape.ndim != 4) {
            fprintf(stderr, "gpipe %s: --tta flip: %s: batch %d is not (B, C, H, W) float32 images "
                            "in host memory\n", cmd, what, i);
            free(ws);
            return GP_CLI_EXIT_RUNTIME;
        }
        if (gp_model_shape(t->model, gp_model_nlayers(t->model) - 1, xs[i].shape.dim[0], &ws[i]) !=
            GP_OK) {
            free(ws);
            return gp_cli_fail(cmd, what);
        }
        nimg += gp_tensor_nelem(&xs[i]);
        nlogit += 2 * gp_shape_nelem(&ws[i]);
    }
    gp_tensor *views = calloc((size_t)(4 * n + 1), sizeof *views), *logits = views + 2 * n;
    float *images = malloc((size_t)(nimg + 1) * sizeof *images);
    float *out = malloc((size_t)(nlogit + 1) * sizeof *out);
    int rc = GP_CLI_EXIT_OK;
    if (!views || !images || !out) {
        rc = gp_cli_fail(cmd, "--tta flip: out of host memory");
        goto done;
    }
    float *img = images, *lg = out;
    for (int i = 0; i < n; i++) {
        mirror_images(&xs[i], img);
        views[2 * i] = gp_tensor_view(gp_tensor_host_data(&xs[i]), xs[i].shape, GP_F32);
        views[2 * i + 1] = gp_tensor_view(img, xs[i].shape, GP_F32);
        img += gp_tensor_nelem(&xs[i]);
        for (int v = 0; v < 2; v++, lg += gp_shape_nelem(&ws[i]))
            logits[2 * i + v] = gp_tensor_view(lg, ws[i], GP_F32);
    }
    gp_status s = gp_pipeline_predict_batches(t->pipeline, 2 * n, views, logits);
    *plain = *mirrored = (gp_cli_tally){0};
    for (int i = 0; i < n && s == GP_OK; i++) {
        gp_cli_tally a = {0}, b = {0};
        s = gp_score_views(1, &logits[2 * i], &ys[i], &a.loss, &a.correct, &a.count);
        if (s == GP_OK) s = gp_score_views(2, &logits[2 * i], &ys[i], &b.loss, &b.correct, &b.count);
        plain->loss += a.loss, plain->correct += a.correct, plain->count += a.count;
        mirrored->loss += b.loss, mirrored->correct += b.correct, mirrored->count += b.count;
    }
    if (s != GP_OK) rc = gp_cli_fail(cmd, what);
done:
    free(ws);
    free(views);
    free(images);
    free(out);
    return rc;
}
