// GEMMs through cuBLAS, fp32 (the handle's math mode keeps TF32 off: cuda_device.c). gpipe's
// matrices are row-major and cuBLAS's column-major: a row-major C = op(A) op(B) is the
// column-major C^T = op(B)^T op(A)^T, so cuBLAS gets B first and the sizes swapped, with the
// same leading dimensions and transposes.
#include "kernels/cuda/cuda_kernels.h"
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

extern "C" gp_status gp_cuda_sgemm_strided(gp_device *dev, bool trans_a, bool trans_b, int64_t m,
                                           int64_t n, int64_t k, float alpha, const float *a,
                                           int64_t lda, int64_t stride_a, const float *b,
                                           int64_t ldb, int64_t stride_b, float beta, float *c,
                                           int64_t ldc, int64_t stride_c, int64_t count) {
    gp_status s;
    gp_cuda_ctx *ctx = gp_cuda_begin(dev, &s);
    if (!ctx) return s;
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

extern "C" gp_status gp_cuda_gemm(gp_device *dev, bool trans_a, bool trans_b, int64_t m,
                                  int64_t n, int64_t k, float alpha, const float *a, int64_t lda,
                                  const float *b, int64_t ldb, float beta, float *c,
                                  int64_t ldc) {
    return gp_cuda_sgemm_strided(dev, trans_a, trans_b, m, n, k, alpha, a, lda, 0, b, ldb, 0,
                                 beta, c, ldc, 0, 1);
}

extern "C" gp_status gp_cuda_gemm_batched(gp_device *dev, bool trans_a, bool trans_b, int64_t m,
                                          int64_t n, int64_t k, float alpha, const float *a,
                                          int64_t lda, int64_t stride_a, const float *b,
                                          int64_t ldb, int64_t stride_b, float beta, float *c,
                                          int64_t ldc, int64_t stride_c, int64_t count) {
    return gp_cuda_sgemm_strided(dev, trans_a, trans_b, m, n, k, alpha, a, lda, stride_a, b, ldb,
                                 stride_b, beta, c, ldc, stride_c, count);
}
