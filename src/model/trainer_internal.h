/* Private pieces of the trainer that tests (and later the pipeline) use
 * directly: gradients without an update, and the update on its own. */
#ifndef GP_MODEL_TRAINER_INTERNAL_H
#define GP_MODEL_TRAINER_INTERNAL_H

#include "gpipe.h"

/* Forward and backward over all M micro-batches, gradients summed into the
 * parameters' grad tensors (not cleared first). *loss: the mini-batch mean. */
gp_status gp_trainer_accumulate(gp_trainer *t, const gp_tensor *x, const gp_tensor *y,
                                float *loss);
/* Clip by global norm, one optimizer update, clear gradients, step++.
 * A non-finite norm: GP_NUMERIC, gradients cleared, no update. */
gp_status gp_trainer_apply(gp_trainer *t);
/* Sets every gradient to zero. */
void gp_trainer_zero_grads(gp_trainer *t);

#endif
