/* Device-side helpers of the CUDA kernels: grid-stride loops, block reductions in a fixed tree
 * (the order is set by the block size and the data's length, never by scheduling: no atomics),
 * the CPU's exp approximation (kernels/cpu/transformer_math.h) so that softmax and GELU round
 * as the CPU's do, and Philox4x32-10 as core/rng.c computes it (dropout masks equal the CPU's
 * bit for bit). */
#ifndef GP_KERNELS_CUDA_MATH_CUH
#define GP_KERNELS_CUDA_MATH_CUH

#include <stdint.h>

#include "gpipe.h"
#include "kernels/cuda/cuda_context.h"

/* Every index i in [0, n) once, over the whole grid. */
#define GP_CUDA_FOR(i, n)                                                                   \
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < (int64_t)(n);      \
         i += (int64_t)blockDim.x * gridDim.x)

/* The launch of a kernel over n items with the device's stream, then its check. */
#define GP_CUDA_LAUNCH(c, kernel, n, ...)                                                    \
    do {                                                                                     \
        kernel<<<gp_cuda_blocks(n), GP_CUDA_THREADS, 0, (c)->stream>>>(__VA_ARGS__);         \
        GP_TRY(gp_cuda_launched((c), #kernel));                                              \
    } while (0)

/* The same with `blocks` blocks of GP_CUDA_THREADS (one block per row, channel, ...). */
#define GP_CUDA_LAUNCH_BLOCKS(c, kernel, blocks, ...)                                        \
    do {                                                                                     \
        kernel<<<(unsigned)(blocks), GP_CUDA_THREADS, 0, (c)->stream>>>(__VA_ARGS__);        \
        GP_TRY(gp_cuda_launched((c), #kernel));                                              \
    } while (0)

/* Column sums over many rows (bias and layer-norm gradients) in chunks of GP_CUDA_SUM_CHUNK rows:
 * chunk b's partial of column j adds its rows in order from zero, one thread per (b, j), the
 * threads of a warp on neighbouring columns (coalesced); then a thread per column adds the
 * partials in chunk order to what the output held. A thread per column over all the rows left
 * most of the GPU idle (4.4 ms for T3's 8192 x 2048 layer-norm gradients); the chunks depend on
 * the row count alone, so the bits do not depend on the launch. */
#define GP_CUDA_SUM_CHUNK 128
__host__ __device__ inline int64_t gp_cuda_sum_chunks(int64_t rows) {
    return (rows + GP_CUDA_SUM_CHUNK - 1) / GP_CUDA_SUM_CHUNK;
}

/* Largest grid dimension a one-block-per-item launch may use; kernels loop past it. */
#define GP_CUDA_MAX_GRID 65535

/* The sum over the block of each thread's v: thread t's value is added into a fixed binary tree
 * (blockDim.x a power of two). Every thread gets the total. sh: blockDim.x values of shared
 * memory. */
template <typename T>
__device__ inline T gp_block_sum(T v, T *sh) {
    sh[threadIdx.x] = v;
    __syncthreads();
    for (unsigned s = blockDim.x / 2; s > 0; s >>= 1) {
        if (threadIdx.x < s) sh[threadIdx.x] += sh[threadIdx.x + s];
        __syncthreads();
    }
    const T r = sh[0];
    __syncthreads(); /* sh may be reused right away */
    return r;
}

/* The largest of the threads' values, a NaN winning (any NaN in: NaN out). */
__device__ inline float gp_block_max_nan(float v, float *sh) {
    sh[threadIdx.x] = v;
    __syncthreads();
    for (unsigned s = blockDim.x / 2; s > 0; s >>= 1) {
        if (threadIdx.x < s) {
            const float a = sh[threadIdx.x], b = sh[threadIdx.x + s];
            sh[threadIdx.x] = (b > a || b != b) ? b : a;
        }
        __syncthreads();
    }
    const float r = sh[0];
    __syncthreads();
    return r;
}

/* The CPU's gp_exp_core and gp_exp (transformer_math.h), with fmaf where it has GP_FMA (the CPU
 * fuses there when the machine has FMA, as every GPU does). */
__device__ inline float gp_cuda_exp_core(float x) {
    const float shifter = 12582912.0f;
    const float kb = fmaf(x, 1.44269504f, shifter);
    const float kf = kb - shifter;
    float r = fmaf(kf, -0.693359375f, x);
    r = fmaf(kf, 2.12194440e-4f, r);
    float p = 1.0f / 5040.0f;
    p = fmaf(p, r, 1.0f / 720.0f);
    p = fmaf(p, r, 1.0f / 120.0f);
    p = fmaf(p, r, 1.0f / 24.0f);
    p = fmaf(p, r, 1.0f / 6.0f);
    p = fmaf(p, r, 0.5f);
    p = fmaf(p, r, 1.0f);
    p = fmaf(p, r, 1.0f);
    const float sb = __uint_as_float((__float_as_uint(kb) - 0x4B400000u + 127u) << 23);
    return p * sb;
}

__device__ inline float gp_cuda_exp(float x) {
    float xc = x < -87.0f ? -87.0f : x;
    xc = xc > 88.0f ? 88.0f : xc;
    const float e = gp_cuda_exp_core(xc);
    return x < -87.0f ? 0.0f : e;
}

/* Philox4x32-10 block `block` of stream s: core/rng.c's gp_rng_block, word for word. */
__device__ inline void gp_cuda_philox(const gp_rng_stream &s, uint64_t block, uint32_t out[4]) {
    uint32_t key0 = (uint32_t)s.seed ^ ((uint32_t)(block >> 32) * 0x85EBCA6Bu);
    uint32_t key1 = (uint32_t)(s.seed >> 32) ^ (s.purpose * 0x9E3779B9u);
    uint32_t c0 = (uint32_t)block, c1 = s.a, c2 = s.b, c3 = s.c;
    for (int r = 0; r < 10; r++) {
        const uint32_t hi0 = __umulhi(0xD2511F53u, c0), lo0 = 0xD2511F53u * c0;
        const uint32_t hi1 = __umulhi(0xCD9E8D57u, c2), lo1 = 0xCD9E8D57u * c2;
        const uint32_t n0 = hi1 ^ c1 ^ key0, n2 = hi0 ^ c3 ^ key1;
        c0 = n0;
        c1 = lo1;
        c2 = n2;
        c3 = lo0;
        key0 += 0x9E3779B9u;
        key1 += 0xBB67AE85u;
    }
    out[0] = c0, out[1] = c1, out[2] = c2, out[3] = c3;
}

/* Element e of the stream as a uniform in [0, 1): core/rng.c's gp_rng_uniform. */
__device__ inline float gp_cuda_uniform(const gp_rng_stream &s, uint64_t e) {
    uint32_t w[4];
    gp_cuda_philox(s, e / 4, w);
    return (float)(w[e % 4] >> 8) * (1.0f / 16777216.0f);
}

#endif
