/* The pipeline over MPI: one stage per process, D data-parallel replicas x K stages, each
 * replica on its slice of the mini-batch, the stages' gradients summed over the replicas in
 * buckets started during the last backward, and the collectives that give every rank the
 * step's stats, timeline and parameters. Without MPI support the grid cannot be made and these
 * paths are never taken. */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h> /* gethostname: whether the ranks share a clock */

#include "runtime_internal.h"

/* Gradient buckets of at least a quarter of the stage's gradients (so that a bucket travels
 * while the stage's earlier layers still backpropagate) and at most this many floats (4 MiB:
 * big enough for the all-reduce to run at bandwidth); a bucket ends at a layer boundary. */
#define DP_BUCKET_FLOATS (1 << 20)

/* The grid (mpirun's world as D x K) and this process's stage; threads: nothing. */
gp_status gp_rt_init_processes(gp_pipeline *p, const gp_pipeline_opts *po) {
    if (po->backend == GP_BACKEND_THREADS) {
        if (po->data_parallel > 1)
            return gp_error(GP_INVALID_ARGUMENT,
                            "pipeline: data_parallel %d needs the MPI backend (one process per "
                            "replica and stage)",
                            po->data_parallel);
        return GP_OK;
    }
    if (po->backend != GP_BACKEND_MPI)
        return gp_error(GP_INVALID_ARGUMENT, "pipeline: backend %d is neither threads (%d) nor mpi (%d)",
                        (int)po->backend, GP_BACKEND_THREADS, GP_BACKEND_MPI);
    if (po->data_parallel < 0 || !(po->comm_timeout_s >= 0))
        return gp_error(GP_INVALID_ARGUMENT,
                        "pipeline: data_parallel %d must be >= 1 and comm_timeout_s %g >= 0",
                        po->data_parallel, po->comm_timeout_s);
    p->D = po->data_parallel ? po->data_parallel : 1;
    GP_TRY(gp_grid_new(p->D, p->K, po->comm_timeout_s, &p->grid));
    p->tr = gp_grid_pipe(p->grid);
    p->bytes = calloc(2 * (size_t)gp_grid_world_size(p->grid), sizeof *p->bytes);
    if (!p->bytes) return gp_error(GP_OUT_OF_MEMORY, "pipeline: cannot allocate byte counters");
    char name[48];
    snprintf(name, sizeof name, "mirror%d", gp_grid_world_rank(p->grid));
    return gp_device_cpu_new(name, &p->mirror);
}

/* Every rank must cut the model at the same layers; a partition balanced on measured times
 * (--balance time) may differ from rank to rank, so rank 0's is used everywhere: one all-reduce
 * to which only rank 0 contributes. */
gp_status gp_rt_agree_partition(gp_pipeline *p, int *first) {
    int rank = gp_grid_world_rank(p->grid);
    double *v = calloc((size_t)p->K, sizeof *v);
    if (!v) return gp_error(GP_OUT_OF_MEMORY, "pipeline: cannot allocate %d cell bounds", p->K);
    for (int k = 0; rank == 0 && k < p->K; k++) v[k] = first[k];
    gp_status s = gp_transport_allreduce_sum(gp_grid_world(p->grid), rank, v, p->K);
    for (int k = 0; s == GP_OK && k < p->K; k++) first[k] = (int)v[k];
    free(v);
    return s == GP_OK ? GP_OK : gp_error_context(s, "pipeline: agreeing on rank 0's cells");
}

void gp_rt_free_processes(gp_pipeline *p) {
    if (!p->grid) return;
    if (p->st) gp_tensor_release(&p->dp_buf); /* on the stage device, before it goes */
    for (int k = 0; p->st && k < p->K; k++) /* the mirror's copies of the other stages */
        if (!gp_rt_owns(p, k)) gp_model_release_range(p->m, p->st[k].first, p->st[k].last);
    gp_grid_free(p->grid);
    p->grid = NULL;
    p->tr = NULL;
    if (p->mirror) gp_device_free(p->mirror);
    p->mirror = NULL;
    free(p->bytes);
    free(p->rank_mem);
    free(p->dp_off);
}

/* The stage's gradients in dp_buf, layer after layer (each layer's trainable parameters in
 * order); dp_off[li] is where layer li's start, for li in [first, last]. */
static gp_status dp_layout(stage *s) {
    gp_pipeline *p = s->p;
    if (p->dp_off) return GP_OK;
    p->dp_off = calloc((size_t)p->m->nlayers + 1, sizeof *p->dp_off);
    if (!p->dp_off) return gp_error(GP_OUT_OF_MEMORY, "pipeline: cannot allocate bucket offsets");
    int64_t n = 0;
    for (int li = s->first; li < s->last; li++) {
        p->dp_off[li] = n;
        for (int j = 0; j < p->m->layers[li]->nparams; j++) {
            const gp_param *q = &p->m->layers[li]->params[j];
            if (q->trainable) n += gp_tensor_nelem(&q->grad);
        }
    }
    p->dp_off[s->last] = n;
    p->dp_bucket = n / 4 < DP_BUCKET_FLOATS ? n / 4 : DP_BUCKET_FLOATS;
    return n ? gp_tensor_alloc(s->dev, GP_MEM_GRADS, gp_shape1(n), GP_F32, &p->dp_buf) : GP_OK;
}

/* Layer li's gradients are final (the stage's last backward runs its layers last to first):
 * copy them into their place and, once the layers not yet sent fill a bucket (or the cell's
 * first layer is done), start that bucket's all-reduce while the earlier layers backpropagate. */
static gp_status layer_grads_final(void *ctx, int li) {
    stage *s = ctx;
    gp_pipeline *p = s->p;
    if (!p->dp_buf.data) return GP_OK;
    float *b = p->dp_buf.data + p->dp_off[li];
    for (int j = 0; j < p->m->layers[li]->nparams; j++) {
        const gp_param *q = &p->m->layers[li]->params[j];
        if (!q->trainable) continue;
        memcpy(b, q->grad.data, gp_tensor_nbytes(&q->grad));
        b += gp_tensor_nelem(&q->grad);
    }
    int64_t lo = p->dp_off[li], hi = p->dp_off[p->dp_mark];
    if (hi > lo && (hi - lo >= p->dp_bucket || li == s->first)) {
        GP_TRY(gp_grid_grads_start(p->grid, p->dp_buf.data + lo, hi - lo));
        p->dp_mark = li;
    }
    return GP_OK;
}

/* Backward through the cell; with data-parallel replicas the last micro-batch's backward also
 * starts the gradient buckets as their layers finish. */
gp_status gp_rt_backward_cell(stage *s, int mb, const gp_tensor *dy, gp_tensor *dx) {
    gp_pipeline *p = s->p;
    if (!p->grid || p->D < 2 || mb != p->M - 1)
        return gp_seq_backward(p->m, &s->pass[mb], dy, dx);
    gp_status st = dp_layout(s);
    p->dp_mark = s->last;
    if (st != GP_OK) {
        gp_seq_release(&s->pass[mb]);
        return st;
    }
    return gp_seq_backward_each(p->m, &s->pass[mb], dy, dx, layer_grads_final, s);
}

gp_status gp_rt_finish_grad_reduce(stage *s) {
    gp_pipeline *p = s->p;
    if (p->D < 2 || !p->dp_buf.data) return GP_OK;
    GP_TRY(gp_trace_begin(&p->trace, s->k, GP_TRACE_WAIT, -1, "GRAD_ALLREDUCE"));
    gp_status st = gp_grid_grads_wait(p->grid);
    gp_trace_end(&p->trace, s->k);
    if (st != GP_OK) return st;
    const float *b = p->dp_buf.data;
    gp_param *q;
    FOR_EACH_OWN_TRAINABLE(s, li, q) {
        (void)li;
        memcpy(q->grad.data, b, gp_tensor_nbytes(&q->grad));
        b += gp_tensor_nelem(&q->grad);
    }
    return GP_OK;
}

/* v[0..L-1]: this stage's layers' squared gradient norms (zero elsewhere), v[L]: the last
 * stage's loss over its replica's rows. One all-reduce over every rank, in world order, of
 * L norms (replica 0's only: the replicas' reduced gradients are identical), D losses and each
 * rank's byte counts. Every entry has one contributor, so the sums are exact and identical
 * everywhere; the loss is then the replicas' losses added in replica order. */
gp_status gp_rt_reduce_over_ranks(stage *s, double *v, int L) {
    gp_pipeline *p = s->p;
    int W = gp_grid_world_size(p->grid), rank = gp_grid_world_rank(p->grid);
    int d = gp_grid_replica(p->grid), n = L + p->D + 2 * W;
    double *w = calloc((size_t)n, sizeof *w);
    if (!w) return gp_error(GP_OUT_OF_MEMORY, "cannot allocate %d reduction values", n);
    if (d == 0) memcpy(w, v, (size_t)L * sizeof *w);
    w[L + d] = v[L];
    uint64_t p2p, ar;
    gp_grid_bytes(p->grid, &p2p, &ar);
    w[L + p->D + 2 * rank] = (double)p2p;
    w[L + p->D + 2 * rank + 1] = (double)ar;
    gp_status st = gp_transport_allreduce_sum(gp_grid_world(p->grid), rank, w, n);
    if (st == GP_OK) {
        memcpy(v, w, (size_t)L * sizeof *v);
        double loss = w[L];
        for (int r = 1; r < p->D; r++) loss += w[L + r];
        v[L] = loss;
        for (int i = 0; i < 2 * W; i++) p->bytes[i] = (uint64_t)w[L + p->D + i];
    }
    free(w);
    return st;
}

/* The stage's transport calls as WAIT events (named by what they moved): over MPI a call's
 * blocking and its transfer cannot be told apart, and the transfer through shared memory or a
 * NIC is the smaller part, so the whole call counts as idle time. */
static gp_status trace_calls(stage *s) {
    static const char *const names[2][GP_MSG_NKINDS] = {{"SEND_ACT", "SEND_GRAD"},
                                                        {"RECV_ACT", "RECV_GRAD"}};
    gp_pipeline *p = s->p;
    int k = s->k;
    bool sends[GP_MSG_NKINDS] = {k < p->K - 1, k > 0}, recvs[GP_MSG_NKINDS] = {k > 0, k < p->K - 1};
    for (int mb = 0; mb < p->M; mb++)
        for (int j = 0; j < GP_MSG_NKINDS; j++) {
            const comm_times *c = &s->ct[mb];
            if (sends[j])
                GP_TRY(gp_trace_add(&p->trace, k, GP_TRACE_WAIT, mb, c->send_b[j], c->send_e[j],
                                    names[0][j]));
            if (recvs[j])
                GP_TRY(gp_trace_add(&p->trace, k, GP_TRACE_WAIT, mb, c->recv_b[j], c->recv_e[j],
                                    names[1][j]));
        }
    return GP_OK;
}

/* One step on this process's stage, on the calling thread (MPI is initialized FUNNELED: only
 * this thread calls it). Every rank gets the global batch; this replica takes its rows. */
gp_status gp_rt_step_processes(gp_pipeline *p, const gp_tensor *x, const gp_tensor *y,
                                float *loss) {
    int64_t B = x->shape.dim[0];
    if (B % ((int64_t)p->D * p->M))
        return gp_error(GP_INVALID_ARGUMENT,
                        "pipeline step: batch %lld is not divisible by %d replicas x %d "
                        "micro-batches",
                        (long long)B, p->D, p->M);
    int d = gp_grid_replica(p->grid), k = gp_grid_stage(p->grid);
    int64_t rows = B / p->D;
    p->xv = gp_rt_batch_slice(x, d * rows, rows);
    p->yv = gp_rt_batch_slice(y, d * rows, rows);
    p->x = &p->xv;
    p->y = &p->yv;
    p->b = rows / p->M;
    p->mb0 = d * p->M;
    double n = (double)gp_count_labels(y); /* the global batch's: replicas' gradients add up */
    p->normalizer = n > 0 ? n : 1;
    stage *s = &p->st[k];
    GP_TRY(gp_model_shape(p->m, s->first - 1, p->b, &s->in_shape));
    GP_TRY(gp_model_shape(p->m, s->last - 1, p->b, &s->out_shape));
    s->status = GP_OK;
    s->msg[0] = '\0';
    p->have_trace = false;
    gp_trace_reset(&p->trace);
    gp_grid_bytes_reset(p->grid);
    double t_start = gp_now();
    gp_rt_stage_main(s);
    p->step_s = gp_now() - t_start;
    if (s->status == GP_OK) s->status = trace_calls(s);
    if (s->status != GP_OK) {
        gp_rt_zero_grads(s);
        return gp_error(s->status, "%s", s->msg);
    }
    if (loss) *loss = (float)s->loss;
    p->step++;
    return GP_OK;
}

void gp_pipeline_place(const gp_pipeline *p, int *rank, int *nranks, int *stage, int *replica) {
    bool g = p && p->grid;
    if (rank) *rank = g ? gp_grid_world_rank(p->grid) : 0;
    if (nranks) *nranks = g ? gp_grid_world_size(p->grid) : 1;
    if (stage) *stage = g ? gp_grid_stage(p->grid) : -1;
    if (replica) *replica = g ? gp_grid_replica(p->grid) : 0;
}

gp_status gp_pipeline_sync_params(gp_pipeline *p) {
    if (!p) return gp_error(GP_INVALID_ARGUMENT, "gp_pipeline_sync_params: pipeline is NULL");
    if (!p->grid) return GP_OK;
    gp_model *m = p->m;
    for (int k = 0; k < p->K; k++)
        for (int li = p->st[k].first; li < p->st[k].last; li++)
            for (int j = 0; j < m->layers[li]->nparams; j++) {
                gp_tensor *v = &m->layers[li]->params[j].value;
                gp_status st = gp_grid_bcast(p->grid, k, v->data, gp_tensor_nbytes(v));
                if (st != GP_OK)
                    return gp_error_context(st, "gp_pipeline_sync_params: layer %d parameter %s",
                                            li, m->layers[li]->params[j].name);
            }
    return GP_OK;
}

gp_status gp_pipeline_bytes_sent(const gp_pipeline *p, uint64_t *p2p, uint64_t *allreduce, int n) {
    if (!p || !p2p || !allreduce)
        return gp_error(GP_INVALID_ARGUMENT, "gp_pipeline_bytes_sent: NULL argument");
    int W = p->grid ? gp_grid_world_size(p->grid) : 1;
    if (n < W)
        return gp_error(GP_INVALID_ARGUMENT, "gp_pipeline_bytes_sent: room for %d ranks, %d needed",
                        n, W);
    for (int r = 0; r < n; r++) {
        p2p[r] = r < W && p->grid ? p->bytes[2 * r] : 0;
        allreduce[r] = r < W && p->grid ? p->bytes[2 * r + 1] : 0;
    }
    return GP_OK;
}

/* What each rank contributes to a gather: its trace origin (CLOCK_MONOTONIC: comparable between
 * the ranks of one host), a host hash, its stage device's counters, then its events. */
typedef struct gather_head {
    double origin;
    uint64_t host;
    gp_mem_stats mem;
    int nevents;
} gather_head;

gp_status gp_pipeline_gather(gp_pipeline *p) {
    if (!p) return gp_error(GP_INVALID_ARGUMENT, "gp_pipeline_gather: pipeline is NULL");
    if (!p->grid) return GP_OK;
    int W = gp_grid_world_size(p->grid), k = gp_grid_stage(p->grid);
    int n = 0;
    const gp_trace_event *ev = gp_trace_events(&p->trace, k, &n);
    size_t nbytes = sizeof(gather_head) + (size_t)n * sizeof *ev;
    char *mine = malloc(nbytes);
    size_t *off = calloc((size_t)W + 1, sizeof *off);
    if (!p->rank_mem) p->rank_mem = calloc((size_t)W, sizeof *p->rank_mem);
    if (!mine || !off || !p->rank_mem) {
        free(mine);
        free(off);
        return gp_error(GP_OUT_OF_MEMORY, "gp_pipeline_gather: cannot allocate %zu bytes", nbytes);
    }
    gather_head h = {.origin = p->trace.origin, .nevents = n};
    char host[256] = "";
    gethostname(host, sizeof host - 1);
    h.host = gp_fnv1a64(GP_FNV1A64_INIT, host, strlen(host));
    gp_device_mem_stats(p->st[k].dev, &h.mem);
    memcpy(mine, &h, sizeof h);
    if (n) memcpy(mine + sizeof h, ev, (size_t)n * sizeof *ev);
    void *all = NULL;
    gp_status s = gp_grid_allgatherv(p->grid, mine, nbytes, &all, off);
    free(mine);
    if (s != GP_OK) {
        free(off);
        return gp_error_context(s, "gp_pipeline_gather");
    }
    /* One host: the monotonic clocks agree, so every track keeps its true offset. Several
     * hosts: each track starts at its own step start (the step began with the previous one's
     * all-reduce, on every rank within its latency). */
    bool one_host = true;
    gather_head h0;
    memcpy(&h0, all, sizeof h0);
    for (int r = 1; r < W; r++) {
        gather_head hr;
        memcpy(&hr, (char *)all + off[r], sizeof hr);
        one_host = one_host && hr.host == h0.host;
    }
    gp_trace_reset(&p->trace);
    for (int r = 0; r < W && s == GP_OK; r++) {
        gather_head hr;
        memcpy(&hr, (char *)all + off[r], sizeof hr);
        p->rank_mem[r] = hr.mem;
        double shift = one_host ? hr.origin - h0.origin : 0;
        for (int i = 0; i < hr.nevents && s == GP_OK; i++) {
            gp_trace_event e;
            memcpy(&e, (char *)all + off[r] + sizeof hr + (size_t)i * sizeof e, sizeof e);
            if (e.t_end < e.t_begin) continue; /* left open by a failure */
            s = gp_trace_add(&p->trace, r, e.kind, e.micro_batch, e.t_begin + shift,
                             e.t_end + shift, e.label);
        }
    }
    free(all);
    free(off);
    if (s == GP_OK) s = gp_rt_simulate_trace(p); /* tracks 0..K-1: replica 0's stages */
    p->have_trace = s == GP_OK;
    return s;
}