/* Optimizer internals: per-parameter state and the update rules. */
#ifndef GP_OPTIM_OPTIM_H
#define GP_OPTIM_OPTIM_H

#include "../layers/layer.h"

/* Validates the options; the message names the bad field and its range. */
gp_status gp_optim_check(const gp_optim_opts *o);
/* State tensors per trainable parameter: AdamW 2, SGD with momentum 1, plain
 * SGD 0 (o NULL: 0). What gp_optim_state_init allocates and planners count. */
int gp_optim_state_count(const gp_optim_opts *o);
/* Allocates (zeroed) the state a parameter needs on dev, as GP_MEM_OPTIM. */
gp_status gp_optim_state_init(const gp_optim_opts *o, gp_param *p, gp_device *dev);
/* One update of p from p->grad with learning rate lr; t is the 1-based
 * step number (AdamW bias correction). Does not clear the gradient. */
void gp_optim_update(const gp_optim_opts *o, gp_param *p, float lr, int t);

/* Sum of squares of a gradient, accumulated in double in element order. */
double gp_grad_sumsq(const gp_param *p);
/* grad *= scale */
void gp_grad_scale(gp_param *p, float scale);
/* The factor clip-by-global-norm multiplies gradients by (1 when off or
 * under the threshold), as torch.nn.utils.clip_grad_norm_. */
float gp_clip_factor(float clip_norm, double total_norm);

/* The per-layer partial of the global gradient norm: squared gradients of
 * the layer's trainable parameters, in parameter order. The trainer and the
 * pipeline both combine these in layer order, which is what makes the norm
 * (and so the update) independent of how layers are split into stages. */
double gp_layer_grad_sumsq(const gp_layer *l);
/* Clip by the global norm and update every trainable parameter of
 * layers[first, last) with the learning rate of 0-based `step`. */
void gp_optim_apply_layers(const gp_optim_opts *o, gp_layer *const *layers, int first, int last,
                           double global_norm, int step);

#endif
