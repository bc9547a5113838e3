/* The GPU ranks' choice of NCCL or MPI, and the pairwise order of the data-parallel gradient sum
 * (gpu_comm.h), shared by the MPI grid and the NCCL path so that the two give the same bits. */
#include "comm/gpu_comm.h"

#include <stdio.h>
#include <string.h>

const char *gp_gpu_comm_name(gp_gpu_comm c) {
    return c == GP_GPU_COMM_AUTO ? "auto" : c == GP_GPU_COMM_NCCL ? "nccl"
                                        : c == GP_GPU_COMM_MPI    ? "mpi"
                                                                  : "?";
}

gp_status gp_gpu_comm_choose(gp_gpu_comm want, const gp_gpu_comm_facts *f, gp_gpu_comm *use,
                             char *why, size_t n) {
    *use = GP_GPU_COMM_MPI;
    if (n) why[0] = '\0';
    if (want != GP_GPU_COMM_AUTO && want != GP_GPU_COMM_NCCL && want != GP_GPU_COMM_MPI)
        return gp_error(GP_INVALID_ARGUMENT, "gpu_comm %d: expected auto (%d), nccl (%d) or mpi (%d)",
                        (int)want, GP_GPU_COMM_AUTO, GP_GPU_COMM_NCCL, GP_GPU_COMM_MPI);
    if (!f->cuda) {
        if (want == GP_GPU_COMM_NCCL)
            return gp_error(GP_INVALID_ARGUMENT, "--gpu-comm nccl: NCCL runs between CUDA GPUs, "
                                                 "and the stages compute on the CPU (give "
                                                 "--device cuda)");
        return GP_OK;
    }
    if (want == GP_GPU_COMM_MPI) {
        snprintf(why, n, "as asked (--gpu-comm mpi)");
        return GP_OK;
    }
    if (f->nccl_missing) {
        if (want == GP_GPU_COMM_NCCL)
            return gp_error(GP_UNSUPPORTED, "--gpu-comm nccl: %s", f->nccl_missing);
        snprintf(why, n, "%s", f->nccl_missing);
        return GP_OK;
    }
    if (f->shared_a >= 0) {
        char msg[256];
        snprintf(msg, sizeof msg,
                 "ranks %d and %d share GPU %s, and one GPU cannot host two NCCL ranks (give "
                 "each rank a GPU of its own)",
                 f->shared_a, f->shared_b, f->shared_gpu ? f->shared_gpu : "?");
        if (want == GP_GPU_COMM_NCCL)
            return gp_error(GP_INVALID_ARGUMENT, "--gpu-comm nccl: %s", msg);
        snprintf(why, n, "%s", msg);
        return GP_OK;
    }
    *use = GP_GPU_COMM_NCCL;
    return GP_OK;
}

bool gp_gpu_comm_shared(const unsigned char *ids, int n, size_t idbytes, int *a, int *b) {
    *a = *b = -1;
    for (int j = 1; j < n; j++)
        for (int i = 0; i < j; i++)
            if (memcmp(ids + (size_t)i * idbytes, ids + (size_t)j * idbytes, idbytes) == 0) {
                *a = i;
                *b = j;
                return true;
            }
    return false;
}

int gp_dp_pair_rounds(int D, bool tree) {
    if (D == 2) return 1;
    if (!tree || D < 2 || (D & (D - 1)) != 0) return 0;
    int r = 0;
    while ((1 << r) < D) r++;
    return r;
}

void gp_dp_pair_add(float *x, const float *y, int64_t n) {
    for (int64_t i = 0; i < n; i++) x[i] += y[i];
}
