/* Finding the op table for a tensor's memory: its device's, or the CPU's for host views. */
#include "kernels/kernels.h"

#include "kernels/cpu/cpu_device.h"

const gp_kernels *gp_kernels_of(const gp_device *dev) {
    return dev ? gp_device_kernels(dev) : gp_cpu_kernels();
}

bool gp_kernels_same_memory(const gp_device *a, const gp_device *b) {
    return a == b || (gp_device_is_host(a) && gp_device_is_host(b));
}
