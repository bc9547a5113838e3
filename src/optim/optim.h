/* Optimizer internals: option checks, state sizes, and the updates over flat arrays (a store's
 * parameter, gradient and state blocks, or any run of them), on the kernels of the device the
 * arrays live on. */
#ifndef GP_OPTIM_OPTIM_H
#define GP_OPTIM_OPTIM_H

#include "gpipe.h"

/* Validates the options; the message names the bad field and its range. */
gp_status gp_optim_check(const gp_optim_opts *o);
/* State arrays per trainable element: AdamW 2, SGD with momentum 1, plain SGD 0 (o NULL: 0). */
int gp_optim_state_count(const gp_optim_opts *o);
/* The factor clip-by-global-norm multiplies gradients by (1 when off or under the threshold),
 * as torch.nn.utils.clip_grad_norm_. */
float gp_clip_factor(float clip_norm, double total_norm);

/* One update of n elements on dev: w from g with the states (state[i] NULL beyond
 * gp_optim_state_count), learning rate lr, weight decay applied when `decay` (matrices, not
 * biases or norms), and t the 1-based step number (AdamW bias correction). */
gp_status gp_optim_update(const gp_optim_opts *o, gp_device *dev, int64_t n, float *w,
                          const float *g, float *const state[2], bool decay, float lr, int t);

#endif
