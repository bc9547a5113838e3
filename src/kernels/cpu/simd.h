/* Whether this build carries the CPU kernels' AVX2 + FMA code (x86-64 under GCC or clang: the
 * functions marked GP_AVX2 are compiled for those instructions whatever the build's -march) and
 * whether the processor running it has them, so each kernel asks both the same way. */
#ifndef GP_KERNELS_CPU_SIMD_H
#define GP_KERNELS_CPU_SIMD_H

#include <stdbool.h>

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define GP_HAVE_AVX2 1
#include <immintrin.h>
#define GP_AVX2 __attribute__((target("avx2,fma")))
#else
#define GP_HAVE_AVX2 0
#endif

static inline bool gp_cpu_has_avx2_fma(void) {
#if GP_HAVE_AVX2
    return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
#else
    return false;
#endif
}

#endif
