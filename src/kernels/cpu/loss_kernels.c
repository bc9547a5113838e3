/* CPU softmax cross-entropy: a stable log-sum-exp per row, the loss summed in double, rows in
 * order, so micro-batch losses add up to the mini-batch mean bit for bit. */
#include <math.h>

#include "core/error.h"
#include "kernels/cpu/cpu_kernels.h"

gp_status gp_cpu_softmax_xent(gp_device *dev, int64_t rows, int64_t classes, const float *logits,
                              const int32_t *labels, double normalizer, double *loss,
                              float *dlogits) {
    (void)dev;
    int64_t counted = 0;
    for (int64_t r = 0; r < rows; r++) {
        if (labels[r] < -1 || labels[r] >= classes)
            return gp_error(GP_INVALID_ARGUMENT,
                            "label %d at row %lld is outside [-1, %lld) (-1: ignored)",
                            (int)labels[r], (long long)r, (long long)classes);
        counted += labels[r] != -1;
    }
    if (counted > 0 && !(normalizer > 0))
        return gp_error(GP_INVALID_ARGUMENT,
                        "normalizer %g with %lld labelled rows, expected > 0 (the mini-batch's "
                        "count of non-ignored labels)",
                        normalizer, (long long)counted);
    double total = 0;
    for (int64_t r = 0; r < rows; r++) {
        const float *x = logits + r * classes; /* (classes) */
        float *d = dlogits ? dlogits + r * classes : NULL;
        const int32_t y = labels[r];
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
    *loss = counted ? total / normalizer : 0.0;
    return GP_OK;
}
