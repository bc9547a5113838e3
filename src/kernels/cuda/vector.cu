// CUDA kernels over flat arrays: fills and scales, bias sums, squared norms and the ReLUs. An
// element-wise op is one grid-stride loop; a sum adds in a fixed order (a bias sum's column in
// chunks of rows, then the chunks in order; the squared norm in a fixed order), so the bits
// never depend on scheduling.
#include "kernels/cuda/cuda_kernels.h"
#include "kernels/cuda/math.cuh"

static __global__ void fill_kernel(float *x, int64_t n, float v) {
    GP_CUDA_FOR(i, n) x[i] = v;
}

extern "C" gp_status gp_cuda_fill(gp_device *dev, float *x, int64_t n, float value) {
    gp_status s;
    gp_cuda_ctx *c = gp_cuda_begin(dev, &s);
    if (!c) return s;
    if (n > 0) GP_CUDA_LAUNCH(c, fill_kernel, n, x, n, value);
    return GP_OK;
}

static __global__ void scale_kernel(float *x, int64_t n, float a) {
    GP_CUDA_FOR(i, n) x[i] *= a;
}

extern "C" gp_status gp_cuda_scale(gp_device *dev, float *x, int64_t n, float alpha) {
    gp_status s;
    gp_cuda_ctx *c = gp_cuda_begin(dev, &s);
    if (!c) return s;
    if (n > 0) GP_CUDA_LAUNCH(c, scale_kernel, n, x, n, alpha);
    return GP_OK;
}

static __global__ void axpy_kernel(int64_t n, float a, const float *x, float *y) {
    GP_CUDA_FOR(i, n) y[i] += a * x[i];
}

extern "C" gp_status gp_cuda_axpy(gp_device *dev, int64_t n, float alpha, const float *x,
                                  float *y) {
    gp_status s;
    gp_cuda_ctx *c = gp_cuda_begin(dev, &s);
    if (!c) return s;
    if (n > 0) GP_CUDA_LAUNCH(c, axpy_kernel, n, n, alpha, x, y);
    return GP_OK;
}

// Bias sums in chunks of rows (math.cuh, GP_CUDA_SUM_CHUNK): chunk b's partial of column j in
// part[b cols + j].
static __global__ void sum_rows_partial_kernel(const float *x, int64_t rows, int64_t cols,
                                               float *part) {
    GP_CUDA_FOR(t, gp_cuda_sum_chunks(rows) * cols) {
        const int64_t b = t / cols, j = t % cols;
        const int64_t i1 = (b + 1) * GP_CUDA_SUM_CHUNK < rows ? (b + 1) * GP_CUDA_SUM_CHUNK : rows;
        float a = 0.0f;
        for (int64_t i = b * GP_CUDA_SUM_CHUNK; i < i1; i++) a += x[i * cols + j];
        part[t] = a;
    }
}

// out0[j] += column j's partials in chunk order, and out1[j] += those at part + nchunks cols
// where out1 is given (layer norm's dw and db in one launch).
static __global__ void sum_partials_kernel(const float *part, int64_t nchunks, int64_t cols,
                                           float *out0, float *out1) {
    GP_CUDA_FOR(t, (out1 ? 2 : 1) * cols) {
        const int64_t o = t / cols, j = t % cols;
        float *out = o ? out1 : out0;
        const float *p = part + o * nchunks * cols;
        float acc = out[j];
        for (int64_t b = 0; b < nchunks; b++) acc += p[b * cols + j];
        out[j] = acc;
    }
}

extern "C" gp_status gp_cuda_sum_partials(gp_cuda_ctx *c, const float *part, int64_t nchunks,
                                          int64_t cols, float *out0, float *out1) {
    GP_CUDA_LAUNCH(c, sum_partials_kernel, (out1 ? 2 : 1) * cols, part, nchunks, cols, out0, out1);
    return GP_OK;
}

extern "C" gp_status gp_cuda_sum_rows_add(gp_device *dev, const float *x, int64_t rows,
                                          int64_t cols, float *out) {
    gp_status s;
    gp_cuda_ctx *c = gp_cuda_begin(dev, &s);
    if (!c) return s;
    if (cols <= 0 || rows <= 0) return GP_OK;
    const int64_t nchunks = gp_cuda_sum_chunks(rows);
    float *part = (float *)gp_cuda_workspace(dev, (size_t)(nchunks * cols) * sizeof(float), &s);
    if (!part) return s;
    sum_rows_partial_kernel<<<gp_cuda_blocks(nchunks * cols), GP_CUDA_THREADS, 0, c->stream>>>(
        x, rows, cols, part);
    s = gp_cuda_launched(c, "sum_rows_partial_kernel");
    if (s == GP_OK) s = gp_cuda_sum_partials(c, part, nchunks, cols, out, NULL);
    gp_cuda_workspace_release(dev, part); // later work on the stream comes after the kernels
    return s;
}

// The squared norm in SUMSQ_BLOCKS blocks of consecutive elements (block b of the range cut
// by the length alone), each summed by a block of threads in a fixed order, then the blocks
// in order by one thread: a fixed order, as the CPU's, though not the same one.
enum { SUMSQ_BLOCKS = 64 };

static __global__ void sumsq_blocks_kernel(const float *x, int64_t n, double *partial) {
    __shared__ double sh[GP_CUDA_THREADS];
    const int64_t per = (n + SUMSQ_BLOCKS - 1) / SUMSQ_BLOCKS;
    const int64_t lo = blockIdx.x * per, hi = lo + per < n ? lo + per : n;
    double acc = 0;
    for (int64_t i = lo + threadIdx.x; i < hi; i += blockDim.x) acc += (double)x[i] * x[i];
    const double total = gp_block_sum(acc, sh);
    if (threadIdx.x == 0) partial[blockIdx.x] = total;
}

static __global__ void sumsq_total_kernel(const double *partial, double *out) {
    double s = 0;
    for (int b = 0; b < SUMSQ_BLOCKS; b++) s += partial[b];
    *out = s;
}

extern "C" gp_status gp_cuda_sumsq(gp_device *dev, const float *x, int64_t n, double *out) {
    gp_status s;
    gp_cuda_ctx *c = gp_cuda_begin(dev, &s);
    if (!c) return s;
    if (n <= 0) {
        *out = 0;
        return GP_OK;
    }
    double *ws = (double *)gp_cuda_workspace(dev, (SUMSQ_BLOCKS + 1) * sizeof(double), &s);
    if (!ws) return s;
    sumsq_blocks_kernel<<<SUMSQ_BLOCKS, GP_CUDA_THREADS, 0, c->stream>>>(x, n, ws);
    s = gp_cuda_launched(c, "sumsq_blocks_kernel");
    if (s == GP_OK) {
        sumsq_total_kernel<<<1, 1, 0, c->stream>>>(ws, ws + SUMSQ_BLOCKS);
        s = gp_cuda_launched(c, "sumsq_total_kernel");
    }
    void *host = NULL;
    if (s == GP_OK) s = gp_cuda_host_scratch(c, sizeof(double), &host);
    if (s == GP_OK) s = gp_cuda_to_host(c, host, ws + SUMSQ_BLOCKS, sizeof(double));
    if (s == GP_OK) *out = *(const double *)host;
    gp_cuda_workspace_release(dev, ws);
    return s;
}

static __global__ void relu_kernel(int64_t n, const float *x, float *y) {
    GP_CUDA_FOR(i, n) y[i] = x[i] > 0.0f ? x[i] : 0.0f;
}

extern "C" gp_status gp_cuda_relu_forward(gp_device *dev, int64_t n, const float *x, float *y) {
    gp_status s;
    gp_cuda_ctx *c = gp_cuda_begin(dev, &s);
    if (!c) return s;
    if (n > 0) GP_CUDA_LAUNCH(c, relu_kernel, n, n, x, y);
    return GP_OK;
}

static __global__ void relu_back_kernel(int64_t n, const float *x, const float *dy, float *dx) {
    GP_CUDA_FOR(i, n) dx[i] = x[i] > 0.0f ? dy[i] : 0.0f;
}

extern "C" gp_status gp_cuda_relu_backward(gp_device *dev, int64_t n, const float *x,
                                           const float *dy, float *dx) {
    gp_status s;
    gp_cuda_ctx *c = gp_cuda_begin(dev, &s);
    if (!c) return s;
    if (n > 0) GP_CUDA_LAUNCH(c, relu_back_kernel, n, n, x, dy, dx);
    return GP_OK;
}
