/* The CPU kernels' variants: the same sources compiled once per instruction set (baseline
 * x86-64; x86-64-v3, "avx2"; x86-64-v4, "avx512"; and in a GP_NATIVE build "native"), and the
 * choice of one (isa.c), made once from the CPU's features or the environment's GP_CPU_ISA.
 *
 * A file compiled once per variant gets GP_ISA_VARIANT (its name) from the build; the headers
 * it includes then rename every function it defines by that suffix (isa_names.h), so the
 * variants link side by side and each reaches only its own functions. Each variant describes
 * itself (isa_table.h); a few functions here call the variant in use, for tests and
 * benchmarks. */
#ifndef GP_KERNELS_CPU_ISA_H
#define GP_KERNELS_CPU_ISA_H

#include <stdbool.h>
#include <stdint.h>

#include "kernels/cpu/isa_table.h"

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

/* The variant in use's functions outside the op table, for tests and benchmarks: the
 * vectorizable approximations of transformer_math.h out of line (relative error below 3e-7; NaN
 * propagates; gp_cpu_tanh: y[i] = tanh(x[i]), y may alias x), and whether the convolution paths
 * serve a convolution (conv_direct.h, conv_winograd.h). */
float gp_cpu_expf(float x);
float gp_cpu_tanhf(float x);
void gp_cpu_tanh(int64_t n, const float *x, float *y);
bool gp_conv_direct_applies(const gp_conv_geom *g, int64_t oc);
bool gp_conv_winograd_applies(const gp_conv_geom *g, int64_t oc);
bool gp_conv_winograd_dw_applies(const gp_conv_geom *g, int64_t batch, int64_t oc);

#endif
