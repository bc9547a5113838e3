/* The launcher of one stage shard per MPI process (launch_mpi.c), as the pipeline's set-up
 * chooses it. */
#ifndef GP_PIPELINE_LAUNCH_MPI_H
#define GP_PIPELINE_LAUNCH_MPI_H

#include "pipeline/state.h"

/* Binds the launcher to p (launcher.h): the grid, the transports, this process's place. */
gp_status gp_launch_mpi_init(struct gp_pipeline *p, const gp_pipeline_opts *po);
/* Every rank uses rank 0's cells (a balance by measured times may differ by rank). */
gp_status gp_launch_mpi_agree_cells(struct gp_pipeline *p, int *first);

/* Once the stages are made: NCCL or MPI between GPU ranks (launch_nccl.h), every rank. */
gp_status gp_launch_mpi_gpu_comm(struct gp_pipeline *p, const gp_pipeline_opts *po);

#endif
