/* What describes one variant of the CPU kernels (isa.h): the features its code needs, its op
 * table, and what tests and benchmarks reach outside the table. isa_table.c, compiled with each
 * variant, defines its description. */
#ifndef GP_KERNELS_CPU_ISA_TABLE_H
#define GP_KERNELS_CPU_ISA_TABLE_H

#include <stdbool.h>
#include <stdint.h>

#include "kernels/cpu/isa_names.h"
#include "kernels/kernel_table.h"

/* The CPU features a variant may be compiled to use, as bits of a mask. */
typedef enum gp_cpu_feature {
    GP_CPU_SSE3, GP_CPU_SSSE3, GP_CPU_SSE41, GP_CPU_SSE42, GP_CPU_POPCNT, GP_CPU_AVX,
    GP_CPU_AVX2, GP_CPU_FMA, GP_CPU_BMI1, GP_CPU_BMI2, GP_CPU_F16C, GP_CPU_LZCNT, GP_CPU_MOVBE,
    GP_CPU_AVX512F, GP_CPU_AVX512BW, GP_CPU_AVX512CD, GP_CPU_AVX512DQ, GP_CPU_AVX512VL,
    GP_CPU_FEATURES
} gp_cpu_feature;
#define GP_CPU_BIT(f) ((uint32_t)1 << (f))

/* One variant: its name, the features its code needs (from the compiler's predefined macros,
 * so a native variant asks for what -march=native turned on, of the features above: not for
 * the others it may use, VNNI, BF16, ...; a native build is for the CPU that built it), its op
 * table, and what tests and benchmarks reach outside the table. */
typedef struct gp_cpu_variant {
    const char *name;
    uint32_t needs;
    const gp_kernels *kernels;
    /* whether it carries the AVX2 + FMA convolution tiles (Winograd's, the direct path) */
    bool conv_tiles;
    float (*expf)(float);
    float (*tanhf)(float);
    void (*tanh)(int64_t n, const float *x, float *y);
    bool (*conv_direct_applies)(const gp_conv_geom *g, int64_t oc);
    bool (*conv_winograd_applies)(const gp_conv_geom *g, int64_t oc);
    bool (*conv_winograd_dw_applies)(const gp_conv_geom *g, int64_t batch, int64_t oc);
} gp_cpu_variant;

/* Each variant's description (isa_table.c, compiled with the variant). */
#ifdef GP_ISA_VARIANT
extern const gp_cpu_variant GP_ISA_NAME(gp_cpu_variant);
#endif

#endif
