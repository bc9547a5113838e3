/* The model's own questions beyond the public API (model.c): where its layers' parameters live,
 * and the parameter hash over a range of layers. */
#ifndef GP_MODEL_MODEL_H
#define GP_MODEL_MODEL_H

#include "model/model_types.h"

/* The device holding layer li's parameters (NULL: not initialized). */
gp_device *gp_model_layer_device(const gp_model *m, int li);
/* The device holding all of layers [first, last), or NULL with the message set if they are not
 * initialized on one device. */
gp_device *gp_model_range_device(const gp_model *m, int first, int last);

/* Continues the FNV-1a hash *h over the bytes of every parameter and buffer of layers
 * [first, last) that hold values, in layer and parameter order (device memory through a host
 * copy): the parameter hash, chainable across stages. */
gp_status gp_model_params_fnv1a64_range(const gp_model *m, int first, int last, uint64_t *h);

#endif
