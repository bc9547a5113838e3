/* One variant of the CPU kernels, compiled once per instruction set with the kernel files
 * (isa.h): its op table, the features its code needs, read from the compiler's own predefined
 * macros for the flags the build gave, and the variant's math out of line for tests. */
#include "kernels/cpu/isa_table.h"

#include "kernels/cpu/conv_direct.h"
#include "kernels/cpu/conv_winograd.h"
#include "kernels/cpu/cpu_ops.h"
#include "kernels/cpu/simd.h"
#include "kernels/cpu/transformer_math.h"

#define GP_ISA_STR_(x) #x
#define GP_ISA_STR(x) GP_ISA_STR_(x)

static const gp_kernels cpu_kernels = {
    .name = "cpu",
/* gp_cpu_<op>, each renamed by the variant's suffix (isa_names.h) */
#define GP_KERNEL_OP(op, ret, params) .op = gp_cpu_##op,
#include "kernels/kernel_ops.def"
#undef GP_KERNEL_OP
};

/* The features the compiler was allowed to use here (x86-64's SSE and SSE2 go without saying). */
static const uint32_t needs = 0
#ifdef __SSE3__
    | GP_CPU_BIT(GP_CPU_SSE3)
#endif
#ifdef __SSSE3__
    | GP_CPU_BIT(GP_CPU_SSSE3)
#endif
#ifdef __SSE4_1__
    | GP_CPU_BIT(GP_CPU_SSE41)
#endif
#ifdef __SSE4_2__
    | GP_CPU_BIT(GP_CPU_SSE42)
#endif
#ifdef __POPCNT__
    | GP_CPU_BIT(GP_CPU_POPCNT)
#endif
#ifdef __AVX__
    | GP_CPU_BIT(GP_CPU_AVX)
#endif
#ifdef __AVX2__
    | GP_CPU_BIT(GP_CPU_AVX2)
#endif
#ifdef __FMA__
    | GP_CPU_BIT(GP_CPU_FMA)
#endif
#ifdef __BMI__
    | GP_CPU_BIT(GP_CPU_BMI1)
#endif
#ifdef __BMI2__
    | GP_CPU_BIT(GP_CPU_BMI2)
#endif
#ifdef __F16C__
    | GP_CPU_BIT(GP_CPU_F16C)
#endif
#ifdef __LZCNT__
    | GP_CPU_BIT(GP_CPU_LZCNT)
#endif
#ifdef __MOVBE__
    | GP_CPU_BIT(GP_CPU_MOVBE)
#endif
#ifdef __AVX512F__
    | GP_CPU_BIT(GP_CPU_AVX512F)
#endif
#ifdef __AVX512BW__
    | GP_CPU_BIT(GP_CPU_AVX512BW)
#endif
#ifdef __AVX512CD__
    | GP_CPU_BIT(GP_CPU_AVX512CD)
#endif
#ifdef __AVX512DQ__
    | GP_CPU_BIT(GP_CPU_AVX512DQ)
#endif
#ifdef __AVX512VL__
    | GP_CPU_BIT(GP_CPU_AVX512VL)
#endif
    ;

/* transformer_math.h's approximations as this variant compiles them */
static float variant_expf(float x) { return gp_exp(x); }
static float variant_tanhf(float x) { return gp_tanh(x); }
static void variant_tanh(int64_t n, const float *x, float *y) {
    for (int64_t i = 0; i < n; i++) y[i] = gp_tanh(x[i]);
}

const gp_cpu_variant GP_ISA_NAME(gp_cpu_variant) = {
    .name = GP_ISA_STR(GP_ISA_VARIANT),
    .needs = needs,
    .kernels = &cpu_kernels,
    .conv_tiles = GP_HAVE_AVX2,
    .expf = variant_expf,
    .tanhf = variant_tanhf,
    .tanh = variant_tanh,
    .conv_direct_applies = gp_conv_direct_serves,
    .conv_winograd_applies = gp_conv_winograd_serves,
    .conv_winograd_dw_applies = gp_conv_winograd_dw_serves,
};
