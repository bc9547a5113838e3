/* CPU kernels of the ConvNet layers: im2col / col2im (convolution as GEMM)
 * and the fixed-order reductions batch norm uses for its statistics. */
#include "../conv_kernels.h"

#include <string.h>

/* The output columns ow whose input column ow*s - pad + kj lies inside
 * [0, W): [*lo, *hi). Empty when *lo == *hi. */
static void valid_cols(const gp_conv_geom *g, int64_t kj, int64_t *lo, int64_t *hi) {
    int64_t s = g->stride, t = g->pad - kj, u = g->width - 1 + g->pad - kj;
    int64_t a = t <= 0 ? 0 : (t + s - 1) / s;
    int64_t b = u < 0 ? 0 : u / s + 1;
    if (b > g->out_w) b = g->out_w;
    if (a > b) a = b;
    *lo = a;
    *hi = b;
}

void gp_im2col(const gp_conv_geom *g, const float *x, int64_t oh0, int64_t oh1, float *col) {
    const int64_t k = g->kernel, s = g->stride, ow_n = g->out_w, H = g->height, W = g->width;
    float *dst = col;
    for (int64_t c = 0; c < g->channels; c++) {
        const float *xc = x + c * H * W;
        for (int64_t ki = 0; ki < k; ki++) {
            for (int64_t kj = 0; kj < k; kj++) {
                int64_t lo, hi;
                valid_cols(g, kj, &lo, &hi);
                for (int64_t oh = oh0; oh < oh1; oh++, dst += ow_n) {
                    int64_t ih = oh * s - g->pad + ki;
                    if (ih < 0 || ih >= H) {
                        memset(dst, 0, (size_t)ow_n * sizeof *dst);
                        continue;
                    }
                    /* index of the tap of column ow: base + ow*s (in range for lo <= ow < hi) */
                    int64_t base = ih * W - g->pad + kj;
                    for (int64_t ow = 0; ow < lo; ow++) dst[ow] = 0.0f;
                    if (s == 1) {
                        if (hi > lo)
                            memcpy(dst + lo, xc + base + lo, (size_t)(hi - lo) * sizeof *dst);
                    } else {
                        for (int64_t ow = lo; ow < hi; ow++) dst[ow] = xc[base + ow * s];
                    }
                    for (int64_t ow = hi; ow < ow_n; ow++) dst[ow] = 0.0f;
                }
            }
        }
    }
}

void gp_col2im_add(const gp_conv_geom *g, const float *col, int64_t oh0, int64_t oh1, float *x) {
    const int64_t k = g->kernel, s = g->stride, ow_n = g->out_w, H = g->height, W = g->width;
    const float *src = col;
    for (int64_t c = 0; c < g->channels; c++) {
        float *xc = x + c * H * W;
        for (int64_t ki = 0; ki < k; ki++) {
            for (int64_t kj = 0; kj < k; kj++) {
                int64_t lo, hi;
                valid_cols(g, kj, &lo, &hi);
                for (int64_t oh = oh0; oh < oh1; oh++, src += ow_n) {
                    int64_t ih = oh * s - g->pad + ki;
                    if (ih < 0 || ih >= H) continue;
                    int64_t base = ih * W - g->pad + kj;
                    if (s == 1 && hi > lo) {
                        float *row = xc + base + lo;
                        const float *sr = src + lo;
                        for (int64_t j = 0; j < hi - lo; j++) row[j] += sr[j];
                    } else {
                        for (int64_t ow = lo; ow < hi; ow++) xc[base + ow * s] += src[ow];
                    }
                }
            }
        }
    }
}

/* Eight independent double lanes combined in a fixed tree: vectorizes
 * without -ffast-math, and the order is set by this code, not the compiler. */
#define GP_LANES 8

static double combine(const double acc[GP_LANES]) {
    return ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]));
}

double gp_sum_f64(const float *x, int64_t n) {
    double acc[GP_LANES] = {0};
    int64_t i = 0;
    for (; i + GP_LANES <= n; i += GP_LANES)
        for (int j = 0; j < GP_LANES; j++) acc[j] += (double)x[i + j];
    for (; i < n; i++) acc[i % GP_LANES] += (double)x[i];
    return combine(acc);
}

double gp_sumsq_dev_f64(const float *x, int64_t n, double mean) {
    double acc[GP_LANES] = {0};
    int64_t i = 0;
    for (; i + GP_LANES <= n; i += GP_LANES)
        for (int j = 0; j < GP_LANES; j++) {
            double d = (double)x[i + j] - mean;
            acc[j] += d * d;
        }
    for (; i < n; i++) {
        double d = (double)x[i] - mean;
        acc[i % GP_LANES] += d * d;
    }
    return combine(acc);
}

double gp_dot_dev_f64(const float *a, const float *b, int64_t n, double mean_b) {
    double acc[GP_LANES] = {0};
    int64_t i = 0;
    for (; i + GP_LANES <= n; i += GP_LANES)
        for (int j = 0; j < GP_LANES; j++) acc[j] += (double)a[i + j] * ((double)b[i + j] - mean_b);
    for (; i < n; i++) acc[i % GP_LANES] += (double)a[i] * ((double)b[i] - mean_b);
    return combine(acc);
}
