/* The softmax cross-entropy of a vocabulary split over the tensor axis (loss_shard.c). */
#ifndef GP_LAYERS_LOSS_SHARD_H
#define GP_LAYERS_LOSS_SHARD_H

#include <stdint.h>

#include "core/collective.h"
#include "gpipe.h"

/* Softmax cross-entropy of logits (rows, classes) that hold classes [first, first + classes)
 * of `vocab`, the rest on the other members of g (labels global, -1 ignored): the row maximum
 * and the sums of exponentials and target logits are all-reduced over g (1 + 2 floats a row;
 * 1 + 3 with label smoothing > 0, whose loss also takes the row's sum of logits), so the whole
 * logits are never gathered. *loss is the same on every member (the whole loss, as
 * gp_softmax_xent_smoothed's within float rounding); dlogits (may be NULL) gets this shard's
 * columns of the gradient. Workspace on the logits' device. */
gp_status gp_softmax_xent_shard(const gp_tensor *logits, const gp_tensor *labels, int64_t vocab,
                                int64_t first, const gp_coll_group *g, double normalizer,
                                double smoothing, double *loss, gp_tensor *dlogits);

#endif
