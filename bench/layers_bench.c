/* Times one Transformer block forward+backward at T1 shapes (docs/WORKLOADS.md:
 * B 32, T 128, C 512, 8 heads, d_ff 2048) against the single-thread sgemm
 * ceiling measured in the same process, and the block's pieces separately,
 * through the CPU device's kernel table. Built as build/bench_layers.
 * Usage: bench_layers [reps] */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#ifdef __GLIBC__
#include <malloc.h>
#endif

#include "kernels/kernels.h"
#include "layers/transformer_ops.h"
#include "support/blas_core.h"
#include "support/support.h"

#define F32(t) ((float *)(t).data)

static gp_device *dev;       /* the CPU device the block runs on */
static const gp_kernels *kt; /* its kernel table */

/* Thread CPU time: on a shared machine, time slices taken by other
 * processes do not count (GP_BENCH_WALL=1 uses wall-clock time instead). */
static double now(void) {
    static int wall = -1;
    if (wall < 0) wall = getenv("GP_BENCH_WALL") && getenv("GP_BENCH_WALL")[0] == '1';
    if (wall) return gp_cli_now();
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static double median(double *v, int n) {
    qsort(v, (size_t)n, sizeof *v, cmp_double);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

static float *buf(int64_t n, uint32_t stream) {
    float *p = aligned_alloc(64, (size_t)n * sizeof(float));
    gp_rng_stream s = {.seed = 1, .purpose = GP_RNG_TEST, .a = stream};
    gp_rng_uniform(&s, 0, p, n);
    for (int64_t i = 0; i < n; i++) p[i] = (p[i] - 0.5f) * 0.2f;
    return p;
}

/* GFLOP/s of one row-major sgemm shape, median of reps. */
static double gemm_rate(int64_t m, int64_t n, int64_t k, int reps) {
    float *a = buf(m * k, 1), *b = buf(k * n, 2), *c = buf(m * n, 3);
    double t[16];
    kt->gemm(dev, false, false, m, n, k, 1.0f, a, k, b, n, 0.0f, c, n);
    for (int r = 0; r < reps; r++) {
        double t0 = now();
        kt->gemm(dev, false, false, m, n, k, 1.0f, a, k, b, n, 0.0f, c, n);
        t[r] = now() - t0;
    }
    free(a), free(b), free(c);
    return 2.0 * (double)m * (double)n * (double)k / median(t, reps) / 1e9;
}

int main(int argc, char **argv) {
    gp_cli_blas_core_check("bench_layers", argv);
    const int reps = argc > 1 ? atoi(argv[1]) : 5;
#ifdef __GLIBC__
    /* GP_BENCH_KEEP_HEAP=1: freed blocks stay mapped, to show what fresh-page
     * faults on every call cost (what a caching device allocator would save). */
    if (getenv("GP_BENCH_KEEP_HEAP") && getenv("GP_BENCH_KEEP_HEAP")[0] == '1') {
        mallopt(M_MMAP_THRESHOLD, 1 << 30);
        mallopt(M_TRIM_THRESHOLD, 1 << 30);
        printf("glibc: large blocks kept in the heap\n");
    }
#endif
    if (gp_device_cpu_new("bench", &dev) != GP_OK) return 1;
    kt = gp_kernels_of(dev);
    char core[GP_CLI_BLAS_CORE_TEXT_SIZE];
    printf("OpenBLAS core %s, one thread\n", gp_cli_blas_core_text(core, sizeof core));
    const double ceiling = gemm_rate(2048, 2048, 2048, 3);
    printf("sgemm 2048^3: %.1f GFLOP/s (the ceiling)\n", ceiling);
    printf("sgemm 4096x512x1536 %.1f, 4096x2048x512 %.1f, 4096x512x2048 %.1f GFLOP/s\n",
           gemm_rate(4096, 1536, 512, 3), gemm_rate(4096, 512, 2048, 3),
           gemm_rate(4096, 2048, 512, 3));

    const int B = 32, T = 128, C = 512, H = 8, F = 2048;
    gp_layer *l = gp_transformer_block(C, H, F, 0.0f);
    l->index = 0;
    for (int i = 0; i < l->nparams; i++) {
        gp_param *p = &l->params[i];
        gp_tensor_alloc(dev, GP_MEM_PARAMS, p->shape, GP_F32, &p->value);
        gp_tensor_zeros(dev, GP_MEM_GRADS, p->shape, GP_F32, &p->grad);
        gp_rng_stream s = {.seed = 3, .purpose = GP_RNG_INIT, .a = 0, .b = (uint32_t)i};
        gp_rng_normal(&s, 0, p->value.data, gp_tensor_nelem(&p->value));
        for (int64_t k = 0; k < gp_tensor_nelem(&p->value); k++)
            F32(p->value)[k] = p->shape.ndim == 2 ? 0.02f * F32(p->value)[k]
                                                  : (i == 0 || i == 6 ? 1.0f : 0.0f);
    }
    gp_shape xs = gp_shape3(B, T, C);
    gp_tensor x, y, dy, dx;
    gp_tensor_alloc(dev, GP_MEM_ACTIVATIONS, xs, GP_F32, &x);
    gp_tensor_alloc(dev, GP_MEM_ACTIVATIONS, xs, GP_F32, &y);
    gp_tensor_alloc(dev, GP_MEM_ACTIVATIONS, xs, GP_F32, &dy);
    gp_tensor_alloc(dev, GP_MEM_ACTIVATIONS, xs, GP_F32, &dx);
    gp_rng_stream s = {.seed = 5, .purpose = GP_RNG_TEST};
    gp_rng_normal(&s, 0, x.data, gp_tensor_nelem(&x));
    s.a = 1;
    gp_rng_normal(&s, 0, dy.data, gp_tensor_nelem(&dy));
    gp_run run = {.training = true, .seed = 1};

    /* The ceiling is re-measured before every repetition and each
     * repetition's ratio uses its own: a shared machine drifts. */
    float *ga = buf(2048 * 2048, 21), *gb = buf(2048 * 2048, 22), *gc = buf(2048 * 2048, 23);
    double tf[32], tb[32], ratio[32], ceil_r[32];
    const int n = reps + 1 > 32 ? 31 : reps;
    const double N = (double)B * T;
    /* WORKLOADS.md counting: 6 x matmul parameters x tokens + 12 x T x C x tokens. */
    const double counted = 6.0 * 12.0 * C * C * N + 12.0 * T * C * N;
    for (int r = -1; r < n; r++) { /* r = -1: warm-up */
        double tg = now();
        kt->gemm(dev, false, false, 2048, 2048, 2048, 1.0f, ga, 2048, gb, 2048, 0.0f, gc, 2048);
        tg = now() - tg;
        gp_ctx c;
        gp_ctx_init(&c, dev, &run);
        c.x = &x;
        c.y = &y;
        double t0 = now();
        if (l->ops->forward(l, &c, &x, &y) != GP_OK) return fprintf(stderr, "%s\n", gp_last_error()), 1;
        double t1 = now();
        if (l->ops->backward(l, &c, &dy, &dx) != GP_OK) return fprintf(stderr, "%s\n", gp_last_error()), 1;
        double t2 = now();
        gp_ctx_release(&c);
        if (r >= 0) {
            tf[r] = t1 - t0, tb[r] = t2 - t1;
            ceil_r[r] = 2.0 * 2048 * 2048 * 2048 / tg / 1e9;
            ratio[r] = counted / (t2 - t0) / 1e9 / ceil_r[r];
        }
    }
    free(ga), free(gb), free(gc);
    const double f = median(tf, n), b = median(tb, n);
    const double ratio_med = median(ratio, n), ceil_med = median(ceil_r, n);
    gp_cost cost = l->ops->cost(l, &xs);
    printf("block fwd %.1f ms, bwd %.1f ms, total %.1f ms (median of %d)\n", f * 1e3, b * 1e3,
           (f + b) * 1e3, n);
    printf("counted %.1f GFLOP -> %.1f GFLOP/s; median ratio to the interleaved 2048^3 ceiling "
           "(median %.1f GFLOP/s): %.1f%% (spread %.1f%% .. %.1f%%)\n",
           counted / 1e9, counted / (f + b) / 1e9, ceil_med, 100.0 * ratio_med, 100.0 * ratio[0],
           100.0 * ratio[n - 1]);
    printf("cost() %.1f GFLOP (as computed, causal blocks skipped) -> %.1f GFLOP/s\n",
           (cost.fwd_flops + cost.bwd_flops) / 1e9, (cost.fwd_flops + cost.bwd_flops) / (f + b) / 1e9);
    printf("fwd alone %.1f%%, bwd alone %.1f%% of the median ceiling (counted flops 1/3, 2/3)\n",
           100.0 * counted / 3 / f / 1e9 / ceil_med, 100.0 * counted * 2 / 3 / b / 1e9 / ceil_med);
    gp_mem_stats st;
    gp_device_mem_stats(dev, &st);
    printf("peak activations %.1f MB, workspace %.1f MB\n", st.peak[GP_MEM_ACTIVATIONS] / 1e6,
           st.peak[GP_MEM_WORKSPACE] / 1e6);

    /* Pieces: the non-GEMM passes at T1 sizes. */
    const int64_t NC = (int64_t)N * C, NF = (int64_t)N * F;
    float *a1 = buf(NF, 11), *a2 = buf(NF, 12), *a3 = buf(NF, 13), *st2 = buf(2 * (int64_t)N, 14);
    double tt[32];
    for (int r = 0; r < n; r++) {
        double t0 = now();
        kt->gelu_forward(dev, NF, a1, a2, NULL);
        tt[r] = now() - t0;
    }
    printf("gelu fwd (N, F): %.2f ms\n", median(tt, n) * 1e3);
    for (int r = 0; r < n; r++) {
        double t0 = now();
        kt->gelu_backward(dev, (int64_t)N, F, a1, a2, a3, st2);
        tt[r] = now() - t0;
    }
    printf("gelu bwd (N, F): %.2f ms\n", median(tt, n) * 1e3);
    for (int r = 0; r < n; r++) {
        double t0 = now();
        kt->layernorm_forward(dev, (int64_t)N, C, a1, F32(l->params[0].value),
                              F32(l->params[1].value), a2, NULL, st2);
        tt[r] = now() - t0;
    }
    printf("layernorm fwd (N, C): %.2f ms\n", median(tt, n) * 1e3);
    for (int r = 0; r < n; r++) {
        double t0 = now();
        kt->layernorm_backward(dev, (int64_t)N, C, a1, F32(l->params[0].value), st2, a2, a3, a3,
                               F32(l->params[0].grad), F32(l->params[1].grad));
        tt[r] = now() - t0;
    }
    printf("layernorm bwd (N, C): %.2f ms\n", median(tt, n) * 1e3);
    gp_attn_dims d = {.batch = B, .seq = T, .dim = C, .heads = H};
    float *probs = buf((int64_t)B * H * T * T, 15);
    for (int r = 0; r < n; r++) {
        double t0 = now();
        kt->attention_forward(dev, &d, a1, probs, a2, NULL);
        tt[r] = now() - t0;
    }
    printf("attention core fwd: %.2f ms (%.2f GFLOP as computed)\n", median(tt, n) * 1e3,
           gp_op_attention_gemm_flops(&d) / 1e9);
    for (int r = 0; r < n; r++) {
        double t0 = now();
        kt->attention_backward(dev, &d, a1, probs, NULL, NULL, a2, a3, st2, a3 + 3 * NC);
        tt[r] = now() - t0;
    }
    printf("attention core bwd: %.2f ms\n", median(tt, n) * 1e3);
    free(a1), free(a2), free(a3), free(st2), free(probs);
    gp_tensor_release(&x), gp_tensor_release(&y), gp_tensor_release(&dy), gp_tensor_release(&dx);
    for (int i = 0; i < l->nparams; i++) {
        gp_tensor_release(&l->params[i].value);
        gp_tensor_release(&l->params[i].grad);
    }
    gp_layer_free(l);
    gp_device_free(dev);
    return 0;
}
