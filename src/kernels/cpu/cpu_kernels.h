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

/* gemm.c */
gp_status gp_cpu_gemm(gp_device *dev, bool trans_a, bool trans_b, int64_t m, int64_t n,
                      int64_t k, float alpha, const float *a, int64_t lda, const float *b,
                      int64_t ldb, float beta, float *c, int64_t ldc);
gp_status gp_cpu_gemm_batched(gp_device *dev, bool trans_a, bool trans_b, int64_t m, int64_t n,
                              int64_t k, float alpha, const float *a, int64_t lda,
                              int64_t stride_a, const float *b, int64_t ldb, int64_t stride_b,
                              float beta, float *c, int64_t ldc, int64_t stride_c,
                              int64_t count);

/* vector_kernels.c */
gp_status gp_cpu_fill(gp_device *dev, float *x, int64_t n, float value);
gp_status gp_cpu_scale(gp_device *dev, float *x, int64_t n, float alpha);
gp_status gp_cpu_axpy(gp_device *dev, int64_t n, float alpha, const float *x, float *y);
gp_status gp_cpu_sum_rows_add(gp_device *dev, const float *x, int64_t rows, int64_t cols,
                              float *out);
gp_status gp_cpu_sumsq(gp_device *dev, const float *x, int64_t n, double *out);
gp_status gp_cpu_relu_forward(gp_device *dev, int64_t n, const float *x, float *y);
gp_status gp_cpu_relu_backward(gp_device *dev, int64_t n, const float *x, const float *dy,
                               float *dx);
gp_status gp_cpu_sgd_update(gp_device *dev, int64_t n, float *w, const float *g, float *buf,
                            float lr, float wd, float momentum);
gp_status gp_cpu_adamw_update(gp_device *dev, int64_t n, float *w, const float *g, float *m,
                              float *v, const gp_adamw_step *s);

/* transformer_kernels.c */
gp_status gp_cpu_linear_forward(gp_device *dev, int64_t rows, int64_t in, int64_t out,
                                const float *x, const float *w, const float *b, const float *res,
                                float *y);
gp_status gp_cpu_linear_backward(gp_device *dev, int64_t rows, int64_t in, int64_t out,
                                 const float *x, const float *w, const float *dy, float *dx,
                                 float *dw, float *db);
gp_status gp_cpu_layernorm_forward(gp_device *dev, int64_t rows, int64_t dim, const float *x,
                                   const float *w, const float *b, float *y, float *stats);
gp_status gp_cpu_layernorm_backward(gp_device *dev, int64_t rows, int64_t dim, const float *x,
                                    const float *w, const float *stats, const float *dy,
                                    const float *dres, float *dx, float *dw, float *db);
gp_status gp_cpu_gelu_forward(gp_device *dev, int64_t n, const float *x, float *y);
gp_status gp_cpu_gelu_backward(gp_device *dev, int64_t rows, int64_t cols, const float *x,
                               const float *dy, float *dx, float *db);
gp_status gp_cpu_dropout(gp_device *dev, const gp_rng_stream *s, float p, int64_t n,
                         const float *x, const float *res, float *y);
gp_status gp_cpu_embedding_forward(gp_device *dev, int64_t n, int64_t row_len, int64_t dim,
                                   int64_t vocab, const int32_t *ids, const float *w, float *y);
gp_status gp_cpu_embedding_backward(gp_device *dev, int64_t n, int64_t row_len, int64_t dim,
                                    int64_t vocab, const int32_t *ids, const float *dy,
                                    float *dw);
gp_status gp_cpu_pos_embedding_forward(gp_device *dev, int64_t batch, int64_t seq, int64_t dim,
                                       const float *x, const float *w, float *y);
gp_status gp_cpu_pos_embedding_backward(gp_device *dev, int64_t batch, int64_t seq, int64_t dim,
                                        const float *dy, float *dw);

/* attention_kernels.c */
gp_status gp_cpu_attention_forward(gp_device *dev, const gp_attn_dims *d, const float *qkv,
                                   float *probs, float *att);
int64_t gp_cpu_attention_backward_ws(gp_device *dev, const gp_attn_dims *d);
gp_status gp_cpu_attention_backward(gp_device *dev, const gp_attn_dims *d, const float *qkv,
                                    const float *probs, const float *datt, float *dqkv,
                                    float *dbias, float *ws);

/* loss_kernels.c */
gp_status gp_cpu_softmax_xent(gp_device *dev, int64_t rows, int64_t classes, const float *logits,
                              const int32_t *labels, double normalizer, double smoothing,
                              double *loss, float *dlogits);

/* conv_kernels.c */
int64_t gp_cpu_conv2d_ws(gp_device *dev, const gp_conv_geom *g, int64_t batch, int64_t out_ch,
                         bool backward, bool want_dx);
gp_status gp_cpu_conv2d_forward(gp_device *dev, const gp_conv_geom *g, int64_t batch,
                                int64_t out_ch, const float *x, const float *w, float *y,
                                float *ws);
gp_status gp_cpu_conv2d_backward(gp_device *dev, const gp_conv_geom *g, int64_t batch,
                                 int64_t out_ch, const float *x, const float *w, const float *dy,
                                 float *dx, float *dw, float *ws);
gp_status gp_cpu_channel_bias_add(gp_device *dev, int64_t batch, int64_t channels, int64_t npix,
                                  const float *bias, float *y);
gp_status gp_cpu_channel_bias_grad(gp_device *dev, int64_t batch, int64_t channels,
                                   int64_t npix, const float *dy, float *db);
gp_status gp_cpu_batchnorm_forward(gp_device *dev, const gp_bn_dims *d, const float *x,
                                   const float *gamma, const float *beta, float *running_mean,
                                   float *running_var, bool batch_stats, bool update_running,
                                   float *stats, float *y);
gp_status gp_cpu_batchnorm_backward(gp_device *dev, const gp_bn_dims *d, const float *x,
                                    const float *dy, const float *stats, const float *gamma,
                                    bool batch_stats, float *dx, float *dgamma, float *dbeta);
gp_status gp_cpu_maxpool_forward(gp_device *dev, const gp_pool_dims *d, const float *x, float *y,
                                 int32_t *argmax);
gp_status gp_cpu_maxpool_backward(gp_device *dev, const gp_pool_dims *d, const int32_t *argmax,
                                  const float *dy, float *dx);
gp_status gp_cpu_avgpool_forward(gp_device *dev, int64_t planes, int64_t hw, const float *x,
                                 float *y);
gp_status gp_cpu_avgpool_backward(gp_device *dev, int64_t planes, int64_t hw, const float *dy,
                                  float *dx);

/* shard_kernels.c: the tensor-parallel shards' ops */
gp_status gp_cpu_embedding_shard_forward(gp_device *dev, int64_t n, int64_t row_len, int64_t dim,
                                         int64_t vocab, int64_t first, int64_t rows,
                                         const int32_t *ids, const float *w, float *y);
gp_status gp_cpu_embedding_shard_backward(gp_device *dev, int64_t n, int64_t row_len,
                                          int64_t dim, int64_t vocab, int64_t first, int64_t rows,
                                          const int32_t *ids, const float *dy, float *dw);
gp_status gp_cpu_row_max(gp_device *dev, int64_t rows, int64_t cols, const float *x, float *out);
gp_status gp_cpu_xent_shard_sums(gp_device *dev, int64_t rows, int64_t classes, int64_t vocab,
                                 int64_t first, const float *logits, const int32_t *labels,
                                 const float *mx, double smoothing, float *sums);
gp_status gp_cpu_xent_shard_finish(gp_device *dev, int64_t rows, int64_t classes, int64_t vocab,
                                   int64_t first, const float *logits, const int32_t *labels,
                                   const float *mx, const float *sums, double normalizer,
                                   double smoothing, double *loss, float *dlogits);

#endif
