// CUDA kernels of the Transformer family but the token embeddings (embedding.cu) and attention
// (attention.cu): linear layers (cuBLAS; a bf16 forward's bias and residual in cuBLASLt's
// epilogue), layer norm, GELU, dropout and the positional
// embedding. Row-wise sums use one block per row in a fixed order (math.cuh); column sums (the
// gradients of weights and biases) add the rows in order in chunks (GP_CUDA_SUM_CHUNK). Outputs
// kept in bf16 (kernel_ops.def: layer norm's and GELU's y16) are written so by the kernels that
// make them, and the linear ops hand a bf16 x16, and the store's bf16 weight copy w16, to cuBLAS
// as they are (gp_cuda_gemm_rounded).
#include "core/bf16.h"
#include "kernels/cuda/cuda_kernels.h"
#include "kernels/cuda/math.cuh"

#define LAYERNORM_EPS 1e-5f

static unsigned row_blocks(int64_t rows) {
    return (unsigned)(rows < GP_CUDA_MAX_GRID ? (rows > 0 ? rows : 1) : GP_CUDA_MAX_GRID);
}

// ---------------------------------------------------------------------------------- linear

// y = [res +] b, or res, before the GEMM adds x W^T onto it (beta = 1), as the CPU does: fp32,
// and bf16 where cuBLASLt's epilogue does not take it (gp_cuda_linear_lt); in vectors of four
// where the rows are (out a multiple of 4, the arrays aligned). The column takes a 32-bit
// remainder where the count allows: a 64-bit one costs more than the element's memory traffic.
__device__ inline void prefill_one(const float *b, const float *res, float *y, int64_t i,
                                   int64_t j) {
    y[i] = b && res ? res[i] + b[j] : b ? b[j] : res[i];
}

static __global__ void linear_prefill_kernel(int64_t rows, int64_t out, const float *b,
                                             const float *res, float *y, bool vec) {
    const int64_t n = rows * out, n4 = gp_cuda_vecs(vec, n), out4 = out / 4;
    const bool narrow = n4 <= (int64_t)UINT32_MAX;
    GP_CUDA_FOR(i, n4) {
        const int64_t j4 = narrow ? (int64_t)((uint32_t)i % (uint32_t)out4) : i % out4;
        float v[4], r[4];
        if (b) gp_ld4(b, j4, v);
        if (res) gp_ld4(res, i, r);
        for (int k = 0; k < 4; k++) v[k] = b && res ? r[k] + v[k] : b ? v[k] : r[k];
        gp_st4(y, i, v);
    }
    GP_CUDA_FOR_TAIL(i, n4, n) prefill_one(b, res, y, i, i % out);
}

extern "C" gp_status gp_cuda_linear_forward(gp_device *dev, int64_t rows, int64_t in,
                                            int64_t out, const float *x, const uint16_t *x16,
                                            const float *w, const uint16_t *w16, const float *b,
                                            const float *res, float *y) {
    gp_status s;
    gp_cuda_ctx *c = gp_cuda_begin(dev, &s);
    if (!c) return s;
    const bool bf16 = gp_device_precision(dev) == GP_PRECISION_BF16;
    GP_TRY(gp_kernels_check_bf16_operand("linear_forward", c->name, bf16, x16 || w16));
    if (bf16 && (b || res)) { // the bias and residual in cuBLASLt's epilogue where it has one
        bool done = false;
        GP_TRY(gp_cuda_linear_lt(dev, rows, in, out, x, x16, w, w16, b, res, y, &done));
        if (done) return GP_OK;
    }
    float beta = 0.0f;
    if ((b || res != y) && (b || res) && rows > 0 && out > 0) {
        const bool vec = out % 4 == 0 && gp_cuda_aligned16(b, res, y);
        linear_prefill_kernel<<<gp_cuda_vec_blocks(vec, rows * out), GP_CUDA_THREADS, 0,
                                c->stream>>>(rows, out, b, res, y, vec);
        GP_TRY(gp_cuda_launched(c, "linear_prefill_kernel"));
    }
    if (b || res) beta = 1.0f;
    return gp_cuda_gemm_rounded(dev, false, true, rows, out, in, 1.0f, x, x16, in, 0, w, w16, in,
                                0, beta, y, out, 0, 1);
}

// dx = dy W and dW += dy^T x share dy: on a bf16 device it is rounded once for both.
extern "C" gp_status gp_cuda_linear_backward(gp_device *dev, int64_t rows, int64_t in,
                                             int64_t out, const float *x, const uint16_t *x16,
                                             const float *w, const uint16_t *w16,
                                             const float *dy, float *dx, float *dw, float *db) {
    void *dy16 = NULL;
    if (dx && dw) GP_TRY(gp_cuda_round_operand(dev, dy, rows * out, &dy16));
    gp_status s = GP_OK;
    if (dx)
        s = gp_cuda_gemm_rounded(dev, false, false, rows, in, out, 1.0f, dy, dy16, out, 0, w,
                                 w16, in, 0, 0.0f, dx, in, 0, 1);
    if (s == GP_OK && dw)
        s = gp_cuda_gemm_rounded(dev, true, false, out, in, rows, 1.0f, dy, dy16, out, 0, x, x16,
                                 in, 0, 1.0f, dw, in, 0, 1);
    gp_cuda_workspace_release(dev, dy16);
    GP_TRY(s);
    if (db) GP_TRY(gp_cuda_sum_rows_add(dev, dy, rows, out, db));
    return GP_OK;
}

// ------------------------------------------------------------------------------ layer norm

// One block per row: the mean, then the squared deviations (two passes: no cancellation).
template <int PER>
static __global__ void layernorm_forward_kernel(int64_t rows, int64_t dim, const float *x,
                                                const float *w, const float *b, float *y,
                                                uint16_t *y16, float *stats) {
    __shared__ float sh[GP_CUDA_THREADS];
    float v[PER ? PER : 1];
    for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
        const float *xr = x + r * dim;
        float acc = 0.0f;
        GP_CUDA_ROW_FOR(PER, k, j, threadIdx.x, blockDim.x, dim) if (j < dim) {
            const float xv = xr[j];
            if (PER) v[GP_CUDA_ROW_REG(PER, k)] = xv;
            acc += xv;
        }
        const float mean = gp_block_sum(acc, sh) / (float)dim;
        float acc2 = 0.0f;
        GP_CUDA_ROW_FOR(PER, k, j, threadIdx.x, blockDim.x, dim) if (j < dim) {
            const float d = (PER ? v[GP_CUDA_ROW_REG(PER, k)] : xr[j]) - mean;
            acc2 += d * d;
        }
        const float var = gp_block_sum(acc2, sh);
        const float rstd = 1.0f / sqrtf(var / (float)dim + LAYERNORM_EPS);
        GP_CUDA_ROW_FOR(PER, k, j, threadIdx.x, blockDim.x, dim) if (j < dim) {
            const float xv = PER ? v[GP_CUDA_ROW_REG(PER, k)] : xr[j];
            const float o = (xv - mean) * rstd * w[j] + b[j];
            if (y16) y16[r * dim + j] = gp_bf16_bits(o);
            else y[r * dim + j] = o;
        }
        if (threadIdx.x == 0) {
            stats[r] = mean;
            stats[rows + r] = rstd;
        }
    }
}

extern "C" gp_status gp_cuda_layernorm_forward(gp_device *dev, int64_t rows, int64_t dim,
                                               const float *x, const float *w, const float *b,
                                               float *y, uint16_t *y16, float *stats) {
    gp_status s;
    gp_cuda_ctx *c = gp_cuda_begin(dev, &s);
    if (!c) return s;
    if (rows > 0 && dim > 0)
        GP_CUDA_ROW_LAUNCH(c, layernorm_forward_kernel, gp_cuda_row_per(dim, GP_CUDA_THREADS),
                           row_blocks(rows), GP_CUDA_THREADS, rows, dim, x, w, b, y, y16, stats);
    return GP_OK;
}

// dw and db in chunks of rows: chunk partials (math.cuh, GP_CUDA_SUM_CHUNK) of dw (part) and db (part + nchunks dim).
static __global__ void layernorm_dw_partial_kernel(int64_t rows, int64_t dim, const float *x,
                                                   const float *stats, const float *dy,
                                                   float *part) {
    const int64_t nchunks = gp_cuda_sum_chunks(rows);
    GP_CUDA_FOR(t, nchunks * dim) {
        const int64_t b = t / dim, j = t % dim;
        const int64_t i1 = (b + 1) * GP_CUDA_SUM_CHUNK < rows ? (b + 1) * GP_CUDA_SUM_CHUNK : rows;
        float aw = 0.0f, ab = 0.0f;
        for (int64_t i = b * GP_CUDA_SUM_CHUNK; i < i1; i++) {
            const float xh = (x[i * dim + j] - stats[i]) * stats[rows + i];
            aw += dy[i * dim + j] * xh;
            ab += dy[i * dim + j];
        }
        part[t] = aw;
        part[nchunks * dim + t] = ab;
    }
}

// dx: one block per row. dxhat = dy w; dx = [dres +] rstd (dxhat - mean(dxhat) - xhat
// mean(dxhat xhat)). The second pass reads the row again (from cache): with the row's xhat and
// dxhat kept in registers instead, as the forward keeps x, fewer blocks fit on an SM and T3's
// 8192 rows of 2048 took 157 us against 96 on the H200.
static __global__ void layernorm_dx_kernel(int64_t rows, int64_t dim, const float *x,
                                           const float *w, const float *stats, const float *dy,
                                           const float *dres, float *dx) {
    __shared__ float sh[GP_CUDA_THREADS];
    for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
        const float *xr = x + r * dim, *dyr = dy + r * dim;
        const float mean = stats[r], rstd = stats[rows + r];
        float a1 = 0.0f, a2 = 0.0f;
        for (int64_t j = threadIdx.x; j < dim; j += blockDim.x) {
            const float xh = (xr[j] - mean) * rstd;
            const float g = dyr[j] * w[j];
            a1 += g;
            a2 += g * xh;
        }
        const float m1 = gp_block_sum(a1, sh) / (float)dim;
        const float m2 = gp_block_sum(a2, sh) / (float)dim;
        float *dxr = dx + r * dim;
        for (int64_t j = threadIdx.x; j < dim; j += blockDim.x) {
            const float xh = (xr[j] - mean) * rstd;
            const float v = rstd * (dyr[j] * w[j] - m1 - xh * m2);
            dxr[j] = dres ? dres[r * dim + j] + v : v; // dres may alias dx: read, then write
        }
    }
}

extern "C" gp_status gp_cuda_layernorm_backward(gp_device *dev, int64_t rows, int64_t dim,
                                                const float *x, const float *w,
                                                const float *stats, const float *dy,
                                                const float *dres, float *dx, float *dw,
                                                float *db) {
    gp_status s;
    gp_cuda_ctx *c = gp_cuda_begin(dev, &s);
    if (!c) return s;
    if (rows <= 0 || dim <= 0) return GP_OK;
    const int64_t nchunks = gp_cuda_sum_chunks(rows);
    float *part = (float *)gp_cuda_workspace(dev, (size_t)(2 * nchunks * dim) * sizeof(float), &s);
    if (!part) return s;
    layernorm_dw_partial_kernel<<<gp_cuda_blocks(nchunks * dim), GP_CUDA_THREADS, 0, c->stream>>>(
        rows, dim, x, stats, dy, part);
    s = gp_cuda_launched(c, "layernorm_dw_partial_kernel");
    if (s == GP_OK) s = gp_cuda_sum_partials(c, part, nchunks, dim, dw, db);
    gp_cuda_workspace_release(dev, part); // later work on the stream comes after the kernels
    GP_TRY(s);
    if (dx)
        GP_CUDA_LAUNCH_BLOCKS(c, layernorm_dx_kernel, row_blocks(rows), rows, dim, x, w, stats,
                              dy, dres, dx);
    return GP_OK;
}

// ------------------------------------------------------------------------------------ GELU

#define GELU_K0 0.7978845608028654f // sqrt(2 / pi)
#define GELU_K1 0.044715f

// The CPU's formulation (transformer_kernels.c): 0.5 (1 + tanh(u)) as s = 1 / (1 + e),
// e = exp(-2u), exactly 0 or 1 past |2u| = 80.
__device__ inline float gelu_sigmoid(float x, float *e_out) {
    const float z = -2.0f * GELU_K0 * fmaf(GELU_K1 * x, x * x, x);
    float zc = z < -80.0f ? -80.0f : z;
    zc = zc > 80.0f ? 80.0f : zc;
    const float ez = gp_cuda_exp_core(zc);
    const float e = z < -80.0f ? 0.0f : ez;
    *e_out = e;
    const float sg = 1.0f / (1.0f + e);
    return z > 80.0f ? 0.0f : sg;
}

__device__ inline float gelu_grad1(float x) {
    float e;
    const float s = gelu_sigmoid(x, &e);
    const float x2 = x * x > 1e6f ? 1e6f : x * x;
    const float du2 = 2.0f * GELU_K0 * fmaf(3.0f * GELU_K1, x2, 1.0f);
    return fmaf(x, du2 * (s * (e * s)), s);
}

__device__ inline float gelu1(float x) {
    float e;
    return x * gelu_sigmoid(x, &e);
}

// y, or y16 (four bf16 values stored as one 8-byte word where vec).
static __global__ void gelu_forward_kernel(int64_t n, const float *x, float *y, uint16_t *y16,
                                           bool vec) {
    const int64_t n4 = gp_cuda_vecs(vec, n);
    GP_CUDA_FOR(i, n4) {
        float v[4];
        gp_ld4(x, i, v);
        for (int k = 0; k < 4; k++) v[k] = gelu1(v[k]);
        if (y16)
            reinterpret_cast<uint2 *>(y16)[i] =
                make_uint2(gp_bf16_bits(v[0]) | (uint32_t)gp_bf16_bits(v[1]) << 16,
                           gp_bf16_bits(v[2]) | (uint32_t)gp_bf16_bits(v[3]) << 16);
        else
            gp_st4(y, i, v);
    }
    GP_CUDA_FOR_TAIL(i, n4, n) {
        const float v = gelu1(x[i]);
        if (y16) y16[i] = gp_bf16_bits(v);
        else y[i] = v;
    }
}

extern "C" gp_status gp_cuda_gelu_forward(gp_device *dev, int64_t n, const float *x, float *y,
                                          uint16_t *y16) {
    gp_status s;
    gp_cuda_ctx *c = gp_cuda_begin(dev, &s);
    if (!c) return s;
    if (n <= 0) return GP_OK;
    const bool vec = y16 ? gp_cuda_aligned16(x, y16) : gp_cuda_aligned16(x, y);
    gelu_forward_kernel<<<gp_cuda_vec_blocks(vec, n), GP_CUDA_THREADS, 0, c->stream>>>(n, x, y,
                                                                                      y16, vec);
    return gp_cuda_launched(c, "gelu_forward_kernel");
}

static __global__ void gelu_backward_kernel(int64_t n, const float *x, const float *dy,
                                            float *dx, bool vec) {
    const int64_t n4 = gp_cuda_vecs(vec, n);
    GP_CUDA_FOR(i, n4) {
        float v[4], d[4];
        gp_ld4(x, i, v);
        gp_ld4(dy, i, d);
        for (int k = 0; k < 4; k++) v[k] = d[k] * gelu_grad1(v[k]);
        gp_st4(dx, i, v);
    }
    GP_CUDA_FOR_TAIL(i, n4, n) dx[i] = dy[i] * gelu_grad1(x[i]);
}

extern "C" gp_status gp_cuda_gelu_backward(gp_device *dev, int64_t rows, int64_t cols,
                                           const float *x, const float *dy, float *dx,
                                           float *db) {
    gp_status s;
    gp_cuda_ctx *c = gp_cuda_begin(dev, &s);
    if (!c) return s;
    const int64_t n = rows * cols;
    if (n > 0) {
        const bool vec = gp_cuda_aligned16(x, dy, dx);
        gelu_backward_kernel<<<gp_cuda_vec_blocks(vec, n), GP_CUDA_THREADS, 0, c->stream>>>(
            n, x, dy, dx, vec);
        GP_TRY(gp_cuda_launched(c, "gelu_backward_kernel"));
    }
    // The bias gradient sums the rows of dx in order, as the CPU's.
    return db ? gp_cuda_sum_rows_add(dev, dx, rows, cols, db) : GP_OK;
}

// --------------------------------------------------------------------------------- dropout

// Element i keeps its value when uniform i of the stream is >= p: the CPU's mask, bit for bit
// (math.cuh computes the stream as core/rng.c does).
static __global__ void dropout_kernel(gp_rng_stream st, float p, float scale, int64_t n,
                                      const float *x, const float *res, float *y) {
    GP_CUDA_FOR(i, n) {
        const float u = gp_cuda_uniform(st, (uint64_t)i);
        const float v = x[i] * (u >= p ? scale : 0.0f);
        y[i] = res ? res[i] + v : v;
    }
}

extern "C" gp_status gp_cuda_dropout(gp_device *dev, const gp_rng_stream *st, float p, int64_t n,
                                     const float *x, const float *res, float *y) {
    gp_status s;
    gp_cuda_ctx *c = gp_cuda_begin(dev, &s);
    if (!c) return s;
    const float scale = 1.0f / (1.0f - p);
    if (n > 0) GP_CUDA_LAUNCH(c, dropout_kernel, n, *st, p, scale, n, x, res, y);
    return GP_OK;
}

// ---------------------------------------------------------------------- positional embedding

static __global__ void pos_forward_kernel(int64_t rows, int64_t seq, int64_t dim, const float *x,
                                          const float *w, float *y) {
    GP_CUDA_FOR(i, rows * dim) {
        const int64_t r = i / dim, j = i % dim;
        y[i] = x[i] + w[(r % seq) * dim + j];
    }
}

extern "C" gp_status gp_cuda_pos_embedding_forward(gp_device *dev, int64_t batch, int64_t seq,
                                                   int64_t dim, const float *x, const float *w,
                                                   float *y) {
    gp_status s;
    gp_cuda_ctx *c = gp_cuda_begin(dev, &s);
    if (!c) return s;
    const int64_t n = batch * seq * dim;
    if (n > 0) GP_CUDA_LAUNCH(c, pos_forward_kernel, n, batch * seq, seq, dim, x, w, y);
    return GP_OK;
}

// A thread per element of dw, the batch in order b = 0, 1, ...: the CPU's sums.
static __global__ void pos_backward_kernel(int64_t batch, int64_t seq, int64_t dim,
                                           const float *dy, float *dw) {
    GP_CUDA_FOR(i, seq * dim) {
        float acc = dw[i];
        for (int64_t b = 0; b < batch; b++) acc += dy[b * seq * dim + i];
        dw[i] = acc;
    }
}

extern "C" gp_status gp_cuda_pos_embedding_backward(gp_device *dev, int64_t batch, int64_t seq,
                                                    int64_t dim, const float *dy, float *dw) {
    gp_status s;
    gp_cuda_ctx *c = gp_cuda_begin(dev, &s);
    if (!c) return s;
    if (seq * dim > 0 && batch > 0)
        GP_CUDA_LAUNCH(c, pos_backward_kernel, seq * dim, batch, seq, dim, dy, dw);
    return GP_OK;
}
