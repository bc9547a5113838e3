/* The simulator (simulate.c): predicts a schedule's step time, bubble and activation memory
 * from each cell's figures. Private to the library. */
#ifndef GP_PLAN_SIMULATE_H
#define GP_PLAN_SIMULATE_H

#include "plan/partition.h"
#include "plan/replay.h"

/* Sums a cell's figures over layers [first, end) (the memory model's terms). */
gp_sim_cell gp_sim_cell_from_layers(const gp_layer_est *layers, int first, int end);
/* Validates s with o->capacity, then plays it with cells[K V] figures (cell c's at c; a stage's
 * optimizer step takes the sum of its cells' opt_time): actions of a stage run one
 * after another; a RECV ends when its message has arrived (send end + latency); a SEND waits
 * while the mailbox is full (until the receiver took the message `capacity` sends earlier).
 * stages[K] (caller-owned) get per-stage figures. */
gp_status gp_schedule_simulate(const gp_schedule *s, const gp_sim_cell *cells,
                               const gp_sim_opts *o, gp_sim_stage *stages, gp_sim_result *out);
/* The step of K stages on `units` devices (stage k on device k mod units) that run one
 * stage's work at a time, as a GPU does: at least the busiest device's stages' busy times
 * together; step where units <= 0 or units >= K (a device each). The replay lets stages on one
 * device overlap: on one GPU, T3 as K = 4 was simulated at 0.56 s a step against the 1.36 s
 * that one stage measured. */
double gp_sim_shared_step(const gp_sim_stage *stages, int K, int units, double step);

#endif
