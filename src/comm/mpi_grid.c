/* The MPI launcher's process grid (see mpi_grid.h) and the public gp_mpi_* functions; the failure
 * state that every wait polls is in mpi_shared.c. MPI itself is process-wide (one MPI_Init per
 * process), so whether this process initialized it is the only process-wide state here. Built
 * without MPI, every entry point says so. */
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "comm/mpi_grid.h"
#include "core/device.h"

/* Environment variables that launchers set in every rank they start. */
static const char *const LAUNCH_VARS[] = {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_SIZE",
                                          "MPI_LOCALNRANKS"};

bool gp_mpi_launched(int *world_size) {
    for (size_t i = 0; i < sizeof LAUNCH_VARS / sizeof *LAUNCH_VARS; i++) {
        const char *v = getenv(LAUNCH_VARS[i]);
        if (v && *v) {
            if (world_size) *world_size = atoi(v);
            return true;
        }
    }
    if (world_size) *world_size = 1;
    return false;
}

#ifndef GP_HAVE_MPI

bool gp_mpi_built(void) { return false; }

static gp_status not_built(const char *what) {
    return gp_error(GP_UNSUPPORTED,
                    "%s: MPI support was not built (install libopenmpi-dev, or another MPI-3 "
                    "library, and rebuild: cmake finds it with -DGP_MPI=AUTO or ON)",
                    what);
}

gp_status gp_mpi_init(int *rank, int *size) {
    if (rank) *rank = 0;
    if (size) *size = 1;
    return not_built("gp_mpi_init");
}
void gp_mpi_finalize(void) {}
void gp_mpi_abort_job(int code) { (void)code; }
gp_status gp_grid_new(int D, int K, int T, double timeout_s, gp_grid **out) {
    (void)D, (void)K, (void)T, (void)timeout_s;
    *out = NULL;
    return not_built("the MPI launcher");
}
void gp_grid_free(gp_grid *g) { (void)g; }
int gp_grid_world_rank(const gp_grid *g) { return (void)g, 0; }
int gp_grid_world_size(const gp_grid *g) { return (void)g, 1; }
int gp_grid_stage(const gp_grid *g) { return (void)g, 0; }
int gp_grid_replica(const gp_grid *g) { return (void)g, 0; }
int gp_grid_shard(const gp_grid *g) { return (void)g, 0; }
int gp_grid_local_rank(const gp_grid *g) { return (void)g, 0; }
gp_transport *gp_grid_pipe(gp_grid *g) { return (void)g, NULL; }
gp_transport *gp_grid_tensor(gp_grid *g) { return (void)g, NULL; }
gp_transport *gp_grid_world(gp_grid *g) { return (void)g, NULL; }
gp_status gp_grid_grads_start(gp_grid *g, const gp_tensor *slice) {
    (void)g, (void)slice;
    return not_built("gradient all-reduce");
}
gp_status gp_grid_grads_wait(gp_grid *g) { return (void)g, not_built("gradient all-reduce"); }
void gp_grid_set_grad_tree(gp_grid *g, bool tree) { (void)g, (void)tree; }
void gp_grid_set_payload(gp_grid *g, const gp_transport_payload *hook) { (void)g, (void)hook; }
gp_status gp_grid_allgatherv(gp_grid *g, const void *mine, size_t nbytes, void **all,
                             size_t *offsets) {
    (void)g, (void)mine, (void)nbytes, (void)offsets;
    *all = NULL;
    return not_built("gather");
}
void gp_grid_bytes(const gp_grid *g, uint64_t *p2p, uint64_t *allreduce) {
    (void)g;
    *p2p = *allreduce = 0;
}
void gp_grid_bytes_reset(gp_grid *g) { (void)g; }
void gp_grid_count_allreduce(gp_grid *g, uint64_t nbytes) { (void)g, (void)nbytes; }
void gp_grid_abort(gp_grid *g, gp_status s, const char *why) { (void)g, (void)s, (void)why; }
bool gp_grid_failed(gp_grid *g) { return (void)g, false; }
gp_status gp_grid_wait_for(gp_grid *g, gp_grid_poll_fn poll, void *ctx, const char *doing) {
    (void)g, (void)poll, (void)ctx, (void)doing;
    return not_built("wait");
}

#else /* GP_HAVE_MPI */

#include "comm/gpu_comm.h"
#include "comm/mpi_transport.h"

static bool g_we_initialized; /* this library called MPI_Init_thread */

bool gp_mpi_built(void) { return true; }

gp_status gp_mpi_init(int *rank, int *size) {
    int inited = 0, finalized = 0;
    MPI_Initialized(&inited);
    MPI_Finalized(&finalized);
    if (finalized) return gp_error(GP_INVALID_ARGUMENT, "gp_mpi_init: MPI was already finalized");
    if (!inited) {
        /* Stages call MPI from the thread that initialized it only. */
        int provided = 0;
        if (MPI_Init_thread(NULL, NULL, MPI_THREAD_FUNNELED, &provided) != MPI_SUCCESS)
            return gp_error(GP_IO, "gp_mpi_init: MPI_Init_thread failed");
        g_we_initialized = true;
    }
    int r = 0, n = 1;
    MPI_Comm_rank(MPI_COMM_WORLD, &r);
    MPI_Comm_size(MPI_COMM_WORLD, &n);
    if (rank) *rank = r;
    if (size) *size = n;
    return GP_OK;
}

void gp_mpi_finalize(void) {
    int inited = 0, finalized = 0;
    MPI_Initialized(&inited);
    MPI_Finalized(&finalized);
    if (!inited || finalized || !g_we_initialized) return;
    /* After a failure MPI_Finalize would wait for dead peers. */
    if (gp_mpi_shared_failed()) {
        gp_mpi_abort_job(1);
        return;
    }
    MPI_Finalize();
}

void gp_mpi_abort_job(int code) {
    int inited = 0, finalized = 0;
    MPI_Initialized(&inited);
    MPI_Finalized(&finalized);
    fflush(stdout);
    fflush(stderr);
    if (inited && !finalized) MPI_Abort(MPI_COMM_WORLD, code);
}

/* -------------------------------------------------------------------- grid */

/* A gradient bucket being summed over the replicas: MPI_Iallreduce's request, or the exchange
 * with the partner of the current pairwise round (gp_dp_pair_rounds). A bucket in device memory
 * is summed in a host copy (staged), copied back by the wait. Its host buffers are counted as
 * gradients on the bucket's device (gp_device_count_host), as the NCCL path's partner sum is
 * (there in device memory): the limit and the memory report see them. */
typedef struct grad_bucket {
    float *x; /* host: the bucket itself, or staged */
    int64_t n;
    gp_tensor slice;    /* where the bucket lives (a view) */
    MPI_Request req[2]; /* the reduction's, or the round's receive and send */
    int round;
    float *scratch; /* (cap) the partner's partial sum */
    int64_t cap;
    float *staged; /* (staged_cap) the host copy of a bucket in device memory */
    int64_t staged_cap;
    gp_device *counted; /* the device scratch and staged are counted on */
} grad_bucket;

struct gp_grid {
    gp_mpi_shared sh;
    int D, K, T, stage, replica, shard;
    int local_rank; /* among the ranks of this node (MPI_COMM_TYPE_SHARED) */
    MPI_Comm pipe_comm, dp_comm, tp_comm;
    gp_transport *pipe, *world, *tensor;
    grad_bucket *bk; /* (cap_buckets) the buckets in flight (scratch kept for the next step) */
    int nbuckets, cap_buckets;
    bool tree;       /* the replicas' sum in tree order (gp_grid_set_grad_tree) */
};

static void bucket_buffers_free(grad_bucket *bk);

static gp_status mpi_check(int rc, const char *what) {
    if (rc == MPI_SUCCESS) return GP_OK;
    char es[MPI_MAX_ERROR_STRING];
    int len = 0;
    MPI_Error_string(rc, es, &len);
    return gp_error(GP_IO, "%s failed: %s", what, es);
}

gp_status gp_grid_new(int D, int K, int T, double timeout_s, gp_grid **out) {
    *out = NULL;
    if (D < 1 || K < 1 || T < 1)
        return gp_error(GP_INVALID_ARGUMENT, "MPI grid: needs D >= 1 replicas, K >= 1 stages and "
                                             "T >= 1 shards (got %d, %d, %d)", D, K, T);
    int rank, size;
    GP_TRY(gp_mpi_init(&rank, &size));
    if (size != D * K * T && T == 1)
        return gp_error(GP_INVALID_ARGUMENT,
                        "launched with %d MPI rank%s, but --data-parallel %d x --stages %d needs "
                        "D x K = %d ranks (one per replica and stage): start mpirun -np %d",
                        size, size == 1 ? "" : "s", D, K, D * K, D * K);
    if (size != D * K * T)
        return gp_error(GP_INVALID_ARGUMENT,
                        "launched with %d MPI rank%s, but --data-parallel %d x --stages %d x "
                        "--tensor-parallel %d needs D x K x T = %d ranks (one per replica, stage "
                        "and shard): start mpirun -np %d",
                        size, size == 1 ? "" : "s", D, K, T, D * K * T, D * K * T);
    gp_grid *g = calloc(1, sizeof *g);
    if (!g) return gp_error(GP_OUT_OF_MEMORY, "MPI grid: cannot allocate it");
    g->D = D;
    g->K = K;
    g->T = T;
    /* World rank r = (d K + k) T + t: a stage's shards are neighbours, then a replica's stages. */
    g->shard = rank % T;
    g->stage = rank / T % K;
    g->replica = rank / (K * T);
    g->pipe_comm = g->dp_comm = g->tp_comm = MPI_COMM_NULL;
    gp_mpi_shared *sh = &g->sh;
    sh->world = MPI_COMM_NULL;
    sh->world_rank = rank;
    sh->world_size = size;
    sh->timeout_s = timeout_s > 0 ? timeout_s : 60.0;
    sh->abort_rank = -1;
    sh->note_req = calloc((size_t)size, sizeof *sh->note_req);
    sh->note_buf = calloc(1, sizeof(gp_mpi_note));
    gp_status s = sh->note_req && sh->note_buf
                      ? GP_OK
                      : gp_error(GP_OUT_OF_MEMORY, "MPI grid: cannot allocate abort notes");
    for (int r = 0; sh->note_req && r < size; r++) sh->note_req[r] = MPI_REQUEST_NULL;
    if (s == GP_OK) s = mpi_check(MPI_Comm_dup(MPI_COMM_WORLD, &sh->world), "MPI_Comm_dup");
    /* Errors come back as codes, so that a dead peer is a named failure, not MPI's abort. */
    if (s == GP_OK) MPI_Comm_set_errhandler(sh->world, MPI_ERRORS_RETURN);
    if (s == GP_OK) {
        MPI_Comm node = MPI_COMM_NULL;
        s = mpi_check(MPI_Comm_split_type(sh->world, MPI_COMM_TYPE_SHARED, rank, MPI_INFO_NULL,
                                          &node),
                      "MPI_Comm_split_type (the node's ranks)");
        if (s == GP_OK) {
            MPI_Comm_rank(node, &g->local_rank);
            MPI_Comm_free(&node);
        }
    }
    /* One communicator per mesh axis: the ranks that differ in that coordinate alone. */
    if (s == GP_OK)
        s = mpi_check(MPI_Comm_split(sh->world, g->replica * T + g->shard, g->stage, &g->pipe_comm),
                      "MPI_Comm_split (pipeline)");
    if (s == GP_OK)
        s = mpi_check(MPI_Comm_split(sh->world, g->stage * T + g->shard, g->replica, &g->dp_comm),
                      "MPI_Comm_split (data-parallel)");
    if (s == GP_OK)
        s = mpi_check(MPI_Comm_split(sh->world, g->replica * K + g->stage, g->shard, &g->tp_comm),
                      "MPI_Comm_split (tensor-parallel)");
    gp_transport_opts o = {.nranks = K, .capacity = 2, .timeout_s = sh->timeout_s};
    if (s == GP_OK) s = gp_transport_mpi_new(sh, g->pipe_comm, "stage", &o, &g->pipe);
    o.nranks = T;
    if (s == GP_OK) s = gp_transport_mpi_new(sh, g->tp_comm, "shard", &o, &g->tensor);
    o.nranks = size;
    if (s == GP_OK) s = gp_transport_mpi_new(sh, sh->world, "rank", &o, &g->world);
    if (s != GP_OK) {
        gp_grid_free(g);
        return T == 1 ? gp_error_context(s, "MPI grid of %d x %d", D, K)
                      : gp_error_context(s, "MPI grid of %d x %d x %d", D, K, T);
    }
    *out = g;
    return GP_OK;
}

void gp_grid_free(gp_grid *g) {
    if (!g) return;
    gp_transport_free(g->pipe);
    gp_transport_free(g->tensor);
    gp_transport_free(g->world);
    /* An abort note still in flight reads note_buf: it stays (a few hundred bytes) until MPI is
     * done with it, which nothing will report once its request is freed. */
    bool notes_in_flight = false;
    if (g->sh.note_req)
        for (int r = 0; r < g->sh.world_size; r++) {
            int done = 1;
            if (g->sh.note_req[r] != MPI_REQUEST_NULL)
                MPI_Test(&g->sh.note_req[r], &done, MPI_STATUS_IGNORE);
            if (!done) {
                MPI_Request_free(&g->sh.note_req[r]);
                notes_in_flight = true;
            }
        }
    if (g->pipe_comm != MPI_COMM_NULL) MPI_Comm_free(&g->pipe_comm);
    if (g->dp_comm != MPI_COMM_NULL) MPI_Comm_free(&g->dp_comm);
    if (g->tp_comm != MPI_COMM_NULL) MPI_Comm_free(&g->tp_comm);
    if (g->sh.world != MPI_COMM_NULL) MPI_Comm_free(&g->sh.world);
    free(g->sh.note_req);
    if (!notes_in_flight) free(g->sh.note_buf);
    for (int b = 0; b < g->cap_buckets; b++) bucket_buffers_free(&g->bk[b]);
    free(g->bk);
    free(g);
}

int gp_grid_world_rank(const gp_grid *g) { return g->sh.world_rank; }
int gp_grid_world_size(const gp_grid *g) { return g->sh.world_size; }
int gp_grid_stage(const gp_grid *g) { return g->stage; }
int gp_grid_replica(const gp_grid *g) { return g->replica; }
int gp_grid_shard(const gp_grid *g) { return g->shard; }
int gp_grid_local_rank(const gp_grid *g) { return g->local_rank; }
gp_transport *gp_grid_pipe(gp_grid *g) { return g->pipe; }
gp_transport *gp_grid_tensor(gp_grid *g) { return g->tensor; }
gp_transport *gp_grid_world(gp_grid *g) { return g->world; }

static void who(const gp_grid *g, char *buf, size_t n) {
    if (g->T > 1)
        snprintf(buf, n, "rank %d (stage %d shard %d of replica %d)", g->sh.world_rank, g->stage,
                 g->shard, g->replica);
    else
        snprintf(buf, n, "rank %d (stage %d of replica %d)", g->sh.world_rank, g->stage,
                 g->replica);
}

void gp_grid_set_grad_tree(gp_grid *g, bool tree) { g->tree = tree; }

void gp_grid_set_payload(gp_grid *g, const gp_transport_payload *hook) {
    gp_transport_mpi_set_payload(g->pipe, hook);
}

/* Rounds of pairwise exchange (gp_dp_pair_rounds, the NCCL path's too), else 0: the all-reduce. */
static int pair_rounds(const gp_grid *g) { return gp_dp_pair_rounds(g->D, g->tree); }

/* Posts bucket b's exchange with its partner of round b->round: each sends its partial sum and
 * receives the partner's (tag: the round), both then hold the same pair. */
static gp_status pair_round(gp_grid *g, grad_bucket *b) {
    const int partner = gp_dp_partner(g->replica, b->round), tag = b->round, n = (int)b->n;
    gp_status s = mpi_check(MPI_Irecv(b->scratch, n, MPI_FLOAT, partner, tag, g->dp_comm, &b->req[0]),
                            "MPI_Irecv");
    if (s == GP_OK)
        s = mpi_check(MPI_Isend(b->x, n, MPI_FLOAT, partner, tag, g->dp_comm, &b->req[1]),
                      "MPI_Isend");
    return s;
}

/* At least n floats at *buf (cap of them), kept from step to step and counted on bk's device. */
static gp_status bucket_buffer(grad_bucket *bk, float **buf, int64_t *cap, int64_t n,
                               const char *w, int b, const char *what) {
    if (*cap >= n) return GP_OK;
    gp_device_uncount_host(bk->counted, GP_MEM_GRADS, (size_t)*cap * sizeof **buf);
    free(*buf);
    *buf = NULL;
    *cap = 0;
    char why[192];
    snprintf(why, sizeof why, "%s: %s of gradient bucket %d", w, what, b);
    GP_TRY(gp_device_count_host(bk->counted, GP_MEM_GRADS, (size_t)n * sizeof **buf, why));
    if (!(*buf = malloc((size_t)n * sizeof **buf))) {
        gp_device_uncount_host(bk->counted, GP_MEM_GRADS, (size_t)n * sizeof **buf);
        return gp_error(GP_OUT_OF_MEMORY, "%s: cannot allocate %lld floats for %s of gradient "
                                          "bucket %d", w, (long long)n, what, b);
    }
    *cap = n;
    return GP_OK;
}

/* The bucket's host buffers gone, and uncounted on their device. */
static void bucket_buffers_free(grad_bucket *bk) {
    gp_device_uncount_host(bk->counted, GP_MEM_GRADS, (size_t)bk->cap * sizeof *bk->scratch);
    gp_device_uncount_host(bk->counted, GP_MEM_GRADS,
                           (size_t)bk->staged_cap * sizeof *bk->staged);
    free(bk->scratch);
    free(bk->staged);
    bk->scratch = bk->staged = NULL;
    bk->cap = bk->staged_cap = 0;
    bk->counted = NULL;
}

gp_status gp_grid_grads_start(gp_grid *g, const gp_tensor *slice) {
    char w[96];
    who(g, w, sizeof w);
    const int64_t n = gp_tensor_nelem(slice);
    if (slice->dtype != GP_F32 || !slice->data)
        return gp_error(GP_INVALID_ARGUMENT, "%s: gradient bucket of %s at %p (float32 expected)",
                        w, gp_dtype_name(slice->dtype), slice->data);
    if (n < 1 || n > INT_MAX)
        return gp_error(GP_INVALID_ARGUMENT, "%s: gradient bucket of %lld floats (1..%d)", w,
                        (long long)n, INT_MAX);
    if (gp_mpi_shared_poll(&g->sh))
        return gp_mpi_aborted_error(&g->sh, w, "starting the gradient all-reduce");
    if (g->nbuckets == g->cap_buckets) {
        int cap = g->cap_buckets ? 2 * g->cap_buckets : 16;
        grad_bucket *r = realloc(g->bk, (size_t)cap * sizeof *r);
        if (!r) return gp_error(GP_OUT_OF_MEMORY, "%s: cannot track %d gradient buckets", w, cap);
        memset(r + g->cap_buckets, 0, (size_t)(cap - g->cap_buckets) * sizeof *r);
        g->bk = r;
        g->cap_buckets = cap;
    }
    grad_bucket *b = &g->bk[g->nbuckets];
    if (b->counted != slice->dev) bucket_buffers_free(b); /* counted on the slice's device */
    b->counted = slice->dev;
    b->slice = *slice;
    b->x = slice->data;
    b->n = n;
    b->req[0] = b->req[1] = MPI_REQUEST_NULL;
    b->round = 0;
    gp_status s = GP_OK;
    if (!gp_device_is_host(slice->dev)) { /* host staging: MPI reads host memory only */
        s = bucket_buffer(b, &b->staged, &b->staged_cap, n, w, g->nbuckets, "the host copy");
        if (s == GP_OK) s = gp_tensor_to_host(slice, b->staged, (size_t)n * sizeof *b->staged);
        b->x = b->staged;
    }
    if (s == GP_OK && pair_rounds(g) > 0) {
        s = bucket_buffer(b, &b->scratch, &b->cap, n, w, g->nbuckets, "the partner's sum");
        if (s == GP_OK) s = pair_round(g, b);
    } else if (s == GP_OK) {
        s = mpi_check(MPI_Iallreduce(MPI_IN_PLACE, b->x, (int)n, MPI_FLOAT, MPI_SUM, g->dp_comm,
                                     &b->req[0]),
                      "MPI_Iallreduce");
    }
    if (s != GP_OK) {
        gp_error_context(s, "%s: gradient bucket %d", w, g->nbuckets);
        gp_mpi_shared_abort(&g->sh, g->sh.world_rank, s, gp_last_error());
        return s;
    }
    g->nbuckets++;
    g->sh.bytes_allreduce += (uint64_t)n * sizeof(float);
    return GP_OK;
}

/* Bucket b's remaining rounds: after round i replica d holds the sum over its aligned block of
 * 2^(i+1) replicas, the lower half's sum added to the upper's (a commutative pair, so both
 * partners get the same bits), which is the subtree the single-replica sum builds there. */
static gp_status pairs_finish(gp_grid *g, grad_bucket *b, double deadline, const char *w,
                              const char *doing) {
    gp_status s = GP_OK;
    while (s == GP_OK) {
        s = gp_mpi_wait(&g->sh, &b->req[0], deadline, w, doing);
        if (s == GP_OK) s = gp_mpi_wait(&g->sh, &b->req[1], deadline, w, doing);
        if (s != GP_OK) break;
        gp_dp_pair_add(b->x, b->scratch, b->n);
        if (++b->round >= pair_rounds(g)) break;
        s = pair_round(g, b);
    }
    return s;
}

gp_status gp_grid_grads_wait(gp_grid *g) {
    char w[96], doing[160];
    who(g, w, sizeof w);
    double deadline = gp_mpi_deadline(&g->sh);
    gp_status s = GP_OK;
    for (int b = 0; b < g->nbuckets && s == GP_OK; b++) {
        snprintf(doing, sizeof doing,
                 "waiting in the gradient all-reduce (bucket %d of %d) over the %d replicas of "
                 "stage %d%s",
                 b + 1, g->nbuckets, g->D, g->stage, g->T > 1 ? " (this shard)" : "");
        grad_bucket *bk = &g->bk[b];
        s = pair_rounds(g) > 0 ? pairs_finish(g, bk, deadline, w, doing)
                               : gp_mpi_wait(&g->sh, &bk->req[0], deadline, w, doing);
        if (s == GP_OK && bk->x == bk->staged)
            s = gp_tensor_from_host(&bk->slice, bk->staged, (size_t)bk->n * sizeof *bk->staged);
    }
    g->nbuckets = 0;
    return s;
}

gp_status gp_grid_allgatherv(gp_grid *g, const void *mine, size_t nbytes, void **all,
                             size_t *offsets) {
    char w[96];
    who(g, w, sizeof w);
    *all = NULL;
    int W = g->sh.world_size;
    if (nbytes > (size_t)1 << 30)
        return gp_error(GP_INVALID_ARGUMENT, "%s: gather of %zu bytes (at most 1 GiB)", w, nbytes);
    /* counts[W] holds this rank's size: MPI reads it from there, not from the stack. */
    int *counts = calloc((size_t)W + 1, sizeof *counts), *displs = calloc((size_t)W, sizeof *displs);
    if (!counts || !displs) {
        free(counts);
        free(displs);
        return gp_error(GP_OUT_OF_MEMORY, "%s: cannot gather from %d ranks", w, W);
    }
    int me = (int)nbytes;
    counts[W] = me;
    MPI_Request req = MPI_REQUEST_NULL;
    gp_status s = mpi_check(
        MPI_Iallgather(&counts[W], 1, MPI_INT, counts, 1, MPI_INT, g->sh.world, &req),
        "MPI_Iallgather");
    if (s == GP_OK) s = gp_mpi_wait(&g->sh, &req, gp_mpi_deadline(&g->sh), w, "gathering sizes");
    size_t total = 0;
    for (int r = 0; s == GP_OK && r < W; r++) {
        offsets[r] = total;
        displs[r] = (int)total;
        total += (size_t)counts[r];
        if (total > (size_t)1 << 30)
            s = gp_error(GP_INVALID_ARGUMENT, "%s: gather of more than 1 GiB", w);
    }
    if (s == GP_OK) {
        offsets[W] = total;
        *all = malloc(total ? total : 1);
        if (!*all) s = gp_error(GP_OUT_OF_MEMORY, "%s: cannot gather %zu bytes", w, total);
    }
    if (s == GP_OK)
        s = mpi_check(MPI_Iallgatherv(mine, me, MPI_BYTE, *all, counts, displs, MPI_BYTE,
                                      g->sh.world, &req),
                      "MPI_Iallgatherv");
    if (s == GP_OK) s = gp_mpi_wait(&g->sh, &req, gp_mpi_deadline(&g->sh), w, "gathering");
    if (s != GP_OK && req != MPI_REQUEST_NULL) {
        /* A failure left the gather posted (collectives cannot be cancelled): MPI may still
         * write its buffers, so they are not freed; the failed run ends the process. */
        *all = NULL;
        return s;
    }
    free(counts);
    free(displs);
    if (s != GP_OK) {
        free(*all);
        *all = NULL;
    }
    return s;
}

void gp_grid_bytes(const gp_grid *g, uint64_t *p2p, uint64_t *allreduce) {
    *p2p = g->sh.bytes_p2p;
    *allreduce = g->sh.bytes_allreduce;
}

void gp_grid_bytes_reset(gp_grid *g) { g->sh.bytes_p2p = g->sh.bytes_allreduce = 0; }

void gp_grid_count_allreduce(gp_grid *g, uint64_t nbytes) { g->sh.bytes_allreduce += nbytes; }

void gp_grid_abort(gp_grid *g, gp_status s, const char *why) {
    gp_mpi_shared_abort(&g->sh, g->sh.world_rank, s, why);
}

bool gp_grid_failed(gp_grid *g) { return gp_mpi_shared_poll(&g->sh) || gp_mpi_shared_failed(); }

/* A poll whose error aborts the run, as the transport's waits do. */
typedef struct grid_poll {
    gp_grid *g;
    gp_grid_poll_fn poll;
    void *ctx;
} grid_poll;

static gp_status grid_poll_abort(void *ctx, bool *done) {
    grid_poll *gp = ctx;
    const gp_status s = gp->poll(gp->ctx, done);
    if (s != GP_OK) gp_mpi_shared_abort(&gp->g->sh, gp->g->sh.world_rank, s, gp_last_error());
    return s;
}

gp_status gp_grid_wait_for(gp_grid *g, gp_grid_poll_fn poll, void *ctx, const char *doing) {
    char w[96];
    who(g, w, sizeof w);
    grid_poll gp = {g, poll, ctx};
    return gp_mpi_wait_for(&g->sh, grid_poll_abort, &gp, gp_mpi_deadline(&g->sh), w, doing);
}

#endif /* GP_HAVE_MPI */
