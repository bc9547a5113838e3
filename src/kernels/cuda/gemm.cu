// GEMMs through cuBLAS: fp32 (the handle's math mode keeps TF32 off: cuda_device.c), or, for
// the gemm ops and attention of a bf16 device (gpipe.h, gp_precision), bf16 operands summed in
// fp32 into the fp32 C on the tensor cores. gpipe's matrices are row-major and cuBLAS's
// column-major: a row-major C = op(A) op(B) is the column-major C^T = op(B)^T op(A)^T, so
// cuBLAS gets B first and the sizes swapped, with the same leading dimensions and transposes.
#include <cuda_bf16.h>

#include "core/bf16.h"
#include "kernels/cuda/cuda_kernels.h"
#include "kernels/cuda/gemm_lt.h"
#include "kernels/cuda/math.cuh"

// C = beta C for a product over k = 0 (cuBLAS refuses the zero leading dimension a transposed
// operand would then have); beta = 0 writes zeros, as BLAS, whatever C held.
static __global__ void scale_c_kernel(float *c, int64_t m, int64_t n, int64_t ldc,
                                      int64_t stride_c, int64_t count, float beta) {
    GP_CUDA_FOR(i, m * n * count) {
        const int64_t b = i / (m * n), r = i % (m * n) / n, j = i % n;
        float *p = c + b * stride_c + r * ldc + j;
        *p = beta == 0.0f ? 0.0f : beta * *p;
    }
}

// y[0..n) = x rounded to bf16 (core/bf16.h: the CPU's rounding, bit for bit), four a thread
// where x and y are 16-byte aligned (y always is in gemm_bf16's workspace).
static __global__ void round_bf16_kernel(const float *x, uint16_t *y, int64_t n, bool vec) {
    const int64_t n4 = gp_cuda_vecs(vec, n);
    GP_CUDA_FOR(i, n4) {
        float v[4];
        gp_ld4(x, i, v);
        reinterpret_cast<uint2 *>(y)[i] =
            make_uint2(gp_bf16_bits(v[0]) | (uint32_t)gp_bf16_bits(v[1]) << 16,
                       gp_bf16_bits(v[2]) | (uint32_t)gp_bf16_bits(v[3]) << 16);
    }
    GP_CUDA_FOR_TAIL(i, n4, n) y[i] = gp_bf16_bits(x[i]);
}

static gp_status round_bf16(gp_cuda_ctx *ctx, const float *x, __nv_bfloat16 *y, int64_t n) {
    const bool vec = gp_cuda_aligned16(x, y);
    round_bf16_kernel<<<gp_cuda_vec_blocks(vec, n), GP_CUDA_THREADS, 0, ctx->stream>>>(
        x, reinterpret_cast<uint16_t *>(y), n, vec);
    return gp_cuda_launched(ctx, "round_bf16_kernel");
}

extern "C" gp_status gp_cuda_bf16_store(gp_device *dev, const float *x, uint16_t *y16,
                                        int64_t n) {
    gp_status s;
    gp_cuda_ctx *ctx = gp_cuda_begin(dev, &s);
    if (!ctx) return s;
    return n > 0 ? round_bf16(ctx, x, reinterpret_cast<__nv_bfloat16 *>(y16), n) : GP_OK;
}

extern "C" gp_status gp_cuda_round_operand(gp_device *dev, const float *x, int64_t span,
                                           void **out) {
    *out = NULL;
    if (gp_device_precision(dev) != GP_PRECISION_BF16 || span <= 0) return GP_OK;
    gp_status s;
    gp_cuda_ctx *ctx = gp_cuda_begin(dev, &s);
    if (!ctx) return s;
    void *y = gp_cuda_workspace(dev, (size_t)span * sizeof(__nv_bfloat16), &s);
    if (!y) return s;
    s = round_bf16(ctx, x, (__nv_bfloat16 *)y, span);
    if (s == GP_OK) *out = y;
    else gp_cuda_workspace_release(dev, y);
    return s;
}

// A and B's bf16 copies for a product: the caller's (a16_in, b16_in: gp_cuda_round_operand) or
// places in one workspace block (B's copy a multiple of 128 bytes into it: the tensor-core
// kernels want aligned operands), which operands_round fills. The block (ws, may be NULL) is
// released once the product is queued: its memory is reused only by work queued after it on the
// same stream (cuda_context.h).
typedef struct bf16_operands {
    const float *a, *b; // what is rounded where a16_in, b16_in were not given
    int64_t na, nb;     // their spans (0: given)
    __nv_bfloat16 *ws;
    const __nv_bfloat16 *a16, *b16;
} bf16_operands;

static gp_status operands_place(gp_device *dev, bool trans_a, bool trans_b, int64_t m, int64_t n,
                                int64_t k, const float *a, const void *a16_in, int64_t lda,
                                int64_t stride_a, const float *b, const void *b16_in, int64_t ldb,
                                int64_t stride_b, int64_t count, bf16_operands *o) {
    *o = bf16_operands{};
    o->a = a, o->b = b;
    o->na = a16_in ? 0 : gp_bf16_operand_span(trans_a, m, k, lda, stride_a, count);
    o->nb = b16_in ? 0 : gp_bf16_operand_span(trans_b, k, n, ldb, stride_b, count);
    const int64_t na_padded = (o->na + 63) / 64 * 64;
    gp_status s = GP_OK;
    o->ws = NULL;
    if (na_padded + o->nb > 0) {
        o->ws = (__nv_bfloat16 *)gp_cuda_workspace(
            dev, (size_t)(na_padded + o->nb) * sizeof(__nv_bfloat16), &s);
        if (!o->ws) return s;
    }
    o->a16 = a16_in ? (const __nv_bfloat16 *)a16_in : o->ws;
    o->b16 = b16_in ? (const __nv_bfloat16 *)b16_in : o->ws + na_padded;
    return GP_OK;
}

static gp_status operands_round(gp_cuda_ctx *ctx, const bf16_operands *o) {
    if (o->na > 0) GP_TRY(round_bf16(ctx, o->a, (__nv_bfloat16 *)o->a16, o->na));
    if (o->nb > 0) GP_TRY(round_bf16(ctx, o->b, (__nv_bfloat16 *)o->b16, o->nb));
    return GP_OK;
}

// The bf16 products: the operands' bf16 copies, then cuBLAS's bf16 GEMM with fp32 sums and
// output.
static gp_status gemm_bf16(gp_cuda_ctx *ctx, gp_device *dev, cublasOperation_t op_a,
                           cublasOperation_t op_b, bool trans_a, bool trans_b, int64_t m,
                           int64_t n, int64_t k, float alpha, const float *a, const void *a16_in,
                           int64_t lda, int64_t stride_a, const float *b, const void *b16_in,
                           int64_t ldb, int64_t stride_b, float beta, float *c, int64_t ldc,
                           int64_t stride_c, int64_t count) {
    bf16_operands o;
    GP_TRY(operands_place(dev, trans_a, trans_b, m, n, k, a, a16_in, lda, stride_a, b, b16_in, ldb,
                          stride_b, count, &o));
    const __nv_bfloat16 *a16 = o.a16, *b16 = o.b16;
    gp_status s = operands_round(ctx, &o);
    if (s == GP_OK && count == 1)
        s = gp_cuda_blas_check(ctx,
                               cublasGemmEx(ctx->blas, op_b, op_a, (int)n, (int)m, (int)k, &alpha,
                                            b16, CUDA_R_16BF, (int)ldb, a16, CUDA_R_16BF,
                                            (int)lda, &beta, c, CUDA_R_32F, (int)ldc,
                                            CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
                               "cublasGemmEx");
    else if (s == GP_OK)
        s = gp_cuda_blas_check(
            ctx,
            cublasGemmStridedBatchedEx(ctx->blas, op_b, op_a, (int)n, (int)m, (int)k, &alpha, b16,
                                       CUDA_R_16BF, (int)ldb, (long long)stride_b, a16,
                                       CUDA_R_16BF, (int)lda, (long long)stride_a, &beta, c,
                                       CUDA_R_32F, (int)ldc, (long long)stride_c, (int)count,
                                       CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
            "cublasGemmStridedBatchedEx");
    gp_cuda_workspace_release(dev, o.ws);
    return s;
}

extern "C" gp_status gp_cuda_linear_lt(gp_device *dev, int64_t rows, int64_t in, int64_t out,
                                       const float *x, const uint16_t *x16, const float *w,
                                       const uint16_t *w16, const float *b, const float *res,
                                       float *y, bool *done) {
    *done = false;
    gp_status s;
    gp_cuda_ctx *ctx = gp_cuda_begin(dev, &s);
    if (!ctx) return s;
    if (!ctx->lt || gp_device_precision(dev) != GP_PRECISION_BF16 || rows <= 0 || out <= 0 ||
        in <= 0)
        return GP_OK;
    bf16_operands o;
    GP_TRY(operands_place(dev, false, true, rows, out, in, x, x16, in, 0, w, w16, in, 0, 1, &o));
    // column-major y^T (out x rows) = W (stored in x out: transposed) x^T (in x rows)
    const gp_cuda_lt_gemm g = {.trans_a = true, .trans_b = false, .m = out, .n = rows, .k = in,
                               .a16 = o.b16, .lda = in, .b16 = o.a16, .ldb = in,
                               .beta = res ? 1.0f : 0.0f, .c = res, .d = y, .ldd = out,
                               .bias = b};
    s = gp_cuda_lt_supports(ctx, &g, done);
    if (s == GP_OK && *done) s = operands_round(ctx, &o);
    if (s == GP_OK && *done) s = gp_cuda_lt_run(ctx, &g, done);
    gp_cuda_workspace_release(dev, o.ws);
    return s;
}

// The product in fp32, or with bf16 operands where bf16.
static gp_status gemm_strided(gp_device *dev, bool bf16, bool trans_a, bool trans_b, int64_t m,
                              int64_t n, int64_t k, float alpha, const float *a,
                              const void *a16, int64_t lda, int64_t stride_a, const float *b,
                              const void *b16, int64_t ldb, int64_t stride_b, float beta,
                              float *c, int64_t ldc, int64_t stride_c, int64_t count) {
    gp_status s;
    gp_cuda_ctx *ctx = gp_cuda_begin(dev, &s);
    if (!ctx) return s;
    GP_TRY(gp_kernels_check_bf16_operand("gemm", ctx->name, bf16, a16 || b16));
    if (m <= 0 || n <= 0 || count <= 0) return GP_OK;
    if (k <= 0) {
        GP_CUDA_LAUNCH(ctx, scale_c_kernel, m * n * count, c, m, n, ldc, stride_c, count, beta);
        return GP_OK;
    }
    const int64_t dims[] = {m, n, k, lda, ldb, ldc, count};
    const char *const names[] = {"m", "n", "k", "lda", "ldb", "ldc", "count"};
    for (int i = 0; i < 7; i++) GP_TRY(gp_kernels_check_int(ctx, "gemm", dims[i], names[i]));
    const cublasOperation_t op_a = trans_a ? CUBLAS_OP_T : CUBLAS_OP_N;
    const cublasOperation_t op_b = trans_b ? CUBLAS_OP_T : CUBLAS_OP_N;
    if (bf16)
        return gemm_bf16(ctx, dev, op_a, op_b, trans_a, trans_b, m, n, k, alpha, a, a16, lda,
                         stride_a, b, b16, ldb, stride_b, beta, c, ldc, stride_c, count);
    if (count == 1)
        return gp_cuda_blas_check(ctx,
                                  cublasSgemm(ctx->blas, op_b, op_a, (int)n, (int)m, (int)k, &alpha,
                                              b, (int)ldb, a, (int)lda, &beta, c, (int)ldc),
                                  "cublasSgemm");
    return gp_cuda_blas_check(
        ctx,
        cublasSgemmStridedBatched(ctx->blas, op_b, op_a, (int)n, (int)m, (int)k, &alpha, b,
                                  (int)ldb, (long long)stride_b, a, (int)lda, (long long)stride_a,
                                  &beta, c, (int)ldc, (long long)stride_c, (int)count),
        "cublasSgemmStridedBatched");
}

extern "C" gp_status gp_cuda_sgemm_strided(gp_device *dev, bool trans_a, bool trans_b, int64_t m,
                                           int64_t n, int64_t k, float alpha, const float *a,
                                           int64_t lda, int64_t stride_a, const float *b,
                                           int64_t ldb, int64_t stride_b, float beta, float *c,
                                           int64_t ldc, int64_t stride_c, int64_t count) {
    return gemm_strided(dev, false, trans_a, trans_b, m, n, k, alpha, a, NULL, lda, stride_a, b,
                        NULL, ldb, stride_b, beta, c, ldc, stride_c, count);
}

extern "C" gp_status gp_cuda_gemm_rounded(gp_device *dev, bool trans_a, bool trans_b, int64_t m,
                                          int64_t n, int64_t k, float alpha, const float *a,
                                          const void *a16, int64_t lda, int64_t stride_a,
                                          const float *b, const void *b16, int64_t ldb,
                                          int64_t stride_b, float beta, float *c, int64_t ldc,
                                          int64_t stride_c, int64_t count) {
    return gemm_strided(dev, gp_device_precision(dev) == GP_PRECISION_BF16, trans_a, trans_b, m,
                        n, k, alpha, a, a16, lda, stride_a, b, b16, ldb, stride_b, beta, c, ldc,
                        stride_c, count);
}

extern "C" gp_status gp_cuda_gemm_strided(gp_device *dev, bool trans_a, bool trans_b, int64_t m,
                                          int64_t n, int64_t k, float alpha, const float *a,
                                          int64_t lda, int64_t stride_a, const float *b,
                                          int64_t ldb, int64_t stride_b, float beta, float *c,
                                          int64_t ldc, int64_t stride_c, int64_t count) {
    return gp_cuda_gemm_rounded(dev, trans_a, trans_b, m, n, k, alpha, a, NULL, lda, stride_a, b,
                                NULL, ldb, stride_b, beta, c, ldc, stride_c, count);
}

extern "C" gp_status gp_cuda_gemm(gp_device *dev, bool trans_a, bool trans_b, int64_t m,
                                  int64_t n, int64_t k, float alpha, const float *a, int64_t lda,
                                  const float *b, int64_t ldb, float beta, float *c,
                                  int64_t ldc) {
    return gp_cuda_gemm_strided(dev, trans_a, trans_b, m, n, k, alpha, a, lda, 0, b, ldb, 0, beta,
                                c, ldc, 0, 1);
}

extern "C" gp_status gp_cuda_gemm_batched(gp_device *dev, bool trans_a, bool trans_b, int64_t m,
                                          int64_t n, int64_t k, float alpha, const float *a,
                                          int64_t lda, int64_t stride_a, const float *b,
                                          int64_t ldb, int64_t stride_b, float beta, float *c,
                                          int64_t ldc, int64_t stride_c, int64_t count) {
    return gp_cuda_gemm_strided(dev, trans_a, trans_b, m, n, k, alpha, a, lda, stride_a, b, ldb,
                                stride_b, beta, c, ldc, stride_c, count);
}
