/* Rounding fp32 to bfloat16 (fp32's sign, exponent and top 7 mantissa bits), once for the CPU
 * and the CUDA code (host and device functions there): the operands of a bf16 GEMM (gpipe.h,
 * gp_precision) are rounded by these bits on every device. C and CUDA C++ both include it. */
#ifndef GP_CORE_BF16_H
#define GP_CORE_BF16_H

#include <stdbool.h>
#include <stdint.h>
#include <string.h>

#ifdef __CUDACC__
#define GP_BF16_FN static __host__ __device__ inline
#else
#define GP_BF16_FN static inline
#endif

/* The bfloat16 nearest x, ties to the even one (IEEE's default, as __float2bfloat16_rn),
 * denormals included; past the largest bfloat16 it is infinity. A NaN stays a NaN (quiet):
 * dropping the low bits alone could turn a NaN whose payload lay there into infinity. */
GP_BF16_FN uint16_t gp_bf16_bits(float x) {
    uint32_t u;
    memcpy(&u, &x, sizeof u);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x0040u);
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}

/* The fp32 of bfloat16 bits h (exact: bfloat16 is a subset of fp32). */
GP_BF16_FN float gp_bf16_float(uint16_t h) {
    const uint32_t u = (uint32_t)h << 16;
    float r;
    memcpy(&r, &u, sizeof r);
    return r;
}

/* x rounded to bfloat16, as the fp32 of that value. */
GP_BF16_FN float gp_bf16_round(float x) { return gp_bf16_float(gp_bf16_bits(x)); }

/* The elements from a GEMM operand's first to its last over `count` matrices `stride` apart
 * (op(X) rows x cols, stored transposed where trans, rows `ld` apart): what a bf16 GEMM rounds,
 * the whole span, so that the rounded copy keeps the operand's leading dimension and stride
 * (elements between the rows, if any, are rounded and not read). */
GP_BF16_FN int64_t gp_bf16_operand_span(bool trans, int64_t rows, int64_t cols, int64_t ld,
                                        int64_t stride, int64_t count) {
    const int64_t r = trans ? cols : rows, c = trans ? rows : cols;
    return (count - 1) * stride + (r - 1) * ld + c;
}

#undef GP_BF16_FN

#endif
