/* Softmax cross-entropy over the last dimension with ignored (-1) labels and an explicit
 * normalizer, so micro-batch losses add up to the mini-batch mean. Stable log-sum-exp;
 * the loss is summed in double, row by row in order. */
#include <math.h>
#include <stdint.h>

#include "../core/error.h"
#include "gpipe.h"

int64_t gp_count_labels(const gp_tensor *labels) {
    if (!labels || !labels->data || labels->dtype != GP_I32) return 0;
    const int32_t *lab = (const int32_t *)labels->data;
    int64_t n = 0, total = gp_tensor_nelem(labels);
    for (int64_t i = 0; i < total; i++) n += lab[i] != -1;
    return n;
}

static gp_status check_args(const gp_tensor *logits, const gp_tensor *labels,
                            const gp_tensor *dlogits, int64_t *rows, int64_t *classes) {
    char a[96], b[96];
    if (!logits || !labels || !logits->data || !labels->data)
        return gp_error(GP_INVALID_ARGUMENT, "gp_softmax_xent: logits and labels must not be NULL");
    if (logits->dtype != GP_F32 || labels->dtype != GP_I32)
        return gp_error(GP_INVALID_ARGUMENT,
                        "gp_softmax_xent: logits are %s and labels %s, expected float32 and int32",
                        gp_dtype_name(logits->dtype), gp_dtype_name(labels->dtype));
    if (logits->shape.ndim < 1 || logits->shape.dim[logits->shape.ndim - 1] < 1)
        return gp_error(GP_SHAPE,
                        "gp_softmax_xent: logits shape %s: expected (rows..., classes) with "
                        "classes >= 1",
                        gp_shape_str(&logits->shape, a, sizeof a));
    *classes = logits->shape.dim[logits->shape.ndim - 1];
    *rows = gp_tensor_nelem(logits) / *classes;
    if (gp_tensor_nelem(labels) != *rows)
        return gp_error(GP_SHAPE,
                        "gp_softmax_xent: labels shape %s has %lld values, expected one per row of "
                        "logits %s (%lld rows)",
                        gp_shape_str(&labels->shape, a, sizeof a),
                        (long long)gp_tensor_nelem(labels),
                        gp_shape_str(&logits->shape, b, sizeof b), (long long)*rows);
    if (dlogits && (!dlogits->data || dlogits->dtype != GP_F32 ||
                    !gp_shape_equal(&dlogits->shape, &logits->shape)))
        return gp_error(GP_SHAPE, "gp_softmax_xent: dlogits is %s %s, expected float32 %s",
                        gp_dtype_name(dlogits->dtype), gp_shape_str(&dlogits->shape, a, sizeof a),
                        gp_shape_str(&logits->shape, b, sizeof b));
    return GP_OK;
}

gp_status gp_softmax_xent(const gp_tensor *logits, const gp_tensor *labels, double normalizer,
                          double *loss, gp_tensor *dlogits) {
    int64_t rows = 0, classes = 0;
    GP_TRY(check_args(logits, labels, dlogits, &rows, &classes));
    const int32_t *lab = (const int32_t *)labels->data;
    int64_t counted = 0;
    for (int64_t r = 0; r < rows; r++) {
        if (lab[r] < -1 || lab[r] >= classes)
            return gp_error(GP_INVALID_ARGUMENT,
                            "gp_softmax_xent: label %d at row %lld is outside [-1, %lld) (-1: "
                            "ignored)",
                            (int)lab[r], (long long)r, (long long)classes);
        counted += lab[r] != -1;
    }
    if (counted > 0 && !(normalizer > 0))
        return gp_error(GP_INVALID_ARGUMENT,
                        "gp_softmax_xent: normalizer %g with %lld labelled rows, expected > 0 (the "
                        "mini-batch's count of non-ignored labels)",
                        normalizer, (long long)counted);

    double total = 0;
    for (int64_t r = 0; r < rows; r++) {
        const float *x = logits->data + r * classes; /* (classes) */
        float *d = dlogits ? dlogits->data + r * classes : NULL;
        const int32_t y = lab[r];
        if (y == -1) {
            if (d)
                for (int64_t j = 0; j < classes; j++) d[j] = 0.0f;
            continue;
        }
        const float xy = x[y]; /* read before d overwrites it when dlogits aliases logits */
        float mx = x[0];
        for (int64_t j = 1; j < classes; j++) mx = x[j] > mx ? x[j] : mx;
        double sum = 0;
        if (d) {
            for (int64_t j = 0; j < classes; j++) {
                d[j] = expf(x[j] - mx);
                sum += d[j];
            }
        } else {
            for (int64_t j = 0; j < classes; j++) sum += expf(x[j] - mx);
        }
        total += (double)mx + log(sum) - (double)xy;
        if (d) {
            /* (softmax - onehot) / normalizer */
            const double inv = 1.0 / (sum * normalizer);
            const double ey = d[y];
            for (int64_t j = 0; j < classes; j++) d[j] = (float)(d[j] * inv);
            d[y] = (float)((ey / sum - 1.0) / normalizer);
        }
    }
    if (loss) *loss = counted ? total / normalizer : 0.0;
    return GP_OK;
}
