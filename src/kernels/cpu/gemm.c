/* GEMM through CBLAS (OpenBLAS by default; any CBLAS links), and BLAS thread control. */
#include <cblas.h>
#include <stdlib.h>

#include "core/error.h"
#include "kernels/cpu/cpu_kernels.h"

/* OpenBLAS extensions; other CBLAS libraries lack them, so they are weak. */
extern void openblas_set_num_threads(int) __attribute__((weak));
extern int openblas_get_num_threads(void) __attribute__((weak));
extern char *openblas_get_corename(void) __attribute__((weak));

void gp_cpu_sgemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha,
                  const float *a, int64_t lda, const float *b, int64_t ldb, float beta, float *c,
                  int64_t ldc) {
    if (m <= 0 || n <= 0) return;
    cblas_sgemm(CblasRowMajor, trans_a ? CblasTrans : CblasNoTrans,
                trans_b ? CblasTrans : CblasNoTrans, (blasint)m, (blasint)n, (blasint)k, alpha, a,
                (blasint)lda, b, (blasint)ldb, beta, c, (blasint)ldc);
}

gp_status gp_cpu_gemm(gp_device *dev, bool trans_a, bool trans_b, int64_t m, int64_t n,
                      int64_t k, float alpha, const float *a, int64_t lda, const float *b,
                      int64_t ldb, float beta, float *c, int64_t ldc) {
    (void)dev;
    gp_cpu_sgemm(trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
    return GP_OK;
}

gp_status gp_cpu_gemm_batched(gp_device *dev, bool trans_a, bool trans_b, int64_t m, int64_t n,
                              int64_t k, float alpha, const float *a, int64_t lda,
                              int64_t stride_a, const float *b, int64_t ldb, int64_t stride_b,
                              float beta, float *c, int64_t ldc, int64_t stride_c,
                              int64_t count) {
    (void)dev;
    for (int64_t i = 0; i < count; i++)
        gp_cpu_sgemm(trans_a, trans_b, m, n, k, alpha, a + i * stride_a, lda, b + i * stride_b,
                     ldb, beta, c + i * stride_c, ldc);
    return GP_OK;
}

void gp_blas_set_threads(int n) {
    if (n < 1) n = 1;
    if (openblas_set_num_threads) openblas_set_num_threads(n);
}

int gp_blas_threads(void) { return openblas_get_num_threads ? openblas_get_num_threads() : 1; }

const char *gp_blas_corename(void) {
    return openblas_get_corename ? openblas_get_corename() : "unknown (not OpenBLAS)";
}
