/* The CPU kernels' variants: the same sources compiled once per instruction set (baseline
 * x86-64; x86-64-v3, "avx2"; x86-64-v4, "avx512"; and in a GP_NATIVE build "native"), and the
 * choice of one, made once from the CPU's features or the environment's GP_CPU_ISA.
 *
 * A file compiled once per variant gets GP_ISA_VARIANT (its name) from the build; the headers
 * it includes then rename every function it defines by that suffix (isa_names.h), so the
 * variants link side by side and each reaches only its own functions. Outside the variants a
 * few of those names (gp_cpu_expf, gp_conv_direct_applies, ...: isa.c) call the variant in use,
 * for tests and benchmarks. */
#ifndef GP_KERNELS_CPU_ISA_H
#define GP_KERNELS_CPU_ISA_H

#include <stdbool.h>
#include <stdint.h>

#include "kernels/kernels.h"

#ifdef GP_ISA_VARIANT
#define GP_ISA_CAT_(a, b) a##_##b
#define GP_ISA_CAT(a, b) GP_ISA_CAT_(a, b)
#define GP_ISA_NAME(name) GP_ISA_CAT(name, GP_ISA_VARIANT)
#include "kernels/cpu/isa_names.h"
#endif

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

/* The features of the CPU running this (cpuid, with the OS's support for the AVX and AVX-512
 * registers from xgetbv); 0 off x86-64. */
uint32_t gp_cpu_features(void);
/* The variant named `name` among those built, for a CPU with `features`: GP_INVALID_ARGUMENT
 * for a name that is none of them (or not built here), GP_UNSUPPORTED, naming the missing
 * features, for one this CPU cannot run. */
gp_status gp_cpu_isa_find(const char *name, uint32_t features, const gp_cpu_variant **out);
/* The fastest variant built that a CPU with `features` runs (native, avx512, avx2, baseline). */
const gp_cpu_variant *gp_cpu_isa_best(uint32_t features);
/* The variant in use: GP_CPU_ISA's, or the fastest this CPU runs, chosen at the first call.
 * Where GP_CPU_ISA cannot be used it is the fastest, and gp_cpu_isa_check says why. */
const gp_cpu_variant *gp_cpu_isa_active(void);
/* GP_OK, or GP_CPU_ISA's error (as gp_cpu_isa_find's), each call. */
gp_status gp_cpu_isa_check(void);

#endif
