/* CPU kernels for causal multi-head attention: per (batch, head) GEMMs straight on the strided
 * q/k/v columns of qkv (no head transposes), a row softmax, and the backward products arranged
 * so that every operand is read in place. */
#include <string.h>

#include "kernels/cpu/cpu_kernels.h"
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

gp_status gp_cpu_attention_forward(gp_device *dev, const gp_attn_dims *d, const float *qkv,
                                   float *probs, float *att) {
    (void)dev;
    const int64_t B = d->batch, T = d->seq, C = d->dim, H = d->heads, hd = C / H;
    const int64_t ld = 3 * C;
    const float scale = 1.0f / sqrtf((float)hd);
    for (int64_t b = 0; b < B; b++)
        for (int64_t h = 0; h < H; h++) {
            const float *q = qkv + b * T * ld + h * hd; // (T, hd), row stride 3C
            const float *k = q + C, *v = q + 2 * C;
            float *P = probs + (b * H + h) * T * T; // (T, T)
            float *o = att + b * T * C + h * hd;    // (T, hd), row stride C
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
    return GP_OK;
}

int64_t gp_cpu_attention_backward_ws(const gp_attn_dims *d) { return d->seq * d->seq; }

gp_status gp_cpu_attention_backward(gp_device *dev, const gp_attn_dims *d, const float *qkv,
                                    const float *probs, const float *datt, float *dqkv,
                                    float *dbias, float *ws) {
    (void)dev;
    const int64_t B = d->batch, T = d->seq, C = d->dim, H = d->heads, hd = C / H;
    const int64_t ld = 3 * C;
    const float scale = 1.0f / sqrtf((float)hd);
    float *dS = ws; // (T, T)
    for (int64_t b = 0; b < B; b++)
        for (int64_t h = 0; h < H; h++) {
            const float *q = qkv + b * T * ld + h * hd; // (T, hd), row stride 3C
            const float *k = q + C, *v = q + 2 * C;
            const float *P = probs + (b * H + h) * T * T; // (T, T), zero above the diagonal
            const float *dout = datt + b * T * C + h * hd;  // (T, hd), row stride C
            float *dq = dqkv + b * T * ld + h * hd;         // (T, hd), row stride 3C
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
                gp_cpu_sgemm(true, false, c1 - c0, hd, T - c0, 1.0f, dS + c0 * T + c0, T, q + c0 * ld,
                        ld, 0.0f, dk + c0 * ld, ld);
                gp_cpu_sgemm(true, false, c1 - c0, hd, T - c0, 1.0f, P + c0 * T + c0, T,
                        dout + c0 * C, C, 0.0f, dv + c0 * ld, ld);
            }
            if (dbias) {
                /* Rows of this (b, h) in order: with b outer this is row order. */
                for (int64_t t = 0; t < T; t++) {
                    const float *r = dq + t * ld;
                    for (int64_t j = 0; j < hd; j++) {
                        dbias[h * hd + j] += r[j];
                        dbias[C + h * hd + j] += r[C + j];
                        dbias[2 * C + h * hd + j] += r[2 * C + j];
                    }
                }
            }
        }
    return GP_OK;
}
