/* The CPU device (cpu_device.c): host memory behind the device interface, its thread pool and
 * the op table of a variant of the CPU kernels. */
#ifndef GP_KERNELS_CPU_CPU_DEVICE_H
#define GP_KERNELS_CPU_CPU_DEVICE_H

#include "gpipe.h"
#include "kernels/cpu/isa_table.h"
#include "kernels/kernel_table.h"

/* Threads one CPU device may have. */
#define GP_CPU_MAX_THREADS 1024

/* The CPU's op table (the one for host memory): the variant's in use (gp_cpu_isa_active). */
const gp_kernels *gp_cpu_kernels(void);
/* A CPU device of `threads` threads running the kernels of variant isa, which this CPU must run
 * (gp_cpu_isa_find), whatever the variant in use: for tests of every variant in one process. */
gp_status gp_device_cpu_new_isa(const char *name, int threads, const gp_cpu_variant *isa,
                                gp_device **out);

#endif
