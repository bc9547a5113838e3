/* Tensor helpers private to the library: views of device memory (a slice of a flat block, a
 * part of a workspace) that carry their device, so copies and kernels know where they live. */
#ifndef GP_CORE_TENSOR_H
#define GP_CORE_TENSOR_H

#include "gpipe.h"

/* A non-owning view of memory on dev (NULL: host memory), counted under cat by whoever owns it. */
gp_tensor gp_tensor_view_on(gp_device *dev, void *data, gp_shape shape, gp_dtype dtype,
                            gp_mem_category cat);
/* data + nelem elements of dtype: address arithmetic only (valid for device pointers too). */
void *gp_ptr_offset(void *data, int64_t nelem, gp_dtype dtype);

#endif
