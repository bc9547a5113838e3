/* CPU kernels over flat arrays: fills and scales, bias sums, squared norms, ReLU and the
 * optimizer updates. Plain loops the compiler vectorizes, split over the device's threads in
 * contiguous parts; a reduction is split over its outputs (the columns of a bias sum) or over
 * blocks fixed by n alone (the squared norm), never by the thread count, so the bits do not
 * depend on it. */
#include <math.h>

#include "kernels/cpu/cpu_ops.h"
#include "kernels/cpu/pool.h"

/* Elements per thread below which an elementwise op stays on one thread. */
#define GRAIN 16384
/* A part starts on a 64-byte line of floats. */
#define ALIGN 16

typedef struct flat_args {
    float *x, *y, *w, *buf, *m, *v;
    const float *cx, *cy, *g;
    float a, b, c;
    const gp_adamw_step *step;
    int64_t rows, cols;
    double *partial;
} flat_args;

static void fill_range(void *ctx, int64_t lo, int64_t hi) {
    const flat_args *f = ctx;
    float *restrict x = f->x;
    const float a = f->a;
    for (int64_t i = lo; i < hi; i++) x[i] = a;
}

gp_status gp_cpu_fill(gp_device *dev, float *x, int64_t n, float value) {
    flat_args f = {.x = x, .a = value};
    gp_cpu_parallel_for(gp_cpu_pool_of(dev), n, ALIGN, GRAIN, fill_range, &f);
    return GP_OK;
}

static void scale_range(void *ctx, int64_t lo, int64_t hi) {
    const flat_args *f = ctx;
    float *restrict x = f->x;
    const float a = f->a;
    for (int64_t i = lo; i < hi; i++) x[i] *= a;
}

gp_status gp_cpu_scale(gp_device *dev, float *x, int64_t n, float alpha) {
    flat_args f = {.x = x, .a = alpha};
    gp_cpu_parallel_for(gp_cpu_pool_of(dev), n, ALIGN, GRAIN, scale_range, &f);
    return GP_OK;
}

static void axpy_range(void *ctx, int64_t lo, int64_t hi) {
    const flat_args *f = ctx;
    float *y = f->y;
    const float *x = f->cx;
    const float a = f->a;
    for (int64_t i = lo; i < hi; i++) y[i] += a * x[i];
}

gp_status gp_cpu_axpy(gp_device *dev, int64_t n, float alpha, const float *x, float *y) {
    flat_args f = {.y = y, .cx = x, .a = alpha};
    gp_cpu_parallel_for(gp_cpu_pool_of(dev), n, ALIGN, GRAIN, axpy_range, &f);
    return GP_OK;
}

/* Columns [lo, hi) of every row, rows in order: each column's sum is the serial one. */
static void sum_rows_range(void *ctx, int64_t lo, int64_t hi) {
    const flat_args *f = ctx;
    float *restrict y = f->y;
    const int64_t rows = f->rows, cols = f->cols;
    for (int64_t i = 0; i < rows; i++) {
        const float *restrict r = f->cx + i * cols;
        for (int64_t j = lo; j < hi; j++) y[j] += r[j];
    }
}

gp_status gp_cpu_sum_rows_add(gp_device *dev, const float *x, int64_t rows, int64_t cols,
                              float *out) {
    flat_args f = {.cx = x, .y = out, .rows = rows, .cols = cols};
    const int64_t per_col = rows > 0 ? rows : 1;
    gp_cpu_parallel_for(gp_cpu_pool_of(dev), cols, ALIGN, (GRAIN + per_col - 1) / per_col,
                        sum_rows_range, &f);
    return GP_OK;
}

/* The squared norm adds SUMSQ_BLOCKS partial sums, block b covering part b of [0, n) as
 * gp_cpu_split cuts it: the blocks depend on n alone, so any thread count adds the same
 * numbers in the same order. */
enum { SUMSQ_BLOCKS = 64 };

static void sumsq_range(void *ctx, int64_t lo, int64_t hi) {
    const flat_args *f = ctx;
    const float *restrict x = f->cx;
    for (int64_t b = lo; b < hi; b++) {
        int64_t i0, i1;
        gp_cpu_split(f->rows, (int)b, SUMSQ_BLOCKS, 1, &i0, &i1);
        double s = 0;
        for (int64_t i = i0; i < i1; i++) s += (double)x[i] * x[i];
        f->partial[b] = s;
    }
}

gp_status gp_cpu_sumsq(gp_device *dev, const float *x, int64_t n, double *out) {
    double partial[SUMSQ_BLOCKS];
    flat_args f = {.cx = x, .rows = n, .partial = partial};
    gp_cpu_parallel_for(gp_cpu_pool_of(dev), SUMSQ_BLOCKS, 1,
                        n >= (int64_t)SUMSQ_BLOCKS * 1024 ? 1 : SUMSQ_BLOCKS, sumsq_range, &f);
    double s = 0;
    for (int b = 0; b < SUMSQ_BLOCKS; b++) s += partial[b];
    *out = s;
    return GP_OK;
}

static void relu_range(void *ctx, int64_t lo, int64_t hi) {
    const flat_args *f = ctx;
    const float *x = f->cx;
    float *y = f->y;
    for (int64_t i = lo; i < hi; i++) y[i] = x[i] > 0.0f ? x[i] : 0.0f;
}

gp_status gp_cpu_relu_forward(gp_device *dev, int64_t n, const float *x, float *y) {
    flat_args f = {.cx = x, .y = y};
    gp_cpu_parallel_for(gp_cpu_pool_of(dev), n, ALIGN, GRAIN, relu_range, &f);
    return GP_OK;
}

static void relu_back_range(void *ctx, int64_t lo, int64_t hi) {
    const flat_args *f = ctx;
    const float *x = f->cx, *dy = f->cy;
    float *dx = f->x;
    for (int64_t i = lo; i < hi; i++) dx[i] = x[i] > 0.0f ? dy[i] : 0.0f;
}

gp_status gp_cpu_relu_backward(gp_device *dev, int64_t n, const float *x, const float *dy,
                               float *dx) {
    flat_args f = {.cx = x, .cy = dy, .x = dx};
    gp_cpu_parallel_for(gp_cpu_pool_of(dev), n, ALIGN, GRAIN, relu_back_range, &f);
    return GP_OK;
}

static void sgd_range(void *ctx, int64_t lo, int64_t hi) {
    const flat_args *f = ctx;
    const float lr = f->a, wd = f->b, momentum = f->c;
    float *restrict w = f->w, *restrict buf = f->buf;
    const float *restrict g = f->g;
    if (buf) {
        for (int64_t i = lo; i < hi; i++) {
            float d = g[i] + wd * w[i];
            buf[i] = momentum * buf[i] + d;
            w[i] -= lr * buf[i];
        }
    } else {
        for (int64_t i = lo; i < hi; i++) w[i] -= lr * (g[i] + wd * w[i]);
    }
}

gp_status gp_cpu_sgd_update(gp_device *dev, int64_t n, float *w, const float *g, float *buf,
                            float lr, float wd, float momentum) {
    flat_args f = {.w = w, .g = g, .buf = buf, .a = lr, .b = wd, .c = momentum};
    gp_cpu_parallel_for(gp_cpu_pool_of(dev), n, ALIGN, GRAIN, sgd_range, &f);
    return GP_OK;
}

static void adamw_range(void *ctx, int64_t lo, int64_t hi) {
    const flat_args *f = ctx;
    /* The step's constants in locals: read through f->step, the compiler reloads them after
     * every store (they might alias w, m or v) and keeps the loop scalar. */
    const gp_adamw_step s = *f->step;
    const float b1 = s.beta1, b2 = s.beta2;
    float *restrict w = f->w, *restrict m = f->m, *restrict v = f->v;
    const float *restrict g = f->g;
    for (int64_t i = lo; i < hi; i++) {
        float wi = w[i] * s.decay;
        m[i] = m[i] * b1 + g[i] * (1.0f - b1);
        v[i] = v[i] * b2 + g[i] * g[i] * (1.0f - b2);
        float denom = sqrtf(v[i]) / s.bc2_sqrt + s.eps;
        w[i] = wi - s.step_size * (m[i] / denom);
    }
}

gp_status gp_cpu_adamw_update(gp_device *dev, int64_t n, float *w, const float *g, float *m,
                              float *v, const gp_adamw_step *s) {
    flat_args f = {.w = w, .g = g, .m = m, .v = v, .step = s};
    gp_cpu_parallel_for(gp_cpu_pool_of(dev), n, ALIGN, GRAIN / 4, adamw_range, &f);
    return GP_OK;
}
