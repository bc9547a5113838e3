/* CPU kernels over flat arrays: fills and scales, bias sums, squared norms, ReLU and the
 * optimizer updates. Plain loops the compiler vectorizes; reductions in a fixed order. */
#include <math.h>

#include "kernels/cpu/cpu_kernels.h"

gp_status gp_cpu_fill(gp_device *dev, float *x, int64_t n, float value) {
    (void)dev;
    for (int64_t i = 0; i < n; i++) x[i] = value;
    return GP_OK;
}

gp_status gp_cpu_scale(gp_device *dev, float *x, int64_t n, float alpha) {
    (void)dev;
    for (int64_t i = 0; i < n; i++) x[i] *= alpha;
    return GP_OK;
}

gp_status gp_cpu_axpy(gp_device *dev, int64_t n, float alpha, const float *x, float *y) {
    (void)dev;
    for (int64_t i = 0; i < n; i++) y[i] += alpha * x[i];
    return GP_OK;
}

gp_status gp_cpu_sum_rows_add(gp_device *dev, const float *x, int64_t rows, int64_t cols,
                              float *out) {
    (void)dev;
    for (int64_t i = 0; i < rows; i++) {
        const float *r = x + i * cols;
        for (int64_t j = 0; j < cols; j++) out[j] += r[j];
    }
    return GP_OK;
}

gp_status gp_cpu_sumsq(gp_device *dev, const float *x, int64_t n, double *out) {
    (void)dev;
    double s = 0;
    for (int64_t i = 0; i < n; i++) s += (double)x[i] * x[i];
    *out = s;
    return GP_OK;
}

gp_status gp_cpu_relu_forward(gp_device *dev, int64_t n, const float *x, float *y) {
    (void)dev;
    for (int64_t i = 0; i < n; i++) y[i] = x[i] > 0.0f ? x[i] : 0.0f;
    return GP_OK;
}

gp_status gp_cpu_relu_backward(gp_device *dev, int64_t n, const float *x, const float *dy,
                               float *dx) {
    (void)dev;
    for (int64_t i = 0; i < n; i++) dx[i] = x[i] > 0.0f ? dy[i] : 0.0f;
    return GP_OK;
}

gp_status gp_cpu_sgd_update(gp_device *dev, int64_t n, float *w, const float *g, float *buf,
                            float lr, float wd, float momentum) {
    (void)dev;
    if (buf) {
        for (int64_t i = 0; i < n; i++) {
            float d = g[i] + wd * w[i];
            buf[i] = momentum * buf[i] + d;
            w[i] -= lr * buf[i];
        }
    } else {
        for (int64_t i = 0; i < n; i++) w[i] -= lr * (g[i] + wd * w[i]);
    }
    return GP_OK;
}

gp_status gp_cpu_adamw_update(gp_device *dev, int64_t n, float *w, const float *g, float *m,
                              float *v, const gp_adamw_step *s) {
    (void)dev;
    const float b1 = s->beta1, b2 = s->beta2;
    for (int64_t i = 0; i < n; i++) {
        float wi = w[i] * s->decay;
        m[i] = m[i] * b1 + g[i] * (1.0f - b1);
        v[i] = v[i] * b2 + g[i] * g[i] * (1.0f - b2);
        float denom = sqrtf(v[i]) / s->bc2_sqrt + s->eps;
        w[i] = wi - s->step_size * (m[i] / denom);
    }
    return GP_OK;
}
