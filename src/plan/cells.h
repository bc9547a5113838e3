/* The cells of a pipeline (cells.c): each cell's memory as its share of its stage's simulated
 * peak under a schedule, the profiles of moments the memory model is evaluated at, and the choice
 * of the K cells (partition given or balanced, each cell's remat mode) that gp_plan_make and
 * gp_pipeline_new share. Private to the library. */
#ifndef GP_PLAN_CELLS_H
#define GP_PLAN_CELLS_H

#include "plan/partition.h"
#include "plan/schedule.h"
#include "plan/simulate.h"

/* The bytes of ncells cells (starts first[], modes cell_remat: CELL or NONE) that po's schedule
 * runs V to a stage over M micro-batches, as shares of each stage's peak: out[c] (ncells
 * entries) holds cell c's static bytes (its gradients with the buffers of their sums that po's
 * grad_sum and data parallelism keep, gp_grad_bufs), its part of its stage's simulated peak of
 * activations (stash; work 0: the rebuilt state is in the peak), its messages, and its transient
 * only when it is the largest of its stage's (a stage runs one action at a time: counted once);
 * total adds them, so a stage's cells' totals add up to its peak: stage_total (may be NULL,
 * ncells / V entries). The simulation is of memory alone, which the order of each stage's
 * actions decides, not their times. */
gp_status gp_cells_memory(const gp_layer_est *est, int L, const int *first,
                          const gp_remat *cell_remat, int ncells, int M,
                          const gp_pipeline_opts *po, int V, gp_cell_mem *out,
                          uint64_t *stage_total);

/* The K cells for pipeline options po (partition given or balanced, balance by cost or by
 * po->layer_times, the memory limit checked on every stage's simulated peak, as the plan reports
 * it, for every schedule): what gp_plan_make and gp_pipeline_new both use. est (L entries)
 * receives the layers' figures at micro_batch_size, times in FLOPs or (balance TIME) measured
 * seconds; first and cell_remat (each cell's own mode, CELL or NONE): K entries, both needed. */
gp_status gp_cells_choose(const gp_model *m, int64_t micro_batch_size, int optim_states,
                          const gp_pipeline_opts *po, int K, int M, gp_layer_est *est,
                          int *first, gp_remat *cell_remat);

/* gp_cells_memory's shares from a simulation already made of schedule s (of po's schedule
 * kind, with any times: the peaks depend on each stage's order alone), st holding its s->stages
 * stages: the planner's, so that it replays each candidate once. */
gp_status gp_cells_memory_shares(const gp_layer_est *est, int L, const int *first,
                                 const gp_remat *cell_remat, const gp_pipeline_opts *po,
                                 const gp_schedule *s, const gp_sim_stage *st, gp_cell_mem *out,
                                 uint64_t *stage_total);
/* Each cell's profile (partition.h) under schedule s: out[c] for its K V cells (zeroed by the
 * caller), the points of its stage's order of actions at which the cell's part of the stage's
 * activations can peak, as the simulator counts them. With one cell per stage the largest point
 * is the stage's simulated peak exactly; with several, the cells' largest points add up to at
 * least it. Free the points with gp_stash_profiles_free. */
gp_status gp_stash_profiles(const gp_schedule *s, gp_stash_profile *out);
void gp_stash_profiles_free(gp_stash_profile *p, int n);

#endif
