/* Evaluation of many batches with the stages at work at once (eval_overlap.c): for in-process
 * pipelines of one cell per stage, without shards, each stage on a host device of its own. */
#ifndef GP_PIPELINE_EVAL_OVERLAP_H
#define GP_PIPELINE_EVAL_OVERLAP_H

#include "pipeline/state.h"

bool gp_eval_overlap_applies(const struct gp_pipeline *p);
/* logits NULL: each batch scored against ys; else its logits copied into logits[i]. */
gp_status gp_eval_overlap(struct gp_pipeline *p, int n, const gp_tensor *xs, const gp_tensor *ys,
                          gp_tensor *logits, double *loss_sum, int64_t *ncorrect,
                          int64_t *ncount);

#endif
