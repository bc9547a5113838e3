/* The CUDA device's kernel functions behind its op table (cuda_device.c puts them in the table),
 * one .cu file per topic as the CPU's. Each takes the table's arguments (kernels/kernel_ops.def
 * says what each computes); pointers are the device's, but for the scalars the table returns to
 * the host. C and CUDA C++ both include it. */
#ifndef GP_KERNELS_CUDA_CUDA_KERNELS_H
#define GP_KERNELS_CUDA_CUDA_KERNELS_H

#ifdef __cplusplus
extern "C" {
#endif

#include "core/error.h"
#include "kernels/checks.h"
#include "kernels/kernel_table.h"

/* C (m, n) = alpha op(A) op(B) + beta C for count matrices at fixed strides (stride 0: the same
 * matrix for every product), row-major, through one cuBLAS call. sgemm: in fp32 always (the
 * convolutions); gemm: in the device's precision (gpipe.h, gp_precision: bf16 operands
 * converted into workspace first), what gemm, gemm_batched and attention use. */
gp_status gp_cuda_sgemm_strided(gp_device *dev, bool trans_a, bool trans_b, int64_t m, int64_t n,
                                int64_t k, float alpha, const float *a, int64_t lda,
                                int64_t stride_a, const float *b, int64_t ldb, int64_t stride_b,
                                float beta, float *c, int64_t ldc, int64_t stride_c,
                                int64_t count);
gp_status gp_cuda_gemm_strided(gp_device *dev, bool trans_a, bool trans_b, int64_t m, int64_t n,
                               int64_t k, float alpha, const float *a, int64_t lda,
                               int64_t stride_a, const float *b, int64_t ldb, int64_t stride_b,
                               float beta, float *c, int64_t ldc, int64_t stride_c,
                               int64_t count);

/* An operand that several products share, rounded to bf16 once: on a bf16 device x[0..span)
 * into new workspace (*out; gp_cuda_workspace_release it once the products that read it are
 * queued), on an fp32 device nothing (*out = NULL). gp_cuda_gemm_rounded takes such copies
 * (a16, b16; NULL: that operand rounded by the call) beside the fp32 operands; span must cover
 * what the product reads (core/bf16.h, gp_bf16_operand_span). */
gp_status gp_cuda_round_operand(gp_device *dev, const float *x, int64_t span, void **out);
/* (gp_cuda_bf16_store, the kernel op bf16_store, also makes an op's output kept in bf16 where
 * the op makes it in fp32 first.) */
gp_status gp_cuda_gemm_rounded(gp_device *dev, bool trans_a, bool trans_b, int64_t m, int64_t n,
                               int64_t k, float alpha, const float *a, const void *a16,
                               int64_t lda, int64_t stride_a, const float *b, const void *b16,
                               int64_t ldb, int64_t stride_b, float beta, float *c, int64_t ldc,
                               int64_t stride_c, int64_t count);

/* y (rows, out) = x W^T + b [+ res] on a bf16 device through cuBLASLt (gemm_lt.h): the bias in
 * the epilogue, res as C with beta 1 (res may be y), the operands' bf16 copies as
 * gp_cuda_gemm_rounded makes them. *done false, nothing queued, on an fp32 device, under
 * GP_CUDA_EPILOGUE=prefill, where a matrix or the bias is not 16-byte aligned, or where
 * cuBLASLt has no algorithm for the shape (the same answer for the same shape every time): the
 * caller then prefills and calls cuBLAS. */
gp_status gp_cuda_linear_lt(gp_device *dev, int64_t rows, int64_t in, int64_t out, const float *x,
                            const uint16_t *x16, const float *w, const uint16_t *w16,
                            const float *b, const float *res, float *y, bool *done);

/* The fused attention of a bf16 device (flash_attention.cu): whether it takes these dims on dev
 * (bf16, head size a multiple of 16 up to 128, shared memory enough), its forward (lse: B H T
 * row log-sum-exps, at the start of the op's probs) and its backward (dsum: B H T floats of
 * workspace); att in bf16 where att16 is not NULL. */
bool gp_cuda_flash_fits(gp_device *dev, const gp_attn_dims *d);
gp_status gp_cuda_flash_forward(gp_device *dev, const gp_attn_dims *d, const float *qkv,
                                float *lse, float *att, uint16_t *att16);
gp_status gp_cuda_flash_backward(gp_device *dev, const gp_attn_dims *d, const float *qkv,
                                 const float *lse, const float *att, const uint16_t *att16,
                                 const float *datt, float *dqkv, float *dsum);

/* out0[j] (and out1[j] where not NULL, from part + nchunks cols) += the chunk partials of column
 * j in chunk order: the second pass of the chunked column sums (math.cuh, GP_CUDA_SUM_CHUNK),
 * shared by the bias and layer-norm gradients (vector.cu). */
struct gp_cuda_ctx;
gp_status gp_cuda_sum_partials(struct gp_cuda_ctx *c, const float *part, int64_t nchunks,
                               int64_t cols, float *out0, float *out1);

/* The ops of the table (kernel_ops.def), gp_cuda_<op>, defined by gemm.cu, vector.cu (vectors,
 * ReLU), optimizer.cu (the updates), transformer.cu (linear, layer norm, GELU, dropout, position
 * embeddings), embedding.cu (token embeddings and their shards), attention.cu, loss.cu (the
 * softmax cross-entropy and its shards' sums), conv.cu (convolutions, channel biases) and
 * norm_pool.cu (batch norm, pooling). */
#define GP_KERNEL_OP(op, ret, params) ret gp_cuda_##op params;
#include "kernels/kernel_ops.def"
#undef GP_KERNEL_OP

#ifdef __cplusplus
}
#endif

#endif
