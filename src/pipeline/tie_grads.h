/* Parameters tied across cells (tie_grads.c): their gradients summed at the step's end. */
#ifndef GP_PIPELINE_TIE_GRADS_H
#define GP_PIPELINE_TIE_GRADS_H

#include "pipeline/state.h"

/* At the step's end, before the norms: each tie's two
 * gradients (as the data-parallel sums left them) become their sum at both uses. gp_ties_sum:
 * the uses on lead s's stage (both: in place; one: an exchange with the other's stage over the
 * pipeline transport); gp_ties_sum_local: every worker of an in-process pipeline. */
gp_status gp_ties_sum(struct gp_pipeline *p, gp_stage *lead);
gp_status gp_ties_sum_local(struct gp_pipeline *p);

#endif
