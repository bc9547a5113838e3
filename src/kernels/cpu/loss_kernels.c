/* CPU softmax cross-entropy: a stable log-sum-exp per row (rows split over the device's
 * threads), the loss summed in double, rows in order, so micro-batch losses add up to the
 * mini-batch mean bit for bit. */
#include <math.h>
#include <stdlib.h>

#include "core/error.h"
#include "kernels/checks.h"
#include "kernels/cpu/cpu_ops.h"
#include "kernels/cpu/pool.h"

typedef struct xent_args {
    int64_t classes;
    const float *logits;
    const int32_t *labels;
    double normalizer, smoothing;
    float *dlogits;
    double *row_loss;
} xent_args;

/* Rows [lo, hi): each row's loss (0 when ignored) and its gradient. */
static void xent_range(void *ctx, int64_t lo, int64_t hi) {
    const xent_args *a = ctx;
    const int64_t classes = a->classes;
    const double normalizer = a->normalizer;
    for (int64_t r = lo; r < hi; r++) {
        const float *x = a->logits + r * classes; /* (classes) */
        float *d = a->dlogits ? a->dlogits + r * classes : NULL;
        const int32_t y = a->labels[r];
        a->row_loss[r] = 0;
        if (y == -1) {
            if (d)
                for (int64_t j = 0; j < classes; j++) d[j] = 0.0f;
            continue;
        }
        const float xy = x[y]; /* read before d overwrites it when dlogits aliases logits */
        float mx = x[0];
        for (int64_t j = 1; j < classes; j++) mx = x[j] > mx ? x[j] : mx;
        /* smoothed: the uniform part of the target weighs the mean logit (read before d too) */
        double mean = 0;
        if (a->smoothing > 0) {
            for (int64_t j = 0; j < classes; j++) mean += x[j];
            mean /= (double)classes;
        }
        double sum = 0;
        if (d) {
            for (int64_t j = 0; j < classes; j++) {
                d[j] = expf(x[j] - mx);
                sum += d[j];
            }
        } else {
            for (int64_t j = 0; j < classes; j++) sum += expf(x[j] - mx);
        }
        if (a->smoothing > 0) {
            /* -sum q log p = lse - (1 - s) x[y] - s mean(x); dlogits (softmax - q) / normalizer */
            const double s = a->smoothing, u = s / (double)classes;
            a->row_loss[r] = (double)mx + log(sum) - (1.0 - s) * (double)xy - s * mean;
            if (d) {
                const double ey = d[y];
                for (int64_t j = 0; j < classes; j++) d[j] = (float)((d[j] / sum - u) / normalizer);
                d[y] = (float)((ey / sum - (1.0 - s) - u) / normalizer);
            }
            continue;
        }
        a->row_loss[r] = (double)mx + log(sum) - (double)xy;
        if (d) {
            /* (softmax - onehot) / normalizer */
            const double inv = 1.0 / (sum * normalizer);
            const double ey = d[y];
            for (int64_t j = 0; j < classes; j++) d[j] = (float)(d[j] * inv);
            d[y] = (float)((ey / sum - 1.0) / normalizer);
        }
    }
}

gp_status gp_cpu_softmax_xent(gp_device *dev, int64_t rows, int64_t classes, const float *logits,
                              const int32_t *labels, double normalizer, double smoothing,
                              double *loss, float *dlogits) {
    int64_t counted = 0;
    GP_TRY(gp_kernels_check_smoothing(smoothing));
    GP_TRY(gp_kernels_check_labels(rows, classes, labels, &counted));
    GP_TRY(gp_kernels_check_normalizer(normalizer, counted));
    double *row_loss = malloc((size_t)(rows > 0 ? rows : 1) * sizeof *row_loss);
    if (!row_loss)
        return gp_error(GP_OUT_OF_MEMORY, "softmax cross-entropy: %lld row losses",
                        (long long)rows);
    xent_args a = {.classes = classes, .logits = logits, .labels = labels,
                   .normalizer = normalizer, .smoothing = smoothing, .dlogits = dlogits,
                   .row_loss = row_loss};
    gp_cpu_parallel_for(gp_cpu_pool_of(dev), rows, 1,
                        classes >= 4096 ? 1 : 4096 / (classes > 0 ? classes : 1), xent_range, &a);
    double total = 0;
    for (int64_t r = 0; r < rows; r++) total += row_loss[r]; /* rows in order */
    free(row_loss);
    *loss = counted ? total / normalizer : 0.0;
    return GP_OK;
}
