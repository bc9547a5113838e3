/* The CUDA device's kernel functions behind its op table (cuda_device.c puts them in the table),
 * one .cu file per topic as the CPU's. Each takes the table's arguments (kernels/kernels.h has
 * what each computes); pointers are the device's, but for the scalars the table returns to the
 * host. C and CUDA C++ both include it. */
#ifndef GP_KERNELS_CUDA_CUDA_KERNELS_H
#define GP_KERNELS_CUDA_CUDA_KERNELS_H

#ifdef __cplusplus
extern "C" {
#endif

#include "core/error.h"
#include "kernels/kernels.h"

/* C (m, n) = alpha op(A) op(B) + beta C for count matrices at fixed strides (stride 0: the same
 * matrix for every product), row-major, through one cuBLAS call: what gemm, gemm_batched and the
 * attention and convolution kernels use. */
gp_status gp_cuda_sgemm_strided(gp_device *dev, bool trans_a, bool trans_b, int64_t m, int64_t n,
                                int64_t k, float alpha, const float *a, int64_t lda,
                                int64_t stride_a, const float *b, int64_t ldb, int64_t stride_b,
                                float beta, float *c, int64_t ldc, int64_t stride_c,
                                int64_t count);

/* gemm.cu */
gp_status gp_cuda_gemm(gp_device *dev, bool trans_a, bool trans_b, int64_t m, int64_t n,
                       int64_t k, float alpha, const float *a, int64_t lda, const float *b,
                       int64_t ldb, float beta, float *c, int64_t ldc);
gp_status gp_cuda_gemm_batched(gp_device *dev, bool trans_a, bool trans_b, int64_t m, int64_t n,
                               int64_t k, float alpha, const float *a, int64_t lda,
                               int64_t stride_a, const float *b, int64_t ldb, int64_t stride_b,
                               float beta, float *c, int64_t ldc, int64_t stride_c,
                               int64_t count);

/* vector.cu (the ReLUs too) and optimizer.cu (the updates) */
gp_status gp_cuda_fill(gp_device *dev, float *x, int64_t n, float value);
gp_status gp_cuda_scale(gp_device *dev, float *x, int64_t n, float alpha);
gp_status gp_cuda_axpy(gp_device *dev, int64_t n, float alpha, const float *x, float *y);
gp_status gp_cuda_sum_rows_add(gp_device *dev, const float *x, int64_t rows, int64_t cols,
                               float *out);
gp_status gp_cuda_sumsq(gp_device *dev, const float *x, int64_t n, double *out);
gp_status gp_cuda_relu_forward(gp_device *dev, int64_t n, const float *x, float *y);
gp_status gp_cuda_relu_backward(gp_device *dev, int64_t n, const float *x, const float *dy,
                                float *dx);
gp_status gp_cuda_sgd_update(gp_device *dev, int64_t n, float *w, const float *g, float *buf,
                             float lr, float wd, float momentum);
gp_status gp_cuda_adamw_update(gp_device *dev, int64_t n, float *w, const float *g, float *m,
                               float *v, const gp_adamw_step *s);

/* transformer.cu and embedding.cu (the token embeddings) */
gp_status gp_cuda_linear_forward(gp_device *dev, int64_t rows, int64_t in, int64_t out,
                                 const float *x, const float *w, const float *b, const float *res,
                                 float *y);
gp_status gp_cuda_linear_backward(gp_device *dev, int64_t rows, int64_t in, int64_t out,
                                  const float *x, const float *w, const float *dy, float *dx,
                                  float *dw, float *db);
gp_status gp_cuda_layernorm_forward(gp_device *dev, int64_t rows, int64_t dim, const float *x,
                                    const float *w, const float *b, float *y, float *stats);
gp_status gp_cuda_layernorm_backward(gp_device *dev, int64_t rows, int64_t dim, const float *x,
                                     const float *w, const float *stats, const float *dy,
                                     const float *dres, float *dx, float *dw, float *db);
gp_status gp_cuda_gelu_forward(gp_device *dev, int64_t n, const float *x, float *y);
gp_status gp_cuda_gelu_backward(gp_device *dev, int64_t rows, int64_t cols, const float *x,
                                const float *dy, float *dx, float *db);
gp_status gp_cuda_dropout(gp_device *dev, const gp_rng_stream *s, float p, int64_t n,
                          const float *x, const float *res, float *y);
gp_status gp_cuda_embedding_forward(gp_device *dev, int64_t n, int64_t row_len, int64_t dim,
                                    int64_t vocab, const int32_t *ids, const float *w, float *y);
gp_status gp_cuda_embedding_backward(gp_device *dev, int64_t n, int64_t row_len, int64_t dim,
                                     int64_t vocab, const int32_t *ids, const float *dy,
                                     float *dw);
gp_status gp_cuda_pos_embedding_forward(gp_device *dev, int64_t batch, int64_t seq, int64_t dim,
                                        const float *x, const float *w, float *y);
gp_status gp_cuda_pos_embedding_backward(gp_device *dev, int64_t batch, int64_t seq, int64_t dim,
                                         const float *dy, float *dw);

/* attention.cu */
gp_status gp_cuda_attention_forward(gp_device *dev, const gp_attn_dims *d, const float *qkv,
                                    float *probs, float *att);
int64_t gp_cuda_attention_backward_ws(gp_device *dev, const gp_attn_dims *d);
gp_status gp_cuda_attention_backward(gp_device *dev, const gp_attn_dims *d, const float *qkv,
                                     const float *probs, const float *datt, float *dqkv,
                                     float *dbias, float *ws);

/* loss.cu */
gp_status gp_cuda_softmax_xent(gp_device *dev, int64_t rows, int64_t classes, const float *logits,
                               const int32_t *labels, double normalizer, double smoothing,
                               double *loss, float *dlogits);

/* conv.cu (convolutions, channel biases) and norm_pool.cu (batch norm, pooling) */
int64_t gp_cuda_conv2d_ws(gp_device *dev, const gp_conv_geom *g, int64_t batch, int64_t out_ch,
                          bool backward, bool want_dx);
gp_status gp_cuda_conv2d_forward(gp_device *dev, const gp_conv_geom *g, int64_t batch,
                                 int64_t out_ch, const float *x, const float *w, float *y,
                                 float *ws);
gp_status gp_cuda_conv2d_backward(gp_device *dev, const gp_conv_geom *g, int64_t batch,
                                  int64_t out_ch, const float *x, const float *w, const float *dy,
                                  float *dx, float *dw, float *ws);
gp_status gp_cuda_channel_bias_add(gp_device *dev, int64_t batch, int64_t channels, int64_t npix,
                                   const float *bias, float *y);
gp_status gp_cuda_channel_bias_grad(gp_device *dev, int64_t batch, int64_t channels,
                                    int64_t npix, const float *dy, float *db);
gp_status gp_cuda_batchnorm_forward(gp_device *dev, const gp_bn_dims *d, const float *x,
                                    const float *gamma, const float *beta, float *running_mean,
                                    float *running_var, bool batch_stats, bool update_running,
                                    float *stats, float *y);
gp_status gp_cuda_batchnorm_backward(gp_device *dev, const gp_bn_dims *d, const float *x,
                                     const float *dy, const float *stats, const float *gamma,
                                     bool batch_stats, float *dx, float *dgamma, float *dbeta);
gp_status gp_cuda_maxpool_forward(gp_device *dev, const gp_pool_dims *d, const float *x, float *y,
                                  int32_t *argmax);
gp_status gp_cuda_maxpool_backward(gp_device *dev, const gp_pool_dims *d, const int32_t *argmax,
                                   const float *dy, float *dx);
gp_status gp_cuda_avgpool_forward(gp_device *dev, int64_t planes, int64_t hw, const float *x,
                                  float *y);
gp_status gp_cuda_avgpool_backward(gp_device *dev, int64_t planes, int64_t hw, const float *dy,
                                   float *dx);

/* embedding.cu and loss.cu: the tensor-parallel shards' ops */
gp_status gp_cuda_embedding_shard_forward(gp_device *dev, int64_t n, int64_t row_len, int64_t dim,
                                          int64_t vocab, int64_t first, int64_t rows,
                                          const int32_t *ids, const float *w, float *y);
gp_status gp_cuda_embedding_shard_backward(gp_device *dev, int64_t n, int64_t row_len,
                                           int64_t dim, int64_t vocab, int64_t first, int64_t rows,
                                           const int32_t *ids, const float *dy, float *dw);
gp_status gp_cuda_row_max(gp_device *dev, int64_t rows, int64_t cols, const float *x, float *out);
gp_status gp_cuda_xent_shard_sums(gp_device *dev, int64_t rows, int64_t classes, int64_t vocab,
                                  int64_t first, const float *logits, const int32_t *labels,
                                  const float *mx, double smoothing, float *sums);
gp_status gp_cuda_xent_shard_finish(gp_device *dev, int64_t rows, int64_t classes, int64_t vocab,
                                    int64_t first, const float *logits, const int32_t *labels,
                                    const float *mx, const float *sums, double normalizer,
                                    double smoothing, double *loss, float *dlogits);

#ifdef __cplusplus
}
#endif

#endif
