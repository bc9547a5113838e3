/* Inference: a forward pass in eval mode (batch norm on running statistics,
 * no dropout), and batch evaluation (loss sum and correct predictions). */
#include <string.h>

#include "sequence.h"

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

static gp_status eval_forward(gp_model *m, gp_device *dev, const gp_tensor *x, gp_tensor *out) {
    if (!m || !dev) return gp_error(GP_INVALID_ARGUMENT, "inference: model or device is NULL");
    GP_TRY(check_input(m, x));
    /* Parameters may live on several devices (pipeline stages, between
     * steps); activations all go on `dev`, in this one thread. */
    for (int i = 0; i < m->nlayers; i++)
        if (!m->devs[i])
            return gp_error(GP_INVALID_ARGUMENT,
                            "inference: layer %d (%s) is not initialized: call gp_model_init first",
                            i, m->layers[i]->ops->kind);
    gp_run run = {.training = false, .seed = m->seed};
    return gp_seq_infer(m, 0, m->nlayers, dev, &run, x, out);
}

gp_status gp_model_predict(gp_model *m, gp_device *dev, const gp_tensor *x, gp_tensor *logits) {
    char got[96], want[96];
    gp_tensor out;
    GP_TRY(eval_forward(m, dev, x, &out));
    if (!logits || !logits->data || !gp_shape_equal(&logits->shape, &out.shape)) {
        gp_status s = gp_error(GP_SHAPE, "gp_model_predict: logits tensor %s, expected %s",
                               logits ? gp_shape_str(&logits->shape, got, sizeof got) : "NULL",
                               gp_shape_str(&out.shape, want, sizeof want));
        gp_tensor_release(&out);
        return s;
    }
    memcpy(logits->data, out.data, gp_tensor_nbytes(&out));
    gp_tensor_release(&out);
    return GP_OK;
}

gp_status gp_model_evaluate(gp_model *m, gp_device *dev, const gp_tensor *x, const gp_tensor *y,
                            double *loss_sum, int64_t *ncorrect, int64_t *ncount) {
    gp_tensor out;
    GP_TRY(eval_forward(m, dev, x, &out));
    double l = 0;
    gp_status s = gp_softmax_xent(&out, y, 1.0, &l, NULL);
    if (s != GP_OK) {
        gp_tensor_release(&out);
        return gp_error_context(s, "gp_model_evaluate");
    }
    int64_t classes = out.shape.dim[out.shape.ndim - 1];
    int64_t rows = gp_tensor_nelem(&out) / classes, correct = 0, count = 0;
    const int32_t *lab = (const int32_t *)y->data;
    for (int64_t r = 0; r < rows; r++) {
        if (lab[r] < 0) continue;
        const float *row = out.data + r * classes;
        int64_t best = 0;
        for (int64_t c = 1; c < classes; c++)
            if (row[c] > row[best]) best = c;
        correct += best == lab[r];
        count++;
    }
    gp_tensor_release(&out);
    if (loss_sum) *loss_sum = l;
    if (ncorrect) *ncorrect = correct;
    if (ncount) *ncount = count;
    return GP_OK;
}
