/* The kernel op table: every computation a layer, the loss or the optimizer does on tensor data,
 * one table per kind of device (kernels/cpu/ for the CPU; a GPU registers its own). Layers call
 * only the table of the device their tensors live on (gp_kernels_of), so a layer is written once
 * for every device. Pointers are device pointers of that device; scalars that come back to the
 * caller (a loss, a sum of squares) are host pointers. Every op returns a status; the CPU's fail
 * only on bad input they detect (a token id or label out of range), with a message that names
 * it, before writing any output. Shapes in comments: (rows, cols).
 *
 * Determinism: every reduction adds in an order fixed by the op's code and the shapes, never by
 * timing, so the same inputs give the same bits on every run. On the CPU the order does not
 * depend on the number of threads either, except inside the GEMMs (gemm, gemm_batched and the
 * linear ops), which the same thread count cuts the same way. The CPU's order is documented
 * per op where the rest of the library relies on it. */
#ifndef GP_KERNELS_KERNELS_H
#define GP_KERNELS_KERNELS_H

#include <stdbool.h>
#include <stdint.h>

#include "core/device.h"
#include "gpipe.h"

/* Causal multi-head attention dimensions: qkv (B, T, 3C), head h uses columns h*hd..(h+1)*hd-1
 * of each of q, k, v; head_dim hd = C / H. */
typedef struct gp_attn_dims {
    int64_t batch, seq, dim, heads; /* B, T, C, H */
} gp_attn_dims;

/* One 2-D convolution over one example, square kernel. */
typedef struct gp_conv_geom {
    int64_t channels, height, width; /* input (C, H, W) */
    int64_t kernel, stride, pad;
    int64_t out_h, out_w; /* (H + 2 pad - k) / stride + 1, same for W */
} gp_conv_geom;

/* NCHW planes of batch norm: (B, C, HW). */
typedef struct gp_bn_dims {
    int64_t batch, channels, hw;
    double eps, momentum;
} gp_bn_dims;

/* Max pooling without padding over `planes` (B * C) planes of (H, W). */
typedef struct gp_pool_dims {
    int64_t planes, height, width, out_h, out_w, kernel, stride;
} gp_pool_dims;

/* One AdamW update's scalars (PyTorch's rule, bias corrections precomputed by the caller). */
typedef struct gp_adamw_step {
    float decay;     /* 1 - lr * weight_decay (1: no decay) */
    float beta1, beta2, eps;
    float step_size; /* lr / (1 - beta1^t) */
    float bc2_sqrt;  /* sqrt(1 - beta2^t) */
} gp_adamw_step;

typedef struct gp_kernels {
    const char *name; /* "cpu" */

    /* ---- matrices and vectors */
    /* Row-major C(m, n) = alpha op(A) op(B) + beta C; op(A): (m, k), op(B): (k, n); lda, ldb,
     * ldc are the row strides of the stored matrices. With beta = 0, C is not read (it may hold
     * anything, NaN included), as in BLAS. */
    gp_status (*gemm)(gp_device *dev, bool trans_a, bool trans_b, int64_t m, int64_t n,
                      int64_t k, float alpha, const float *a, int64_t lda, const float *b,
                      int64_t ldb, float beta, float *c, int64_t ldc);
    /* The same for `count` matrices at fixed strides (attention heads). */
    gp_status (*gemm_batched)(gp_device *dev, bool trans_a, bool trans_b, int64_t m, int64_t n,
                              int64_t k, float alpha, const float *a, int64_t lda,
                              int64_t stride_a, const float *b, int64_t ldb, int64_t stride_b,
                              float beta, float *c, int64_t ldc, int64_t stride_c,
                              int64_t count);
    /* x[i] = value */
    gp_status (*fill)(gp_device *dev, float *x, int64_t n, float value);
    /* x[i] *= alpha */
    gp_status (*scale)(gp_device *dev, float *x, int64_t n, float alpha);
    /* y[i] += alpha * x[i] */
    gp_status (*axpy)(gp_device *dev, int64_t n, float alpha, const float *x, float *y);
    /* out[j] += sum over rows i in order of x[i, j]; x (rows, cols): bias gradients. */
    gp_status (*sum_rows_add)(gp_device *dev, const float *x, int64_t rows, int64_t cols,
                              float *out);
    /* *out (host) = sum of x[i]^2 in double (CPU: 64 contiguous blocks set by n, each summed
     * in element order, then the blocks in order). */
    gp_status (*sumsq)(gp_device *dev, const float *x, int64_t n, double *out);

    /* ---- Transformer family */
    /* y (rows, out) = x (rows, in) W^T + b [+ res]; W (out, in); b, res may be NULL; res may
     * alias y. */
    gp_status (*linear_forward)(gp_device *dev, int64_t rows, int64_t in, int64_t out,
                                const float *x, const float *w, const float *b, const float *res,
                                float *y);
    /* dx (rows, in) written when not NULL; dw (out, in) and db (out) added into when not NULL.
     * Each of the three is computed alone: the parts of a split backward give its bits. */
    gp_status (*linear_backward)(gp_device *dev, int64_t rows, int64_t in, int64_t out,
                                 const float *x, const float *w, const float *dy, float *dx,
                                 float *dw, float *db);
    /* Over the last dimension of (rows, dim), eps 1e-5; stats (2, rows): mean, then
     * 1/sqrt(var + eps). */
    gp_status (*layernorm_forward)(gp_device *dev, int64_t rows, int64_t dim, const float *x,
                                   const float *w, const float *b, float *y, float *stats);
    /* dx = dres + LN'(x) dy when dx is not NULL (dres may be NULL or alias dx); dw, db added. */
    gp_status (*layernorm_backward)(gp_device *dev, int64_t rows, int64_t dim, const float *x,
                                    const float *w, const float *stats, const float *dy,
                                    const float *dres, float *dx, float *dw, float *db);
    /* GELU, tanh form; y may alias x. */
    gp_status (*gelu_forward)(gp_device *dev, int64_t n, const float *x, float *y);
    /* dx = dy * gelu'(x) over (rows, cols); dx may alias dy; the columns of dx are summed into
     * db when it is not NULL. */
    gp_status (*gelu_backward)(gp_device *dev, int64_t rows, int64_t cols, const float *x,
                               const float *dy, float *dx, float *db);
    /* y = [res +] x * mask / (1 - p), mask_i = (u_i >= p), u_i element i of stream s: the mask
     * is never stored, backward calls the same op on dy. y may alias x or res. */
    gp_status (*dropout)(gp_device *dev, const gp_rng_stream *s, float p, int64_t n,
                         const float *x, const float *res, float *y);
    /* probs (B, H, T, T): softmax(q k^T / sqrt(hd)), zero above the diagonal; att (B, T, C). */
    gp_status (*attention_forward)(gp_device *dev, const gp_attn_dims *d, const float *qkv,
                                   float *probs, float *att);
    /* Floats of workspace attention_backward needs on dev (the CPU: T x T per thread). */
    int64_t (*attention_backward_ws)(gp_device *dev, const gp_attn_dims *d);
    /* datt (B, T, C) -> dqkv (B, T, 3C) written; rows of dqkv summed into dbias (3C) when not
     * NULL; ws: attention_backward_ws floats. */
    gp_status (*attention_backward)(gp_device *dev, const gp_attn_dims *d, const float *qkv,
                                    const float *probs, const float *datt, float *dqkv,
                                    float *dbias, float *ws);
    /* y (n, dim) = rows ids[i] of w (vocab, dim); an id outside [0, vocab) is an error naming
     * its position i (row i / row_len, column i % row_len). */
    gp_status (*embedding_forward)(gp_device *dev, int64_t n, int64_t row_len, int64_t dim,
                                   int64_t vocab, const int32_t *ids, const float *w, float *y);
    /* dw rows ids[i] += dy row i, in position order. */
    gp_status (*embedding_backward)(gp_device *dev, int64_t n, int64_t row_len, int64_t dim,
                                    int64_t vocab, const int32_t *ids, const float *dy,
                                    float *dw);
    /* y (B, T, D) = x + w rows 0..T-1; x may alias y. */
    gp_status (*pos_embedding_forward)(gp_device *dev, int64_t batch, int64_t seq, int64_t dim,
                                       const float *x, const float *w, float *y);
    /* dw rows t += dy[b, t] for b = 0, 1, ... in order. */
    gp_status (*pos_embedding_backward)(gp_device *dev, int64_t batch, int64_t seq, int64_t dim,
                                        const float *dy, float *dw);

    /* ---- loss */
    /* Softmax cross-entropy over rows of (rows, classes) against targets smoothed by
     * `smoothing` s in [0, 1): q = (1 - s) onehot + s / classes; labels in [-1, classes) (-1:
     * ignored; anything else is an error naming the row). *loss (host) = sum over counted rows
     * of -sum q log softmax, in double, rows in order, divided by normalizer (> 0 when any row
     * is counted); dlogits (may be NULL, may alias logits) = (softmax - q) / normalizer, zero
     * rows for ignored labels. s = 0 is the plain cross-entropy, -log softmax[label]. */
    gp_status (*softmax_xent)(gp_device *dev, int64_t rows, int64_t classes, const float *logits,
                              const int32_t *labels, double normalizer, double smoothing,
                              double *loss, float *dlogits);

    /* ---- convolutions, batch norm, pooling */
    /* Convolutions of x (B, C, H, W) with w (OC, C, k, k) into y (B, OC, OH, OW), g the
     * geometry of one example: floats of workspace conv2d_forward (backward false) or
     * conv2d_backward (with dx or not) needs on dev. */
    int64_t (*conv2d_ws)(gp_device *dev, const gp_conv_geom *g, int64_t batch, int64_t out_ch,
                         bool backward, bool want_dx);
    gp_status (*conv2d_forward)(gp_device *dev, const gp_conv_geom *g, int64_t batch,
                                int64_t out_ch, const float *x, const float *w, float *y,
                                float *ws);
    /* dw (OC, C, k, k, may be NULL) added into; dx (may be NULL) written; either computed
     * alone gives the bits of both together. The sum over the batch goes in an order set by the
     * batch size alone (CPU: per group of examples, groups in order). */
    gp_status (*conv2d_backward)(gp_device *dev, const gp_conv_geom *g, int64_t batch,
                                 int64_t out_ch, const float *x, const float *w, const float *dy,
                                 float *dx, float *dw, float *ws);
    /* y (B, OC, P) += bias[o] on every pixel of channel o. */
    gp_status (*channel_bias_add)(gp_device *dev, int64_t batch, int64_t channels, int64_t npix,
                                  const float *bias, float *y);
    /* db[o] += sum over examples b in order of sum(dy[b, o, :]), in double, then rounded once. */
    gp_status (*channel_bias_grad)(gp_device *dev, int64_t batch, int64_t channels,
                                   int64_t npix, const float *dy, float *db);
    /* Batch statistics (batch_stats, which needs batch * hw >= 2 values per channel: the caller
     * checks) or the running ones; the running statistics move (momentum, unbiased variance) only
     * when update_running. stats (2, C): the mean and 1/sqrt(var + eps) used. Sums in double in
     * a fixed order. */
    gp_status (*batchnorm_forward)(gp_device *dev, const gp_bn_dims *d, const float *x,
                                   const float *gamma, const float *beta, float *running_mean,
                                   float *running_var, bool batch_stats, bool update_running,
                                   float *stats, float *y);
    /* dgamma, dbeta added into; dx (may be NULL) written; batch_stats as in forward. */
    gp_status (*batchnorm_backward)(gp_device *dev, const gp_bn_dims *d, const float *x,
                                    const float *dy, const float *stats, const float *gamma,
                                    bool batch_stats, float *dx, float *dgamma, float *dbeta);
    gp_status (*relu_forward)(gp_device *dev, int64_t n, const float *x, float *y);
    gp_status (*relu_backward)(gp_device *dev, int64_t n, const float *x, const float *dy,
                               float *dx);
    /* y (planes, OH, OW); argmax: the index h*W + w of each maximum in its plane: the first
     * maximum in row-major window order, except that a NaN wins (the last NaN when several, as
     * PyTorch). */
    gp_status (*maxpool_forward)(gp_device *dev, const gp_pool_dims *d, const float *x, float *y,
                                 int32_t *argmax);
    /* dx (planes, H, W) = 0, then dy scattered onto the maxima, in output order. */
    gp_status (*maxpool_backward)(gp_device *dev, const gp_pool_dims *d, const int32_t *argmax,
                                  const float *dy, float *dx);
    /* y[p] = mean of plane p of x (planes, hw), summed in double. */
    gp_status (*avgpool_forward)(gp_device *dev, int64_t planes, int64_t hw, const float *x,
                                 float *y);
    /* dx[p, :] = dy[p] / hw */
    gp_status (*avgpool_backward)(gp_device *dev, int64_t planes, int64_t hw, const float *dy,
                                  float *dx);

    /* ---- optimizer updates over flat arrays of n elements */
    /* SGD with optional momentum buffer (NULL: none) and L2 weight decay wd:
     * d = g + wd w; buf = momentum buf + d; w -= lr buf (or lr d without a buffer). */
    gp_status (*sgd_update)(gp_device *dev, int64_t n, float *w, const float *g, float *buf,
                            float lr, float wd, float momentum);
    /* AdamW: w = w decay - step_size m / (sqrt(v) / bc2_sqrt + eps) after the moment updates. */
    gp_status (*adamw_update)(gp_device *dev, int64_t n, float *w, const float *g, float *m,
                              float *v, const gp_adamw_step *s);

    /* ---- tensor-parallel shards: one shard's part of a layer whose vocabulary (or classes) is
     * split over the tensor axis; the shard holds rows (classes) [first, first + rows) of the
     * whole `vocab`. Ids and labels outside [0, vocab) (labels: [-1, vocab)) are errors naming
     * their position, as in the whole-table ops. */
    /* y (n, dim) = row ids[i] - first of w (rows, dim) for ids in the shard, zero rows for the
     * others: the shards' outputs add up to embedding_forward's exactly (one of them non-zero). */
    gp_status (*embedding_shard_forward)(gp_device *dev, int64_t n, int64_t row_len, int64_t dim,
                                         int64_t vocab, int64_t first, int64_t rows,
                                         const int32_t *ids, const float *w, float *y);
    /* dw row ids[i] - first += dy row i for ids in the shard, in position order. */
    gp_status (*embedding_shard_backward)(gp_device *dev, int64_t n, int64_t row_len,
                                          int64_t dim, int64_t vocab, int64_t first, int64_t rows,
                                          const int32_t *ids, const float *dy, float *dw);
    /* out[r] = the largest value of row r of x (rows, cols); a NaN wins. */
    gp_status (*row_max)(gp_device *dev, int64_t rows, int64_t cols, const float *x, float *out);
    /* The shard's sums of a softmax cross-entropy over classes split by shard: logits (rows,
     * classes) hold classes [first, first + classes) of `vocab`; mx (rows) is the row maximum over
     * every shard (row_max, then an all-reduce max). sums (2, rows), or (3, rows) with label
     * smoothing > 0: [0][r] = sum of exp(x - mx[r]) over the shard's classes, in double, rounded
     * once; [1][r] = x[label] - mx[r] when the label is the shard's, else 0; [2][r] = sum of
     * x - mx[r] over the shard's classes, in double, rounded once (all 0 for an ignored row).
     * The shards' sums, added, are the whole row's. */
    gp_status (*xent_shard_sums)(gp_device *dev, int64_t rows, int64_t classes, int64_t vocab,
                                 int64_t first, const float *logits, const int32_t *labels,
                                 const float *mx, double smoothing, float *sums);
    /* With sums added over every shard: *loss (host) = the sum over counted rows of
     * log(sums[0][r]) - sums[1][r] (smoothing s > 0: log(sums[0][r]) - (1 - s) sums[1][r] -
     * s / vocab sums[2][r]), in double, rows in order, divided by normalizer: the same on every
     * shard; dlogits (may be NULL, may alias logits) = (exp(x - mx) / sums[0] - target) /
     * normalizer on the shard's classes (target: the one-hot label, or 1 - s on it plus s / vocab
     * on every class), zero rows for ignored labels. */
    gp_status (*xent_shard_finish)(gp_device *dev, int64_t rows, int64_t classes, int64_t vocab,
                                   int64_t first, const float *logits, const int32_t *labels,
                                   const float *mx, const float *sums, double normalizer,
                                   double smoothing, double *loss, float *dlogits);
} gp_kernels;

/* The table for memory on dev; NULL (a host view) gets the CPU's, which works on host memory. */
const gp_kernels *gp_kernels_of(const gp_device *dev);
/* Whether memory on a and on b can go to one kernel call: the same device, or both host memory
 * (NULL or a device whose memory is the host's). */
bool gp_kernels_same_memory(const gp_device *a, const gp_device *b);

/* checks.c: the checks of the ops that read ids or labels, before they write anything (host
 * arrays): every id in [0, vocab) (named by position, row and column); every label in [-1,
 * classes) (-1: ignored; *counted, may be NULL, gets the others); a vocabulary shard
 * [first, first + rows) within [0, vocab) and not empty (`what` names it); the normalizer > 0
 * where any row is labelled. */
gp_status gp_kernels_check_ids(int64_t n, int64_t row_len, int64_t vocab, const int32_t *ids);
gp_status gp_kernels_check_labels(int64_t rows, int64_t classes, const int32_t *labels,
                                  int64_t *counted);
gp_status gp_kernels_check_shard(int64_t vocab, int64_t first, int64_t rows, const char *what);
gp_status gp_kernels_check_normalizer(double normalizer, int64_t counted);
/* A label smoothing in [0, 1), or an error naming it. */
gp_status gp_kernels_check_smoothing(double smoothing);

#endif
