/* What pipeline.c gives the library's own code beyond gpipe.h: the checkpoint code's view of the
 * pipeline, and the tests' hooks. */
#ifndef GP_PIPELINE_PIPELINE_HOOKS_H
#define GP_PIPELINE_PIPELINE_HOOKS_H

#include "gpipe.h"
#include "pipeline/stage.h" /* gp_pipeline_apply */

/* What the pipeline's checkpoint code (checkpoint.c) needs of the pipeline. */
gp_model *gp_pipeline_model(const gp_pipeline *p);
const gp_optim_opts *gp_pipeline_optim(const gp_pipeline *p);

/* Test hooks (the library's tests only): a step's forward and backward over every micro-batch
 * without the update, leaving the summed gradients in place; then gp_pipeline_apply (stage.h)
 * makes the update on its own. In-process launchers only. */
gp_status gp_pipeline_accumulate(gp_pipeline *p, const gp_tensor *x, const gp_tensor *y,
                                 float *loss);

#endif
