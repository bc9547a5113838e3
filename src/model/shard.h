/* A model split over the tensor axis of a mesh: the model one of T tensor-parallel shards runs
 * (each layer that has a layout replaced by its kind's shard, the others copied whole), and the
 * copies between a whole parameter and a shard's part of it, through host memory. The whole
 * model keeps the names and the whole shapes (checkpoints, hashes); the shard models hold the
 * values while a pipeline trains them. */
#ifndef GP_MODEL_SHARD_H
#define GP_MODEL_SHARD_H

#include "layers/layout.h"
#include "model/store.h"

/* The layout layer li of m runs with over the tensor axis (gp_layout_of; the last layer may
 * split its output). */
void gp_model_layout(const gp_model *m, int li, gp_layout *out);
/* Every layer's layout divides by T, and every kind can be placed on the mesh: GP_CONFIG naming
 * the first layer that cannot, its dimension and the mesh axis. */
gp_status gp_model_check_layouts(const gp_model *m, int T);
/* Builds the model of one of T shards (T >= 2): the same input, layer indices and kinds, each
 * layer its kind's shard (ops->shard(l, T)) where it has a layout, else a copy; parameters
 * declared at their shard shapes (checked against the layouts), no values. The caller frees it
 * with gp_model_free. */
gp_status gp_model_shard_new(const gp_model *m, int T, gp_model **out);
/* A one-layer model holding a copy of m's layer li (the same kind and shapes, no values), fed
 * what layer li is fed: so several threads can each run the layer on a device of their own.
 * The caller frees it with gp_model_free. */
gp_status gp_model_layer_copy_new(const gp_model *m, int li, gp_model **out);
/* Whether m's last layer splits its output (a vocabulary head): the shards' logits are then
 * their columns, [t V/T, (t + 1) V/T) of the V classes. */
bool gp_model_output_split(const gp_model *m);

/* Initializes shard t's store s (layers of the shard model ms) with exactly the values that
 * initializing the whole model m gives, each parameter cut to shard t's part. */
gp_status gp_shard_init_values(const gp_model *m, gp_model *ms, gp_store *s, int T, int t,
                               uint64_t seed);
/* Parameter j of layer li between the whole model m and shard t of T: `part` is the shard's
 * tensor (its value, or an optimizer state: anywhere), `whole` host memory of the whole
 * parameter's elements. gather puts the part into whole; scatter cuts it out of whole. */
gp_status gp_shard_gather(const gp_model *m, int li, int j, int T, int t, const gp_tensor *part,
                          float *whole);
gp_status gp_shard_scatter(const gp_model *m, int li, int j, int T, int t, const float *whole,
                           gp_tensor *part);

#endif
