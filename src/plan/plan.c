/* The public planning entry point: checks the pipeline options against the model and the batch,
 * partitions the layers (or checks the given partition) with the shared memory model, and runs
 * the schedule simulator to predict per-cell busy/idle time, peak bytes, the step time and the
 * bubble. On a mesh (T tensor-parallel shards, D replicas) every figure is one device's: a
 * shard's layers (the shard model's costs and bytes) on its replica's slice of the batch, with
 * the bytes each device gives to each mesh axis, and their time at a link bandwidth. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "comm/transport.h"
#include "model/shard.h"
#include "optim/optim.h"
#include "plan/cells.h"
#include "plan/options.h"
#include "plan/partition.h"
#include "plan/schedule.h"
#include "plan/simulate.h"

/* A stage's device holds its V cells together. */
uint64_t gp_plan_fullest_bytes(const gp_plan *p) {
    uint64_t b = 0;
    for (int k = 0; p && k < p->stages; k++) {
        uint64_t dev = 0;
        for (int c = 0; c < p->ncells; c++)
            if (p->cells[c].stage == k) dev += p->cells[c].total_bytes;
        if (dev > b) b = dev;
    }
    return b;
}

void gp_plan_free(gp_plan *p) {
    if (!p) return;
    free(p->cells);
    memset(p, 0, sizeof *p);
}


/* The options (gp_pipeline_opts_check) and gp_plan_make's own arguments; the sizes read. */
static gp_status check_opts(const gp_model *m, int64_t batch, const gp_optim_opts *o,
                            const gp_pipeline_opts *po, double gflops, gp_pipeline_sizes *z) {
    if (!m || !po)
        return gp_error(GP_INVALID_ARGUMENT, "gp_plan_make: NULL model or pipeline options");
    if (batch < 1)
        return gp_error(GP_INVALID_ARGUMENT, "batch %lld: expected at least 1 example",
                        (long long)batch);
    GP_TRY(gp_pipeline_opts_check(m, batch, po, NULL));
    if (o && o->kind != GP_OPTIM_SGD && o->kind != GP_OPTIM_ADAMW)
        return gp_error(GP_INVALID_ARGUMENT, "unknown optimizer kind %d", (int)o->kind);
    if (po->balance != GP_BALANCE_TIME && (!isfinite(gflops) || gflops <= 0))
        return gp_error(GP_INVALID_ARGUMENT, "%g GFLOP/s; expected a finite rate > 0",
                        gflops);
    *z = gp_pipeline_opts_sizes(po);
    return GP_OK;
}

/* Seconds a ring all-reduce of n bytes over T devices takes at bw bytes/s: 2 (T - 1) / T of
 * the buffer crosses each link each way. 0 without a bandwidth. */
static double allreduce_s(double n, int T, double bw) {
    return bw > 0 && T > 1 ? 2.0 * (T - 1) / T * n / bw : 0.0;
}

/* Each cell's bytes per step on each mesh axis (one device's: cells[k].grad_bytes set), and the
 * tensor axis's all-reduces added to its simulated forward and backward (sc, seconds). */
static void mesh_bytes(const gp_layer_est *est, int L, const int *first, int K, int M,
                       const gp_pipeline_opts *po, const gp_remat *cell_remat, bool vocab_split,
                       int64_t rows, gp_sim_cell *sc, gp_plan *out) {
    const int T = out->tensor_parallel, D = out->data_parallel;
    const double bw = po->link_gbytes_per_s * 1e9;
    for (int k = 0; k < K; k++) {
        gp_plan_cell *c = &out->cells[k];
        const int e = k + 1 < K ? first[k + 1] : L;
        uint64_t fwd = 0, bwd = 0;
        for (int i = first[k]; i < e; i++) fwd += est[i].tp_fwd_bytes, bwd += est[i].tp_bwd_bytes;
        /* The split cross-entropy: the row maximum, then the sums, 3 floats a row (4 with
         * label smoothing: the row's sum of logits too). */
        const uint64_t per_row = po->label_smoothing > 0 ? 4 : 3;
        if (k == K - 1 && vocab_split) bwd += per_row * (uint64_t)rows * sizeof(float);
        const uint64_t recompute = cell_remat[k] == GP_REMAT_CELL ? fwd : 0;
        c->tensor_bytes = T > 1 ? (uint64_t)M * (fwd + recompute + bwd) : 0;
        c->pipe_bytes = 0;
        const uint64_t hdr = GP_MSG_HEADER_BYTES;
        if (k < K - 1) c->pipe_bytes += (uint64_t)M * (gp_cut_out_bytes(est, e) + hdr);
        if (k > 0) c->pipe_bytes += (uint64_t)M * (gp_cut_bytes(est, first[k]) + hdr);
        c->data_bytes = D > 1 ? c->grad_bytes : 0;
        sc[k].fwd_time += allreduce_s((double)fwd, T, bw);
        sc[k].bwd_time += allreduce_s((double)bwd, T, bw);
    }
}

/* Boundaries into cells, simulation into the plan. est: L layers, times in units of
 * sec_per_unit seconds (FLOPs, or measured seconds); flops: the same layers' FLOP figures;
 * first: K cell starts. */
static gp_status simulate_into(const gp_layer_est *est, const gp_layer_est *flops, int L,
                               const int *first, const gp_remat *cell_remat, int K, int M,
                               const gp_pipeline_opts *po, double sec_per_unit, bool vocab_split,
                               int64_t rows, gp_plan *out) {
    /* K: cells; the schedule's stages run V each */
    gp_sim_cell *sc = calloc((size_t)K, sizeof *sc);
    gp_sim_stage *st = calloc((size_t)out->stages, sizeof *st);
    gp_cell_mem *mem = calloc((size_t)K, sizeof *mem);
    gp_schedule s = {0};
    gp_status status = GP_OK;
    if (!sc || !st || !mem) {
        status = gp_error(GP_OUT_OF_MEMORY, "gp_plan_make: no memory for %d cells", K);
        goto done;
    }
    double worst_comm = 0; /* the tensor axis's time per step on the stage where it is most */
    const bool split = gp_schedule_kind_splits(po->schedule);
    for (int k = 0; k < K; k++) {
        int e = k + 1 < K ? first[k + 1] : L;
        sc[k] = gp_sim_cell_from_layers(est, first[k], e);
        sc[k].fwd_time = sc[k].fwd_time * sec_per_unit + po->action_s;
        /* a split backward is two actions, its weight part one of them */
        sc[k].bwd_time = sc[k].bwd_time * sec_per_unit + po->action_s * (split ? 2 : 1);
        sc[k].wgt_time = sc[k].wgt_time * sec_per_unit + (split ? po->action_s : 0);
        out->cells[k].grad_bytes = gp_cell_memory(est, first[k], e, L, 1, cell_remat[k]).grads;
        out->cells[k].time_s = sc[k].fwd_time + sc[k].bwd_time; /* compute alone, for now */
        /* each shard updates its own trainable elements after its stage's last backward */
        sc[k].opt_time = po->optim_s_per_param *
                         (double)(out->cells[k].grad_bytes / gp_dtype_nbytes(GP_F32));
        out->cells[k].opt_s = sc[k].opt_time;
    }
    mesh_bytes(est, L, first, K, M, po, cell_remat, vocab_split, rows, sc, out);
    for (int k = 0; k < K; k++)
        worst_comm = fmax(worst_comm, M * (sc[k].fwd_time + sc[k].bwd_time - out->cells[k].time_s));
    status = gp_schedule_generate(po->schedule, out->stages, M, out->chunks, &s);
    if (status != GP_OK) goto done;
    /* the mailboxes of the runtime's transports */
    gp_sim_opts so = {.capacity = GP_MAILBOX_CAPACITY, .cell_remat = cell_remat};
    gp_sim_result res;
    status = gp_schedule_simulate(&s, sc, &so, st, &res);
    if (status != GP_OK) goto done;
    /* The replicas' gradient all-reduce after the last backward (not overlapped here: an upper
     * bound of what the bucketed all-reduce costs). */
    uint64_t grads = 0;
    for (int k = 0; k < K; k++) grads = out->cells[k].grad_bytes > grads ? out->cells[k].grad_bytes : grads;
    const double data_s = allreduce_s((double)grads, out->data_parallel, po->link_gbytes_per_s * 1e9);
    /* Stage devices on fewer GPUs (one process, stage device w on GPU w mod count) share them:
     * each GPU runs its stages' work one after another. A CPU's stages share its cores through
     * the contention model instead. */
    int units = 0;
    if (po->device_type != GP_DEVICE_CPU && po->launcher != GP_LAUNCHER_MPI && !po->devices &&
        out->data_parallel * out->tensor_parallel == 1 &&
        gp_device_type_count(po->device_type, &units) != GP_OK)
        units = 0;
    out->step_s = gp_sim_shared_step(st, out->stages, units, res.step_time) + data_s;
    /* the memory columns: each cell's share of its stage's peak */
    status = gp_cells_memory_shares(est, L, first, cell_remat, po, &s, st, mem, NULL);
    if (status != GP_OK) goto done;
    out->comm_s = worst_comm + data_s;
    out->bubble_simulated = res.bubble;
    for (int k = 0; k < K; k++) {
        int e = k + 1 < K ? first[k + 1] : L;
        gp_plan_cell *c = &out->cells[k];
        c->first = first[k];
        c->last = e - 1;
        c->remat = cell_remat[k];
        for (int i = first[k]; i < e; i++) {
            c->fwd_flops += flops[i].fwd_time;
            c->bwd_flops += flops[i].bwd_time;
        }
        c->time_s = sc[k].fwd_time + sc[k].bwd_time;
        gp_schedule_place(&s, k, &c->stage, &c->chunk);
        const gp_sim_stage *sk = &st[c->stage];
        const gp_cell_mem *cm = &mem[k];
        c->param_bytes = cm->params;
        c->grad_bytes = cm->grads;
        c->optim_bytes = cm->optim;
        c->nparams = (int64_t)((cm->grads - cm->grad_bufs) / gp_dtype_nbytes(GP_F32));
        c->peak_act_bytes = cm->stash;
        c->transient_bytes = cm->transient + cm->messages;
        c->total_bytes = cm->total;
        c->peak_in_flight = sk->peak_in_flight;
        c->busy_s = sk->busy;
        c->idle_s = sk->idle;
        /* gp_cells_choose checked these very figures (stages_fit: the same cells, modes and
         * schedule, whose memory does not depend on the times) against the limit. */
        GP_ASSERT(!po->memory_limit || c->total_bytes <= po->memory_limit);
    }
done:
    gp_schedule_free(&s);
    free(sc);
    free(st);
    free(mem);
    return status;
}

gp_status gp_plan_make(const gp_model *m, int64_t batch, const gp_optim_opts *o,
                       const gp_pipeline_opts *po, double gflops, gp_plan *out) {
    if (!out) return gp_error(GP_INVALID_ARGUMENT, "gp_plan_make: NULL output");
    memset(out, 0, sizeof *out);
    gp_pipeline_sizes z;
    GP_TRY(check_opts(m, batch, o, po, gflops, &z));
    const int stages = z.stages, M = z.micro_batches, T = z.tensor_parallel;
    const int D = z.data_parallel, V = z.chunks;
    const int K = stages * V; /* cells */
    int L = gp_model_nlayers(m);
    /* On a mesh a device holds and computes one shard: plan the shard model. */
    gp_model *shard = NULL;
    if (T > 1) GP_TRY(gp_model_shard_new(m, T, &shard));
    const gp_model *pm = shard ? shard : m;
    const int64_t mb = batch / ((int64_t)D * M); /* one replica's micro-batch */
    gp_shape out_shape;
    gp_status so = gp_model_shape(pm, L - 1, mb, &out_shape);
    if (so != GP_OK) {
        gp_model_free(shard);
        return so;
    }
    const int64_t rows = gp_shape_nelem(&out_shape) / out_shape.dim[out_shape.ndim - 1];
    const bool vocab_split = T > 1 && gp_model_output_split(m);
    const bool measured = po->balance == GP_BALANCE_TIME;
    gp_layer_est *est = calloc((size_t)L, sizeof *est);
    gp_layer_est *flops = measured ? calloc((size_t)L, sizeof *flops) : est;
    int *first = calloc((size_t)K, sizeof *first);
    gp_remat *cell_remat = calloc((size_t)K, sizeof *cell_remat);
    out->cells = calloc((size_t)K, sizeof *out->cells);
    gp_status status = GP_OK;
    if (!est || !flops || !first || !cell_remat || !out->cells) {
        status = gp_error(GP_OUT_OF_MEMORY, "gp_plan_make: no memory for %d layers and %d cells",
                          L, K);
        goto done;
    }
    status = gp_cells_choose(pm, mb, gp_optim_state_count(o), po, K, M, est, first, cell_remat);
    if (status == GP_OK && measured)
        status = gp_layer_est_from_model(pm, mb, gp_optim_state_count(o), NULL, flops);
    if (status != GP_OK) goto done;
    out->stages = stages;
    out->chunks = V;
    out->ncells = K;
    out->micro_batches = M;
    out->tensor_parallel = T;
    out->data_parallel = D;
    out->batch = batch;
    out->micro_batch_size = mb;
    out->schedule = po->schedule;
    out->remat = po->remat;
    out->memory_limit = po->memory_limit;
    out->gflops_assumed = measured ? 0 : gflops;
    out->balance = po->balance;
    out->bubble_theory = (double)(stages - 1) / (double)(V * M + stages - 1);
    status = simulate_into(est, flops, L, first, cell_remat, K, M, po,
                           measured ? 1.0 : 1.0 / (gflops * 1e9), vocab_split, rows, out);
done:
    gp_model_free(shard);
    if (flops != est) free(flops);
    free(est);
    free(first);
    free(cell_remat);
    if (status != GP_OK) gp_plan_free(out);
    return status;
}
