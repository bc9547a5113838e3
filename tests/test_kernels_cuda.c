/* The CUDA device's op table against the CPU's: every op of kernels/kernels.h run on the same
 * random inputs through both tables, then every output compared. What only selects or copies
 * must be equal bit for bit (dropout masks, embedding rows and their gradients, pooling maxima
 * and indices, row maxima); everything else within
 *
 *   |cuda - cpu| <= 1e-5 (|cpu| + max |cpu| over the output)
 *
 * (float32 rounding scales with the operands, and an element may cancel to near zero), and the
 * scalars that come back to the host within 1e-5 of the CPU's, relative. The CUDA side runs each
 * case twice and must give the same bits both times (determinism). tests/test_kernels.c checks
 * the same table against plain-C references in double, with guard words and unset outputs.
 *
 * Without a GPU, or in a build without CUDA, it prints why and exits 77 (skipped). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/device.h"
#include "kernels/kernels.h"
#include "testutil.h"

#define TOL 1e-5
#define MAX_BUFS 24

/* One run of one case on one device: the buffers it made, in order (the CPU's and the CUDA's
 * runs of a case make the same list), and the host scalars the ops returned. */
typedef struct run {
    gp_device *dev;
    const gp_kernels *K;
    int nb;
    void *d[MAX_BUFS];
    int64_t n[MAX_BUFS];
    bool input[MAX_BUFS];
    double scalar[4];
    int ns;
} run;

static uint32_t g_stream;
static const char *g_case;

static void *dbuf(run *r, const void *host, int64_t n, bool input) {
    if (r->nb == MAX_BUFS) {
        fprintf(stderr, "test_kernels_cuda: too many buffers in %s\n", g_case);
        exit(1);
    }
    const size_t nbytes = (size_t)(n > 0 ? n : 1) * 4;
    gp_status st;
    void *p = gp_device_alloc(r->dev, GP_MEM_WORKSPACE, nbytes, &st);
    if (!p) {
        fprintf(stderr, "test_kernels_cuda: allocation failed: %s\n", gp_last_error());
        exit(1);
    }
    if (host) {
        REQUIRE_OK(gp_device_copy(r->dev, p, host, (size_t)n * 4, GP_COPY_HOST_TO_DEVICE));
    } else {
        REQUIRE_OK(gp_device_fill(r->dev, p, nbytes, 0xff)); /* NaN: unwritten shows */
    }
    r->d[r->nb] = p;
    r->n[r->nb] = n;
    r->input[r->nb++] = input;
    return p;
}

static const float *in(run *r, const float *h, int64_t n) { return dbuf(r, h, n, true); }
static const int32_t *in_i(run *r, const int32_t *h, int64_t n) { return dbuf(r, h, n, true); }
static float *io(run *r, const float *h, int64_t n) { return dbuf(r, h, n, false); }
static float *out(run *r, int64_t n) { return dbuf(r, NULL, n, false); }
static int32_t *out_i(run *r, int64_t n) { return dbuf(r, NULL, n, false); }
static double *scalar(run *r) { return &r->scalar[r->ns++]; }

/* Host inputs, the same for both devices: drawn again from the same streams for each run. */
static float *rnd(int64_t n, float sd) {
    float *x = malloc((size_t)(n > 0 ? n : 1) * sizeof *x);
    gp_rng_stream s = {.seed = 0xc0da, .purpose = GP_RNG_TEST, .a = 0xcd, .b = ++g_stream};
    gp_rng_normal(&s, 0, x, n);
    for (int64_t i = 0; i < n; i++) x[i] *= sd;
    return x;
}

static float *pos(int64_t n) { /* positive values (variances, second moments) */
    float *x = rnd(n, 1.0f);
    for (int64_t i = 0; i < n; i++) x[i] = fabsf(x[i]) + 0.1f;
    return x;
}

static int32_t *ids(int64_t n, int64_t hi, bool ignore) { /* [0, hi), some -1 when ignore */
    int32_t *x = malloc((size_t)(n > 0 ? n : 1) * sizeof *x);
    gp_rng_stream s = {.seed = 0xc0da, .purpose = GP_RNG_TEST, .a = 0x1d, .b = ++g_stream};
    for (int64_t i = 0; i < n; i++) {
        x[i] = (int32_t)(gp_rng_u64(&s, (uint64_t)i) % (uint64_t)hi);
        if (ignore && i % 5 == 2) x[i] = -1;
    }
    return x;
}

/* The host arrays of one run, freed after it. */
#define H(x) (held[nheld++] = (x))
#define CASE_BEGIN void *held[32]; int nheld = 0
#define CASE_END for (int i_ = 0; i_ < nheld; i_++) free(held[i_])

typedef void (*case_fn)(run *r);

static void release(run *r) {
    for (int i = 0; i < r->nb; i++) gp_device_release(r->dev, r->d[i]);
    r->nb = 0;
}

static void *fetch(run *r, int i) {
    void *h = malloc((size_t)(r->n[i] > 0 ? r->n[i] : 1) * 4);
    REQUIRE_OK(gp_device_sync(r->dev));
    REQUIRE_OK(gp_device_copy(r->dev, h, r->d[i], (size_t)r->n[i] * 4, GP_COPY_DEVICE_TO_HOST));
    return h;
}

static bool same_bits(const void *a, const void *b, int64_t n) {
    return memcmp(a, b, (size_t)n * 4) == 0;
}

/* The case on the CPU, twice on CUDA; compares (tol: the bound for what is not exact). */
static void check_case(gp_device *cpu, gp_device *gpu, const char *name, bool exact, double tol,
                       case_fn fn) {
    g_case = name;
    run rc = {.dev = cpu, .K = gp_kernels_of(cpu)};
    run rg[2] = {{.dev = gpu, .K = gp_kernels_of(gpu)}, {.dev = gpu, .K = gp_kernels_of(gpu)}};
    const uint32_t stream0 = g_stream;
    fn(&rc);
    for (int k = 0; k < 2; k++) {
        g_stream = stream0;
        fn(&rg[k]);
    }
    double worst = 0;
    int failed = 0;
    for (int i = 0; i < rc.nb && !failed; i++) {
        if (rc.input[i]) continue;
        float *c = fetch(&rc, i), *g0 = fetch(&rg[0], i), *g1 = fetch(&rg[1], i);
        if (!same_bits(g0, g1, rc.n[i])) {
            fprintf(stderr, "%s: buffer %d: two CUDA runs gave different bits\n", name, i);
            failed++;
        }
        double mag = 0;
        for (int64_t j = 0; j < rc.n[i]; j++)
            if (isfinite(c[j]) && fabs(c[j]) > mag) mag = fabs(c[j]);
        for (int64_t j = 0; j < rc.n[i] && failed < 5; j++) {
            const bool nan_both = isnan(c[j]) && isnan(g0[j]);
            uint32_t bc, bg;
            memcpy(&bc, &c[j], 4);
            memcpy(&bg, &g0[j], 4);
            const double err = fabs((double)g0[j] - c[j]) / (fabs(c[j]) + mag + 1e-30);
            const bool ok = exact ? (bc == bg || nan_both) : (nan_both || err <= tol);
            if (!nan_both && err > worst) worst = err;
            if (!ok) {
                fprintf(stderr, "%s: buffer %d [%lld]: cuda %.9g (0x%08x), cpu %.9g (0x%08x)%s\n",
                        name, i, (long long)j, g0[j], bg, c[j], bc,
                        exact ? ", expected the same bits" : "");
                failed++;
            }
        }
        free(c), free(g0), free(g1);
    }
    for (int k = 0; k < rc.ns; k++) {
        const double c = rc.scalar[k], g = rg[0].scalar[k];
        if (memcmp(&g, &rg[1].scalar[k], sizeof g) != 0) {
            fprintf(stderr, "%s: scalar %d: two CUDA runs differ\n", name, k);
            failed++;
        }
        if (!(fabs(g - c) <= TOL * fabs(c) + 1e-12)) {
            fprintf(stderr, "%s: scalar %d: cuda %.17g, cpu %.17g\n", name, k, g, c);
            failed++;
        }
    }
    gp_test_failures += failed;
    printf("%-34s %s, worst %.2e%s\n", name, exact ? "bits" : "tol ", worst,
           failed ? "  FAILED" : "");
    release(&rc), release(&rg[0]), release(&rg[1]);
}

/* ------------------------------------------------------------------------ the cases */

#define S(expr) CHECK_OK(expr)

static void c_gemm(run *r, bool ta, bool tb) {
    CASE_BEGIN;
    const int64_t m = 37, n = 29, k = 53;
    const float *a = in(r, H(rnd(m * k, 1)), m * k), *b = in(r, H(rnd(k * n, 1)), k * n);
    float *c = io(r, H(rnd(m * n, 1)), m * n);
    S(r->K->gemm(r->dev, ta, tb, m, n, k, 0.7f, a, ta ? m : k, b, tb ? k : n, 0.3f, c, n));
    CASE_END;
}
static void c_gemm_nn(run *r) { c_gemm(r, false, false); }
static void c_gemm_nt(run *r) { c_gemm(r, false, true); }
static void c_gemm_tn(run *r) { c_gemm(r, true, false); }
static void c_gemm_tt(run *r) { c_gemm(r, true, true); }

/* Operands and output one float past an allocation's start: not 16-byte aligned, so the GPU's
 * four-a-thread kernels (the bf16 rounding here) take their one-a-thread path. */
static void c_gemm_offset(run *r) {
    CASE_BEGIN;
    const int64_t m = 21, n = 18, k = 33;
    const float *a = in(r, H(rnd(m * k + 1, 1)), m * k + 1);
    const float *b = in(r, H(rnd(k * n + 1, 1)), k * n + 1);
    float *c = io(r, H(rnd(m * n + 1, 1)), m * n + 1);
    S(r->K->gemm(r->dev, false, true, m, n, k, 1.0f, a + 1, k, b + 1, k, 0.5f, c + 1, n));
    CASE_END;
}
static void c_gemm_batched(run *r) {
    CASE_BEGIN;
    const int64_t m = 19, n = 23, k = 31, cnt = 3;
    const float *a = in(r, H(rnd(cnt * m * k, 1)), cnt * m * k);
    const float *b = in(r, H(rnd(cnt * n * k, 1)), cnt * n * k);
    float *c = out(r, cnt * m * n);
    S(r->K->gemm_batched(r->dev, false, true, m, n, k, 1.0f, a, k, m * k, b, k, n * k, 0.0f, c,
                         n, m * n, cnt));
    CASE_END;
}

/* The case with both devices in bf16 (gp_precision): the same operands rounded alike (both
 * devices round with core/bf16.h), products of bf16 values exact in float, so that GEMMs differ
 * only in the order of their fp32 sums, as in fp32: the same bound. Without the rounding on one
 * side they would differ by up to 2^-8 of each operand, far past it. */
static void bf16(run *r, case_fn fn) {
    S(gp_device_set_precision(r->dev, GP_PRECISION_BF16));
    fn(r);
    S(gp_device_set_precision(r->dev, GP_PRECISION_FP32));
}
static void c_gemm_nn_bf16(run *r) { bf16(r, c_gemm_nn); }
static void c_gemm_tt_bf16(run *r) { bf16(r, c_gemm_tt); }
static void c_gemm_batched_bf16(run *r) { bf16(r, c_gemm_batched); }
static void c_gemm_offset_bf16(run *r) { bf16(r, c_gemm_offset); }

static void c_vector(run *r) {
    CASE_BEGIN;
    const int64_t n = 1029;
    float *x = out(r, n), *y = io(r, H(rnd(n, 1)), n), *z = io(r, H(rnd(n, 1)), n);
    S(r->K->fill(r->dev, x, n, 0.25f));
    S(r->K->scale(r->dev, y, n, -1.5f));
    S(r->K->axpy(r->dev, n, 0.3f, y, z));
    CASE_END;
}

/* 333 rows: on the GPU three chunks of partial sums (GP_CUDA_SUM_CHUNK 128), the last short. */
static void c_sum_rows(run *r) {
    CASE_BEGIN;
    const float *x = in(r, H(rnd(333 * 70, 1)), 333 * 70);
    float *o = io(r, H(rnd(70, 1)), 70);
    S(r->K->sum_rows_add(r->dev, x, 333, 70, o));
    CASE_END;
}

static void c_sumsq(run *r) {
    CASE_BEGIN;
    const int64_t n = 100003;
    const float *x = in(r, H(rnd(n, 1)), n);
    S(r->K->sumsq(r->dev, x, n, scalar(r)));
    CASE_END;
}

static void c_relu(run *r) {
    CASE_BEGIN;
    const int64_t n = 777;
    const float *x = in(r, H(rnd(n, 1)), n), *dy = in(r, H(rnd(n, 1)), n);
    float *y = out(r, n), *dx = out(r, n);
    S(r->K->relu_forward(r->dev, n, x, y));
    S(r->K->relu_backward(r->dev, n, x, dy, dx));
    CASE_END;
}

static void c_linear(run *r) {
    CASE_BEGIN;
    const int64_t rows = 17, ni = 33, no = 16;
    const float *x = in(r, H(rnd(rows * ni, 1)), rows * ni), *w = in(r, H(rnd(no * ni, 1)), no * ni);
    const float *b = in(r, H(rnd(no, 1)), no), *res = in(r, H(rnd(rows * no, 1)), rows * no);
    const float *dy = in(r, H(rnd(rows * no, 1)), rows * no);
    float *y1 = out(r, rows * no), *y2 = out(r, rows * no), *dx = out(r, rows * ni);
    float *dw = io(r, H(rnd(no * ni, 1)), no * ni), *db = io(r, H(rnd(no, 1)), no);
    S(r->K->linear_forward(r->dev, rows, ni, no, x, NULL, w, NULL, b, res, y1));
    S(r->K->linear_forward(r->dev, rows, ni, no, x, NULL, w, NULL, NULL, NULL, y2));
    float *y3 = out(r, rows * no); /* the bias alone: the GPU's four-a-thread prefill */
    S(r->K->linear_forward(r->dev, rows, ni, no, x, NULL, w, NULL, b, NULL, y3));
    S(r->K->linear_backward(r->dev, rows, ni, no, x, NULL, w, NULL, dy, dx, dw, db));
    CASE_END;
}

/* Fifteen outputs: rows of a length not a multiple of 4, so the GPU's bias prefill goes one float
 * a thread; the bias, the residual and the output one float in (not aligned) for the same
 * reason (and, in bf16, so that cuBLASLt's epilogue is not taken: gemm_lt.h). */
static void c_linear_odd(run *r) {
    CASE_BEGIN;
    const int64_t rows = 9, ni = 20, no = 15;
    const float *x = in(r, H(rnd(rows * ni, 1)), rows * ni), *w = in(r, H(rnd(16 * ni, 1)), 16 * ni);
    const float *b = in(r, H(rnd(17, 1)), 17);
    const float *res = in(r, H(rnd(rows * 16 + 1, 1)), rows * 16 + 1);
    float *y1 = out(r, rows * no), *y2 = out(r, rows * 16 + 1);
    S(r->K->linear_forward(r->dev, rows, ni, no, x, NULL, w, NULL, b + 1, NULL, y1));
    S(r->K->linear_forward(r->dev, rows, ni, 16, x, NULL, w, NULL, b, res + 1, y2 + 1));
    CASE_END;
}

/* The residual without a bias, and in place (res = y, with a bias): the GPU's prefill copies it
 * (fp32, GP_CUDA_EPILOGUE=prefill), cuBLASLt takes it as C with beta 1 (bf16). */
static void c_linear_res(run *r) {
    CASE_BEGIN;
    const int64_t rows = 24, ni = 40, no = 32;
    const float *x = in(r, H(rnd(rows * ni, 1)), rows * ni), *w = in(r, H(rnd(no * ni, 1)), no * ni);
    const float *b = in(r, H(rnd(no, 1)), no), *res = in(r, H(rnd(rows * no, 1)), rows * no);
    float *y1 = out(r, rows * no), *y2 = io(r, H(rnd(rows * no, 1)), rows * no);
    S(r->K->linear_forward(r->dev, rows, ni, no, x, NULL, w, NULL, NULL, res, y1));
    S(r->K->linear_forward(r->dev, rows, ni, no, x, NULL, w, NULL, b, y2, y2));
    CASE_END;
}
static void c_linear_res_bf16(run *r) { bf16(r, c_linear_res); }
static void c_linear_odd_bf16(run *r) { bf16(r, c_linear_odd); }

static void c_layernorm(run *r) {
    CASE_BEGIN;
    const int64_t rows = 300, dim = 130; /* on the GPU, dw and db in three chunks of rows */
    const float *x = in(r, H(rnd(rows * dim, 2)), rows * dim), *w = in(r, H(rnd(dim, 1)), dim);
    const float *b = in(r, H(rnd(dim, 1)), dim), *dy = in(r, H(rnd(rows * dim, 1)), rows * dim);
    float *y = out(r, rows * dim), *st = out(r, 2 * rows);
    float *dx = io(r, H(rnd(rows * dim, 1)), rows * dim); /* dres aliased in place */
    float *dw = io(r, H(rnd(dim, 1)), dim), *db = io(r, H(rnd(dim, 1)), dim);
    S(r->K->layernorm_forward(r->dev, rows, dim, x, w, b, y, NULL, st));
    S(r->K->layernorm_backward(r->dev, rows, dim, x, w, st, dy, dx, dx, dw, db));
    CASE_END;
}

/* Layer norm over rows x dim, forward then backward (no residual gradient). */
static void layernorm_rows(run *r, int64_t rows, int64_t dim) {
    CASE_BEGIN;
    const float *x = in(r, H(rnd(rows * dim, 2)), rows * dim), *w = in(r, H(rnd(dim, 1)), dim);
    const float *b = in(r, H(rnd(dim, 1)), dim), *dy = in(r, H(rnd(rows * dim, 1)), rows * dim);
    float *y = out(r, rows * dim), *st = out(r, 2 * rows), *dx = out(r, rows * dim);
    float *dw = io(r, H(rnd(dim, 1)), dim), *db = io(r, H(rnd(dim, 1)), dim);
    S(r->K->layernorm_forward(r->dev, rows, dim, x, w, b, y, NULL, st));
    S(r->K->layernorm_backward(r->dev, rows, dim, x, w, st, dy, NULL, dx, dw, db));
    CASE_END;
}

/* Rows of 2048 as T3's: 8 floats a thread in the GPU's registers. */
static void c_layernorm_2048(run *r) { layernorm_rows(r, 6, 2048); }

/* Rows long enough for the GPU's register copies of 16 floats a thread (2050) and past them
 * (8200: each pass reads the row again). */
static void c_layernorm_wide(run *r) {
    layernorm_rows(r, 5, 2050);
    layernorm_rows(r, 5, 8200);
}

static void c_gelu(run *r) {
    CASE_BEGIN;
    const int64_t rows = 7, cols = 33, n = rows * cols;
    const float *x = in(r, H(rnd(n, 3)), n), *dy = in(r, H(rnd(n, 1)), n);
    float *y = out(r, n), *dx = out(r, n), *db = io(r, H(rnd(cols, 1)), cols);
    S(r->K->gelu_forward(r->dev, n, x, y, NULL));
    S(r->K->gelu_backward(r->dev, rows, cols, x, dy, dx, db));
    CASE_END;
}

/* One float in: the GPU's one-a-thread paths of GELU and AdamW. */
static void c_unaligned(run *r) {
    CASE_BEGIN;
    const int64_t n = 1001;
    const float *x = in(r, H(rnd(n + 1, 3)), n + 1), *dy = in(r, H(rnd(n + 1, 1)), n + 1);
    float *y = out(r, n + 1), *dx = out(r, n + 1);
    S(r->K->gelu_forward(r->dev, n, x + 1, y + 1, NULL));
    S(r->K->gelu_backward(r->dev, 7, 143, x + 1, dy + 1, dx + 1, NULL));
    float *w = io(r, H(rnd(n + 1, 1)), n + 1), *m = io(r, H(rnd(n + 1, 1)), n + 1);
    float *v = io(r, H(pos(n + 1)), n + 1);
    const gp_adamw_step st = {.decay = 0.999f, .beta1 = 0.9f, .beta2 = 0.999f, .eps = 1e-8f,
                              .step_size = 0.01f, .bc2_sqrt = 0.05f};
    S(r->K->adamw_update(r->dev, n, w + 1, dy + 1, m + 1, v + 1, &st));
    CASE_END;
}

static void c_dropout(run *r) {
    CASE_BEGIN;
    const int64_t n = 5003;
    const gp_rng_stream s = {.seed = 99, .purpose = GP_RNG_DROPOUT, .a = 3, .b = 7, .c = 1};
    const float *x = in(r, H(rnd(n, 1)), n), *res = in(r, H(rnd(n, 1)), n);
    float *y = out(r, n), *y2 = out(r, n);
    S(r->K->dropout(r->dev, &s, 0.3f, n, x, NULL, y));
    S(r->K->dropout(r->dev, &s, 0.3f, n, x, res, y2));
    CASE_END;
}

/* Attention forward then backward. probs holds what the forward leaves its backward, the device's
 * own (kernel_ops.def): compared only where both devices keep the probabilities (private: a
 * bf16 GPU's fused kernels keep each row's log-sum-exp there). */
static void attention_case(run *r, gp_attn_dims d, bool with_bias, bool private_probs) {
    CASE_BEGIN;
    const int64_t nq = d.batch * d.seq * 3 * d.dim, na = d.batch * d.seq * d.dim;
    const float *qkv = in(r, H(rnd(nq, 1)), nq), *datt = in(r, H(rnd(na, 1)), na);
    float *probs = out(r, r->K->attention_saved(r->dev, &d));
    if (private_probs) r->input[r->nb - 1] = true;
    float *att = out(r, na), *dqkv = out(r, nq);
    float *dbias = with_bias ? io(r, H(rnd(3 * d.dim, 1)), 3 * d.dim) : NULL;
    float *ws = out(r, r->K->attention_backward_ws(r->dev, &d));
    r->input[r->nb - 1] = true; /* the workspace: not compared */
    S(r->K->attention_forward(r->dev, &d, qkv, probs, att, NULL));
    S(r->K->attention_backward(r->dev, &d, qkv, probs, att, NULL, datt, dqkv, dbias, ws));
    CASE_END;
}

static void c_attention(run *r) {
    attention_case(r, (gp_attn_dims){.batch = 2, .seq = 70, .dim = 32, .heads = 4}, true, false);
}

/* Rows of seq floats: 600 (the GPU's softmax kernels with 32 registers a lane, as T3's 1024) and
 * past 1024 (no register copies: each pass reads the row). */
static void c_attention_600(run *r) {
    attention_case(r, (gp_attn_dims){.batch = 1, .seq = 600, .dim = 8, .heads = 2}, false, false);
}
static void c_attention_1030(run *r) {
    attention_case(r, (gp_attn_dims){.batch = 1, .seq = 1030, .dim = 8, .heads = 2}, false, false);
}

/* Head sizes of 32 and of 128 (T3's) in bf16: the GPU's fused kernels (flash_attention.cu), over
 * two and four tiles of 64 queries, the last short. */
static void c_attention_fused_32(run *r) {
    S(gp_device_set_precision(r->dev, GP_PRECISION_BF16));
    attention_case(r, (gp_attn_dims){.batch = 2, .seq = 100, .dim = 64, .heads = 2}, true, true);
    S(gp_device_set_precision(r->dev, GP_PRECISION_FP32));
}
static void c_attention_fused_128(run *r) {
    S(gp_device_set_precision(r->dev, GP_PRECISION_BF16));
    attention_case(r, (gp_attn_dims){.batch = 1, .seq = 200, .dim = 256, .heads = 2}, false, true);
    S(gp_device_set_precision(r->dev, GP_PRECISION_FP32));
}

static void c_linear_bf16(run *r) { bf16(r, c_linear); }
/* Attention also rounds P and dS, which each device computes in fp32 with its own order of
 * sums: where the two straddle a bf16 rounding boundary they round a bf16 step apart (2^-7 of
 * the element at most), hence TOL_ATTN_BF16 for this case. */
static void c_attention_bf16(run *r) { bf16(r, c_attention); }
#define TOL_ATTN_BF16 (1.0 / 128)

/* n bf16 values (n even) of output, not compared themselves: where the devices' fp32 values
 * straddle a rounding boundary they are a bf16 step apart, which the products that read them
 * show within TOL_ATTN_BF16. */
static uint16_t *out16(run *r, int64_t n) {
    uint16_t *p = (uint16_t *)out(r, n / 2);
    r->input[r->nb - 1] = true;
    return p;
}

/* The Transformer block's activations kept in bf16 (kernel_ops.def): layer norm's and GELU's
 * outputs written in bf16 by the GPU's kernels, then read as the linear ops' x16 (cuBLAS's
 * bf16 operand as it is); the products compared. */
static void c_bf16_operands(run *r) {
    CASE_BEGIN;
    S(gp_device_set_precision(r->dev, GP_PRECISION_BF16));
    const int64_t rows = 24, dim = 64, no = 16, n = rows * dim;
    const float *x = in(r, H(rnd(n, 2)), n), *w = in(r, H(rnd(dim, 1)), dim);
    const float *b = in(r, H(rnd(dim, 1)), dim), *wl = in(r, H(rnd(no * dim, 1)), no * dim);
    const float *dy = in(r, H(rnd(rows * no, 1)), rows * no);
    uint16_t *y16 = out16(r, n), *g16 = out16(r, n), *g16u = out16(r, n + 8);
    float *st = out(r, 2 * rows), *y1 = out(r, rows * no), *y2 = out(r, rows * no);
    float *y3 = out(r, rows * no), *dx = out(r, n), *dw = io(r, H(rnd(no * dim, 1)), no * dim);
    S(r->K->layernorm_forward(r->dev, rows, dim, x, w, b, NULL, y16, st));
    S(r->K->linear_forward(r->dev, rows, dim, no, NULL, y16, wl, NULL, b, NULL, y1));
    S(r->K->linear_backward(r->dev, rows, dim, no, NULL, y16, wl, NULL, dy, dx, dw, NULL));
    S(r->K->gelu_forward(r->dev, n, x, NULL, g16));
    S(r->K->linear_forward(r->dev, rows, dim, no, NULL, g16, wl, NULL, NULL, NULL, y2));
    /* one element in: GELU's one-a-thread path */
    S(r->K->gelu_forward(r->dev, n, x, NULL, g16u + 1));
    S(r->K->linear_forward(r->dev, rows, dim, no, NULL, g16u + 1, wl, NULL, NULL, NULL, y3));
    S(gp_device_set_precision(r->dev, GP_PRECISION_FP32));
    CASE_END;
}

/* bf16_store's bits are the CPU's (one rounding rule, core/bf16.h): an odd count (the tail past
 * whole vectors), specials among the values, and a source and destination off their vectors'
 * alignment. */
static void c_bf16_store(run *r) {
    CASE_BEGIN;
    const int64_t n = 1029;
    float *h = H(rnd(n + 1, 1));
    const float special[] = {1.00390625f, -0.0f, INFINITY, NAN, 1e-40f, -3.0e38f};
    for (int i = 0; i < 6; i++) h[i * 7] = special[i];
    const float *x = in(r, h, n + 1);
    uint16_t *y = out16(r, n + 1), *yu = out16(r, n + 3);
    r->input[r->nb - 1] = r->input[r->nb - 2] = false; /* compared, bit for bit */
    S(r->K->bf16_store(r->dev, x, y, n));
    S(r->K->bf16_store(r->dev, x + 1, yu + 1, n));
    CASE_END;
}

/* The same bits on one device, or a failure counted. */
static void check_same_here(run *r, const float *a, const float *b, int64_t n, const char *what) {
    float *ha = malloc((size_t)n * 4), *hb = malloc((size_t)n * 4);
    if (!ha || !hb) exit(1);
    REQUIRE_OK(gp_device_sync(r->dev));
    REQUIRE_OK(gp_device_copy(r->dev, ha, a, (size_t)n * 4, GP_COPY_DEVICE_TO_HOST));
    REQUIRE_OK(gp_device_copy(r->dev, hb, b, (size_t)n * 4, GP_COPY_DEVICE_TO_HOST));
    if (memcmp(ha, hb, (size_t)n * 4) != 0) {
        fprintf(stderr, "%s on %s: %s, not the bits of the same op given w\n", g_case,
                gp_device_name(r->dev), what);
        gp_test_failures++;
    }
    free(ha), free(hb);
}

/* The store's bf16 weight copy (kernel_ops.def's w16): the linear ops given w16 = bf16_store(w)
 * in place of w give, on each device, the bits of the same ops given w; compared with the CPU. */
static void c_weight16(run *r) {
    CASE_BEGIN;
    S(gp_device_set_precision(r->dev, GP_PRECISION_BF16));
    const int64_t rows = 24, ni = 64, no = 48;
    const float *x = in(r, H(rnd(rows * ni, 1)), rows * ni), *b = in(r, H(rnd(no, 1)), no);
    const float *w = in(r, H(rnd(no * ni, 1)), no * ni);
    const float *dy = in(r, H(rnd(rows * no, 1)), rows * no);
    const float *dw0 = H(rnd(no * ni, 1));
    uint16_t *w16 = out16(r, no * ni);
    float *y1 = out(r, rows * no), *y2 = out(r, rows * no), *dx1 = out(r, rows * ni);
    float *dx2 = out(r, rows * ni), *dw1 = io(r, dw0, no * ni), *dw2 = io(r, dw0, no * ni);
    S(r->K->bf16_store(r->dev, w, w16, no * ni));
    S(r->K->linear_forward(r->dev, rows, ni, no, x, NULL, w, NULL, b, NULL, y1));
    S(r->K->linear_forward(r->dev, rows, ni, no, x, NULL, NULL, w16, b, NULL, y2));
    S(r->K->linear_backward(r->dev, rows, ni, no, x, NULL, w, NULL, dy, dx1, dw1, NULL));
    S(r->K->linear_backward(r->dev, rows, ni, no, x, NULL, NULL, w16, dy, dx2, dw2, NULL));
    check_same_here(r, y2, y1, rows * no, "linear_forward with w16");
    check_same_here(r, dx2, dx1, rows * ni, "linear_backward's dx with w16");
    check_same_here(r, dw2, dw1, no * ni, "linear_backward's dw with w16");
    S(gp_device_set_precision(r->dev, GP_PRECISION_FP32));
    CASE_END;
}

/* Attention's output kept in bf16: made so (the GPU's fused kernels write it; otherwise an
 * example's fp32 output is rounded), read by the projection's product, and by the fused
 * backward for its D. */
static void attention16_case(run *r, gp_attn_dims d) {
    CASE_BEGIN;
    S(gp_device_set_precision(r->dev, GP_PRECISION_BF16));
    const int64_t nq = d.batch * d.seq * 3 * d.dim, na = d.batch * d.seq * d.dim;
    const float *qkv = in(r, H(rnd(nq, 1)), nq), *datt = in(r, H(rnd(na, 1)), na);
    const float *wp = in(r, H(rnd(d.dim * d.dim, 1)), d.dim * d.dim);
    float *probs = out(r, r->K->attention_saved(r->dev, &d));
    r->input[r->nb - 1] = true; /* the device's own */
    uint16_t *att16 = out16(r, na);
    float *y = out(r, na), *dqkv = out(r, nq);
    float *ws = out(r, r->K->attention_backward_ws(r->dev, &d));
    r->input[r->nb - 1] = true; /* the workspace: not compared */
    S(r->K->attention_forward(r->dev, &d, qkv, probs, NULL, att16));
    S(r->K->linear_forward(r->dev, d.batch * d.seq, d.dim, d.dim, NULL, att16, wp, NULL, NULL,
                           NULL, y));
    S(r->K->attention_backward(r->dev, &d, qkv, probs, NULL, att16, datt, dqkv, NULL, ws));
    S(gp_device_set_precision(r->dev, GP_PRECISION_FP32));
    CASE_END;
}
static void c_attention16(run *r) {
    attention16_case(r, (gp_attn_dims){.batch = 2, .seq = 70, .dim = 32, .heads = 4});
}
static void c_attention16_fused(run *r) {
    attention16_case(r, (gp_attn_dims){.batch = 1, .seq = 200, .dim = 256, .heads = 2});
}

static void c_embedding(run *r) {
    CASE_BEGIN;
    const int64_t n = 300, len = 30, dim = 20, vocab = 50;
    const int32_t *id = in_i(r, H(ids(n, vocab, false)), n);
    const float *w = in(r, H(rnd(vocab * dim, 1)), vocab * dim), *dy = in(r, H(rnd(n * dim, 1)), n * dim);
    float *y = out(r, n * dim), *dw = io(r, H(rnd(vocab * dim, 1)), vocab * dim);
    float *ys = out(r, n * dim), *dws = io(r, H(rnd(20 * dim, 1)), 20 * dim);
    S(r->K->embedding_forward(r->dev, n, len, dim, vocab, id, w, y));
    S(r->K->embedding_backward(r->dev, n, len, dim, vocab, id, dy, dw));
    S(r->K->embedding_shard_forward(r->dev, n, len, dim, vocab, 15, 20, id, w, ys));
    S(r->K->embedding_shard_backward(r->dev, n, len, dim, vocab, 15, 20, id, dy, dws));
    CASE_END;
}

static void c_pos_embedding(run *r) {
    CASE_BEGIN;
    const int64_t B = 3, T = 11, D = 24;
    const float *x = in(r, H(rnd(B * T * D, 1)), B * T * D), *w = in(r, H(rnd(T * D, 1)), T * D);
    float *y = out(r, B * T * D), *dw = io(r, H(rnd(T * D, 1)), T * D);
    S(r->K->pos_embedding_forward(r->dev, B, T, D, x, w, y));
    S(r->K->pos_embedding_backward(r->dev, B, T, D, x, dw));
    CASE_END;
}

static void c_softmax_xent(run *r) {
    CASE_BEGIN;
    const int64_t rows = 9, classes = 37;
    const float *x = in(r, H(rnd(rows * classes, 3)), rows * classes);
    const int32_t *lab = in_i(r, H(ids(rows, classes, true)), rows);
    float *d = out(r, rows * classes);
    S(r->K->softmax_xent(r->dev, rows, classes, x, lab, 7.0, 0.0, scalar(r), d));
    S(r->K->softmax_xent(r->dev, rows, classes, x, lab, 7.0, 0.0, scalar(r), NULL));
    float *ds = out(r, rows * classes); /* smoothed targets */
    S(r->K->softmax_xent(r->dev, rows, classes, x, lab, 7.0, 0.1, scalar(r), ds));
    CASE_END;
}

static void c_xent_shards(run *r) {
    CASE_BEGIN;
    const int64_t rows = 9, classes = 13, vocab = 40, first = 20;
    const float *x = in(r, H(rnd(rows * classes, 3)), rows * classes);
    const int32_t *lab = in_i(r, H(ids(rows, vocab, true)), rows);
    float *mx = out(r, rows), *sums = out(r, 2 * rows), *d = out(r, rows * classes);
    S(r->K->row_max(r->dev, rows, classes, x, mx));
    S(r->K->xent_shard_sums(r->dev, rows, classes, vocab, first, x, lab, mx, 0.0, sums));
    S(r->K->xent_shard_finish(r->dev, rows, classes, vocab, first, x, lab, mx, sums, 5.0, 0.0,
                              scalar(r), d));
    float *sums3 = out(r, 3 * rows), *ds = out(r, rows * classes); /* smoothed */
    S(r->K->xent_shard_sums(r->dev, rows, classes, vocab, first, x, lab, mx, 0.1, sums3));
    S(r->K->xent_shard_finish(r->dev, rows, classes, vocab, first, x, lab, mx, sums3, 5.0, 0.1,
                              scalar(r), ds));
    CASE_END;
}

static void c_conv(run *r, gp_conv_geom g) {
    CASE_BEGIN;
    const int64_t B = 4, OC = 5;
    const int64_t nx = B * g.channels * g.height * g.width, nw = OC * g.channels * g.kernel * g.kernel;
    const int64_t ny = B * OC * g.out_h * g.out_w;
    const float *x = in(r, H(rnd(nx, 1)), nx), *w = in(r, H(rnd(nw, 1)), nw);
    const float *dy = in(r, H(rnd(ny, 1)), ny), *bias = in(r, H(rnd(OC, 1)), OC);
    float *y = out(r, ny), *dx = out(r, nx), *dw = io(r, H(rnd(nw, 1)), nw);
    float *db = io(r, H(rnd(OC, 1)), OC);
    const int64_t nws = r->K->conv2d_ws(r->dev, &g, B, OC, true, true);
    const int64_t fws = r->K->conv2d_ws(r->dev, &g, B, OC, false, false);
    float *ws = out(r, nws > fws ? nws : fws);
    S(r->K->conv2d_forward(r->dev, &g, B, OC, x, w, NULL, y, ws));
    S(r->K->channel_bias_add(r->dev, B, OC, g.out_h * g.out_w, bias, y));
    S(r->K->conv2d_backward(r->dev, &g, B, OC, x, w, NULL, dy, dx, dw, ws));
    S(r->K->channel_bias_grad(r->dev, B, OC, g.out_h * g.out_w, dy, db));
    r->input[r->nb - 1] = true; /* the workspace: not compared */
    CASE_END;
}

static void c_conv_strided(run *r) {
    c_conv(r, (gp_conv_geom){.channels = 3, .height = 9, .width = 7, .kernel = 3, .stride = 2,
                             .pad = 1, .out_h = 5, .out_w = 4});
}
static void c_conv_same(run *r) {
    c_conv(r, (gp_conv_geom){.channels = 2, .height = 6, .width = 6, .kernel = 3, .stride = 1,
                             .pad = 1, .out_h = 6, .out_w = 6});
}
static void c_conv_direct(run *r) {
    c_conv(r, (gp_conv_geom){.channels = 6, .height = 5, .width = 3, .kernel = 1, .stride = 1,
                             .pad = 0, .out_h = 5, .out_w = 3});
}

static void c_batchnorm(run *r, bool batch_stats) {
    CASE_BEGIN;
    const gp_bn_dims d = {.batch = 3, .channels = 4, .hw = 37, .eps = 1e-5, .momentum = 0.1};
    const int64_t n = d.batch * d.channels * d.hw;
    const float *x = in(r, H(rnd(n, 2)), n), *dy = in(r, H(rnd(n, 1)), n);
    const float *gm = in(r, H(rnd(4, 1)), 4), *bt = in(r, H(rnd(4, 1)), 4);
    float *rm = io(r, H(rnd(4, 1)), 4), *rv = io(r, H(pos(4)), 4);
    float *st = out(r, 8), *y = out(r, n), *dx = out(r, n);
    float *dg = io(r, H(rnd(4, 1)), 4), *dbt = io(r, H(rnd(4, 1)), 4);
    S(r->K->batchnorm_forward(r->dev, &d, x, gm, bt, rm, rv, batch_stats, batch_stats, st, y));
    S(r->K->batchnorm_backward(r->dev, &d, x, dy, st, gm, batch_stats, dx, dg, dbt));
    CASE_END;
}
static void c_bn_batch(run *r) { c_batchnorm(r, true); }
static void c_bn_running(run *r) { c_batchnorm(r, false); }

static void c_maxpool(run *r) {
    CASE_BEGIN;
    const gp_pool_dims d = {.planes = 6, .height = 9, .width = 8, .out_h = 4, .out_w = 3,
                            .kernel = 3, .stride = 2};
    const int64_t n = d.planes * d.height * d.width, no = d.planes * d.out_h * d.out_w;
    float *xh = H(rnd(n, 1));
    for (int64_t i = 0; i < n; i += 7) xh[i] = 0.5f; /* ties */
    const float *x = in(r, xh, n), *dy = in(r, H(rnd(no, 1)), no);
    float *y = out(r, no), *dx = out(r, n);
    int32_t *am = out_i(r, no);
    S(r->K->maxpool_forward(r->dev, &d, x, y, am));
    S(r->K->maxpool_backward(r->dev, &d, am, dy, dx));
    CASE_END;
}

static void c_avgpool(run *r) {
    CASE_BEGIN;
    const int64_t planes = 10, hw = 49;
    const float *x = in(r, H(rnd(planes * hw, 1)), planes * hw), *dy = in(r, H(rnd(planes, 1)), planes);
    float *y = out(r, planes), *dx = out(r, planes * hw);
    S(r->K->avgpool_forward(r->dev, planes, hw, x, y));
    S(r->K->avgpool_backward(r->dev, planes, hw, dy, dx));
    CASE_END;
}

static void c_optim(run *r) {
    CASE_BEGIN;
    const int64_t n = 1001;
    const float *g = in(r, H(rnd(n, 1)), n);
    float *w1 = io(r, H(rnd(n, 1)), n), *buf = io(r, H(rnd(n, 1)), n), *w2 = io(r, H(rnd(n, 1)), n);
    float *w3 = io(r, H(rnd(n, 1)), n), *m = io(r, H(rnd(n, 1)), n), *v = io(r, H(pos(n)), n);
    const gp_adamw_step st = {.decay = 0.999f, .beta1 = 0.9f, .beta2 = 0.999f, .eps = 1e-8f,
                              .step_size = 0.01f, .bc2_sqrt = 0.05f};
    S(r->K->sgd_update(r->dev, n, w1, g, buf, 0.1f, 1e-4f, 0.9f));
    S(r->K->sgd_update(r->dev, n, w2, g, NULL, 0.1f, 1e-4f, 0.0f));
    S(r->K->adamw_update(r->dev, n, w3, g, m, v, &st));
    CASE_END;
}

typedef struct named_case {
    const char *name;
    bool exact;
    case_fn fn;
    double tol; /* the bound of what is not exact */
} named_case;

static const named_case cases[] = {
    {"gemm (no transposes)", false, c_gemm_nn, TOL},
    {"gemm (B transposed)", false, c_gemm_nt, TOL},
    {"gemm (A transposed)", false, c_gemm_tn, TOL},
    {"gemm (both transposed)", false, c_gemm_tt, TOL},
    {"gemm_batched", false, c_gemm_batched, TOL},
    {"gemm, operands not aligned", false, c_gemm_offset, TOL},
    {"gemm bf16, operands not aligned", false, c_gemm_offset_bf16, TOL},
    {"gemm bf16 (no transposes)", false, c_gemm_nn_bf16, TOL},
    {"gemm bf16 (both transposed)", false, c_gemm_tt_bf16, TOL},
    {"gemm_batched bf16", false, c_gemm_batched_bf16, TOL},
    {"linear forward/backward bf16", false, c_linear_bf16, TOL},
    {"linear bf16, odd sizes, not aligned", false, c_linear_odd_bf16, TOL},
    {"linear bf16, residual alone and in place", false, c_linear_res_bf16, TOL},
    {"attention forward/backward bf16", false, c_attention_bf16, TOL_ATTN_BF16},
    {"attention bf16, head size 32 (fused)", false, c_attention_fused_32, TOL_ATTN_BF16},
    {"attention bf16, head size 128 (fused)", false, c_attention_fused_128, TOL_ATTN_BF16},
    {"bf16 operands: layernorm, gelu, linear", false, c_bf16_operands, TOL_ATTN_BF16},
    {"bf16 att: attention, projection", false, c_attention16, TOL_ATTN_BF16},
    {"bf16_store", true, c_bf16_store, TOL},
    {"linear with the weight's bf16 copy", false, c_weight16, TOL},
    {"bf16 att: fused attention, projection", false, c_attention16_fused, TOL_ATTN_BF16},
    {"fill, scale, axpy", false, c_vector, TOL},
    {"sum_rows_add", false, c_sum_rows, TOL},
    {"sumsq", false, c_sumsq, TOL},
    {"relu forward/backward", true, c_relu, TOL},
    {"linear forward/backward", false, c_linear, TOL},
    {"linear, rows not of 4 floats", false, c_linear_odd, TOL},
    {"linear, residual alone and in place", false, c_linear_res, TOL},
    {"layernorm forward/backward", false, c_layernorm, TOL},
    {"layernorm, rows of 2048", false, c_layernorm_2048, TOL},
    {"layernorm, rows of 2050 and 8200", false, c_layernorm_wide, TOL},
    {"gelu forward/backward", false, c_gelu, TOL},
    {"gelu and adamw, not aligned", false, c_unaligned, TOL},
    {"dropout", true, c_dropout, TOL},
    {"attention forward/backward", false, c_attention, TOL},
    {"attention, rows of 600", false, c_attention_600, TOL},
    {"attention, rows of 1030", false, c_attention_1030, TOL},
    {"embedding (whole and shard)", true, c_embedding, TOL},
    {"pos_embedding forward/backward", false, c_pos_embedding, TOL},
    {"softmax_xent", false, c_softmax_xent, TOL},
    {"row_max, xent_shard_sums/finish", false, c_xent_shards, TOL},
    {"conv2d 3x3 stride 2 + biases", false, c_conv_strided, TOL},
    {"conv2d 3x3 same + biases", false, c_conv_same, TOL},
    {"conv2d 1x1 + biases", false, c_conv_direct, TOL},
    {"batchnorm (batch statistics)", false, c_bn_batch, TOL},
    {"batchnorm (running statistics)", false, c_bn_running, TOL},
    {"maxpool forward/backward", true, c_maxpool, TOL},
    {"avgpool forward/backward", false, c_avgpool, TOL},
    {"sgd_update, adamw_update", false, c_optim, TOL},
};

/* The columns calls and after idle of the profile table's row for `name`; false if it has none. */
static bool profile_row(const char *table, const char *name, long long *calls,
                        long long *after_idle) {
    const size_t len = strlen(name);
    for (const char *l = table; l; l = strchr(l, '\n'), l = l ? l + 1 : NULL)
        if (strncmp(l, name, len) == 0 && l[len] == ' ' &&
            sscanf(l + len, "%lld %*f %*f %*f %*f%% %lld", calls, after_idle) == 2)
            return true;
    return false;
}

/* GP_CUDA_PROFILE=1 when a device is made: its results are still the CPU's, and when it is freed
 * it prints a table to stderr (caught here in a file) that counts every kernel launch, cuBLAS
 * call and fill; the first after each wait for the GPU (copies from the host wait) is one of
 * those "after idle", the others may be (tiny kernels can be done before the next is queued). */
static void check_profile(gp_device *cpu) {
    setenv("GP_CUDA_PROFILE", "1", 1);
    gp_device *gpu;
    REQUIRE_OK(gp_device_cuda_new("cuda-profiled", 0, &gpu));
    unsetenv("GP_CUDA_PROFILE");
    check_case(cpu, gpu, "profiled: gemm", false, TOL, c_gemm_nn);
    check_case(cpu, gpu, "profiled: sumsq", false, TOL, c_sumsq);
    check_case(cpu, gpu, "profiled: relu", true, TOL, c_relu);
    fflush(stderr);
    FILE *f = tmpfile();
    const int saved = dup(2);
    if (!f || saved < 0 || dup2(fileno(f), 2) < 0) {
        fprintf(stderr, "test_kernels_cuda: cannot send stderr to a file\n");
        exit(1);
    }
    gp_device_free(gpu);
    fflush(stderr);
    dup2(saved, 2);
    close(saved);
    static char table[65536];
    rewind(f);
    table[fread(table, 1, sizeof table - 1, f)] = '\0';
    fclose(f);
    fputs(table, stdout);
    long long total_calls = -1;
    double timed_ms = -1, idle_ms = -1;
    const char *head = strstr(table, "GP_CUDA_PROFILE device cuda-profiled (GPU 0): ");
    CHECK(head && sscanf(strchr(head, ':') + 1, "%lld calls, %lf ms timed, %lf ms after idle",
                         &total_calls, &timed_ms, &idle_ms) == 3);
    CHECK(total_calls > 0 && timed_ms >= 0 && idle_ms >= 0 && timed_ms + idle_ms > 0);
    /* Each case runs twice on the GPU. The GEMM and the first sumsq kernel come first after the
     * copies of their inputs, each waited for, as do the fills of relu's first output. */
    static const struct {
        const char *name;
        long long calls, first;
    } want[] = {
        {"cublasSgemm", 2, 2},        {"sumsq_blocks_kernel", 2, 2}, {"sumsq_total_kernel", 2, 0},
        {"cudaMemsetAsync", 4, 2},    {"relu_kernel", 2, 0},         {"relu_back_kernel", 2, 0},
    };
    for (size_t i = 0; i < sizeof want / sizeof want[0]; i++) {
        long long calls = -1, after_idle = -1;
        if (!profile_row(table, want[i].name, &calls, &after_idle) || calls != want[i].calls ||
            after_idle < want[i].first || after_idle > calls) {
            fprintf(stderr,
                    "profile: %s: %lld calls, %lld after idle; expected %lld calls, %lld to %lld "
                    "after idle\n",
                    want[i].name, calls, after_idle, want[i].calls, want[i].first, want[i].calls);
            gp_test_failures++;
        }
    }
}

int main(void) {
    int count = 0;
    if (gp_cuda_device_count(&count) != GP_OK) {
        printf("SKIP: %s\n", gp_last_error());
        return 77;
    }
    gp_device *cpu, *gpu;
    REQUIRE_OK(gp_device_cpu_new("cpu", &cpu));
    REQUIRE_OK(gp_device_cuda_new("cuda0", 0, &gpu));
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
        check_case(cpu, gpu, cases[i].name, cases[i].exact, cases[i].tol, cases[i].fn);
    /* A bad id is refused with the CPU's message, before anything is written. */
    int32_t bad[3] = {1, 7, 2};
    int32_t *dbad = gp_device_alloc(gpu, GP_MEM_WORKSPACE, sizeof bad, NULL);
    float *dw = gp_device_alloc(gpu, GP_MEM_WORKSPACE, 3 * 4 * sizeof(float), NULL);
    REQUIRE_OK(gp_device_copy(gpu, dbad, bad, sizeof bad, GP_COPY_HOST_TO_DEVICE));
    CHECK_FAILS(gp_kernels_of(gpu)->embedding_forward(gpu, 3, 3, 4, 5, dbad, dw, dw),
                GP_INVALID_ARGUMENT, "token id 7 at position 1 (row 0, column 1)");
    gp_device_release(gpu, dbad);
    gp_device_release(gpu, dw);
    gp_mem_stats st;
    gp_device_mem_stats(gpu, &st);
    CHECK_EQ_INT(st.live_total, 0);
    gp_device_free(gpu);
    check_profile(cpu);
    gp_device_free(cpu);
    return gp_test_finish("test_kernels_cuda");
}
