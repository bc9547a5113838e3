/* Which way the MPI launcher's GPU ranks talk (gpu_comm.c): the choice between NCCL and MPI with
 * host staging from what is known about the run, and the order of the data-parallel gradient
 * sum that the MPI and NCCL paths share, so that both give the same bits. Pure functions: no
 * MPI, no NCCL. */
#ifndef GP_COMM_GPU_COMM_H
#define GP_COMM_GPU_COMM_H

#include <stddef.h>

#include "core/error.h"
#include "gpipe.h"

/* What the choice depends on, the same on every rank. */
typedef struct gp_gpu_comm_facts {
    bool cuda;                /* the ranks' stages compute on CUDA devices */
    const char *nccl_missing; /* NULL: the build has NCCL; else why not (its error message) */
    int shared_a, shared_b;   /* two ranks on one GPU (a < b), or -1: every GPU distinct */
    const char *shared_gpu;   /* that GPU, for the message */
} gp_gpu_comm_facts;

/* The path to take for `want`: *use is NCCL or MPI, and why (n bytes) says why MPI was taken on
 * GPUs ("" for NCCL, and on CPUs, where there is nothing to say). An explicit NCCL that cannot
 * be is GP_INVALID_ARGUMENT (not --device cuda, ranks sharing a GPU) or GP_UNSUPPORTED (not
 * built), naming why. */
gp_status gp_gpu_comm_choose(gp_gpu_comm want, const gp_gpu_comm_facts *f, gp_gpu_comm *use,
                             char *why, size_t n);

/* The first two ranks (*a < *b) of n whose ids (idbytes each, rank after rank) are equal: true
 * then, false when every id is distinct. */
bool gp_gpu_comm_shared(const unsigned char *ids, int n, size_t idbytes, int *a, int *b);

/* The rounds of pairwise exchange that sum a gradient bucket over D replicas, or 0 where the sum
 * is one all-reduce of the library's (MPI_Iallreduce, ncclAllReduce) in its own order. In round
 * i replica d sends its partial sum to gp_dp_partner(d, i), receives the partner's and adds it
 * (x + y: a commutative pair, so both partners hold the same bits). With tree (GP_GRAD_SUM_TREE)
 * and D a power of two: log2 D rounds, the top of the single replica's tree; D = 2 either way:
 * one round, the one sum of two values, as any all-reduce adds them. */
int gp_dp_pair_rounds(int D, bool tree);
static inline int gp_dp_partner(int replica, int round) { return replica ^ (1 << round); }
/* x[i] += y[i], i < n: a round's add on the host (the GPU's is the axpy kernel, alpha 1). */
void gp_dp_pair_add(float *x, const float *y, int64_t n);

#endif
