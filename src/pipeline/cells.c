/* The cells of a pipeline: one routine that turns the pipeline options into K contiguous cells,
 * shared by the planner and the runtime so that `gpipe plan` shows exactly the cells a training
 * run gets (same per-layer figures, same micro-batch size, same memory model, same schedule-aware
 * number of micro-batches in flight). */
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "pipeline/partition.h"
#include "pipeline/schedule.h"

const char *gp_balance_name(gp_balance b) {
    return b == GP_BALANCE_COST ? "cost" : b == GP_BALANCE_TIME ? "time" : "?";
}

int gp_cells_in_flight(gp_schedule_kind schedule, int K, int M) {
    /* Fill-drain stashes all M micro-batches; 1F1B's stage 0 at most K of them (later stages
     * fewer: the partitioner counts each stage's, tapered), so min(K, M) bounds every stage of
     * it; ZB-H1 keeps min(K, M) on every stage (up to each micro-batch's weight part).
     * Interleaved: gp_cells_choose bounds each cell by its stage 0's peak over all its cells
     * (below), since a cell holds at most what its stage does. */
    return schedule != GP_SCHEDULE_GPIPE && schedule != GP_SCHEDULE_INTERLEAVED && K < M ? K : M;
}

gp_status gp_cells_choose(const gp_model *m, int64_t micro_batch_size, int optim_states,
                          const gp_pipeline_opts *po, int K, int M, gp_layer_est *est,
                          int *first, gp_remat *cell_remat) {
    const int L = gp_model_nlayers(m);
    /* The kernels' workspace sizes are those of a stage's device: a scratch one like it. */
    gp_device *dev = NULL;
    GP_TRY(gp_device_cpu_new_threads("plan", po->stage_threads > 0 ? po->stage_threads : 1, &dev));
    gp_status se = gp_layer_est_from_model(m, micro_batch_size, optim_states, dev, est);
    gp_device_free(dev);
    GP_TRY(se);
    if (po->balance == GP_BALANCE_TIME) {
        if (!po->layer_times)
            return gp_error(GP_INVALID_ARGUMENT,
                            "balance by time needs the measured layer times "
                            "(gp_model_profile_layers)");
        for (int i = 0; i < L; i++) {
            double f = po->layer_times[i], b = po->layer_times[L + i];
            if (!(f >= 0) || !(b >= 0))
                return gp_error(GP_INVALID_ARGUMENT,
                                "measured time of layer %d (%s): forward %g s, backward %g s; "
                                "expected finite values >= 0",
                                i, est[i].kind ? est[i].kind : "?", f, b);
            /* the weight part's share of the measured backward: its share of the FLOPs */
            est[i].wgt_time = est[i].bwd_time > 0 ? b * (est[i].wgt_time / est[i].bwd_time) : 0;
            est[i].fwd_time = f;
            est[i].bwd_time = b;
        }
    } else if (po->balance != GP_BALANCE_COST) {
        return gp_error(GP_INVALID_ARGUMENT, "unknown balance %d (expected cost or time)",
                        (int)po->balance);
    }
    int V;
    GP_TRY(gp_schedule_kind_chunks(po->schedule, po->chunks, &V));
    int in_flight = gp_cells_in_flight(po->schedule, K, M);
    if (V > 1) {
        /* Interleaved: stage 0 (of S = K / V) runs 2 (S - 1) + (V - 1) S warm-up forwards, then
         * one more before each backward, over its V cells; ZBV holds at most 2 S on a stage.
         * No cell holds more than its stage, nor more than M. Each cell is planned under a V-th
         * of the device's limit, safe but loose (the stage's peak is shared by its cells). */
        const int S = K / V;
        const int peak = po->schedule == GP_SCHEDULE_ZBV ? 2 * S : 2 * (S - 1) + (V - 1) * S + 1;
        in_flight = peak < M ? peak : M;
    }
    /* A split backward holds each micro-batch's state to its weight part, recomputed or not:
     * the memory of HELD for every cell, whose time is that of the mode asked for (SELECTIVE:
     * NONE, which then costs no more memory). */
    const bool split = gp_schedule_kind_splits(po->schedule);
    /* 1F1B's stage k stashes min(K - k, M): the partitioner counts each stage's own */
    const bool tapered = po->schedule == GP_SCHEDULE_1F1B;
    gp_partition_req req = {.layers = est,
                            .nlayers = L,
                            .stages = K,
                            .micro_batches = tapered ? M : in_flight,
                            .tapered = tapered,
                            .remat = split ? GP_REMAT_HELD : po->remat,
                            .mem_limit = po->memory_limit / (uint64_t)V,
                            .cell_remat = cell_remat};
    gp_status s;
    if (po->partition) {
        memcpy(first, po->partition, (size_t)K * sizeof *first);
        s = gp_partition_check(&req, first, K);
    } else {
        s = gp_partition_balance(&req, first, NULL);
    }
    for (int k = 0; split && cell_remat && s == GP_OK && k < K; k++)
        cell_remat[k] = po->remat == GP_REMAT_CELL ? GP_REMAT_CELL : GP_REMAT_NONE;
    if (s != GP_OK && V > 1)
        gp_error_context(s,
                         "schedule %s: each of a stage's %d cells planned with a %d-th of the "
                         "device's limit and %d of the M = %d micro-batches in flight",
                         gp_schedule_kind_name(po->schedule), V, V, in_flight, M);
    else if (s != GP_OK && tapered)
        gp_error_context(s,
                         "schedule 1f1b: stage k keeps at most min(K - k, M) of the M = %d "
                         "micro-batches in flight",
                         M);
    else if (s != GP_OK && in_flight != M)
        gp_error_context(s,
                         "schedule %s keeps at most min(K, M) = %d of the M = %d micro-batches "
                         "in flight per stage",
                         gp_schedule_kind_name(po->schedule), in_flight, M);
    if (s != GP_OK)
        gp_error_context(s, "micro-batches of %lld example%s", (long long)micro_batch_size,
                         micro_batch_size == 1 ? "" : "s");
    return s;
}
