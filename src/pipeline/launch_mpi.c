/* The launcher of one stage shard per MPI process: the mesh of D data-parallel replicas x K
 * stages x T tensor-parallel shards, each replica on its slice of the mini-batch. A rank holds
 * its own stage's shard and nothing more (with V cells per stage: its V cells, over a transport
 * of cells laid on the stages'). Its hooks sum the shard's gradients over the replicas
 * in buckets that are slices of its gradient block, started during the last backward as their
 * layers finish; the norms and losses meet in one fixed-order all-reduce. Evaluation and the
 * parameter hash stream through the stages of replica 0 (each stage's shards together), and
 * every rank gets the result. Without MPI support the grid cannot be made. */
#include <stdlib.h>
#include <string.h>
#include <unistd.h> /* gethostname: whether the ranks share a clock */

#include "comm/mpi_grid.h"
#include "core/clock.h"
#include "core/hash.h"
#include "model/skips.h"
#include "pipeline/launch_mpi.h"
#include "pipeline/launch_nccl.h"
#include "pipeline/launcher.h"
#include "pipeline/mesh.h"
#include "pipeline/stage.h"
#include "pipeline/timeline.h"

/* Gradient buckets of at least a quarter of the stage's gradients (so that a bucket travels
 * while the stage's earlier layers still backpropagate) and at most this many floats (4 MiB:
 * big enough for the all-reduce to run at bandwidth); a bucket ends at a layer boundary. */
#define DP_BUCKET_FLOATS (1 << 20)

typedef struct mpi_launch {
    gp_grid *grid;
    gp_nccl_state *nccl; /* NCCL between the GPU ranks (launch_nccl.c); NULL: MPI */
    gp_transport *cells; /* V > 1: the cells' transport over the grid's pipe (owned) */
    gp_tensor xv, yv; /* this replica's rows of the step's mini-batch (views) */
    int dp_mark;      /* layers [dp_mark, last) are in buckets already started */
    int64_t dp_bucket; /* floats that make a bucket */
} mpi_launch;

static gp_stage *my_stage(gp_pipeline *p) { return gp_worker(p, p->my_stage, p->my_shard); }

/* -------------------------------------------------------------- gradient hooks */

/* Layer li's gradients are final: once the layers not yet sent fill a bucket (or the cell's
 * first layer is done), start that slice's all-reduce while the earlier layers backpropagate. */
static gp_status layer_grads_final(void *ctx, gp_stage *s, int li) {
    mpi_launch *l = ctx;
    if (li == s->last - 1) l->dp_mark = s->last;
    gp_tensor slice = gp_store_grad_slice(s->store, li, l->dp_mark);
    const int64_t n = gp_tensor_nelem(&slice);
    if (n > 0 && (n >= l->dp_bucket || li == s->first)) {
        GP_TRY(l->nccl ? gp_launch_nccl_grads(l->nccl, &slice)
                       : gp_grid_grads_start(l->grid, &slice));
        l->dp_mark = li;
    }
    return GP_OK;
}

static gp_status grads_wait(void *ctx, gp_stage *s) {
    (void)s;
    mpi_launch *l = ctx;
    return l->nccl ? gp_launch_nccl_grads_wait(l->nccl) : gp_grid_grads_wait(l->grid);
}

/* v[0..L-1]: this stage shard's parts of its layers' squared gradient norms (zero elsewhere),
 * v[L]: the last stage's loss over its replica's rows (shard 0's). One all-reduce over every
 * rank, in world order, of L norms (replica 0's only: the replicas' reduced gradients are
 * identical), D losses and each rank's byte counts. A layer's entry has the T shards of its
 * stage as contributors, added in shard order (consecutive ranks), as the threads launcher adds
 * them; every other entry has one, so the sums are identical everywhere; the loss is then the
 * replicas' losses added in replica order. */
static gp_status reduce_norms(void *ctx, gp_stage *s, double *v, int L) {
    mpi_launch *l = ctx;
    gp_pipeline *p = s->p;
    const int W = p->nranks, d = p->replica, n = L + p->D + 3 * W;
    double *w = calloc((size_t)n, sizeof *w);
    if (!w) return gp_error(GP_OUT_OF_MEMORY, "cannot allocate %d reduction values", n);
    if (d == 0) memcpy(w, v, (size_t)L * sizeof *w);
    w[L + d] = v[L];
    uint64_t p2p, ar;
    gp_grid_bytes(l->grid, &p2p, &ar);
    w[L + p->D + 3 * p->rank] = (double)p2p;
    w[L + p->D + 3 * p->rank + 1] = (double)ar;
    w[L + p->D + 3 * p->rank + 2] = (double)gp_worker_tp_bytes(p, s);
    gp_status st = gp_transport_allreduce_sum(gp_grid_world(l->grid), p->rank, w, n);
    if (st == GP_OK) {
        memcpy(v, w, (size_t)L * sizeof *v);
        double loss = w[L];
        for (int r = 1; r < p->D; r++) loss += w[L + r];
        v[L] = loss;
        for (int r = 0; r < W; r++) {
            const double *c = &w[L + p->D + 3 * r];
            gp_pipeline_set_bytes(p, r, (uint64_t)c[0], (uint64_t)c[1], (uint64_t)c[2]);
        }
    }
    free(w);
    return st;
}

/* ------------------------------------------------------------------- step */

/* One step on this process's stage, on the calling thread (MPI is initialized FUNNELED: only
 * this thread calls it). Every rank gets the global batch; this replica takes its rows. */
static gp_status mpi_step(gp_pipeline *p, const gp_tensor *x, const gp_tensor *y, float *loss) {
    mpi_launch *l = p->launch;
    const int64_t rows = x->shape.dim[0] / p->D;
    l->xv = gp_tensor_rows(x, p->replica * rows, rows);
    l->yv = gp_tensor_rows(y, p->replica * rows, rows);
    GP_TRY(gp_pipeline_begin_step(p, &l->xv, &l->yv, p->replica * p->M));
    gp_stage *s = my_stage(p);
    gp_grid_bytes_reset(l->grid);
    const double t0 = gp_now();
    gp_stage_run(s);
    gp_pipeline_end_step(p, gp_now() - t0);
    if (s->status != GP_OK) return gp_error(s->status, "%s", s->msg);
    gp_launch_nccl_step_end(l->nccl);
    /* the calls as WAIT events, named by what they moved (see gp_timeline_trace_calls) */
    for (int v = 0; v < p->V; v++) GP_TRY(gp_timeline_trace_calls(gp_chunk_of(p, s, v)));
    *loss = (float)s->loss;
    return GP_OK;
}

/* ------------------------------------------------------- across the stages */

/* Every rank gets rank `root`'s nbytes at mine (on the other ranks mine is ignored) in out. */
static gp_status share_from(mpi_launch *l, int root, int rank, const void *mine, size_t nbytes,
                            void *out) {
    int W = gp_grid_world_size(l->grid);
    size_t *off = calloc((size_t)W + 1, sizeof *off);
    if (!off) return gp_error(GP_OUT_OF_MEMORY, "cannot gather from %d ranks", W);
    void *all = NULL;
    gp_status s = gp_grid_allgatherv(l->grid, mine, rank == root ? nbytes : 0, &all, off);
    if (s == GP_OK && off[root + 1] - off[root] != nbytes)
        s = gp_error(GP_INTERNAL, "rank %d shared %zu bytes, %zu expected", root,
                     off[root + 1] - off[root], nbytes);
    if (s == GP_OK) memcpy(out, (char *)all + off[root], nbytes);
    free(all);
    free(off);
    return s;
}

/* A message of the streamed passes: shape and dtype agreed by both ends, from the model. */
static gp_status recv_from_prev(gp_pipeline *p, gp_stage *s, gp_shape shape, gp_dtype dt,
                                gp_tensor *t) {
    GP_TRY(gp_tensor_alloc(s->dev, GP_MEM_ACTIVATIONS, shape, dt, t));
    gp_status st = gp_transport_recv(p->tr, s->k, s->k - 1, (gp_msg_tag){GP_MSG_ACT, 0, 0}, t);
    if (st != GP_OK) gp_tensor_release(t);
    return st;
}

/* The stage shard's eval forward: its layers, with its tensor-parallel group. */
static gp_status eval_range(gp_pipeline *p, gp_stage *s, const gp_tensor *in, gp_tensor *out) {
    if (p->T == 1) return gp_model_forward_eval(p->m, s->first, s->last, in, out);
    const gp_run run = {.training = false, .seed = s->m->seed, .tp = &s->tp};
    return gp_seq_forward_output(s->m, s->first, s->last, s->dev, &run, in, out);
}

/* The last stage's logits into host (the whole (B, ..., V)): its own, or with a split head every
 * shard's columns (an all-gather over the stage's shards, put side by side). */
static gp_status last_logits(gp_pipeline *p, gp_stage *s, const gp_tensor *out, float *host,
                             size_t nbytes) {
    if (!p->vocab_split) return gp_tensor_to_host(out, host, nbytes);
    const int64_t lc = out->shape.dim[out->shape.ndim - 1], n = gp_tensor_nelem(out);
    const int64_t rows = n / lc, V = lc * p->T;
    float *mine = malloc((size_t)n * sizeof *mine), *all = malloc((size_t)(n * p->T) * sizeof *all);
    gp_status st = mine && all ? gp_tensor_to_host(out, mine, (size_t)n * sizeof *mine)
                               : gp_error(GP_OUT_OF_MEMORY, "logits of %d shards", p->T);
    if (st == GP_OK) st = gp_transport_allgather_f32(s->tensor, s->t, mine, n, all);
    for (int t = 0; t < p->T && st == GP_OK; t++)
        for (int64_t r = 0; r < rows; r++)
            memcpy(host + r * V + t * lc, all + t * n + r * lc, (size_t)lc * sizeof *host);
    free(mine);
    free(all);
    return st;
}

/* Replica 0's world rank that runs the last cell (its shard 0): where results come from. */
static int last_cell_rank(const gp_pipeline *p) {
    return gp_worker((gp_pipeline *)p, p->K - 1, 0)->dk * p->T;
}

/* Cell s's part of the eval pass: its input (the batch, or the previous cell's output), its
 * layers, then its output on to the next cell or, from the last, the logits into host. */
static gp_status predict_cell(gp_pipeline *p, gp_stage *s, const gp_tensor *x, void *host,
                              size_t nbytes) {
    const int64_t B = x->shape.dim[0];
    gp_tensor in = {0}, out = {0};
    gp_shape in_shape;
    gp_status st = gp_model_cut_shape(p->m, s->first, B, &in_shape);
    if (st == GP_OK)
        st = s->k == 0 ? gp_stage_input_rows(s, x, 0, B, &in)
                       : recv_from_prev(p, s, in_shape, GP_F32, &in);
    if (st == GP_OK) st = eval_range(p, s, &in, &out);
    gp_tensor_release(&in);
    if (st == GP_OK && s->k < p->K - 1)
        st = gp_transport_send(p->tr, s->k, s->k + 1, (gp_msg_tag){GP_MSG_ACT, 0, 0}, &out);
    else if (st == GP_OK)
        st = last_logits(p, s, &out, host, nbytes);
    gp_tensor_release(&out);
    return st;
}

/* Replica 0's stages pass x forward in eval mode, cell after cell (each stage's shards
 * together, shard t to shard t); the last cell's logits reach every rank. */
static gp_status mpi_predict(gp_pipeline *p, const gp_tensor *x, gp_tensor *logits) {
    mpi_launch *l = p->launch;
    gp_stage *s = my_stage(p);
    const size_t nbytes = gp_tensor_nbytes(logits);
    void *host = malloc(nbytes ? nbytes : 1);
    if (!host) return gp_error(GP_OUT_OF_MEMORY, "gp_pipeline_predict: %zu bytes", nbytes);
    gp_status st = GP_OK;
    if (p->replica == 0) {
        for (int c = 0; c < p->K && st == GP_OK; c++)
            if (gp_worker(p, c, s->t)->run_here)
                st = predict_cell(p, gp_worker(p, c, s->t), x, host, nbytes);
        for (int v = 0; v < p->V && st == GP_OK; v++)
            st = gp_transport_flush(p->tr, gp_chunk_of(p, s, v)->k);
        if (st != GP_OK) gp_grid_abort(l->grid, st, gp_last_error());
    }
    if (st == GP_OK) st = share_from(l, last_cell_rank(p), p->rank, host, nbytes, host);
    if (st == GP_OK) st = gp_tensor_from_host(logits, host, nbytes);
    free(host);
    return st == GP_OK ? GP_OK : gp_error_context(st, "gp_pipeline_predict (rank %d)", p->rank);
}

/* Continues the hash over the stage's layers: its own values, or with shards the whole layers
 * put together (collective over the stage's shards; shard 0 hashes them). */
static gp_status hash_stage(gp_pipeline *p, gp_stage *s, uint64_t *state) {
    if (p->T == 1) return gp_model_params_fnv1a64_range(p->m, s->first, s->last, state);
    GP_TRY(gp_mesh_whole_begin(p, s->first, s->last, false, true));
    gp_status st = s->t == 0 ? gp_model_params_fnv1a64_range(p->m, s->first, s->last, state)
                             : GP_OK;
    gp_mesh_whole_end(p, s->first, s->last);
    return st;
}

/* The FNV-1a state travels from stage to stage (shard 0 to shard 0) as two int32 words. */
static gp_status mpi_params_hash(gp_pipeline *p, uint64_t *h) {
    mpi_launch *l = p->launch;
    gp_stage *me = my_stage(p);
    uint64_t state = GP_FNV1A64_INIT;
    gp_status st = GP_OK;
    for (int c = 0; p->replica == 0 && c < p->K && st == GP_OK; c++) {
        gp_stage *s = gp_worker(p, c, me->t);
        if (!s->run_here) continue;
        gp_tensor t = {0};
        const bool chain = s->t == 0;
        if (s->k > 0 && chain) {
            st = recv_from_prev(p, s, gp_shape1(2), GP_I32, &t);
            if (st == GP_OK) st = gp_tensor_to_host(&t, &state, sizeof state);
            gp_tensor_release(&t);
        }
        if (st == GP_OK) st = hash_stage(p, s, &state);
        if (st == GP_OK && s->k < p->K - 1 && chain) {
            st = gp_tensor_alloc(s->dev, GP_MEM_WORKSPACE, gp_shape1(2), GP_I32, &t);
            if (st == GP_OK) st = gp_tensor_from_host(&t, &state, sizeof state);
            if (st == GP_OK)
                st = gp_transport_send(p->tr, s->k, s->k + 1, (gp_msg_tag){GP_MSG_ACT, 0, 0}, &t);
            gp_tensor_release(&t);
        }
    }
    if (p->replica == 0) {
        for (int v = 0; v < p->V && st == GP_OK; v++)
            st = gp_transport_flush(p->tr, gp_chunk_of(p, me, v)->k);
        if (st != GP_OK) gp_grid_abort(l->grid, st, gp_last_error());
    }
    if (st == GP_OK) st = share_from(l, last_cell_rank(p), p->rank, &state, sizeof state, &state);
    if (st == GP_OK) *h = state;
    return st == GP_OK ? GP_OK : gp_error_context(st, "gp_pipeline_params_fnv1a64 (rank %d)", p->rank);
}

static gp_status mpi_allgather(gp_pipeline *p, const void *mine, size_t nbytes, void *all) {
    mpi_launch *l = p->launch;
    const int W = p->nranks;
    size_t *off = calloc((size_t)W + 1, sizeof *off);
    void *got = NULL;
    if (!off) return gp_error(GP_OUT_OF_MEMORY, "gp_pipeline_allgather: %d ranks", W);
    gp_status s = gp_grid_allgatherv(l->grid, mine, nbytes, &got, off);
    for (int r = 0; r < W && s == GP_OK; r++)
        if (off[r + 1] - off[r] != nbytes)
            s = gp_error(GP_INTERNAL, "gp_pipeline_allgather: rank %d gave %zu bytes, not %zu", r,
                         off[r + 1] - off[r], nbytes);
    if (s == GP_OK) memcpy(all, got, (size_t)W * nbytes);
    free(got);
    free(off);
    return s;
}

/* What each rank contributes to a gather: its trace origin (CLOCK_MONOTONIC: comparable between
 * the ranks of one host), a host hash, its stage device's counters, then its events. */
typedef struct gather_head {
    double origin;
    uint64_t host;
    gp_mem_stats mem;
    int nevents;
} gather_head;

static gp_status add_gathered(gp_pipeline *p, const char *all, const size_t *off) {
    /* One host: the monotonic clocks agree, so every track keeps its true offset. Several
     * hosts: each track starts at its own step start (the step began with the previous one's
     * all-reduce, on every rank within its latency). */
    const int W = p->nranks;
    bool one_host = true;
    gather_head h0;
    memcpy(&h0, all, sizeof h0);
    for (int r = 1; r < W; r++) {
        gather_head hr;
        memcpy(&hr, all + off[r], sizeof hr);
        one_host = one_host && hr.host == h0.host;
    }
    gp_timeline_reset(p);
    gp_status s = GP_OK;
    for (int r = 0; r < W && s == GP_OK; r++) {
        gather_head hr;
        memcpy(&hr, all + off[r], sizeof hr);
        s = gp_pipeline_set_rank_mem(p, r, &hr.mem);
        /* the events, copied out of the byte buffer to their own alignment */
        gp_trace_event *ev = hr.nevents ? malloc((size_t)hr.nevents * sizeof *ev) : NULL;
        if (s == GP_OK && hr.nevents && !ev)
            s = gp_error(GP_OUT_OF_MEMORY, "gp_pipeline_gather: %d events of rank %d", hr.nevents, r);
        if (s == GP_OK && ev) memcpy(ev, all + off[r] + sizeof hr, (size_t)hr.nevents * sizeof *ev);
        if (s == GP_OK)
            s = gp_timeline_add_track(p, r, ev, hr.nevents, one_host ? hr.origin - h0.origin : 0);
        free(ev);
    }
    return s;
}

static gp_status mpi_gather(gp_pipeline *p) {
    mpi_launch *l = p->launch;
    const int W = p->nranks, k = my_stage(p)->w;
    int n = 0;
    const gp_trace_event *ev = gp_trace_events(&p->trace, k, &n);
    size_t nbytes = sizeof(gather_head) + (size_t)n * sizeof *ev;
    char *mine = malloc(nbytes);
    size_t *off = calloc((size_t)W + 1, sizeof *off);
    if (!mine || !off) {
        free(mine);
        free(off);
        return gp_error(GP_OUT_OF_MEMORY, "gp_pipeline_gather: cannot allocate %zu bytes", nbytes);
    }
    gather_head h = {.origin = p->trace.origin, .nevents = n};
    char host[256] = "";
    gethostname(host, sizeof host - 1);
    h.host = gp_fnv1a64(GP_FNV1A64_INIT, host, strlen(host));
    gp_device_mem_stats(my_stage(p)->dev, &h.mem);
    memcpy(mine, &h, sizeof h);
    if (n) memcpy(mine + sizeof h, ev, (size_t)n * sizeof *ev);
    void *all = NULL;
    gp_status s = gp_grid_allgatherv(l->grid, mine, nbytes, &all, off);
    free(mine);
    if (s == GP_OK) s = add_gathered(p, all, off);
    free(all);
    free(off);
    /* tracks 0..K-1: replica 0's stages; on success the timeline is complete */
    if (s == GP_OK) s = gp_timeline_simulate(p);
    if (s != GP_OK) gp_timeline_reset(p); /* no timeline half gathered */
    return s == GP_OK ? GP_OK : gp_error_context(s, "gp_pipeline_gather");
}

static void mpi_free(gp_pipeline *p) {
    mpi_launch *l = p->launch;
    if (!l) return;
    gp_transport_free(l->cells);
    gp_launch_nccl_free(l->nccl);
    gp_grid_free(l->grid);
    free(l);
    const gp_stage_sync none = {0};
    gp_pipeline_bind_launcher(p, p->launcher, NULL, &none);
    gp_pipeline_bind_transport(p, NULL);
}

static const gp_launcher_iface mpi_iface = {
    .name = "mpi",
    .step = mpi_step,
    .predict = mpi_predict,
    .params_hash = mpi_params_hash,
    .allgather = mpi_allgather,
    .gather = mpi_gather,
    .free = mpi_free,
};

/* The grid (mpirun's world as D x K) and this process's place. Processes are bound to cores by
 * their launcher (mpirun --bind-to), not by the stage they run. */
gp_status gp_launch_mpi_init(gp_pipeline *p, const gp_pipeline_opts *po) {
    mpi_launch *l = calloc(1, sizeof *l);
    if (!l) return gp_error(GP_OUT_OF_MEMORY, "pipeline: cannot allocate its launcher");
    const int D = po->data_parallel ? po->data_parallel : 1;
    gp_stage_sync sync = {.reduce_norms = reduce_norms, .ctx = l};
    if (D > 1) {
        sync.layer_grads_final = layer_grads_final;
        sync.grads_wait = grads_wait;
    }
    gp_pipeline_bind_launcher(p, &mpi_iface, l, &sync); /* from here its free releases l */
    GP_TRY(gp_grid_new(D, p->nstages, p->T, po->comm_timeout_s, &l->grid));
    gp_grid_set_grad_tree(l->grid, po->grad_sum == GP_GRAD_SUM_TREE);
    gp_transport *tr = gp_grid_pipe(l->grid);
    if (p->V > 1) { /* the pipe's ranks are the stages; the cells talk over them */
        int *rank_of = malloc((size_t)p->K * sizeof *rank_of);
        if (!rank_of) return gp_error(GP_OUT_OF_MEMORY, "pipeline: %d cells", p->K);
        for (int c = 0; c < p->K; c++) {
            int v;
            gp_schedule_place(&p->sched, c, &rank_of[c], &v);
        }
        gp_status s = gp_transport_cells_new(tr, p->K, rank_of, &l->cells);
        free(rank_of);
        GP_TRY(s);
        tr = l->cells;
    }
    gp_pipeline_bind_transport(p, tr);
    for (int w = 0; w < p->K * p->T; w++) {
        gp_stage_bind_transports(&p->st[w], tr, gp_grid_tensor(l->grid));
        gp_stage_set_cpu(&p->st[w], -1);
    }
    const gp_place place = {.rank = gp_grid_world_rank(l->grid),
                            .nranks = gp_grid_world_size(l->grid),
                            .stage = gp_grid_stage(l->grid),
                            .shard = gp_grid_shard(l->grid),
                            .replica = gp_grid_replica(l->grid),
                            .replicas = D,
                            .local_rank = gp_grid_local_rank(l->grid)};
    return gp_pipeline_set_place(p, &place);
}

/* Every rank must cut the model at the same layers; a partition balanced on measured times
 * (--balance time) may differ from rank to rank, so rank 0's is used everywhere: one all-reduce
 * to which only rank 0 contributes. Also sizes the gradient buckets, once the cells are known. */
gp_status gp_launch_mpi_agree_cells(gp_pipeline *p, int *first) {
    mpi_launch *l = p->launch;
    double *v = calloc((size_t)p->K, sizeof *v);
    if (!v) return gp_error(GP_OUT_OF_MEMORY, "pipeline: cannot allocate %d cell bounds", p->K);
    for (int k = 0; p->rank == 0 && k < p->K; k++) v[k] = first[k];
    gp_status s = gp_transport_allreduce_sum(gp_grid_world(l->grid), p->rank, v, p->K);
    for (int k = 0; s == GP_OK && k < p->K; k++) first[k] = (int)v[k];
    free(v);
    if (s != GP_OK) return gp_error_context(s, "pipeline: agreeing on rank 0's cells");
    const gp_model *sm = p->T > 1 ? p->shard[p->my_shard] : p->m; /* this rank's shapes */
    int64_t n = 0;
    for (int c = 0; c < p->K; c++) { /* this rank's cells */
        int dk, v;
        gp_schedule_place(&p->sched, c, &dk, &v);
        if (dk != p->my_stage) continue;
        const int last = c + 1 < p->K ? first[c + 1] : p->m->nlayers;
        for (int li = first[c]; li < last; li++)
            for (int j = 0; j < sm->layers[li]->nparams; j++)
                if (sm->layers[li]->params[j].trainable)
                    n += gp_shape_nelem(&sm->layers[li]->params[j].shape);
    }
    l->dp_bucket = n / 4 < DP_BUCKET_FLOATS ? n / 4 : DP_BUCKET_FLOATS;
    return GP_OK;
}

gp_status gp_launch_mpi_gpu_comm(gp_pipeline *p, const gp_pipeline_opts *po) {
    mpi_launch *l = p->launch;
    return gp_launch_nccl_setup(p, l->grid, po->gpu_comm, &l->nccl);
}
