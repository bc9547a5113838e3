/* The CPU device's kernels for the files of other folders (the tests of the CPU math, the device
 * registry): the device (cpu_device.h), its ops (cpu_ops.h), the BLAS call (gemm.h), the
 * variants (isa.h) and the thread pool (pool.h). The files of this folder include only the
 * headers of what they use. */
#ifndef GP_KERNELS_CPU_CPU_KERNELS_H
#define GP_KERNELS_CPU_CPU_KERNELS_H

#include "kernels/cpu/cpu_device.h"
#include "kernels/cpu/cpu_ops.h"
#include "kernels/cpu/gemm.h"
#include "kernels/cpu/isa.h"
#include "kernels/cpu/pool.h"

#endif
