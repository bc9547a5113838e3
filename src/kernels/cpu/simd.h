/* Whether the variant of the CPU kernels being compiled carries the AVX2 + FMA code (the
 * convolution tiles, batch norm's streaming stores, the 2x2 max pool's vectors), and the
 * AVX-512 code (the convolution tiles' wider forms): the avx2, avx512 and native variants carry
 * the first, avx512 and native on an AVX-512 CPU the second (isa.h); a variant runs only on a
 * CPU that has its features, so the code asks nothing at run time. */
#ifndef GP_KERNELS_CPU_SIMD_H
#define GP_KERNELS_CPU_SIMD_H

#if defined(__AVX2__) && defined(__FMA__)
#define GP_HAVE_AVX2 1
#include <immintrin.h>
#else
#define GP_HAVE_AVX2 0
#endif

/* The avx512 and (on such a CPU) native variants add 16-lane tiles: twice the multiply-adds per
 * instruction, and 32 vector registers for more accumulators. */
#if GP_HAVE_AVX2 && defined(__AVX512F__) && defined(__AVX512VL__)
#define GP_HAVE_AVX512 1
#else
#define GP_HAVE_AVX512 0
#endif

#endif
