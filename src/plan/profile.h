/* What the profiling pass (profile.c, whose timing functions are public in gpipe.h) shares with
 * the contention profile (profile_contention.c): the stand-in tensors a layer timed alone reads,
 * and which layers are alike. Private to the library. */
#ifndef GP_PLAN_PROFILE_H
#define GP_PLAN_PROFILE_H

#include "gpipe.h"

/* A stand-in tensor for what flows into or out of layer `layer` while profiling (`which`: 0 in,
 * 1 out): token 0 for integer inputs, small seeded random values otherwise. */
gp_status gp_profile_stand_in(gp_device *dev, gp_shape shape, gp_dtype dt, uint32_t layer,
                              uint32_t which, gp_tensor *t);

/* How many of m's layers are like layer li (itself included): the same kind, shapes,
 * parameters and cost at micro-batches of micro_batch, so the same work (a Transformer's
 * blocks). First layers and merges are like no other. */
int gp_profile_alike(const gp_model *m, int li, int64_t micro_batch);

#endif
