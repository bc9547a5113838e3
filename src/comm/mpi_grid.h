/* The process grid of the MPI launcher: a mesh of D data-parallel replicas x K pipeline stages x
 * T tensor-parallel shards, one MPI process per (replica, stage, shard), world rank
 * r = (replica * K + stage) * T + shard, so a stage's shards are consecutive ranks (they talk
 * most: two all-reduces per block forward and two backward), then a replica's stages
 * (neighbours on one node under mpirun's default mapping). One communicator per mesh axis
 * (MPI_Comm_split): the pipeline transport (the K stages of this replica and shard), the tensor
 * transport (the T shards of this stage and replica), the data-parallel gradient all-reduce in
 * buckets (the D replicas of this stage and shard), and every rank for the fixed-order norms
 * and the gathers. Without MPI every constructor fails with "MPI support was not built".
 * Private to the library; no MPI type appears here. */
#ifndef GP_COMM_MPI_GRID_H
#define GP_COMM_MPI_GRID_H

#include "comm/payload.h"
#include "comm/transport_iface.h"

typedef struct gp_grid gp_grid;

/* Flushes stdout/stderr and ends every rank (MPI_Abort): gp_mpi_finalize after a failed run. */
void gp_mpi_abort_job(int code);

/* Initializes MPI if needed and splits the world into D x K x T. The world size must be
 * D * K * T: otherwise GP_INVALID_ARGUMENT naming both, before anything else happens. timeout_s
 * bounds every wait (0: 60 s). The caller frees the grid with gp_grid_free. */
gp_status gp_grid_new(int D, int K, int T, double timeout_s, gp_grid **out);
void gp_grid_free(gp_grid *g);

int gp_grid_world_rank(const gp_grid *g);
int gp_grid_world_size(const gp_grid *g);
int gp_grid_stage(const gp_grid *g);   /* k in 0..K-1 */
int gp_grid_replica(const gp_grid *g); /* d in 0..D-1 */
int gp_grid_shard(const gp_grid *g);   /* t in 0..T-1 */
/* This rank among the ranks on its node (MPI_COMM_TYPE_SHARED, world order): the GPU it takes
 * there, since a node's GPUs are numbered from 0 whatever the world rank. */
int gp_grid_local_rank(const gp_grid *g);

/* The K stages of this replica and shard: rank k is stage k. Owned by the grid. */
gp_transport *gp_grid_pipe(gp_grid *g);
/* The T shards of this stage and replica: rank t is shard t (the float collectives). */
gp_transport *gp_grid_tensor(gp_grid *g);
/* Every rank (world order), for the fixed-order all-reduce of norms and losses. */
gp_transport *gp_grid_world(gp_grid *g);

/* Starts summing one bucket, slice (float32, a view of the gradient block), over this stage's
 * (and shard's) D replicas in place and returns at once; every replica starts the same buckets
 * in the same order. gp_grid_grads_wait completes every bucket started. The sum is pairwise
 * (gp_dp_pair_rounds: D = 2, or tree with D a power of two) or MPI_Iallreduce. With D = 2 a sum
 * of two values has the same bits in either order, so both replicas hold identical sums, run
 * after run. A slice in device memory is summed in a host copy (host staging) and copied back
 * by the wait. */
gp_status gp_grid_grads_start(gp_grid *g, const gp_tensor *slice);
gp_status gp_grid_grads_wait(gp_grid *g);
/* tree: with D a power of two, each bucket is summed by pairing the replicas in rounds of
 * distance 1, 2, 4, ... (replica d with d ^ distance), so that the sum is a binary tree over
 * the replicas in order, the same on every replica and the top of the single-replica tree
 * (GP_GRAD_SUM_TREE); other D > 2 keep MPI_Iallreduce. */
void gp_grid_set_grad_tree(gp_grid *g, bool tree);

/* Sets (or with NULL clears) the payload hook of the pipe transport (gp_grid_pipe); the old
 * hook's pending operations are forgotten first. */
void gp_grid_set_payload(gp_grid *g, const gp_transport_payload *hook);

/* Gathers every world rank's nbytes at mine (sizes may differ) into one malloc'ed block,
 * world order, on every rank: *all (the caller frees it) and offsets[W + 1] (caller-owned,
 * rank r's bytes at offsets[r] .. offsets[r + 1]). */
gp_status gp_grid_allgatherv(gp_grid *g, const void *mine, size_t nbytes, void **all,
                             size_t *offsets);

/* Bytes this process handed to MPI since the last reset: point-to-point (headers and payloads)
 * and gradients given to the data-parallel all-reduce. */
void gp_grid_bytes(const gp_grid *g, uint64_t *p2p, uint64_t *allreduce);
void gp_grid_bytes_reset(gp_grid *g);
/* Counts bytes given to a data-parallel all-reduce outside MPI (NCCL) as the grid's own. */
void gp_grid_count_allreduce(gp_grid *g, uint64_t nbytes);

/* Marks the run failed by this process (notes to every rank) and whether it was aborted. */
void gp_grid_abort(gp_grid *g, gp_status s, const char *why);
/* Whether a run of this process failed (its own failure or a peer's note). */
bool gp_grid_failed(gp_grid *g);

/* The grid's bounded wait (gp_mpi_wait_for) on anything pollable (an NCCL operation): until
 * poll says done, the timeout (which aborts the run), a peer's abort note, or poll's error,
 * which also aborts the run. doing names the wait in the error. */
typedef gp_status (*gp_grid_poll_fn)(void *ctx, bool *done);
gp_status gp_grid_wait_for(gp_grid *g, gp_grid_poll_fn poll, void *ctx, const char *doing);

#endif
