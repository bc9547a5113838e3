/* Whether the variant of the CPU kernels being compiled carries the AVX2 + FMA code (the
 * convolution tiles, batch norm's streaming stores, the 2x2 max pool's vectors): the avx2,
 * avx512 and native variants do (isa.h), and the variant runs only on a CPU that has them, so
 * the code asks nothing at run time. */
#ifndef GP_KERNELS_CPU_SIMD_H
#define GP_KERNELS_CPU_SIMD_H

#if defined(__AVX2__) && defined(__FMA__)
#define GP_HAVE_AVX2 1
#include <immintrin.h>
#else
#define GP_HAVE_AVX2 0
#endif

#endif
