/* Inline, vectorizable math for the Transformer kernels: exp, tanh, a
 * branch-free select and fixed-order lane reductions. Written so that gcc and
 * clang vectorize the loops that call them without -ffast-math. */
#ifndef GP_KERNELS_CPU_TRANSFORMER_MATH_H
#define GP_KERNELS_CPU_TRANSFORMER_MATH_H

#include <math.h>
#include <stdbool.h>
#include <stdint.h>

/* A fused multiply-add, rounded once in every variant of the kernels (isa.h), so that all of
 * them give the same bits: one instruction where the variant has FMA, a library call (and
 * loops that stay scalar) in the baseline variant. */
#define GP_FMA(a, b, c) fmaf((a), (b), (c))

/* Independent partial sums per reduction; combined in a fixed order, so the
 * result never depends on timing, and the compiler may vectorize them. */
#define GP_LANES 16

/* Bit casts through a union: defined in C11 and vectorized by both compilers. */
typedef union {
    float f;
    uint32_t u;
} gp_f32_bits;

/* c ? a : b as a bit blend. With a plain ?: gcc sinks the unused arm's
 * computation into a branch and then (-ftrapping-math) will not if-convert
 * it, which stops the whole loop from vectorizing. */
static inline float gp_select(bool c, float a, float b) {
    gp_f32_bits A = {.f = a}, B = {.f = b};
    const uint32_t m = 0u - (uint32_t)c;
    gp_f32_bits r = {.u = (A.u & m) | (B.u & ~m)};
    return r.f;
}

/* exp(x) for x in [-87, 88] (not checked): 2^k exp(r), r = x - k ln2 in
 * [-ln2/2, ln2/2], degree-7 Taylor polynomial (truncation < 6e-9). k comes
 * from the rounding trick's bits: no float-to-int conversion that could
 * overflow on NaN. NaN in, NaN out. */
static inline float gp_exp_core(float x) {
    const float shifter = 12582912.0f; /* 1.5 * 2^23: adding it rounds to integer */
    gp_f32_bits kb = {.f = GP_FMA(x, 1.44269504f, shifter)};
    const float kf = kb.f - shifter;
    float r = GP_FMA(kf, -0.693359375f, x); /* ln2 split: the high part has 9 bits */
    r = GP_FMA(kf, 2.12194440e-4f, r);
    float p = 1.0f / 5040.0f;
    p = GP_FMA(p, r, 1.0f / 720.0f);
    p = GP_FMA(p, r, 1.0f / 120.0f);
    p = GP_FMA(p, r, 1.0f / 24.0f);
    p = GP_FMA(p, r, 1.0f / 6.0f);
    p = GP_FMA(p, r, 0.5f);
    p = GP_FMA(p, r, 1.0f);
    p = GP_FMA(p, r, 1.0f);
    gp_f32_bits sb = {.u = (kb.u - 0x4B400000u + 127u) << 23};
    return p * sb.f;
}

/* exp(x) for any x: 0 below -87, capped at exp(88) above. */
static inline float gp_exp(float x) {
    float xc = gp_select(x < -87.0f, -87.0f, x);
    xc = gp_select(xc > 88.0f, 88.0f, xc);
    return gp_select(x < -87.0f, 0.0f, gp_exp_core(xc));
}

/* tanh: |x| < 0.55: odd Taylor series to x^15 (truncation < 2e-8 relative);
 * otherwise 1 - 2 / (exp(2|x|) + 1), which has no cancellation there.
 * |x| is capped at 10, where tanh rounds to 1 in float. */
static inline float gp_tanh(float x) {
    const float ax = fabsf(x), x2 = x * x;
    float q = -929569.0f / 638512875.0f;
    q = GP_FMA(q, x2, 21844.0f / 6081075.0f);
    q = GP_FMA(q, x2, -1382.0f / 155925.0f);
    q = GP_FMA(q, x2, 62.0f / 2835.0f);
    q = GP_FMA(q, x2, -17.0f / 315.0f);
    q = GP_FMA(q, x2, 2.0f / 15.0f);
    q = GP_FMA(q, x2, -1.0f / 3.0f);
    const float small = GP_FMA(x * x2, q, x);
    const float a = gp_select(ax > 10.0f, 10.0f, ax);
    const float big = copysignf(1.0f - 2.0f / (gp_exp_core(2.0f * a) + 1.0f), x);
    return gp_select(ax < 0.55f, small, big);
}

static inline float gp_lanes_total(const float acc[GP_LANES]) {
    float s = 0.0f;
    for (int l = 0; l < GP_LANES; l++) s += acc[l];
    return s;
}

static inline float gp_row_sum(const float *x, int64_t n) {
    const int64_t body = n - n % GP_LANES;
    float acc[GP_LANES] = {0};
    for (int64_t j = 0; j < body; j += GP_LANES)
        for (int l = 0; l < GP_LANES; l++) acc[l] += x[j + l];
    float s = gp_lanes_total(acc);
    for (int64_t j = body; j < n; j++) s += x[j];
    return s;
}

static inline float gp_row_dot(const float *x, const float *y, int64_t n) {
    const int64_t body = n - n % GP_LANES;
    float acc[GP_LANES] = {0};
    for (int64_t j = 0; j < body; j += GP_LANES)
        for (int l = 0; l < GP_LANES; l++) acc[l] = GP_FMA(x[j + l], y[j + l], acc[l]);
    float s = gp_lanes_total(acc);
    for (int64_t j = body; j < n; j++) s = GP_FMA(x[j], y[j], s);
    return s;
}

/* Largest element (n >= 1; a NaN may or may not win, as with any max). */
static inline float gp_row_max(const float *x, int64_t n) {
    const int64_t body = n - n % GP_LANES;
    float m = x[0];
    if (body) {
        float acc[GP_LANES];
        for (int l = 0; l < GP_LANES; l++) acc[l] = x[l];
        for (int64_t j = GP_LANES; j < body; j += GP_LANES)
            for (int l = 0; l < GP_LANES; l++) acc[l] = x[j + l] > acc[l] ? x[j + l] : acc[l];
        for (int l = 0; l < GP_LANES; l++) m = acc[l] > m ? acc[l] : m;
    }
    for (int64_t j = body; j < n; j++) m = x[j] > m ? x[j] : m;
    return m;
}

#endif
