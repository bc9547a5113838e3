/* The launcher of the stages in this process (launch_local.c), as the pipeline's set-up chooses
 * it. */
#ifndef GP_PIPELINE_LAUNCH_LOCAL_H
#define GP_PIPELINE_LAUNCH_LOCAL_H

#include "pipeline/state.h"

/* Binds the launcher to p (launcher.h): its hooks, its state and each worker's core. */
gp_status gp_launch_local_init(struct gp_pipeline *p, const gp_pipeline_opts *po);

#endif
