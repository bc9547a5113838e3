/* A bf16 device's products through cuBLASLt, where an epilogue does what a separate pass would:
 * the bias added as the product is written, and a residual taken as C (beta 1), so the linear
 * forward needs no prefill of its output (transformer.cu). Column-major, as cuBLAS: D (m x n) =
 * op(A) op(B) + beta C + bias broadcast along the rows' columns, A and B bf16, C and D fp32 (C
 * may be D), fp32 sums. No workspace and no split-k reduction scheme: every algorithm a tile
 * kernel whose sums do not depend on what else runs, so a shape gives the same bits each time.
 * Only for 16-byte aligned matrices and bias, so that where a buffer lies never changes the
 * algorithm. The algorithm found for a shape is kept: the heuristic is asked once per shape.
 * C and CUDA C++ both include it. */
#ifndef GP_KERNELS_CUDA_GEMM_LT_H
#define GP_KERNELS_CUDA_GEMM_LT_H

#include <stdbool.h>
#include <stdint.h>

#include "kernels/cuda/cuda_context.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct gp_cuda_lt gp_cuda_lt;

typedef struct gp_cuda_lt_gemm {
    bool trans_a, trans_b;
    int64_t m, n, k;
    const void *a16; /* bf16 */
    int64_t lda;
    const void *b16; /* bf16 */
    int64_t ldb;
    float beta;     /* 0: C is not read */
    const float *c; /* m x n at ldd, or NULL with beta 0; may be d */
    float *d;
    int64_t ldd;
    const float *bias; /* m floats, or NULL */
} gp_cuda_lt_gemm;

/* The device's cuBLASLt state (its handle and the algorithms found); NULL with the message set
 * on failure. */
gp_cuda_lt *gp_cuda_lt_new(const gp_cuda_ctx *c, gp_status *status);
void gp_cuda_lt_free(gp_cuda_lt *lt);

/* *yes: whether g's pointers are 16-byte aligned and cuBLASLt has an algorithm for g on this
 * GPU (asked once per shape, transposes and epilogue; a question the heuristic refuses counts
 * as none); nothing is queued. */
gp_status gp_cuda_lt_supports(gp_cuda_ctx *c, const gp_cuda_lt_gemm *g, bool *yes);
/* Queues g on the device's stream with that algorithm (after gp_cuda_lt_supports said yes;
 * GP_UNSUPPORTED otherwise): *done true. Where cublasLtMatmul refuses the algorithm after all
 * (CUBLAS_STATUS_NOT_SUPPORTED) nothing is queued, *done is false, and the shape counts as
 * having none from then on. */
gp_status gp_cuda_lt_run(gp_cuda_ctx *c, const gp_cuda_lt_gemm *g, bool *done);

#ifdef __cplusplus
}
#endif

#endif
