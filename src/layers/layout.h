/* Layouts over the tensor axis (the data is in layer.h: gp_layout): the layout a layer runs
 * with in a model, its check against the axis size (a named error before anything runs), the
 * shard shape of a parameter, and the copy between a whole parameter and one shard's part of it
 * (host memory), which gathers for checkpoints and the parameter hash and scatters for
 * initialization and loads. */
#ifndef GP_LAYERS_LAYOUT_H
#define GP_LAYERS_LAYOUT_H

#include "layers/layer_base.h"

/* The mesh axis that splits layers. */
#define GP_TENSOR_AXIS "tensor"

/* The layout layer l runs with: its kind's (ops->layout), or replicated when it has none, or
 * when it would split its output (a column-parallel head) but is not the model's last layer. */
void gp_layout_of(const gp_layer *l, bool last, gp_layout *out);
/* Every split model dimension divides by T (the size of its axis): else GP_CONFIG naming the
 * layer, the dimension, its size and the mesh axis. */
gp_status gp_layout_check(const gp_layer *l, const gp_layout *lo, int T);
/* The split of parameter j in lo, or NULL (replicated). */
const gp_layout_split *gp_layout_split_of(const gp_layout *lo, int j);
/* The shape of one of T shards of a parameter of shape full split by sp (NULL: full). */
gp_shape gp_layout_shard_shape(const gp_shape *full, const gp_layout_split *sp, int T);
/* Copies shard t of T between a whole parameter (full, shape `shape`) and its shard's part
 * (shard, gp_layout_shard_shape of it), both host memory: to_shard takes the part out of the
 * whole, else puts it back. sp NULL (replicated): the whole tensor either way. */
void gp_layout_copy(const gp_layout_split *sp, const gp_shape *shape, int T, int t, float *full,
                    float *shard, bool to_shard);

#endif
