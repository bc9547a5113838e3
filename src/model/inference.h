/* Inference (inference.c): the eval-mode forward over a range of layers, each on its
 * parameters' device, and the scoring of logits against labels. */
#ifndef GP_MODEL_INFERENCE_H
#define GP_MODEL_INFERENCE_H

#include "model/model_types.h"

/* Eval-mode forward of layers [first, last) on x (anywhere): each layer runs on its parameters'
 * device, the activation moving between devices; out (the caller releases it) lives on the last
 * layer's device. Every layer of the range must be initialized. */
gp_status gp_model_forward_eval(gp_model *m, int first, int last, const gp_tensor *x,
                                gp_tensor *out);
/* The loss sum (normalizer 1) and correct argmax predictions of logits against labels y (either
 * anywhere; labels -1 are not counted). */
gp_status gp_model_score(const gp_tensor *logits, const gp_tensor *y, double *loss_sum,
                         int64_t *ncorrect, int64_t *ncount);

#endif
