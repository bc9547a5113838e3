/* CPU kernels of the ConvNet layers: im2col / col2im (convolution as GEMM), channel biases,
 * batch norm with its statistics summed in double in a fixed lane order (the same bits on any
 * compiler), max and global average pooling. */
#include <math.h>
#include <string.h>

#include "kernels/cpu/cpu_kernels.h"

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

gp_status gp_cpu_im2col(gp_device *dev, const gp_conv_geom *g, const float *x, int64_t oh0,
                        int64_t oh1, float *col) {
    (void)dev;
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
    return GP_OK;
}

gp_status gp_cpu_col2im_add(gp_device *dev, const gp_conv_geom *g, const float *col,
                            int64_t oh0, int64_t oh1, float *x) {
    (void)dev;
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
    return GP_OK;
}

/* Eight independent double lanes combined in a fixed tree: vectorizes
 * without -ffast-math, and the order is set by this code, not the compiler. */
#define F64_LANES 8

static double combine(const double acc[F64_LANES]) {
    return ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]));
}

static double sum_f64(const float *x, int64_t n) {
    double acc[F64_LANES] = {0};
    int64_t i = 0;
    for (; i + F64_LANES <= n; i += F64_LANES)
        for (int j = 0; j < F64_LANES; j++) acc[j] += (double)x[i + j];
    for (; i < n; i++) acc[i % F64_LANES] += (double)x[i];
    return combine(acc);
}

static double sumsq_dev_f64(const float *x, int64_t n, double mean) {
    double acc[F64_LANES] = {0};
    int64_t i = 0;
    for (; i + F64_LANES <= n; i += F64_LANES)
        for (int j = 0; j < F64_LANES; j++) {
            double d = (double)x[i + j] - mean;
            acc[j] += d * d;
        }
    for (; i < n; i++) {
        double d = (double)x[i] - mean;
        acc[i % F64_LANES] += d * d;
    }
    return combine(acc);
}

static double dot_dev_f64(const float *a, const float *b, int64_t n, double mean_b) {
    double acc[F64_LANES] = {0};
    int64_t i = 0;
    for (; i + F64_LANES <= n; i += F64_LANES)
        for (int j = 0; j < F64_LANES; j++) acc[j] += (double)a[i + j] * ((double)b[i + j] - mean_b);
    for (; i < n; i++) acc[i % F64_LANES] += (double)a[i] * ((double)b[i] - mean_b);
    return combine(acc);
}

/* ------------------------------------------------------------ channel bias */

gp_status gp_cpu_channel_bias_add(gp_device *dev, int64_t batch, int64_t channels, int64_t npix,
                                  const float *bias, float *y) {
    (void)dev;
    for (int64_t b = 0; b < batch; b++)
        for (int64_t o = 0; o < channels; o++) {
            const float bv = bias[o];
            float *row = y + (b * channels + o) * npix;
            for (int64_t p = 0; p < npix; p++) row[p] += bv;
        }
    return GP_OK;
}

gp_status gp_cpu_channel_bias_grad(gp_device *dev, int64_t batch, int64_t channels,
                                   int64_t npix, const float *dy, float *db) {
    (void)dev;
    for (int64_t o = 0; o < channels; o++) {
        double acc = 0; /* examples in order: the same sum whichever order channels go in */
        for (int64_t b = 0; b < batch; b++) acc += sum_f64(dy + (b * channels + o) * npix, npix);
        db[o] += (float)acc;
    }
    return GP_OK;
}

/* -------------------------------------------------------------- batch norm */

gp_status gp_cpu_batchnorm_forward(gp_device *dev, const gp_bn_dims *d, const float *x,
                                   const float *gamma, const float *beta, float *running_mean,
                                   float *running_var, bool batch_stats, bool update_running,
                                   float *stats, float *y) {
    (void)dev;
    const int64_t batch = d->batch, nch = d->channels, hw = d->hw, count = batch * hw;
    float *mean_out = stats, *invstd_out = stats + nch; /* (C), (C) */
    for (int64_t c = 0; c < nch; c++) {
        double mean, invstd;
        if (batch_stats) {
            double sum = 0, ss = 0;
            for (int64_t b = 0; b < batch; b++) sum += sum_f64(x + (b * nch + c) * hw, hw);
            mean = sum / (double)count;
            for (int64_t b = 0; b < batch; b++)
                ss += sumsq_dev_f64(x + (b * nch + c) * hw, hw, mean);
            double var = ss / (double)count; /* biased: normalizes */
            invstd = 1.0 / sqrt(var + d->eps);
            if (update_running) {
                double unbiased = ss / (double)(count - 1);
                running_mean[c] =
                    (float)((1.0 - d->momentum) * running_mean[c] + d->momentum * mean);
                running_var[c] =
                    (float)((1.0 - d->momentum) * running_var[c] + d->momentum * unbiased);
            }
        } else {
            mean = running_mean[c];
            invstd = 1.0 / sqrt((double)running_var[c] + d->eps);
        }
        const float m = (float)mean, is = (float)invstd;
        const float scale = gamma[c] * is, shift = beta[c];
        mean_out[c] = m;
        invstd_out[c] = is;
        for (int64_t b = 0; b < batch; b++) {
            const float *xp = x + (b * nch + c) * hw;
            float *yp = y + (b * nch + c) * hw;
            for (int64_t i = 0; i < hw; i++) yp[i] = (xp[i] - m) * scale + shift;
        }
    }
    return GP_OK;
}

gp_status gp_cpu_batchnorm_backward(gp_device *dev, const gp_bn_dims *d, const float *x,
                                    const float *dy, const float *stats, const float *gamma,
                                    bool batch_stats, float *dx, float *dgamma, float *dbeta) {
    (void)dev;
    const int64_t batch = d->batch, nch = d->channels, hw = d->hw;
    const double count = (double)(batch * hw);
    const float *mean_in = stats, *invstd_in = stats + nch;
    for (int64_t c = 0; c < nch; c++) {
        const float m = mean_in[c], is = invstd_in[c];
        double sdy = 0, sdy_xc = 0; /* sum dy, sum dy * (x - mean) */
        for (int64_t b = 0; b < batch; b++) {
            const float *xp = x + (b * nch + c) * hw, *dyp = dy + (b * nch + c) * hw;
            sdy += sum_f64(dyp, hw);
            sdy_xc += dot_dev_f64(dyp, xp, hw, (double)m);
        }
        const double sdy_xhat = sdy_xc * is; /* sum dy * xhat */
        dgamma[c] += (float)sdy_xhat;
        dbeta[c] += (float)sdy;
        if (!dx) continue;
        const float k1 = gamma[c] * is;
        /* batch statistics: dx = gamma*invstd * (dy - mean(dy) - xhat * mean(dy*xhat));
         * running statistics are constants: dx = gamma*invstd * dy. */
        const float a = batch_stats ? (float)(sdy / count) : 0.0f;
        const float bc = batch_stats ? (float)(sdy_xhat / count * is) : 0.0f;
        for (int64_t b = 0; b < batch; b++) {
            const float *xp = x + (b * nch + c) * hw, *dyp = dy + (b * nch + c) * hw;
            float *dxp = dx + (b * nch + c) * hw;
            for (int64_t i = 0; i < hw; i++) dxp[i] = k1 * (dyp[i] - a - (xp[i] - m) * bc);
        }
    }
    return GP_OK;
}

/* ----------------------------------------------------------------- pooling */

gp_status gp_cpu_maxpool_forward(gp_device *dev, const gp_pool_dims *d, const float *x, float *y,
                                 int32_t *argmax) {
    (void)dev;
    const int64_t h = d->height, w = d->width, oh_n = d->out_h, ow_n = d->out_w;
    const int64_t k = d->kernel, s = d->stride;
    for (int64_t p = 0; p < d->planes; p++) {
        const float *xp = x + p * h * w;
        float *yp = y + p * oh_n * ow_n;
        int32_t *ap = argmax + p * oh_n * ow_n;
        for (int64_t oh = 0; oh < oh_n; oh++)
            for (int64_t ow = 0; ow < ow_n; ow++) {
                int64_t first = oh * s * w + ow * s, idx = first;
                float best = -INFINITY;
                for (int64_t ki = 0; ki < k; ki++)
                    for (int64_t kj = 0; kj < k; kj++) {
                        int64_t i = first + ki * w + kj;
                        float v = xp[i];
                        /* branch-free select: random data mispredicts an if */
                        bool take = (v > best) | (v != v); /* NaN propagates, as PyTorch */
                        best = take ? v : best;
                        idx = take ? i : idx;
                    }
                yp[oh * ow_n + ow] = best;
                ap[oh * ow_n + ow] = (int32_t)idx;
            }
    }
    return GP_OK;
}

gp_status gp_cpu_maxpool_backward(gp_device *dev, const gp_pool_dims *d, const int32_t *argmax,
                                  const float *dy, float *dx) {
    (void)dev;
    const int64_t hw = d->height * d->width, ohw = d->out_h * d->out_w;
    memset(dx, 0, (size_t)(d->planes * hw) * sizeof *dx);
    for (int64_t p = 0; p < d->planes; p++) {
        float *dxp = dx + p * hw;
        const float *dyp = dy + p * ohw;
        const int32_t *ap = argmax + p * ohw;
        /* overlapping windows (stride < kernel) add in output order */
        for (int64_t i = 0; i < ohw; i++) dxp[ap[i]] += dyp[i];
    }
    return GP_OK;
}

gp_status gp_cpu_avgpool_forward(gp_device *dev, int64_t planes, int64_t hw, const float *x,
                                 float *y) {
    (void)dev;
    for (int64_t p = 0; p < planes; p++) y[p] = (float)(sum_f64(x + p * hw, hw) / (double)hw);
    return GP_OK;
}

gp_status gp_cpu_avgpool_backward(gp_device *dev, int64_t planes, int64_t hw, const float *dy,
                                  float *dx) {
    (void)dev;
    for (int64_t p = 0; p < planes; p++) {
        float g = dy[p] / (float)hw, *dxp = dx + p * hw;
        for (int64_t i = 0; i < hw; i++) dxp[i] = g;
    }
    return GP_OK;
}
