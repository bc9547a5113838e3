/* The launcher options shared by `gpipe train` and `gpipe bench` (--launcher, --data-parallel,
 * --comm-timeout, --gpu-comm): the stages run as MPI processes when an MPI launcher (mpirun, srun) started
 * the process, as threads otherwise; the launch is checked against D x K x T before any work; ranks
 * other than 0 stay silent on stdout (their errors still reach stderr). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"

/* The longest --comm-timeout: about 31 years, a deadline every clock the transports wait on
 * still holds (a larger double overflows their whole seconds). */
#define MAX_WAIT_S 1e9

void gp_cli_mpi_options(gp_cli_opt out[GP_CLI_MPI_NOPTS], gp_cli_mpi_args *a) {
    gp_cli_opt tab[GP_CLI_MPI_NOPTS] = {
        {"--launcher", GP_CLI_CHOICE, &a->launcher, "threads|mpi",
         "how the stages are started: threads of this process, or MPI processes (mpirun -np "
         "D*K)",
         "mpi when started by mpirun/srun, else threads", 0, false, "threads|mpi", false, 0, false},
        {"--data-parallel", GP_CLI_INT, &a->data_parallel, "D",
         "MPI: D replicas of the K stages, each on its slice of the mini-batch", "1", 1, false,
         NULL, false, GP_MAX_DEVICES, false},
        {"--comm-timeout", GP_CLI_FLOAT, &a->comm_timeout, "SECONDS",
         "longest wait on another stage (thread or rank) before the step fails, naming it", "60",
         0, true, NULL, false, MAX_WAIT_S, false},
        {"--gpu-comm", GP_CLI_CHOICE, &a->gpu_comm, "auto|nccl|mpi",
         "MPI with --device cuda: how the ranks send stage messages and sum gradients: NCCL "
         "(built with GP_NCCL; each rank on a GPU of its own: one GPU cannot host two NCCL "
         "ranks) or MPI with host staging; auto takes NCCL where it can and says why not",
         "auto", 0, false, "auto|nccl|mpi", false, 0, false},
    };
    memcpy(out, tab, sizeof tab);
}

int gp_cli_mpi_resolve(const char *cmd, gp_cli_opt *tab, int n, const gp_cli_mpi_args *a, int K,
                       int T, gp_cli_mpi_place *out) {
    int launched_size = 1;
    bool launched = gp_mpi_launched(&launched_size);
    bool seen_launcher = gp_cli_seen(tab, n, "--launcher");
    bool mpi = seen_launcher ? strcmp(a->launcher, "mpi") == 0 : launched && gp_mpi_built();
    *out = (gp_cli_mpi_place){.launcher = GP_LAUNCHER_THREADS, .data_parallel = 1, .rank = 0,
                              .nranks = 1, .timeout_s = 60};
    if (gp_cli_seen(tab, n, "--comm-timeout")) out->timeout_s = a->comm_timeout;
    if (mpi && !gp_mpi_built())
        return gp_cli_usage_error(cmd,
                                  "--launcher mpi: MPI support was not built into this gpipe "
                                  "(install libopenmpi-dev and rebuild)");
    if (!mpi && launched && launched_size > 1)
        return gp_cli_usage_error(
            cmd, "started by an MPI launcher with %d ranks, but %s: every rank would train alone",
            launched_size,
            seen_launcher ? "--launcher threads was given" : "MPI support was not built into this gpipe");
    if (!mpi) {
        if (gp_cli_seen(tab, n, "--data-parallel"))
            return gp_cli_usage_error(cmd,
                                      "--data-parallel: only with the MPI launcher (start gpipe "
                                      "with mpirun -np D*K, or give --launcher mpi)");
        if (gp_cli_seen(tab, n, "--gpu-comm"))
            return gp_cli_usage_error(cmd, "--gpu-comm: only with the MPI launcher (stages on "
                                           "threads share one process and its GPUs)");
        return GP_CLI_EXIT_OK;
    }
    out->launcher = GP_LAUNCHER_MPI;
    out->gpu_comm = !a->gpu_comm || strcmp(a->gpu_comm, "auto") == 0 ? GP_GPU_COMM_AUTO
                    : strcmp(a->gpu_comm, "nccl") == 0                ? GP_GPU_COMM_NCCL
                                                                      : GP_GPU_COMM_MPI;
    out->data_parallel = gp_cli_seen(tab, n, "--data-parallel") ? a->data_parallel : 1;
    if (gp_mpi_init(&out->rank, &out->nranks) != GP_OK)
        return gp_cli_fail(cmd, "--launcher mpi: cannot initialize MPI");
    const long long need = (long long)out->data_parallel * K * T; /* each up to GP_MAX_DEVICES */
    if (out->nranks != need && out->rank != 0) return GP_CLI_EXIT_USAGE; /* rank 0 says why */
    if (out->nranks != need && T > 1)
        return gp_cli_usage_error(cmd,
                                  "launched with %d MPI rank%s, but --data-parallel %d x --stages "
                                  "%d x --tensor-parallel %d needs D x K x T = %lld ranks (one per "
                                  "replica, stage and shard): start mpirun -np %lld",
                                  out->nranks, out->nranks == 1 ? "" : "s", out->data_parallel, K,
                                  T, need, need);
    if (out->nranks != need)
        return gp_cli_usage_error(cmd,
                                  "launched with %d MPI rank%s, but --data-parallel %d x --stages "
                                  "%d needs D x K = %lld ranks (one per replica and stage): start "
                                  "mpirun -np %lld",
                                  out->nranks, out->nranks == 1 ? "" : "s", out->data_parallel, K,
                                  need, need);
    /* One voice: rank 0 prints progress, summaries and reports. */
    if (out->rank != 0 && !freopen("/dev/null", "w", stdout))
        fprintf(stderr, "gpipe %s: rank %d: cannot silence stdout\n", cmd, out->rank);
    return GP_CLI_EXIT_OK;
}

void gp_cli_mpi_apply(const gp_cli_mpi_place *pl, gp_pipeline_opts *po) {
    po->launcher = pl->launcher;
    po->data_parallel = pl->data_parallel;
    po->comm_timeout_s = pl->timeout_s;
    po->gpu_comm = pl->gpu_comm;
}

void gp_cli_gpu_comm_print(const gp_pipeline *p, const gp_cli_mpi_place *pl,
                           gp_device_type type) {
    if (pl->launcher != GP_LAUNCHER_MPI || type != GP_DEVICE_CUDA) return;
    const char *why = "";
    if (gp_pipeline_gpu_comm(p, &why) == GP_GPU_COMM_NCCL)
        printf("GPU ranks: NCCL for stage messages and the gradient sum (a GPU each)\n");
    else
        printf("GPU ranks: MPI with host staging: %s\n", why);
}

void gp_cli_comm_report(cJSON *obj, const gp_pipeline *p, const gp_cli_mpi_place *pl) {
    cJSON *arr = cJSON_AddArrayToObject(obj, "bytes_sent_last_step");
    const int K = gp_pipeline_stages(p), T = gp_pipeline_tensor_parallel(p);
    const bool mpi = pl->launcher == GP_LAUNCHER_MPI;
    const int W = mpi ? pl->nranks : K * T; /* devices, mesh order */
    uint64_t *p2p = calloc((size_t)W, sizeof *p2p), *ar = calloc((size_t)W, sizeof *ar);
    uint64_t *tb = calloc((size_t)W, sizeof *tb);
    if (p2p && ar && tb && (mpi || T > 1) &&
        gp_pipeline_bytes_sent(p, p2p, ar, W) == GP_OK &&
        gp_pipeline_bytes_tensor(p, tb, W) == GP_OK) {
        for (int r = 0; r < W; r++) {
            cJSON *e = cJSON_CreateObject();
            if (mpi) cJSON_AddNumberToObject(e, "rank", r);
            cJSON_AddNumberToObject(e, "stage", r / T % K);
            cJSON_AddNumberToObject(e, "shard", r % T);
            cJSON_AddNumberToObject(e, "replica", r / (K * T));
            if (mpi) {
                gp_cli_report_u64(e, "p2p", p2p[r]);
                gp_cli_report_u64(e, "allreduce", ar[r]);
            }
            gp_cli_report_u64(e, "tensor", tb[r]);
            cJSON_AddItemToArray(arr, e);
        }
    }
    free(p2p);
    free(ar);
    free(tb);
}
