/* Times the CPU's convolution paths: the default (Winograd's F(2x2, 3x3) for the 3x3 stride-1
 * convolutions it serves, kernels/cpu/conv_winograd.c, forward and both gradients where it
 * applies; the direct tile for the rest), the direct AVX2/FMA tile alone
 * (kernels/cpu/conv_direct.c, GP_CPU_CONV=direct) and im2col with OpenBLAS
 * (GP_CPU_CONV=im2col), on the convolutions of a 24/48/96-channel ResNet on Fashion-MNIST (the
 * Fashion demo's first two blocks; its last two have 128 channels), micro-batches of 8, and of
 * C1 (batch 128), forward and backward (weight and input gradients), in one process: the paths
 * alternate round by round, and the sgemm ceiling (2048^3 on the same threads) is measured after
 * each pass's rounds.
 * Prints GFLOP/s (2 x the direct sum's multiply-adds, whatever the path computes: Winograd's
 * are effective rates; backward counts both gradients), each path's fraction of the ceiling,
 * default over direct and direct over im2col. Built as build/bench_conv.
 * Usage: bench_conv [threads (1)] [rounds (7)] */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/cpu/conv_path.h"
#include "kernels/cpu/isa.h"
#include "kernels/kernels.h"
#include "support/support.h"

typedef struct conv_case {
    const char *name;
    int64_t c, hw, k, stride, oc, batch;
} conv_case;

#define NPATHS 3
static const char *const path_names[NPATHS] = {"default", "direct", "im2col"};

/* Path 0: Winograd where it applies, the direct tile elsewhere; 1: the direct tile; 2: im2col. */
static void use_path(int path) {
    gp_conv_path_enable(GP_CONV_WINOGRAD, path == 0);
    gp_conv_path_enable(GP_CONV_DIRECT, path < 2);
}

/* Every convolution of the two networks that the direct path serves (16 taps or more). */
static const conv_case cases[] = {
    {"fashion block 1, 24->24 3x3 at 28x28", 24, 28, 3, 1, 24, 8},
    {"fashion block 2, 24->48 3x3 stride 2", 24, 28, 3, 2, 48, 8},
    {"fashion block 2, 24->48 1x1 stride 2", 24, 28, 1, 2, 48, 8},
    {"fashion block 2, 48->48 3x3 at 14x14", 48, 14, 3, 1, 48, 8},
    {"fashion block 3, 48->96 3x3 stride 2", 48, 14, 3, 2, 96, 8},
    {"fashion block 3, 48->96 1x1 stride 2", 48, 14, 1, 2, 96, 8},
    {"fashion blocks 3-4, 96->96 3x3 at 7x7", 96, 7, 3, 1, 96, 8},
    {"C1 conv 1, 32->32 3x3 at 28x28", 32, 28, 3, 1, 32, 128},
    {"C1 conv 2, 32->64 3x3 at 14x14", 32, 14, 3, 1, 64, 128},
    {"C1 conv 3, 64->64 3x3 at 14x14", 64, 14, 3, 1, 64, 128},
};
#define NCASES ((int)(sizeof cases / sizeof cases[0]))

static int cmp_double(const void *a, const void *b) {
    const double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static double median(double *v, int n) {
    qsort(v, (size_t)n, sizeof *v, cmp_double);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

/* Seconds of one forward (pass 0) or backward (pass 1) of case cc on the current path: the
 * least of 3 calls, after one that warms the caches. */
static double time_pass(gp_device *dev, const gp_kernels *kt, const conv_case *cc,
                        const gp_conv_geom *g, const float *x, const float *w, const float *dy,
                        float *y, float *dx, float *dw, int pass) {
    const int64_t nws = kt->conv2d_ws(dev, g, cc->batch, cc->oc, pass == 1, true);
    float *ws = nws ? malloc((size_t)nws * sizeof *ws) : NULL;
    if (nws && !ws) exit(1);
    double best = 1e30;
    for (int r = 0; r < 4; r++) {
        const double t0 = gp_cli_now();
        if (pass == 0)
            kt->conv2d_forward(dev, g, cc->batch, cc->oc, x, w, NULL, y, ws);
        else
            kt->conv2d_backward(dev, g, cc->batch, cc->oc, x, w, NULL, dy, dx, dw, ws);
        const double t = gp_cli_now() - t0;
        if (r > 0 && t < best) best = t;
    }
    free(ws);
    return best;
}

int main(int argc, char **argv) {
    int threads, rounds, rc;
    gp_device *dev;
    if (!gp_cli_bench_start("bench_conv", argc, argv, 7, 64, &threads, &rounds, &dev, &rc))
        return rc;
    const gp_kernels *kt = gp_kernels_of(dev);
    use_path(0); /* whatever GP_CPU_CONV says: every path is timed */
    gp_conv_geom probe = {.channels = 24, .height = 28, .width = 28, .kernel = 3, .stride = 1,
                          .pad = 1, .out_h = 28, .out_w = 28};
    if (!gp_conv_direct_applies(&probe, 24)) {
        printf("bench_conv: the direct path is not in these CPU kernels (it needs AVX2 and FMA: "
               "a CPU without them, or GP_CPU_ISA=baseline): nothing to compare\n");
        gp_device_free(dev);
        return 0;
    }
    double warm; /* wakes the device's threads and the clock before the first case */
    char why[128];
    if (!gp_cli_bench_sgemm(2048, 2048, 2048, threads, false, 1, &warm, why, sizeof why)) {
        fprintf(stderr, "bench_conv: %s\n", why);
        gp_device_free(dev);
        return 1;
    }
    printf("CPU device of %d thread(s); %d rounds, the three paths alternating; medians\n",
           threads, rounds);
    double ceil_rounds[2 * NCASES];
    int nceil = 0;
    printf("| convolution | batch | pass | default (Winograd) GFLOP/s | direct GFLOP/s | im2col "
           "GFLOP/s | default / direct | direct / im2col | default of ceiling | direct of "
           "ceiling |\n|---|---:|---|---:|---:|---:|---:|---:|---:|---:|\n");
    double sum_t[NPATHS] = {0, 0, 0};
    for (int ci = 0; ci < NCASES; ci++) {
        const conv_case *cc = &cases[ci];
        const int64_t pad = cc->k / 2;
        gp_conv_geom g = {.channels = cc->c, .height = cc->hw, .width = cc->hw,
                          .kernel = cc->k, .stride = cc->stride, .pad = pad};
        g.out_h = g.out_w = (cc->hw + 2 * pad - cc->k) / cc->stride + 1;
        const int64_t nx = cc->batch * cc->c * cc->hw * cc->hw, nw = cc->oc * cc->c * cc->k * cc->k;
        const int64_t ny = cc->batch * cc->oc * g.out_h * g.out_w;
        float *x = gp_cli_bench_normal(nx, 1), *w = gp_cli_bench_normal(nw, 2);
        float *dy = gp_cli_bench_normal(ny, 3), *y = gp_cli_bench_normal(ny, 4);
        float *dx = gp_cli_bench_normal(nx, 5), *dw = gp_cli_bench_normal(nw, 6);
        const double macs = (double)ny * (double)(cc->c * cc->k * cc->k);
        for (int pass = 0; pass < 2; pass++) {
            double t[NPATHS][64];
            for (int r = 0; r < rounds; r++) {
                for (int path = 0; path < NPATHS; path++) {
                    use_path(path);
                    t[path][r] = time_pass(dev, kt, cc, &g, x, w, dy, y, dx, dw, pass);
                }
            }
            double rate;
            if (nceil < 2 * NCASES &&
                gp_cli_bench_sgemm(2048, 2048, 2048, threads, false, 1, &rate, why, sizeof why))
                ceil_rounds[nceil++] = rate;
            else
                ceil_rounds[nceil++] = warm; /* (a failed run: the first measurement stands) */
            const double flops = 2.0 * macs * (pass ? 2.0 : 1.0);
            const double tw = median(t[0], rounds), td = median(t[1], rounds),
                         ti = median(t[2], rounds);
            const double ceiling = median(ceil_rounds, nceil);
            sum_t[0] += tw, sum_t[1] += td, sum_t[2] += ti;
            printf("| %s | %lld | %s | %.1f | %.1f | %.1f | %.2fx | %.2fx | %.3f | %.3f |\n",
                   cc->name, (long long)cc->batch, pass ? "backward" : "forward",
                   flops / tw / 1e9, flops / td / 1e9, flops / ti / 1e9, td / tw, ti / td,
                   flops / tw / 1e9 / ceiling, flops / td / 1e9 / ceiling);
            fflush(stdout);
        }
        free(x), free(w), free(dy), free(y), free(dx), free(dw);
    }
    use_path(0);
    printf("sgemm 2048^3 ceiling: %.1f GFLOP/s (median of %d, one after each pass)\n",
           median(ceil_rounds, nceil), nceil);
    printf("all cases, one call of each pass: %s %.2f ms, %s %.2f ms, %s %.2f ms\n",
           path_names[0], sum_t[0] * 1e3, path_names[1], sum_t[1] * 1e3, path_names[2],
           sum_t[2] * 1e3);
    gp_device_free(dev);
    return 0;
}
