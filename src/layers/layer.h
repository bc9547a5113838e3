/* The layers for the parts above (model, pipeline): the interface every kind builds on
 * (layer_base.h) and the binding of merge layers (merge.h). The files of this part include only
 * the headers of what they use. */
#ifndef GP_LAYERS_LAYER_H
#define GP_LAYERS_LAYER_H

#include "layers/layer_base.h"
#include "layers/merge.h"

#endif
