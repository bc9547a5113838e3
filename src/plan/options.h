/* The pipeline options' sizes with their zeros read as the defaults, for the planner and the
 * runtime after gp_pipeline_opts_check (public, in gpipe.h) has passed them. */
#ifndef GP_PLAN_OPTIONS_H
#define GP_PLAN_OPTIONS_H

#include "core/error.h"
#include "gpipe.h"

typedef struct gp_pipeline_sizes {
    int stages, micro_batches, tensor_parallel, data_parallel;
    int chunks; /* V cells per stage: the schedule's (1 where po->chunks is none it runs) */
} gp_pipeline_sizes;

gp_pipeline_sizes gp_pipeline_opts_sizes(const gp_pipeline_opts *po);

#endif
