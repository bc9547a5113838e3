// CUDA batch norm and pooling. Batch norm takes a block per channel, its sums in double in a
// fixed order (thread t takes the elements t, t + 256, ... of the channel's planes, in order);
// max pooling a thread per output for the forward (the CPU's rule for ties and NaNs, so the
// same indices) and a thread per plane for the backward, which scatters in output order as the
// CPU does (overlapping windows add in that order, without atomics).
#include "kernels/cuda/cuda_kernels.h"
#include "kernels/cuda/math.cuh"

static unsigned item_blocks(int64_t n) {
    return (unsigned)(n < GP_CUDA_MAX_GRID ? (n > 0 ? n : 1) : GP_CUDA_MAX_GRID);
}

// ------------------------------------------------------------------------------ batch norm

static __global__ void bn_forward_kernel(gp_bn_dims d, const float *x, const float *gamma,
                                         const float *beta, float *running_mean,
                                         float *running_var, bool batch_stats,
                                         bool update_running, float *stats, float *y) {
    __shared__ double sh[GP_CUDA_THREADS];
    const int64_t nch = d.channels, hw = d.hw, count = d.batch * hw;
    for (int64_t c = blockIdx.x; c < nch; c += gridDim.x) {
        double mean, invstd;
        if (batch_stats) {
            double t = 0;
            for (int64_t i = threadIdx.x; i < count; i += blockDim.x)
                t += (double)x[(i / hw * nch + c) * hw + i % hw];
            mean = gp_block_sum(t, sh) / (double)count;
            double t2 = 0;
            for (int64_t i = threadIdx.x; i < count; i += blockDim.x) {
                const double dv = (double)x[(i / hw * nch + c) * hw + i % hw] - mean;
                t2 += dv * dv;
            }
            const double ss = gp_block_sum(t2, sh);
            invstd = 1.0 / sqrt(ss / (double)count + d.eps); // biased variance normalizes
            if (update_running && threadIdx.x == 0) {
                const double unbiased = ss / (double)(count - 1);
                running_mean[c] = (float)((1.0 - d.momentum) * running_mean[c] + d.momentum * mean);
                running_var[c] = (float)((1.0 - d.momentum) * running_var[c] + d.momentum * unbiased);
            }
        } else {
            mean = running_mean[c];
            invstd = 1.0 / sqrt((double)running_var[c] + d.eps);
        }
        const float m = (float)mean, is = (float)invstd;
        const float scale = gamma[c] * is, shift = beta[c];
        if (threadIdx.x == 0) {
            stats[c] = m;
            stats[nch + c] = is;
        }
        for (int64_t i = threadIdx.x; i < count; i += blockDim.x) {
            const int64_t at = (i / hw * nch + c) * hw + i % hw;
            y[at] = (x[at] - m) * scale + shift;
        }
    }
}

extern "C" gp_status gp_cuda_batchnorm_forward(gp_device *dev, const gp_bn_dims *d,
                                               const float *x, const float *gamma,
                                               const float *beta, float *running_mean,
                                               float *running_var, bool batch_stats,
                                               bool update_running, float *stats, float *y) {
    gp_status s;
    gp_cuda_ctx *c = gp_cuda_begin(dev, &s);
    if (!c) return s;
    if (d->channels > 0)
        GP_CUDA_LAUNCH_BLOCKS(c, bn_forward_kernel, item_blocks(d->channels), *d, x, gamma, beta,
                              running_mean, running_var, batch_stats, update_running, stats, y);
    return GP_OK;
}

static __global__ void bn_backward_kernel(gp_bn_dims d, const float *x, const float *dy,
                                          const float *stats, const float *gamma,
                                          bool batch_stats, float *dx, float *dgamma,
                                          float *dbeta) {
    __shared__ double sh[GP_CUDA_THREADS];
    const int64_t nch = d.channels, hw = d.hw, count = d.batch * hw;
    for (int64_t c = blockIdx.x; c < nch; c += gridDim.x) {
        const float m = stats[c], is = stats[nch + c];
        double t1 = 0, t2 = 0; // sum dy, sum dy (x - mean)
        for (int64_t i = threadIdx.x; i < count; i += blockDim.x) {
            const int64_t at = (i / hw * nch + c) * hw + i % hw;
            t1 += (double)dy[at];
            t2 += (double)dy[at] * ((double)x[at] - (double)m);
        }
        const double sdy = gp_block_sum(t1, sh);
        const double sdy_xhat = gp_block_sum(t2, sh) * is;
        if (threadIdx.x == 0) {
            dgamma[c] += (float)sdy_xhat;
            dbeta[c] += (float)sdy;
        }
        if (!dx) continue;
        // batch statistics: dx = gamma invstd (dy - mean(dy) - xhat mean(dy xhat)); running
        // statistics are constants: dx = gamma invstd dy.
        const float k1 = gamma[c] * is;
        const float ma = batch_stats ? (float)(sdy / (double)count) : 0.0f;
        const float bc = batch_stats ? (float)(sdy_xhat / (double)count * is) : 0.0f;
        for (int64_t i = threadIdx.x; i < count; i += blockDim.x) {
            const int64_t at = (i / hw * nch + c) * hw + i % hw;
            dx[at] = k1 * (dy[at] - ma - (x[at] - m) * bc);
        }
    }
}

extern "C" gp_status gp_cuda_batchnorm_backward(gp_device *dev, const gp_bn_dims *d,
                                                const float *x, const float *dy,
                                                const float *stats, const float *gamma,
                                                bool batch_stats, float *dx, float *dgamma,
                                                float *dbeta) {
    gp_status s;
    gp_cuda_ctx *c = gp_cuda_begin(dev, &s);
    if (!c) return s;
    if (d->channels > 0)
        GP_CUDA_LAUNCH_BLOCKS(c, bn_backward_kernel, item_blocks(d->channels), *d, x, dy, stats,
                              gamma, batch_stats, dx, dgamma, dbeta);
    return GP_OK;
}

// -------------------------------------------------------------------------------- pooling

// The first maximum in window order, except that a NaN wins (the last NaN): the CPU's rule.
static __global__ void maxpool_forward_kernel(gp_pool_dims d, const float *x, float *y,
                                              int32_t *argmax) {
    const int64_t ohw = d.out_h * d.out_w;
    GP_CUDA_FOR(i, d.planes * ohw) {
        const int64_t p = i / ohw, oh = i % ohw / d.out_w, ow = i % d.out_w;
        const float *xp = x + p * d.height * d.width;
        const int64_t first = oh * d.stride * d.width + ow * d.stride;
        int64_t idx = first;
        float best = -INFINITY;
        for (int64_t ki = 0; ki < d.kernel; ki++)
            for (int64_t kj = 0; kj < d.kernel; kj++) {
                const int64_t at = first + ki * d.width + kj;
                const float v = xp[at];
                if (v > best || v != v) {
                    best = v;
                    idx = at;
                }
            }
        y[i] = best;
        argmax[i] = (int32_t)idx;
    }
}

extern "C" gp_status gp_cuda_maxpool_forward(gp_device *dev, const gp_pool_dims *d,
                                             const float *x, float *y, int32_t *argmax) {
    gp_status s;
    gp_cuda_ctx *c = gp_cuda_begin(dev, &s);
    if (!c) return s;
    const int64_t n = d->planes * d->out_h * d->out_w;
    if (n > 0) GP_CUDA_LAUNCH(c, maxpool_forward_kernel, n, *d, x, y, argmax);
    return GP_OK;
}

static __global__ void zero_kernel(int64_t n, float *x) {
    GP_CUDA_FOR(i, n) x[i] = 0.0f;
}

// A thread per plane: dy scattered onto the maxima in output order.
static __global__ void maxpool_backward_kernel(gp_pool_dims d, const int32_t *argmax,
                                               const float *dy, float *dx) {
    const int64_t hw = d.height * d.width, ohw = d.out_h * d.out_w;
    GP_CUDA_FOR(p, d.planes) {
        float *dxp = dx + p * hw;
        const float *dyp = dy + p * ohw;
        const int32_t *ap = argmax + p * ohw;
        for (int64_t i = 0; i < ohw; i++) dxp[ap[i]] += dyp[i];
    }
}

extern "C" gp_status gp_cuda_maxpool_backward(gp_device *dev, const gp_pool_dims *d,
                                              const int32_t *argmax, const float *dy,
                                              float *dx) {
    gp_status s;
    gp_cuda_ctx *c = gp_cuda_begin(dev, &s);
    if (!c) return s;
    const int64_t n = d->planes * d->height * d->width;
    if (n <= 0) return GP_OK;
    GP_CUDA_LAUNCH(c, zero_kernel, n, n, dx);
    GP_CUDA_LAUNCH(c, maxpool_backward_kernel, d->planes, *d, argmax, dy, dx);
    return GP_OK;
}

// A block per plane: its mean, summed in double in a fixed order.
static __global__ void avgpool_forward_kernel(int64_t planes, int64_t hw, const float *x,
                                              float *y) {
    __shared__ double sh[GP_CUDA_THREADS];
    for (int64_t p = blockIdx.x; p < planes; p += gridDim.x) {
        double t = 0;
        for (int64_t i = threadIdx.x; i < hw; i += blockDim.x) t += (double)x[p * hw + i];
        const double sum = gp_block_sum(t, sh);
        if (threadIdx.x == 0) y[p] = (float)(sum / (double)hw);
    }
}

extern "C" gp_status gp_cuda_avgpool_forward(gp_device *dev, int64_t planes, int64_t hw,
                                             const float *x, float *y) {
    gp_status s;
    gp_cuda_ctx *c = gp_cuda_begin(dev, &s);
    if (!c) return s;
    if (planes > 0)
        GP_CUDA_LAUNCH_BLOCKS(c, avgpool_forward_kernel, item_blocks(planes), planes, hw, x, y);
    return GP_OK;
}

static __global__ void avgpool_backward_kernel(int64_t planes, int64_t hw, const float *dy,
                                               float *dx) {
    GP_CUDA_FOR(i, planes * hw) dx[i] = dy[i / hw] / (float)hw;
}

extern "C" gp_status gp_cuda_avgpool_backward(gp_device *dev, int64_t planes, int64_t hw,
                                              const float *dy, float *dx) {
    gp_status s;
    gp_cuda_ctx *c = gp_cuda_begin(dev, &s);
    if (!c) return s;
    if (planes * hw > 0)
        GP_CUDA_LAUNCH(c, avgpool_backward_kernel, planes * hw, planes, hw, dy, dx);
    return GP_OK;
}
