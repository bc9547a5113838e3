/* The tree sum of a cell's weight gradients over its micro-batches (grad_tree.c; the state is
 * gp_grad_tree in state.h), as the stage interpreter and the pipeline's set-up use it. */
#ifndef GP_PIPELINE_GRAD_TREE_H
#define GP_PIPELINE_GRAD_TREE_H

#include "pipeline/state.h"

/* Setup for M micro-batches once the cell's store exists (off for SEQUENTIAL: not called); free
 * releases the buffers (before the cell's device goes). */
gp_status gp_grad_tree_setup(gp_stage *s, int M);
void gp_grad_tree_free(gp_stage *s);
void gp_grad_tree_begin_step(gp_stage *s);
/* Around a backward (or either part of a split one) of micro-batch mb: the cell's gradient
 * views point at its block's leaf; last_part: mb's weight gradients are complete. */
gp_status gp_grad_tree_enter(gp_stage *s, int mb);
gp_status gp_grad_tree_leave(gp_stage *s, int mb, bool last_part);
/* Whether the weight gradients of mb complete the last leaf: its layers are then folded into
 * the gradient block one by one, gp_grad_tree_layer_final(s, li) as layer li finishes. */
bool gp_grad_tree_folds(const gp_stage *s, int mb);
gp_status gp_grad_tree_layer_final(gp_stage *s, int li);

#endif
