/* CPU kernels for causal multi-head attention: per (batch, head) GEMMs straight on the strided
 * q/k/v columns of qkv (no head transposes), a row softmax, and the backward products arranged
 * so that every operand is read in place. The (batch, head) pairs are split over the device's
 * threads; each pair is computed whole by one thread, so the bits do not depend on the split.
 * A bf16 device (gpipe.h, gp_precision) rounds every product's operands to bf16 first. */
#include <string.h>

#include "core/bf16.h"
#include "core/device.h"
#include "core/error.h"

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
    /* bf16 (gp_precision): the products' operands rounded to bf16, q, k, v and datt rounded
     * whole beforehand (qkv and datt point at the copies), P and dS block by block into the
     * part's own scratch (pscr, pscr_len floats per part); NULL pscr: fp32 */
    float *pscr;
    int64_t pscr_len;
} attn_args;

/* rows x n of src (rows ld apart) rounded to bf16 into dst (the same strides; may be src). */
static void round_rows(const float *src, float *dst, int64_t ld, int64_t rows, int64_t n) {
    for (int64_t t = 0; t < rows; t++)
        for (int64_t j = 0; j < n; j++) dst[t * ld + j] = gp_bf16_round(src[t * ld + j]);
}

/* Pairs [lo, hi) of (b, h), pair index b * H + h; pr: the part's bf16 scratch (ATTN_BLOCK rows
 * of T) or NULL. */
static void attn_forward_pairs(const attn_args *a, int64_t lo, int64_t hi, float *pr) {
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
            /* P is kept in fp32 for the backward; in bf16 the product takes its rounding */
            const float *Pop = P + r0 * T;
            if (pr) {
                round_rows(P + r0 * T, pr, T, r1 - r0, r1);
                Pop = pr;
            }
            gp_cpu_sgemm(false, false, r1 - r0, hd, r1, 1.0f, Pop, T, v, ld, 0.0f, o + r0 * C, C);
        }
    }
}

static void attn_forward_part(void *ctx, int t, int nt) {
    const attn_args *a = ctx;
    int64_t lo, hi;
    gp_cpu_split(a->d->batch * a->d->heads, t, nt, 1, &lo, &hi);
    attn_forward_pairs(a, lo, hi, a->pscr ? a->pscr + (int64_t)t * a->pscr_len : NULL);
}

/* In bf16, the copies of the ops' inputs the products read (attn_args) and the parts' scratch:
 * one workspace block, *ws (NULL in fp32). in[i] (n[i] floats) rounded into it, a->* pointed at
 * the copies by the caller. */
static gp_status bf16_inputs(gp_device *dev, int parts, int64_t scratch, const float *const *in,
                             const int64_t *n, int nin, float **copies, float **ws,
                             attn_args *a) {
    *ws = NULL;
    if (gp_device_precision(dev) != GP_PRECISION_BF16) return GP_OK;
    int64_t total = (int64_t)parts * scratch;
    for (int i = 0; i < nin; i++) total += n[i];
    gp_status s;
    *ws = gp_device_alloc(dev, GP_MEM_WORKSPACE, (size_t)total * sizeof(float), &s);
    if (!*ws) return gp_error_context(s, "attention in bf16: the rounded operands");
    float *p = *ws;
    for (int i = 0; i < nin; i++) {
        gp_cpu_bf16_round_n(gp_cpu_pool_of(dev), in[i], p, n[i]);
        copies[i] = p;
        p += n[i];
    }
    a->pscr = p;
    a->pscr_len = scratch;
    return GP_OK;
}

static int parts_of(gp_cpu_pool *pool, int64_t pairs) {
    const int threads = gp_cpu_pool_threads(pool);
    return pairs < threads ? (int)pairs : threads;
}

/* att16: the output made in fp32 in workspace, then rounded into it. */
gp_status gp_cpu_attention_forward(gp_device *dev, const gp_attn_dims *d, const float *qkv,
                                   float *probs, float *att, uint16_t *att16) {
    gp_cpu_pool *pool = gp_cpu_pool_of(dev);
    const int64_t pairs = d->batch * d->heads, T = d->seq, natt = d->batch * T * d->dim;
    if (pairs <= 0 || T <= 0) return GP_OK;
    const int parts = parts_of(pool, pairs);
    attn_args a = {.d = d, .qkv = qkv, .probs = probs, .att = att};
    float *copy[1], *ws, *att32 = NULL;
    const int64_t n[1] = {natt * 3};
    GP_TRY(bf16_inputs(dev, parts, (T < ATTN_BLOCK ? T : ATTN_BLOCK) * T, &qkv, n, 1, copy,
                       &ws, &a));
    if (ws) a.qkv = copy[0];
    gp_status s = GP_OK;
    if (att16) {
        att32 = gp_device_alloc(dev, GP_MEM_WORKSPACE, (size_t)natt * sizeof(float), &s);
        a.att = att32;
    }
    if (s == GP_OK) gp_cpu_pool_run(pool, parts, attn_forward_part, &a);
    if (s == GP_OK && att16) gp_cpu_bf16_store_n(pool, att32, att16, natt);
    gp_device_release(dev, att32);
    gp_device_release(dev, ws);
    return s == GP_OK ? GP_OK : gp_error_context(s, "attention forward: its output before bf16");
}

int64_t gp_cpu_attention_saved(gp_device *dev, const gp_attn_dims *d) {
    (void)dev;
    return d->batch * d->heads * d->seq * d->seq;
}

int64_t gp_cpu_attention_backward_ws(gp_device *dev, const gp_attn_dims *d) {
    return gp_cpu_pool_threads(gp_cpu_pool_of(dev)) * d->seq * d->seq;
}

/* Pairs [lo, hi) with dS, a (T, T) workspace of the part's own; pr: the part's bf16 scratch
 * for P (T, T), or NULL. */
static void attn_backward_pairs(const attn_args *a, int64_t lo, int64_t hi, float *dS,
                                float *pr) {
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
                const float *pr_row = P + t * T;
                float *sr = dS + t * T;
                const int64_t n = t + 1;
                const float dot = gp_row_dot(pr_row, sr, n);
                for (int64_t j = 0; j < n; j++) sr[j] = pr_row[j] * (sr[j] - dot) * scale;
                if (r1 > n) memset(sr + n, 0, (size_t)(r1 - n) * sizeof *sr);
            }
            /* dS is only an operand from here on: in bf16, rounded in place */
            if (pr) round_rows(dS + r0 * T, dS + r0 * T, T, r1 - r0, r1);
            /* dq[r0:r1] = dS[r0:r1, 0:r1] k[0:r1] */
            gp_cpu_sgemm(false, false, r1 - r0, hd, r1, 1.0f, dS + r0 * T, T, k, ld, 0.0f,
                         dq + r0 * ld, ld);
        }
        /* P as dv's operand: in bf16 its rounding, whole rows (the blocks below read some of
         * the zeros above the diagonal) */
        const float *Pop = P;
        if (pr) {
            round_rows(P, pr, T, T, T);
            Pop = pr;
        }
        /* Key rows j in [c0, c1) receive from query rows t >= c0 only:
         * dk = dS^T q and dv = P^T dout on the lower part of each column block. */
        for (int64_t c0 = 0; c0 < T; c0 += ATTN_BLOCK) {
            const int64_t c1 = c0 + ATTN_BLOCK < T ? c0 + ATTN_BLOCK : T;
            gp_cpu_sgemm(true, false, c1 - c0, hd, T - c0, 1.0f, dS + c0 * T + c0, T,
                         q + c0 * ld, ld, 0.0f, dk + c0 * ld, ld);
            gp_cpu_sgemm(true, false, c1 - c0, hd, T - c0, 1.0f, Pop + c0 * T + c0, T,
                         dout + c0 * C, C, 0.0f, dv + c0 * ld, ld);
        }
    }
}

static void attn_backward_part(void *ctx, int t, int nt) {
    const attn_args *a = ctx;
    int64_t lo, hi;
    gp_cpu_split(a->d->batch * a->d->heads, t, nt, 1, &lo, &hi);
    attn_backward_pairs(a, lo, hi, a->ws + (int64_t)t * a->d->seq * a->d->seq,
                        a->pscr ? a->pscr + (int64_t)t * a->pscr_len : NULL);
}

gp_status gp_cpu_attention_backward(gp_device *dev, const gp_attn_dims *d, const float *qkv,
                                    const float *probs, const float *att, const uint16_t *att16,
                                    const float *datt, float *dqkv, float *dbias, float *ws) {
    (void)att, (void)att16; /* the probabilities are saved whole */
    gp_cpu_pool *pool = gp_cpu_pool_of(dev);
    const int64_t pairs = d->batch * d->heads, T = d->seq;
    attn_args a = {.d = d, .qkv = qkv, .probs_in = probs, .datt = datt, .dqkv = dqkv, .ws = ws};
    float *bws = NULL;
    if (pairs > 0 && T > 0) {
        const int parts = parts_of(pool, pairs);
        const float *in[2] = {qkv, datt};
        const int64_t n[2] = {d->batch * T * 3 * d->dim, d->batch * T * d->dim};
        float *copy[2];
        GP_TRY(bf16_inputs(dev, parts, T * T, in, n, 2, copy, &bws, &a));
        if (bws) a.qkv = copy[0], a.datt = copy[1];
        gp_cpu_pool_run(pool, parts, attn_backward_part, &a);
        gp_device_release(dev, bws);
    }
    /* The bias gradient: the rows of dqkv in order (the serial sum's order), by columns. */
    if (dbias) GP_TRY(gp_cpu_sum_rows_add(dev, dqkv, d->batch * d->seq, 3 * d->dim, dbias));
    return GP_OK;
}
