/* Times the CPU's memory-bound kernels around the convolutions: batch norm's forward (batch
 * statistics, two sums in double then the normalization) and backward (one pass of two sums,
 * then the input gradient), ReLU both ways and the residual add (axpy), through the kernel
 * table, on the shapes of a 24/48/96-channel Fashion-MNIST ResNet (micro-batches of 8) and of C1
 * (batch 128). Each figure is the least of `reps` calls after one that warms the caches; the
 * bandwidth counts the floats each kernel must read and write once (batch norm's forward reads x
 * twice for its sums and once more to normalize, writes y: 4 n floats; backward 5 n), so a figure
 * near the core's memory speed (about 29 GB/s here for data past the caches) says the kernel is
 * memory-bound. Built as build/bench_norm.
 * Usage: bench_norm [threads (1)] [reps (41)] */
#include <stdio.h>
#include <stdlib.h>

#include "kernels/kernels.h"
#include "support/support.h"

typedef struct norm_case {
    const char *name;
    int64_t batch, channels, hw;
} norm_case;

static const norm_case cases[] = {
    {"fashion 28x28 (stem, block 1)", 8, 24, 28},
    {"fashion 14x14 (block 2)", 8, 48, 14},
    {"fashion 7x7 (blocks 3-4)", 8, 96, 7},
    {"C1 28x28 (conv 1-2)", 128, 32, 28},
    {"C1 14x14 (conv 3-4)", 128, 64, 14},
};
#define NCASES ((int)(sizeof cases / sizeof cases[0]))

enum { BN_FWD, BN_BWD, RELU_FWD, RELU_BWD, AXPY, NKERNELS };
static const char *const kernel_names[NKERNELS] = {"batch norm forward", "batch norm backward",
                                                   "relu forward", "relu backward", "axpy"};
/* floats read and written once, per element */
static const double kernel_floats[NKERNELS] = {4, 5, 2, 3, 3};

typedef struct bufs {
    float *x, *y, *dy, *dx, *gamma, *beta, *rmean, *rvar, *stats, *dgamma, *dbeta;
} bufs;

static gp_status call(gp_device *dev, const gp_kernels *kt, int k, const gp_bn_dims *d,
                      const bufs *b) {
    const int64_t n = d->batch * d->channels * d->hw;
    switch (k) {
    case BN_FWD:
        return kt->batchnorm_forward(dev, d, b->x, b->gamma, b->beta, b->rmean, b->rvar, true,
                                     false, b->stats, b->y);
    case BN_BWD:
        return kt->batchnorm_backward(dev, d, b->x, b->dy, b->stats, b->gamma, true, b->dx,
                                      b->dgamma, b->dbeta);
    case RELU_FWD: return kt->relu_forward(dev, n, b->x, b->y);
    case RELU_BWD: return kt->relu_backward(dev, n, b->x, b->dy, b->dx);
    default: return kt->axpy(dev, n, 1.0f, b->x, b->y);
    }
}

int main(int argc, char **argv) {
    int threads, reps, rc;
    gp_device *dev;
    if (!gp_cli_bench_start("bench_norm", argc, argv, 41, 100000, &threads, &reps, &dev, &rc))
        return rc;
    const gp_kernels *kt = gp_kernels_of(dev);
    printf("CPU device of %d thread(s); the least of %d calls each\n", threads, reps);
    printf("| shape | (B, C, H, W) | MB | kernel | ms | GB/s |\n|---|---|---:|---|---:|---:|\n");
    rc = 0;
    for (int ci = 0; ci < NCASES && rc == 0; ci++) {
        const norm_case *c = &cases[ci];
        const gp_bn_dims d = {.batch = c->batch, .channels = c->channels, .hw = c->hw * c->hw,
                              .eps = 1e-5, .momentum = 0.1};
        const int64_t n = c->batch * c->channels * c->hw * c->hw, C = c->channels;
        /* x, y, dy, dx of n floats; gamma, beta, running mean and variance, stats (2C), dgamma,
         * dbeta */
        bufs b = {gp_cli_bench_normal(n, 1),     gp_cli_bench_normal(n, 2),
                  gp_cli_bench_normal(n, 3),     gp_cli_bench_normal(n, 4),
                  gp_cli_bench_normal(C, 5),     gp_cli_bench_normal(C, 6),
                  gp_cli_bench_normal(C, 7),     gp_cli_bench_normal(C, 8),
                  gp_cli_bench_normal(2 * C, 9), gp_cli_bench_normal(C, 10),
                  gp_cli_bench_normal(C, 11)};
        for (int64_t i = 0; i < C; i++) b.rvar[i] = 1.0f + b.rvar[i] * b.rvar[i];
        for (int k = 0; k < NKERNELS && rc == 0; k++) {
            double best = 1e30;
            for (int r = 0; r <= reps && rc == 0; r++) {
                const double t0 = gp_cli_now();
                if (call(dev, kt, k, &d, &b) != GP_OK) {
                    fprintf(stderr, "bench_norm: %s: %s\n", kernel_names[k], gp_last_error());
                    rc = 1;
                }
                const double t = gp_cli_now() - t0;
                if (r > 0 && t < best) best = t;
            }
            const double mb = (double)n * sizeof(float) / 1e6;
            if (rc == 0)
                printf("| %s | (%lld, %lld, %lld, %lld) | %.2f | %s | %.4f | %.1f |\n", c->name,
                       (long long)c->batch, (long long)C, (long long)c->hw, (long long)c->hw, mb,
                       kernel_names[k], best * 1e3, kernel_floats[k] * mb / 1e3 / best);
        }
        float *const all[] = {b.x,    b.y,     b.dy,    b.dx,     b.gamma, b.beta,
                              b.rmean, b.rvar, b.stats, b.dgamma, b.dbeta};
        for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) free(all[i]);
    }
    gp_device_free(dev);
    return rc;
}
