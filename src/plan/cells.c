/* The cells of a pipeline: one routine that turns the pipeline options into K contiguous cells,
 * shared by the planner and the runtime so that `gpipe plan` shows exactly the cells a training
 * run gets (same per-layer figures, same micro-batch size, same memory model, and one memory
 * check for every schedule: each stage's simulated peak, the figure the plan reports). */
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "plan/cells.h"
#include "plan/grad_bufs.h"

const char *gp_balance_name(gp_balance b) {
    return b == GP_BALANCE_COST ? "cost" : b == GP_BALANCE_TIME ? "time" : "?";
}

/* A point is at or above another in all four counts. */
static bool covers(const gp_stash_point *a, const gp_stash_point *b) {
    return a->fwd >= b->fwd && a->wgt >= b->wgt && a->bwd >= b->bwd && a->keep >= b->keep;
}

/* Adds q to p unless a point covers it, dropping the points it covers. */
static gp_status profile_add(gp_stash_profile *p, gp_stash_point q) {
    for (int i = 0; i < p->n; i++)
        if (covers(&p->pt[i], &q)) return GP_OK;
    int n = 0;
    for (int i = 0; i < p->n; i++)
        if (!covers(&q, &p->pt[i])) p->pt[n++] = p->pt[i];
    p->n = n;
    if (p->n == p->cap) {
        const int cap = p->cap ? 2 * p->cap : 8;
        gp_stash_point *pt = realloc(p->pt, (size_t)cap * sizeof *pt);
        if (!pt) return gp_error(GP_OUT_OF_MEMORY, "stash profile: %d points", cap);
        p->pt = pt;
        p->cap = cap;
    }
    p->pt[p->n++] = q;
    return GP_OK;
}

gp_status gp_stash_profiles(const gp_schedule *s, gp_stash_profile *out) {
    const int V = s->chunks > 1 ? s->chunks : 1;
    gp_status st = GP_OK;
    for (int k = 0; st == GP_OK && k < s->stages; k++) {
        /* the replay's stash of each chunk: forwarded, and waiting for the weight part */
        int f[GP_SCHEDULE_MAX_CHUNKS] = {0}, w[GP_SCHEDULE_MAX_CHUNKS] = {0};
        for (int v = 0; st == GP_OK && v < V; v++)
            st = profile_add(&out[gp_schedule_cell(s, k, v)], (gp_stash_point){0});
        for (int i = 0; st == GP_OK && i < s->stage[k].n; i++) {
            const gp_action *a = &s->stage[k].a[i];
            const int v = a->chunk;
            gp_stash_profile *p = &out[gp_schedule_cell(s, k, v)];
            switch (a->kind) {
            case GP_ACT_FORWARD: f[v]++; break;
            case GP_ACT_BACKWARD:
                st = profile_add(p, (gp_stash_point){f[v], w[v], 1, w[v]});
                f[v]--;
                break;
            case GP_ACT_BACKWARD_INPUT:
                /* its keep_bytes on top, then held with the input to the weight part */
                st = profile_add(p, (gp_stash_point){f[v], w[v], 1, w[v] + 1});
                f[v]--, w[v]++;
                break;
            case GP_ACT_BACKWARD_WEIGHT: w[v]--; break;
            default: continue;
            }
            if (st == GP_OK) st = profile_add(p, (gp_stash_point){f[v], w[v], 0, w[v]});
        }
    }
    return st;
}

void gp_stash_profiles_free(gp_stash_profile *p, int n) {
    for (int i = 0; p && i < n; i++) {
        free(p[i].pt);
        p[i] = (gp_stash_profile){0};
    }
}

/* a + b, or UINT64_MAX where it would wrap (the memory model's sums saturate) */
static uint64_t sat_sum(uint64_t a, uint64_t b) { return a > UINT64_MAX - b ? UINT64_MAX : a + b; }

gp_status gp_cells_memory_shares(const gp_layer_est *est, int L, const int *first,
                                 const gp_remat *cell_remat, const gp_pipeline_opts *po,
                                 const gp_schedule *s, const gp_sim_stage *st, gp_cell_mem *out,
                                 uint64_t *stage_total) {
    const int S = s->stages, V = s->chunks, ncells = S * V;
    /* the static bytes (with the gradient sums' buffers), transient and messages; the
     * activations are the simulation's */
    const bool split = gp_schedule_kind_splits(po->schedule);
    gp_stash_profile *bufs = calloc((size_t)ncells, sizeof *bufs);
    if (!bufs) return gp_error(GP_OUT_OF_MEMORY, "cell memory: %d cells", ncells);
    gp_status status = gp_grad_bufs(s, po, bufs);
    for (int c = 0; status == GP_OK && c < ncells; c++) {
        const int e = c + 1 < ncells ? first[c + 1] : L;
        out[c] = gp_cell_memory_at(est, first[c], e, L, &bufs[c], cell_remat[c], split);
    }
    free(bufs);
    GP_TRY(status);
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
    return GP_OK;
}

gp_status gp_cells_memory(const gp_layer_est *est, int L, const int *first,
                          const gp_remat *cell_remat, int ncells, int M,
                          const gp_pipeline_opts *po, int V, gp_cell_mem *out,
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
    if (status == GP_OK) status = gp_schedule_generate(po->schedule, S, M, V, &s);
    for (int c = 0; status == GP_OK && c < ncells; c++)
        sc[c] = gp_sim_cell_from_layers(est, first[c], c + 1 < ncells ? first[c + 1] : L);
    gp_sim_opts so = {.capacity = GP_MAILBOX_CAPACITY, .cell_remat = cell_remat};
    gp_sim_result res;
    if (status == GP_OK) status = gp_schedule_simulate(&s, sc, &so, st, &res);
    if (status == GP_OK)
        status = gp_cells_memory_shares(est, L, first, cell_remat, po, &s, st, out, stage_total);
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

/* The one memory check of every schedule: each stage's cells (modes cell_remat) within po's
 * limit together, at their stage's simulated peak (gp_cells_memory, the figures the plan shows).
 * *fullest: the fullest stage's bytes. */
static gp_status stages_fit(const gp_layer_est *est, int L, const int *first,
                            const gp_remat *cell_remat, int K, int M, const gp_pipeline_opts *po,
                            int V, uint64_t *fullest) {
    gp_cell_mem *mem = malloc((size_t)K * sizeof *mem);
    uint64_t *stage = malloc((size_t)K * sizeof *stage);
    gp_status s = mem && stage ? GP_OK : gp_error(GP_OUT_OF_MEMORY, "cells: %d cells", K);
    if (s == GP_OK)
        s = gp_cells_memory(est, L, first, cell_remat, K, M, po, V, mem, stage);
    int worst = 0;
    for (int k = 0; s == GP_OK && k < K / V; k++)
        if (stage[k] > stage[worst]) worst = k;
    if (s == GP_OK) *fullest = stage[worst];
    if (s == GP_OK && stage[worst] > po->memory_limit) {
        char need[48], lim[48], over[48];
        s = gp_error(GP_MEMORY_LIMIT,
                     "stage %d's %d cell%s need %s together at the stage's simulated peak, over "
                     "the %s per-device limit by %s",
                     worst, V, V == 1 ? "" : "s", gp_plan_bytes_str(stage[worst], need, sizeof need),
                     gp_plan_bytes_str(po->memory_limit, lim, sizeof lim),
                     gp_plan_bytes_str(stage[worst] - po->memory_limit, over, sizeof over));
    }
    free(mem);
    free(stage);
    return s;
}

/* SELECTIVE's modes for the cells first: CELL everywhere, then, cell after cell, NONE wherever
 * its stage still fits so. */
static gp_status selective_modes(const gp_layer_est *est, int L, const int *first,
                                 gp_remat *cell_remat, int K, int M, const gp_pipeline_opts *po,
                                 int V, uint64_t *fullest) {
    for (int c = 0; c < K; c++) cell_remat[c] = GP_REMAT_CELL;
    GP_TRY(stages_fit(est, L, first, cell_remat, K, M, po, V, fullest));
    for (int c = 0; c < K; c++) {
        cell_remat[c] = GP_REMAT_NONE;
        uint64_t b;
        if (stages_fit(est, L, first, cell_remat, K, M, po, V, &b) == GP_OK)
            *fullest = b;
        else
            cell_remat[c] = GP_REMAT_CELL;
    }
    return GP_OK;
}

/* The cells of req within po's limit, checked by stages_fit for every schedule. With one cell
 * per stage the partitioner's own check is that exactly (each cell on its schedule's profile),
 * so its cells are the answer. With V per stage it checks cells alone, and the stages are checked
 * after it, trying in turn: the cells balanced without a limit (the fastest, so the answer
 * whenever they fit), within the whole limit each, and within a V-th of it each (which fits
 * whenever it partitions: the cells' largest points add up to at least their stage's peak; a
 * limit under V bytes has no V-th); SELECTIVE where its own modes fail takes its cells' CELL and
 * NONE by selective_modes, and then tries CELL's cells the same way, so that it never fits less
 * than CELL. The error kept is that of the most constrained try (*together: the fullest stage of
 * the whole limit's cells, 0 if they were not made; *share: whether that try was a V-th's). */
static gp_status choose_within(const gp_partition_req *base, const gp_pipeline_opts *po, int M,
                               int V, int *first, uint64_t *together, bool *share) {
    const gp_layer_est *est = base->layers;
    const int L = base->nlayers, K = base->stages;
    const uint64_t limit = po->memory_limit;
    gp_partition_req req = *base;
    uint64_t fullest = 0;
    *together = 0;
    *share = false;
    if (V == 1 || !limit) {
        GP_TRY(choose_first(&req, po, K, V, first));
        return limit ? stages_fit(est, L, first, req.cell_remat, K, M, po, V, &fullest) : GP_OK;
    }
    const uint64_t tries[3] = {0, limit, limit / V};
    const int ntries = po->partition ? 1 : limit / V ? 3 : 2;
    const bool sel = po->remat == GP_REMAT_SELECTIVE;
    gp_status kept = GP_OK;
    char why[2048] = "";
    for (int mode = 0; mode < (sel ? 2 : 1); mode++)
        for (int t = 0; t < ntries; t++) {
            req.remat = mode ? GP_REMAT_CELL : po->remat;
            req.mem_limit = tries[t];
            gp_status s = choose_first(&req, po, K, V, first);
            const bool parted = s == GP_OK;
            if (parted && !mode) {
                s = stages_fit(est, L, first, req.cell_remat, K, M, po, V, &fullest);
                if (t == 1) *together = fullest;
            }
            if (parted && sel && (mode || s == GP_MEMORY_LIMIT))
                s = selective_modes(est, L, first, req.cell_remat, K, M, po, V, &fullest);
            if (s == GP_OK) return GP_OK;
            if (s != GP_MEMORY_LIMIT) return s;
            if (mode == 0 && t == ntries - 1) {
                kept = s;
                *share = t == 2;
                snprintf(why, sizeof why, "%s", gp_last_error());
            }
        }
    return gp_error(kept, "%s", why);
}

gp_status gp_cells_choose(const gp_model *m, int64_t micro_batch_size, int optim_states,
                          const gp_pipeline_opts *po, int K, int M, gp_layer_est *est,
                          int *first, gp_remat *cell_remat) {
    const int L = gp_model_nlayers(m);
    /* The kernels' workspace sizes are those of a stage's device: a scratch one of its kind
     * (a GPU's kernels size theirs differently from the CPU's). */
    gp_device *dev = NULL;
    GP_TRY(gp_device_type_new(po->device_type, "plan", 0,
                              po->stage_threads > 0 ? po->stage_threads : 1, &dev));
    /* in the run's precision: a bf16 GPU keeps less for attention (attention_saved) */
    gp_status se = gp_device_set_precision(dev, po->precision);
    if (se == GP_OK) se = gp_layer_est_from_model(m, micro_batch_size, optim_states, dev, est);
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
    /* each cell's points of its stage's order of actions: what the memory model counts */
    const int S = K / V;
    gp_schedule sched = {0};
    gp_stash_profile *prof = calloc((size_t)K, sizeof *prof);
    gp_status s = prof ? GP_OK : gp_error(GP_OUT_OF_MEMORY, "cells: %d profiles", K);
    if (s == GP_OK)
        s = gp_schedule_generate(po->schedule, S, M, V, &sched);
    if (s == GP_OK) s = gp_stash_profiles(&sched, prof);
    if (s == GP_OK) s = gp_grad_bufs(&sched, po, prof);
    gp_schedule_free(&sched);
    const gp_partition_req req = {.layers = est,
                                  .nlayers = L,
                                  .stages = K,
                                  .micro_batches = M,
                                  .profile = prof,
                                  .split = gp_schedule_kind_splits(po->schedule),
                                  .remat = po->remat,
                                  .mem_limit = po->memory_limit,
                                  .cell_remat = cell_remat};
    uint64_t together = 0; /* the fullest stage's cells balanced within the whole limit */
    bool share = false;
    if (s == GP_OK) s = choose_within(&req, po, M, V, first, &together, &share);
    gp_stash_profiles_free(prof, K);
    free(prof);
    if (s != GP_OK && share && together)
        gp_error_context(s,
                         "schedule %s: each of a stage's %d cells planned with 1/%d of the "
                         "device's limit (balanced within the whole limit, a stage's cells needed "
                         "%llu bytes together)",
                         gp_schedule_kind_name(po->schedule), V, V, (unsigned long long)together);
    else if (s != GP_OK && share)
        gp_error_context(s, "schedule %s: each of a stage's %d cells planned with 1/%d of the "
                            "device's limit",
                         gp_schedule_kind_name(po->schedule), V, V);
    else if (s != GP_OK && V > 1)
        gp_error_context(s, "schedule %s: a stage's %d cells planned together",
                         gp_schedule_kind_name(po->schedule), V);
    else if (s != GP_OK && po->schedule == GP_SCHEDULE_1F1B)
        gp_error_context(s,
                         "schedule 1f1b: stage k keeps at most min(K - k, M) of the M = %d "
                         "micro-batches in flight",
                         M);
    else if (s != GP_OK && po->schedule == GP_SCHEDULE_ZBH1)
        gp_error_context(s,
                         "schedule zbh1: stage k keeps at most min(K - k, M) of the M = %d "
                         "micro-batches between forward and input backward, and as many waiting "
                         "for their weight parts",
                         M);
    if (s != GP_OK)
        gp_error_context(s, "micro-batches of %lld example%s", (long long)micro_batch_size,
                         micro_batch_size == 1 ? "" : "s");
    return s;
}
