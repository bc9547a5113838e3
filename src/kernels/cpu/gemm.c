/* GEMM through CBLAS (OpenBLAS by default; any CBLAS links), split over the device's threads:
 * the larger side of C is cut into one block of rows or columns per thread, each block one
 * single-threaded BLAS call. The same thread count gives the same cut, hence the same bits;
 * another thread count may round some elements differently (OpenBLAS's result for an element
 * depends on where its call's block starts). A cut fixed by the shape alone would make GEMMs
 * thread-count invariant too, but measured, 8 to 16 blocks cost 5-30% of a single call's
 * speed on T1's shapes (each block re-packs the whole other operand). A bf16 device's GEMMs
 * (gpipe.h, gp_precision) are these on operands rounded to bf16 first, or widened from bf16
 * where the caller keeps an operand in bf16. */
#include <cblas.h>
#include <stdlib.h>

#include "core/bf16.h"
#include "core/device.h"
#include "core/error.h"
#include "kernels/checks.h"
#include "kernels/cpu/cpu_ops.h"
#include "kernels/cpu/gemm.h"
#include "kernels/cpu/pool.h"

/* OpenBLAS extensions; other CBLAS libraries lack them, so they are weak. */
extern void openblas_set_num_threads(int) __attribute__((weak));
extern char *openblas_get_corename(void) __attribute__((weak));

/* Below this many multiply-adds a GEMM runs on one thread: waking the others costs more. */
#define SPLIT_MIN_MACS ((int64_t)1 << 19)
/* Blocks start at multiples of 16 rows or columns: whole register tiles of the sgemm kernels,
 * and whole 64-byte lines of C. */
#define SPLIT_ALIGN 16

void gp_cpu_sgemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha,
                  const float *a, int64_t lda, const float *b, int64_t ldb, float beta, float *c,
                  int64_t ldc) {
    if (m <= 0 || n <= 0) return;
    cblas_sgemm(CblasRowMajor, trans_a ? CblasTrans : CblasNoTrans,
                trans_b ? CblasTrans : CblasNoTrans, (blasint)m, (blasint)n, (blasint)k, alpha, a,
                (blasint)lda, b, (blasint)ldb, beta, c, (blasint)ldc);
}

typedef struct gemm_args {
    bool trans_a, trans_b;
    int64_t m, n, k;
    float alpha, beta;
    const float *a, *b;
    float *c;
    int64_t lda, ldb, ldc;
    int64_t stride_a, stride_b, stride_c, count;
    bool split_rows; /* one GEMM: blocks of C's rows (else of its columns) */
    int64_t blocks;
} gemm_args;

/* The cut of one GEMM: the larger side (each block re-packs the whole of the other operand),
 * in one block per thread, at most one per 16 rows or columns. */
static void gemm_cut(gemm_args *g, int threads) {
    g->split_rows = g->m >= g->n;
    const int64_t side = g->split_rows ? g->m : g->n;
    const int64_t units = (side + SPLIT_ALIGN - 1) / SPLIT_ALIGN;
    g->blocks = units < threads ? units : threads;
}

/* Block i of one GEMM. */
static void gemm_block(const gemm_args *g, int64_t i) {
    int64_t lo, hi;
    if (g->split_rows) {
        gp_cpu_split(g->m, (int)i, (int)g->blocks, SPLIT_ALIGN, &lo, &hi);
        const float *a = g->trans_a ? g->a + lo : g->a + lo * g->lda;
        gp_cpu_sgemm(g->trans_a, g->trans_b, hi - lo, g->n, g->k, g->alpha, a, g->lda, g->b,
                     g->ldb, g->beta, g->c + lo * g->ldc, g->ldc);
    } else {
        gp_cpu_split(g->n, (int)i, (int)g->blocks, SPLIT_ALIGN, &lo, &hi);
        const float *b = g->trans_b ? g->b + lo * g->ldb : g->b + lo;
        gp_cpu_sgemm(g->trans_a, g->trans_b, g->m, hi - lo, g->k, g->alpha, g->a, g->lda, b,
                     g->ldb, g->beta, g->c + lo, g->ldc);
    }
}

/* Part t: a run of blocks. */
static void gemm_part(void *ctx, int t, int nt) {
    const gemm_args *g = ctx;
    int64_t lo, hi;
    gp_cpu_split(g->blocks, t, nt, 1, &lo, &hi);
    for (int64_t i = lo; i < hi; i++) gemm_block(g, i);
}

/* Part t of a batch: whole GEMMs, a contiguous run of them per thread. */
static void batch_part(void *ctx, int t, int nt) {
    const gemm_args *g = ctx;
    int64_t lo, hi;
    gp_cpu_split(g->count, t, nt, 1, &lo, &hi);
    for (int64_t i = lo; i < hi; i++)
        gp_cpu_sgemm(g->trans_a, g->trans_b, g->m, g->n, g->k, g->alpha, g->a + i * g->stride_a,
                     g->lda, g->b + i * g->stride_b, g->ldb, g->beta, g->c + i * g->stride_c,
                     g->ldc);
}

static void gemm_on(gp_cpu_pool *pool, gemm_args *g) {
    if (g->m <= 0 || g->n <= 0) return;
    const int threads = gp_cpu_pool_threads(pool);
    if (threads == 1 || (g->m * g->n * g->k < SPLIT_MIN_MACS && !gp_cpu_pool_eager(pool))) {
        g->split_rows = true, g->blocks = 1;
        gemm_block(g, 0);
        return;
    }
    gemm_cut(g, threads);
    gp_cpu_pool_run(pool, (int)g->blocks, gemm_part, g);
}

static void gemm_fp32(gp_cpu_pool *pool, gemm_args *g) {
    if (g->count == 1) {
        gemm_on(pool, g);
        return;
    }
    const int threads = gp_cpu_pool_threads(pool);
    if (g->count <= 0 || g->m <= 0 || g->n <= 0) return;
    if (threads == 1 ||
        (g->m * g->n * g->k * g->count < SPLIT_MIN_MACS && !gp_cpu_pool_eager(pool))) {
        batch_part(g, 0, 1);
    } else if (g->count >= threads) {
        gp_cpu_pool_run(pool, threads, batch_part, g);
    } else {
        for (int64_t i = 0; i < g->count; i++) { /* fewer matrices than threads: split each */
            gemm_args one = *g;
            one.a = g->a + i * g->stride_a, one.b = g->b + i * g->stride_b;
            one.c = g->c + i * g->stride_c, one.count = 1;
            gemm_on(pool, &one);
        }
    }
}

/* One pass of the conversions between fp32 and bf16: exactly one of the sources is set. */
typedef struct round_args {
    const float *src;
    const uint16_t *src16;
    float *dst;
    uint16_t *dst16;
} round_args;

static void round_range(void *ctx, int64_t lo, int64_t hi) {
    const round_args *r = ctx;
    if (r->src16)
        for (int64_t i = lo; i < hi; i++) r->dst[i] = gp_bf16_float(r->src16[i]);
    else if (r->dst16)
        for (int64_t i = lo; i < hi; i++) r->dst16[i] = gp_bf16_bits(r->src[i]);
    else
        for (int64_t i = lo; i < hi; i++) r->dst[i] = gp_bf16_round(r->src[i]);
}

/* Rounding is a pass over the operands, (m + n) k elements of an m n k GEMM: split over the
 * threads only in runs long enough to pay for waking them. */
#define ROUND_GRAIN ((int64_t)1 << 15)

static void convert_n(gp_cpu_pool *pool, round_args r, int64_t n) {
    gp_cpu_parallel_for(pool, n, 1, ROUND_GRAIN, round_range, &r);
}

void gp_cpu_bf16_round_n(gp_cpu_pool *pool, const float *src, float *dst, int64_t n) {
    convert_n(pool, (round_args){.src = src, .dst = dst}, n);
}

void gp_cpu_bf16_store_n(gp_cpu_pool *pool, const float *src, uint16_t *dst, int64_t n) {
    convert_n(pool, (round_args){.src = src, .dst16 = dst}, n);
}

gp_status gp_cpu_bf16_store(gp_device *dev, const float *x, uint16_t *y16, int64_t n) {
    gp_cpu_bf16_store_n(gp_cpu_pool_of(dev), x, y16, n);
    return GP_OK;
}

/* The copy of one operand (n elements) a product reads: src16 widened, or src rounded in bf16;
 * NULL (src read as it is) otherwise. */
static const float *operand_copy(gp_cpu_pool *pool, bool bf16, const float *src,
                                 const uint16_t *src16, float *ws, int64_t n) {
    if (!src16 && !bf16) return src;
    convert_n(pool, (round_args){.src = src, .src16 = src16, .dst = ws}, n);
    return ws;
}

/* The GEMM in the device's precision: bf16 rounds A and B into workspace first (or widens
 * them there, given as bf16: a16, b16), then runs the fp32 GEMM on the copies, at the same
 * leading dimensions and strides, so its bits are the fp32 GEMM's of the rounded operands. */
static gp_status gemm(gp_device *dev, gemm_args *g, const uint16_t *a16, const uint16_t *b16) {
    gp_cpu_pool *pool = gp_cpu_pool_of(dev);
    const bool bf16 = gp_device_precision(dev) == GP_PRECISION_BF16;
    GP_TRY(gp_kernels_check_bf16_operand("gemm", gp_device_name(dev), bf16, a16 || b16));
    if (!bf16 || g->m <= 0 || g->n <= 0 || g->k <= 0 || g->count <= 0) {
        gemm_fp32(pool, g);
        return GP_OK;
    }
    const int64_t na =
        gp_bf16_operand_span(g->trans_a, g->m, g->k, g->lda, g->stride_a, g->count);
    const int64_t nb =
        gp_bf16_operand_span(g->trans_b, g->k, g->n, g->ldb, g->stride_b, g->count);
    gp_status s;
    float *ws = gp_device_alloc(dev, GP_MEM_WORKSPACE, (size_t)(na + nb) * sizeof(float), &s);
    if (!ws) return gp_error_context(s, "gemm in bf16: the rounded operands");
    g->a = operand_copy(pool, bf16, g->a, a16, ws, na);
    g->b = operand_copy(pool, bf16, g->b, b16, ws + na, nb);
    gemm_fp32(pool, g);
    gp_device_release(dev, ws);
    return GP_OK;
}

gp_status gp_cpu_gemm_mixed(gp_device *dev, bool trans_a, bool trans_b, int64_t m, int64_t n,
                            int64_t k, float alpha, const float *a, const uint16_t *a16,
                            int64_t lda, const float *b, const uint16_t *b16, int64_t ldb,
                            float beta, float *c, int64_t ldc) {
    gemm_args g = {.trans_a = trans_a, .trans_b = trans_b, .m = m, .n = n, .k = k,
                   .alpha = alpha, .beta = beta, .a = a, .b = b, .c = c,
                   .lda = lda, .ldb = ldb, .ldc = ldc, .count = 1};
    return gemm(dev, &g, a16, b16);
}

gp_status gp_cpu_gemm(gp_device *dev, bool trans_a, bool trans_b, int64_t m, int64_t n,
                      int64_t k, float alpha, const float *a, int64_t lda, const float *b,
                      int64_t ldb, float beta, float *c, int64_t ldc) {
    return gp_cpu_gemm_mixed(dev, trans_a, trans_b, m, n, k, alpha, a, NULL, lda, b, NULL, ldb,
                             beta, c, ldc);
}

gp_status gp_cpu_gemm_batched(gp_device *dev, bool trans_a, bool trans_b, int64_t m, int64_t n,
                              int64_t k, float alpha, const float *a, int64_t lda,
                              int64_t stride_a, const float *b, int64_t ldb, int64_t stride_b,
                              float beta, float *c, int64_t ldc, int64_t stride_c,
                              int64_t count) {
    gemm_args g = {.trans_a = trans_a, .trans_b = trans_b, .m = m, .n = n, .k = k,
                   .alpha = alpha, .beta = beta, .a = a, .b = b, .c = c,
                   .lda = lda, .ldb = ldb, .ldc = ldc, .stride_a = stride_a,
                   .stride_b = stride_b, .stride_c = stride_c, .count = count};
    return gemm(dev, &g, NULL, NULL);
}

void gp_cpu_blas_set_threads(int n) {
    if (openblas_set_num_threads) openblas_set_num_threads(n < 1 ? 1 : n);
}

const char *gp_blas_corename(void) {
    return openblas_get_corename ? openblas_get_corename() : "unknown (not OpenBLAS)";
}
