/* Softmax cross-entropy over the last dimension with ignored (-1) labels, an explicit
 * normalizer (so micro-batch losses add up to the mini-batch mean) and optional label
 * smoothing: the argument checks here, the computation in the kernel table of the device the logits live on. */
#include <stdint.h>
#include <stdlib.h>

#include "core/error.h"
#include "kernels/kernels.h"

int64_t gp_count_labels(const gp_tensor *labels) {
    if (!labels || !labels->data || labels->dtype != GP_I32) return 0;
    const int64_t total = gp_tensor_nelem(labels);
    const int32_t *lab = gp_tensor_host_data(labels);
    int32_t *copy = NULL;
    if (!lab) { /* on a device the host cannot read */
        copy = malloc((size_t)total * sizeof *copy);
        if (!copy || gp_tensor_to_host(labels, copy, (size_t)total * sizeof *copy) != GP_OK) {
            free(copy);
            return 0;
        }
        lab = copy;
    }
    int64_t n = 0;
    for (int64_t i = 0; i < total; i++) n += lab[i] != -1;
    free(copy);
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
    if (!gp_kernels_same_memory(logits->dev, labels->dev) ||
        (dlogits && !gp_kernels_same_memory(logits->dev, dlogits->dev)))
        return gp_error(GP_INVALID_ARGUMENT,
                        "gp_softmax_xent: logits on %s, labels on %s%s%s: expected them in one "
                        "device's memory",
                        gp_device_name(logits->dev), gp_device_name(labels->dev),
                        dlogits ? ", dlogits on " : "", dlogits ? gp_device_name(dlogits->dev) : "");
    return GP_OK;
}

gp_status gp_softmax_xent(const gp_tensor *logits, const gp_tensor *labels, double normalizer,
                          double *loss, gp_tensor *dlogits) {
    return gp_softmax_xent_smoothed(logits, labels, normalizer, 0.0, loss, dlogits);
}

gp_status gp_softmax_xent_smoothed(const gp_tensor *logits, const gp_tensor *labels,
                                   double normalizer, double smoothing, double *loss,
                                   gp_tensor *dlogits) {
    int64_t rows = 0, classes = 0;
    GP_TRY(check_args(logits, labels, dlogits, &rows, &classes));
    double l = 0;
    gp_status s = gp_kernels_of(logits->dev)
                      ->softmax_xent(logits->dev, rows, classes, (const float *)logits->data,
                                     (const int32_t *)labels->data, normalizer, smoothing, &l,
                                     dlogits ? (float *)dlogits->data : NULL);
    if (s != GP_OK) return gp_error_context(s, "gp_softmax_xent");
    if (loss) *loss = l;
    return GP_OK;
}
