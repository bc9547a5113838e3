/* CPU kernels shared by the layers. GEMM goes through CBLAS (OpenBLAS by
 * default); everything else is plain C written to vectorize. */
#ifndef GP_KERNELS_H
#define GP_KERNELS_H

#include <stdbool.h>
#include <stdint.h>

/* Row-major C(m, n) = alpha * op(A) * op(B) + beta * C, op(A): (m, k),
 * op(B): (k, n). lda/ldb/ldc are row strides of the stored matrices. */
void gp_gemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha,
             const float *a, int64_t lda, const float *b, int64_t ldb, float beta, float *c,
             int64_t ldc);

/* The same GEMM for `count` matrices at fixed strides (attention heads). */
void gp_gemm_batched(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha,
                     const float *a, int64_t lda, int64_t stride_a, const float *b, int64_t ldb,
                     int64_t stride_b, float beta, float *c, int64_t ldc, int64_t stride_c,
                     int64_t count);

/* y[i] += x[i] */
void gp_add_inplace(float *y, const float *x, int64_t n);
/* out[j] += sum over rows i of x[i, j]  (x: (rows, cols)) — bias gradients. */
void gp_sum_rows_add(float *out, const float *x, int64_t rows, int64_t cols);

#endif
