/* CPU ops of the tensor-parallel shards: the vocabulary-parallel embedding (each shard looks up
 * the ids its rows hold, zeros elsewhere, so the all-reduce of the shards' outputs is exact) and
 * the pieces of a softmax cross-entropy whose classes are split over the shards, so that the
 * whole logits are never gathered: the row maximum, each shard's sum of exponentials and target
 * logit, then the loss and the shard's gradient once those are added over the shards. */
#include <math.h>
#include <string.h>

#include "core/error.h"
#include "kernels/checks.h"
#include "kernels/cpu/cpu_ops.h"



gp_status gp_cpu_embedding_shard_forward(gp_device *dev, int64_t n, int64_t row_len, int64_t dim,
                                         int64_t vocab, int64_t first, int64_t rows,
                                         const int32_t *ids, const float *w, float *y) {
    (void)dev;
    GP_TRY(gp_kernels_check_shard(vocab, first, rows, "embedding"));
    GP_TRY(gp_kernels_check_ids(n, row_len, vocab, ids));
    for (int64_t i = 0; i < n; i++) {
        const int64_t r = (int64_t)ids[i] - first;
        if (r >= 0 && r < rows)
            memcpy(y + i * dim, w + r * dim, (size_t)dim * sizeof *y);
        else
            memset(y + i * dim, 0, (size_t)dim * sizeof *y);
    }
    return GP_OK;
}

gp_status gp_cpu_embedding_shard_backward(gp_device *dev, int64_t n, int64_t row_len,
                                          int64_t dim, int64_t vocab, int64_t first, int64_t rows,
                                          const int32_t *ids, const float *dy, float *dw) {
    (void)dev;
    GP_TRY(gp_kernels_check_shard(vocab, first, rows, "embedding"));
    GP_TRY(gp_kernels_check_ids(n, row_len, vocab, ids));
    /* Position order, as the whole table's backward: each row gets the same sum in the same
     * order, so the shards' gradient rows are the whole table's bit for bit. */
    for (int64_t i = 0; i < n; i++) {
        const int64_t r = (int64_t)ids[i] - first;
        if (r < 0 || r >= rows) continue;
        float *row = dw + r * dim;
        const float *g = dy + i * dim;
        for (int64_t j = 0; j < dim; j++) row[j] += g[j];
    }
    return GP_OK;
}

gp_status gp_cpu_row_max(gp_device *dev, int64_t rows, int64_t cols, const float *x, float *out) {
    (void)dev;
    if (cols < 1)
        return gp_error(GP_INVALID_ARGUMENT, "row maximum of %lld columns, expected >= 1",
                        (long long)cols);
    for (int64_t r = 0; r < rows; r++) {
        const float *v = x + r * cols;
        float mx = v[0];
        for (int64_t j = 1; j < cols; j++) mx = v[j] > mx || v[j] != v[j] ? v[j] : mx;
        out[r] = mx;
    }
    return GP_OK;
}


gp_status gp_cpu_xent_shard_sums(gp_device *dev, int64_t rows, int64_t classes, int64_t vocab,
                                 int64_t first, const float *logits, const int32_t *labels,
                                 const float *mx, double smoothing, float *sums) {
    (void)dev;
    GP_TRY(gp_kernels_check_shard(vocab, first, classes, "cross-entropy classes"));
    GP_TRY(gp_kernels_check_smoothing(smoothing));
    GP_TRY(gp_kernels_check_labels(rows, vocab, labels, NULL));
    for (int64_t r = 0; r < rows; r++) {
        const float *x = logits + r * classes;
        const int64_t y = labels[r];
        if (y == -1) {
            sums[r] = sums[rows + r] = 0.0f;
            if (smoothing > 0) sums[2 * rows + r] = 0.0f;
            continue;
        }
        double sum = 0;
        for (int64_t j = 0; j < classes; j++) sum += expf(x[j] - mx[r]);
        sums[r] = (float)sum;
        sums[rows + r] = y >= first && y < first + classes ? x[y - first] - mx[r] : 0.0f;
        if (smoothing > 0) {
            double shifted = 0;
            for (int64_t j = 0; j < classes; j++) shifted += (double)x[j] - mx[r];
            sums[2 * rows + r] = (float)shifted;
        }
    }
    return GP_OK;
}

gp_status gp_cpu_xent_shard_finish(gp_device *dev, int64_t rows, int64_t classes, int64_t vocab,
                                   int64_t first, const float *logits, const int32_t *labels,
                                   const float *mx, const float *sums, double normalizer,
                                   double smoothing, double *loss, float *dlogits) {
    (void)dev;
    GP_TRY(gp_kernels_check_shard(vocab, first, classes, "cross-entropy classes"));
    GP_TRY(gp_kernels_check_smoothing(smoothing));
    int64_t counted = 0;
    GP_TRY(gp_kernels_check_labels(rows, vocab, labels, &counted));
    GP_TRY(gp_kernels_check_normalizer(normalizer, counted));
    double total = 0;
    for (int64_t r = 0; r < rows; r++) {
        const float *x = logits + r * classes;
        float *d = dlogits ? dlogits + r * classes : NULL;
        const int64_t y = labels[r];
        if (y == -1) {
            if (d) memset(d, 0, (size_t)classes * sizeof *d);
            continue;
        }
        const double sum = sums[r];
        if (smoothing > 0) {
            /* lse - (1 - s) x[y] - s mean(x), each taken from the row maximum; dlogits
             * (softmax - (1 - s) onehot - s / vocab) / normalizer */
            const double u = smoothing / (double)vocab;
            total += log(sum) - (1.0 - smoothing) * (double)sums[rows + r] -
                     u * (double)sums[2 * rows + r];
            if (!d) continue;
            for (int64_t j = 0; j < classes; j++) {
                const double p = (double)expf(x[j] - mx[r]) / sum - u;
                d[j] = (float)((first + j == y ? p - (1.0 - smoothing) : p) / normalizer);
            }
            continue;
        }
        total += log(sum) - (double)sums[rows + r];
        if (!d) continue;
        const double inv = 1.0 / (sum * normalizer);
        for (int64_t j = 0; j < classes; j++) {
            const float e = expf(x[j] - mx[r]);
            d[j] = first + j == y ? (float)(((double)e / sum - 1.0) / normalizer)
                                  : (float)(e * inv);
        }
    }
    *loss = counted ? total / normalizer : 0.0;
    return GP_OK;
}
