/* CPU kernels of the Transformer family: linear, layer norm, GELU, dropout and the token and
 * positional embeddings. Loops are written so that gcc/clang vectorize them without -ffast-math:
 * reductions keep GP_LANES independent partial sums, combined in a fixed order. */
#include <string.h>

#include "core/error.h"
#include "kernels/cpu/cpu_kernels.h"
#include "kernels/cpu/transformer_math.h"

#define LAYERNORM_EPS 1e-5f

float gp_cpu_expf(float x) { return gp_exp(x); }
float gp_cpu_tanhf(float x) { return gp_tanh(x); }

void gp_cpu_tanh(int64_t n, const float *x, float *y) {
    for (int64_t i = 0; i < n; i++) y[i] = gp_tanh(x[i]);
}

/* ---------------------------------------------------------------- linear */

gp_status gp_cpu_linear_forward(gp_device *dev, int64_t rows, int64_t in, int64_t out,
                                const float *x, const float *w, const float *b, const float *res,
                                float *y) {
    (void)dev;
    /* OpenBLAS clears C in a separate pass when beta = 0, so writing the bias
     * (and residual) there first and accumulating with beta = 1 costs nothing. */
    float beta = 0.0f;
    if (b || res) {
        beta = 1.0f;
        for (int64_t i = 0; i < rows; i++) {
            float *yr = y + i * out;
            const float *rr = res ? res + i * out : NULL;
            if (b && rr) {
                for (int64_t j = 0; j < out; j++) yr[j] = rr[j] + b[j];
            } else if (b) {
                memcpy(yr, b, (size_t)out * sizeof *yr);
            } else if (rr != yr) {
                memcpy(yr, rr, (size_t)out * sizeof *yr);
            }
        }
    }
    gp_cpu_sgemm(false, true, rows, out, in, 1.0f, x, in, w, in, beta, y, out);
    return GP_OK;
}

gp_status gp_cpu_linear_backward(gp_device *dev, int64_t rows, int64_t in, int64_t out,
                                 const float *x, const float *w, const float *dy, float *dx,
                                 float *dw, float *db) {
    if (dx) gp_cpu_sgemm(false, false, rows, in, out, 1.0f, dy, out, w, in, 0.0f, dx, in);
    gp_cpu_sgemm(true, false, out, in, rows, 1.0f, dy, out, x, in, 1.0f, dw, in);
    if (db) gp_cpu_sum_rows_add(dev, dy, rows, out, db);
    return GP_OK;
}

/* ------------------------------------------------------------ layer norm */

gp_status gp_cpu_layernorm_forward(gp_device *dev, int64_t rows, int64_t dim, const float *x,
                                   const float *w, const float *b, float *y, float *stats) {
    (void)dev;
    const int64_t body = dim - dim % GP_LANES;
    for (int64_t i = 0; i < rows; i++) {
        const float *xr = x + i * dim; // (dim)
        float *yr = y + i * dim;
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
        for (int64_t j = 0; j < dim; j++) yr[j] = (xr[j] - mean) * rstd * w[j] + b[j];
        stats[i] = mean;
        stats[rows + i] = rstd;
    }
    return GP_OK;
}

gp_status gp_cpu_layernorm_backward(gp_device *dev, int64_t rows, int64_t dim, const float *x,
                                    const float *w, const float *stats, const float *dy,
                                    const float *dres, float *dx, float *dw, float *db) {
    (void)dev;
    const int64_t body = dim - dim % GP_LANES;
    for (int64_t i = 0; i < rows; i++) {
        const float *xr = x + i * dim, *dyr = dy + i * dim; // (dim)
        const float mean = stats[i], rstd = stats[rows + i];
        /* dxhat = dy * w;  dx = rstd (dxhat - mean(dxhat) - xhat mean(dxhat xhat)) */
        float a1[GP_LANES] = {0}, a2[GP_LANES] = {0};
        for (int64_t j = 0; j < body; j += GP_LANES)
            for (int l = 0; l < GP_LANES; l++) {
                float xh = (xr[j + l] - mean) * rstd;
                float g = dyr[j + l] * w[j + l];
                a1[l] += g;
                a2[l] += g * xh;
                dw[j + l] += dyr[j + l] * xh;
                db[j + l] += dyr[j + l];
            }
        float s1 = gp_lanes_total(a1), s2 = gp_lanes_total(a2);
        for (int64_t j = body; j < dim; j++) {
            float xh = (xr[j] - mean) * rstd;
            float g = dyr[j] * w[j];
            s1 += g;
            s2 += g * xh;
            dw[j] += dyr[j] * xh;
            db[j] += dyr[j];
        }
        if (!dx) continue;
        const float m1 = s1 / (float)dim, m2 = s2 / (float)dim;
        float *dxr = dx + i * dim;
        if (dres) {
            const float *rr = dres + i * dim;
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

gp_status gp_cpu_gelu_forward(gp_device *dev, int64_t n, const float *x, float *y) {
    (void)dev;
    for (int64_t i = 0; i < n; i++) y[i] = gelu1(x[i]);
    return GP_OK;
}

gp_status gp_cpu_gelu_backward(gp_device *dev, int64_t rows, int64_t cols, const float *x,
                               const float *dy, float *dx, float *db) {
    (void)dev;
    for (int64_t i = 0; i < rows; i++) {
        const float *xr = x + i * cols, *dyr = dy + i * cols; // (cols)
        float *dxr = dx + i * cols;
        if (db)
            for (int64_t j = 0; j < cols; j++) {
                float d = dyr[j] * gelu_grad1(xr[j]);
                dxr[j] = d;
                db[j] += d;
            }
        else
            for (int64_t j = 0; j < cols; j++) dxr[j] = dyr[j] * gelu_grad1(xr[j]);
    }
    return GP_OK;
}

/* --------------------------------------------------------------- dropout */

gp_status gp_cpu_dropout(gp_device *dev, const gp_rng_stream *s, float p, int64_t n,
                         const float *x, const float *res, float *y) {
    (void)dev;
    /* The uniforms are made a chunk at a time on the stack: the mask is a
     * pure function of (stream, index), so nothing needs to be kept. */
    enum { CHUNK = 1024 };
    float u[CHUNK];
    const float scale = 1.0f / (1.0f - p);
    for (int64_t i0 = 0; i0 < n; i0 += CHUNK) {
        int64_t len = n - i0 < CHUNK ? n - i0 : CHUNK;
        gp_rng_uniform(s, (uint64_t)i0, u, len);
        const float *xc = x + i0;
        float *yc = y + i0;
        if (res) {
            const float *rc = res + i0;
            for (int64_t j = 0; j < len; j++) yc[j] = rc[j] + xc[j] * (u[j] >= p ? scale : 0.0f);
        } else {
            for (int64_t j = 0; j < len; j++) yc[j] = xc[j] * (u[j] >= p ? scale : 0.0f);
        }
    }
    return GP_OK;
}

/* ------------------------------------------------------------ embeddings */

/* Every id is checked before anything is read with it. */
static gp_status check_ids(int64_t n, int64_t row_len, int64_t vocab, const int32_t *ids) {
    for (int64_t i = 0; i < n; i++)
        if (ids[i] < 0 || ids[i] >= vocab)
            return gp_error(GP_INVALID_ARGUMENT,
                            "token id %d at position %lld (row %lld, column %lld) is out of "
                            "range: expected 0 <= id < vocab = %lld",
                            (int)ids[i], (long long)i, (long long)(i / row_len),
                            (long long)(i % row_len), (long long)vocab);
    return GP_OK;
}

gp_status gp_cpu_embedding_forward(gp_device *dev, int64_t n, int64_t row_len, int64_t dim,
                                   int64_t vocab, const int32_t *ids, const float *w, float *y) {
    (void)dev;
    GP_TRY(check_ids(n, row_len, vocab, ids));
    for (int64_t i = 0; i < n; i++)
        memcpy(y + i * dim, w + (int64_t)ids[i] * dim, (size_t)dim * sizeof *y);
    return GP_OK;
}

gp_status gp_cpu_embedding_backward(gp_device *dev, int64_t n, int64_t row_len, int64_t dim,
                                    int64_t vocab, const int32_t *ids, const float *dy,
                                    float *dw) {
    (void)dev;
    GP_TRY(check_ids(n, row_len, vocab, ids));
    /* Scatter-add in position order: a fixed order, so the sums are deterministic. */
    for (int64_t i = 0; i < n; i++) {
        float *row = dw + (int64_t)ids[i] * dim;
        const float *g = dy + i * dim;
        for (int64_t j = 0; j < dim; j++) row[j] += g[j];
    }
    return GP_OK;
}

gp_status gp_cpu_pos_embedding_forward(gp_device *dev, int64_t batch, int64_t seq, int64_t dim,
                                       const float *x, const float *w, float *y) {
    (void)dev;
    for (int64_t b = 0; b < batch; b++)
        for (int64_t t = 0; t < seq; t++) {
            const float *xr = x + (b * seq + t) * dim, *wr = w + t * dim;
            float *yr = y + (b * seq + t) * dim;
            for (int64_t j = 0; j < dim; j++) yr[j] = xr[j] + wr[j];
        }
    return GP_OK;
}

gp_status gp_cpu_pos_embedding_backward(gp_device *dev, int64_t batch, int64_t seq, int64_t dim,
                                        const float *dy, float *dw) {
    (void)dev;
    /* Rows of dw receive the batch in order b = 0, 1, ...: deterministic. */
    for (int64_t b = 0; b < batch; b++)
        for (int64_t t = 0; t < seq; t++) {
            const float *g = dy + (b * seq + t) * dim;
            float *wr = dw + t * dim;
            for (int64_t j = 0; j < dim; j++) wr[j] += g[j];
        }
    return GP_OK;
}
