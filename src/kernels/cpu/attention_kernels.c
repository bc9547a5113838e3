/* CPU kernels for causal multi-head attention: per (batch, head) GEMMs straight on the strided
 * q/k/v columns of qkv (no head transposes), a row softmax, and the backward products arranged
 * so that every operand is read in place. The (batch, head) pairs are split over the device's
 * threads; each pair is computed whole by one thread, so the bits do not depend on the split. */
#include <string.h>

#include "kernels/cpu/cpu_ops.h"
#include "kernels/cpu/gemm.h"
#include "kernels/cpu/pool.h"
#include "kernels/cpu/transformer_math.h"

/* Rows are processed in blocks of ATTN_BLOCK: a block of query rows only needs keys up to its
 * last row, which skips most of the masked triangle while keeping each GEMM large enough to run
 * near peak. The layers' cost model (layers/transformer_ops.c) counts the same blocks. */
#define ATTN_BLOCK 64

/* Softmax of s[0..n) in place; s[n..width) set to zero (the masked part). */
static void softmax_row(float *s, int64_t n, int64_t width) {
    const float m = gp_row_max(s, n);
    for (int64_t j = 0; j < n; j++) s[j] = gp_exp(s[j] - m);
    const float inv = 1.0f / gp_row_sum(s, n);
    for (int64_t j = 0; j < n; j++) s[j] *= inv;
    if (width > n) memset(s + n, 0, (size_t)(width - n) * sizeof *s);
}

typedef struct attn_args {
    const gp_attn_dims *d;
    const float *qkv, *probs_in, *datt;
    float *probs, *att, *dqkv, *ws;
} attn_args;

/* Pairs [lo, hi) of (b, h), pair index b * H + h. */
static void attn_forward_range(void *ctx, int64_t lo, int64_t hi) {
    const attn_args *a = ctx;
    const gp_attn_dims *d = a->d;
    const int64_t T = d->seq, C = d->dim, H = d->heads, hd = C / H;
    const int64_t ld = 3 * C;
    const float scale = 1.0f / sqrtf((float)hd);
    for (int64_t bh = lo; bh < hi; bh++) {
        const int64_t b = bh / H, h = bh % H;
        const float *q = a->qkv + b * T * ld + h * hd; // (T, hd), row stride 3C
        const float *k = q + C, *v = q + 2 * C;
        float *P = a->probs + bh * T * T;   // (T, T)
        float *o = a->att + b * T * C + h * hd; // (T, hd), row stride C
        for (int64_t r0 = 0; r0 < T; r0 += ATTN_BLOCK) {
            const int64_t r1 = r0 + ATTN_BLOCK < T ? r0 + ATTN_BLOCK : T;
            /* S[r0:r1, 0:r1] = q k^T * scale; columns >= r1 are all masked. */
            gp_cpu_sgemm(false, true, r1 - r0, r1, hd, scale, q + r0 * ld, ld, k, ld, 0.0f,
                         P + r0 * T, T);
            for (int64_t t = r0; t < r1; t++) softmax_row(P + t * T, t + 1, T);
            gp_cpu_sgemm(false, false, r1 - r0, hd, r1, 1.0f, P + r0 * T, T, v, ld, 0.0f,
                         o + r0 * C, C);
        }
    }
}

gp_status gp_cpu_attention_forward(gp_device *dev, const gp_attn_dims *d, const float *qkv,
                                   float *probs, float *att) {
    attn_args a = {.d = d, .qkv = qkv, .probs = probs, .att = att};
    gp_cpu_parallel_for(gp_cpu_pool_of(dev), d->batch * d->heads, 1, 1, attn_forward_range, &a);
    return GP_OK;
}

int64_t gp_cpu_attention_backward_ws(gp_device *dev, const gp_attn_dims *d) {
    return gp_cpu_pool_threads(gp_cpu_pool_of(dev)) * d->seq * d->seq;
}

/* Pairs [lo, hi) with dS, a (T, T) workspace of the part's own. */
static void attn_backward_pairs(const attn_args *a, int64_t lo, int64_t hi, float *dS) {
    const gp_attn_dims *d = a->d;
    const int64_t T = d->seq, C = d->dim, H = d->heads, hd = C / H;
    const int64_t ld = 3 * C;
    const float scale = 1.0f / sqrtf((float)hd);
    for (int64_t bh = lo; bh < hi; bh++) {
        const int64_t b = bh / H, h = bh % H;
        const float *q = a->qkv + b * T * ld + h * hd; // (T, hd), row stride 3C
        const float *k = q + C, *v = q + 2 * C;
        const float *P = a->probs_in + bh * T * T;       // (T, T), zero above the diagonal
        const float *dout = a->datt + b * T * C + h * hd; // (T, hd), row stride C
        float *dq = a->dqkv + b * T * ld + h * hd;        // (T, hd), row stride 3C
        float *dk = dq + C, *dv = dq + 2 * C;
        for (int64_t r0 = 0; r0 < T; r0 += ATTN_BLOCK) {
            const int64_t r1 = r0 + ATTN_BLOCK < T ? r0 + ATTN_BLOCK : T;
            /* dP = dout v^T, then dS = P (dP - rowsum(P dP)) * scale. */
            gp_cpu_sgemm(false, true, r1 - r0, r1, hd, 1.0f, dout + r0 * C, C, v, ld, 0.0f,
                         dS + r0 * T, T);
            for (int64_t t = r0; t < r1; t++) {
                const float *pr = P + t * T;
                float *sr = dS + t * T;
                const int64_t n = t + 1;
                const float dot = gp_row_dot(pr, sr, n);
                for (int64_t j = 0; j < n; j++) sr[j] = pr[j] * (sr[j] - dot) * scale;
                if (r1 > n) memset(sr + n, 0, (size_t)(r1 - n) * sizeof *sr);
            }
            /* dq[r0:r1] = dS[r0:r1, 0:r1] k[0:r1] */
            gp_cpu_sgemm(false, false, r1 - r0, hd, r1, 1.0f, dS + r0 * T, T, k, ld, 0.0f,
                         dq + r0 * ld, ld);
        }
        /* Key rows j in [c0, c1) receive from query rows t >= c0 only:
         * dk = dS^T q and dv = P^T dout on the lower part of each column block. */
        for (int64_t c0 = 0; c0 < T; c0 += ATTN_BLOCK) {
            const int64_t c1 = c0 + ATTN_BLOCK < T ? c0 + ATTN_BLOCK : T;
            gp_cpu_sgemm(true, false, c1 - c0, hd, T - c0, 1.0f, dS + c0 * T + c0, T,
                         q + c0 * ld, ld, 0.0f, dk + c0 * ld, ld);
            gp_cpu_sgemm(true, false, c1 - c0, hd, T - c0, 1.0f, P + c0 * T + c0, T,
                         dout + c0 * C, C, 0.0f, dv + c0 * ld, ld);
        }
    }
}

static void attn_backward_part(void *ctx, int t, int nt) {
    const attn_args *a = ctx;
    int64_t lo, hi;
    gp_cpu_split(a->d->batch * a->d->heads, t, nt, 1, &lo, &hi);
    attn_backward_pairs(a, lo, hi, a->ws + (int64_t)t * a->d->seq * a->d->seq);
}

gp_status gp_cpu_attention_backward(gp_device *dev, const gp_attn_dims *d, const float *qkv,
                                    const float *probs, const float *datt, float *dqkv,
                                    float *dbias, float *ws) {
    gp_cpu_pool *pool = gp_cpu_pool_of(dev);
    const int64_t pairs = d->batch * d->heads;
    const int threads = gp_cpu_pool_threads(pool);
    attn_args a = {.d = d, .qkv = qkv, .probs_in = probs, .datt = datt, .dqkv = dqkv, .ws = ws};
    gp_cpu_pool_run(pool, pairs < threads ? (int)pairs : threads, attn_backward_part, &a);
    /* The bias gradient: the rows of dqkv in order (the serial sum's order), by columns. */
    if (dbias) GP_TRY(gp_cpu_sum_rows_add(dev, dqkv, d->batch * d->seq, 3 * d->dim, dbias));
    return GP_OK;
}
