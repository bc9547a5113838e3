/* Skip connections over a model's layers: which sources' outputs cross a cut between two layers
 * (where one cell ends and the next begins), and the cut tensor that carries them: the
 * activation first, then each crossing source's output in source order, each whole and
 * contiguous, so that one message per micro-batch carries all of them from stage to stage (and
 * the same layout carries their gradients back). Without skips crossing, the cut is the
 * activation itself. */
#ifndef GP_MODEL_SKIPS_H
#define GP_MODEL_SKIPS_H

#include "model/model_types.h"

/* Whether any layer of m merges a skip. */
bool gp_model_has_skips(const gp_model *m);
/* The last merge that reads layer src's output; -1 for none. */
int gp_skip_last_use(const gp_model *m, int src);
/* The sources whose outputs cross cut b (between layers b - 1 and b): layers src < b read by a
 * merge at b or after, ascending, into srcs (nlayers entries; may be NULL). Returns how many. */
int gp_skips_across(const gp_model *m, int b, int *srcs);
/* The shape of what crosses cut b (0 <= b <= nlayers) at `batch` examples: layer b - 1's output
 * (the input at b = 0), or with skips crossing the packed (batch, n) of n floats per example. */
gp_status gp_model_cut_shape(const gp_model *m, int b, int64_t batch, gp_shape *out);
/* Views of a cut tensor t at cut b: *act, the activation (layer b - 1's output shape), and
 * skips[src] for each crossing source (nlayers entries; may be NULL: the activation alone). */
gp_status gp_cut_views(const gp_model *m, int b, const gp_tensor *t, gp_tensor *act,
                       gp_tensor *skips);
/* A new cut tensor for cut b on dev (ACTIVATIONS): act, then vals[src] for each crossing source
 * (nlayers entries), copied in. */
gp_status gp_cut_pack(const gp_model *m, int b, gp_device *dev, const gp_tensor *act,
                      const gp_tensor *const *vals, gp_tensor *out);

#endif
