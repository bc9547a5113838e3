/* Inference: a forward pass in eval mode (batch norm on running statistics, no dropout), each
 * layer on the device its parameters live on, and the scoring of logits against labels (loss sum
 * and correct predictions). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "model/inference.h"
#include "model/model.h"
#include "model/sequence.h"

static gp_status check_input(const gp_model *m, const gp_tensor *x) {
    char got[96], want[96];
    if (!x || !x->data || x->shape.ndim < 1)
        return gp_error(GP_INVALID_ARGUMENT, "inference: the input tensor is empty");
    gp_shape ws;
    GP_TRY(gp_model_shape(m, -1, x->shape.dim[0], &ws));
    if (!gp_shape_equal(&ws, &x->shape) || x->dtype != m->input_dtype)
        return gp_error(GP_SHAPE, "inference: input %s %s, expected %s %s",
                        gp_shape_str(&x->shape, got, sizeof got), gp_dtype_name(x->dtype),
                        gp_shape_str(&ws, want, sizeof want), gp_dtype_name(m->input_dtype));
    return GP_OK;
}

/* x as an input on dev: itself when dev can read its memory, else a copy (owned). */
static gp_status to_device(gp_device *dev, const gp_tensor *x, gp_tensor *out) {
    if (gp_kernels_same_memory(dev, x->dev)) {
        *out = *x;
        out->owned = false;
        return GP_OK;
    }
    GP_TRY(gp_tensor_alloc(dev, GP_MEM_ACTIVATIONS, x->shape, x->dtype, out));
    gp_status s = gp_tensor_copy(out, x);
    if (s != GP_OK) gp_tensor_release(out);
    return s;
}

gp_status gp_model_forward_eval(gp_model *m, int first, int last, const gp_tensor *x,
                                gp_tensor *out) {
    memset(out, 0, sizeof *out);
    for (int i = first; i < last; i++)
        if (!gp_model_layer_device(m, i))
            return gp_error(GP_INVALID_ARGUMENT,
                            "inference: layer %d (%s) is not initialized here: initialize the "
                            "model first (under MPI, run it through the pipeline)",
                            i, m->layers[i]->ops->kind);
    gp_run run = {.training = false, .seed = m->seed};
    gp_tensor cur = *x;
    cur.owned = false;
    /* Each run of layers on one device runs there; the activation moves between runs. */
    for (int a = first; a < last;) {
        gp_device *dev = gp_model_layer_device(m, a);
        int b = a + 1;
        while (b < last && gp_model_layer_device(m, b) == dev) b++;
        gp_tensor in, y;
        gp_status s = to_device(dev, &cur, &in);
        if (s == GP_OK) s = gp_seq_forward_output(m, a, b, dev, &run, &in, &y);
        gp_tensor_release(&in);
        gp_tensor_release(&cur);
        if (s != GP_OK) return s;
        cur = y;
        a = b;
    }
    *out = cur;
    return GP_OK;
}

gp_status gp_model_predict(gp_model *m, const gp_tensor *x, gp_tensor *logits) {
    char got[96], want[96];
    if (!m) return gp_error(GP_INVALID_ARGUMENT, "gp_model_predict: model is NULL");
    GP_TRY(check_input(m, x));
    gp_tensor out;
    GP_TRY(gp_model_forward_eval(m, 0, m->nlayers, x, &out));
    gp_status s = GP_OK;
    if (!logits || !logits->data || !gp_shape_equal(&logits->shape, &out.shape))
        s = gp_error(GP_SHAPE, "gp_model_predict: logits tensor %s, expected %s",
                     logits ? gp_shape_str(&logits->shape, got, sizeof got) : "NULL",
                     gp_shape_str(&out.shape, want, sizeof want));
    if (s == GP_OK) s = gp_tensor_copy(logits, &out);
    gp_tensor_release(&out);
    return s;
}

/* t's bytes in host memory: itself, or a malloc'ed copy in *copy (the caller frees it). */
static gp_status host_bytes(const gp_tensor *t, const void **bytes, void **copy) {
    *copy = NULL;
    if ((*bytes = gp_tensor_host_data(t))) return GP_OK;
    size_t n = gp_tensor_nbytes(t);
    if (!(*copy = malloc(n ? n : 1))) return gp_error(GP_OUT_OF_MEMORY, "%zu bytes", n);
    gp_status s = gp_tensor_to_host(t, *copy, n);
    *bytes = *copy;
    return s;
}

gp_status gp_model_score(const gp_tensor *logits, const gp_tensor *y, double *loss_sum,
                         int64_t *ncorrect, int64_t *ncount) {
    const void *lb = NULL, *yb = NULL;
    void *lcopy = NULL, *ycopy = NULL;
    gp_status s = host_bytes(logits, &lb, &lcopy);
    if (s == GP_OK) s = host_bytes(y, &yb, &ycopy);
    gp_tensor hl = gp_tensor_view((void *)lb, logits->shape, logits->dtype);
    gp_tensor hy = gp_tensor_view((void *)yb, y->shape, y->dtype);
    double l = 0;
    if (s == GP_OK) s = gp_softmax_xent(&hl, &hy, 1.0, &l, NULL);
    if (s == GP_OK) {
        const int64_t classes = hl.shape.dim[hl.shape.ndim - 1];
        const int64_t rows = gp_tensor_nelem(&hl) / classes;
        const float *out = lb;
        const int32_t *lab = yb;
        int64_t correct = 0, count = 0;
        for (int64_t r = 0; r < rows; r++) {
            if (lab[r] < 0) continue;
            const float *row = out + r * classes;
            int64_t best = 0;
            for (int64_t c = 1; c < classes; c++)
                if (row[c] > row[best]) best = c;
            correct += best == lab[r];
            count++;
        }
        if (loss_sum) *loss_sum = l;
        if (ncorrect) *ncorrect = correct;
        if (ncount) *ncount = count;
    }
    free(lcopy);
    free(ycopy);
    return s;
}

/* The mean of the views' softmax for each labelled row: its -log at the label and whether its
 * largest entry (the first of equals, as gp_model_score's argmax) is the label. In double:
 * nothing here has a twin whose bits it must match. */
static void score_mean_softmax(int views, const float *const *lb, const int32_t *lab, int64_t rows,
                               int64_t classes, double *mean, double *loss, int64_t *correct,
                               int64_t *count) {
    for (int64_t r = 0; r < rows; r++) {
        if (lab[r] < 0) continue;
        for (int64_t c = 0; c < classes; c++) mean[c] = 0;
        for (int v = 0; v < views; v++) {
            const float *row = lb[v] + r * classes;
            float top = row[0];
            for (int64_t c = 1; c < classes; c++) top = row[c] > top ? row[c] : top;
            double z = 0;
            for (int64_t c = 0; c < classes; c++) z += exp((double)row[c] - top);
            for (int64_t c = 0; c < classes; c++) mean[c] += exp((double)row[c] - top) / z / views;
        }
        int64_t best = 0;
        for (int64_t c = 1; c < classes; c++)
            if (mean[c] > mean[best]) best = c;
        *loss -= log(mean[lab[r]]);
        *correct += best == lab[r];
        (*count)++;
    }
}

gp_status gp_score_views(int views, const gp_tensor *logits, const gp_tensor *y,
                         double *loss_sum, int64_t *ncorrect, int64_t *ncount) {
    char got[96], want[96];
    if (views < 1 || !logits || !y)
        return gp_error(GP_INVALID_ARGUMENT, "gp_score_views: %d views, expected at least 1, "
                                             "and the logits and labels", views);
    const gp_shape *ws = &logits[0].shape;
    for (int v = 0; v < views; v++)
        if (!logits[v].data || logits[v].dtype != GP_F32 || logits[v].shape.ndim < 1 ||
            !gp_shape_equal(&logits[v].shape, ws))
            return gp_error(GP_SHAPE, "gp_score_views: view %d's logits %s %s, expected float32 %s "
                                      "as view 0's",
                            v, gp_shape_str(&logits[v].shape, got, sizeof got),
                            gp_dtype_name(logits[v].dtype), gp_shape_str(ws, want, sizeof want));
    const int64_t classes = ws->dim[ws->ndim - 1];
    const int64_t rows = classes > 0 ? gp_shape_nelem(ws) / classes : 0;
    if (!y->data || y->dtype != GP_I32 || gp_shape_nelem(&y->shape) != rows || classes < 1)
        return gp_error(GP_SHAPE, "gp_score_views: labels %s %s, expected int32 with one per "
                                  "row of the logits %s",
                        gp_shape_str(&y->shape, got, sizeof got), gp_dtype_name(y->dtype),
                        gp_shape_str(ws, want, sizeof want));
    if (views == 1) return gp_model_score(&logits[0], y, loss_sum, ncorrect, ncount);
    const float **lb = calloc((size_t)views, sizeof *lb);
    void **copies = calloc((size_t)views, sizeof *copies);
    double *mean = malloc((size_t)classes * sizeof *mean);
    const void *yb = NULL;
    void *ycopy = NULL;
    gp_status s = lb && copies && mean
                      ? GP_OK
                      : gp_error(GP_OUT_OF_MEMORY, "gp_score_views: %d views of %lld classes",
                                 views, (long long)classes);
    for (int v = 0; v < views && s == GP_OK; v++) {
        const void *b = NULL;
        s = host_bytes(&logits[v], &b, &copies[v]);
        lb[v] = b;
    }
    if (s == GP_OK) s = host_bytes(y, &yb, &ycopy);
    if (s == GP_OK) {
        double l = 0;
        int64_t correct = 0, count = 0;
        for (int64_t r = 0; r < rows && s == GP_OK; r++) {
            const int32_t lab = ((const int32_t *)yb)[r];
            if (lab >= classes)
                s = gp_error(GP_INVALID_ARGUMENT, "gp_score_views: label %d of row %lld, expected "
                                                  "below %lld classes",
                             lab, (long long)r, (long long)classes);
        }
        if (s == GP_OK)
            score_mean_softmax(views, lb, yb, rows, classes, mean, &l, &correct, &count);
        if (s == GP_OK && loss_sum) *loss_sum = l;
        if (s == GP_OK && ncorrect) *ncorrect = correct;
        if (s == GP_OK && ncount) *ncount = count;
    }
    for (int v = 0; copies && v < views; v++) free(copies[v]);
    free(copies);
    free(lb);
    free(mean);
    free(ycopy);
    return s;
}

gp_status gp_model_evaluate(gp_model *m, const gp_tensor *x, const gp_tensor *y,
                            double *loss_sum, int64_t *ncorrect, int64_t *ncount) {
    if (!m) return gp_error(GP_INVALID_ARGUMENT, "gp_model_evaluate: model is NULL");
    GP_TRY(check_input(m, x));
    gp_tensor out;
    GP_TRY(gp_model_forward_eval(m, 0, m->nlayers, x, &out));
    gp_status s = gp_model_score(&out, y, loss_sum, ncorrect, ncount);
    gp_tensor_release(&out);
    return s == GP_OK ? GP_OK : gp_error_context(s, "gp_model_evaluate");
}
