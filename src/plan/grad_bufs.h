/* The gradient-sized buffers each cell keeps beside its slice of the gradient block from step to
 * step (grad_bufs.c), for the memory model: counted as gradients on the cell's device, they add
 * to its peak. Private to the library. */
#ifndef GP_PLAN_GRAD_BUFS_H
#define GP_PLAN_GRAD_BUFS_H

#include "plan/partition.h"
#include "plan/schedule.h"

/* Sets prof[c].grad_bufs for each of schedule s's cells under pipeline options po, as the runtime
 * allocates them:
 *   - GP_GRAD_SUM_TREE: the tree's pool (pipeline/grad_tree.c), as many buffers as its binary
 *     counter holds at once over the cell's backwards in s's order: with M = q 2^n (q odd) and
 *     the blocks of q micro-batches finishing one after another, n; more where a schedule defers
 *     weight parts past the next block's start (none for an odd M);
 *   - D > 1 replicas over MPI (comm/mpi_grid.c): the stage's gradients go out in buckets that
 *     cover them once, and each bucket keeps, counted on its device, a host buffer for the
 *     partner's partial sum where the replicas sum pairwise (gp_dp_pair_rounds > 0) and, on a
 *     GPU, a host copy of the bucket: one more each. NCCL (po->gpu_comm NCCL) keeps one partner
 *     buffer per stage instead, its largest bucket, which is not counted here; AUTO is counted as
 *     the MPI path, the larger.
 * prof: the schedule's K V cells' profiles (their points untouched). */
gp_status gp_grad_bufs(const gp_schedule *s, const gp_pipeline_opts *po, gp_stash_profile *prof);

#endif
