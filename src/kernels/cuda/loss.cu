// CUDA softmax cross-entropy, whole and split over vocabulary shards, and the row maximum.
// Labels are copied to the host and checked there first (the CPU's messages); a block per row
// computes its sums in a fixed order; the row losses come back to the host, which adds them in
// row order in double as the CPU does.
#include "kernels/cuda/cuda_kernels.h"
#include "kernels/cuda/math.cuh"

static unsigned row_blocks(int64_t rows) {
    return (unsigned)(rows < GP_CUDA_MAX_GRID ? (rows > 0 ? rows : 1) : GP_CUDA_MAX_GRID);
}

// Host scratch holding the labels (rows) followed, 8-byte aligned, by `extra` bytes.
static gp_status labels_to_host(gp_cuda_ctx *c, const int32_t *labels, int64_t rows,
                                size_t extra, int32_t **lab, void **rest) {
    const size_t lbytes = ((size_t)rows * sizeof(int32_t) + 7) / 8 * 8;
    void *h;
    GP_TRY(gp_cuda_host_scratch(c, lbytes + extra, &h));
    GP_TRY(gp_cuda_to_host(c, h, labels, (size_t)rows * sizeof(int32_t)));
    *lab = (int32_t *)h;
    *rest = (char *)h + lbytes;
    return GP_OK;
}

// --------------------------------------------------------------- softmax cross-entropy

static __global__ void xent_kernel(int64_t rows, int64_t classes, const float *logits,
                                   const int32_t *labels, double normalizer, double smoothing,
                                   float *dlogits, double *row_loss) {
    __shared__ double shd[GP_CUDA_THREADS];
    __shared__ float shf[GP_CUDA_THREADS];
    for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
        const float *x = logits + r * classes;
        float *d = dlogits ? dlogits + r * classes : NULL;
        const int32_t y = labels[r];
        if (y == -1) {
            if (d)
                for (int64_t j = threadIdx.x; j < classes; j += blockDim.x) d[j] = 0.0f;
            if (threadIdx.x == 0) row_loss[r] = 0;
            continue;
        }
        const float xy = x[y]; // read before any thread writes d (which may alias x)
        float m = -INFINITY;
        for (int64_t j = threadIdx.x; j < classes; j += blockDim.x) m = x[j] > m || x[j] != x[j] ? x[j] : m;
        const float mx = gp_block_max_nan(m, shf);
        double acc = 0;
        for (int64_t j = threadIdx.x; j < classes; j += blockDim.x) acc += (double)expf(x[j] - mx);
        const double sum = gp_block_sum(acc, shd); // also orders every read of x before the writes
        if (smoothing > 0) {
            // -sum q log p = lse - (1 - s) x[y] - s mean(x); dlogits (softmax - q) / normalizer
            double xs = 0;
            for (int64_t j = threadIdx.x; j < classes; j += blockDim.x) xs += (double)x[j];
            const double mean = gp_block_sum(xs, shd) / (double)classes;
            const double u = smoothing / (double)classes;
            if (threadIdx.x == 0)
                row_loss[r] =
                    (double)mx + log(sum) - (1.0 - smoothing) * (double)xy - smoothing * mean;
            if (!d) continue;
            for (int64_t j = threadIdx.x; j < classes; j += blockDim.x) {
                const double p = (double)expf(x[j] - mx) / sum;
                d[j] = (float)((p - u - (j == y ? 1.0 - smoothing : 0.0)) / normalizer);
            }
            continue;
        }
        if (threadIdx.x == 0) row_loss[r] = (double)mx + log(sum) - (double)xy;
        if (!d) continue;
        const double inv = 1.0 / (sum * normalizer);
        for (int64_t j = threadIdx.x; j < classes; j += blockDim.x) {
            const float e = expf(x[j] - mx);
            d[j] = j == y ? (float)(((double)e / sum - 1.0) / normalizer) : (float)(e * inv);
        }
    }
}

extern "C" gp_status gp_cuda_softmax_xent(gp_device *dev, int64_t rows, int64_t classes,
                                          const float *logits, const int32_t *labels,
                                          double normalizer, double smoothing, double *loss,
                                          float *dlogits) {
    gp_status s;
    gp_cuda_ctx *c = gp_cuda_begin(dev, &s);
    if (!c) return s;
    GP_TRY(gp_kernels_check_smoothing(smoothing));
    if (rows <= 0) {
        *loss = 0.0;
        return GP_OK;
    }
    int32_t *lab;
    void *rest;
    GP_TRY(labels_to_host(c, labels, rows, (size_t)rows * sizeof(double), &lab, &rest));
    int64_t counted;
    GP_TRY(gp_kernels_check_labels(rows, classes, lab, &counted));
    GP_TRY(gp_kernels_check_normalizer(normalizer, counted));
    double *row_loss = (double *)gp_cuda_workspace(dev, (size_t)rows * sizeof(double), &s);
    if (!row_loss) return s;
    xent_kernel<<<row_blocks(rows), GP_CUDA_THREADS, 0, c->stream>>>(
        rows, classes, logits, labels, normalizer, smoothing, dlogits, row_loss);
    s = gp_cuda_launched(c, "xent_kernel");
    double *h = (double *)rest;
    if (s == GP_OK) s = gp_cuda_to_host(c, h, row_loss, (size_t)rows * sizeof(double));
    gp_cuda_workspace_release(dev, row_loss);
    if (s != GP_OK) return s;
    double total = 0;
    for (int64_t r = 0; r < rows; r++) total += h[r]; // rows in order
    *loss = counted ? total / normalizer : 0.0;
    return GP_OK;
}

// ----------------------------------------------------------------------------- row maximum

static __global__ void row_max_kernel(int64_t rows, int64_t cols, const float *x, float *out) {
    __shared__ float sh[GP_CUDA_THREADS];
    for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
        const float *v = x + r * cols;
        float m = -INFINITY;
        for (int64_t j = threadIdx.x; j < cols; j += blockDim.x) m = v[j] > m || v[j] != v[j] ? v[j] : m;
        m = gp_block_max_nan(m, sh);
        if (threadIdx.x == 0) out[r] = m;
    }
}

extern "C" gp_status gp_cuda_row_max(gp_device *dev, int64_t rows, int64_t cols, const float *x,
                                     float *out) {
    gp_status s;
    gp_cuda_ctx *c = gp_cuda_begin(dev, &s);
    if (!c) return s;
    if (cols < 1)
        return gp_error(GP_INVALID_ARGUMENT, "row maximum of %lld columns, expected >= 1",
                        (long long)cols);
    if (rows > 0) GP_CUDA_LAUNCH_BLOCKS(c, row_max_kernel, row_blocks(rows), rows, cols, x, out);
    return GP_OK;
}

// ------------------------------------------------------------ cross-entropy over shards

static __global__ void shard_sums_kernel(int64_t rows, int64_t classes, int64_t first,
                                         const float *logits, const int32_t *labels,
                                         const float *mx, bool shifted_sum, float *sums) {
    __shared__ double sh[GP_CUDA_THREADS];
    for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
        const float *x = logits + r * classes;
        const int64_t y = labels[r];
        if (y == -1) {
            if (threadIdx.x == 0) {
                sums[r] = sums[rows + r] = 0.0f;
                if (shifted_sum) sums[2 * rows + r] = 0.0f;
            }
            continue;
        }
        double acc = 0;
        for (int64_t j = threadIdx.x; j < classes; j += blockDim.x) acc += (double)expf(x[j] - mx[r]);
        const double sum = gp_block_sum(acc, sh);
        if (threadIdx.x == 0) {
            sums[r] = (float)sum;
            sums[rows + r] = y >= first && y < first + classes ? x[y - first] - mx[r] : 0.0f;
        }
        if (shifted_sum) { // label smoothing's sum of x - mx over the shard's classes
            double t = 0;
            for (int64_t j = threadIdx.x; j < classes; j += blockDim.x) t += (double)x[j] - mx[r];
            const double shifted = gp_block_sum(t, sh);
            if (threadIdx.x == 0) sums[2 * rows + r] = (float)shifted;
        }
    }
}

extern "C" gp_status gp_cuda_xent_shard_sums(gp_device *dev, int64_t rows, int64_t classes,
                                             int64_t vocab, int64_t first, const float *logits,
                                             const int32_t *labels, const float *mx,
                                             double smoothing, float *sums) {
    gp_status s;
    gp_cuda_ctx *c = gp_cuda_begin(dev, &s);
    if (!c) return s;
    GP_TRY(gp_kernels_check_shard(vocab, first, classes, "cross-entropy classes"));
    GP_TRY(gp_kernels_check_smoothing(smoothing));
    if (rows <= 0) return GP_OK;
    int32_t *lab;
    void *rest;
    GP_TRY(labels_to_host(c, labels, rows, 0, &lab, &rest));
    GP_TRY(gp_kernels_check_labels(rows, vocab, lab, NULL));
    GP_CUDA_LAUNCH_BLOCKS(c, shard_sums_kernel, row_blocks(rows), rows, classes, first, logits,
                          labels, mx, smoothing > 0, sums);
    return GP_OK;
}

static __global__ void shard_grad_kernel(int64_t rows, int64_t classes, int64_t first,
                                         const float *logits, const int32_t *labels,
                                         const float *mx, const float *sums, double normalizer,
                                         double smoothing, double u, float *dlogits) {
    GP_CUDA_FOR(i, rows * classes) {
        const int64_t r = i / classes, j = i % classes;
        const int64_t y = labels[r];
        if (y == -1) {
            dlogits[i] = 0.0f;
            continue;
        }
        const double sum = sums[r];
        const float e = expf(logits[i] - mx[r]);
        if (smoothing > 0) { // the CPU's smoothed gradient, term for term
            const double p = (double)e / sum - u;
            dlogits[i] = (float)((first + j == y ? p - (1.0 - smoothing) : p) / normalizer);
            continue;
        }
        const double inv = 1.0 / (sum * normalizer);
        dlogits[i] = first + j == y ? (float)(((double)e / sum - 1.0) / normalizer)
                                    : (float)(e * inv);
    }
}

extern "C" gp_status gp_cuda_xent_shard_finish(gp_device *dev, int64_t rows, int64_t classes,
                                               int64_t vocab, int64_t first, const float *logits,
                                               const int32_t *labels, const float *mx,
                                               const float *sums, double normalizer,
                                               double smoothing, double *loss, float *dlogits) {
    gp_status s;
    gp_cuda_ctx *c = gp_cuda_begin(dev, &s);
    if (!c) return s;
    GP_TRY(gp_kernels_check_shard(vocab, first, classes, "cross-entropy classes"));
    GP_TRY(gp_kernels_check_smoothing(smoothing));
    if (rows <= 0) {
        *loss = 0.0;
        return GP_OK;
    }
    const size_t nsums = (smoothing > 0 ? 3 : 2) * (size_t)rows;
    int32_t *lab;
    void *rest;
    GP_TRY(labels_to_host(c, labels, rows, nsums * sizeof(float), &lab, &rest));
    int64_t counted;
    GP_TRY(gp_kernels_check_labels(rows, vocab, lab, &counted));
    GP_TRY(gp_kernels_check_normalizer(normalizer, counted));
    float *h = (float *)rest;
    GP_TRY(gp_cuda_to_host(c, h, sums, nsums * sizeof(float)));
    const double u = smoothing / (double)vocab;
    double total = 0; // the CPU's sum: rows in order, in double
    for (int64_t r = 0; r < rows; r++) {
        if (lab[r] == -1) continue;
        if (smoothing > 0)
            total += log((double)h[r]) - (1.0 - smoothing) * (double)h[rows + r] -
                     u * (double)h[2 * rows + r];
        else
            total += log((double)h[r]) - (double)h[rows + r];
    }
    if (dlogits && classes > 0)
        GP_CUDA_LAUNCH(c, shard_grad_kernel, rows * classes, rows, classes, first, logits, labels,
                       mx, sums, normalizer, smoothing, u, dlogits);
    *loss = counted ? total / normalizer : 0.0;
    return GP_OK;
}
