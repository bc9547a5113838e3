/* Tests of the choice of the CPU kernels' variant (kernels/cpu/isa.h): the features read from
 * cpuid against the compiler runtime's own reading, what each variant needs, the default for
 * the CPUs gpipe meets (Zen 3: AVX2 without AVX-512; Zen 4 and 5, Sapphire Rapids: AVX-512; a
 * CPU older than AVX2), and the errors for a variant that is unknown, not built, or beyond the
 * CPU. GP_CPU_ISA itself is tested through the CLI (tests/cli/cpu_isa.sh), the variants' bits
 * op by op in test_kernels. */
#include <stdlib.h>
#include <string.h>

#include "kernels/cpu/cpu_kernels.h"
#include "kernels/cpu/isa.h"
#include "testutil.h"

#define B(f) GP_CPU_BIT(GP_CPU_##f)
/* x86-64-v2, -v3 and -v4 as the compilers define them. */
#define V2 (B(SSE3) | B(SSSE3) | B(SSE41) | B(SSE42) | B(POPCNT))
#define V3 (V2 | B(AVX) | B(AVX2) | B(FMA) | B(BMI1) | B(BMI2) | B(F16C) | B(LZCNT) | B(MOVBE))
#define V4 (V3 | B(AVX512F) | B(AVX512BW) | B(AVX512CD) | B(AVX512DQ) | B(AVX512VL))

static const gp_cpu_variant *built(const char *name) {
    const gp_cpu_variant *v = NULL;
    return gp_cpu_isa_find(name, ~0u, &v) == GP_OK ? v : NULL;
}

static void test_features(void) {
    const uint32_t f = gp_cpu_features();
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
    const struct {
        gp_cpu_feature f;
        bool has;
    } seen[] = {
        {GP_CPU_SSE3, __builtin_cpu_supports("sse3")},
        {GP_CPU_SSSE3, __builtin_cpu_supports("ssse3")},
        {GP_CPU_SSE41, __builtin_cpu_supports("sse4.1")},
        {GP_CPU_SSE42, __builtin_cpu_supports("sse4.2")},
        {GP_CPU_POPCNT, __builtin_cpu_supports("popcnt")},
        {GP_CPU_AVX, __builtin_cpu_supports("avx")},
        {GP_CPU_AVX2, __builtin_cpu_supports("avx2")},
        {GP_CPU_FMA, __builtin_cpu_supports("fma")},
        {GP_CPU_BMI1, __builtin_cpu_supports("bmi")},
        {GP_CPU_BMI2, __builtin_cpu_supports("bmi2")},
        {GP_CPU_AVX512F, __builtin_cpu_supports("avx512f")},
        {GP_CPU_AVX512BW, __builtin_cpu_supports("avx512bw")},
        {GP_CPU_AVX512CD, __builtin_cpu_supports("avx512cd")},
        {GP_CPU_AVX512DQ, __builtin_cpu_supports("avx512dq")},
        {GP_CPU_AVX512VL, __builtin_cpu_supports("avx512vl")},
    };
    for (size_t i = 0; i < sizeof seen / sizeof seen[0]; i++)
        if (!(f & GP_CPU_BIT(seen[i].f)) != !seen[i].has) {
            fprintf(stderr, "feature %d: cpuid says %d, the compiler's runtime %d\n",
                    (int)seen[i].f, !!(f & GP_CPU_BIT(seen[i].f)), seen[i].has);
            gp_test_failures++;
        }
    printf("  this CPU: features 0x%05x, kernels %s (runs %s)\n", (unsigned)f,
           gp_cpu_isa_active()->name, gp_cpu_isa_runnable());
#else
    CHECK_EQ_INT(f, 0);
#endif
    /* the default is the fastest variant this CPU runs (unless the environment names one) */
    const gp_cpu_variant *best = gp_cpu_isa_best(f), *want = best;
    CHECK_EQ_INT(best->needs & ~f, 0);
    const char *env = getenv("GP_CPU_ISA");
    if (env && env[0] && gp_cpu_isa_find(env, f, &want) != GP_OK) want = best;
    CHECK(gp_cpu_isa_active() == want);
    const char *name = NULL;
    (void)gp_cpu_isa(&name);
    CHECK(name && strcmp(name, want->name) == 0);
    CHECK(gp_cpu_kernels() == want->kernels);
}

static void test_needs(void) {
    const gp_cpu_variant *base = built("baseline"), *avx2 = built("avx2"),
                         *avx512 = built("avx512");
    REQUIRE_OK(base ? GP_OK : GP_INTERNAL);
    CHECK_EQ_INT(base->needs, 0); /* x86-64's SSE2 (or another CPU's plain C) */
    CHECK(!base->conv_tiles);
    /* (avx2 and avx512 on x86-64 where the compiler knows -march=x86-64-v3 and -v4: gcc 11
     * and clang 12 on) */
#if !defined(__x86_64__)
    CHECK(!avx2 && !avx512);
#endif
    if (avx2) CHECK_EQ_INT(avx2->needs, V3);
    if (avx2) CHECK(avx2->conv_tiles);
    if (avx512) CHECK_EQ_INT(avx512->needs, V4);
    if (avx512) CHECK(avx512->conv_tiles);
    const gp_cpu_variant *native = built("native");
    if (native) CHECK_EQ_INT(native->needs & ~gp_cpu_features(), 0); /* built here for here */
    printf("  built: %s%s%s%s\n", base->name, avx2 ? ", avx2" : "", avx512 ? ", avx512" : "",
           native ? ", native" : "");
}

static void test_default_by_cpu(void) {
    /* an x86-64 without AVX2 (and before x86-64-v2) */
    CHECK(strcmp(gp_cpu_isa_best(0)->name, "baseline") == 0);
    CHECK(strcmp(gp_cpu_isa_best(V2 | B(AVX))->name, "baseline") == 0);
    if (!built("avx2")) return;
    const gp_cpu_variant *native = built("native");
    const bool native_runs_v3 = native && !(native->needs & ~V3);
    const bool native_runs_v4 = native && !(native->needs & ~V4);
    /* Zen 3, Haswell to Alder Lake: AVX2, no AVX-512 */
    CHECK(strcmp(gp_cpu_isa_best(V3)->name, native_runs_v3 ? "native" : "avx2") == 0);
    /* one feature of v3 short (FMA) is not enough */
    CHECK(strcmp(gp_cpu_isa_best(V3 & ~B(FMA))->name, "baseline") == 0);
    /* Zen 4 and 5, Sapphire Rapids: AVX-512 */
    CHECK(strcmp(gp_cpu_isa_best(V4)->name, native_runs_v4 ? "native" : "avx512") == 0);
    /* AVX-512F without BW and VL (Knights Landing) runs avx2's */
    CHECK(strcmp(gp_cpu_isa_best(V3 | B(AVX512F) | B(AVX512CD))->name,
                 native_runs_v3 ? "native" : "avx2") == 0);
}

static void test_errors(void) {
    const gp_cpu_variant *v = (const gp_cpu_variant *)1;
    CHECK_FAILS(gp_cpu_isa_find("bogus", ~0u, &v), GP_INVALID_ARGUMENT,
                "GP_CPU_ISA=bogus: unknown variant of the CPU kernels, expected baseline, avx2, "
                "avx512 or native");
    CHECK(v == NULL);
    CHECK_FAILS(gp_cpu_isa_find("", ~0u, &v), GP_INVALID_ARGUMENT, "unknown variant");
    CHECK_FAILS(gp_cpu_isa_find("AVX2", ~0u, &v), GP_INVALID_ARGUMENT, "unknown variant");
    if (!built("native"))
        CHECK_FAILS(gp_cpu_isa_find("native", ~0u, &v), GP_INVALID_ARGUMENT,
                    "this build has no native variant of the CPU kernels (a build configured "
                    "with -DGP_NATIVE=ON has)");
    if (!built("avx512")) return;
    /* Zen 3 asked for avx512: what it lacks, and what it runs instead */
    CHECK_FAILS(gp_cpu_isa_find("avx512", V3, &v), GP_UNSUPPORTED,
                "GP_CPU_ISA=avx512: this CPU lacks avx512f, avx512bw, avx512cd, avx512dq, "
                "avx512vl, which the avx512 kernels use (variants it runs: ");
    CHECK(strstr(gp_last_error(), "avx2, baseline)") != NULL);
    CHECK(v == NULL);
    CHECK_FAILS(gp_cpu_isa_find("avx2", V3 & ~(B(FMA) | B(MOVBE)), &v), GP_UNSUPPORTED,
                "this CPU lacks fma, movbe, which the avx2 kernels use (variants it runs: "
                "baseline)");
    CHECK_OK(gp_cpu_isa_find("avx2", V4, &v));
    CHECK(v && strcmp(v->name, "avx2") == 0);
    CHECK_OK(gp_cpu_isa_find("baseline", 0, &v));
    CHECK(v && strcmp(v->name, "baseline") == 0);
}

int main(void) {
    test_features();
    test_needs();
    test_default_by_cpu();
    test_errors();
    return gp_test_finish("test_cpu_isa");
}
