/* Choosing the CPU kernels' variant (isa.h): the CPU's features from cpuid and xgetbv, the
 * variants this build carries, the one in use, and the few functions outside the op table that
 * tests and benchmarks call, passed on to it. */
#include "kernels/cpu/isa.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "gpipe.h"

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <cpuid.h>
#define GP_X86_64 1
#else
#define GP_X86_64 0
#endif

/* The variants the build compiled (CMakeLists.txt), fastest first: the first one the CPU runs is
 * the default. */
extern const gp_cpu_variant gp_cpu_variant_baseline;
#if GP_ISA_HAVE_NATIVE
extern const gp_cpu_variant gp_cpu_variant_native;
#endif
#if GP_ISA_HAVE_AVX512
extern const gp_cpu_variant gp_cpu_variant_avx512;
#endif
#if GP_ISA_HAVE_AVX2
extern const gp_cpu_variant gp_cpu_variant_avx2;
#endif
static const gp_cpu_variant *const g_built[] = {
#if GP_ISA_HAVE_NATIVE
    &gp_cpu_variant_native,
#endif
#if GP_ISA_HAVE_AVX512
    &gp_cpu_variant_avx512,
#endif
#if GP_ISA_HAVE_AVX2
    &gp_cpu_variant_avx2,
#endif
    &gp_cpu_variant_baseline,
};
#define NBUILT (sizeof g_built / sizeof g_built[0])

/* Every variant a build may have, for messages about names this one lacks. */
static const char *const g_known[] = {"baseline", "avx2", "avx512", "native"};
#define NKNOWN (sizeof g_known / sizeof g_known[0])

static const char *const g_feature_names[GP_CPU_FEATURES] = {
    "sse3",  "ssse3", "sse4.1", "sse4.2", "popcnt",  "avx",      "avx2",     "fma",      "bmi1",
    "bmi2",  "f16c",  "lzcnt",  "movbe",  "avx512f", "avx512bw", "avx512cd", "avx512dq", "avx512vl",
};

#if GP_X86_64
static uint64_t xgetbv0(void) {
    uint32_t lo, hi;
    __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
    return ((uint64_t)hi << 32) | lo;
}
#endif

uint32_t gp_cpu_features(void) {
#if GP_X86_64
    unsigned a, b, c, d;
    if (!__get_cpuid(1, &a, &b, &c, &d)) return 0;
    const unsigned c1 = c;
    unsigned b7 = 0, c81 = 0;
    if (__get_cpuid_count(7, 0, &a, &b, &c, &d)) b7 = b;
    if (__get_cpuid(0x80000001u, &a, &b, &c, &d)) c81 = c;
    /* The AVX and AVX-512 registers are usable only where the OS saves them (XCR0): the YMM
     * state (bits 1-2), and the opmask and ZMM states (bits 5-7). */
    const uint64_t xcr0 = (c1 >> 27 & 1) ? xgetbv0() : 0; /* OSXSAVE */
    const bool ymm = (xcr0 & 0x6) == 0x6, zmm = ymm && (xcr0 & 0xe0) == 0xe0;
    const struct {
        unsigned reg;
        int bit;
        gp_cpu_feature f;
        bool ymm, zmm; /* needs the OS's YMM (ZMM) state */
    } bits[] = {
        {c1, 0, GP_CPU_SSE3, false, false},     {c1, 9, GP_CPU_SSSE3, false, false},
        {c1, 19, GP_CPU_SSE41, false, false},   {c1, 20, GP_CPU_SSE42, false, false},
        {c1, 23, GP_CPU_POPCNT, false, false},  {c1, 28, GP_CPU_AVX, true, false},
        {b7, 5, GP_CPU_AVX2, true, false},      {c1, 12, GP_CPU_FMA, true, false},
        {b7, 3, GP_CPU_BMI1, false, false},     {b7, 8, GP_CPU_BMI2, false, false},
        {c1, 29, GP_CPU_F16C, true, false},     {c81, 5, GP_CPU_LZCNT, false, false},
        {c1, 22, GP_CPU_MOVBE, false, false},   {b7, 16, GP_CPU_AVX512F, true, true},
        {b7, 30, GP_CPU_AVX512BW, true, true},  {b7, 28, GP_CPU_AVX512CD, true, true},
        {b7, 17, GP_CPU_AVX512DQ, true, true},  {b7, 31, GP_CPU_AVX512VL, true, true},
    };
    uint32_t f = 0;
    for (size_t i = 0; i < sizeof bits / sizeof bits[0]; i++)
        if ((bits[i].reg >> bits[i].bit & 1) && (!bits[i].ymm || ymm) && (!bits[i].zmm || zmm))
            f |= GP_CPU_BIT(bits[i].f);
    return f;
#else
    return 0;
#endif
}

/* Appends name to the list "a, b" in buf (truncated at cap). */
static void append_name(char *buf, size_t cap, const char *name) {
    const size_t used = strlen(buf);
    snprintf(buf + used, cap - used, "%s%s", used ? ", " : "", name);
}

/* The built variants that a CPU with `features` runs, fastest first. */
static void variant_names(uint32_t features, char *buf, size_t cap) {
    buf[0] = '\0';
    for (size_t i = 0; i < NBUILT; i++)
        if (!(g_built[i]->needs & ~features)) append_name(buf, cap, g_built[i]->name);
}

static void feature_names(uint32_t mask, char *buf, size_t cap) {
    buf[0] = '\0';
    for (int i = 0; i < GP_CPU_FEATURES; i++)
        if (mask & GP_CPU_BIT(i)) append_name(buf, cap, g_feature_names[i]);
}

gp_status gp_cpu_isa_find(const char *name, uint32_t features, const gp_cpu_variant **out) {
    *out = NULL;
    char runs[128];
    variant_names(features, runs, sizeof runs);
    for (size_t i = 0; i < NBUILT; i++) {
        if (strcmp(name, g_built[i]->name) != 0) continue;
        const uint32_t missing = g_built[i]->needs & ~features;
        if (missing) {
            char lacks[256];
            feature_names(missing, lacks, sizeof lacks);
            return gp_error(GP_UNSUPPORTED,
                            "GP_CPU_ISA=%s: this CPU lacks %s, which the %s kernels use "
                            "(variants it runs: %s)",
                            name, lacks, name, runs);
        }
        *out = g_built[i];
        return GP_OK;
    }
    char built[128];
    variant_names(~0u, built, sizeof built);
    for (size_t i = 0; i < NKNOWN; i++)
        if (strcmp(name, g_known[i]) == 0)
            return gp_error(GP_INVALID_ARGUMENT,
                            "GP_CPU_ISA=%s: this build has no %s variant of the CPU kernels%s "
                            "(built: %s)",
                            name, name,
                            strcmp(name, "native") == 0
                                ? " (a build configured with -DGP_NATIVE=ON has)"
                                : "",
                            built);
    return gp_error(GP_INVALID_ARGUMENT,
                    "GP_CPU_ISA=%s: unknown variant of the CPU kernels, expected baseline, avx2, "
                    "avx512 or native (built: %s; this CPU runs: %s)",
                    name, built, runs);
}

const gp_cpu_variant *gp_cpu_isa_best(uint32_t features) {
    for (size_t i = 0; i < NBUILT; i++)
        if (!(g_built[i]->needs & ~features)) return g_built[i];
    return g_built[NBUILT - 1]; /* baseline: x86-64's own SSE2, or another CPU's plain C */
}

static pthread_once_t g_once = PTHREAD_ONCE_INIT;
static const gp_cpu_variant *g_active;
static gp_status g_env_status = GP_OK;
static char g_env_error[512];
static char g_runnable[128];

static void choose(void) {
    const uint32_t features = gp_cpu_features();
    g_active = gp_cpu_isa_best(features);
    variant_names(features, g_runnable, sizeof g_runnable);
    const char *want = getenv("GP_CPU_ISA");
    if (!want || !want[0]) return;
    const gp_cpu_variant *v;
    g_env_status = gp_cpu_isa_find(want, features, &v);
    if (g_env_status == GP_OK)
        g_active = v;
    else
        snprintf(g_env_error, sizeof g_env_error, "%s", gp_last_error());
}

const gp_cpu_variant *gp_cpu_isa_active(void) {
    pthread_once(&g_once, choose);
    return g_active;
}

gp_status gp_cpu_isa_check(void) {
    pthread_once(&g_once, choose);
    return g_env_status == GP_OK ? GP_OK : gp_error(g_env_status, "%s", g_env_error);
}

gp_status gp_cpu_isa(const char **name) {
    if (!name) return gp_error(GP_INVALID_ARGUMENT, "gp_cpu_isa: name is NULL");
    *name = gp_cpu_isa_active()->name;
    return gp_cpu_isa_check();
}

const char *gp_cpu_isa_runnable(void) {
    pthread_once(&g_once, choose);
    return g_runnable;
}

/* The variant in use's functions that tests and benchmarks call by name. */
float gp_cpu_expf(float x) { return gp_cpu_isa_active()->expf(x); }
float gp_cpu_tanhf(float x) { return gp_cpu_isa_active()->tanhf(x); }
void gp_cpu_tanh(int64_t n, const float *x, float *y) { gp_cpu_isa_active()->tanh(n, x, y); }
bool gp_conv_direct_applies(const gp_conv_geom *g, int64_t oc) {
    return gp_cpu_isa_active()->conv_direct_applies(g, oc);
}
bool gp_conv_winograd_applies(const gp_conv_geom *g, int64_t oc) {
    return gp_cpu_isa_active()->conv_winograd_applies(g, oc);
}
bool gp_conv_winograd_dw_applies(const gp_conv_geom *g, int64_t batch, int64_t oc) {
    return gp_cpu_isa_active()->conv_winograd_dw_applies(g, batch, oc);
}
