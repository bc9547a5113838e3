/* Internal device allocator: raw counted allocations for code that needs
 * memory that is not a tensor (workspaces, index buffers). */
#ifndef GP_CORE_DEVICE_H
#define GP_CORE_DEVICE_H

#include "gpipe.h"

/* Allocates nbytes (64-byte aligned) counted under cat. On failure returns
 * NULL with the message set (naming device, category, request and limit)
 * and *status set when status is not NULL. */
void *gp_device_alloc(gp_device *dev, gp_mem_category cat, size_t nbytes, gp_status *status);
/* Frees memory from gp_device_alloc; NULL is ignored. */
void gp_device_release(gp_device *dev, void *p);

#endif
