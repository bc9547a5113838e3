/* What a launcher may change in the runtime (launcher.c): its hooks and transports, where this
 * process stands, and a step's inputs and counters. The launchers read the state (state.h) but
 * set it only through these, so the runtime's own files know every writer of its fields. */
#ifndef GP_PIPELINE_LAUNCHER_H
#define GP_PIPELINE_LAUNCHER_H

#include "pipeline/state.h"

/* The launcher's hooks, its own state (released by iface->free) and what it does for the stages
 * around the gradients. */
void gp_pipeline_bind_launcher(gp_pipeline *p, const gp_launcher_iface *iface, void *state,
                               const gp_stage_sync *sync);
/* The transport between the cells that the pipeline itself uses (MPI: streamed evaluation and
 * hash); NULL: none. */
void gp_pipeline_bind_transport(gp_pipeline *p, gp_transport *tr);
/* Cell s's transports: to its neighbouring cells (its rank: s->k) and across its stage's shards
 * (its rank: s->t); NULL: none (K = 1 inline, or between steps). */
void gp_stage_bind_transports(gp_stage *s, gp_transport *pipe, gp_transport *tensor);
/* The core cell s's thread is pinned to when it leads its stage; -1: not pinned. */
void gp_stage_set_cpu(gp_stage *s, int cpu);

/* Where this process stands in an MPI launch. */
typedef struct gp_place {
    int rank, nranks;    /* in the world */
    int stage, shard;    /* the stage and shard this process runs */
    int replica, replicas;
    int local_rank;      /* among the node's ranks: its GPU there */
} gp_place;
/* Sets the place and makes the per-rank byte counters. */
gp_status gp_pipeline_set_place(gp_pipeline *p, const gp_place *pl);
/* What the GPU ranks use between them (NCCL or MPI) and why MPI (gp_pipeline_gpu_comm). */
void gp_pipeline_set_gpu_comm(gp_pipeline *p, gp_gpu_comm use, const char *why);

/* Before the stages run a step: its inputs as the stages see them (this replica's rows), the
 * global index of its first micro-batch (RNG keys), every cell run here begun, the timeline
 * emptied. */
gp_status gp_pipeline_begin_step(gp_pipeline *p, const gp_tensor *x, const gp_tensor *y, int mb0);
/* After the stages ran it: the step's seconds. */
void gp_pipeline_end_step(gp_pipeline *p, double seconds);
/* The last step's bytes of rank (or, on threads, worker) r: point-to-point and all-reduce (kept
 * under MPI only) and the tensor axis's. */
void gp_pipeline_set_bytes(gp_pipeline *p, int r, uint64_t p2p, uint64_t allreduce,
                           uint64_t tensor);
/* Rank r's stage counters, at a gather. */
gp_status gp_pipeline_set_rank_mem(gp_pipeline *p, int r, const gp_mem_stats *m);

#endif
