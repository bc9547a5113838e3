/* What the pipeline's checkpoint code (checkpoint.c) needs of the runtime. Private. */
#ifndef GP_PIPELINE_RUNTIME_INTERNAL_H
#define GP_PIPELINE_RUNTIME_INTERNAL_H

#include "gpipe.h"

gp_model *gp_pipeline_model(const gp_pipeline *p);
const gp_optim_opts *gp_pipeline_optim(const gp_pipeline *p);
/* Every rank's nbytes at mine into all (world size x nbytes, world order), on every rank,
 * bounded by the comm timeout; on threads all gets mine. */
gp_status gp_pipeline_allgather(gp_pipeline *p, const void *mine, size_t nbytes, void *all);

#endif
