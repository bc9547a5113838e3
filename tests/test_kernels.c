/* Tests of every device's kernel op table (kernels/kernels.h), in the manner of ggml's
 * test-backend-ops: for each device in `devices` below and each op of the table, inputs drawn
 * from a fixed seed over several shapes, awkward ones included (sizes 1, odd sizes, sizes that
 * are not multiples of 16, transposes, leading dimensions longer than the rows, strided and
 * interleaved batches, T on both sides of the attention kernel's 64-row block, strided and
 * padded convolutions, overlapping pooling windows, ties), are made on the host, copied to the
 * device, run through the op twice (the two results must be bit-identical) and copied back, then
 * compared with a plain-C reference written here, in double:
 *
 *   |got - ref| <= 1e-5 (|ref| + mag)
 *
 * where mag is the magnitude of the operands the value is made from (the sum of the absolute
 * values of the terms of a sum, and so on): float32 rounding errors scale with that, not with
 * a result that may cancel to near zero. Copies, selections and single roundings are compared
 * exactly, the optimizer updates against their documented formulas in float. Every device
 * buffer has guard words on both sides (a write outside an output fails), outputs the op must
 * write start as NaN (an element left unwritten fails) and inputs must come back unchanged.
 * The log has one line per op with the worst relative error seen. */
#include <float.h>
#include <math.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "core/bf16.h"
#include "core/device.h"
#include "kernels/cpu/conv_direct.h"
#include "kernels/cpu/conv_geom.h"
#include "kernels/cpu/conv_path.h"
#include "kernels/cpu/conv_winograd.h"
#include "kernels/cpu/cpu_kernels.h"
#include "kernels/kernels.h"
#include "testutil.h"

/* ---------------------------------------------------------- devices under test */

/* Every device here runs every op test below, each made with its constructor under the name
 * given: a new device (a CUDA GPU) joins the whole test by adding one line. */
typedef struct test_device {
    const char *name;
    gp_status (*make)(const char *name, gp_device **out);
    /* -1, or the index in devices[] of a device whose results this one must equal bit for bit
     * (the CPU on any number of threads: its splits never change a sum's order), except in the
     * ops of gemm_split_ops */
    int same_bits_as;
    /* A device this machine or build may lack (a GPU): a constructor's GP_UNSUPPORTED skips it,
     * with the reason printed, instead of failing the test. */
    bool optional;
} test_device;

/* Three threads that split every op however small (the thresholds for waking threads are
 * ignored), so that the cases below, sized for the reference, run the threaded paths. */
static gp_status cpu_three_eager(const char *name, gp_device **out) {
    GP_TRY(gp_device_cpu_new_threads(name, 3, out));
    gp_cpu_pool_set_eager(gp_cpu_pool_of(*out), true);
    return GP_OK;
}

/* ThreadSanitizer's build runs the devices with threads alone: one thread has nothing to race,
 * and the convolutions' cases on it took half of that run's longest test. */
#if defined(__SANITIZE_THREAD__)
#define GP_TEST_UNDER_TSAN 1
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define GP_TEST_UNDER_TSAN 1
#endif
#endif

static gp_status cpu_one_thread(const char *name, gp_device **out) {
#ifdef GP_TEST_UNDER_TSAN
    (void)name, (void)out;
    return gp_error(GP_UNSUPPORTED, "ThreadSanitizer: the devices with threads only");
#else
    return gp_device_cpu_new(name, out);
#endif
}

static gp_status cuda_first_gpu(const char *name, gp_device **out) {
    return gp_device_cuda_new(name, 0, out);
}

/* The CPU kernels' other variants (kernels/cpu/isa.h), "cpu-<variant>", on one thread as the
 * "cpu" device is: skipped where this build or CPU lacks one, for the one "cpu" runs, and in
 * the sanitizer builds' shortened runs (GP_TEST_QUICK), where they would double the test's
 * minutes to run the same source again, compiled for other instructions. */
static gp_status cpu_variant(const char *name, gp_device **out) {
    if (getenv("GP_TEST_QUICK"))
        return gp_error(GP_UNSUPPORTED, "GP_TEST_QUICK: the variant in use only");
    const gp_cpu_variant *v;
    const gp_status s = gp_cpu_isa_find(name + strlen("cpu-"), gp_cpu_features(), &v);
    if (s != GP_OK) return gp_error(GP_UNSUPPORTED, "%s", gp_last_error());
    if (v == gp_cpu_isa_active())
        return gp_error(GP_UNSUPPORTED, "the variant the device \"cpu\" runs");
    return gp_device_cpu_new_isa(name, 1, v, out);
}

static const test_device devices[] = {
    {"cpu", cpu_one_thread, -1, true},
    {"cpu-3-threads", cpu_three_eager, 0, false},
    {"cuda", cuda_first_gpu, -1, true},
    {"cpu-native", cpu_variant, 0, true},
    {"cpu-avx512", cpu_variant, 0, true},
    {"cpu-avx2", cpu_variant, 0, true},
    {"cpu-baseline", cpu_variant, 0, true},
};
#define NDEV ((int)(sizeof devices / sizeof devices[0]))

/* Ops that cut a GEMM into one OpenBLAS call per thread: OpenBLAS rounds some elements
 * differently by where a call's block starts, so these give the same bits for the same thread
 * count only (gemm.c). */
static const char *const gemm_split_ops[] = {"gemm", "gemm_batched", "linear_forward",
                                             "linear_backward"};

static bool splits_gemms(const char *op) {
    for (size_t i = 0; i < sizeof gemm_split_ops / sizeof gemm_split_ops[0]; i++)
        if (strcmp(op, gemm_split_ops[i]) == 0) return true;
    return false;
}

/* ------------------------------------------------------------------- settings */

#define SEED 0x6b65726e656c73ULL
#define TOL 1e-5     /* relative to |ref| + mag: float32 against a double reference */
#define GUARD 16     /* guard words each side of a device buffer (64 bytes: alignment kept) */
#define MAX_SHOWN 5  /* failures printed per check */
#define LL(x) ((long long)(x))

static const uint32_t GUARD_BITS = 0x7fc0dead; /* a NaN in the guard words */
static const uint32_t UNSET_BITS = 0x7fc0beef; /* a NaN in outputs before the op writes them */
static const float PAD = -999.25f;             /* padding of gemm outputs: must stay */

/* ------------------------------------------------------------ per-op bookkeeping */

typedef struct op_stats {
    int cases;
    long long compared, exact; /* values within the tolerance / checked exactly */
    double worst;              /* worst |got - ref| / (|ref| + mag + FLT_MIN / TOL) */
} op_stats;

#define MAX_OPS 64
static op_stats g_st[MAX_OPS];
static int g_op;           /* index in ops[] of the op under test */
static const char *g_dev;  /* device under test */
static const char *g_name; /* op under test */
static char g_case[256];   /* the case, for messages */

static void fail(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "[%s] %s (%s): ", g_dev, g_name, g_case);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
    gp_test_failures++;
}

/* ------------------------------------------------------------- host scratch */

/* Host arrays of one case, freed when the next case starts (set_case) or the op's test ends. */
#define MAX_HOST 128
static void *g_host[MAX_HOST];
static int g_nhost;

static void *hmem(size_t nbytes) {
    if (g_nhost == MAX_HOST) {
        fprintf(stderr, "test_kernels: more than %d host arrays in one case\n", MAX_HOST);
        exit(1);
    }
    void *p = calloc(nbytes ? nbytes : 1, 1);
    if (!p) {
        fprintf(stderr, "test_kernels: out of host memory\n");
        exit(1);
    }
    return g_host[g_nhost++] = p;
}

static void hfree(void) {
    while (g_nhost) free(g_host[--g_nhost]);
}

static float *fa(int64_t n) { return hmem((size_t)n * sizeof(float)); }
static double *da(int64_t n) { return hmem((size_t)n * sizeof(double)); }
static int32_t *ia(int64_t n) { return hmem((size_t)n * sizeof(int32_t)); }

static void set_case(const char *fmt, ...) {
    hfree();
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(g_case, sizeof g_case, fmt, ap);
    va_end(ap);
    g_st[g_op].cases++;
}

/* ------------------------------------------------------------- random inputs */

/* Each array draws its own test stream, in a fixed order: reproducible. */
static uint32_t g_stream;

static gp_rng_stream next_stream(void) {
    return (gp_rng_stream){.seed = SEED, .purpose = GP_RNG_TEST, .a = 0x4b, .b = ++g_stream};
}

/* Normal(mean, sd^2) values. */
static float *rnd(int64_t n, float sd, float mean) {
    float *x = fa(n);
    gp_rng_stream s = next_stream();
    gp_rng_normal(&s, 0, x, n);
    for (int64_t i = 0; i < n; i++) x[i] = x[i] * sd + mean;
    return x;
}

/* Uniform in [lo, hi). */
static float *rndu(int64_t n, float lo, float hi) {
    float *x = fa(n);
    gp_rng_stream s = next_stream();
    gp_rng_uniform(&s, 0, x, n);
    for (int64_t i = 0; i < n; i++) x[i] = lo + (hi - lo) * x[i];
    return x;
}

/* Integers in [0, hi). */
static int32_t *rndi(int64_t n, int64_t hi) {
    int32_t *x = ia(n);
    gp_rng_stream s = next_stream();
    for (int64_t i = 0; i < n; i++) x[i] = (int32_t)(gp_rng_u64(&s, (uint64_t)i) % (uint64_t)hi);
    return x;
}

/* A float product / quotient rounded to float on its own (never fused into an add). */
static float mulr(float a, float b) {
    volatile float p = a * b;
    return p;
}

static float divr(float a, float b) {
    volatile float q = a / b;
    return q;
}

/* ------------------------------------------------------------ device buffers */

/* One case's device buffers: n 32-bit words with GUARD words each side. init holds what was
 * copied up, guards included. */
typedef struct dbuf {
    unsigned char *base;
    int64_t n;
    uint32_t *init;
    bool input; /* the op must not change it */
} dbuf;

#define MAX_BUFS 32
typedef struct kt {
    gp_device *dev;
    int rep; /* 0 or 1: the two runs compared for determinism */
    int nb;
    dbuf b[MAX_BUFS];
} kt;

/* Everything each run copied back, byte for byte, to compare the two runs. */
static unsigned char *g_rec[2];
static size_t g_len[2], g_cap[2];

static void rec_add(int rep, const void *p, size_t nbytes) {
    if (g_len[rep] + nbytes > g_cap[rep]) {
        size_t cap = g_cap[rep] ? g_cap[rep] : 4096;
        while (cap < g_len[rep] + nbytes) cap *= 2;
        unsigned char *q = realloc(g_rec[rep], cap);
        if (!q) {
            fprintf(stderr, "test_kernels: out of host memory\n");
            exit(1);
        }
        g_rec[rep] = q;
        g_cap[rep] = cap;
    }
    memcpy(g_rec[rep] + g_len[rep], p, nbytes);
    g_len[rep] += nbytes;
}

/* FNV-1a of everything each op's cases copied back, per device, to compare devices that must
 * agree bit for bit. */
static uint64_t g_hash[8][MAX_OPS];
static int g_devi; /* index in devices[] of the device under test */

static void det_check(void) {
    if (g_len[0] != g_len[1] || memcmp(g_rec[0], g_rec[1], g_len[0]) != 0)
        fail("two runs on the same inputs gave different bits (not deterministic)");
    uint64_t h = g_hash[g_devi][g_op];
    for (size_t i = 0; i < g_len[0]; i++) h = (h ^ g_rec[0][i]) * 0x100000001b3ULL;
    g_hash[g_devi][g_op] = h;
}

static void kt_begin(kt *t, gp_device *dev, int rep) {
    t->dev = dev;
    t->rep = rep;
    t->nb = 0;
    g_len[rep] = 0;
}

/* A device buffer of n words holding host[0..n) (NULL: UNSET_BITS). */
static void *kt_buf(kt *t, const void *host, int64_t n, bool input) {
    if (t->nb == MAX_BUFS) {
        fprintf(stderr, "test_kernels: more than %d device buffers in one case\n", MAX_BUFS);
        exit(1);
    }
    dbuf *b = &t->b[t->nb++];
    const int64_t words = n + 2 * GUARD;
    const size_t nbytes = (size_t)words * 4;
    b->init = malloc(nbytes);
    if (!b->init) exit(1);
    for (int64_t i = 0; i < GUARD; i++) b->init[i] = b->init[GUARD + n + i] = GUARD_BITS;
    if (host)
        memcpy(b->init + GUARD, host, (size_t)n * 4);
    else
        for (int64_t i = 0; i < n; i++) b->init[GUARD + i] = UNSET_BITS;
    gp_status st;
    b->base = gp_device_alloc(t->dev, GP_MEM_WORKSPACE, nbytes, &st);
    if (!b->base) {
        fprintf(stderr, "test_kernels: device allocation failed: %s\n", gp_last_error());
        exit(1);
    }
    REQUIRE_OK(gp_device_copy(t->dev, b->base, b->init, nbytes, GP_COPY_HOST_TO_DEVICE));
    b->n = n;
    b->input = input;
    return b->base + GUARD * 4;
}

/* A read-only input, an input the op updates (or an in-place operand), an output. */
static const float *kt_in(kt *t, const float *h, int64_t n) { return kt_buf(t, h, n, true); }
static const int32_t *kt_in_i(kt *t, const int32_t *h, int64_t n) {
    return kt_buf(t, h, n, true);
}
static float *kt_io(kt *t, const float *h, int64_t n) { return kt_buf(t, h, n, false); }
static float *kt_out(kt *t, int64_t n) { return kt_buf(t, NULL, n, false); }
static int32_t *kt_out_i(kt *t, int64_t n) { return kt_buf(t, NULL, n, false); }

/* Copies n words at device address p back into host (and the run's record). */
static void kt_get(kt *t, const void *p, void *host, int64_t n) {
    REQUIRE_OK(gp_device_sync(t->dev));
    REQUIRE_OK(gp_device_copy(t->dev, host, p, (size_t)n * 4, GP_COPY_DEVICE_TO_HOST));
    rec_add(t->rep, host, (size_t)n * 4);
}

/* A result the op returned in host memory (a loss, a sum of squares). */
static void kt_host(kt *t, const void *p, size_t nbytes) { rec_add(t->rep, p, nbytes); }

/* Checks the guards of every buffer and that inputs are unchanged, then frees them. */
static void kt_end(kt *t) {
    REQUIRE_OK(gp_device_sync(t->dev));
    for (int i = 0; i < t->nb; i++) {
        dbuf *b = &t->b[i];
        const int64_t words = b->n + 2 * GUARD;
        uint32_t *now = malloc((size_t)words * 4);
        if (!now) exit(1);
        REQUIRE_OK(gp_device_copy(t->dev, now, b->base, (size_t)words * 4,
                                  GP_COPY_DEVICE_TO_HOST));
        for (int64_t j = 0; j < GUARD; j++) {
            if (now[j] != GUARD_BITS) {
                fail("wrote %lld words before the start of buffer %d", LL(GUARD - j), i);
                break;
            }
        }
        for (int64_t j = GUARD + b->n; j < words; j++) {
            if (now[j] != GUARD_BITS) {
                fail("wrote past the end of buffer %d (%lld words), at word %lld", i, LL(b->n),
                     LL(j - GUARD));
                break;
            }
        }
        if (b->input && memcmp(now + GUARD, b->init + GUARD, (size_t)b->n * 4) != 0)
            fail("changed its read-only input (buffer %d)", i);
        free(now);
        free(b->init);
        gp_device_release(t->dev, b->base);
    }
    t->nb = 0;
}

/* ------------------------------------------------------------------- checks */

static void note(double rel) {
    op_stats *s = &g_st[g_op];
    if (!(rel <= s->worst)) s->worst = isnan(rel) ? INFINITY : rel;
}

/* |got[i] - ref[i]| <= tol (|ref[i]| + mag[i]) + FLT_MIN (mag NULL: 0). Float has no relative
 * precision below FLT_MIN (1.2e-38): a true value of 1e-50 is rightly 0 or subnormal, so an
 * absolute FLT_MIN is allowed on top (it is below every value these tests make otherwise). */
static void check_close(const char *what, const float *got, const double *ref,
                        const double *mag, int64_t n, double tol) {
    int shown = 0;
    for (int64_t i = 0; i < n; i++) {
        const double r = ref[i], den = fabs(r) + (mag ? mag[i] : 0.0) + FLT_MIN / tol;
        const double err = fabs((double)got[i] - r);
        const double rel = err / den;
        note(rel);
        if (!(err <= tol * den) && shown++ < MAX_SHOWN)
            fail("%s[%lld] = %.9g, reference %.9g (magnitude %.3g): relative error %.3g > %g",
                 what, LL(i), (double)got[i], r, den, rel, tol);
    }
    if (shown > MAX_SHOWN) fail("%s: %d more values out of tolerance", what, shown - MAX_SHOWN);
    g_st[g_op].compared += n;
}

static void check_close1(const char *what, double got, double ref, double mag, double tol) {
    const double den = fabs(ref) + mag, err = fabs(got - ref);
    const double rel = den > 0 ? err / den : (err == 0 ? 0.0 : INFINITY);
    note(rel);
    if (!(err <= tol * den))
        fail("%s = %.17g, reference %.17g (magnitude %.3g): relative error %.3g > %g", what, got,
             ref, den, rel, tol);
    g_st[g_op].compared++;
}

static bool same(float a, float b) { return a == b || (isnan(a) && isnan(b)); }

/* got[i] equals want[i] (NaN equals NaN; 0 equals -0). */
static void check_exact(const char *what, const float *got, const float *want, int64_t n) {
    int shown = 0;
    for (int64_t i = 0; i < n; i++)
        if (!same(got[i], want[i]) && shown++ < MAX_SHOWN)
            fail("%s[%lld] = %.9g, expected exactly %.9g", what, LL(i), (double)got[i],
                 (double)want[i]);
    if (shown > MAX_SHOWN) fail("%s: %d more values differ", what, shown - MAX_SHOWN);
    g_st[g_op].exact += n;
}

static void check_exact_i(const char *what, const int32_t *got, const int32_t *want, int64_t n) {
    int shown = 0;
    for (int64_t i = 0; i < n; i++)
        if (got[i] != want[i] && shown++ < MAX_SHOWN)
            fail("%s[%lld] = %d, expected %d", what, LL(i), (int)got[i], (int)want[i]);
    if (shown > MAX_SHOWN) fail("%s: %d more values differ", what, shown - MAX_SHOWN);
    g_st[g_op].exact += n;
}

/* got equals one of cand[0..nc): a formula evaluated in float where the device may fuse a
 * multiply-add into one rounding (clang contracts a*b + c by default, GPU compilers too). */
static void check_oneof(const char *what, int64_t i, float got, const float *cand, int nc,
                        int *shown) {
    g_st[g_op].exact++;
    for (int c = 0; c < nc; c++)
        if (same(got, cand[c])) return;
    if ((*shown)++ < MAX_SHOWN)
        fail("%s[%lld] = %.9g, expected %.9g (or a fused multiply-add variant)", what, LL(i),
             (double)got, (double)cand[0]);
}

/* ===================================================================== ops */

/* ---------------------------------------------------------------- gemm */

/* `count` matrices of (rows, cols) in one buffer: element (i, r, c) at i*stride + r*ld + c. */
typedef struct mlay {
    int64_t rows, cols, ld, stride, count;
} mlay;

enum { L_TIGHT, L_PAD, L_GAP, L_INTER };
static const char *const lay_names[] = {"tight", "padded", "gaps", "interleaved"};

static mlay make_lay(int kind, int64_t rows, int64_t cols, int64_t count) {
    mlay l = {rows, cols, cols, rows * cols, count};
    if (kind == L_PAD) { /* rows longer than the matrix */
        l.ld = cols + 3;
        l.stride = rows * l.ld;
    } else if (kind == L_GAP) { /* padded rows and a gap between matrices */
        l.ld = cols + 1;
        l.stride = rows * l.ld + 5;
    } else if (kind == L_INTER) { /* side by side in each row, as attention's heads */
        l.ld = count * cols + 2;
        l.stride = cols;
    }
    return l;
}

static int64_t lay_size(const mlay *l) {
    return (l->count - 1) * l->stride + (l->rows - 1) * l->ld + l->cols;
}

static int64_t lay_at(const mlay *l, int64_t i, int64_t r, int64_t c) {
    return i * l->stride + r * l->ld + c;
}

/* pad everywhere, then the matrices' elements: random, or NaN (not to be read). */
static float *lay_fill(const mlay *l, float pad, bool nan_cells) {
    const int64_t size = lay_size(l), cells = l->count * l->rows * l->cols;
    float *buf = fa(size), *v = rnd(cells, 1.0f, 0.0f);
    for (int64_t i = 0; i < size; i++) buf[i] = pad;
    int64_t q = 0;
    for (int64_t i = 0; i < l->count; i++)
        for (int64_t r = 0; r < l->rows; r++)
            for (int64_t c = 0; c < l->cols; c++, q++)
                buf[lay_at(l, i, r, c)] = nan_cells ? NAN : v[q];
    return buf;
}

typedef struct gemm_case {
    int64_t m, n, k, count;
    float alpha, beta;
    int la, lb, lc;
} gemm_case;

/* x with every element rounded to bf16 (NaN padding stays NaN). */
static float *bf16_copy(const float *x, int64_t n) {
    float *r = fa(n);
    for (int64_t i = 0; i < n; i++) r[i] = gp_bf16_round(x[i]);
    return r;
}

/* A few operand elements set to values whose rounding is a case of its own: halfway between
 * two bf16 values (ties to even, down and up), just past halfway, and denormals (one a tie). */
static void bf16_awkward(float *x, const mlay *l) {
    static const uint32_t bits[] = {0x3f808000u, 0xbf818000u, 0x3f808001u, 0x00018000u,
                                    0x80008000u, 0x3e7f8000u};
    for (int64_t i = 0; i < 6 && i < l->rows * l->cols; i++)
        memcpy(&x[lay_at(l, 0, i % l->rows, (i * 7) % l->cols)], &bits[i], 4);
}

/* The GEMM in the device's precision prec (gp_device_set_precision) against the double
 * reference: for bf16, the reference of the operands rounded to bf16, whose products are exact
 * in float (8-bit significands), so that only the fp32 sums round, as in fp32: the same bound.
 * On a host device bf16 must also give exactly the fp32 GEMM's bits on operands rounded here
 * (the same threads, the same cut). */
static void run_gemm(gp_device *dev, const gp_kernels *K, bool batched, bool ta, bool tb,
                     const gemm_case *g, gp_precision prec) {
    const int64_t m = g->m, n = g->n, k = g->k, cnt = g->count;
    const bool bf16 = prec == GP_PRECISION_BF16;
    set_case("%sm %lld n %lld k %lld, op(A) %s op(B) %s, alpha %g beta %g, count %lld, "
             "A %s B %s C %s",
             bf16 ? "bf16: " : "", LL(m), LL(n), LL(k), ta ? "A^T" : "A", tb ? "B^T" : "B",
             (double)g->alpha, (double)g->beta, LL(cnt), lay_names[g->la], lay_names[g->lb],
             lay_names[g->lc]);
    const mlay A = make_lay(g->la, ta ? k : m, ta ? m : k, cnt);
    const mlay B = make_lay(g->lb, tb ? n : k, tb ? k : n, cnt);
    const mlay C = make_lay(g->lc, m, n, cnt);
    const int64_t na = lay_size(&A), nb = lay_size(&B), nc = lay_size(&C);
    /* Padding of A and B is NaN: reading it would show. With beta = 0, C is NaN too: as in
     * BLAS, C is then not read (the layers pass uninitialized outputs with beta = 0). */
    float *a = lay_fill(&A, NAN, false), *b = lay_fill(&B, NAN, false);
    if (bf16) bf16_awkward(a, &A), bf16_awkward(b, &B);
    const float *ar = bf16 ? bf16_copy(a, na) : a, *br = bf16 ? bf16_copy(b, nb) : b;
    const float *c0 = lay_fill(&C, PAD, g->beta == 0.0f);
    float *c = fa(nc);
    double *ref = da(nc), *mag = da(nc);
    for (int64_t i = 0; i < nc; i++) ref[i] = c0[i]; /* padding: unchanged (mag 0: exact) */
    for (int64_t i = 0; i < cnt; i++)
        for (int64_t r = 0; r < m; r++)
            for (int64_t j = 0; j < n; j++) {
                double s = 0, sm = 0;
                for (int64_t p = 0; p < k; p++) {
                    const double av = ta ? ar[lay_at(&A, i, p, r)] : ar[lay_at(&A, i, r, p)];
                    const double bv = tb ? br[lay_at(&B, i, j, p)] : br[lay_at(&B, i, p, j)];
                    s += av * bv;
                    sm += fabs(av * bv);
                }
                const int64_t o = lay_at(&C, i, r, j);
                const double cb = g->beta != 0.0f ? (double)g->beta * c0[o] : 0.0;
                ref[o] = g->alpha * s + cb;
                mag[o] = fabs(g->alpha) * sm + fabs(cb);
            }
    /* runs 0 and 1: the two compared for determinism; run 2, on a host device in bf16: fp32 on
     * the operands rounded here */
    const int runs = bf16 && gp_device_is_host(dev) ? 3 : 2;
    float *c_fp32 = fa(nc);
    for (int rep = 0; rep < runs; rep++) {
        kt t;
        kt_begin(&t, dev, rep < 2 ? rep : 0);
        const float *dA = kt_in(&t, rep < 2 ? a : ar, na), *dB = kt_in(&t, rep < 2 ? b : br, nb);
        float *dC = kt_io(&t, c0, nc);
        REQUIRE_OK(gp_device_set_precision(dev, rep < 2 ? prec : GP_PRECISION_FP32));
        if (batched)
            CHECK_OK(K->gemm_batched(dev, ta, tb, m, n, k, g->alpha, dA, A.ld, A.stride, dB, B.ld,
                                     B.stride, g->beta, dC, C.ld, C.stride, cnt));
        else
            CHECK_OK(K->gemm(dev, ta, tb, m, n, k, g->alpha, dA, A.ld, dB, B.ld, g->beta, dC,
                             C.ld));
        REQUIRE_OK(gp_device_set_precision(dev, GP_PRECISION_FP32));
        kt_get(&t, dC, rep < 2 ? c : c_fp32, nc);
        kt_end(&t);
        if (rep == 1) det_check();
    }
    check_close("C", c, ref, mag, nc, TOL);
    if (runs == 3) check_exact("C (bf16 against fp32 on rounded operands)", c, c_fp32, nc);
}

static void test_gemm(gp_device *dev, const gp_kernels *K) {
    static const gemm_case cases[] = {
        {1, 1, 1, 1, 1.0f, 0.0f, L_TIGHT, L_TIGHT, L_TIGHT},
        {7, 5, 3, 1, 1.0f, 0.0f, L_PAD, L_PAD, L_PAD},
        {17, 33, 19, 1, 0.5f, 1.0f, L_TIGHT, L_PAD, L_TIGHT},
        {64, 1, 65, 1, -1.25f, 0.75f, L_PAD, L_TIGHT, L_PAD},
        {1, 31, 130, 1, 1.0f, 1.0f, L_TIGHT, L_TIGHT, L_PAD},
        {33, 47, 16, 1, 2.0f, 0.0f, L_PAD, L_PAD, L_PAD},
    };
    for (int pr = GP_PRECISION_FP32; pr <= GP_PRECISION_BF16; pr++)
        for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
            for (int tr = 0; tr < 4; tr++)
                run_gemm(dev, K, false, tr & 1, tr & 2, &cases[i], (gp_precision)pr);
}

static void test_gemm_batched(gp_device *dev, const gp_kernels *K) {
    static const gemm_case cases[] = {
        {5, 6, 4, 3, 1.0f, 0.0f, L_INTER, L_INTER, L_INTER},
        {7, 3, 9, 2, 0.5f, 1.0f, L_GAP, L_GAP, L_GAP},
        {1, 1, 1, 4, 1.0f, 0.5f, L_GAP, L_INTER, L_TIGHT},
        {16, 17, 15, 3, -1.0f, 0.0f, L_INTER, L_GAP, L_INTER},
        {65, 8, 64, 2, 1.0f, 1.0f, L_TIGHT, L_PAD, L_GAP},
        {3, 4, 5, 1, 1.0f, 0.0f, L_PAD, L_TIGHT, L_PAD},
    };
    for (int pr = GP_PRECISION_FP32; pr <= GP_PRECISION_BF16; pr++)
        for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
            for (int tr = 0; tr < 4; tr++)
                run_gemm(dev, K, true, tr & 1, tr & 2, &cases[i], (gp_precision)pr);
}

/* The bf16 rounding itself (core/bf16.h), on values with a case of their own each. */
static void test_bf16_round(void) {
    static const struct {
        uint32_t in;
        uint16_t out;
    } cases[] = {
        {0x3f800000u, 0x3f80u}, /* 1: exact */
        {0x3f808000u, 0x3f80u}, /* halfway, to the even one below */
        {0x3f818000u, 0x3f82u}, /* halfway, to the even one above */
        {0xbf818000u, 0xbf82u}, /* the same, negative */
        {0x3f808001u, 0x3f81u}, /* just past halfway: up */
        {0x3f807fffu, 0x3f80u}, /* just short of halfway: down */
        {0x7f7f7fffu, 0x7f7fu}, /* the largest bf16 */
        {0x7f7fffffu, 0x7f80u}, /* the largest float: past it, infinity */
        {0x7f800000u, 0x7f80u}, /* infinities stay */
        {0xff800000u, 0xff80u},
        {0x7fc00000u, 0x7fc0u}, /* quiet NaN */
        {0x7f800001u, 0x7fc0u}, /* NaN whose payload lies in the dropped bits: still NaN */
        {0xff800001u, 0xffc0u},
        {0x80000000u, 0x8000u}, /* -0 */
        {0x00008000u, 0x0000u}, /* denormals: halfway to even (down) */
        {0x00018000u, 0x0002u}, /* halfway to even (up) */
        {0x00010001u, 0x0001u},
        {0x007fffffu, 0x0080u}, /* the largest denormal: up to the smallest normal */
    };
    int bad = 0;
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        float x, r;
        memcpy(&x, &cases[i].in, 4);
        const uint16_t got = gp_bf16_bits(x);
        const uint32_t want32 = (uint32_t)cases[i].out << 16;
        r = gp_bf16_round(x);
        uint32_t r32;
        memcpy(&r32, &r, 4);
        if (got != cases[i].out || r32 != want32) {
            fprintf(stderr, "bf16 of 0x%08x: 0x%04x (as float 0x%08x), expected 0x%04x\n",
                    cases[i].in, got, r32, cases[i].out);
            bad++;
        }
    }
    gp_test_failures += bad;
    printf("bf16 rounding: %d special values, %d wrong\n", (int)(sizeof cases / sizeof cases[0]),
           bad);
}

/* ------------------------------------------------------------ flat vectors */

static const int64_t vec_sizes[] = {1, 7, 17, 1029};
#define NVEC ((int)(sizeof vec_sizes / sizeof vec_sizes[0]))

static void test_fill(gp_device *dev, const gp_kernels *K) {
    static const float values[] = {0.0f, -0.0f, 3.25f, -1e30f};
    for (int si = 0; si < NVEC; si++)
        for (int vi = 0; vi < 4; vi++) {
            const int64_t n = vec_sizes[si];
            const float v = values[vi];
            set_case("n %lld, value %g", LL(n), (double)v);
            const float *x0 = rnd(n, 1.0f, 0.0f);
            float *x = fa(n);
            for (int rep = 0; rep < 2; rep++) {
                kt t;
                kt_begin(&t, dev, rep);
                float *dx = kt_io(&t, x0, n);
                CHECK_OK(K->fill(dev, dx, n, v));
                kt_get(&t, dx, x, n);
                kt_end(&t);
            }
            det_check();
            /* bit for bit: the sign of -0 too */
            for (int64_t i = 0; i < n; i++)
                if (memcmp(&x[i], &v, sizeof v) != 0) {
                    fail("x[%lld] = %g, expected the bits of %g", LL(i), (double)x[i], (double)v);
                    break;
                }
            g_st[g_op].exact += n;
        }
}

static void test_scale(gp_device *dev, const gp_kernels *K) {
    static const float alphas[] = {0.5f, -3.3f, 0.0f};
    for (int si = 0; si < NVEC; si++)
        for (int ai = 0; ai < 3; ai++) {
            const int64_t n = vec_sizes[si];
            const float alpha = alphas[ai];
            set_case("n %lld, alpha %g", LL(n), (double)alpha);
            const float *x0 = rnd(n, 2.0f, 0.0f);
            float *x = fa(n), *want = fa(n);
            /* The double product of two floats is exact: one rounding, as the float product. */
            for (int64_t i = 0; i < n; i++) want[i] = (float)((double)x0[i] * alpha);
            for (int rep = 0; rep < 2; rep++) {
                kt t;
                kt_begin(&t, dev, rep);
                float *dx = kt_io(&t, x0, n);
                CHECK_OK(K->scale(dev, dx, n, alpha));
                kt_get(&t, dx, x, n);
                kt_end(&t);
            }
            det_check();
            check_exact("x", x, want, n);
        }
}

static void test_axpy(gp_device *dev, const gp_kernels *K) {
    static const float alphas[] = {1.0f, -0.37f, 0.0f};
    for (int si = 0; si < NVEC; si++)
        for (int ai = 0; ai < 3; ai++) {
            const int64_t n = vec_sizes[si];
            const float alpha = alphas[ai];
            set_case("n %lld, alpha %g", LL(n), (double)alpha);
            const float *x = rnd(n, 1.0f, 0.0f), *y0 = rnd(n, 1.0f, 0.0f);
            float *y = fa(n);
            for (int rep = 0; rep < 2; rep++) {
                kt t;
                kt_begin(&t, dev, rep);
                const float *dx = kt_in(&t, x, n);
                float *dy = kt_io(&t, y0, n);
                CHECK_OK(K->axpy(dev, n, alpha, dx, dy));
                kt_get(&t, dy, y, n);
                kt_end(&t);
            }
            det_check();
            int shown = 0;
            for (int64_t i = 0; i < n; i++) {
                const float cand[2] = {y0[i] + mulr(alpha, x[i]), fmaf(alpha, x[i], y0[i])};
                check_oneof("y", i, y[i], cand, 2, &shown);
            }
        }
}

static void test_sum_rows_add(gp_device *dev, const gp_kernels *K) {
    static const int64_t shapes[][2] = {{1, 1}, {7, 5}, {64, 33}, {130, 17}, {3, 1000}};
    for (size_t si = 0; si < sizeof shapes / sizeof shapes[0]; si++) {
        const int64_t rows = shapes[si][0], cols = shapes[si][1];
        set_case("rows %lld cols %lld", LL(rows), LL(cols));
        const float *x = rnd(rows * cols, 1.0f, 0.0f), *out0 = rnd(cols, 1.0f, 0.0f);
        float *out = fa(cols);
        double *ref = da(cols), *mag = da(cols);
        for (int64_t j = 0; j < cols; j++) {
            ref[j] = out0[j];
            mag[j] = fabs(out0[j]);
            for (int64_t i = 0; i < rows; i++) {
                ref[j] += x[i * cols + j];
                mag[j] += fabs(x[i * cols + j]);
            }
        }
        for (int rep = 0; rep < 2; rep++) {
            kt t;
            kt_begin(&t, dev, rep);
            const float *dx = kt_in(&t, x, rows * cols);
            float *dout = kt_io(&t, out0, cols);
            CHECK_OK(K->sum_rows_add(dev, dx, rows, cols, dout));
            kt_get(&t, dout, out, cols);
            kt_end(&t);
        }
        det_check();
        check_close("out", out, ref, mag, cols, TOL);
    }
}

static void test_sumsq(gp_device *dev, const gp_kernels *K) {
    static const int64_t sizes[] = {1, 7, 1000, 4099};
    for (size_t si = 0; si < sizeof sizes / sizeof sizes[0]; si++) {
        const int64_t n = sizes[si];
        set_case("n %lld", LL(n));
        float *x = rnd(n, 1.0f, 0.0f);
        if (n > 3) { /* squares out of float range and a tiny one: the sum is in double */
            x[1] = 1e20f;
            x[2] = -3e-30f;
            x[3] = -2.5e19f;
        }
        /* The documented order: element 0 first, each square exact in double. */
        double want = 0;
        for (int64_t i = 0; i < n; i++) want += (double)x[i] * (double)x[i];
        double got = 0;
        for (int rep = 0; rep < 2; rep++) {
            kt t;
            kt_begin(&t, dev, rep);
            const float *dx = kt_in(&t, x, n);
            got = NAN;
            CHECK_OK(K->sumsq(dev, dx, n, &got));
            kt_host(&t, &got, sizeof got);
            kt_end(&t);
        }
        det_check();
        if (memcmp(&got, &want, sizeof got) != 0)
            fail("sum = %.17g, expected exactly %.17g (double, element order)", got, want);
        g_st[g_op].exact++;
    }
}

/* ------------------------------------------------------------------ linear */

static const int64_t lin_shapes[][3] = {{1, 1, 1}, {7, 5, 3}, {17, 33, 16}, {64, 65, 19},
                                        {130, 24, 40}};
#define NLIN ((int)(sizeof lin_shapes / sizeof lin_shapes[0]))

static void test_linear_forward(gp_device *dev, const gp_kernels *K) {
    static const char *const res_names[] = {"none", "separate", "aliasing y"};
    for (int si = 0; si < NLIN; si++)
        for (int mode = 0; mode < 6; mode++) {
            const int64_t rows = lin_shapes[si][0], in = lin_shapes[si][1],
                          out = lin_shapes[si][2];
            const bool has_b = mode & 1;
            const int rmode = mode >> 1;
            set_case("rows %lld in %lld out %lld, bias %s, residual %s", LL(rows), LL(in),
                     LL(out), has_b ? "yes" : "no", res_names[rmode]);
            const float *x = rnd(rows * in, 1.0f, 0.0f), *w = rnd(out * in, 0.5f, 0.0f);
            const float *bias = rnd(out, 1.0f, 0.0f), *res = rnd(rows * out, 1.0f, 0.0f);
            float *y = fa(rows * out);
            double *ref = da(rows * out), *mag = da(rows * out);
            for (int64_t i = 0; i < rows; i++)
                for (int64_t j = 0; j < out; j++) {
                    double s = 0, sm = 0;
                    for (int64_t p = 0; p < in; p++) {
                        s += (double)x[i * in + p] * w[j * in + p];
                        sm += fabs((double)x[i * in + p] * w[j * in + p]);
                    }
                    if (has_b) s += bias[j], sm += fabs(bias[j]);
                    if (rmode) s += res[i * out + j], sm += fabs(res[i * out + j]);
                    ref[i * out + j] = s;
                    mag[i * out + j] = sm;
                }
            for (int rep = 0; rep < 2; rep++) {
                kt t;
                kt_begin(&t, dev, rep);
                const float *dx = kt_in(&t, x, rows * in), *dw = kt_in(&t, w, out * in);
                const float *db = has_b ? kt_in(&t, bias, out) : NULL, *dres = NULL;
                float *dy;
                if (rmode == 2) {
                    dy = kt_io(&t, res, rows * out);
                    dres = dy;
                } else {
                    dy = kt_out(&t, rows * out);
                    if (rmode == 1) dres = kt_in(&t, res, rows * out);
                }
                CHECK_OK(K->linear_forward(dev, rows, in, out, dx, NULL, dw, NULL, db, dres, dy));
                kt_get(&t, dy, y, rows * out);
                kt_end(&t);
            }
            det_check();
            check_close("y", y, ref, mag, rows * out, TOL);
        }
}

static void test_linear_backward(gp_device *dev, const gp_kernels *K) {
    for (int si = 0; si < NLIN; si++)
        for (int mode = 0; mode < 4; mode++) {
            const int64_t rows = lin_shapes[si][0], in = lin_shapes[si][1],
                          out = lin_shapes[si][2];
            const bool want_dx = mode & 1, want_db = mode & 2;
            set_case("rows %lld in %lld out %lld, dx %s, db %s", LL(rows), LL(in), LL(out),
                     want_dx ? "yes" : "NULL", want_db ? "yes" : "NULL");
            const float *x = rnd(rows * in, 1.0f, 0.0f), *w = rnd(out * in, 0.5f, 0.0f);
            const float *dy = rnd(rows * out, 1.0f, 0.0f);
            const float *dw0 = rnd(out * in, 1.0f, 0.0f), *db0 = rnd(out, 1.0f, 0.0f);
            float *dx = fa(rows * in), *dw = fa(out * in), *db = fa(out);
            double *rx = da(rows * in), *mx = da(rows * in);
            double *rw = da(out * in), *mw = da(out * in), *rb = da(out), *mb = da(out);
            for (int64_t i = 0; i < rows; i++)
                for (int64_t p = 0; p < in; p++)
                    for (int64_t j = 0; j < out; j++) {
                        const double t = (double)dy[i * out + j] * w[j * in + p];
                        rx[i * in + p] += t;
                        mx[i * in + p] += fabs(t);
                    }
            for (int64_t j = 0; j < out; j++) {
                for (int64_t p = 0; p < in; p++) {
                    double s = dw0[j * in + p], sm = fabs(dw0[j * in + p]);
                    for (int64_t i = 0; i < rows; i++) {
                        const double t = (double)dy[i * out + j] * x[i * in + p];
                        s += t;
                        sm += fabs(t);
                    }
                    rw[j * in + p] = s;
                    mw[j * in + p] = sm;
                }
                rb[j] = db0[j];
                mb[j] = fabs(db0[j]);
                for (int64_t i = 0; i < rows; i++) {
                    rb[j] += dy[i * out + j];
                    mb[j] += fabs(dy[i * out + j]);
                }
            }
            for (int rep = 0; rep < 2; rep++) {
                kt t;
                kt_begin(&t, dev, rep);
                const float *d_x = kt_in(&t, x, rows * in), *d_w = kt_in(&t, w, out * in);
                const float *d_dy = kt_in(&t, dy, rows * out);
                float *d_dx = want_dx ? kt_out(&t, rows * in) : NULL;
                float *d_dw = kt_io(&t, dw0, out * in);
                float *d_db = want_db ? kt_io(&t, db0, out) : NULL;
                CHECK_OK(K->linear_backward(dev, rows, in, out, d_x, NULL, d_w, NULL, d_dy, d_dx,
                                            d_dw, d_db));
                if (want_dx) kt_get(&t, d_dx, dx, rows * in);
                kt_get(&t, d_dw, dw, out * in);
                if (want_db) kt_get(&t, d_db, db, out);
                kt_end(&t);
            }
            det_check();
            if (want_dx) check_close("dx", dx, rx, mx, rows * in, TOL);
            check_close("dw", dw, rw, mw, out * in, TOL);
            if (want_db) check_close("db", db, rb, mb, out, TOL);
        }
}

/* -------------------------------------------------------------- layer norm */

static const int64_t ln_shapes[][2] = {{1, 1}, {3, 7}, {5, 16}, {4, 33}, {2, 130}, {3, 1000}};
#define NLN ((int)(sizeof ln_shapes / sizeof ln_shapes[0]))
#define LN_EPS 1e-5

/* Mean and 1/sqrt(biased variance + eps) of each row, in double. */
static void ln_stats(const float *x, int64_t rows, int64_t dim, double *mean, double *rstd) {
    for (int64_t i = 0; i < rows; i++) {
        double s = 0, v = 0;
        for (int64_t j = 0; j < dim; j++) s += x[i * dim + j];
        mean[i] = s / (double)dim;
        for (int64_t j = 0; j < dim; j++) {
            const double e = x[i * dim + j] - mean[i];
            v += e * e;
        }
        rstd[i] = 1.0 / sqrt(v / (double)dim + LN_EPS);
    }
}

static void test_layernorm_forward(gp_device *dev, const gp_kernels *K) {
    for (int si = 0; si < NLN; si++)
        for (int oi = 0; oi < 2; oi++) {
            const int64_t rows = ln_shapes[si][0], dim = ln_shapes[si][1];
            const float offset = oi ? 3.0f : 0.0f;
            set_case("rows %lld dim %lld, inputs around %g", LL(rows), LL(dim), (double)offset);
            const float *x = rnd(rows * dim, 1.5f, offset), *w = rnd(dim, 1.0f, 0.0f);
            const float *b = rnd(dim, 1.0f, 0.0f);
            float *y = fa(rows * dim), *stats = fa(2 * rows);
            double *mean = da(rows), *rstd = da(rows);
            double *ry = da(rows * dim), *my = da(rows * dim), *rs = da(2 * rows),
                   *ms = da(2 * rows);
            ln_stats(x, rows, dim, mean, rstd);
            for (int64_t i = 0; i < rows; i++) {
                double amean = 0;
                for (int64_t j = 0; j < dim; j++) amean += fabs(x[i * dim + j]);
                amean /= (double)dim;
                rs[i] = mean[i];
                ms[i] = amean;
                rs[rows + i] = rstd[i];
                ms[rows + i] = rstd[i];
                for (int64_t j = 0; j < dim; j++) {
                    const double xh = (x[i * dim + j] - mean[i]) * rstd[i];
                    /* (x - mean) rstd is computed from x and the mean: their magnitude */
                    const double amp = rstd[i] * (fabs(x[i * dim + j]) + fabs(mean[i]));
                    ry[i * dim + j] = xh * w[j] + b[j];
                    my[i * dim + j] = fabs(w[j]) * (fabs(xh) + amp) + fabs(b[j]);
                }
            }
            for (int rep = 0; rep < 2; rep++) {
                kt t;
                kt_begin(&t, dev, rep);
                const float *dx = kt_in(&t, x, rows * dim), *dw = kt_in(&t, w, dim);
                const float *db = kt_in(&t, b, dim);
                float *dy = kt_out(&t, rows * dim), *dst = kt_out(&t, 2 * rows);
                CHECK_OK(K->layernorm_forward(dev, rows, dim, dx, dw, db, dy, NULL, dst));
                kt_get(&t, dy, y, rows * dim);
                kt_get(&t, dst, stats, 2 * rows);
                kt_end(&t);
            }
            det_check();
            check_close("y", y, ry, my, rows * dim, TOL);
            check_close("stats", stats, rs, ms, 2 * rows, TOL);
        }
}

static void test_layernorm_backward(gp_device *dev, const gp_kernels *K) {
    static const char *const modes[] = {"dx, no dres", "dx + separate dres", "dres aliasing dx",
                                        "dx NULL"};
    for (int si = 0; si < NLN; si++)
        for (int mode = 0; mode < 4; mode++) {
            const int64_t rows = ln_shapes[si][0], dim = ln_shapes[si][1], n = rows * dim;
            set_case("rows %lld dim %lld, %s", LL(rows), LL(dim), modes[mode]);
            const float *x = rnd(n, 1.5f, mode == 1 ? 3.0f : 0.0f), *w = rnd(dim, 1.0f, 0.0f);
            const float *dy = rnd(n, 1.0f, 0.0f), *dres = rnd(n, 1.0f, 0.0f);
            const float *dw0 = rnd(dim, 1.0f, 0.0f), *db0 = rnd(dim, 1.0f, 0.0f);
            /* stats as forward would give them: the double ones rounded to float */
            double *mean = da(rows), *rstd = da(rows);
            ln_stats(x, rows, dim, mean, rstd);
            float *stats = fa(2 * rows);
            for (int64_t i = 0; i < rows; i++) {
                stats[i] = (float)mean[i];
                stats[rows + i] = (float)rstd[i];
            }
            double *rx = da(n), *mx = da(n), *rw = da(dim), *mw = da(dim), *rb = da(dim),
                   *mb = da(dim);
            for (int64_t j = 0; j < dim; j++) {
                rw[j] = dw0[j], mw[j] = fabs(dw0[j]);
                rb[j] = db0[j], mb[j] = fabs(db0[j]);
            }
            for (int64_t i = 0; i < rows; i++) {
                const double mu = stats[i], rs = stats[rows + i];
                const float *xr = x + i * dim, *gr = dy + i * dim;
                double m1 = 0, m2 = 0, a1 = 0, a2 = 0; /* means of g, g xh; of |g|, |g| amp */
                for (int64_t j = 0; j < dim; j++) {
                    const double xh = (xr[j] - mu) * rs, amp = rs * (fabs(xr[j]) + fabs(mu));
                    const double g = (double)gr[j] * w[j];
                    m1 += g, m2 += g * xh, a1 += fabs(g), a2 += fabs(g) * amp;
                    rw[j] += gr[j] * xh, mw[j] += fabs(gr[j]) * amp;
                    rb[j] += gr[j], mb[j] += fabs(gr[j]);
                }
                m1 /= (double)dim, m2 /= (double)dim, a1 /= (double)dim, a2 /= (double)dim;
                for (int64_t j = 0; j < dim; j++) {
                    const double xh = (xr[j] - mu) * rs, amp = rs * (fabs(xr[j]) + fabs(mu));
                    const double g = (double)gr[j] * w[j];
                    const double r0 = mode == 1 || mode == 2 ? dres[i * dim + j] : 0.0;
                    rx[i * dim + j] = r0 + rs * (g - m1 - xh * m2);
                    mx[i * dim + j] = fabs(r0) + rs * (fabs(g) + a1 + amp * a2);
                }
            }
            float *dx = fa(n), *dw = fa(dim), *db = fa(dim);
            for (int rep = 0; rep < 2; rep++) {
                kt t;
                kt_begin(&t, dev, rep);
                const float *d_x = kt_in(&t, x, n), *d_w = kt_in(&t, w, dim);
                const float *d_st = kt_in(&t, stats, 2 * rows), *d_dy = kt_in(&t, dy, n);
                const float *d_dres = NULL;
                float *d_dx = NULL;
                if (mode == 0) d_dx = kt_out(&t, n);
                if (mode == 1) d_dx = kt_out(&t, n), d_dres = kt_in(&t, dres, n);
                if (mode == 2) d_dx = kt_io(&t, dres, n), d_dres = d_dx;
                float *d_dw = kt_io(&t, dw0, dim), *d_db = kt_io(&t, db0, dim);
                CHECK_OK(K->layernorm_backward(dev, rows, dim, d_x, d_w, d_st, d_dy, d_dres, d_dx,
                                               d_dw, d_db));
                if (d_dx) kt_get(&t, d_dx, dx, n);
                kt_get(&t, d_dw, dw, dim);
                kt_get(&t, d_db, db, dim);
                kt_end(&t);
            }
            det_check();
            if (mode != 3) check_close("dx", dx, rx, mx, n, TOL);
            check_close("dw", dw, rw, mw, dim, TOL);
            check_close("db", db, rb, mb, dim, TOL);
        }
}

/* -------------------------------------------------------------------- GELU */

#define GELU_K0 0.7978845608028654 /* sqrt(2 / pi) */
#define GELU_K1 0.044715

/* 0.5 (1 + tanh u) as 1 / (1 + exp(-2u)): 1 + tanh(u) in double cancels to nothing for
 * u < -19, where gelu(x) and its derivative are still far above float's range. */
static double ref_half1p_tanh(double u) { return 1.0 / (1.0 + exp(-2.0 * u)); }

static double ref_gelu(double x) {
    return x * ref_half1p_tanh(GELU_K0 * (x + GELU_K1 * x * x * x));
}

/* d/dx gelu(x) = 0.5 (1 + tanh u) + 0.5 x sech^2(u) u'; *mag: the two terms' magnitudes. */
static double ref_gelu_grad(double x, double *mag) {
    const double u = GELU_K0 * (x + GELU_K1 * x * x * x), ch = cosh(u);
    const double t1 = ref_half1p_tanh(u);
    const double t2 = 0.5 * x / (ch * ch) * GELU_K0 * (1.0 + 3.0 * GELU_K1 * x * x);
    *mag = fabs(t1) + fabs(t2);
    return t1 + t2;
}

/* Both branches of a tanh approximation, its switch points, the flat tails, zeros. */
static const float gelu_specials[] = {0.0f,  -0.0f, 1e-4f, -1e-4f, 0.5f,  -0.75f, 3.0f,
                                      -3.0f, 5.5f,  -5.5f, 9.0f,   -9.0f, 20.0f,  -20.0f,
                                      100.0f, -100.0f, 1e4f, -1e4f};

static float *gelu_inputs(int64_t n) {
    float *x = rnd(n, 3.0f, 0.0f);
    const int64_t ns = (int64_t)(sizeof gelu_specials / sizeof gelu_specials[0]);
    for (int64_t i = 1; i < n && i <= ns; i++) x[i] = gelu_specials[i - 1];
    return x;
}

static void test_gelu_forward(gp_device *dev, const gp_kernels *K) {
    for (int si = 0; si < NVEC; si++)
        for (int alias = 0; alias < 2; alias++) {
            const int64_t n = vec_sizes[si];
            set_case("n %lld, %s", LL(n), alias ? "in place" : "separate y");
            const float *x = gelu_inputs(n);
            float *y = fa(n);
            double *ref = da(n), *mag = da(n);
            for (int64_t i = 0; i < n; i++) ref[i] = ref_gelu(x[i]), mag[i] = fabs(x[i]);
            for (int rep = 0; rep < 2; rep++) {
                kt t;
                kt_begin(&t, dev, rep);
                float *dy;
                if (alias) {
                    dy = kt_io(&t, x, n);
                    CHECK_OK(K->gelu_forward(dev, n, dy, dy, NULL));
                } else {
                    const float *dx = kt_in(&t, x, n);
                    dy = kt_out(&t, n);
                    CHECK_OK(K->gelu_forward(dev, n, dx, dy, NULL));
                }
                kt_get(&t, dy, y, n);
                kt_end(&t);
            }
            det_check();
            check_close("y", y, ref, mag, n, TOL);
        }
}

static void test_gelu_backward(gp_device *dev, const gp_kernels *K) {
    static const int64_t shapes[][2] = {{1, 1}, {3, 7}, {17, 33}, {2, 1029}};
    for (size_t si = 0; si < sizeof shapes / sizeof shapes[0]; si++)
        for (int mode = 0; mode < 4; mode++) {
            const int64_t rows = shapes[si][0], cols = shapes[si][1], n = rows * cols;
            const bool want_db = mode & 1, alias = mode & 2;
            set_case("rows %lld cols %lld, db %s, dx %s", LL(rows), LL(cols),
                     want_db ? "yes" : "NULL", alias ? "aliasing dy" : "separate");
            const float *x = gelu_inputs(n), *dy = rnd(n, 1.0f, 0.0f);
            const float *db0 = rnd(cols, 1.0f, 0.0f);
            float *dx = fa(n), *db = fa(cols);
            double *rx = da(n), *mx = da(n), *rb = da(cols), *mb = da(cols);
            for (int64_t j = 0; j < cols; j++) rb[j] = db0[j], mb[j] = fabs(db0[j]);
            for (int64_t i = 0; i < n; i++) {
                /* Relative to the derivative itself, with one exception: far in the negative
                 * tail (u < -40, x < -9.45) |gelu'| is below 4e-33, and the CPU kernel, like
                 * any exp-based one that clamps its argument, returns 0 there: an absolute
                 * error of 1e-32 |dy| is allowed (|gelu'| is at most 1.13). */
                double m;
                rx[i] = dy[i] * ref_gelu_grad(x[i], &m);
                mx[i] = fabs(dy[i]) * (m + 1e-32 / TOL);
                rb[i % cols] += rx[i];
                mb[i % cols] += mx[i];
            }
            for (int rep = 0; rep < 2; rep++) {
                kt t;
                kt_begin(&t, dev, rep);
                const float *d_x = kt_in(&t, x, n), *d_dy;
                float *d_dx;
                if (alias) {
                    d_dx = kt_io(&t, dy, n);
                    d_dy = d_dx;
                } else {
                    d_dy = kt_in(&t, dy, n);
                    d_dx = kt_out(&t, n);
                }
                float *d_db = want_db ? kt_io(&t, db0, cols) : NULL;
                CHECK_OK(K->gelu_backward(dev, rows, cols, d_x, d_dy, d_dx, d_db));
                kt_get(&t, d_dx, dx, n);
                if (want_db) kt_get(&t, d_db, db, cols);
                kt_end(&t);
            }
            det_check();
            check_close("dx", dx, rx, mx, n, TOL);
            if (want_db) check_close("db", db, rb, mb, cols, TOL);
        }
}

/* ----------------------------------------------------------------- dropout */

static void test_dropout(gp_device *dev, const gp_kernels *K) {
    /* Sizes across the CPU's 1024-element chunks. p = 0.5, 0.75 and 0 have an exact 1/(1-p):
     * every output is then exact, fused residual add or not. The last p is the stream's own
     * u_{n/2}, so one element sits exactly on the threshold (kept: u_i >= p); its scale is
     * inexact, so kept values are compared within the tolerance there, dropped ones exactly. */
    static const int64_t sizes[] = {1, 7, 1023, 1024, 1025, 2500};
    static const float ps[] = {0.5f, 0.75f, 0.0f, -1.0f /* u_{n/2} */};
    static const char *const modes[] = {"y separate", "y + separate res", "y aliasing x",
                                        "y aliasing res"};
    for (size_t si = 0; si < sizeof sizes / sizeof sizes[0]; si++)
        for (int pi = 0; pi < 4; pi++)
            for (int mode = 0; mode < 4; mode++) {
                const int64_t n = sizes[si];
                const gp_rng_stream s = {.seed = SEED, .purpose = GP_RNG_DROPOUT,
                                         .a = 5 * 16 + 1, .b = 9, .c = (uint32_t)si};
                float p = ps[pi];
                if (p < 0) gp_rng_uniform(&s, (uint64_t)(n / 2), &p, 1);
                set_case("n %lld, p %.9g, %s", LL(n), (double)p, modes[mode]);
                float *u = fa(n);
                gp_rng_uniform(&s, 0, u, n);
                const float *x = rnd(n, 1.0f, 0.0f), *res = rnd(n, 1.0f, 0.0f);
                const bool has_res = mode == 1 || mode == 3, exact = ps[pi] >= 0;
                /* the mask is the keyed stream's u_i >= p, the scaling 1 / (1 - p) */
                float *want = fa(n), *y = fa(n);
                double *ref = da(n), *mag = da(n);
                const float scale = 1.0f / (1.0f - p);
                int64_t kept = 0;
                for (int64_t i = 0; i < n; i++) {
                    const bool keep = u[i] >= p;
                    kept += keep;
                    const float v = keep ? x[i] * scale : 0.0f;
                    want[i] = has_res ? res[i] + v : v;
                    const double vd = keep ? (double)x[i] / (1.0 - (double)p) : 0.0;
                    ref[i] = (has_res ? res[i] : 0.0) + vd;
                    mag[i] = (has_res ? fabs(res[i]) : 0.0) + fabs(vd); /* 0 if dropped */
                }
                for (int rep = 0; rep < 2; rep++) {
                    kt t;
                    kt_begin(&t, dev, rep);
                    float *dy;
                    if (mode == 0) {
                        const float *dx = kt_in(&t, x, n);
                        dy = kt_out(&t, n);
                        CHECK_OK(K->dropout(dev, &s, p, n, dx, NULL, dy));
                    } else if (mode == 1) {
                        const float *dx = kt_in(&t, x, n), *dr = kt_in(&t, res, n);
                        dy = kt_out(&t, n);
                        CHECK_OK(K->dropout(dev, &s, p, n, dx, dr, dy));
                    } else if (mode == 2) {
                        dy = kt_io(&t, x, n);
                        CHECK_OK(K->dropout(dev, &s, p, n, dy, NULL, dy));
                    } else {
                        const float *dx = kt_in(&t, x, n);
                        dy = kt_io(&t, res, n);
                        CHECK_OK(K->dropout(dev, &s, p, n, dx, dy, dy));
                    }
                    kt_get(&t, dy, y, n);
                    kt_end(&t);
                }
                det_check();
                if (exact)
                    check_exact("y", y, want, n);
                else
                    check_close("y", y, ref, mag, n, TOL);
                if (n >= 1000 && p == 0.5f && (kept < n / 2 - n / 10 || kept > n / 2 + n / 10))
                    fail("kept %lld of %lld at p = 0.5: the stream is not uniform", LL(kept),
                         LL(n));
            }
}

/* --------------------------------------------------------------- attention */

/* Head sizes below 16 all: a bf16 GPU would take its fused kernels for a multiple of 16, which
 * keep their own state in probs (attention_saved), not the probabilities these tests build and
 * compare; test_kernels_cuda checks those against the CPU. */
static const int64_t attn_cases[][4] = {/* B, T, C, H */
                                        {1, 1, 4, 1},   {2, 7, 12, 3},  {1, 64, 8, 2},
                                        {1, 65, 10, 2}, {2, 130, 16, 4}, {1, 130, 6, 3},
                                        {1, 33, 8, 1}};
#define NATTN ((int)(sizeof attn_cases / sizeof attn_cases[0]))

static gp_attn_dims attn_dims(int ci) {
    return (gp_attn_dims){attn_cases[ci][0], attn_cases[ci][1], attn_cases[ci][2],
                          attn_cases[ci][3]};
}

static float *attn_qkv(const gp_attn_dims *d, int ci) {
    /* one case with larger scores: a sharp softmax */
    return rnd(d->batch * d->seq * 3 * d->dim, ci == 3 ? 2.5f : 1.0f, 0.0f);
}

/* Causal softmax probabilities (B, H, T, T) in double; smag (B, H, T; may be NULL): twice the
 * largest score magnitude sum_e |q_te k_je| / sqrt(hd) of each row. A float score error of e
 * times that magnitude moves p_tj by at most p_tj smag e: p's magnitude is p_tj smag. */
static void ref_probs(const gp_attn_dims *d, const float *qkv, double *P, double *smag) {
    const int64_t B = d->batch, T = d->seq, C = d->dim, H = d->heads, hd = C / H, ld = 3 * C;
    const double sc = 1.0 / sqrt((double)hd);
    double *s = malloc(sizeof(double) * (size_t)T);
    if (!s) exit(1);
    for (int64_t b = 0; b < B; b++)
        for (int64_t h = 0; h < H; h++)
            for (int64_t t = 0; t < T; t++) {
                const float *q = qkv + (b * T + t) * ld + h * hd;
                double mx = -INFINITY, msm = 0, z = 0;
                for (int64_t j = 0; j <= t; j++) {
                    const float *k = qkv + (b * T + j) * ld + C + h * hd;
                    double sm = 0;
                    s[j] = 0;
                    for (int64_t e = 0; e < hd; e++) {
                        s[j] += (double)q[e] * k[e];
                        sm += fabs((double)q[e] * k[e]);
                    }
                    s[j] *= sc;
                    mx = fmax(mx, s[j]), msm = fmax(msm, sm * sc);
                }
                for (int64_t j = 0; j <= t; j++) z += exp(s[j] - mx);
                double *pr = P + ((b * H + h) * T + t) * T;
                for (int64_t j = 0; j < T; j++) pr[j] = j <= t ? exp(s[j] - mx) / z : 0.0;
                if (smag) smag[(b * H + h) * T + t] = 2.0 * msm;
            }
    free(s);
}

/* Attention on a bf16 device (gp_precision) against the reference of its operands rounded to
 * bf16 (q, k, v; datt): the products also take P (and dS) rounded, each element moved by at most
 * 2^-8 of itself (bf16's unit roundoff: 8 significant bits), so a result moves by at most 2^-8
 * of its magnitude (the sum of the terms' absolute values) beyond fp32's rounding: checked at
 * 2^-7. That bound would also pass the fp32 products of unrounded q, k, v, so bf16's results
 * must differ from fp32's as well. */
#define TOL_BF16 (1.0 / 128)

/* Marks the case as the bf16 pass (the messages say so). */
static void case_bf16(void) {
    const size_t len = strlen(g_case);
    snprintf(g_case + len, sizeof g_case - len, ", bf16");
}

/* got differs from the fp32 results in some element: bf16 changed something. */
static void check_differs(const char *what, const float *got, const float *fp32, int64_t n) {
    if (memcmp(got, fp32, (size_t)n * sizeof *got) == 0)
        fail("%s: the same bits as in fp32 (bf16 rounded nothing)", what);
}

static void test_attention_forward(gp_device *dev, const gp_kernels *K) {
    for (int ci = 0; ci < NATTN; ci++) {
        const gp_attn_dims d = attn_dims(ci);
        const int64_t B = d.batch, T = d.seq, C = d.dim, H = d.heads, hd = C / H, ld = 3 * C;
        set_case("B %lld T %lld C %lld H %lld (head dim %lld)", LL(B), LL(T), LL(C), LL(H),
                 LL(hd));
        const int64_t nq = B * T * ld, np = B * H * T * T, na = B * T * C;
        const float *qkv_in = attn_qkv(&d, ci);
        float *att32 = fa(na);
        for (int pr = GP_PRECISION_FP32; pr <= GP_PRECISION_BF16; pr++) {
            const bool bf16 = pr == GP_PRECISION_BF16;
            if (bf16) case_bf16();
            const float *qkv = bf16 ? bf16_copy(qkv_in, nq) : qkv_in; /* what the reference takes */
            double *rp = da(np), *mp = da(np), *ra = da(na), *ma = da(na), *smag = da(B * H * T);
            ref_probs(&d, qkv, rp, smag);
            for (int64_t i = 0; i < np; i++) mp[i] = rp[i] * smag[i / T]; /* 0 above the diagonal */
            for (int64_t b = 0; b < B; b++)
                for (int64_t h = 0; h < H; h++)
                    for (int64_t t = 0; t < T; t++) {
                        const double *pr = rp + ((b * H + h) * T + t) * T;
                        const double rel = smag[(b * H + h) * T + t];
                        for (int64_t e = 0; e < hd; e++) {
                            double s = 0, sm = 0;
                            for (int64_t j = 0; j <= t; j++) {
                                const double v = qkv[(b * T + j) * ld + 2 * C + h * hd + e];
                                s += pr[j] * v;
                                sm += pr[j] * fabs(v);
                            }
                            ra[(b * T + t) * C + h * hd + e] = s;
                            ma[(b * T + t) * C + h * hd + e] = sm * (1.0 + rel);
                        }
                    }
            float *p = fa(np), *att = bf16 ? fa(na) : att32;
            for (int rep = 0; rep < 2; rep++) {
                kt t;
                kt_begin(&t, dev, rep);
                const float *dq = kt_in(&t, qkv_in, nq);
                float *dp = kt_out(&t, np), *da_ = kt_out(&t, na);
                REQUIRE_OK(gp_device_set_precision(dev, (gp_precision)pr));
                CHECK_OK(K->attention_forward(dev, &d, dq, dp, da_, NULL));
                REQUIRE_OK(gp_device_set_precision(dev, GP_PRECISION_FP32));
                kt_get(&t, dp, p, np);
                kt_get(&t, da_, att, na);
                kt_end(&t);
        }
        det_check();
        /* P itself is fp32 (of the rounded q, k): only its use in P v rounds it */
        check_close("probs", p, rp, mp, np, TOL);
        check_close("att", att, ra, ma, na, bf16 ? TOL_BF16 : TOL);
        if (bf16) check_differs("att", att, att32, na);
        int64_t above = 0, nonzero = 0; /* the masked part: exactly 0 */
        for (int64_t i = 0; i < np; i++)
            if (i % T > (i / T) % T) above++, nonzero += p[i] != 0.0f;
        if (nonzero) fail("%lld of the %lld probabilities above the diagonal are not 0",
                          LL(nonzero), LL(above));
        g_st[g_op].exact += above;
        }
    }
}

/* What the forward keeps for the backward: at least a float a row (the fused GPU path's
 * log-sum-exps), the same on every call; the CPU keeps the B H T T probabilities (the forward's
 * test below checks them). */
static void test_attention_saved(gp_device *dev, const gp_kernels *K) {
    for (int ci = 0; ci < NATTN; ci++) {
        const gp_attn_dims d = attn_dims(ci);
        set_case("B %lld T %lld C %lld H %lld", LL(d.batch), LL(d.seq), LL(d.dim), LL(d.heads));
        const int64_t n = K->attention_saved(dev, &d), rows = d.batch * d.heads * d.seq;
        if (n < rows) fail("%lld floats saved for %lld rows", LL(n), LL(rows));
        if (gp_device_is_host(dev) && n != rows * d.seq)
            fail("the CPU saves %lld floats, not the B H T T = %lld probabilities", LL(n),
                 LL(rows * d.seq));
        if (K->attention_saved(dev, &d) != n) fail("saved size changes between calls");
        g_st[g_op].exact++;
    }
}

static void test_attention_backward_ws(gp_device *dev, const gp_kernels *K) {
    /* the size itself; attention_backward runs with exactly this many guarded floats */
    for (int ci = 0; ci < NATTN; ci++) {
        const gp_attn_dims d = attn_dims(ci);
        set_case("B %lld T %lld C %lld H %lld", LL(d.batch), LL(d.seq), LL(d.dim), LL(d.heads));
        const int64_t w = K->attention_backward_ws(dev, &d);
        if (w < 0) fail("workspace of %lld floats", LL(w));
        if (K->attention_backward_ws(dev, &d) != w) fail("workspace size changes between calls");
        g_st[g_op].exact++;
    }
}

static void test_attention_backward(gp_device *dev, const gp_kernels *K) {
    for (int ci = 0; ci < NATTN; ci++)
        for (int want_db = 0; want_db < 2; want_db++) {
            const gp_attn_dims d = attn_dims(ci);
            const int64_t B = d.batch, T = d.seq, C = d.dim, H = d.heads, hd = C / H;
            const int64_t ld = 3 * C, nq = B * T * ld, np = B * H * T * T, na = B * T * C;
            const double sc = 1.0 / sqrt((double)hd);
            set_case("B %lld T %lld C %lld H %lld (head dim %lld), dbias %s", LL(B), LL(T),
                     LL(C), LL(H), LL(hd), want_db ? "yes" : "NULL");
            const float *qkv_in = attn_qkv(&d, ci), *datt_in = rnd(na, 1.0f, 0.0f);
            const float *dbias0 = rnd(3 * C, 1.0f, 0.0f);
            /* probs as forward gives them: the double ones in float, 0 above the diagonal */
            double *pd = da(np);
            ref_probs(&d, qkv_in, pd, NULL);
            float *probs = fa(np);
            for (int64_t i = 0; i < np; i++) probs[i] = (float)pd[i];
            float *dqkv32 = fa(nq);
            for (int pr = GP_PRECISION_FP32; pr <= GP_PRECISION_BF16; pr++) {
                const bool bf16 = pr == GP_PRECISION_BF16;
                if (bf16) case_bf16();
                /* what the reference takes: P stays as given (rounded only inside the products) */
                const float *qkv = bf16 ? bf16_copy(qkv_in, nq) : qkv_in;
                const float *datt = bf16 ? bf16_copy(datt_in, na) : datt_in;
                double *rq = da(nq), *mq = da(nq), *rb = da(3 * C), *mb = da(3 * C);
                double *dP = da(T * T), *dPm = da(T * T), *dS = da(T * T), *dSm = da(T * T);
                for (int64_t b = 0; b < B; b++)
                    for (int64_t h = 0; h < H; h++) {
                        const float *P = probs + (b * H + h) * T * T;
    #define Q(t, e) ((double)qkv[(b * T + (t)) * ld + h * hd + (e)])
    #define KK(t, e) ((double)qkv[(b * T + (t)) * ld + C + h * hd + (e)])
    #define V(t, e) ((double)qkv[(b * T + (t)) * ld + 2 * C + h * hd + (e)])
    #define DO(t, e) ((double)datt[(b * T + (t)) * C + h * hd + (e)])
                        for (int64_t t = 0; t < T; t++) {
                            double dot = 0, dotm = 0;
                            for (int64_t j = 0; j <= t; j++) {
                                double s = 0, sm = 0;
                                for (int64_t e = 0; e < hd; e++) {
                                    s += DO(t, e) * V(j, e);
                                    sm += fabs(DO(t, e) * V(j, e));
                                }
                                dP[t * T + j] = s, dPm[t * T + j] = sm;
                                dot += P[t * T + j] * s, dotm += P[t * T + j] * sm;
                            }
                            for (int64_t j = 0; j <= t; j++) {
                                dS[t * T + j] = P[t * T + j] * (dP[t * T + j] - dot) * sc;
                                dSm[t * T + j] = P[t * T + j] * (dPm[t * T + j] + dotm) * sc;
                            }
                        }
                        for (int64_t t = 0; t < T; t++)
                            for (int64_t e = 0; e < hd; e++) {
                                double gq = 0, mgq = 0, gk = 0, mgk = 0, gv = 0, mgv = 0;
                                for (int64_t j = 0; j <= t; j++) { /* dq_t = sum_j dS_tj k_j */
                                    gq += dS[t * T + j] * KK(j, e);
                                    mgq += dSm[t * T + j] * fabs(KK(j, e));
                                }
                                for (int64_t r = t; r < T; r++) { /* key/value row t */
                                    gk += dS[r * T + t] * Q(r, e);
                                    mgk += dSm[r * T + t] * fabs(Q(r, e));
                                    gv += P[r * T + t] * DO(r, e);
                                    mgv += P[r * T + t] * fabs(DO(r, e));
                                }
                                const int64_t o = (b * T + t) * ld + h * hd + e;
                                rq[o] = gq, mq[o] = mgq;
                                rq[o + C] = gk, mq[o + C] = mgk;
                                rq[o + 2 * C] = gv, mq[o + 2 * C] = mgv;
                            }
    #undef Q
    #undef KK
    #undef V
    #undef DO
                    }
                for (int64_t c = 0; c < 3 * C; c++) {
                    rb[c] = dbias0[c], mb[c] = fabs(dbias0[c]);
                    for (int64_t r = 0; r < B * T; r++)
                        rb[c] += rq[r * ld + c], mb[c] += mq[r * ld + c];
            }
            const int64_t ws = K->attention_backward_ws(dev, &d);
            float *dqkv = bf16 ? fa(nq) : dqkv32, *dbias = fa(3 * C);
            for (int rep = 0; rep < 2; rep++) {
                kt t;
                kt_begin(&t, dev, rep);
                const float *d_qkv = kt_in(&t, qkv_in, nq), *d_p = kt_in(&t, probs, np);
                const float *d_datt = kt_in(&t, datt_in, na);
                float *d_dqkv = kt_out(&t, nq), *d_ws = kt_out(&t, ws > 0 ? ws : 0);
                float *d_db = want_db ? kt_io(&t, dbias0, 3 * C) : NULL;
                REQUIRE_OK(gp_device_set_precision(dev, (gp_precision)pr));
                CHECK_OK(K->attention_backward(dev, &d, d_qkv, d_p, NULL, NULL, d_datt, d_dqkv, d_db,
                                               d_ws));
                REQUIRE_OK(gp_device_set_precision(dev, GP_PRECISION_FP32));
                kt_get(&t, d_dqkv, dqkv, nq);
                if (want_db) kt_get(&t, d_db, dbias, 3 * C);
                kt_end(&t);
            }
            det_check();
            check_close("dqkv", dqkv, rq, mq, nq, bf16 ? TOL_BF16 : TOL);
            if (want_db) check_close("dbias", dbias, rb, mb, 3 * C, bf16 ? TOL_BF16 : TOL);
            if (bf16) check_differs("dqkv", dqkv, dqkv32, nq);
            }
        }
}

/* -------------------------------------------------------------- embeddings */

static const int64_t emb_cases[][4] = {/* rows, row_len, dim, vocab */
                                       {1, 1, 1, 1},    {2, 7, 5, 11},  {3, 65, 17, 300},
                                       {4, 16, 64, 50}, {1, 130, 3, 2}};
#define NEMB ((int)(sizeof emb_cases / sizeof emb_cases[0]))

/* ids with 0 and vocab - 1 present and a repeated id. */
static int32_t *emb_ids(int64_t n, int64_t vocab) {
    int32_t *ids = rndi(n, vocab);
    ids[0] = 0;
    ids[n - 1] = (int32_t)(vocab - 1);
    if (n > 2) ids[1] = ids[n - 1];
    return ids;
}

/* Out-of-range ids must fail naming the position; nothing is written outside the outputs. */
static void emb_errors(gp_device *dev, const gp_kernels *K, bool backward) {
    const int64_t rows = 2, row_len = 7, n = rows * row_len, dim = 5, vocab = 11;
    static const struct {
        int64_t pos;
        int32_t id;
        const char *needle;
    } bad[] = {{12, 11, "position 12"}, {3, -1, "position 3"}, {0, 1 << 30, "position 0"}};
    for (int i = 0; i < 3; i++) {
        set_case("id %d at position %lld of %lld, vocab %lld", (int)bad[i].id, LL(bad[i].pos),
                 LL(n), LL(vocab));
        int32_t *ids = emb_ids(n, vocab);
        ids[bad[i].pos] = bad[i].id;
        const float *w = rnd(vocab * dim, 1.0f, 0.0f), *dy = rnd(n * dim, 1.0f, 0.0f);
        kt t;
        kt_begin(&t, dev, 0);
        const int32_t *d_ids = kt_in_i(&t, ids, n);
        if (backward) {
            float *d_dw = kt_io(&t, w, vocab * dim);
            const float *d_dy = kt_in(&t, dy, n * dim);
            CHECK_FAILS(K->embedding_backward(dev, n, row_len, dim, vocab, d_ids, d_dy, d_dw),
                        GP_INVALID_ARGUMENT, bad[i].needle);
        } else {
            const float *d_w = kt_in(&t, w, vocab * dim);
            float *d_y = kt_out(&t, n * dim);
            CHECK_FAILS(K->embedding_forward(dev, n, row_len, dim, vocab, d_ids, d_w, d_y),
                        GP_INVALID_ARGUMENT, bad[i].needle);
        }
        kt_end(&t);
        g_st[g_op].exact++;
    }
}

static void test_embedding_forward(gp_device *dev, const gp_kernels *K) {
    for (int ci = 0; ci < NEMB; ci++) {
        const int64_t rows = emb_cases[ci][0], row_len = emb_cases[ci][1], dim = emb_cases[ci][2],
                      vocab = emb_cases[ci][3], n = rows * row_len;
        set_case("rows %lld row_len %lld dim %lld vocab %lld", LL(rows), LL(row_len), LL(dim),
                 LL(vocab));
        const int32_t *ids = emb_ids(n, vocab);
        const float *w = rnd(vocab * dim, 1.0f, 0.0f);
        float *y = fa(n * dim), *want = fa(n * dim);
        for (int64_t i = 0; i < n; i++)
            for (int64_t j = 0; j < dim; j++) want[i * dim + j] = w[ids[i] * dim + j];
        for (int rep = 0; rep < 2; rep++) {
            kt t;
            kt_begin(&t, dev, rep);
            const int32_t *d_ids = kt_in_i(&t, ids, n);
            const float *d_w = kt_in(&t, w, vocab * dim);
            float *d_y = kt_out(&t, n * dim);
            CHECK_OK(K->embedding_forward(dev, n, row_len, dim, vocab, d_ids, d_w, d_y));
            kt_get(&t, d_y, y, n * dim);
            kt_end(&t);
        }
        det_check();
        check_exact("y", y, want, n * dim);
    }
    emb_errors(dev, K, false);
}

static void test_embedding_backward(gp_device *dev, const gp_kernels *K) {
    for (int ci = 0; ci < NEMB; ci++) {
        const int64_t rows = emb_cases[ci][0], row_len = emb_cases[ci][1], dim = emb_cases[ci][2],
                      vocab = emb_cases[ci][3], n = rows * row_len;
        set_case("rows %lld row_len %lld dim %lld vocab %lld", LL(rows), LL(row_len), LL(dim),
                 LL(vocab));
        const int32_t *ids = emb_ids(n, vocab);
        const float *dy = rnd(n * dim, 1.0f, 0.0f), *dw0 = rnd(vocab * dim, 1.0f, 0.0f);
        float *dw = fa(vocab * dim);
        double *ref = da(vocab * dim), *mag = da(vocab * dim);
        for (int64_t i = 0; i < vocab * dim; i++) ref[i] = dw0[i], mag[i] = fabs(dw0[i]);
        for (int64_t i = 0; i < n; i++)
            for (int64_t j = 0; j < dim; j++) {
                ref[ids[i] * dim + j] += dy[i * dim + j];
                mag[ids[i] * dim + j] += fabs(dy[i * dim + j]);
            }
        for (int rep = 0; rep < 2; rep++) {
            kt t;
            kt_begin(&t, dev, rep);
            const int32_t *d_ids = kt_in_i(&t, ids, n);
            const float *d_dy = kt_in(&t, dy, n * dim);
            float *d_dw = kt_io(&t, dw0, vocab * dim);
            CHECK_OK(K->embedding_backward(dev, n, row_len, dim, vocab, d_ids, d_dy, d_dw));
            kt_get(&t, d_dw, dw, vocab * dim);
            kt_end(&t);
        }
        det_check();
        check_close("dw", dw, ref, mag, vocab * dim, TOL);
    }
    emb_errors(dev, K, true);
}

static const int64_t pos_cases[][3] = {{1, 1, 1}, {2, 7, 5}, {3, 65, 17}, {2, 130, 16}};
#define NPOS ((int)(sizeof pos_cases / sizeof pos_cases[0]))
#define POS_EXTRA 3 /* rows of the table past T: not used */

static void test_pos_embedding_forward(gp_device *dev, const gp_kernels *K) {
    for (int ci = 0; ci < NPOS; ci++)
        for (int alias = 0; alias < 2; alias++) {
            const int64_t B = pos_cases[ci][0], T = pos_cases[ci][1], D = pos_cases[ci][2];
            const int64_t n = B * T * D, nw = (T + POS_EXTRA) * D;
            set_case("B %lld T %lld D %lld (table of %lld rows), %s", LL(B), LL(T), LL(D),
                     LL(T + POS_EXTRA), alias ? "in place" : "separate y");
            const float *x = rnd(n, 1.0f, 0.0f), *w = rnd(nw, 1.0f, 0.0f);
            float *y = fa(n), *want = fa(n);
            for (int64_t b = 0; b < B; b++)
                for (int64_t t = 0; t < T; t++)
                    for (int64_t j = 0; j < D; j++) {
                        const int64_t o = (b * T + t) * D + j;
                        want[o] = x[o] + w[t * D + j]; /* one float add: one rounding */
                    }
            for (int rep = 0; rep < 2; rep++) {
                kt t;
                kt_begin(&t, dev, rep);
                const float *d_w = kt_in(&t, w, nw);
                float *d_y;
                if (alias) {
                    d_y = kt_io(&t, x, n);
                    CHECK_OK(K->pos_embedding_forward(dev, B, T, D, d_y, d_w, d_y));
                } else {
                    const float *d_x = kt_in(&t, x, n);
                    d_y = kt_out(&t, n);
                    CHECK_OK(K->pos_embedding_forward(dev, B, T, D, d_x, d_w, d_y));
                }
                kt_get(&t, d_y, y, n);
                kt_end(&t);
            }
            det_check();
            check_exact("y", y, want, n);
        }
}

static void test_pos_embedding_backward(gp_device *dev, const gp_kernels *K) {
    for (int ci = 0; ci < NPOS; ci++) {
        const int64_t B = pos_cases[ci][0], T = pos_cases[ci][1], D = pos_cases[ci][2];
        const int64_t n = B * T * D, nw = (T + POS_EXTRA) * D;
        set_case("B %lld T %lld D %lld (table of %lld rows)", LL(B), LL(T), LL(D),
                 LL(T + POS_EXTRA));
        const float *dy = rnd(n, 1.0f, 0.0f), *dw0 = rnd(nw, 1.0f, 0.0f);
        float *dw = fa(nw);
        double *ref = da(nw), *mag = da(nw);
        for (int64_t i = 0; i < nw; i++) ref[i] = dw0[i], mag[i] = 0; /* rows >= T: exact */
        for (int64_t i = 0; i < T * D; i++) mag[i] = fabs(dw0[i]);
        for (int64_t b = 0; b < B; b++)
            for (int64_t i = 0; i < T * D; i++) {
                ref[i] += dy[b * T * D + i];
                mag[i] += fabs(dy[b * T * D + i]);
            }
        for (int rep = 0; rep < 2; rep++) {
            kt t;
            kt_begin(&t, dev, rep);
            const float *d_dy = kt_in(&t, dy, n);
            float *d_dw = kt_io(&t, dw0, nw);
            CHECK_OK(K->pos_embedding_backward(dev, B, T, D, d_dy, d_dw));
            kt_get(&t, d_dw, dw, nw);
            kt_end(&t);
        }
        det_check();
        check_close("dw", dw, ref, mag, nw, TOL);
    }
}

/* -------------------------------------------------------------------- loss */

static void test_softmax_xent(gp_device *dev, const gp_kernels *K) {
    static const struct {
        int64_t rows, classes;
        float sd;
    } cases[] = {{1, 1, 1.0f},   {1, 7, 1.0f},    {5, 3, 2.0f}, {17, 33, 1.0f},
                 {64, 100, 30.0f}, {3, 1000, 5.0f}, {6, 4, 1.0f} /* all ignored */};
    static const char *const modes[] = {"dlogits separate", "dlogits NULL",
                                        "dlogits aliasing logits"};
    const int ncases = (int)(sizeof cases / sizeof cases[0]);
    for (int ci = 0; ci < ncases; ci++)
        for (int mode = 0; mode < 3; mode++)
            for (int nv = 0; nv < 4; nv++) {
                const int64_t rows = cases[ci].rows, classes = cases[ci].classes,
                              n = rows * classes;
                const bool none = ci == ncases - 1;
                const double sm = nv / 2 ? 0.1 : 0.0; /* label smoothing */
                set_case("rows %lld classes %lld, logits sd %g, %s, normalizer %s%s, smoothing %g",
                         LL(rows), LL(classes), (double)cases[ci].sd, modes[mode],
                         nv % 2 ? "1.5 x count" : "count", none ? ", every label ignored" : "",
                         sm);
                const float *x = rnd(n, cases[ci].sd, 0.0f);
                int32_t *lab = rndi(rows, classes);
                int64_t counted = 0;
                for (int64_t r = 0; r < rows; r++) {
                    if (r % 3 == 1 || none) lab[r] = -1;
                    if (r == 0 && !none) lab[r] = 0;
                    if (r == rows - 1 && r > 0 && !none) lab[r] = (int32_t)(classes - 1);
                    counted += lab[r] != -1;
                }
                const double norm = none ? 0.0 : (double)counted * (nv % 2 ? 1.5 : 1.0);
                double rl = 0, ml = 0, *rd = da(n), *md = da(n);
                for (int64_t r = 0; r < rows; r++) {
                    const float *xr = x + r * classes;
                    const int32_t y = lab[r];
                    if (y == -1) continue; /* rd, md stay 0: exact zeros */
                    double mx = -INFINITY, mn = INFINITY, z = 0;
                    for (int64_t j = 0; j < classes; j++)
                        mx = fmax(mx, xr[j]), mn = fmin(mn, xr[j]);
                    for (int64_t j = 0; j < classes; j++) z += exp(xr[j] - mx);
                    const double lse = mx + log(z);
                    /* -sum q log p, q = (1 - sm) onehot + sm / classes */
                    double lq = 0;
                    for (int64_t j = 0; j < classes; j++)
                        lq += ((j == y ? 1.0 - sm : 0.0) + sm / (double)classes) * (lse - xr[j]);
                    rl += lq;
                    /* exp(x - max) in float errs in proportion to |x - max| */
                    ml += fabs(lse) + fabs(xr[y]) + (mx - mn) + sm * (fabs(mx) + fabs(mn));
                    for (int64_t j = 0; j < classes; j++) {
                        const double p = exp(xr[j] - mx) / z,
                                     q = (j == y ? 1.0 - sm : 0.0) + sm / (double)classes;
                        rd[r * classes + j] = (p - q) / norm;
                        md[r * classes + j] = (p * (1.0 + (mx - xr[j])) + q) / norm;
                    }
                }
                if (counted) rl /= norm, ml /= norm;
                float *dl = fa(n);
                double loss = NAN;
                for (int rep = 0; rep < 2; rep++) {
                    kt t;
                    kt_begin(&t, dev, rep);
                    const int32_t *d_lab = kt_in_i(&t, lab, rows);
                    float *d_dl = NULL;
                    loss = NAN;
                    if (mode == 2) {
                        d_dl = kt_io(&t, x, n);
                        CHECK_OK(K->softmax_xent(dev, rows, classes, d_dl, d_lab, norm, sm,
                                                 &loss, d_dl));
                    } else {
                        const float *d_x = kt_in(&t, x, n);
                        if (mode == 0) d_dl = kt_out(&t, n);
                        CHECK_OK(K->softmax_xent(dev, rows, classes, d_x, d_lab, norm, sm,
                                                 &loss, d_dl));
                    }
                    kt_host(&t, &loss, sizeof loss);
                    if (d_dl) kt_get(&t, d_dl, dl, n);
                    kt_end(&t);
                }
                det_check();
                check_close1("loss", loss, rl, ml, TOL);
                if (mode != 1) check_close("dlogits", dl, rd, md, n, TOL);
            }
    /* labels outside [-1, classes): an error naming the row */
    static const struct {
        int64_t row;
        int32_t label;
        const char *needle;
    } bad[] = {{3, 4, "row 3"}, {2, -2, "row 2"}, {4, 1 << 30, "row 4"}};
    for (int i = 0; i < 3; i++) {
        const int64_t rows = 5, classes = 4;
        set_case("label %d at row %lld, classes %lld", (int)bad[i].label, LL(bad[i].row),
                 LL(classes));
        const float *x = rnd(rows * classes, 1.0f, 0.0f);
        int32_t *lab = rndi(rows, classes);
        lab[bad[i].row] = bad[i].label;
        kt t;
        kt_begin(&t, dev, 0);
        const float *d_x = kt_in(&t, x, rows * classes);
        const int32_t *d_lab = kt_in_i(&t, lab, rows);
        float *d_dl = kt_out(&t, rows * classes);
        double loss = 0;
        CHECK_FAILS(K->softmax_xent(dev, rows, classes, d_x, d_lab, (double)rows, 0.0, &loss,
                                    d_dl),
                    GP_INVALID_ARGUMENT, bad[i].needle);
        kt_end(&t);
        g_st[g_op].exact++;
    }
    /* a smoothing outside [0, 1) */
    const double bad_sm[] = {1.0, -0.1, NAN};
    for (int i = 0; i < 3; i++) {
        const int64_t rows = 3, classes = 4;
        set_case("label smoothing %g", bad_sm[i]);
        const float *x = rnd(rows * classes, 1.0f, 0.0f);
        int32_t *lab = rndi(rows, classes);
        kt t;
        kt_begin(&t, dev, 0);
        const float *d_x = kt_in(&t, x, rows * classes);
        const int32_t *d_lab = kt_in_i(&t, lab, rows);
        double loss = 0;
        CHECK_FAILS(K->softmax_xent(dev, rows, classes, d_x, d_lab, (double)rows, bad_sm[i],
                                    &loss, NULL),
                    GP_INVALID_ARGUMENT, "label smoothing");
        kt_end(&t);
        g_st[g_op].exact++;
    }
}

/* ----------------------------------------------------------- convolutions */

/* C, H, W, k, stride, pad, batch, OC: 1x1 direct, 3x3 "same" (stride 1, pad 1: the fast
 * im2col and dx as a convolution), pad > what "same" needs, strides 2 and 3 (dx through
 * col2im), kernels wider than the stride (overlaps), a batch above the 16 gradient groups, and
 * an image large enough that its columns go in bands of rows; more 3x3 "same" layers with odd
 * sizes, a 1x1 image, and the ConvNets' 28x28 and 14x14 planes; small outputs whose examples go
 * into a GEMM in chunks (7x7 and 14x14 to 7x7, batches that the groups and chunks do not divide);
 * output channel counts that the direct path tiles 8, 16 and 24 wide (and 48 with AVX-512:
 * forward and weight gradient to 48 channels, input gradients to 96 by the flipped convolution
 * and to 48 by phase at stride 2), with padded lanes (20, 40), pixels and taps that do not fill its last tile, and batches whose weight gradients it
 * sums in several chunks of examples (with and without padding, stride 2); its input gradients
 * by phase at strides 2 and 3, with phases that no tap reaches (1x1 at stride 2, k 2 at stride
 * 3), and padding beyond k - 1 at stride 1 (dx through im2col after it); 3x3 "same" layers
 * where Winograd applies both ways (forward and dx), with odd sizes (tiles past the edge),
 * output channels that its panels of 4 do not divide, images narrower than a row of 8 tiles
 * and wider than two, chunks of tile rows that cross examples, and one example of 28x28 alone;
 * three where it computes the weight gradient too, in groups of tile rows (odd sizes, input
 * channels its panels of 3 do not divide, groups across examples; more groups than a round
 * holds: conv2d_dw_rounds). Every case runs on each path of the CPU (Winograd with the direct tile, the direct tile
 * alone, where the processor has AVX2 and FMA; im2col and OpenBLAS). */
static const int64_t conv_cases[][8] = {
    {1, 1, 1, 1, 1, 0, 1, 1},   {4, 3, 5, 1, 1, 0, 3, 2},   {1, 5, 5, 3, 1, 1, 2, 3},
    {3, 7, 6, 3, 2, 1, 3, 2},   {2, 8, 8, 5, 2, 2, 1, 4},   {2, 9, 7, 4, 3, 0, 2, 1},
    {1, 6, 5, 2, 2, 0, 4, 2},   {3, 4, 5, 3, 1, 2, 2, 3},   {1, 17, 16, 3, 2, 1, 1, 2},
    {3, 6, 7, 3, 1, 1, 19, 5},  {2, 5, 4, 1, 2, 0, 3, 3},   {64, 48, 48, 3, 1, 1, 1, 4},
    {8, 7, 9, 3, 1, 1, 5, 6},   {4, 14, 14, 3, 1, 1, 12, 4}, {5, 28, 28, 3, 1, 1, 3, 8},
    {4, 1, 1, 3, 1, 1, 2, 4},   {6, 7, 7, 3, 1, 1, 7, 5},   {4, 14, 14, 3, 2, 1, 9, 6},
    {3, 14, 14, 1, 2, 0, 10, 4}, {24, 7, 7, 3, 1, 1, 3, 48},  {6, 14, 14, 3, 2, 1, 2, 32},
    {16, 5, 5, 3, 1, 1, 2, 24},  {3, 9, 9, 3, 1, 1, 2, 20},  {2, 6, 6, 3, 1, 0, 2, 40},
    {33, 4, 4, 1, 1, 0, 2, 16},  {4, 28, 28, 3, 1, 1, 13, 20}, {3, 30, 30, 3, 1, 0, 9, 16},
    {2, 60, 60, 3, 2, 1, 7, 8},  {4, 5, 5, 3, 1, 3, 2, 8},    {24, 9, 9, 1, 2, 0, 3, 24},
    {16, 8, 7, 2, 3, 0, 2, 8},   {32, 28, 28, 3, 1, 1, 3, 32}, {20, 9, 13, 3, 1, 1, 5, 30},
    {24, 3, 37, 3, 1, 1, 3, 26}, {16, 2, 64, 3, 1, 1, 2, 40}, {96, 7, 7, 3, 1, 1, 9, 48},
    {18, 28, 28, 3, 1, 1, 1, 29}, {40, 9, 13, 3, 1, 1, 8, 30}, {96, 7, 7, 3, 1, 1, 20, 48},
    {48, 9, 11, 3, 2, 1, 3, 24}};
#define NCONV ((int)(sizeof conv_cases / sizeof conv_cases[0]))

static gp_conv_geom conv_geom(int ci, int64_t *batch, int64_t *oc) {
    const int64_t *c = conv_cases[ci];
    gp_conv_geom g = {.channels = c[0], .height = c[1], .width = c[2], .kernel = c[3],
                      .stride = c[4], .pad = c[5]};
    g.out_h = (g.height + 2 * g.pad - g.kernel) / g.stride + 1;
    g.out_w = (g.width + 2 * g.pad - g.kernel) / g.stride + 1;
    *batch = c[6], *oc = c[7];
    return g;
}

/* The CPU's convolution paths: Winograd and the direct tile, the direct tile alone (where the
 * processor has them; other devices ignore the switches), and im2col with OpenBLAS. Each case
 * below computes its double reference once and runs its kernel on every path (the reference
 * took three quarters of this test's time when it was made again for each path). */
static const struct {
    const char *name;
    bool direct, winograd;
} conv_path_list[] = {{" (winograd)", true, true}, {" (direct)", true, false},
                      {" (im2col)", false, false}};
#define NCONV_PATHS ((int)(sizeof conv_path_list / sizeof conv_path_list[0]))

/* A convolution case (its arrays live until the next case), then each path it runs on, named
 * after it in messages. */
static char g_conv_case[sizeof g_case];

static void conv_set_case(const gp_conv_geom *g, int64_t B, int64_t OC, const char *extra) {
    set_case("B %lld, C %lld H %lld W %lld -> OC %lld, k %lld stride %lld pad %lld -> %lldx%lld%s",
             LL(B), LL(g->channels), LL(g->height), LL(g->width), LL(OC), LL(g->kernel),
             LL(g->stride), LL(g->pad), LL(g->out_h), LL(g->out_w), extra);
    memcpy(g_conv_case, g_case, sizeof g_case);
}

static void conv_path_set(int pi) {
    gp_conv_path_enable(GP_CONV_DIRECT, conv_path_list[pi].direct);
    gp_conv_path_enable(GP_CONV_WINOGRAD, conv_path_list[pi].winograd);
    snprintf(g_case, sizeof g_case, "%s%s", g_conv_case, conv_path_list[pi].name);
}

/* Runs a convolution test whose cases go over the paths (conv_path_set), after checking that
 * the cases reach Winograd where the processor has its tiles, and puts the switches back. */
static void conv_paths(gp_device *dev, const gp_kernels *K,
                       void (*cases)(gp_device *, const gp_kernels *)) {
    const bool was = gp_conv_path_enable(GP_CONV_DIRECT, true);
    const bool was_wg = gp_conv_path_enable(GP_CONV_WINOGRAD, true);
    int64_t B, OC;
    const gp_conv_geom probe = conv_geom(NCONV - 9, &B, &OC); /* 32 channels, 28x28 */
    if (gp_conv_direct_applies(&probe, OC)) { /* AVX2 and FMA: the cases must reach Winograd */
        int fwd = 0, dx = 0, dw = 0;
        for (int ci = 0; ci < NCONV; ci++) {
            const gp_conv_geom g = conv_geom(ci, &B, &OC);
            gp_conv_geom gt;
            fwd += gp_conv_winograd_applies(&g, OC);
            dx += gp_conv_dx_geom(&g, OC, &gt) && gp_conv_winograd_applies(&gt, g.channels);
            dw += gp_conv_winograd_dw_applies(&g, B, OC);
        }
        if (fwd < 8 || dx < 8 || dw < 3)
            fail("Winograd serves %d forward, %d input-gradient and %d weight-gradient cases, "
                 "expected 8, 8 and 3", fwd, dx, dw);
    }
    cases(dev, K);
    gp_conv_path_enable(GP_CONV_DIRECT, was);
    gp_conv_path_enable(GP_CONV_WINOGRAD, was_wg);
}

/* Index in one example's x of tap (c, ki, kj) of output pixel (oh, ow), or -1 for padding. */
static int64_t tap(const gp_conv_geom *g, int64_t c, int64_t ki, int64_t kj, int64_t oh,
                   int64_t ow) {
    const int64_t ih = oh * g->stride - g->pad + ki, iw = ow * g->stride - g->pad + kj;
    if (ih < 0 || ih >= g->height || iw < 0 || iw >= g->width) return -1;
    return (c * g->height + ih) * g->width + iw;
}

static void conv2d_ws_cases(gp_device *dev, const gp_kernels *K) {
    for (int ci = 0; ci < NCONV; ci++) {
        int64_t B, OC;
        const gp_conv_geom g = conv_geom(ci, &B, &OC);
        conv_set_case(&g, B, OC, "");
        for (int pi = 0; pi < NCONV_PATHS; pi++) {
            conv_path_set(pi);
            for (int mode = 0; mode < 3; mode++) {
                const int64_t w = K->conv2d_ws(dev, &g, B, OC, mode > 0, mode == 2);
                if (w < 0) fail("workspace of %lld floats (mode %d)", LL(w), mode);
                if (K->conv2d_ws(dev, &g, B, OC, mode > 0, mode == 2) != w)
                    fail("workspace size changes between calls (mode %d)", mode);
            }
            if (K->conv2d_ws(dev, &g, B, OC, true, false) >
                K->conv2d_ws(dev, &g, B, OC, true, true))
                fail("backward without dx asks for more workspace than with it");
            g_st[g_op].exact++;
        }
    }
}

static void conv2d_forward_cases(gp_device *dev, const gp_kernels *K) {
    for (int ci = 0; ci < NCONV; ci++) {
        int64_t B, OC;
        const gp_conv_geom g = conv_geom(ci, &B, &OC);
        const int64_t C = g.channels, k = g.kernel, P = g.out_h * g.out_w;
        const int64_t nx = B * C * g.height * g.width, nw = OC * C * k * k, ny = B * OC * P;
        conv_set_case(&g, B, OC, "");
        const float *x = rnd(nx, 1.0f, 0.0f), *w = rnd(nw, 0.5f, 0.0f);
        float *y = fa(ny);
        double *ref = da(ny), *mag = da(ny);
        for (int64_t b = 0; b < B; b++)
            for (int64_t o = 0; o < OC; o++)
                for (int64_t p = 0; p < P; p++) {
                    double r = 0, m = 0;
                    for (int64_t c = 0; c < C; c++)
                        for (int64_t ki = 0; ki < k; ki++)
                            for (int64_t kj = 0; kj < k; kj++) {
                                const int64_t i = tap(&g, c, ki, kj, p / g.out_w, p % g.out_w);
                                if (i < 0) continue;
                                const double t = (double)w[((o * C + c) * k + ki) * k + kj] *
                                                 x[b * C * g.height * g.width + i];
                                r += t, m += fabs(t);
                            }
                    ref[(b * OC + o) * P + p] = r, mag[(b * OC + o) * P + p] = m;
                }
        for (int pi = 0; pi < NCONV_PATHS; pi++) {
            conv_path_set(pi);
            const int64_t nws = K->conv2d_ws(dev, &g, B, OC, false, false);
            for (int rep = 0; rep < 2; rep++) {
                kt t;
                kt_begin(&t, dev, rep);
                const float *d_x = kt_in(&t, x, nx), *d_w = kt_in(&t, w, nw);
                float *d_y = kt_out(&t, ny), *d_ws = nws ? kt_out(&t, nws) : NULL;
                CHECK_OK(K->conv2d_forward(dev, &g, B, OC, d_x, d_w, NULL, d_y, d_ws));
                kt_get(&t, d_y, y, ny);
                kt_end(&t);
            }
            det_check();
            check_close("y", y, ref, mag, ny, TOL);
        }
    }
}

static void conv2d_backward_cases(gp_device *dev, const gp_kernels *K) {
    for (int ci = 0; ci < NCONV; ci++)
        for (int want_dx = 0; want_dx < 2; want_dx++) {
            int64_t B, OC;
            const gp_conv_geom g = conv_geom(ci, &B, &OC);
            const int64_t C = g.channels, k = g.kernel, P = g.out_h * g.out_w;
            const int64_t HW = g.height * g.width, nx = B * C * HW, nw = OC * C * k * k;
            const int64_t ny = B * OC * P;
            conv_set_case(&g, B, OC, want_dx ? ", dx" : ", no dx");
            const float *x = rnd(nx, 1.0f, 0.0f), *w = rnd(nw, 0.5f, 0.0f);
            const float *dy = rnd(ny, 1.0f, 0.0f), *dw0 = rnd(nw, 1.0f, 0.0f);
            float *dx = fa(nx), *dw = fa(nw);
            double *rx = da(nx), *mx = da(nx), *rw = da(nw), *mw = da(nw);
            for (int64_t i = 0; i < nw; i++) rw[i] = dw0[i], mw[i] = fabs(dw0[i]);
            for (int64_t b = 0; b < B; b++)
                for (int64_t o = 0; o < OC; o++)
                    for (int64_t p = 0; p < P; p++) {
                        const double d = dy[(b * OC + o) * P + p];
                        for (int64_t c = 0; c < C; c++)
                            for (int64_t ki = 0; ki < k; ki++)
                                for (int64_t kj = 0; kj < k; kj++) {
                                    const int64_t i = tap(&g, c, ki, kj, p / g.out_w, p % g.out_w);
                                    if (i < 0) continue;
                                    const int64_t wi = ((o * C + c) * k + ki) * k + kj;
                                    const double tw = d * x[b * C * HW + i], tx = d * w[wi];
                                    rw[wi] += tw, mw[wi] += fabs(tw);
                                    rx[b * C * HW + i] += tx, mx[b * C * HW + i] += fabs(tx);
                                }
                    }
            for (int pi = 0; pi < NCONV_PATHS; pi++) {
                conv_path_set(pi);
                const int64_t nws = K->conv2d_ws(dev, &g, B, OC, true, want_dx);
                for (int rep = 0; rep < 2; rep++) {
                    kt t;
                    kt_begin(&t, dev, rep);
                    const float *d_x = kt_in(&t, x, nx), *d_w = kt_in(&t, w, nw);
                    const float *d_dy = kt_in(&t, dy, ny);
                    float *d_dw = kt_io(&t, dw0, nw), *d_dx = want_dx ? kt_out(&t, nx) : NULL;
                    float *d_ws = nws ? kt_out(&t, nws) : NULL;
                    CHECK_OK(
                        K->conv2d_backward(dev, &g, B, OC, d_x, d_w, NULL, d_dy, d_dx, d_dw, d_ws));
                    kt_get(&t, d_dw, dw, nw);
                    if (want_dx) kt_get(&t, d_dx, dx, nx);
                    kt_end(&t);
                }
                det_check();
                check_close("dw", dw, rw, mw, nw, TOL);
                if (want_dx) check_close("dx", dx, rx, mx, nx, TOL);
            }
        }
}

static void test_conv2d_ws(gp_device *dev, const gp_kernels *K) {
    conv_paths(dev, K, conv2d_ws_cases);
}
static void test_conv2d_forward(gp_device *dev, const gp_kernels *K) {
    conv_paths(dev, K, conv2d_forward_cases);
}
/* Winograd's weight gradient over a batch of 17 groups of tile rows, more than a round of 16
 * (its sums add round by round): against the direct tile's (checked against the double
 * reference on the cases above; a reference here would cost minutes under the sanitizers),
 * within 1e-5 of a bound on the magnitude of each sum, max |x| times the sum of |dy| over the
 * output channel. */
static void conv2d_dw_rounds(gp_device *dev, const gp_kernels *K) {
    const int64_t B = 32, C = 32, OC = 32, H = 28, P = H * H;
    const gp_conv_geom g = {.channels = C, .height = H, .width = H, .kernel = 3, .stride = 1,
                            .pad = 1, .out_h = H, .out_w = H};
    const bool was = gp_conv_path_enable(GP_CONV_WINOGRAD, true);
    if (!gp_conv_winograd_dw_applies(&g, B, OC)) { /* no AVX2 and FMA here */
        gp_conv_path_enable(GP_CONV_WINOGRAD, was);
        return;
    }
    set_case("B %lld, C %lld %lldx%lld -> OC %lld: Winograd's weight gradient in two rounds of "
             "groups against the direct tile's", LL(B), LL(C), LL(H), LL(H), LL(OC));
    const int64_t nx = B * C * P, ny = B * OC * P, nw = OC * C * 9;
    const float *x = rnd(nx, 1.0f, 0.0f), *dy = rnd(ny, 1.0f, 0.0f), *dw0 = rnd(nw, 1.0f, 0.0f);
    float *dw[2] = {fa(nw), fa(nw)};
    for (int path = 0; path < 2; path++) { /* Winograd, then the direct tile */
        gp_conv_path_enable(GP_CONV_WINOGRAD, path == 0);
        const int64_t nws = K->conv2d_ws(dev, &g, B, OC, true, false);
        kt t;
        kt_begin(&t, dev, 0);
        const float *d_x = kt_in(&t, x, nx), *d_dy = kt_in(&t, dy, ny);
        float *d_dw = kt_io(&t, dw0, nw), *d_ws = nws ? kt_out(&t, nws) : NULL;
        CHECK_OK(K->conv2d_backward(dev, &g, B, OC, d_x, NULL, NULL, d_dy, NULL, d_dw, d_ws));
        kt_get(&t, d_dw, dw[path], nw);
        kt_end(&t);
    }
    gp_conv_path_enable(GP_CONV_WINOGRAD, was);
    double xmax = 0;
    for (int64_t i = 0; i < nx; i++) xmax = fmax(xmax, fabs(x[i]));
    int64_t bad = 0;
    for (int64_t o = 0; o < OC; o++) {
        double dysum = 0;
        for (int64_t b = 0; b < B; b++)
            for (int64_t p = 0; p < P; p++) dysum += fabs(dy[(b * OC + o) * P + p]);
        for (int64_t i = o * C * 9; i < (o + 1) * C * 9; i++)
            if (!(fabs((double)dw[0][i] - dw[1][i]) <= 1e-5 * (xmax * dysum + fabs(dw0[i]))))
                if (bad++ < MAX_SHOWN)
                    fail("dw[%lld] = %.9g by Winograd, %.9g by the direct tile (bound %.3g)",
                         LL(i), dw[0][i], dw[1][i], xmax * dysum);
    }
    if (bad > MAX_SHOWN) fail("dw: %lld more values apart", LL(bad - MAX_SHOWN));
    g_st[g_op].compared += nw;
}

static void test_conv2d_backward(gp_device *dev, const gp_kernels *K) {
    conv_paths(dev, K, conv2d_backward_cases);
    if (strcmp(gp_device_kind(dev), "cpu") == 0) conv2d_dw_rounds(dev, K);
}

/* conv2d_wt_floats: >= 0, the same at every call, 0 off the Winograd path (im2col, the direct
 * tile alone, kernels other than 3x3, every other device); a CPU device whose variant has
 * Winograd's tiles asks for one in every forward and input gradient of the cases it serves. */
static void conv2d_wt_floats_cases(gp_device *dev, const gp_kernels *K) {
    const bool cpu = strcmp(gp_device_kind(dev), "cpu") == 0;
    int used = 0, reachable = 0;
    for (int ci = 0; ci < NCONV; ci++) {
        int64_t B, OC;
        const gp_conv_geom g = conv_geom(ci, &B, &OC);
        conv_set_case(&g, B, OC, "");
        for (int pi = 0; pi < NCONV_PATHS; pi++) {
            conv_path_set(pi);
            gp_conv_geom gt;
            if (pi == 0)
                reachable += gp_conv_winograd_applies(&g, OC) +
                             (gp_conv_dx_geom(&g, OC, &gt) &&
                              gp_conv_winograd_applies(&gt, g.channels));
            for (int flipped = 0; flipped < 2; flipped++) {
                const int64_t n = K->conv2d_wt_floats(dev, &g, OC, flipped);
                if (n < 0 || K->conv2d_wt_floats(dev, &g, OC, flipped) != n)
                    fail("%lld floats of transformed weights (flipped %d), then %lld", LL(n),
                         flipped, LL(K->conv2d_wt_floats(dev, &g, OC, flipped)));
                if (n && (!cpu || !conv_path_list[pi].winograd || g.kernel != 3))
                    fail("%lld floats of transformed weights (flipped %d) off the Winograd path",
                         LL(n), flipped);
                used += n > 0 && pi == 0;
                g_st[g_op].exact++;
            }
        }
    }
    /* (a device of a variant without the tiles, cpu-baseline, has none) */
    if (cpu && used && used != reachable)
        fail("transformed weights for %d of the %d forwards and input gradients Winograd serves",
             used, reachable);
}

/* conv2d_wt: where conv2d_wt_floats is 0, a named error. Elsewhere the forward (flipped: the
 * input gradient) given its weights' transform makes the bits it makes transforming them
 * itself, and given another weights' transform it makes the bits of those weights: it computes
 * with what it is given, so a caller that kept a transform past a change of the weights would
 * compute with the old ones (layers/conv2d.c keys its transforms by the weights' generation). */
static void conv2d_wt_cases(gp_device *dev, const gp_kernels *K) {
    for (int ci = 0; ci < NCONV; ci++) {
        int64_t B, OC;
        const gp_conv_geom g = conv_geom(ci, &B, &OC);
        const int64_t C = g.channels, k = g.kernel;
        const int64_t nx = B * C * g.height * g.width, nw = OC * C * k * k;
        const int64_t ny = B * OC * g.out_h * g.out_w;
        conv_set_case(&g, B, OC, "");
        const float *x = rnd(nx, 1.0f, 0.0f), *dy = rnd(ny, 1.0f, 0.0f);
        const float *w = rnd(nw, 0.5f, 0.0f), *w2 = rnd(nw, 0.5f, 0.0f);
        for (int pi = 0; pi < NCONV_PATHS; pi++) {
            conv_path_set(pi);
            for (int flipped = 0; flipped < 2; flipped++) {
                const int64_t n = K->conv2d_wt_floats(dev, &g, OC, flipped);
                kt t;
                if (!n) {
                    kt_begin(&t, dev, 0);
                    const float *d_w = kt_in(&t, w, nw);
                    CHECK_FAILS(K->conv2d_wt(dev, &g, OC, d_w, flipped, kt_out(&t, 1)),
                                GP_INVALID_ARGUMENT, "no transformed weights");
                    kt_end(&t);
                    continue;
                }
                const int64_t nout = flipped ? nx : ny;
                const int64_t nws = K->conv2d_ws(dev, &g, B, OC, flipped, flipped);
                float *out[4] = {fa(nout), fa(nout), fa(nout), fa(nout)};
                for (int rep = 0; rep < 2; rep++) {
                    kt_begin(&t, dev, rep);
                    const float *d_x = kt_in(&t, x, nx), *d_dy = kt_in(&t, dy, ny);
                    const float *d_w[2] = {kt_in(&t, w, nw), kt_in(&t, w2, nw)};
                    float *d_wt[2] = {kt_out(&t, n), kt_out(&t, n)};
                    float *d_ws = nws ? kt_out(&t, nws) : NULL;
                    for (int i = 0; i < 2; i++)
                        CHECK_OK(K->conv2d_wt(dev, &g, OC, d_w[i], flipped, d_wt[i]));
                    /* w itself, w with its transform, w with w2's, w2 itself */
                    const float *ws_of[4] = {d_w[0], d_w[0], d_w[0], d_w[1]};
                    const float *wt_of[4] = {NULL, d_wt[0], d_wt[1], NULL};
                    for (int v = 0; v < 4; v++) {
                        float *d_o = kt_out(&t, nout);
                        if (flipped)
                            CHECK_OK(K->conv2d_backward(dev, &g, B, OC, d_x, ws_of[v], wt_of[v],
                                                        d_dy, d_o, NULL, d_ws));
                        else
                            CHECK_OK(K->conv2d_forward(dev, &g, B, OC, d_x, ws_of[v], wt_of[v],
                                                       d_o, d_ws));
                        kt_get(&t, d_o, out[v], nout);
                    }
                    kt_end(&t);
                }
                det_check();
                const char *what = flipped ? "the input gradient" : "the forward";
                if (memcmp(out[1], out[0], (size_t)nout * sizeof(float)) != 0)
                    fail("%s given its weights' transform: not the bits it makes itself", what);
                if (memcmp(out[2], out[3], (size_t)nout * sizeof(float)) != 0)
                    fail("%s given other weights' transform: not the bits of those weights",
                         what);
                if (memcmp(out[2], out[0], (size_t)nout * sizeof(float)) == 0)
                    fail("%s given other weights' transform: the bits of its own", what);
                g_st[g_op].exact += 3 * nout;
            }
        }
    }
}

static void test_conv2d_wt_floats(gp_device *dev, const gp_kernels *K) {
    conv_paths(dev, K, conv2d_wt_floats_cases);
}
static void test_conv2d_wt(gp_device *dev, const gp_kernels *K) {
    conv_paths(dev, K, conv2d_wt_cases);
}

static const int64_t cb_cases[][3] = {{1, 1, 1}, {2, 3, 7}, {4, 5, 49}, {1, 16, 1}, {3, 2, 1000}};
#define NCB ((int)(sizeof cb_cases / sizeof cb_cases[0]))

static void test_channel_bias_add(gp_device *dev, const gp_kernels *K) {
    for (int ci = 0; ci < NCB; ci++) {
        const int64_t B = cb_cases[ci][0], C = cb_cases[ci][1], P = cb_cases[ci][2], n = B * C * P;
        set_case("B %lld C %lld pixels %lld", LL(B), LL(C), LL(P));
        const float *bias = rnd(C, 1.0f, 0.0f), *y0 = rnd(n, 1.0f, 0.0f);
        float *y = fa(n), *want = fa(n);
        for (int64_t i = 0; i < n; i++) want[i] = y0[i] + bias[(i / P) % C]; /* one rounding */
        for (int rep = 0; rep < 2; rep++) {
            kt t;
            kt_begin(&t, dev, rep);
            const float *d_b = kt_in(&t, bias, C);
            float *d_y = kt_io(&t, y0, n);
            CHECK_OK(K->channel_bias_add(dev, B, C, P, d_b, d_y));
            kt_get(&t, d_y, y, n);
            kt_end(&t);
        }
        det_check();
        check_exact("y", y, want, n);
    }
}

static void test_channel_bias_grad(gp_device *dev, const gp_kernels *K) {
    for (int ci = 0; ci < NCB; ci++) {
        const int64_t B = cb_cases[ci][0], C = cb_cases[ci][1], P = cb_cases[ci][2], n = B * C * P;
        set_case("B %lld C %lld pixels %lld", LL(B), LL(C), LL(P));
        const float *dy = rnd(n, 1.0f, 0.0f), *db0 = rnd(C, 1.0f, 0.0f);
        float *db = fa(C);
        double *ref = da(C), *mag = da(C);
        for (int64_t c = 0; c < C; c++) ref[c] = db0[c], mag[c] = fabs(db0[c]);
        for (int64_t i = 0; i < n; i++) ref[(i / P) % C] += dy[i], mag[(i / P) % C] += fabs(dy[i]);
        for (int rep = 0; rep < 2; rep++) {
            kt t;
            kt_begin(&t, dev, rep);
            const float *d_dy = kt_in(&t, dy, n);
            float *d_db = kt_io(&t, db0, C);
            CHECK_OK(K->channel_bias_grad(dev, B, C, P, d_dy, d_db));
            kt_get(&t, d_db, db, C);
            kt_end(&t);
        }
        det_check();
        check_close("db", db, ref, mag, C, TOL);
    }
}

/* -------------------------------------------------------------- batch norm */

/* The last is past 8 MB, where the CPU's writes stream past the caches (planes of 999 floats:
 * most start off a 32-byte boundary). */
static const int64_t bn_cases[][3] = {{2, 1, 1},   {1, 3, 7},   {4, 2, 9},
                                      {3, 5, 17},  {8, 4, 49},  {8, 3, 1000},
                                      {64, 33, 999}};
#define NBN ((int)(sizeof bn_cases / sizeof bn_cases[0]))

static gp_bn_dims bn_dims(int ci) {
    return (gp_bn_dims){bn_cases[ci][0], bn_cases[ci][1], bn_cases[ci][2], 1e-5, 0.1};
}

static void test_batchnorm_forward(gp_device *dev, const gp_kernels *K) {
    static const bool modes[][2] = {{true, true}, {true, false}, {false, false}};
    static const char *const names[] = {"batch statistics, running ones updated",
                                        "batch statistics, running ones kept",
                                        "running statistics"};
    for (int ci = 0; ci < NBN; ci++)
        for (int mi = 0; mi < 3; mi++) {
            const gp_bn_dims d = bn_dims(ci);
            const int64_t B = d.batch, C = d.channels, HW = d.hw, n = B * C * HW;
            const bool bs = modes[mi][0], ur = modes[mi][1];
            set_case("B %lld C %lld HW %lld, %s", LL(B), LL(C), LL(HW), names[mi]);
            const float *x = rnd(n, 1.5f, 0.7f), *gamma = rnd(C, 1.0f, 0.0f);
            const float *beta = rnd(C, 1.0f, 0.0f), *rm0 = rnd(C, 0.5f, 0.0f);
            const float *rv0 = rndu(C, 0.5f, 2.0f);
            double *ry = da(n), *my = da(n), *rs = da(2 * C), *ms = da(2 * C);
            double *rrm = da(C), *mrm = da(C), *rrv = da(C), *mrv = da(C);
            const double N = (double)(B * HW);
            for (int64_t c = 0; c < C; c++) {
                double mean, invstd, amean = 0;
                for (int64_t b = 0; b < B; b++)
                    for (int64_t i = 0; i < HW; i++) amean += fabs(x[(b * C + c) * HW + i]);
                amean /= N;
                rrm[c] = rm0[c], mrm[c] = 0; /* unchanged: exact */
                rrv[c] = rv0[c], mrv[c] = 0;
                if (bs) {
                    double s = 0, ss = 0;
                    for (int64_t b = 0; b < B; b++)
                        for (int64_t i = 0; i < HW; i++) s += x[(b * C + c) * HW + i];
                    mean = s / N;
                    for (int64_t b = 0; b < B; b++)
                        for (int64_t i = 0; i < HW; i++) {
                            const double e = x[(b * C + c) * HW + i] - mean;
                            ss += e * e;
                        }
                    invstd = 1.0 / sqrt(ss / N + d.eps);
                    rs[c] = mean, ms[c] = amean;
                    if (ur) { /* unbiased variance into the running one */
                        rrm[c] = (1 - d.momentum) * rm0[c] + d.momentum * mean;
                        mrm[c] = (1 - d.momentum) * fabs(rm0[c]) + d.momentum * amean;
                        rrv[c] = (1 - d.momentum) * rv0[c] + d.momentum * ss / (N - 1);
                        mrv[c] = rrv[c];
                    }
                } else {
                    mean = rm0[c];
                    invstd = 1.0 / sqrt((double)rv0[c] + d.eps);
                    rs[c] = mean, ms[c] = 0;
                }
                rs[C + c] = invstd, ms[C + c] = invstd;
                for (int64_t b = 0; b < B; b++)
                    for (int64_t i = 0; i < HW; i++) {
                        const int64_t o = (b * C + c) * HW + i;
                        ry[o] = (x[o] - mean) * invstd * gamma[c] + beta[c];
                        my[o] = fabs(gamma[c]) * invstd * (fabs(x[o]) + fabs(mean)) +
                                fabs(beta[c]);
                    }
            }
            float *y = fa(n), *stats = fa(2 * C), *rm = fa(C), *rv = fa(C);
            for (int rep = 0; rep < 2; rep++) {
                kt t;
                kt_begin(&t, dev, rep);
                const float *d_x = kt_in(&t, x, n), *d_g = kt_in(&t, gamma, C);
                const float *d_b = kt_in(&t, beta, C);
                float *d_rm = kt_io(&t, rm0, C), *d_rv = kt_io(&t, rv0, C);
                float *d_st = kt_out(&t, 2 * C), *d_y = kt_out(&t, n);
                CHECK_OK(K->batchnorm_forward(dev, &d, d_x, d_g, d_b, d_rm, d_rv, bs, ur, d_st,
                                              d_y));
                kt_get(&t, d_y, y, n);
                kt_get(&t, d_st, stats, 2 * C);
                kt_get(&t, d_rm, rm, C);
                kt_get(&t, d_rv, rv, C);
                kt_end(&t);
            }
            det_check();
            check_close("y", y, ry, my, n, TOL);
            check_close("stats", stats, rs, ms, 2 * C, TOL);
            check_close("running_mean", rm, rrm, mrm, C, TOL);
            check_close("running_var", rv, rrv, mrv, C, TOL);
        }
}

static void test_batchnorm_backward(gp_device *dev, const gp_kernels *K) {
    for (int ci = 0; ci < NBN; ci++)
        for (int mode = 0; mode < 4; mode++) {
            const gp_bn_dims d = bn_dims(ci);
            const int64_t B = d.batch, C = d.channels, HW = d.hw, n = B * C * HW;
            const bool bs = mode & 1, want_dx = !(mode & 2);
            set_case("B %lld C %lld HW %lld, %s statistics, dx %s", LL(B), LL(C), LL(HW),
                     bs ? "batch" : "running", want_dx ? "yes" : "NULL");
            const float *x = rnd(n, 1.5f, 0.7f), *dy = rnd(n, 1.0f, 0.0f);
            const float *gamma = rnd(C, 1.0f, 0.0f);
            const float *dg0 = rnd(C, 1.0f, 0.0f), *dbt0 = rnd(C, 1.0f, 0.0f);
            /* stats (mean, 1/sqrt(var + eps)) as forward gives them, in float */
            float *stats = fa(2 * C);
            const double N = (double)(B * HW);
            for (int64_t c = 0; c < C; c++) {
                double s = 0, ss = 0;
                for (int64_t b = 0; b < B; b++)
                    for (int64_t i = 0; i < HW; i++) s += x[(b * C + c) * HW + i];
                for (int64_t b = 0; b < B; b++)
                    for (int64_t i = 0; i < HW; i++)
                        ss += (x[(b * C + c) * HW + i] - s / N) * (x[(b * C + c) * HW + i] - s / N);
                /* running statistics: some other mean and variance */
                stats[c] = (float)(bs ? s / N : 0.3 * (double)c - 0.2);
                stats[C + c] = (float)(1.0 / sqrt((bs ? ss / N : 0.5 + 0.25 * (double)c) + d.eps));
            }
            double *rx = da(n), *mx = da(n), *rg = da(C), *mg = da(C), *rbt = da(C), *mbt = da(C);
            for (int64_t c = 0; c < C; c++) {
                const double m = stats[c], is = stats[C + c];
                double sdy = 0, msdy = 0, sdyx = 0, msdyx = 0; /* sum dy; sum dy xhat */
                for (int64_t b = 0; b < B; b++)
                    for (int64_t i = 0; i < HW; i++) {
                        const int64_t o = (b * C + c) * HW + i;
                        const double amp = is * (fabs(x[o]) + fabs(m));
                        sdy += dy[o], msdy += fabs(dy[o]);
                        sdyx += dy[o] * (x[o] - m) * is, msdyx += fabs(dy[o]) * amp;
                    }
                rg[c] = dg0[c] + sdyx, mg[c] = fabs(dg0[c]) + msdyx;
                rbt[c] = dbt0[c] + sdy, mbt[c] = fabs(dbt0[c]) + msdy;
                const double k1 = (double)gamma[c] * is;
                for (int64_t b = 0; b < B; b++)
                    for (int64_t i = 0; i < HW; i++) {
                        const int64_t o = (b * C + c) * HW + i;
                        const double xh = (x[o] - m) * is, amp = is * (fabs(x[o]) + fabs(m));
                        if (bs) {
                            rx[o] = k1 * (dy[o] - sdy / N - xh * sdyx / N);
                            mx[o] = fabs(k1) * (fabs(dy[o]) + msdy / N + amp * msdyx / N);
                        } else {
                            rx[o] = k1 * dy[o];
                            mx[o] = fabs(k1 * dy[o]);
                        }
                    }
            }
            float *dx = fa(n), *dg = fa(C), *dbt = fa(C);
            for (int rep = 0; rep < 2; rep++) {
                kt t;
                kt_begin(&t, dev, rep);
                const float *d_x = kt_in(&t, x, n), *d_dy = kt_in(&t, dy, n);
                const float *d_st = kt_in(&t, stats, 2 * C), *d_g = kt_in(&t, gamma, C);
                float *d_dx = want_dx ? kt_out(&t, n) : NULL;
                float *d_dg = kt_io(&t, dg0, C), *d_dbt = kt_io(&t, dbt0, C);
                CHECK_OK(K->batchnorm_backward(dev, &d, d_x, d_dy, d_st, d_g, bs, d_dx, d_dg,
                                               d_dbt));
                if (want_dx) kt_get(&t, d_dx, dx, n);
                kt_get(&t, d_dg, dg, C);
                kt_get(&t, d_dbt, dbt, C);
                kt_end(&t);
            }
            det_check();
            if (want_dx) check_close("dx", dx, rx, mx, n, TOL);
            check_close("dgamma", dg, rg, mg, C, TOL);
            check_close("dbeta", dbt, rbt, mbt, C, TOL);
        }
}

/* -------------------------------------------------------------------- ReLU */

static float *relu_inputs(int64_t n) {
    float *x = rnd(n, 1.0f, 0.0f);
    static const float specials[] = {0.0f, -0.0f, 1e-30f, -1e-30f, 1e30f, -1e30f};
    for (int64_t i = 1; i < n && i <= 6; i++) x[i] = specials[i - 1];
    return x;
}

static void test_relu_forward(gp_device *dev, const gp_kernels *K) {
    for (int si = 0; si < NVEC; si++) {
        const int64_t n = vec_sizes[si];
        set_case("n %lld", LL(n));
        const float *x = relu_inputs(n);
        float *y = fa(n), *want = fa(n);
        for (int64_t i = 0; i < n; i++) want[i] = x[i] > 0 ? x[i] : 0.0f;
        for (int rep = 0; rep < 2; rep++) {
            kt t;
            kt_begin(&t, dev, rep);
            const float *d_x = kt_in(&t, x, n);
            float *d_y = kt_out(&t, n);
            CHECK_OK(K->relu_forward(dev, n, d_x, d_y));
            kt_get(&t, d_y, y, n);
            kt_end(&t);
        }
        det_check();
        check_exact("y", y, want, n);
    }
}

static void test_relu_backward(gp_device *dev, const gp_kernels *K) {
    for (int si = 0; si < NVEC; si++) {
        const int64_t n = vec_sizes[si];
        set_case("n %lld", LL(n));
        const float *x = relu_inputs(n), *dy = rnd(n, 1.0f, 0.0f);
        float *dx = fa(n), *want = fa(n);
        for (int64_t i = 0; i < n; i++) want[i] = x[i] > 0 ? dy[i] : 0.0f;
        for (int rep = 0; rep < 2; rep++) {
            kt t;
            kt_begin(&t, dev, rep);
            const float *d_x = kt_in(&t, x, n), *d_dy = kt_in(&t, dy, n);
            float *d_dx = kt_out(&t, n);
            CHECK_OK(K->relu_backward(dev, n, d_x, d_dy, d_dx));
            kt_get(&t, d_dx, dx, n);
            kt_end(&t);
        }
        det_check();
        check_exact("dx", dx, want, n);
    }
}

/* ----------------------------------------------------------------- pooling */

static const int64_t pool_cases[][5] = {/* planes, H, W, kernel, stride */
                                        {1, 1, 1, 1, 1}, {2, 5, 5, 2, 2},   {3, 7, 6, 3, 2},
                                        {1, 4, 4, 3, 1}, {2, 9, 8, 3, 3},   {4, 28, 28, 2, 2},
                                        {1, 8, 7, 4, 3}, {3, 14, 14, 2, 2},
                                        /* the last two: NaNs and a plane of -inf */
                                        {3, 14, 30, 2, 2}, {3, 6, 6, 3, 2}};
#define NPOOL ((int)(sizeof pool_cases / sizeof pool_cases[0]))
#define POOL_SPECIAL(ci) ((ci) >= NPOOL - 2)

static gp_pool_dims pool_dims(int ci) {
    const int64_t *c = pool_cases[ci];
    return (gp_pool_dims){.planes = c[0], .height = c[1], .width = c[2],
                          .out_h = (c[1] - c[3]) / c[4] + 1, .out_w = (c[2] - c[3]) / c[4] + 1,
                          .kernel = c[3], .stride = c[4]};
}

/* Small integers, so windows have ties; the last two cases have a NaN in plane 0 (with 2x2
 * windows a second one, in a window's second row among the last windows of its row, which the
 * vector form loads under a mask) and a plane of -inf (plane 1). */
static float *pool_inputs(int ci, const gp_pool_dims *d) {
    const int64_t hw = d->height * d->width, n = d->planes * hw;
    float *x = rnd(n, 2.0f, 0.0f);
    for (int64_t i = 0; i < n; i++) x[i] = roundf(x[i]);
    if (POOL_SPECIAL(ci)) {
        x[2 * d->width + 3] = NAN;
        if (d->kernel == 2) x[5 * d->width + d->width - 9] = NAN;
        for (int64_t i = 0; i < hw; i++) x[hw + i] = -INFINITY;
    }
    return x;
}

/* The maximum of each window and its index h*W + w: the first in row-major window order,
 * a NaN over any number. */
static void ref_maxpool(const gp_pool_dims *d, const float *x, float *y, int32_t *arg) {
    const int64_t W = d->width, hw = d->height * W, ohw = d->out_h * d->out_w;
    for (int64_t p = 0; p < d->planes; p++)
        for (int64_t oh = 0; oh < d->out_h; oh++)
            for (int64_t ow = 0; ow < d->out_w; ow++) {
                const int64_t first = oh * d->stride * W + ow * d->stride;
                float best = -INFINITY;
                int64_t idx = first;
                bool nan = false;
                for (int64_t ki = 0; ki < d->kernel; ki++)
                    for (int64_t kj = 0; kj < d->kernel; kj++) {
                        const int64_t i = first + ki * W + kj;
                        const float v = x[p * hw + i];
                        if (nan) continue;
                        if (isnan(v)) nan = true, best = v, idx = i;
                        else if (v > best) best = v, idx = i;
                    }
                y[p * ohw + oh * d->out_w + ow] = best;
                arg[p * ohw + oh * d->out_w + ow] = (int32_t)idx;
            }
}

static void test_maxpool_forward(gp_device *dev, const gp_kernels *K) {
    for (int ci = 0; ci < NPOOL; ci++) {
        const gp_pool_dims d = pool_dims(ci);
        const int64_t n = d.planes * d.height * d.width, no = d.planes * d.out_h * d.out_w;
        set_case("planes %lld H %lld W %lld, kernel %lld stride %lld -> %lldx%lld%s",
                 LL(d.planes), LL(d.height), LL(d.width), LL(d.kernel), LL(d.stride),
                 LL(d.out_h), LL(d.out_w), POOL_SPECIAL(ci) ? ", NaNs and a plane of -inf" : "");
        const float *x = pool_inputs(ci, &d);
        float *y = fa(no), *want = fa(no);
        int32_t *arg = ia(no), *want_arg = ia(no);
        ref_maxpool(&d, x, want, want_arg);
        for (int rep = 0; rep < 2; rep++) {
            kt t;
            kt_begin(&t, dev, rep);
            const float *d_x = kt_in(&t, x, n);
            float *d_y = kt_out(&t, no);
            int32_t *d_arg = kt_out_i(&t, no);
            CHECK_OK(K->maxpool_forward(dev, &d, d_x, d_y, d_arg));
            kt_get(&t, d_y, y, no);
            kt_get(&t, d_arg, arg, no);
            kt_end(&t);
        }
        det_check();
        check_exact("y", y, want, no);
        check_exact_i("argmax", arg, want_arg, no);
    }
}

static void test_maxpool_backward(gp_device *dev, const gp_kernels *K) {
    for (int ci = 0; ci < NPOOL; ci++) {
        const gp_pool_dims d = pool_dims(ci);
        const int64_t hw = d.height * d.width, n = d.planes * hw,
                      ohw = d.out_h * d.out_w, no = d.planes * ohw;
        set_case("planes %lld H %lld W %lld, kernel %lld stride %lld -> %lldx%lld", LL(d.planes),
                 LL(d.height), LL(d.width), LL(d.kernel), LL(d.stride), LL(d.out_h),
                 LL(d.out_w));
        const float *x = pool_inputs(ci, &d), *dy = rnd(no, 1.0f, 0.0f);
        float *y = fa(no), *dx = fa(n);
        int32_t *arg = ia(no);
        ref_maxpool(&d, x, y, arg);
        double *ref = da(n), *mag = da(n); /* 0 where no window's maximum is: exact */
        for (int64_t p = 0; p < d.planes; p++)
            for (int64_t i = 0; i < ohw; i++) {
                ref[p * hw + arg[p * ohw + i]] += dy[p * ohw + i];
                mag[p * hw + arg[p * ohw + i]] += fabs(dy[p * ohw + i]);
            }
        for (int rep = 0; rep < 2; rep++) {
            kt t;
            kt_begin(&t, dev, rep);
            const int32_t *d_arg = kt_in_i(&t, arg, no);
            const float *d_dy = kt_in(&t, dy, no);
            float *d_dx = kt_out(&t, n);
            CHECK_OK(K->maxpool_backward(dev, &d, d_arg, d_dy, d_dx));
            kt_get(&t, d_dx, dx, n);
            kt_end(&t);
        }
        det_check();
        check_close("dx", dx, ref, mag, n, TOL);
    }
}

static const int64_t avg_cases[][2] = {{1, 1}, {3, 7}, {8, 49}, {2, 64}, {5, 1000}};
#define NAVG ((int)(sizeof avg_cases / sizeof avg_cases[0]))

static void test_avgpool_forward(gp_device *dev, const gp_kernels *K) {
    for (int ci = 0; ci < NAVG; ci++) {
        const int64_t planes = avg_cases[ci][0], hw = avg_cases[ci][1], n = planes * hw;
        set_case("planes %lld hw %lld", LL(planes), LL(hw));
        const float *x = rnd(n, 1.0f, 0.5f);
        float *y = fa(planes);
        double *ref = da(planes), *mag = da(planes);
        for (int64_t p = 0; p < planes; p++) {
            for (int64_t i = 0; i < hw; i++) ref[p] += x[p * hw + i], mag[p] += fabs(x[p * hw + i]);
            ref[p] /= (double)hw, mag[p] /= (double)hw;
        }
        for (int rep = 0; rep < 2; rep++) {
            kt t;
            kt_begin(&t, dev, rep);
            const float *d_x = kt_in(&t, x, n);
            float *d_y = kt_out(&t, planes);
            CHECK_OK(K->avgpool_forward(dev, planes, hw, d_x, d_y));
            kt_get(&t, d_y, y, planes);
            kt_end(&t);
        }
        det_check();
        check_close("y", y, ref, mag, planes, TOL);
    }
}

static void test_avgpool_backward(gp_device *dev, const gp_kernels *K) {
    for (int ci = 0; ci < NAVG; ci++) {
        const int64_t planes = avg_cases[ci][0], hw = avg_cases[ci][1], n = planes * hw;
        set_case("planes %lld hw %lld", LL(planes), LL(hw));
        const float *dy = rnd(planes, 1.0f, 0.0f);
        float *dx = fa(n);
        double *ref = da(n);
        for (int64_t i = 0; i < n; i++) ref[i] = (double)dy[i / hw] / (double)hw;
        for (int rep = 0; rep < 2; rep++) {
            kt t;
            kt_begin(&t, dev, rep);
            const float *d_dy = kt_in(&t, dy, planes);
            float *d_dx = kt_out(&t, n);
            CHECK_OK(K->avgpool_backward(dev, planes, hw, d_dy, d_dx));
            kt_get(&t, d_dx, dx, n);
            kt_end(&t);
        }
        det_check();
        check_close("dx", dx, ref, NULL, n, TOL); /* a quotient: relative to itself */
    }
}

/* --------------------------------------------------------------- optimizers */

static void test_sgd_update(gp_device *dev, const gp_kernels *K) {
    static const struct {
        float lr, wd, momentum;
        bool buf;
    } cases[] = {{0.1f, 0.0f, 0.0f, false},
                 {0.05f, 0.01f, 0.0f, false},
                 {0.1f, 0.0f, 0.9f, true},
                 {0.01f, 5e-4f, 0.9f, true},
                 {0.1f, 0.1f, 0.0f, true}};
    for (int si = 0; si < NVEC; si++)
        for (size_t ci = 0; ci < sizeof cases / sizeof cases[0]; ci++) {
            const int64_t n = vec_sizes[si];
            const float lr = cases[ci].lr, wd = cases[ci].wd, mom = cases[ci].momentum;
            const bool hb = cases[ci].buf;
            set_case("n %lld, lr %g wd %g momentum %g, %s", LL(n), (double)lr, (double)wd,
                     (double)mom, hb ? "momentum buffer" : "no buffer");
            const float *w0 = rnd(n, 1.0f, 0.0f), *g = rnd(n, 1.0f, 0.0f);
            const float *buf0 = rnd(n, 0.5f, 0.0f);
            float *w = fa(n), *buf = fa(n);
            for (int rep = 0; rep < 2; rep++) {
                kt t;
                kt_begin(&t, dev, rep);
                const float *d_g = kt_in(&t, g, n);
                float *d_w = kt_io(&t, w0, n), *d_buf = hb ? kt_io(&t, buf0, n) : NULL;
                CHECK_OK(K->sgd_update(dev, n, d_w, d_g, d_buf, lr, wd, mom));
                kt_get(&t, d_w, w, n);
                if (hb) kt_get(&t, d_buf, buf, n);
                kt_end(&t);
            }
            det_check();
            /* d = g + wd w; buf = momentum buf + d; w -= lr buf (lr d without a buffer), each
             * step in float, any multiply-add possibly fused */
            int shown_w = 0, shown_b = 0;
            for (int64_t i = 0; i < n; i++) {
                const float d[2] = {g[i] + mulr(wd, w0[i]), fmaf(wd, w0[i], g[i])};
                float cand[4];
                if (hb) {
                    for (int k = 0; k < 2; k++) {
                        cand[2 * k] = mulr(mom, buf0[i]) + d[k];
                        cand[2 * k + 1] = fmaf(mom, buf0[i], d[k]);
                    }
                    check_oneof("buf", i, buf[i], cand, 4, &shown_b);
                    const float wc[2] = {w0[i] - mulr(lr, buf[i]), fmaf(-lr, buf[i], w0[i])};
                    check_oneof("w", i, w[i], wc, 2, &shown_w);
                } else {
                    for (int k = 0; k < 2; k++) {
                        cand[2 * k] = w0[i] - mulr(lr, d[k]);
                        cand[2 * k + 1] = fmaf(-lr, d[k], w0[i]);
                    }
                    check_oneof("w", i, w[i], cand, 4, &shown_w);
                }
            }
        }
}

static void test_adamw_update(gp_device *dev, const gp_kernels *K) {
    static const struct {
        float lr, wd;
        int t;
    } cases[] = {{1e-3f, 0.01f, 1}, {1e-3f, 0.0f, 10}, {3e-2f, 0.1f, 1000}};
    for (int si = 0; si < NVEC; si++)
        for (size_t ci = 0; ci < sizeof cases / sizeof cases[0]; ci++) {
            const int64_t n = vec_sizes[si];
            const float lr = cases[ci].lr, wd = cases[ci].wd;
            const int step = cases[ci].t;
            set_case("n %lld, lr %g wd %g, step %d", LL(n), (double)lr, (double)wd, step);
            const float b1 = 0.9f, b2 = 0.999f;
            const gp_adamw_step s = {
                .decay = 1.0f - lr * wd,
                .beta1 = b1,
                .beta2 = b2,
                .eps = 1e-8f,
                .step_size = (float)(lr / (1.0 - pow(b1, step))),
                .bc2_sqrt = (float)sqrt(1.0 - pow(b2, step)),
            };
            const float *w0 = rnd(n, 1.0f, 0.0f), *g = rnd(n, 1.0f, 0.0f);
            float *m0 = rnd(n, 0.1f, 0.0f), *v0 = rndu(n, 0.0f, 0.01f);
            if (n > 2) m0[1] = v0[1] = 0.0f; /* a fresh moment: denominator eps */
            float *w = fa(n), *m = fa(n), *v = fa(n);
            for (int rep = 0; rep < 2; rep++) {
                kt t;
                kt_begin(&t, dev, rep);
                const float *d_g = kt_in(&t, g, n);
                float *d_w = kt_io(&t, w0, n), *d_m = kt_io(&t, m0, n), *d_v = kt_io(&t, v0, n);
                CHECK_OK(K->adamw_update(dev, n, d_w, d_g, d_m, d_v, &s));
                kt_get(&t, d_w, w, n);
                kt_get(&t, d_m, m, n);
                kt_get(&t, d_v, v, n);
                kt_end(&t);
            }
            det_check();
            /* m = b1 m + (1 - b1) g; v = b2 v + (1 - b2) g^2;
             * w = w decay - step_size m / (sqrt(v) / bc2_sqrt + eps), in float, any
             * multiply-add possibly fused; w is checked from the m and v the device wrote */
            const float omb1 = 1.0f - b1, omb2 = 1.0f - b2;
            int shown_w = 0, shown_m = 0, shown_v = 0;
            for (int64_t i = 0; i < n; i++) {
                const float gm = mulr(g[i], omb1), mb = mulr(m0[i], b1);
                const float cm[3] = {mb + gm, fmaf(m0[i], b1, gm), fmaf(g[i], omb1, mb)};
                check_oneof("m", i, m[i], cm, 3, &shown_m);
                const float gg = mulr(g[i], g[i]), gv = mulr(gg, omb2), vb = mulr(v0[i], b2);
                const float cv[3] = {vb + gv, fmaf(v0[i], b2, gv), fmaf(gg, omb2, vb)};
                check_oneof("v", i, v[i], cv, 3, &shown_v);
                const float den = divr(sqrtf(v[i]), s.bc2_sqrt) + s.eps;
                const float upd = divr(m[i], den), wi = mulr(w0[i], s.decay);
                const float cw[3] = {wi - mulr(s.step_size, upd), fmaf(-s.step_size, upd, wi),
                                     fmaf(w0[i], s.decay, -mulr(s.step_size, upd))};
                check_oneof("w", i, w[i], cw, 3, &shown_w);
            }
        }
}

/* ------------------------------------------------- tensor-parallel shards */

/* Shard s of S over n: [first, first + rows), as the mesh splits a dimension. */
static void shard_of(int64_t n, int S, int s, int64_t *first, int64_t *rows) {
    *first = n * s / S;
    *rows = n * (s + 1) / S - *first;
}

static void test_embedding_shard_forward(gp_device *dev, const gp_kernels *K) {
    for (int ci = 0; ci < NEMB; ci++)
        for (int S = 1; S <= 3; S++)
            for (int sh = 0; sh < S; sh++) {
                const int64_t rows = emb_cases[ci][0], row_len = emb_cases[ci][1],
                              dim = emb_cases[ci][2], vocab = emb_cases[ci][3], n = rows * row_len;
                int64_t first, nrows;
                shard_of(vocab, S, sh, &first, &nrows);
                if (nrows < 1) continue;
                set_case("rows %lld row_len %lld dim %lld vocab %lld, shard %d of %d [%lld, %lld)",
                         LL(rows), LL(row_len), LL(dim), LL(vocab), sh, S, LL(first),
                         LL(first + nrows));
                const int32_t *ids = emb_ids(n, vocab);
                const float *w = rnd(nrows * dim, 1.0f, 0.0f);
                float *y = fa(n * dim), *want = fa(n * dim);
                for (int64_t i = 0; i < n; i++)
                    for (int64_t j = 0; j < dim; j++) {
                        const int64_t r = ids[i] - first;
                        want[i * dim + j] = r >= 0 && r < nrows ? w[r * dim + j] : 0.0f;
                    }
                for (int rep = 0; rep < 2; rep++) {
                    kt t;
                    kt_begin(&t, dev, rep);
                    const int32_t *d_ids = kt_in_i(&t, ids, n);
                    const float *d_w = kt_in(&t, w, nrows * dim);
                    float *d_y = kt_out(&t, n * dim);
                    CHECK_OK(K->embedding_shard_forward(dev, n, row_len, dim, vocab, first, nrows,
                                                        d_ids, d_w, d_y));
                    kt_get(&t, d_y, y, n * dim);
                    kt_end(&t);
                }
                det_check();
                check_exact("y", y, want, n * dim);
            }
    /* an id outside the whole vocabulary, and a shard outside it */
    set_case("id 11 at position 4, vocab 11, shard [5, 11)");
    int32_t *ids = rndi(6, 11);
    ids[4] = 11;
    const float *w = rnd(6 * 3, 1.0f, 0.0f);
    kt t;
    kt_begin(&t, dev, 0);
    const int32_t *d_ids = kt_in_i(&t, ids, 6);
    const float *d_w = kt_in(&t, w, 6 * 3);
    float *d_y = kt_out(&t, 6 * 3);
    CHECK_FAILS(K->embedding_shard_forward(dev, 6, 3, 3, 11, 5, 6, d_ids, d_w, d_y),
                GP_INVALID_ARGUMENT, "position 4 (row 1, column 1)");
    ids[4] = 0;
    CHECK_FAILS(K->embedding_shard_forward(dev, 6, 3, 3, 11, 6, 6, d_ids, d_w, d_y),
                GP_INVALID_ARGUMENT, "shard [6, 12) is not within [0, 11)");
    kt_end(&t);
    g_st[g_op].exact += 2;
}

static void test_embedding_shard_backward(gp_device *dev, const gp_kernels *K) {
    for (int ci = 0; ci < NEMB; ci++)
        for (int S = 1; S <= 3; S++)
            for (int sh = 0; sh < S; sh++) {
                const int64_t rows = emb_cases[ci][0], row_len = emb_cases[ci][1],
                              dim = emb_cases[ci][2], vocab = emb_cases[ci][3], n = rows * row_len;
                int64_t first, nrows;
                shard_of(vocab, S, sh, &first, &nrows);
                if (nrows < 1) continue;
                set_case("rows %lld row_len %lld dim %lld vocab %lld, shard %d of %d", LL(rows),
                         LL(row_len), LL(dim), LL(vocab), sh, S);
                const int32_t *ids = emb_ids(n, vocab);
                const float *dy = rnd(n * dim, 1.0f, 0.0f), *dw0 = rnd(nrows * dim, 1.0f, 0.0f);
                float *dw = fa(nrows * dim);
                double *ref = da(nrows * dim), *mag = da(nrows * dim);
                for (int64_t i = 0; i < nrows * dim; i++) ref[i] = dw0[i], mag[i] = fabs(dw0[i]);
                for (int64_t i = 0; i < n; i++) {
                    const int64_t r = ids[i] - first;
                    if (r < 0 || r >= nrows) continue;
                    for (int64_t j = 0; j < dim; j++) {
                        ref[r * dim + j] += dy[i * dim + j];
                        mag[r * dim + j] += fabs(dy[i * dim + j]);
                    }
                }
                for (int rep = 0; rep < 2; rep++) {
                    kt t;
                    kt_begin(&t, dev, rep);
                    const int32_t *d_ids = kt_in_i(&t, ids, n);
                    const float *d_dy = kt_in(&t, dy, n * dim);
                    float *d_dw = kt_io(&t, dw0, nrows * dim);
                    CHECK_OK(K->embedding_shard_backward(dev, n, row_len, dim, vocab, first, nrows,
                                                         d_ids, d_dy, d_dw));
                    kt_get(&t, d_dw, dw, nrows * dim);
                    kt_end(&t);
                }
                det_check();
                check_close("dw", dw, ref, mag, nrows * dim, TOL);
            }
    set_case("id -1 at position 2, vocab 11");
    int32_t *ids = rndi(6, 11);
    ids[2] = -1;
    const float *dy = rnd(6 * 3, 1.0f, 0.0f), *dw0 = rnd(6 * 3, 1.0f, 0.0f);
    kt t;
    kt_begin(&t, dev, 0);
    const int32_t *d_ids = kt_in_i(&t, ids, 6);
    const float *d_dy = kt_in(&t, dy, 6 * 3);
    float *d_dw = kt_io(&t, dw0, 6 * 3);
    CHECK_FAILS(K->embedding_shard_backward(dev, 6, 3, 3, 11, 5, 6, d_ids, d_dy, d_dw),
                GP_INVALID_ARGUMENT, "position 2");
    kt_end(&t);
    g_st[g_op].exact++;
}

static void test_row_max(gp_device *dev, const gp_kernels *K) {
    static const int64_t cases[][2] = {{1, 1}, {3, 7}, {17, 33}, {2, 1000}};
    for (int ci = 0; ci < 4; ci++)
        for (int nan = 0; nan < 2; nan++) {
            const int64_t rows = cases[ci][0], cols = cases[ci][1];
            set_case("rows %lld cols %lld%s", LL(rows), LL(cols), nan ? ", a NaN in row 0" : "");
            float *x = rnd(rows * cols, 3.0f, -1.0f), *got = fa(rows), *want = fa(rows);
            if (rows > 1) x[cols + cols / 2] = x[cols]; /* a tie */
            if (nan) x[cols / 2] = NAN;
            for (int64_t r = 0; r < rows; r++) {
                float m = x[r * cols];
                for (int64_t j = 1; j < cols; j++) m = fmaxf(m, x[r * cols + j]);
                want[r] = m;
            }
            if (nan) want[0] = NAN;
            for (int rep = 0; rep < 2; rep++) {
                kt t;
                kt_begin(&t, dev, rep);
                const float *d_x = kt_in(&t, x, rows * cols);
                float *d_o = kt_out(&t, rows);
                CHECK_OK(K->row_max(dev, rows, cols, d_x, d_o));
                kt_get(&t, d_o, got, rows);
                kt_end(&t);
            }
            det_check();
            check_exact("max", got, want, rows);
        }
}

/* The shards' pieces of a softmax cross-entropy against the whole-row formulas in double. */
typedef struct xent_case {
    int64_t rows, vocab;
    int S;
    float sd;
} xent_case;
static const xent_case xent_cases[] = {{1, 2, 2, 1.0f},   {5, 7, 3, 2.0f},   {17, 33, 2, 1.0f},
                                       {8, 100, 4, 30.0f}, {3, 256, 2, 5.0f}, {4, 6, 1, 1.0f}};
#define NXENT ((int)(sizeof xent_cases / sizeof xent_cases[0]))

static int32_t *xent_labels(int64_t rows, int64_t vocab) {
    int32_t *lab = rndi(rows, vocab);
    for (int64_t r = 0; r < rows; r++) {
        if (r % 3 == 1) lab[r] = -1;
        if (r == 0) lab[r] = 0;
        if (r == rows - 1 && r > 0) lab[r] = (int32_t)(vocab - 1);
    }
    return lab;
}

static void test_xent_shard_sums(gp_device *dev, const gp_kernels *K) {
    for (int ci = 0; ci < NXENT; ci++)
        for (int sh = 0; sh < xent_cases[ci].S; sh++)
            for (int smoothed = 0; smoothed < 2; smoothed++) {
                const xent_case *c = &xent_cases[ci];
                const double smoothing = smoothed ? 0.1 : 0.0;
                const int64_t n = (smoothed ? 3 : 2) * c->rows;
                int64_t first, ncl;
                shard_of(c->vocab, c->S, sh, &first, &ncl);
                set_case("rows %lld vocab %lld, shard %d of %d: classes [%lld, %lld), smoothing %g",
                         LL(c->rows), LL(c->vocab), sh, c->S, LL(first), LL(first + ncl),
                         smoothing);
                const float *x = rnd(c->rows * ncl, c->sd, 0.0f);
                const int32_t *lab = xent_labels(c->rows, c->vocab);
                float *mx = rnd(c->rows, 0.5f, c->sd), *got = fa(n);
                double *ref = da(n), *mag = da(n);
                for (int64_t r = 0; r < c->rows; r++) {
                    if (lab[r] == -1) continue; /* exact zeros */
                    for (int64_t j = 0; j < ncl; j++) {
                        const double xs = (double)x[r * ncl + j] - mx[r], e = exp(xs);
                        ref[r] += e;
                        mag[r] += e * (1.0 + fabs(xs));
                        if (smoothed) {
                            ref[2 * c->rows + r] += xs;
                            mag[2 * c->rows + r] += fabs(x[r * ncl + j]) + fabs(mx[r]);
                        }
                    }
                    const int64_t y = lab[r];
                    if (y >= first && y < first + ncl) {
                        ref[c->rows + r] = (double)x[r * ncl + y - first] - mx[r];
                        mag[c->rows + r] = fabs(x[r * ncl + y - first]) + fabs(mx[r]);
                    }
                }
                for (int rep = 0; rep < 2; rep++) {
                    kt t;
                    kt_begin(&t, dev, rep);
                    const float *d_x = kt_in(&t, x, c->rows * ncl), *d_mx = kt_in(&t, mx, c->rows);
                    const int32_t *d_lab = kt_in_i(&t, lab, c->rows);
                    float *d_s = kt_out(&t, n);
                    CHECK_OK(K->xent_shard_sums(dev, c->rows, ncl, c->vocab, first, d_x, d_lab,
                                                d_mx, smoothing, d_s));
                    kt_get(&t, d_s, got, n);
                    kt_end(&t);
                }
                det_check();
                check_close("sums", got, ref, mag, n, TOL);
            }
    set_case("label 7 at row 1, vocab 7");
    int32_t *lab = rndi(3, 7);
    lab[1] = 7;
    const float *x = rnd(3 * 4, 1.0f, 0.0f), *mx = rnd(3, 1.0f, 2.0f);
    kt t;
    kt_begin(&t, dev, 0);
    const float *d_x = kt_in(&t, x, 12), *d_mx = kt_in(&t, mx, 3);
    const int32_t *d_lab = kt_in_i(&t, lab, 3);
    float *d_s = kt_out(&t, 6);
    CHECK_FAILS(K->xent_shard_sums(dev, 3, 4, 7, 3, d_x, d_lab, d_mx, 0.0, d_s),
                GP_INVALID_ARGUMENT, "row 1");
    lab[1] = 2;
    CHECK_FAILS(K->xent_shard_sums(dev, 3, 4, 7, 3, d_x, kt_in_i(&t, lab, 3), d_mx, 1.0, d_s),
                GP_INVALID_ARGUMENT, "label smoothing 1");
    kt_end(&t);
    g_st[g_op].exact++;
}

static void test_xent_shard_finish(gp_device *dev, const gp_kernels *K) {
    static const char *const modes[] = {"dlogits separate", "dlogits NULL",
                                        "dlogits aliasing logits"};
    for (int ci = 0; ci < NXENT; ci++)
        for (int mode = 0; mode < 3; mode++)
            for (int smoothed = 0; smoothed < 2; smoothed++) {
                const xent_case *c = &xent_cases[ci];
                const int64_t rows = c->rows, V = c->vocab, ns = (smoothed ? 3 : 2) * rows;
                const double sm = smoothed ? 0.1 : 0.0, u = sm / (double)V;
                set_case("rows %lld vocab %lld, %s, smoothing %g", LL(rows), LL(V), modes[mode],
                         sm);
                /* The whole logits; each shard's part is a column block of them. */
                const float *xall = rnd(rows * V, c->sd, 0.0f);
                const int32_t *lab = xent_labels(rows, V);
                float *mx = fa(rows), *sums = fa(ns);
                double *rd = da(rows * V), *md = da(rows * V), rl = 0, ml = 0;
                int64_t counted = 0;
                for (int64_t r = 0; r < rows; r++) {
                    counted += lab[r] != -1;
                    float m = xall[r * V];
                    for (int64_t j = 1; j < V; j++) m = fmaxf(m, xall[r * V + j]);
                    mx[r] = m;
                    if (lab[r] == -1) continue;
                    double z = 0, shifted = 0;
                    for (int64_t j = 0; j < V; j++) {
                        z += exp((double)xall[r * V + j] - m);
                        shifted += (double)xall[r * V + j] - m;
                    }
                    sums[r] = (float)z;
                    sums[rows + r] = xall[r * V + lab[r]] - m;
                    if (smoothed) sums[2 * rows + r] = (float)shifted;
                }
                const double norm = (double)counted * 1.5;
                for (int64_t r = 0; r < rows; r++) {
                    const int32_t y = lab[r];
                    if (y == -1) continue;
                    const double z = sums[r];
                    rl += log(z) - (1.0 - sm) * (double)sums[rows + r] -
                          (smoothed ? u * (double)sums[2 * rows + r] : 0.0);
                    ml += fabs(log(z)) + fabs(sums[rows + r]) + 1.0;
                    for (int64_t j = 0; j < V; j++) {
                        const double xs = (double)xall[r * V + j] - mx[r];
                        const double p = exp(xs) / z, oh = j == y ? 1.0 - sm : 0.0;
                        rd[r * V + j] = (p - u - oh) / norm;
                        md[r * V + j] = (p * (1.0 + fabs(xs)) + u + oh) / norm;
                        ml += u * fabs(xs);
                    }
                }
                if (counted) rl /= norm, ml /= norm;
                for (int sh = 0; sh < c->S; sh++) {
                    int64_t first, ncl;
                    shard_of(V, c->S, sh, &first, &ncl);
                    snprintf(g_case, sizeof g_case,
                             "rows %lld vocab %lld, shard %d of %d, %s, smoothing %g", LL(rows),
                             LL(V), sh, c->S, modes[mode], sm);
                    float *x = fa(rows * ncl), *dl = fa(rows * ncl);
                    double *rds = da(rows * ncl), *mds = da(rows * ncl);
                    for (int64_t r = 0; r < rows; r++)
                        for (int64_t j = 0; j < ncl; j++) {
                            x[r * ncl + j] = xall[r * V + first + j];
                            rds[r * ncl + j] = rd[r * V + first + j];
                            mds[r * ncl + j] = md[r * V + first + j];
                        }
                    double loss = NAN;
                    for (int rep = 0; rep < 2; rep++) {
                        kt t;
                        kt_begin(&t, dev, rep);
                        const int32_t *d_lab = kt_in_i(&t, lab, rows);
                        const float *d_mx = kt_in(&t, mx, rows), *d_s = kt_in(&t, sums, ns);
                        float *d_dl = NULL;
                        loss = NAN;
                        if (mode == 2) {
                            d_dl = kt_io(&t, x, rows * ncl);
                            CHECK_OK(K->xent_shard_finish(dev, rows, ncl, V, first, d_dl, d_lab,
                                                          d_mx, d_s, norm, sm, &loss, d_dl));
                        } else {
                            const float *d_x = kt_in(&t, x, rows * ncl);
                            if (mode == 0) d_dl = kt_out(&t, rows * ncl);
                            CHECK_OK(K->xent_shard_finish(dev, rows, ncl, V, first, d_x, d_lab,
                                                          d_mx, d_s, norm, sm, &loss, d_dl));
                        }
                        kt_host(&t, &loss, sizeof loss);
                        if (d_dl) kt_get(&t, d_dl, dl, rows * ncl);
                        kt_end(&t);
                    }
                    det_check();
                    check_close1("loss", loss, rl, ml, TOL);
                    if (mode != 1) check_close("dlogits", dl, rds, mds, rows * ncl, TOL);
                }
            }
    set_case("normalizer 0 with labelled rows");
    const float *x = rnd(2 * 3, 1.0f, 0.0f), *mx = rnd(2, 1.0f, 2.0f), *sums = rndu(4, 1, 2);
    int32_t *lab = rndi(2, 3);
    kt t;
    kt_begin(&t, dev, 0);
    const float *d_x = kt_in(&t, x, 6), *d_mx = kt_in(&t, mx, 2), *d_s = kt_in(&t, sums, 4);
    const int32_t *d_lab = kt_in_i(&t, lab, 2);
    double loss = 0;
    CHECK_FAILS(K->xent_shard_finish(dev, 2, 3, 3, 0, d_x, d_lab, d_mx, d_s, 0.0, 0.0, &loss,
                                     NULL),
                GP_INVALID_ARGUMENT, "normalizer 0");
    CHECK_FAILS(K->xent_shard_finish(dev, 2, 3, 3, 0, d_x, d_lab, d_mx, d_s, 1.0, -0.5, &loss,
                                     NULL),
                GP_INVALID_ARGUMENT, "label smoothing -0.5");
    kt_end(&t);
    g_st[g_op].exact++;
}

/* ============================================================ bf16 operands */

/* n (even) bf16 values at device address p back into host. */
static void get16(kt *t, const uint16_t *p, uint16_t *host, int64_t n) {
    kt_get(t, p, host, n / 2);
}

/* got[i] == the bf16 bits of want[i], for every i. */
static void check_bf16_of(const char *what, const uint16_t *got, const float *want, int64_t n) {
    int64_t bad = 0;
    for (int64_t i = 0; i < n; i++)
        if (got[i] != gp_bf16_bits(want[i]) && bad++ < MAX_SHOWN)
            fail("%s: [%lld] 0x%04x, expected the bf16 of %.9g (0x%04x)", what, LL(i), got[i],
                 (double)want[i], gp_bf16_bits(want[i]));
}

static void check_same_bits(const char *what, const float *got, const float *want, int64_t n) {
    if (memcmp(got, want, (size_t)n * sizeof *got) != 0)
        fail("%s: not the bits of the same op on fp32 operands", what);
}

/* bf16_store: every element's bits are gp_bf16_bits of it (core/bf16.h, the rounding the bf16
 * products make), at each vector size (odd ones: the tail after whole vectors) with a tie to
 * even, -0, an infinity, a NaN and a denormal among them; the same on an fp32 device (a
 * conversion, not a product), and deterministic. */
static void test_bf16_store(gp_device *dev, const gp_kernels *K) {
    static const float special[] = {1.00390625f, -0.0f, INFINITY, NAN, 1e-40f, -3.0e38f};
    for (int si = 0; si < NVEC; si++) {
        const int64_t n = vec_sizes[si], words = (n + 1) / 2;
        set_case("n %lld", LL(n));
        float *x = rnd(n, 1.0f, 0.0f);
        for (int i = 0; i < 6 && i < n; i++) x[(i * 5) % n] = special[i];
        uint16_t *y = hmem((size_t)words * 4);
        for (int rep = 0; rep < 2; rep++) {
            kt t;
            kt_begin(&t, dev, rep);
            uint16_t *d16 = (uint16_t *)kt_out(&t, words);
            CHECK_OK(K->bf16_store(dev, kt_in(&t, x, n), d16, n));
            kt_get(&t, d16, y, words);
            kt_end(&t);
        }
        det_check();
        check_bf16_of("bf16_store", y, x, n);
        g_st[g_op].exact += n;
    }
}

/* The ops' bf16 operands (kernel_ops.def) on a bf16 device: layernorm_forward, gelu_forward and
 * attention_forward write the bf16 rounding of their fp32 outputs, bit for bit; linear_forward
 * and linear_backward given x16 = those bits give the bits of the same op given x (which a bf16
 * device rounds to the same values), and so do they given w16 = bf16_store's copy of w in place
 * of w (not read: NULL), alone or with x16. On an fp32 device x16 and w16 are refused. */
static void test_bf16_operands(gp_device *dev, const gp_kernels *K) {
    g_name = "bf16 operands";
    set_case("layernorm, gelu, attention, linear");
    const int64_t rows = 10, dim = 24, n = rows * dim, out = 12, ng = 1000;
    const gp_attn_dims d = {.batch = 2, .seq = 70, .dim = 32, .heads = 4};
    const int64_t nq = d.batch * d.seq * 3 * d.dim, na = d.batch * d.seq * d.dim;
    const float *x = rnd(n, 2.0f, 0.3f), *w = rnd(dim, 1.0f, 1.0f), *b = rnd(dim, 0.5f, 0.0f);
    const float *xg = rnd(ng, 3.0f, 0.0f), *qkv = rnd(nq, 1.0f, 0.0f);
    const float *wl = rnd(out * dim, 0.2f, 0.0f), *dy = rnd(rows * out, 1.0f, 0.0f);
    float *y = fa(n), *yg = fa(ng), *att = fa(na), *probs = fa(K->attention_saved(dev, &d));
    uint16_t *y16 = hmem((size_t)n * 2), *yg16 = hmem((size_t)ng * 2), *att16 = hmem((size_t)na * 2);
    float *st = fa(2 * rows), *lin[4], *dw[4], *dx[4];
    REQUIRE_OK(gp_device_set_precision(dev, GP_PRECISION_BF16));
    kt t;
    kt_begin(&t, dev, 0);
    const float *d_x = kt_in(&t, x, n), *d_w = kt_in(&t, w, dim), *d_b = kt_in(&t, b, dim);
    const float *d_xg = kt_in(&t, xg, ng), *d_qkv = kt_in(&t, qkv, nq);
    float *d_y = kt_out(&t, n), *d_st = kt_out(&t, 2 * rows), *d_yg = kt_out(&t, ng);
    float *d_att = kt_out(&t, na), *d_p = kt_out(&t, K->attention_saved(dev, &d));
    uint16_t *d_y16 = (uint16_t *)kt_out(&t, n / 2), *d_yg16 = (uint16_t *)kt_out(&t, ng / 2);
    uint16_t *d_att16 = (uint16_t *)kt_out(&t, na / 2);
    CHECK_OK(K->layernorm_forward(dev, rows, dim, d_x, d_w, d_b, d_y, NULL, d_st));
    CHECK_OK(K->layernorm_forward(dev, rows, dim, d_x, d_w, d_b, NULL, d_y16, d_st));
    CHECK_OK(K->gelu_forward(dev, ng, d_xg, d_yg, NULL));
    CHECK_OK(K->gelu_forward(dev, ng, d_xg, NULL, d_yg16));
    CHECK_OK(K->attention_forward(dev, &d, d_qkv, d_p, d_att, NULL));
    CHECK_OK(K->attention_forward(dev, &d, d_qkv, d_p, NULL, d_att16));
    kt_get(&t, d_y, y, n);
    kt_get(&t, d_yg, yg, ng);
    kt_get(&t, d_att, att, na);
    kt_get(&t, d_p, probs, K->attention_saved(dev, &d));
    kt_get(&t, d_st, st, 2 * rows);
    get16(&t, d_y16, y16, n);
    get16(&t, d_yg16, yg16, ng);
    get16(&t, d_att16, att16, na);
    check_bf16_of("layernorm_forward y16", y16, y, n);
    check_bf16_of("gelu_forward y16", yg16, yg, ng);
    check_bf16_of("attention_forward att16", att16, att, na);
    /* the layer norm's output as the linear ops' x: in fp32 (bit 0 of i clear) and in bf16 (set);
     * the weight in fp32 (bit 1 clear) and as its bf16 copy (set) */
    const float *d_wl = kt_in(&t, wl, out * dim), *d_dy = kt_in(&t, dy, rows * out);
    uint16_t *d_wl16 = (uint16_t *)kt_out(&t, out * dim / 2);
    CHECK_OK(K->bf16_store(dev, d_wl, d_wl16, out * dim));
    for (int i = 0; i < 4; i++) {
        const float *xf = i & 1 ? NULL : d_y, *wf = i & 2 ? NULL : d_wl;
        const uint16_t *xh = i & 1 ? d_y16 : NULL, *wh = i & 2 ? d_wl16 : NULL;
        float *d_lin = kt_out(&t, rows * out), *d_dx = kt_out(&t, n);
        float *d_dw = kt_io(&t, wl, out * dim);
        CHECK_OK(K->linear_forward(dev, rows, dim, out, xf, xh, wf, wh, NULL, NULL, d_lin));
        CHECK_OK(
            K->linear_backward(dev, rows, dim, out, xf, xh, wf, wh, d_dy, d_dx, d_dw, NULL));
        lin[i] = fa(rows * out), dw[i] = fa(out * dim), dx[i] = fa(n);
        kt_get(&t, d_lin, lin[i], rows * out);
        kt_get(&t, d_dw, dw[i], out * dim);
        kt_get(&t, d_dx, dx[i], n);
    }
    static const char *const with[4] = {"", " with x16", " with w16", " with x16 and w16"};
    char what[64];
    for (int i = 1; i < 4; i++) {
        snprintf(what, sizeof what, "linear_forward%s", with[i]);
        check_same_bits(what, lin[i], lin[0], rows * out);
        snprintf(what, sizeof what, "linear_backward's dw%s", with[i]);
        check_same_bits(what, dw[i], dw[0], out * dim);
        snprintf(what, sizeof what, "linear_backward's dx%s", with[i]);
        check_same_bits(what, dx[i], dx[0], n);
    }
    REQUIRE_OK(gp_device_set_precision(dev, GP_PRECISION_FP32));
    float *d_lin = kt_out(&t, rows * out), *d_dx = kt_out(&t, n);
    CHECK_FAILS(K->linear_forward(dev, rows, dim, out, NULL, d_y16, d_wl, NULL, NULL, NULL, d_lin),
                GP_INVALID_ARGUMENT, "bf16 operand");
    CHECK_FAILS(K->linear_forward(dev, rows, dim, out, d_y, NULL, NULL, d_wl16, NULL, NULL, d_lin),
                GP_INVALID_ARGUMENT, "bf16 operand");
    CHECK_FAILS(
        K->linear_backward(dev, rows, dim, out, d_y, NULL, NULL, d_wl16, d_dy, d_dx, NULL, NULL),
        GP_INVALID_ARGUMENT, "bf16 operand");
    kt_end(&t);
    hfree();
}

/* ============================================================ the op list */

typedef struct op_test {
    const char *name;
    size_t offset; /* of the op's pointer in gp_kernels */
    void (*run)(gp_device *dev, const gp_kernels *K);
} op_test;

#define OP(field) {#field, offsetof(gp_kernels, field), test_##field}
static const op_test ops[] = {
    OP(gemm),
    OP(gemm_batched),
    OP(bf16_store),
    OP(fill),
    OP(scale),
    OP(axpy),
    OP(sum_rows_add),
    OP(sumsq),
    OP(linear_forward),
    OP(linear_backward),
    OP(layernorm_forward),
    OP(layernorm_backward),
    OP(gelu_forward),
    OP(gelu_backward),
    OP(dropout),
    OP(attention_forward),
    OP(attention_saved),
    OP(attention_backward_ws),
    OP(attention_backward),
    OP(embedding_forward),
    OP(embedding_backward),
    OP(pos_embedding_forward),
    OP(pos_embedding_backward),
    OP(softmax_xent),
    OP(conv2d_ws),
    OP(conv2d_wt_floats),
    OP(conv2d_wt),
    OP(conv2d_forward),
    OP(conv2d_backward),
    OP(channel_bias_add),
    OP(channel_bias_grad),
    OP(batchnorm_forward),
    OP(batchnorm_backward),
    OP(relu_forward),
    OP(relu_backward),
    OP(maxpool_forward),
    OP(maxpool_backward),
    OP(avgpool_forward),
    OP(avgpool_backward),
    OP(sgd_update),
    OP(adamw_update),
    OP(embedding_shard_forward),
    OP(embedding_shard_backward),
    OP(row_max),
    OP(xent_shard_sums),
    OP(xent_shard_finish),
};
#undef OP
#define NOPS (sizeof ops / sizeof ops[0])

/* A new op in gp_kernels stops this file from compiling until it has a test above. */
_Static_assert(sizeof(gp_kernels) == sizeof(const char *) + NOPS * sizeof(void (*)(void)),
               "gp_kernels has an op without a test in ops[] of tests/test_kernels.c");
_Static_assert(NOPS <= MAX_OPS, "raise MAX_OPS");

/* Every op slot of the table is in ops[] exactly once (with the size check above). */
static void check_op_list(void) {
    const size_t first = offsetof(gp_kernels, gemm), step = sizeof(void (*)(void));
    bool seen[MAX_OPS] = {false};
    for (size_t i = 0; i < NOPS; i++) {
        const size_t slot = (ops[i].offset - first) / step;
        if (ops[i].offset < first || (ops[i].offset - first) % step || slot >= NOPS ||
            seen[slot]) {
            fprintf(stderr, "test_kernels: ops[] entry %s is misplaced or repeated\n",
                    ops[i].name);
            gp_test_failures++;
            continue;
        }
        seen[slot] = true;
    }
}

/* What each device that ran was, for the comparisons of bits: its threads and whether its
 * kernels are a CPU variant with the AVX2 convolution tiles (other paths, other roundings). */
static struct {
    bool ran;
    int threads;
    bool conv_tiles;
} g_ran[NDEV];

static bool has_conv_tiles(const gp_kernels *K) {
    static const char *const names[] = {"baseline", "avx2", "avx512", "native"};
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
        const gp_cpu_variant *v;
        if (gp_cpu_isa_find(names[i], ~0u, &v) == GP_OK && v->kernels == K) return v->conv_tiles;
    }
    return false;
}

static void run_device(int di) {
    const test_device *td = &devices[di];
    g_devi = di;
    gp_device *dev = NULL;
    const gp_status made = td->make(td->name, &dev);
    if (made == GP_UNSUPPORTED && td->optional) {
        printf("[%s] skipped: %s\n", td->name, gp_last_error());
        return;
    }
    REQUIRE_OK(made);
    g_dev = td->name;
    const gp_kernels *K = gp_kernels_of(dev);
    g_ran[di].ran = true;
    g_ran[di].threads = gp_device_threads(dev);
    g_ran[di].conv_tiles = has_conv_tiles(K);
    if (!K || K != gp_device_kernels(dev) || !K->name) {
        fprintf(stderr, "[%s] no kernel table, or one without a name\n", td->name);
        gp_test_failures++;
        gp_device_free(dev);
        return;
    }
    memset(g_st, 0, sizeof g_st);
    g_stream = 0; /* every device gets the same inputs */
    printf("[%s] kernel table \"%s\": %d ops; bound |got - ref| <= %g (|ref| + magnitude)\n",
           td->name, K->name, (int)NOPS, TOL);
    for (size_t i = 0; i < NOPS; i++) {
        g_op = (int)i;
        g_name = ops[i].name;
        snprintf(g_case, sizeof g_case, "table");
        void (*fn)(void);
        memcpy(&fn, (const char *)K + ops[i].offset, sizeof fn);
        if (!fn) {
            fail("the op is NULL in the table: every device must implement every op");
            continue;
        }
        const int before = gp_test_failures;
        ops[i].run(dev, K);
        hfree();
        const op_stats *s = &g_st[i];
        printf("[%s] %-23s %3d cases %8lld compared, worst rel err %.2e %8lld exact%s\n",
               td->name, ops[i].name, s->cases, s->compared, s->worst, s->exact,
               gp_test_failures > before ? "  FAILED" : "");
    }
    const int before = gp_test_failures;
    test_bf16_operands(dev, K);
    printf("[%s] bf16 operands (layernorm, gelu, attention, linear)%s\n", td->name,
           gp_test_failures > before ? "  FAILED" : "");
    gp_mem_stats st;
    gp_device_mem_stats(dev, &st);
    if (st.live_total != 0) {
        fprintf(stderr, "[%s] %llu bytes still live after the tests\n", td->name,
                (unsigned long long)st.live_total);
        gp_test_failures++;
    }
    gp_device_free(dev);
}

int main(void) {
    check_op_list();
    test_bf16_round();
    _Static_assert(NDEV <= (int)(sizeof g_hash / sizeof g_hash[0]), "raise g_hash's devices");
    for (int i = 0; i < NDEV; i++) run_device(i);
    /* Devices that must agree bit for bit: every op's results, case by case (but those that split
     * GEMMs between devices of other thread counts, and the convolutions between CPU variants
     * with and without the AVX2 tiles). */
    for (int i = 0; i < NDEV; i++) {
        const int j = devices[i].same_bits_as;
        if (j < 0 || !g_ran[i].ran || !g_ran[j].ran) continue;
        const bool gemms = g_ran[i].threads == g_ran[j].threads;
        const bool convs = g_ran[i].conv_tiles == g_ran[j].conv_tiles;
        int same = 0, checked = 0;
        for (size_t op = 0; op < NOPS; op++) {
            if ((!gemms && splits_gemms(ops[op].name)) ||
                (!convs && strncmp(ops[op].name, "conv2d", 6) == 0))
                continue;
            checked++;
            if (g_hash[i][op] == g_hash[j][op]) {
                same++;
                continue;
            }
            fprintf(stderr, "[%s] %s: results differ from [%s]'s in some bit\n",
                    devices[i].name, ops[op].name, devices[j].name);
            gp_test_failures++;
        }
        printf("[%s] bit-identical to [%s] in %d of the %d ops compared%s%s\n", devices[i].name,
               devices[j].name, same, checked, gemms ? "" : " (none that splits a GEMM)",
               convs ? "" : " (no convolution: other paths)");
    }
    free(g_rec[0]);
    free(g_rec[1]);
    return gp_test_finish("test_kernels");
}
