/* Merge layers (merge.c): a layer's input joined with the output of an earlier layer. */
#ifndef GP_LAYERS_MERGE_H
#define GP_LAYERS_MERGE_H

#include "layers/layer_base.h"

/* When a merge layer is added to a model, the binding of its skip's shape (one example, batch 1
 * in front), which its out_shape then checks against its input. */
gp_status gp_merge_bind(gp_layer *l, const gp_shape *skip);

#endif
