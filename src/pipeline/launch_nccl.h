/* NCCL between the MPI launcher's GPU ranks (launch_nccl.c): the choice of NCCL or MPI with host
 * staging, and with NCCL the communicators, the stage messages' payloads on them and the
 * data-parallel gradient sum. */
#ifndef GP_PIPELINE_LAUNCH_NCCL_H
#define GP_PIPELINE_LAUNCH_NCCL_H

#include "comm/mpi_grid.h"
#include "pipeline/state.h"

typedef struct gp_nccl_state gp_nccl_state;

/* Collective over every rank, once the stages are made: chooses the path for want (p->gpu_comm,
 * p->gpu_comm_why; gp_gpu_comm_choose) and with NCCL makes *out (NULL with MPI) and hooks the
 * grid's pipe transport's stage messages (V = 1: activations and their gradients between neighbours,
 * link 0; the rest keep MPI with host staging). */
gp_status gp_launch_nccl_setup(struct gp_pipeline *p, gp_grid *grid, gp_gpu_comm want,
                               gp_nccl_state **out);
/* Queues the sum of one gradient bucket (a view of the gradient block on the stage's GPU) over
 * the replicas on the GPU's stream, in gp_dp_pair_rounds' order (ncclAllReduce where that is
 * 0); the optimizer's kernels run after it on the same stream, once gp_launch_nccl_grads_wait
 * has seen it done. */
gp_status gp_launch_nccl_grads(gp_nccl_state *n, const gp_tensor *slice);
/* Waits, within the comm timeout, for the sums started so far: the device stream's own waits
 * (cudaStreamSynchronize) have no deadline, and a replica that failed would hold them forever.
 * Every other host wait on the GPU while sums are queued (a copy to or from the host, a sync, a
 * kernel's read-back) takes the same wait first (gp_device_bound_waits, set by setup). A
 * failure aborts the run and the communicators at once. */
gp_status gp_launch_nccl_grads_wait(gp_nccl_state *n);
/* After a step whose messages and sums all completed (none of NCCL's in flight): the GPU's
 * frees held since the last (gp_device_hold_frees) are made. */
void gp_launch_nccl_step_end(gp_nccl_state *n);
void gp_launch_nccl_free(gp_nccl_state *n);

#endif
