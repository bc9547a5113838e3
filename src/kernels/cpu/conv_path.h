/* The switch of the CPU's faster convolution paths (Winograd's, conv_winograd.c; the direct
 * tile, conv_direct.c); im2col with OpenBLAS (conv_kernels.c) serves whatever they do not. */
#ifndef GP_KERNELS_CPU_CONV_PATH_H
#define GP_KERNELS_CPU_CONV_PATH_H

#include <stdbool.h>

typedef enum gp_conv_path { GP_CONV_WINOGRAD, GP_CONV_DIRECT, GP_CONV_PATHS } gp_conv_path;

/* Whether path p may serve convolutions (where the CPU kernels' variant carries it: simd.h).
 * Both are on by default; the environment's GP_CPU_CONV=direct turns Winograd off,
 * GP_CPU_CONV=im2col both (read once, at the first call). */
bool gp_conv_path_on(gp_conv_path p);
/* Turns path p on or off (for tests of every path and benchmarks of one against another); not
 * thread-safe: set it while no device computes. Returns the previous setting. */
bool gp_conv_path_enable(gp_conv_path p, bool on);

#endif
