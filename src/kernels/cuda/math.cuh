/* Device-side helpers of the CUDA kernels: grid-stride loops, block reductions in a fixed order
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

/* Reductions in a fixed order: the xor butterfly within a warp (every lane ends with the same
 * bits: each step adds the same two values on both lanes, and a + b = b + a exactly), then the
 * warps' results in warp order by every thread. The order depends on blockDim.x alone (a multiple
 * of 32), never on scheduling. A tree over shared memory took eight barriers a reduction and left
 * the row kernels (softmax, layer norm) waiting on them. */
#define GP_CUDA_FULL_WARP 0xffffffffu

template <typename T>
__device__ inline T gp_warp_sum(T v) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(GP_CUDA_FULL_WARP, v, o);
    return v;
}

/* The larger of a and b, a NaN winning (any NaN in: NaN out). Lanes may end with +0 and -0 (or
 * NaNs of other payloads) where those tie; both act alike in what follows (x - m, exp). */
__device__ inline float gp_max_nan(float a, float b) { return (b > a || b != b) ? b : a; }

__device__ inline float gp_warp_max_nan(float v) {
    for (int o = 16; o > 0; o >>= 1) v = gp_max_nan(v, __shfl_xor_sync(GP_CUDA_FULL_WARP, v, o));
    return v;
}

/* The sum over the block of each thread's v; every thread gets the total. sh: blockDim.x / 32
 * values of shared memory (blockDim.x of them always suffice). */
template <typename T>
__device__ inline T gp_block_sum(T v, T *sh) {
    v = gp_warp_sum(v);
    if ((threadIdx.x & 31) == 0) sh[threadIdx.x >> 5] = v;
    __syncthreads();
    T r = sh[0];
    for (unsigned w = 1; w < (blockDim.x >> 5); w++) r += sh[w];
    __syncthreads(); /* sh may be reused right away */
    return r;
}

/* The largest of the threads' values, a NaN winning. */
__device__ inline float gp_block_max_nan(float v, float *sh) {
    v = gp_warp_max_nan(v);
    if ((threadIdx.x & 31) == 0) sh[threadIdx.x >> 5] = v;
    __syncthreads();
    float r = sh[0];
    for (unsigned w = 1; w < (blockDim.x >> 5); w++) r = gp_max_nan(r, sh[w]);
    __syncthreads();
    return r;
}

/* Four neighbouring floats a thread (16-byte loads and stores) where every array of an
 * elementwise kernel is 16-byte aligned: one float a thread moved about 1.7 TB/s of the H200's
 * 4.8. The arithmetic of each element is unchanged, and so are its bits. */
template <typename... P>
__host__ inline bool gp_cuda_aligned16(const P *...p) {
    return ((((uintptr_t)p & 15u) == 0) && ...);
}

__device__ inline void gp_ld4(const float *p, int64_t i, float v[4]) {
    const float4 t = reinterpret_cast<const float4 *>(p)[i];
    v[0] = t.x, v[1] = t.y, v[2] = t.z, v[3] = t.w;
}

__device__ inline void gp_st4(float *p, int64_t i, const float v[4]) {
    reinterpret_cast<float4 *>(p)[i] = make_float4(v[0], v[1], v[2], v[3]);
}

/* The vectors of an elementwise kernel over n floats: n / 4 when vec, else none (the rest go one
 * by one: GP_CUDA_FOR_TAIL). */
__host__ __device__ inline int64_t gp_cuda_vecs(bool vec, int64_t n) { return vec ? n / 4 : 0; }

/* Each index i in [4 n4, n) once, over the whole grid: what the vectors left. */
#define GP_CUDA_FOR_TAIL(i, n4, n)                                                          \
    for (int64_t i = 4 * (n4) + (int64_t)blockIdx.x * blockDim.x + threadIdx.x;             \
         i < (int64_t)(n); i += (int64_t)blockDim.x * gridDim.x)

/* Blocks for an elementwise kernel over n floats in vectors where vec. */
__host__ inline unsigned gp_cuda_vec_blocks(bool vec, int64_t n) {
    const int64_t n4 = gp_cuda_vecs(vec, n);
    return gp_cuda_blocks(n4 > n - 4 * n4 ? n4 : n - 4 * n4);
}

/* Row kernels keep a row's elements in registers where the row is short enough, PER of them a
 * thread (element j = t + k * step for the thread's t and k = 0 .. PER - 1: the order in which a
 * loop over memory visits them, so the sums and the bits are the same): each element is read
 * from memory once. PER = 0: no copy, each pass reads the row again (longer rows). */
#define GP_CUDA_ROW_PER_MAX 32

/* The PER of rows of dim elements over `step` threads: the least power of two that holds them,
 * 0 past GP_CUDA_ROW_PER_MAX. */
__host__ inline int gp_cuda_row_per(int64_t dim, int64_t step) {
    const int64_t need = (dim + step - 1) / step;
    for (int per = 1; per <= GP_CUDA_ROW_PER_MAX; per *= 2)
        if (need <= per) return per;
    return 0;
}

/* The launch of kernel<PER> for a PER of gp_cuda_row_per: one of a fixed set of instances;
 * ..._QUEUE launches alone (its check, gp_cuda_launched, left to the caller). */
#define GP_CUDA_ROW_QUEUE(c, kernel, per, grid, threads, ...)                                \
    do {                                                                                     \
        switch (per) {                                                                       \
        case 1: kernel<1><<<(grid), (threads), 0, (c)->stream>>>(__VA_ARGS__); break;      \
        case 2: kernel<2><<<(grid), (threads), 0, (c)->stream>>>(__VA_ARGS__); break;      \
        case 4: kernel<4><<<(grid), (threads), 0, (c)->stream>>>(__VA_ARGS__); break;      \
        case 8: kernel<8><<<(grid), (threads), 0, (c)->stream>>>(__VA_ARGS__); break;      \
        case 16: kernel<16><<<(grid), (threads), 0, (c)->stream>>>(__VA_ARGS__); break;    \
        case 32: kernel<32><<<(grid), (threads), 0, (c)->stream>>>(__VA_ARGS__); break;    \
        default: kernel<0><<<(grid), (threads), 0, (c)->stream>>>(__VA_ARGS__); break;     \
        }                                                                                    \
    } while (0)
#define GP_CUDA_ROW_LAUNCH(c, kernel, per, grid, threads, ...)                               \
    do {                                                                                     \
        GP_CUDA_ROW_QUEUE(c, kernel, per, grid, threads, __VA_ARGS__);                       \
        GP_TRY(gp_cuda_launched((c), #kernel));                                              \
    } while (0)

/* The passes of a row kernel over elements t, t + step, ... below dim: k counts the thread's
 * elements (its register, where PER), j is the element; the body checks j < dim. */
#define GP_CUDA_ROW_FOR(PER, k, j, t, step, dim)                                             \
    _Pragma("unroll") for (int64_t k = 0, j = (t); (PER) ? k < (PER) : j < (dim); k++, j += (step))

/* Register k of a row kernel's copy (index 0 where PER = 0, never read then). */
#define GP_CUDA_ROW_REG(PER, k) ((PER) ? (k) : 0)

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
