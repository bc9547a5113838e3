/* The pipeline: its set-up (the launcher, the cells, the schedule, each stage's device and flat
 * parameter store), the public accessors, and the checks a step and an evaluation make before
 * the launcher runs them. K = 1 is single-device training: the same object, run inline. */
#include <stdlib.h>
#include <string.h>

#include "kernels/devices.h"
#include "optim/optim.h"
#include "pipeline/checkpoint_writer.h"
#include "plan/cells.h"
#include "plan/options.h"
#include "plan/validate.h"
#include "pipeline/eval_overlap.h"
#include "pipeline/grad_tree.h"
#include "pipeline/launch_local.h"
#include "pipeline/launch_mpi.h"
#include "pipeline/mesh.h"
#include "pipeline/pipeline_hooks.h"

gp_gpu_comm gp_pipeline_gpu_comm(const gp_pipeline *p, const char **why) {
    if (why) *why = p ? p->gpu_comm_why : "";
    return p && p->gpu_comm == GP_GPU_COMM_NCCL ? GP_GPU_COMM_NCCL : GP_GPU_COMM_MPI;
}

const char *gp_launcher_name(gp_launcher l) {
    return l == GP_LAUNCHER_THREADS ? "threads" : l == GP_LAUNCHER_MPI ? "mpi" : "?";
}

/* The first layer of each cell, as gp_plan_make would choose them for the same options: the
 * given partition (checked) or the exact balance of the layers' cost estimates or measured
 * times, at the micro-batch size of po->batch (one example when it is not given: every layer's
 * cost grows with the batch alike) and within the per-device memory limit. */
static gp_status choose_partition(gp_pipeline *p, const gp_pipeline_opts *po) {
    const int L = p->m->nlayers;
    /* With T shards, a cell's figures are one shard's: its device holds and computes that. */
    const gp_model *est_model = p->T > 1 ? p->shard[0] : p->m;
    /* po->batch is the global mini-batch: each of the D replicas takes 1/D of it. */
    const int64_t b = po->batch > 0 ? po->batch / ((int64_t)p->D * p->M) : 1;
    gp_layer_est *est = calloc((size_t)L, sizeof *est);
    double *times = NULL;
    gp_pipeline_opts o = *po;
    gp_status s = GP_OK;
    if (!est) s = gp_error(GP_OUT_OF_MEMORY, "cannot allocate %d layer estimates", L);
    if (s == GP_OK && o.balance == GP_BALANCE_TIME && !o.layer_times) {
        /* a split backward is timed as it will run */
        const bool split = gp_schedule_kind_splits(o.schedule);
        times = calloc(4 * (size_t)L, sizeof *times);
        s = !times  ? gp_error(GP_OUT_OF_MEMORY, "cannot allocate %d layer times", 4 * L)
            : split ? gp_model_profile_layers_split(p->m, b, 0, times)
                    : gp_model_profile_layers(p->m, b, 0, times);
        o.layer_times = times;
        o.layer_times_split = split;
    }
    if (s == GP_OK)
        s = gp_cells_choose(est_model, b, gp_optim_state_count(&p->o), &o, p->K, p->M, est,
                            p->first, p->cell_remat);
    free(times);
    free(est);
    return s;
}

/* The options (gp_pipeline_opts_check, against the model and po->batch), and what only a run
 * needs besides: replicas are processes. */
static gp_status check_opts(const gp_model *m, const gp_pipeline_opts *po, gp_pipeline_sizes *z) {
    const gp_status s = gp_pipeline_opts_check(m, po->batch, po, NULL);
    if (s != GP_OK) return gp_error_context(s, "pipeline");
    *z = gp_pipeline_opts_sizes(po);
    if (z->data_parallel > 1 && po->launcher != GP_LAUNCHER_MPI)
        return gp_error(GP_INVALID_ARGUMENT,
                        "pipeline: data_parallel %d: needs the MPI launcher (one process per "
                        "replica and stage)",
                        z->data_parallel);
    return GP_OK;
}

/* Every layer initialized (*all), none, or a named error for a model in between. */
static gp_status model_state(const gp_model *m, bool *all) {
    int n = 0, missing = -1;
    for (int li = 0; li < m->nlayers; li++) {
        if (m->store_of[li])
            n++;
        else if (missing < 0)
            missing = li;
    }
    *all = n == m->nlayers;
    if (n == 0 || *all) return GP_OK;
    return gp_error(GP_INVALID_ARGUMENT,
                    "gp_pipeline_new: the model is partly initialized (layer %d, %s, holds no "
                    "values): initialize all of it, or none (the pipeline then initializes it)",
                    missing, m->layers[missing]->ops->kind);
}

/* The one store holding exactly layers [first, last) on dev, or NULL. */
static gp_store *exact_store(const gp_model *m, int first, int last, const gp_device *dev) {
    gp_store *s = m->store_of[first];
    if (!s || s->first != first || s->last != last || s->nlive != last - first || s->dev != dev)
        return NULL;
    return s;
}

static gp_status stage_device(gp_pipeline *p, gp_stage *s, const gp_pipeline_opts *po,
                              bool initialized) {
    if (po->devices) {
        if (!po->devices[s->w])
            return gp_error(GP_INVALID_ARGUMENT, "pipeline: devices[%d] is NULL", s->w);
        s->dev = po->devices[s->w];
        return GP_OK;
    }
    if (s->chunk > 0) { /* a stage's cells share its device, which its lead has made */
        s->dev = p->st[s->w].dev;
        return GP_OK;
    }
    gp_device *one = p->K == 1 && p->T == 1 && initialized
                         ? gp_model_range_device(p->m, 0, p->m->nlayers)
                         : NULL;
    if (one) { /* single-device training where the model already is */
        s->dev = one;
        return GP_OK;
    }
    char name[32];
    if (p->T > 1)
        snprintf(name, sizeof name, "stage%d.%d", s->dk, s->t);
    else
        snprintf(name, sizeof name, "stage%d", s->dk);
    /* Stage shard w on device w of the kind (mod the kind's count: GPU w mod the GPUs); under
     * MPI the rank's own device, its rank among its node's ranks (GPU local rank mod the node's
     * GPUs, which are numbered from 0 on every node), so that ranks of one node, the replicas of
     * a stage among them, do not share one. */
    GP_TRY(gp_device_type_new(po->device_type, name, p->my_stage >= 0 ? p->local_rank : s->w,
                              po->stage_threads > 0 ? po->stage_threads : 1, &s->dev));
    s->own_dev = true;
    return po->memory_limit ? gp_device_set_limit(s->dev, po->memory_limit) : GP_OK;
}

/* Stage k's device and store: its layers placed there (moved, or initialized from the seed),
 * gradients and optimizer state beside them. */
static gp_status init_stage(gp_pipeline *p, gp_stage *s, const gp_pipeline_opts *po,
                            bool initialized, uint64_t seed) {
    GP_TRY(stage_device(p, s, po, initialized));
    GP_TRY(gp_device_set_precision(s->dev, po->precision));
    GP_TRY(gp_stage_alloc_state(s, p->M));
    gp_model *m = s->m;
    if (p->T > 1) { /* the shard's values: cut from the model's, or initialized as its */
        GP_TRY(gp_store_place(m, s->first, s->last, s->dev, false, &s->store));
        GP_TRY(gp_mesh_init_values(p, s, initialized, seed));
    } else {
        s->store = initialized ? exact_store(m, s->first, s->last, s->dev) : NULL;
    }
    if (!s->store) {
        GP_TRY(gp_store_place(m, s->first, s->last, s->dev, initialized, &s->store));
        if (!initialized) GP_TRY(gp_store_init_values(m, s->store, seed));
    }
    if (p->inference) return GP_OK;
    GP_TRY(gp_store_train_begin(m, s->store, gp_optim_state_count(&p->o)));
    return p->grad_sum == GP_GRAD_SUM_TREE ? gp_grad_tree_setup(s, p->M) : GP_OK;
}

static gp_status init_stages(gp_pipeline *p, const gp_pipeline_opts *po, uint64_t seed) {
    gp_model *m = p->m;
    bool initialized;
    GP_TRY(model_state(m, &initialized));
    for (int w = 0; w < p->K * p->T; w++) {
        gp_stage *s = &p->st[w];
        const int k = w / p->T;
        s->p = p;
        s->k = k;
        s->t = w % p->T;
        gp_schedule_place(&p->sched, k, &s->dk, &s->chunk);
        s->w = s->dk * p->T + s->t;
        s->m = p->T > 1 ? p->shard[s->t] : m;
        s->first = p->first[k];
        s->last = k + 1 < p->K ? p->first[k + 1] : m->nlayers;
        s->run_here = (p->my_stage < 0 || p->my_stage == s->dk) &&
                      (p->my_shard < 0 || p->my_shard == s->t);
        if (p->T > 1) gp_mesh_group(s);
    }
    /* A process holds the stages it runs and nothing more. */
    for (int k = 0; k < p->K; k++)
        if (!gp_worker(p, k, p->my_shard < 0 ? 0 : p->my_shard)->run_here)
            gp_store_release_layers(m, p->first[k], k + 1 < p->K ? p->first[k + 1] : m->nlayers);
    for (int w = 0; w < p->K * p->T; w++) {
        gp_stage *s = &p->st[w];
        if (!s->run_here) continue;
        gp_status st = init_stage(p, s, po, initialized, seed);
        if (st != GP_OK) {
            char cell[32] = "";
            if (p->V > 1) snprintf(cell, sizeof cell, " cell %d", s->k);
            if (p->T > 1)
                return gp_error_context(st, "pipeline stage %d%s shard %d (layers %d..%d) on %s",
                                        s->dk, cell, s->t, s->first, s->last - 1,
                                        gp_device_name(s->dev));
            return gp_error_context(st, "pipeline stage %d%s (layers %d..%d) on %s", s->dk, cell,
                                    s->first, s->last - 1, gp_device_name(s->dev));
        }
    }
    /* With shards the values live in them: the model keeps its names and shapes only. */
    if (p->T > 1) gp_store_release_layers(m, 0, m->nlayers);
    if (!initialized) m->seed = seed;
    for (int t = 0; p->T > 1 && t < p->T; t++) p->shard[t]->seed = m->seed;
    return GP_OK;
}

gp_status gp_pipeline_new(gp_model *m, const gp_optim_opts *o, const gp_pipeline_opts *po,
                          uint64_t seed, gp_pipeline **out) {
    if (!m || !out) return gp_error(GP_INVALID_ARGUMENT, "gp_pipeline_new: NULL argument");
    *out = NULL;
    if (o) GP_TRY(gp_optim_check(o));
    gp_pipeline_opts dflt = {0};
    if (!po) po = &dflt;
    gp_pipeline_sizes z;
    GP_TRY(check_opts(m, po, &z));
    const int stages = z.stages, M = z.micro_batches, T = z.tensor_parallel, V = z.chunks;
    const int K = stages * V; /* cells */
    for (int li = 0; li < m->nlayers; li++)
        if (m->store_of[li] && m->store_of[li]->grads.data)
            return gp_error(GP_INVALID_ARGUMENT,
                            "gp_pipeline_new: the model already has a pipeline (layer %d has "
                            "gradients); free it first",
                            li);
    if (m->held)
        return gp_error(GP_INVALID_ARGUMENT,
                        "gp_pipeline_new: the model already has a pipeline (its values are in "
                        "that pipeline's tensor-parallel shards); free it first");
    gp_pipeline *p = calloc(1, sizeof *p);
    if (p) p->first = calloc((size_t)K, sizeof *p->first);
    if (p) p->cell_remat = calloc((size_t)K, sizeof *p->cell_remat);
    if (p && p->first && p->cell_remat) p->st = calloc((size_t)K * (size_t)T, sizeof *p->st);
    if (!p || !p->first || !p->cell_remat || !p->st) {
        if (p) free(p->first), free(p->cell_remat);
        free(p);
        return gp_error(GP_OUT_OF_MEMORY, "gp_pipeline_new: cannot allocate the pipeline");
    }
    p->m = m;
    p->inference = !o;
    if (o) p->o = *o;
    p->K = K;
    p->V = V;
    p->nstages = stages;
    p->M = M;
    p->T = T;
    p->remat = po->remat;
    p->grad_sum = po->grad_sum;
    p->label_smoothing = po->label_smoothing;
    p->D = 1;
    p->nranks = 1;
    p->my_stage = -1;
    p->my_shard = -1;
    /* The schedule (the launchers place the cells by it), then the launcher: a mismatched MPI
     * launch fails before any work. */
    gp_status s = gp_schedule_generate(po->schedule, stages, M, V, &p->sched);
    if (s == GP_OK) s = gp_schedule_validate(&p->sched, MAILBOX_CAPACITY, NULL);
    if (s == GP_OK)
        s = po->launcher == GP_LAUNCHER_MPI ? gp_launch_mpi_init(p, po) : gp_launch_local_init(p, po);
    if (s == GP_OK) s = gp_mesh_setup(p);
    if (s == GP_OK) s = choose_partition(p, po);
    if (s == GP_OK && po->launcher == GP_LAUNCHER_MPI) s = gp_launch_mpi_agree_cells(p, p->first);
    if (s == GP_OK) s = init_stages(p, po, seed);
    if (s == GP_OK && po->launcher == GP_LAUNCHER_MPI) s = gp_launch_mpi_gpu_comm(p, po);
    p->seed = seed ? seed : m->seed; /* dropout keys: the init seed unless given */
    /* One track per stage shard (a worker); with processes, one per rank once gathered
     * (gp_pipeline_gather). */
    if (s == GP_OK) s = gp_trace_init(&p->trace, p->my_stage >= 0 ? p->nranks : gp_workers(p), M);
    if (s == GP_OK) gp_trace_set_info(&p->trace, p->sched.name, gp_remat_name(p->remat));
    p->trace.stages_per_replica = stages;
    p->trace.shards_per_stage = T;
    p->trace.chunks = V;
    if (s == GP_OK && !p->tp_bytes) {
        const int n = p->my_stage >= 0 ? p->nranks : gp_workers(p);
        if (!(p->tp_bytes = calloc((size_t)n, sizeof *p->tp_bytes)))
            s = gp_error(GP_OUT_OF_MEMORY, "pipeline: byte counters of %d devices", n);
    }
    if (s != GP_OK) {
        if (T > 1)
            gp_error_context(s, "gp_pipeline_new (K = %d, M = %d, T = %d)", stages, M, T);
        else if (V > 1)
            gp_error_context(s, "gp_pipeline_new (K = %d, M = %d, V = %d)", stages, M, V);
        else
            gp_error_context(s, "gp_pipeline_new (K = %d, M = %d)", stages, M);
        gp_pipeline_free(p);
        return s;
    }
    m->held = true;
    *out = p;
    return GP_OK;
}

void gp_pipeline_free(gp_pipeline *p) {
    if (!p) return;
    if (p->m) p->m->held = false;
    gp_ckpt_writer_free(p->ckpt); /* a save in flight is written first, never cut short */
    if (p->launcher) p->launcher->free(p);
    /* Every cell's store goes before the devices: a stage's cells share its lead's device. */
    for (int w = 0; p->st && w < p->K * p->T; w++) {
        gp_stage *s = &p->st[w];
        gp_grad_tree_free(s);
        if (s->store) gp_store_train_end(s->m, s->store);
        if (s->store && p->st[s->w].own_dev) gp_store_release_layers(s->m, s->first, s->last);
    }
    for (int w = 0; p->st && w < p->K * p->T; w++) {
        gp_stage *s = &p->st[w];
        if (s->own_dev) {
            gp_mem_stats ms;
            gp_device_mem_stats(s->dev, &ms);
            GP_ASSERT(ms.live_total == 0); /* every byte a stage held was released */
            gp_device_free(s->dev);
        }
        gp_stage_free_state(s);
    }
    gp_mesh_free(p); /* the shard models' values on the caller's devices go with them */
    free(p->st);
    gp_trace_free(&p->trace);
    free(p->first);
    free(p->cell_remat);
    free(p->bytes);
    free(p->tp_bytes);
    free(p->rank_mem);
    gp_schedule_free(&p->sched);
    free(p);
}

int gp_pipeline_stages(const gp_pipeline *p) { return p ? p->nstages : 0; }
int gp_pipeline_cells(const gp_pipeline *p) { return p ? p->K : 0; }
int gp_pipeline_micro_batches(const gp_pipeline *p) { return p ? p->M : 0; }
int gp_pipeline_tensor_parallel(const gp_pipeline *p) { return p ? p->T : 0; }
int gp_pipeline_shard(const gp_pipeline *p) { return p ? p->my_shard : -1; }

int gp_pipeline_cell_first(const gp_pipeline *p, int k) {
    return p && k >= 0 && k < p->K ? p->first[k] : -1;
}

gp_remat gp_pipeline_cell_remat(const gp_pipeline *p, int k) {
    return p && k >= 0 && k < p->K ? p->cell_remat[k] : GP_REMAT_CELL;
}

gp_device *gp_pipeline_device(const gp_pipeline *p, int k) {
    return p && k >= 0 && k < p->nstages && p->st[k * p->T].run_here ? p->st[k * p->T].dev : NULL;
}

gp_status gp_pipeline_mem_stats_shard(const gp_pipeline *p, int stage, int shard,
                                      gp_mem_stats *out) {
    if (!p || !out) return gp_error(GP_INVALID_ARGUMENT, "gp_pipeline_mem_stats: NULL argument");
    if (stage < 0 || stage >= p->nstages)
        return gp_error(GP_INVALID_ARGUMENT, "gp_pipeline_mem_stats: stage %d outside 0..%d", stage,
                        p->nstages - 1);
    if (shard < 0 || shard >= p->T)
        return gp_error(GP_INVALID_ARGUMENT, "gp_pipeline_mem_stats: shard %d outside 0..%d", shard,
                        p->T - 1);
    const int w = stage * p->T + shard;
    if (p->st[w].run_here) {
        gp_device_mem_stats(p->st[w].dev, out);
        return GP_OK;
    }
    if (p->rank_mem) { /* replica 0's stage `stage` shard `shard` is world rank w */
        *out = p->rank_mem[w];
        return GP_OK;
    }
    return gp_error(GP_INVALID_ARGUMENT,
                    "gp_pipeline_mem_stats: stage %d runs in another process (this is rank %d, "
                    "stage %d): gather first (gp_pipeline_gather)",
                    stage, p->rank, p->my_stage);
}

gp_status gp_pipeline_mem_stats(const gp_pipeline *p, int stage, gp_mem_stats *out) {
    return gp_pipeline_mem_stats_shard(p, stage, 0, out);
}

void gp_pipeline_place(const gp_pipeline *p, int *rank, int *nranks, int *stage, int *replica) {
    if (rank) *rank = p ? p->rank : 0;
    if (nranks) *nranks = p ? p->nranks : 1;
    if (stage) *stage = p ? p->my_stage : -1;
    if (replica) *replica = p ? p->replica : 0;
}

/* ------------------------------------------------------------------- step */

static gp_status check_input(const gp_pipeline *p, const gp_tensor *x, const char *what) {
    char got[96], want[96];
    if (!x || !x->data)
        return gp_error(GP_INVALID_ARGUMENT, "%s: x must be an allocated tensor", what);
    int64_t b = x->shape.ndim ? x->shape.dim[0] : 0;
    if (b < 1) return gp_error(GP_SHAPE, "%s: empty batch", what);
    gp_shape ws;
    GP_TRY(gp_model_shape(p->m, -1, b, &ws));
    if (!gp_shape_equal(&ws, &x->shape) || x->dtype != p->m->input_dtype)
        return gp_error(GP_SHAPE, "%s: input %s %s, expected %s %s", what,
                        gp_shape_str(&x->shape, got, sizeof got), gp_dtype_name(x->dtype),
                        gp_shape_str(&ws, want, sizeof want), gp_dtype_name(p->m->input_dtype));
    return GP_OK;
}

static gp_status check_labels(const gp_tensor *y, int64_t b, const char *what) {
    char got[96];
    if (!y || !y->data)
        return gp_error(GP_INVALID_ARGUMENT, "%s: y must be an allocated tensor", what);
    if (y->dtype != GP_I32 || y->shape.ndim < 1 || y->shape.dim[0] != b)
        return gp_error(GP_SHAPE, "%s: labels %s %s, expected int32 with batch %lld first", what,
                        gp_shape_str(&y->shape, got, sizeof got), gp_dtype_name(y->dtype),
                        (long long)b);
    return GP_OK;
}

static gp_status check_batch(const gp_pipeline *p, const gp_tensor *x, const gp_tensor *y) {
    GP_TRY(check_input(p, x, "pipeline step"));
    const int64_t b = x->shape.dim[0];
    GP_TRY(check_labels(y, b, "pipeline step"));
    if (p->D > 1 && b % ((int64_t)p->D * p->M))
        return gp_error(GP_INVALID_ARGUMENT,
                        "pipeline step: batch %lld is not divisible by %d replicas x %d "
                        "micro-batches",
                        (long long)b, p->D, p->M);
    if (b % p->M)
        return gp_error(GP_INVALID_ARGUMENT,
                        "pipeline step: batch %lld is not divisible by %d micro-batches",
                        (long long)b, p->M);
    return GP_OK;
}

static gp_status run_step(gp_pipeline *p, const gp_tensor *x, const gp_tensor *y, float *loss) {
    if (!p) return gp_error(GP_INVALID_ARGUMENT, "pipeline step: pipeline is NULL");
    if (p->inference)
        return gp_error(GP_INVALID_ARGUMENT,
                        "pipeline step: the pipeline was made without optimizer options, for "
                        "inference only");
    GP_TRY(check_batch(p, x, y));
    double n = (double)gp_count_labels(y); /* the global batch's: replicas' gradients add up */
    p->normalizer = n > 0 ? n : 1;
    p->have_trace = false;
    float l = 0;
    gp_status s = p->launcher->step(p, x, y, &l);
    if (s != GP_OK) {
        /* No gradients left behind, so the next step can succeed. */
        for (int w = 0; w < p->K * p->T; w++)
            if (p->st[w].store) gp_store_zero_grads(p->st[w].store);
        return s;
    }
    if (loss) *loss = l;
    return GP_OK;
}

gp_status gp_pipeline_step(gp_pipeline *p, const gp_tensor *x, const gp_tensor *y, float *loss) {
    GP_TRY(run_step(p, x, y, loss));
    p->step++;
    return GP_OK;
}

gp_status gp_pipeline_accumulate(gp_pipeline *p, const gp_tensor *x, const gp_tensor *y,
                                 float *loss) {
    if (p && p->my_stage >= 0)
        return gp_error(GP_UNSUPPORTED, "gp_pipeline_accumulate: in-process pipelines only");
    if (p) p->no_update = true;
    gp_status s = run_step(p, x, y, loss);
    if (p) p->no_update = false;
    return s;
}

int gp_pipeline_steps_done(const gp_pipeline *p) { return p ? p->step : 0; }

gp_status gp_pipeline_set_step(gp_pipeline *p, int steps_done) {
    if (!p) return gp_error(GP_INVALID_ARGUMENT, "gp_pipeline_set_step: pipeline is NULL");
    if (steps_done < 0)
        return gp_error(GP_INVALID_ARGUMENT, "gp_pipeline_set_step: %d steps, expected >= 0",
                        steps_done);
    p->step = steps_done;
    return GP_OK;
}

/* -------------------------------------------------------- across the stages */

gp_status gp_pipeline_predict(gp_pipeline *p, const gp_tensor *x, gp_tensor *logits) {
    char got[96], want[96];
    if (!p) return gp_error(GP_INVALID_ARGUMENT, "gp_pipeline_predict: pipeline is NULL");
    GP_TRY(check_input(p, x, "gp_pipeline_predict"));
    gp_shape ws;
    GP_TRY(gp_model_shape(p->m, p->m->nlayers - 1, x->shape.dim[0], &ws));
    if (!logits || !logits->data || !gp_shape_equal(&logits->shape, &ws) ||
        logits->dtype != GP_F32)
        return gp_error(GP_SHAPE, "gp_pipeline_predict: logits tensor %s, expected float32 %s",
                        logits ? gp_shape_str(&logits->shape, got, sizeof got) : "NULL",
                        gp_shape_str(&ws, want, sizeof want));
    return p->launcher->predict(p, x, logits);
}

gp_status gp_pipeline_predict_batches(gp_pipeline *p, int n, const gp_tensor *xs,
                                      gp_tensor *logits) {
    if (!p || n < 0 || (n > 0 && (!xs || !logits)))
        return gp_error(GP_INVALID_ARGUMENT,
                        "gp_pipeline_predict_batches: NULL argument or %d batches", n);
    for (int i = 0; i < n; i++) {
        char got[96], want[96];
        gp_shape ws;
        gp_status s = check_input(p, &xs[i], "gp_pipeline_predict_batches");
        if (s == GP_OK) s = gp_model_shape(p->m, p->m->nlayers - 1, xs[i].shape.dim[0], &ws);
        if (s == GP_OK && (!gp_tensor_host_data(&logits[i]) ||
                           !gp_shape_equal(&logits[i].shape, &ws) || logits[i].dtype != GP_F32))
            s = gp_error(GP_SHAPE, "logits tensor %s, expected float32 %s in host memory",
                         gp_shape_str(&logits[i].shape, got, sizeof got),
                         gp_shape_str(&ws, want, sizeof want));
        if (s != GP_OK)
            return gp_error_context(s, "gp_pipeline_predict_batches: batch %d of %d", i, n);
    }
    if (n > 1 && gp_eval_overlap_applies(p)) {
        gp_status s = gp_eval_overlap(p, n, xs, NULL, logits, NULL, NULL, NULL);
        return s == GP_OK ? GP_OK : gp_error_context(s, "gp_pipeline_predict_batches");
    }
    for (int i = 0; i < n; i++) GP_TRY(p->launcher->predict(p, &xs[i], &logits[i]));
    return GP_OK;
}

gp_status gp_pipeline_evaluate(gp_pipeline *p, const gp_tensor *x, const gp_tensor *y,
                               double *loss_sum, int64_t *ncorrect, int64_t *ncount) {
    if (!p) return gp_error(GP_INVALID_ARGUMENT, "gp_pipeline_evaluate: pipeline is NULL");
    GP_TRY(check_input(p, x, "gp_pipeline_evaluate"));
    GP_TRY(check_labels(y, x->shape.dim[0], "gp_pipeline_evaluate"));
    gp_shape ws;
    GP_TRY(gp_model_shape(p->m, p->m->nlayers - 1, x->shape.dim[0], &ws));
    const size_t n = (size_t)gp_shape_nelem(&ws);
    float *host = malloc((n ? n : 1) * sizeof *host);
    if (!host) return gp_error(GP_OUT_OF_MEMORY, "gp_pipeline_evaluate: %zu logits", n);
    gp_tensor logits = gp_tensor_view(host, ws, GP_F32);
    gp_status s = p->launcher->predict(p, x, &logits);
    if (s == GP_OK) s = gp_model_score(&logits, y, loss_sum, ncorrect, ncount);
    free(host);
    return s == GP_OK ? GP_OK : gp_error_context(s, "gp_pipeline_evaluate");
}

gp_status gp_pipeline_evaluate_batches(gp_pipeline *p, int n, const gp_tensor *xs,
                                       const gp_tensor *ys, double *loss_sum, int64_t *ncorrect,
                                       int64_t *ncount) {
    if (!p || n < 0 || (n > 0 && (!xs || !ys)) || !loss_sum || !ncorrect || !ncount)
        return gp_error(GP_INVALID_ARGUMENT,
                        "gp_pipeline_evaluate_batches: NULL argument or %d batches", n);
    for (int i = 0; i < n; i++) {
        gp_status s = check_input(p, &xs[i], "gp_pipeline_evaluate_batches");
        if (s == GP_OK) s = check_labels(&ys[i], xs[i].shape.dim[0], "gp_pipeline_evaluate_batches");
        if (s != GP_OK) return gp_error_context(s, "batch %d of %d", i, n);
    }
    if (n > 1 && gp_eval_overlap_applies(p)) {
        gp_status s = gp_eval_overlap(p, n, xs, ys, NULL, loss_sum, ncorrect, ncount);
        return s == GP_OK ? GP_OK : gp_error_context(s, "gp_pipeline_evaluate_batches");
    }
    double l = 0;
    int64_t c = 0, m = 0;
    for (int i = 0; i < n; i++) {
        double li = 0;
        int64_t ci = 0, mi = 0;
        GP_TRY(gp_pipeline_evaluate(p, &xs[i], &ys[i], &li, &ci, &mi));
        l += li, c += ci, m += mi;
    }
    *loss_sum = l, *ncorrect = c, *ncount = m;
    return GP_OK;
}

gp_status gp_pipeline_params_fnv1a64(gp_pipeline *p, uint64_t *out) {
    if (!p || !out) return gp_error(GP_INVALID_ARGUMENT, "gp_pipeline_params_fnv1a64: NULL argument");
    return p->launcher->params_hash(p, out);
}

gp_status gp_pipeline_gather(gp_pipeline *p) {
    if (!p) return gp_error(GP_INVALID_ARGUMENT, "gp_pipeline_gather: pipeline is NULL");
    return p->launcher->gather(p);
}

gp_model *gp_pipeline_model(const gp_pipeline *p) { return p ? p->m : NULL; }
const gp_optim_opts *gp_pipeline_optim(const gp_pipeline *p) {
    return p && !p->inference ? &p->o : NULL;
}

gp_status gp_pipeline_allgather(gp_pipeline *p, const void *mine, size_t nbytes, void *all) {
    if (!p || !mine || !all)
        return gp_error(GP_INVALID_ARGUMENT, "gp_pipeline_allgather: NULL argument");
    return p->launcher->allgather(p, mine, nbytes, all);
}

gp_status gp_pipeline_bytes_tensor(const gp_pipeline *p, uint64_t *tensor, int n) {
    if (!p || !tensor)
        return gp_error(GP_INVALID_ARGUMENT, "gp_pipeline_bytes_tensor: NULL argument");
    const int devices = p->my_stage >= 0 ? p->nranks : gp_workers(p);
    if (n < devices)
        return gp_error(GP_INVALID_ARGUMENT,
                        "gp_pipeline_bytes_tensor: room for %d devices, %d needed", n, devices);
    for (int r = 0; r < n; r++) tensor[r] = r < devices && p->tp_bytes ? p->tp_bytes[r] : 0;
    return GP_OK;
}

gp_status gp_pipeline_bytes_sent(const gp_pipeline *p, uint64_t *p2p, uint64_t *allreduce, int n) {
    if (!p || !p2p || !allreduce)
        return gp_error(GP_INVALID_ARGUMENT, "gp_pipeline_bytes_sent: NULL argument");
    if (n < p->nranks)
        return gp_error(GP_INVALID_ARGUMENT, "gp_pipeline_bytes_sent: room for %d ranks, %d needed",
                        n, p->nranks);
    for (int r = 0; r < n; r++) {
        p2p[r] = r < p->nranks && p->bytes ? p->bytes[2 * r] : 0;
        allreduce[r] = r < p->nranks && p->bytes ? p->bytes[2 * r + 1] : 0;
    }
    return GP_OK;
}
