/* The CPU's single-threaded BLAS call and OpenBLAS's thread count (gemm.c, compiled once: the
 * variants share it, as they share the table's gemm ops, cpu_ops.h). */
#ifndef GP_KERNELS_CPU_GEMM_H
#define GP_KERNELS_CPU_GEMM_H

#include <stdbool.h>
#include <stdint.h>

#include "gpipe.h"

/* OpenBLAS's own thread count (a CPU device sets it to 1 once: the device's threads split the
 * GEMMs); a no-op under another CBLAS. For the ceiling measurements of the benchmarks. */
void gp_cpu_blas_set_threads(int n);

/* CBLAS sgemm, row-major, on the calling thread alone; m or n of 0 does nothing. */
void gp_cpu_sgemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha,
                  const float *a, int64_t lda, const float *b, int64_t ldb, float beta, float *c,
                  int64_t ldc);

/* dst[0..n) = src rounded to bf16 (core/bf16.h), over the pool's threads: the operands of a bf16
 * device's products (gpipe.h, gp_precision); as fp32 values, or (store) as bf16 bits. */
struct gp_cpu_pool;
void gp_cpu_bf16_round_n(struct gp_cpu_pool *pool, const float *src, float *dst, int64_t n);
void gp_cpu_bf16_store_n(struct gp_cpu_pool *pool, const float *src, uint16_t *dst, int64_t n);

/* The gemm op with either operand given in bf16 instead (a16, b16 when not NULL: then a, b are
 * not read; kernel_ops.def, the Transformer family's bf16 operands), for the ops of other
 * files; a bf16 operand on an fp32 device is GP_INVALID_ARGUMENT. */
gp_status gp_cpu_gemm_mixed(gp_device *dev, bool trans_a, bool trans_b, int64_t m,
                            int64_t n, int64_t k, float alpha, const float *a,
                            const uint16_t *a16, int64_t lda, const float *b, const uint16_t *b16,
                            int64_t ldb, float beta, float *c, int64_t ldc);

#endif
