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

/* a + b, or UINT64_MAX where it would wrap (the memory model's sums saturate) */
static uint64_t sat_sum(uint64_t a, uint64_t b) { return a > UINT64_MAX - b ? UINT64_MAX : a + b; }

void gp_cells_memory_shares(const gp_layer_est *est, int L, const int *first,
                            const gp_remat *cell_remat, gp_schedule_kind schedule,
                            const gp_schedule *s, const gp_sim_stage *st, gp_cell_mem *out,
                            uint64_t *stage_total) {
    const int S = s->stages, V = s->chunks, ncells = S * V;
    /* a split backward holds its state to the weight part: the transient of HELD */
    const bool split = gp_schedule_kind_splits(schedule);
    for (int c = 0; c < ncells; c++) {
        const int e = c + 1 < ncells ? first[c + 1] : L;
        out[c] = gp_cell_memory(est, first[c], e, L, 1, split ? GP_REMAT_HELD : cell_remat[c]);
    }
    for (int k = 0; k < S; k++) {
        int largest = -1; /* the stage's cell with the largest transient, the first of equals */
        for (int v = 0; v < V; v++) {
            const int c = gp_schedule_cell(s, k, v);
            if (largest < 0 || out[c].transient > out[largest].transient) largest = c;
        }
        for (int v = 0; v < V; v++) {
            const int c = gp_schedule_cell(s, k, v);
            gp_cell_mem *m = &out[c];
            m->stash = st[k].peak_chunk_bytes[v];
            m->work = 0;
            if (c != largest) m->transient = 0;
            m->total = sat_sum(sat_sum(sat_sum(m->params, m->grads), sat_sum(m->optim, m->stash)),
                               sat_sum(m->transient, m->messages));
            if (stage_total) stage_total[k] = sat_sum(v ? stage_total[k] : 0, m->total);
        }
    }
}

gp_status gp_cells_memory(const gp_layer_est *est, int L, const int *first,
                          const gp_remat *cell_remat, int ncells, int M,
                          gp_schedule_kind schedule, int V, gp_cell_mem *out,
                          uint64_t *stage_total) {
    const int S = V > 0 ? ncells / V : 0;
    if (!est || !first || !cell_remat || !out || V < 1 || S < 1 || S * V != ncells)
        return gp_error(GP_INVALID_ARGUMENT, "cell memory: %d cells in V = %d per stage", ncells,
                        V);
    gp_schedule s = {0};
    gp_sim_cell *sc = calloc((size_t)ncells, sizeof *sc);
    gp_sim_stage *st = calloc((size_t)S, sizeof *st);
    gp_status status = sc && st ? GP_OK
                                : gp_error(GP_OUT_OF_MEMORY, "cell memory: %d cells", ncells);
    if (status == GP_OK) status = gp_schedule_generate(gp_schedule_kind_name(schedule), S, M, V, &s);
    for (int c = 0; status == GP_OK && c < ncells; c++)
        sc[c] = gp_sim_cell_from_layers(est, first[c], c + 1 < ncells ? first[c + 1] : L);
    gp_sim_opts so = {.capacity = GP_MAILBOX_CAPACITY, .cell_remat = cell_remat};
    gp_sim_result res;
    if (status == GP_OK) status = gp_schedule_simulate(&s, sc, &so, st, &res);
    if (status == GP_OK)
        gp_cells_memory_shares(est, L, first, cell_remat, schedule, &s, st, out, stage_total);
    gp_schedule_free(&s);
    free(sc);
    free(st);
    return status;
}

/* A cell's time as the stages add it: forward + backward, and the forward again when it
 * recomputes. */
static double cell_cost(const gp_layer_est *est, const int *first, int c, int K, int L,
                        const gp_remat *cell_remat) {
    const int e = c + 1 < K ? first[c + 1] : L;
    double t = gp_cell_time(est, first[c], e);
    if (cell_remat && cell_remat[c] == GP_REMAT_CELL)
        for (int i = first[c]; i < e; i++) t += est[i].fwd_time;
    return t;
}

/* The slowest stage's time and the sum of squares of all (the tie-break that lets equal
 * maxima move towards balance). stage_of[c]: the stage running cell c. */
static void stage_load(const gp_layer_est *est, const int *first, int K, int L, int S,
                       const int *stage_of, const gp_remat *cell_remat, double *load,
                       double *worst, double *squares) {
    for (int k = 0; k < S; k++) load[k] = 0;
    for (int c = 0; c < K; c++) load[stage_of[c]] += cell_cost(est, first, c, K, L, cell_remat);
    *worst = 0;
    *squares = 0;
    for (int k = 0; k < S; k++) {
        if (load[k] > *worst) *worst = load[k];
        *squares += load[k] * load[k];
    }
}

/* With V cells per stage the min-max cells need not make balanced stages (a V puts the first
 * and the last cell, often light ones, on stage 0): boundaries then move one layer at a time
 * while the slowest stage gets faster (or, as fast, the stages more even), every cell still
 * within the limit. A local search, deterministic, not an exact optimum over the stages. */
static gp_status balance_stages(const gp_partition_req *req, gp_schedule_kind schedule, int V,
                                int *first, gp_remat *cell_remat) {
    const int K = req->stages, L = req->nlayers, S = K / V;
    gp_schedule place = {0};
    GP_TRY(gp_schedule_init_chunks(&place, S, 1, V,
                                   schedule == GP_SCHEDULE_ZBV ? GP_PLACE_V_SHAPE : GP_PLACE_LOOP));
    int *stage_of = malloc((size_t)K * sizeof *stage_of);
    double *load = malloc((size_t)S * sizeof *load);
    gp_status st = stage_of && load ? GP_OK
                                    : gp_error(GP_OUT_OF_MEMORY, "partition: %d cells", K);
    for (int c = 0; st == GP_OK && c < K; c++) {
        int v;
        gp_schedule_place(&place, c, &stage_of[c], &v);
    }
    gp_schedule_free(&place);
    double worst = 0, squares = 0;
    if (st == GP_OK)
        stage_load(req->layers, first, K, L, S, stage_of, cell_remat, load, &worst, &squares);
    for (int round = 0, moved = 1; st == GP_OK && moved && round < 4 * L; round++) {
        moved = 0;
        for (int b = 1; b < K && !moved; b++)
            for (int d = -1; d <= 1 && !moved; d += 2) {
                const int was = first[b], now = was + d;
                if (now <= first[b - 1] || now >= (b + 1 < K ? first[b + 1] : L)) continue;
                first[b] = now;
                double w, q;
                /* the limit and each cell's mode (selective) for the moved boundary */
                if (gp_partition_check(req, first, K) == GP_OK) {
                    stage_load(req->layers, first, K, L, S, stage_of, cell_remat, load, &w, &q);
                    if (w < worst * (1 - 1e-12) || (w <= worst && q < squares * (1 - 1e-12))) {
                        worst = w, squares = q, moved = 1;
                        continue;
                    }
                }
                first[b] = was;
            }
    }
    /* each cell's mode for the boundaries kept */
    if (st == GP_OK) st = gp_partition_check(req, first, K);
    free(stage_of);
    free(load);
    return st;
}

/* The cells' starts for req: po's partition checked, or balanced (then the stages evened). */
static gp_status choose_first(const gp_partition_req *req, const gp_pipeline_opts *po, int K,
                              int V, int *first) {
    if (po->partition) {
        memcpy(first, po->partition, (size_t)K * sizeof *first);
        return gp_partition_check(req, first, K);
    }
    GP_TRY(gp_partition_balance(req, first, NULL));
    return V > 1 ? balance_stages(req, po->schedule, V, first, req->cell_remat) : GP_OK;
}

/* Whether every stage's cells fit po's limit together (gp_cells_memory's shares). */
static gp_status stages_fit(const gp_layer_est *est, int L, const int *first,
                            const gp_remat *cell_remat, int K, int M, const gp_pipeline_opts *po,
                            int V, uint64_t *fullest) {
    gp_remat *modes = malloc((size_t)K * sizeof *modes);
    gp_cell_mem *mem = malloc((size_t)K * sizeof *mem);
    uint64_t *stage = malloc((size_t)K * sizeof *stage);
    gp_status s = modes && mem && stage ? GP_OK
                                        : gp_error(GP_OUT_OF_MEMORY, "cells: %d cells", K);
    /* each cell's mode as gp_cells_choose leaves it: a split backward's CELL or NONE as asked
     * (SELECTIVE: NONE), else SELECTIVE's own per cell */
    const bool split = gp_schedule_kind_splits(po->schedule);
    for (int c = 0; s == GP_OK && c < K; c++)
        modes[c] = split ? (po->remat == GP_REMAT_CELL ? GP_REMAT_CELL : GP_REMAT_NONE)
                   : po->remat == GP_REMAT_SELECTIVE ? cell_remat[c]
                                                     : po->remat;
    if (s == GP_OK) s = gp_cells_memory(est, L, first, modes, K, M, po->schedule, V, mem, stage);
    for (int k = 0; s == GP_OK && k < K / V; k++)
        if (stage[k] > *fullest) *fullest = stage[k];
    for (int k = 0; s == GP_OK && k < K / V; k++)
        if (stage[k] > po->memory_limit)
            s = gp_error(GP_MEMORY_LIMIT, "stage %d's %d cells need %llu bytes together", k, V,
                         (unsigned long long)stage[k]);
    free(modes);
    free(mem);
    free(stage);
    return s;
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
            if (po->layer_times_split && gp_schedule_kind_splits(po->schedule)) {
                /* a split backward as measured: both parts, the split's own cost included */
                const double bi = po->layer_times[2 * L + i], w = po->layer_times[3 * L + i];
                if (!(bi >= 0) || !(w >= 0))
                    return gp_error(GP_INVALID_ARGUMENT,
                                    "measured split backward of layer %d (%s): input part %g s, "
                                    "weight part %g s; expected finite values >= 0",
                                    i, est[i].kind ? est[i].kind : "?", bi, w);
                est[i].bwd_time = bi + w;
                est[i].wgt_time = w;
            }
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
         * No cell holds more than its stage, nor more than M: each cell alone is bounded so,
         * then its stage's cells are checked together (below). */
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
    gp_status s = GP_OK;
    bool chosen = false;
    uint64_t together = 0; /* the fullest stage's cells balanced within the whole limit */
    if (V > 1 && po->memory_limit) {
        /* First each cell within the whole limit, then the stages checked exactly: each one's
         * cells' shares of its simulated peak together. Where that fails, each cell within a
         * V-th of it (below), which needs no check. */
        gp_partition_req whole = req;
        whole.mem_limit = po->memory_limit;
        s = choose_first(&whole, po, K, V, first);
        if (s == GP_OK) s = stages_fit(est, L, first, cell_remat, K, M, po, V, &together);
        chosen = s == GP_OK;
    }
    if (!chosen) s = choose_first(&req, po, K, V, first);
    for (int k = 0; split && cell_remat && s == GP_OK && k < K; k++)
        cell_remat[k] = po->remat == GP_REMAT_CELL ? GP_REMAT_CELL : GP_REMAT_NONE;
    if (s != GP_OK && V > 1 && together)
        gp_error_context(s,
                         "schedule %s: each of a stage's %d cells planned with 1/%d of the "
                         "device's limit and %d of the M = %d micro-batches in flight (balanced "
                         "within the whole limit, a stage's cells needed %llu bytes together)",
                         gp_schedule_kind_name(po->schedule), V, V, in_flight, M,
                         (unsigned long long)together);
    else if (s != GP_OK && V > 1)
        gp_error_context(s,
                         "schedule %s: each of a stage's %d cells planned with 1/%d of the "
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
