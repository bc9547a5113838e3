/* GEMM through CBLAS, and BLAS thread control. */
#include <cblas.h>

#include "../kernels.h"
#include "gpipe.h"

/* OpenBLAS extensions; other CBLAS libraries lack them, so they are weak. */
extern void openblas_set_num_threads(int) __attribute__((weak));
extern int openblas_get_num_threads(void) __attribute__((weak));
extern char *openblas_get_corename(void) __attribute__((weak));

void gp_gemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha,
             const float *a, int64_t lda, const float *b, int64_t ldb, float beta, float *c,
             int64_t ldc) {
    if (m <= 0 || n <= 0) return;
    cblas_sgemm(CblasRowMajor, trans_a ? CblasTrans : CblasNoTrans,
                trans_b ? CblasTrans : CblasNoTrans, (blasint)m, (blasint)n, (blasint)k, alpha, a,
                (blasint)lda, b, (blasint)ldb, beta, c, (blasint)ldc);
}

void gp_gemm_batched(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha,
                     const float *a, int64_t lda, int64_t stride_a, const float *b, int64_t ldb,
                     int64_t stride_b, float beta, float *c, int64_t ldc, int64_t stride_c,
                     int64_t count) {
    for (int64_t i = 0; i < count; i++)
        gp_gemm(trans_a, trans_b, m, n, k, alpha, a + i * stride_a, lda, b + i * stride_b, ldb,
                beta, c + i * stride_c, ldc);
}

void gp_add_inplace(float *y, const float *x, int64_t n) {
    for (int64_t i = 0; i < n; i++) y[i] += x[i];
}

void gp_sum_rows_add(float *out, const float *x, int64_t rows, int64_t cols) {
    for (int64_t i = 0; i < rows; i++) {
        const float *r = x + i * cols;
        for (int64_t j = 0; j < cols; j++) out[j] += r[j];
    }
}

void gp_blas_set_threads(int n) {
    if (n < 1) n = 1;
    if (openblas_set_num_threads) openblas_set_num_threads(n);
}

int gp_blas_threads(void) { return openblas_get_num_threads ? openblas_get_num_threads() : 1; }

const char *gp_blas_corename(void) {
    return openblas_get_corename ? openblas_get_corename() : "unknown (not OpenBLAS)";
}
