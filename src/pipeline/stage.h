/* The stage interpreter's interface (stage.c): what the launchers, the pipeline and the timeline
 * call to run one stage's action list and to prepare its per-step state. */
#ifndef GP_PIPELINE_STAGE_H
#define GP_PIPELINE_STAGE_H

#include "pipeline/state.h"

/* Runs the action list of lead s's stage (all its cells) for one step on the calling thread; the
 * outcome in s->status and s->msg (an abort of the transport tells the other stages). */
void gp_stage_run(gp_stage *s);
/* The stage's per-step state arrays for M micro-batches (freed by gp_stage_free_state). */
gp_status gp_stage_alloc_state(gp_stage *s, int M);
void gp_stage_free_state(gp_stage *s);
/* Rows [first, first + n) of the step's input or labels, on the stage's device: a view when the
 * device can read host memory, else a copy (released by the caller with gp_tensor_release). */
gp_status gp_stage_input_rows(gp_stage *s, const gp_tensor *t, int64_t first, int64_t n,
                              gp_tensor *out);
/* Before a step: the stage's micro-batch shapes at p->b, its status cleared. */
gp_status gp_stage_begin_step(gp_stage *s);
/* The trace label of cell s's transfers of kind j (send or receive): "SEND_ACT", "RECV_GRAD",
 * with GP_TRACE_SKIP_MARK and their count where the cut it crosses carries skips. */
void gp_stage_msg_label(const gp_stage *s, bool send, gp_msg_kind j, char *buf, size_t n);
/* Pins the calling thread to s->cpu (none: -1); s->pinned says whether it took. */
void gp_stage_pin_thread(gp_stage *s);

/* Test hook (the library's tests only; see pipeline_hooks.h): after gp_pipeline_accumulate, the
 * update on its own (clip, optimizer, gradients cleared, step + 1; a non-finite norm:
 * GP_NUMERIC, gradients cleared, no update). In-process launchers only. */
gp_status gp_pipeline_apply(gp_pipeline *p);

#endif
