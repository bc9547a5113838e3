/* The step's timeline (timeline.c): the launchers hand it the transport calls' times and the
 * gathered tracks; it makes the trace events and the simulator's bubbles. */
#ifndef GP_PIPELINE_TIMELINE_H
#define GP_PIPELINE_TIMELINE_H

#include "pipeline/state.h"

/* Before a step or a gather: an empty trace, and no complete timeline until
 * gp_timeline_simulate succeeds. */
void gp_timeline_reset(struct gp_pipeline *p);
/* Threads transport, after a successful step: every call split into WAIT and its hand-over from
 * the peers' times. */
gp_status gp_timeline_trace_comm(struct gp_pipeline *p);
/* MPI: cell s's transport calls as WAIT events on its track (named by what they moved). */
gp_status gp_timeline_trace_calls(gp_stage *s);
/* MPI: another rank's events on track r, their times shifted by shift (events a failure left
 * open are skipped). */
gp_status gp_timeline_add_track(struct gp_pipeline *p, int r, const gp_trace_event *ev, int n,
                                double shift);
/* The simulator's bubbles (mean times and replay); on success the timeline is complete
 * (gp_pipeline_last_stats and the pictures have it). */
gp_status gp_timeline_simulate(struct gp_pipeline *p);

#endif
