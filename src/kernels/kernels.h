/* Finding a tensor's op table (kernels.c), and with it what the other parts use of the kernels:
 * the table's type (kernel_table.h, where the ops and their contract are described) and the
 * checks every device's ops make (checks.h). The files of this part include only the headers of
 * what they use. */
#ifndef GP_KERNELS_KERNELS_H
#define GP_KERNELS_KERNELS_H

#include <stdbool.h>

#include "core/device.h"
#include "kernels/checks.h"
#include "kernels/kernel_table.h"

/* The table for memory on dev; NULL (a host view) gets the CPU's, which works on host memory. */
const gp_kernels *gp_kernels_of(const gp_device *dev);
/* Whether memory on a and on b can go to one kernel call: the same device, or both host memory
 * (NULL or a device whose memory is the host's). */
bool gp_kernels_same_memory(const gp_device *a, const gp_device *b);

#endif
