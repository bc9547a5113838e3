/* GEMM through CBLAS, and BLAS thread control. */
#include <cblas.h>
#include <stdlib.h>

#include "../../core/error.h"

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

gp_status gp_bench_sgemm(int64_t m, int64_t n, int64_t k, int reps, double *gflops) {
    if (m <= 0 || n <= 0 || k <= 0 || reps < 1 || !gflops)
        return gp_error(GP_INVALID_ARGUMENT,
                        "gp_bench_sgemm: m, n, k and reps must be positive (got %lld, %lld, %lld, %d)",
                        (long long)m, (long long)n, (long long)k, reps);
    float *a = malloc((size_t)(m * k) * sizeof *a);
    float *b = malloc((size_t)(k * n) * sizeof *b);
    float *c = malloc((size_t)(m * n) * sizeof *c);
    if (!a || !b || !c) {
        free(a), free(b), free(c);
        return gp_error(GP_OUT_OF_MEMORY, "gp_bench_sgemm: cannot allocate %lldx%lldx%lld matrices",
                        (long long)m, (long long)n, (long long)k);
    }
    for (int64_t i = 0; i < m * k; i++) a[i] = (float)(i % 13) * 0.01f;
    for (int64_t i = 0; i < k * n; i++) b[i] = (float)(i % 7) * 0.01f;
    gp_gemm(false, false, m, n, k, 1.0f, a, k, b, n, 0.0f, c, n);
    double best = 1e300;
    for (int r = 0; r < reps; r++) {
        double t0 = gp_now();
        gp_gemm(false, false, m, n, k, 1.0f, a, k, b, n, 0.0f, c, n);
        double dt = gp_now() - t0;
        if (dt < best) best = dt;
    }
    *gflops = 2.0 * (double)m * (double)n * (double)k / best / 1e9;
    free(a), free(b), free(c);
    return GP_OK;
}
