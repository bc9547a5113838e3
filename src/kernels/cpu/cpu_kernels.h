/* The CPU device's kernel functions behind its op table (isa_table.c puts them in the table of
 * each variant, isa.h), for the files of this folder, and the few that tests of the CPU math
 * call (those of the variant in use). Each takes the table's arguments; dev is unused on the
 * CPU (there is no queue). */
#ifndef GP_KERNELS_CPU_CPU_KERNELS_H
#define GP_KERNELS_CPU_CPU_KERNELS_H

#include "kernels/cpu/isa.h"
#include "kernels/cpu/pool.h"
#include "kernels/kernels.h"

/* Threads one CPU device may have. */
#define GP_CPU_MAX_THREADS 1024

/* The CPU's op table (the one for host memory): the variant's in use (gp_cpu_isa_active). */
const gp_kernels *gp_cpu_kernels(void);
/* A CPU device of `threads` threads running the kernels of variant isa, which this CPU must run
 * (gp_cpu_isa_find), whatever the variant in use: for tests of every variant in one process. */
gp_status gp_device_cpu_new_isa(const char *name, int threads, const gp_cpu_variant *isa,
                                gp_device **out);
/* OpenBLAS's own thread count (a CPU device sets it to 1 once: the device's threads split the
 * GEMMs); a no-op under another CBLAS. For the ceiling measurements of the benchmarks. */
void gp_cpu_blas_set_threads(int n);

/* CBLAS sgemm, row-major, on the calling thread alone; m or n of 0 does nothing. */
void gp_cpu_sgemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha,
                  const float *a, int64_t lda, const float *b, int64_t ldb, float beta, float *c,
                  int64_t ldc);

/* The vectorizable approximations of transformer_math.h out of line (relative error below
 * 3e-7; NaN propagates), for tests: outside the variants, the variant's in use. */
float gp_cpu_expf(float x);
float gp_cpu_tanhf(float x);
/* y[i] = tanh(x[i]); y may alias x. */
void gp_cpu_tanh(int64_t n, const float *x, float *y);

/* The ops of the table (kernel_ops.def), gp_cpu_<op>, defined by gemm.c, vector_kernels.c
 * (vectors, ReLU, optimizer updates), transformer_kernels.c (linear, layer norm, GELU, dropout,
 * embeddings), attention_kernels.c, loss_kernels.c, conv_kernels.c (convolutions, channel
 * biases, batch norm, pooling) and shard_kernels.c (the tensor-parallel shards' ops). */
#define GP_KERNEL_OP(op, ret, params) ret gp_cpu_##op params;
#include "kernels/kernel_ops.def"
#undef GP_KERNEL_OP

#endif
