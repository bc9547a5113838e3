// CUDA kernels over flat arrays: fills and scales, bias sums, squared norms and the ReLUs. An
// element-wise op is one grid-stride loop; a sum gives each output to one thread (a column of
// a bias sum adds its rows in order, as the CPU's) or to a fixed tree (the squared norm), so
// the bits never depend on scheduling.
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

// One thread per column, the rows in order: the CPU's sum, bit for bit. Threads of a warp
// read neighbouring columns of a row: coalesced.
static __global__ void sum_rows_kernel(const float *x, int64_t rows, int64_t cols, float *out) {
    GP_CUDA_FOR(j, cols) {
        float acc = out[j];
        for (int64_t i = 0; i < rows; i++) acc += x[i * cols + j];
        out[j] = acc;
    }
}

extern "C" gp_status gp_cuda_sum_rows_add(gp_device *dev, const float *x, int64_t rows,
                                          int64_t cols, float *out) {
    gp_status s;
    gp_cuda_ctx *c = gp_cuda_begin(dev, &s);
    if (!c) return s;
    if (cols > 0 && rows > 0) GP_CUDA_LAUNCH(c, sum_rows_kernel, cols, x, rows, cols, out);
    return GP_OK;
}

// The squared norm in SUMSQ_BLOCKS blocks of consecutive elements (block b of the range cut
// by the length alone), each summed by a block of threads into a fixed tree, then the blocks
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
