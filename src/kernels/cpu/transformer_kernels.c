/* CPU kernels of the Transformer family: linear, layer norm, GELU, dropout and the token and
 * positional embeddings. Loops are written so that gcc/clang vectorize them without -ffast-math:
 * reductions keep GP_LANES independent partial sums, combined in a fixed order. Work is split
 * over the device's threads by rows, and by columns where rows are summed (the gradients of
 * weights and biases), so every output is computed by one thread in the serial order. */
#include <string.h>

#include "core/bf16.h"
#include "core/error.h"
#include "kernels/checks.h"
#include "kernels/cpu/cpu_ops.h"
#include "kernels/cpu/gemm.h"
#include "kernels/cpu/pool.h"
#include "kernels/cpu/transformer_math.h"

#define LAYERNORM_EPS 1e-5f

/* Rows per thread below which a row-wise op stays on one thread: ~16K floats of work. */
static int64_t row_grain(int64_t cols) { return cols >= 16384 ? 1 : 16384 / (cols > 0 ? cols : 1); }
#define COL_ALIGN 16

typedef struct tf_args {
    int64_t rows, cols, out, vocab, row_len, batch, seq;
    const float *x, *w, *b, *res, *dy, *dres, *stats;
    const int32_t *ids;
    float *y, *dx, *dw, *db, *out_stats;
    uint16_t *y16; /* the output in bf16 instead of y (kernel_ops.def) */
    const gp_rng_stream *rng;
    float p;
} tf_args;

/* ---------------------------------------------------------------- linear */

static void linear_prefill_range(void *ctx, int64_t lo, int64_t hi) {
    const tf_args *a = ctx;
    const int64_t out = a->out;
    const float *b = a->b;
    for (int64_t i = lo; i < hi; i++) {
        float *yr = a->y + i * out;
        const float *rr = a->res ? a->res + i * out : NULL;
        if (b && rr) {
            for (int64_t j = 0; j < out; j++) yr[j] = rr[j] + b[j];
        } else if (b) {
            memcpy(yr, b, (size_t)out * sizeof *yr);
        } else if (rr != yr) {
            memcpy(yr, rr, (size_t)out * sizeof *yr);
        }
    }
}

gp_status gp_cpu_linear_forward(gp_device *dev, int64_t rows, int64_t in, int64_t out,
                                const float *x, const uint16_t *x16, const float *w,
                                const uint16_t *w16, const float *b, const float *res, float *y) {
    /* OpenBLAS clears C in a separate pass when beta = 0, so writing the bias
     * (and residual) there first and accumulating with beta = 1 costs nothing. */
    const bool bf16 = gp_device_precision(dev) == GP_PRECISION_BF16;
    GP_TRY(gp_kernels_check_bf16_operand("linear_forward", gp_device_name(dev), bf16,
                                         x16 || w16));
    float beta = 0.0f;
    if (b || res) {
        beta = 1.0f;
        tf_args a = {.out = out, .b = b, .res = res, .y = y};
        gp_cpu_parallel_for(gp_cpu_pool_of(dev), rows, 1, row_grain(out), linear_prefill_range,
                            &a);
    }
    return gp_cpu_gemm_mixed(dev, false, true, rows, out, in, 1.0f, x, x16, in, w, w16, in, beta,
                             y, out);
}

gp_status gp_cpu_linear_backward(gp_device *dev, int64_t rows, int64_t in, int64_t out,
                                 const float *x, const uint16_t *x16, const float *w,
                                 const uint16_t *w16, const float *dy, float *dx, float *dw,
                                 float *db) {
    if (dx)
        GP_TRY(gp_cpu_gemm_mixed(dev, false, false, rows, in, out, 1.0f, dy, NULL, out, w, w16, in,
                                 0.0f, dx, in));
    if (dw)
        GP_TRY(gp_cpu_gemm_mixed(dev, true, false, out, in, rows, 1.0f, dy, NULL, out, x, x16, in,
                                 1.0f, dw, in));
    if (db) GP_TRY(gp_cpu_sum_rows_add(dev, dy, rows, out, db));
    return GP_OK;
}

/* ------------------------------------------------------------ layer norm */

static void layernorm_forward_range(void *ctx, int64_t lo, int64_t hi) {
    const tf_args *a = ctx;
    const int64_t dim = a->cols, rows = a->rows;
    const int64_t body = dim - dim % GP_LANES;
    const float *w = a->w, *b = a->b;
    for (int64_t i = lo; i < hi; i++) {
        const float *xr = a->x + i * dim; // (dim)
        float *yr = a->y16 ? NULL : a->y + i * dim;
        float acc[GP_LANES] = {0};
        for (int64_t j = 0; j < body; j += GP_LANES)
            for (int l = 0; l < GP_LANES; l++) acc[l] += xr[j + l];
        float s = gp_lanes_total(acc);
        for (int64_t j = body; j < dim; j++) s += xr[j];
        const float mean = s / (float)dim;
        /* Two passes (mean, then squared deviations): no cancellation. */
        float acc2[GP_LANES] = {0};
        for (int64_t j = 0; j < body; j += GP_LANES)
            for (int l = 0; l < GP_LANES; l++) {
                float d = xr[j + l] - mean;
                acc2[l] += d * d;
            }
        float v = gp_lanes_total(acc2);
        for (int64_t j = body; j < dim; j++) v += (xr[j] - mean) * (xr[j] - mean);
        const float rstd = 1.0f / sqrtf(v / (float)dim + LAYERNORM_EPS);
        if (a->y16)
            for (int64_t j = 0; j < dim; j++)
                a->y16[i * dim + j] = gp_bf16_bits((xr[j] - mean) * rstd * w[j] + b[j]);
        else
            for (int64_t j = 0; j < dim; j++) yr[j] = (xr[j] - mean) * rstd * w[j] + b[j];
        a->out_stats[i] = mean;
        a->out_stats[rows + i] = rstd;
    }
}

gp_status gp_cpu_layernorm_forward(gp_device *dev, int64_t rows, int64_t dim, const float *x,
                                   const float *w, const float *b, float *y, uint16_t *y16,
                                   float *stats) {
    tf_args a = {.rows = rows, .cols = dim, .x = x, .w = w, .b = b, .y = y, .y16 = y16,
                 .out_stats = stats};
    gp_cpu_parallel_for(gp_cpu_pool_of(dev), rows, 1, row_grain(dim), layernorm_forward_range,
                        &a);
    return GP_OK;
}

/* dx of rows [lo, hi): each row's two sums, then its gradient. */
static void layernorm_dx_range(void *ctx, int64_t lo, int64_t hi) {
    const tf_args *a = ctx;
    const int64_t dim = a->cols, rows = a->rows;
    const int64_t body = dim - dim % GP_LANES;
    const float *w = a->w;
    for (int64_t i = lo; i < hi; i++) {
        const float *xr = a->x + i * dim, *dyr = a->dy + i * dim; // (dim)
        const float mean = a->stats[i], rstd = a->stats[rows + i];
        /* dxhat = dy * w;  dx = rstd (dxhat - mean(dxhat) - xhat mean(dxhat xhat)) */
        float a1[GP_LANES] = {0}, a2[GP_LANES] = {0};
        for (int64_t j = 0; j < body; j += GP_LANES)
            for (int l = 0; l < GP_LANES; l++) {
                float xh = (xr[j + l] - mean) * rstd;
                float g = dyr[j + l] * w[j + l];
                a1[l] += g;
                a2[l] += g * xh;
            }
        float s1 = gp_lanes_total(a1), s2 = gp_lanes_total(a2);
        for (int64_t j = body; j < dim; j++) {
            float xh = (xr[j] - mean) * rstd;
            float g = dyr[j] * w[j];
            s1 += g;
            s2 += g * xh;
        }
        const float m1 = s1 / (float)dim, m2 = s2 / (float)dim;
        float *dxr = a->dx + i * dim;
        if (a->dres) {
            const float *rr = a->dres + i * dim;
            for (int64_t j = 0; j < dim; j++) {
                float xh = (xr[j] - mean) * rstd;
                dxr[j] = rr[j] + rstd * (dyr[j] * w[j] - m1 - xh * m2);
            }
        } else {
            for (int64_t j = 0; j < dim; j++) {
                float xh = (xr[j] - mean) * rstd;
                dxr[j] = rstd * (dyr[j] * w[j] - m1 - xh * m2);
            }
        }
    }
}

/* dw and db of columns [lo, hi): rows in order. */
static void layernorm_dw_range(void *ctx, int64_t lo, int64_t hi) {
    const tf_args *a = ctx;
    const int64_t dim = a->cols, rows = a->rows;
    float *dw = a->dw, *db = a->db;
    for (int64_t i = 0; i < rows; i++) {
        const float *xr = a->x + i * dim, *dyr = a->dy + i * dim;
        const float mean = a->stats[i], rstd = a->stats[rows + i];
        for (int64_t j = lo; j < hi; j++) {
            float xh = (xr[j] - mean) * rstd;
            dw[j] += dyr[j] * xh;
            db[j] += dyr[j];
        }
    }
}

gp_status gp_cpu_layernorm_backward(gp_device *dev, int64_t rows, int64_t dim, const float *x,
                                    const float *w, const float *stats, const float *dy,
                                    const float *dres, float *dx, float *dw, float *db) {
    gp_cpu_pool *pool = gp_cpu_pool_of(dev);
    tf_args a = {.rows = rows, .cols = dim, .x = x, .w = w, .stats = stats, .dy = dy,
                 .dres = dres, .dx = dx, .dw = dw, .db = db};
    /* The parameter gradients first: dx may alias dres, never dy or x. */
    const int64_t per_col = rows > 0 ? rows : 1;
    gp_cpu_parallel_for(pool, dim, COL_ALIGN, (16384 + per_col - 1) / per_col,
                        layernorm_dw_range, &a);
    if (dx) gp_cpu_parallel_for(pool, rows, 1, row_grain(dim), layernorm_dx_range, &a);
    return GP_OK;
}

/* ------------------------------------------------------------------ GELU */

#define GELU_K0 0.7978845608028654f /* sqrt(2 / pi) */
#define GELU_K1 0.044715f

/* 0.5 (1 + tanh(u)) is evaluated as s = 1 / (1 + e), e = exp(-2u): the same
 * exp-based tanh with the "+1" folded in, so there is no cancellation where
 * tanh(u) is near -1 and each element costs one exp and one division. Past
 * |2u| = 80, s is exactly 0 or 1 (and e 0), keeping the gradient finite. */
static inline float gelu_sigmoid(float x, float *e_out) {
    const float z = -2.0f * GELU_K0 * GP_FMA(GELU_K1 * x, x * x, x); /* -2u */
    float zc = gp_select(z < -80.0f, -80.0f, z);
    zc = gp_select(zc > 80.0f, 80.0f, zc);
    const float e = gp_select(z < -80.0f, 0.0f, gp_exp_core(zc));
    *e_out = e;
    return gp_select(z > 80.0f, 0.0f, 1.0f / (1.0f + e));
}

static inline float gelu1(float x) {
    float e;
    return x * gelu_sigmoid(x, &e);
}

/* d/dx [x s(x)] = s + x * 2u' * s (1 - s), with 1 - s = e s; the products are
 * ordered so that a zero s (1 - s) is never multiplied by an overflow. */
static inline float gelu_grad1(float x) {
    float e;
    const float s = gelu_sigmoid(x, &e);
    const float x2 = gp_select(x * x > 1e6f, 1e6f, x * x);
    const float du2 = 2.0f * GELU_K0 * GP_FMA(3.0f * GELU_K1, x2, 1.0f); /* 2u' */
    return GP_FMA(x, du2 * (s * (e * s)), s);
}

static void gelu_forward_range(void *ctx, int64_t lo, int64_t hi) {
    const tf_args *a = ctx;
    const float *x = a->x;
    float *y = a->y;
    if (a->y16)
        for (int64_t i = lo; i < hi; i++) a->y16[i] = gp_bf16_bits(gelu1(x[i]));
    else
        for (int64_t i = lo; i < hi; i++) y[i] = gelu1(x[i]);
}

gp_status gp_cpu_gelu_forward(gp_device *dev, int64_t n, const float *x, float *y,
                              uint16_t *y16) {
    tf_args a = {.x = x, .y = y, .y16 = y16};
    gp_cpu_parallel_for(gp_cpu_pool_of(dev), n, COL_ALIGN, 4096, gelu_forward_range, &a);
    return GP_OK;
}

static void gelu_backward_range(void *ctx, int64_t lo, int64_t hi) {
    const tf_args *a = ctx;
    const float *x = a->x, *dy = a->dy;
    float *dx = a->dx;
    for (int64_t i = lo; i < hi; i++) dx[i] = dy[i] * gelu_grad1(x[i]);
}

gp_status gp_cpu_gelu_backward(gp_device *dev, int64_t rows, int64_t cols, const float *x,
                               const float *dy, float *dx, float *db) {
    tf_args a = {.x = x, .dy = dy, .dx = dx};
    gp_cpu_parallel_for(gp_cpu_pool_of(dev), rows * cols, COL_ALIGN, 4096, gelu_backward_range,
                        &a);
    /* The bias gradient sums the rows of dx in order, as a fused loop would. */
    return db ? gp_cpu_sum_rows_add(dev, dx, rows, cols, db) : GP_OK;
}

/* --------------------------------------------------------------- dropout */

/* The uniforms are made a chunk at a time on the stack: the mask is a pure function of
 * (stream, index), so nothing needs to be kept, and parts start on chunk boundaries. */
enum { DROPOUT_CHUNK = 1024 };

static void dropout_range(void *ctx, int64_t lo, int64_t hi) {
    const tf_args *a = ctx;
    float u[DROPOUT_CHUNK];
    const float p = a->p, scale = 1.0f / (1.0f - p);
    for (int64_t i0 = lo; i0 < hi; i0 += DROPOUT_CHUNK) {
        int64_t len = hi - i0 < DROPOUT_CHUNK ? hi - i0 : DROPOUT_CHUNK;
        gp_rng_uniform(a->rng, (uint64_t)i0, u, len);
        const float *xc = a->x + i0;
        float *yc = a->y + i0;
        if (a->res) {
            const float *rc = a->res + i0;
            for (int64_t j = 0; j < len; j++) yc[j] = rc[j] + xc[j] * (u[j] >= p ? scale : 0.0f);
        } else {
            for (int64_t j = 0; j < len; j++) yc[j] = xc[j] * (u[j] >= p ? scale : 0.0f);
        }
    }
}

gp_status gp_cpu_dropout(gp_device *dev, const gp_rng_stream *s, float p, int64_t n,
                         const float *x, const float *res, float *y) {
    tf_args a = {.rng = s, .p = p, .x = x, .res = res, .y = y};
    gp_cpu_parallel_for(gp_cpu_pool_of(dev), n, DROPOUT_CHUNK, 4 * DROPOUT_CHUNK, dropout_range,
                        &a);
    return GP_OK;
}

/* ------------------------------------------------------------ embeddings */


static void embedding_forward_range(void *ctx, int64_t lo, int64_t hi) {
    const tf_args *a = ctx;
    const int64_t dim = a->cols;
    for (int64_t i = lo; i < hi; i++)
        memcpy(a->y + i * dim, a->w + (int64_t)a->ids[i] * dim, (size_t)dim * sizeof *a->y);
}

gp_status gp_cpu_embedding_forward(gp_device *dev, int64_t n, int64_t row_len, int64_t dim,
                                   int64_t vocab, const int32_t *ids, const float *w, float *y) {
    GP_TRY(gp_kernels_check_ids(n, row_len, vocab, ids));
    tf_args a = {.cols = dim, .ids = ids, .w = w, .y = y};
    gp_cpu_parallel_for(gp_cpu_pool_of(dev), n, 1, row_grain(dim), embedding_forward_range, &a);
    return GP_OK;
}

/* Columns [lo, hi) of every position, in position order: each element's sum is the serial
 * scatter-add's. */
static void embedding_backward_range(void *ctx, int64_t lo, int64_t hi) {
    const tf_args *a = ctx;
    const int64_t dim = a->cols;
    for (int64_t i = 0; i < a->rows; i++) {
        float *row = a->dw + (int64_t)a->ids[i] * dim;
        const float *g = a->dy + i * dim;
        for (int64_t j = lo; j < hi; j++) row[j] += g[j];
    }
}

gp_status gp_cpu_embedding_backward(gp_device *dev, int64_t n, int64_t row_len, int64_t dim,
                                    int64_t vocab, const int32_t *ids, const float *dy,
                                    float *dw) {
    GP_TRY(gp_kernels_check_ids(n, row_len, vocab, ids));
    tf_args a = {.rows = n, .cols = dim, .ids = ids, .dy = dy, .dw = dw};
    const int64_t per_col = n > 0 ? n : 1;
    gp_cpu_parallel_for(gp_cpu_pool_of(dev), dim, COL_ALIGN, (16384 + per_col - 1) / per_col,
                        embedding_backward_range, &a);
    return GP_OK;
}

static void pos_forward_range(void *ctx, int64_t lo, int64_t hi) {
    const tf_args *a = ctx;
    const int64_t seq = a->seq, dim = a->cols;
    for (int64_t r = lo; r < hi; r++) {
        const float *xr = a->x + r * dim, *wr = a->w + (r % seq) * dim;
        float *yr = a->y + r * dim;
        for (int64_t j = 0; j < dim; j++) yr[j] = xr[j] + wr[j];
    }
}

gp_status gp_cpu_pos_embedding_forward(gp_device *dev, int64_t batch, int64_t seq, int64_t dim,
                                       const float *x, const float *w, float *y) {
    tf_args a = {.seq = seq, .cols = dim, .x = x, .w = w, .y = y};
    gp_cpu_parallel_for(gp_cpu_pool_of(dev), batch * seq, 1, row_grain(dim), pos_forward_range,
                        &a);
    return GP_OK;
}

/* Positions [lo, hi): row t of dw receives the batch in order b = 0, 1, ... */
static void pos_backward_range(void *ctx, int64_t lo, int64_t hi) {
    const tf_args *a = ctx;
    const int64_t seq = a->seq, dim = a->cols;
    for (int64_t b = 0; b < a->batch; b++)
        for (int64_t t = lo; t < hi; t++) {
            const float *g = a->dy + (b * seq + t) * dim;
            float *wr = a->dw + t * dim;
            for (int64_t j = 0; j < dim; j++) wr[j] += g[j];
        }
}

gp_status gp_cpu_pos_embedding_backward(gp_device *dev, int64_t batch, int64_t seq, int64_t dim,
                                        const float *dy, float *dw) {
    tf_args a = {.batch = batch, .seq = seq, .cols = dim, .dy = dy, .dw = dw};
    const int64_t per_pos = batch > 0 ? batch : 1;
    gp_cpu_parallel_for(gp_cpu_pool_of(dev), seq, 1,
                        row_grain(dim) / per_pos > 0 ? row_grain(dim) / per_pos : 1,
                        pos_backward_range, &a);
    return GP_OK;
}
