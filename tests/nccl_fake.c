/* A stand-in for the CUDA module's NCCL calls (kernels/cuda_module.h, gp_nccl_calls) over MPI on
 * the CPU, which test_gpu_comm loads through GP_CUDA_MODULE so that gpipe's side of NCCL (the
 * choice with the GPUs' identities gathered, the communicators and their splits, the stage
 * messages' payload hook, the pairwise gradient rounds) runs under mpirun without a GPU. Its
 * "GPU memory" is host memory (the test's devices say it is not host memory, as a GPU's is not):
 * a communicator is an MPI communicator, a send MPI_Isend, an exchange MPI_Sendrecv, the
 * all-reduce a gather summed in rank order. Every rank
 * has a GPU of its own unless GP_FAKE_NCCL_SHARED is set (then all share one). It has no CUDA
 * device; gp_fake_nccl_counts says how many calls of each kind the process made.
 * GP_FAKE_NCCL_FAIL=what:rank makes world rank `rank` fail as NCCL can: "send" (its first send
 * returns an error), "lose" (its sends say they are done but never arrive: the peer's receive
 * never completes, as when a rank hangs), "async" (once it has sent or exchanged, op_done
 * reports an asynchronous error, as ncclCommGetAsyncError does for a failed peer), "split"
 * (its first split fails, the others having begun theirs) or "join" (it never joins a
 * collective: its first exchange or all-reduce blocks for good, as a rank frozen mid-backward;
 * on every other rank the exchanges and all-reduces are queued but never complete, as NCCL's
 * wait on the device for a peer that never comes). A stream holding such a collective is
 * "stuck": its marks never complete, and gp_fake_nccl_stream_wait (which the test's device
 * calls from its sync and copies, as CUDA's cudaStreamSynchronize waits for the stream) blocks
 * until the communicator is aborted (ncclCommAbort ends the collective). */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "kernels/cuda_module.h"

#define GP_EXPORT __attribute__((visibility("default")))

static const gp_cuda_host *host;
static long n_send, n_recv, n_exchange, n_allreduce, n_split, n_abort, n_free;
static volatile int stuck; /* "join": a collective queued on this rank's stream never completes */

/* The failure GP_FAKE_NCCL_FAIL asks of this rank ("" where none); *other: a peer's. */
static const char *injected_of(bool other) {
    static char mine[16], peers[16];
    static int known;
    if (!known) {
        known = 1;
        const char *e = getenv("GP_FAKE_NCCL_FAIL");
        int r = -1, me = 0;
        char w[16] = "";
        MPI_Comm_rank(MPI_COMM_WORLD, &me);
        if (e && sscanf(e, "%15[a-z]:%d", w, &r) == 2) memcpy(r == me ? mine : peers, w, sizeof w);
    }
    return other ? peers : mine;
}
static const char *injected(void) { return injected_of(false); }

/* "join": true where the collective is left queued on this rank (a peer never joins); the rank
 * that never joins blocks here for good. */
static bool never_joined(void) {
    if (!strcmp(injected(), "join"))
        for (;;) pause(); /* frozen: ended by a peer's MPI_Abort, or mpirun's limit */
    if (strcmp(injected_of(true), "join") != 0) return false;
    stuck = 1;
    return true;
}

/* "async": the communicators' state once this rank has moved a payload. */
static gp_status async_error(void) {
    if (strcmp(injected(), "async") != 0 || n_send + n_exchange == 0) return GP_OK;
    return host->error(GP_IO, "fake NCCL: ncclCommGetAsyncError: remote process exited (injected)");
}

/* A message or a mark: done when its request is (MPI_REQUEST_NULL: at once). */
typedef struct fake_op {
    MPI_Request req;
    int stuck; /* a mark behind a stuck collective: not done while the stream is stuck */
} fake_op;

/* A split is non-blocking, as NCCL's on a non-blocking communicator: the parent all-gathers
 * every rank's (color, key) (split_req), and ready() then makes the part (MPI_Comm_create_group
 * over the ranks of this color, which have all posted the gather), so a rank that fails before
 * its split leaves the others polling, not blocked in MPI. */
struct gp_nccl_comm {
    MPI_Comm comm;                 /* MPI_COMM_NULL while its split is unfinished */
    struct gp_nccl_comm *parent;   /* while unfinished: the parent whose gather makes it */
    MPI_Request split_req;         /* a split of this communicator in progress */
    int split_mine[2], *split_all; /* (color, key): this rank's, every rank's */
    struct gp_nccl_comm *split_part; /* what that split makes here (NULL: no color) */
};

static void bind(const gp_cuda_host *h) { host = h; }

static gp_status no_gpu(int *count) {
    *count = 0;
    return host->error(GP_UNSUPPORTED, "the fake NCCL module has no GPU");
}

static gp_status mpi_ok(int rc, const char *call) {
    return rc == MPI_SUCCESS ? GP_OK : host->error(GP_IO, "fake NCCL: %s failed", call);
}

static gp_status unique_id(unsigned char id[GP_NCCL_ID_BYTES]) {
    memset(id, 0x5a, GP_NCCL_ID_BYTES);
    return GP_OK;
}

static gp_status gpu_uuid(gp_device *dev, unsigned char uuid[16]) {
    (void)dev;
    int r = 0;
    MPI_Comm_rank(MPI_COMM_WORLD, &r);
    memset(uuid, 0, 16);
    if (!getenv("GP_FAKE_NCCL_SHARED")) memcpy(uuid, &r, sizeof r);
    return GP_OK;
}

static gp_status wrap(MPI_Comm c, gp_nccl_comm **out) {
    *out = NULL;
    if (c == MPI_COMM_NULL) return GP_OK;
    if (!(*out = calloc(1, sizeof **out))) return host->error(GP_OUT_OF_MEMORY, "fake NCCL comm");
    (*out)->comm = c;
    (*out)->split_req = MPI_REQUEST_NULL;
    return GP_OK;
}

static gp_status comm_new(gp_device *dev, const unsigned char id[GP_NCCL_ID_BYTES], int nranks,
                          int rank, gp_nccl_comm **out) {
    (void)dev;
    int r = -1, n = 0;
    MPI_Comm_rank(MPI_COMM_WORLD, &r);
    MPI_Comm_size(MPI_COMM_WORLD, &n);
    if (id[0] != 0x5a || n != nranks || r != rank)
        return host->error(GP_INTERNAL, "fake NCCL: rank %d of %d given id %#x, rank %d of %d", r,
                           n, id[0], rank, nranks);
    MPI_Comm c;
    if (MPI_Comm_dup(MPI_COMM_WORLD, &c) != MPI_SUCCESS)
        return host->error(GP_IO, "fake NCCL: MPI_Comm_dup failed");
    return wrap(c, out);
}

static gp_status comm_split(gp_nccl_comm *parent, gp_device *dev, int color, int key,
                            gp_nccl_comm **out) {
    (void)dev;
    *out = NULL;
    if (!strcmp(injected(), "split"))
        return host->error(GP_IO, "fake NCCL: ncclCommSplit failed (injected)");
    n_split++;
    int size = 1;
    MPI_Comm_size(parent->comm, &size);
    parent->split_all = malloc(2 * (size_t)size * sizeof *parent->split_all);
    if (!parent->split_all) return host->error(GP_OUT_OF_MEMORY, "fake NCCL split");
    parent->split_mine[0] = color, parent->split_mine[1] = key;
    parent->split_part = NULL;
    if (color >= 0) {
        if (!(parent->split_part = calloc(1, sizeof *parent->split_part)))
            return host->error(GP_OUT_OF_MEMORY, "fake NCCL comm");
        parent->split_part->comm = MPI_COMM_NULL;
        parent->split_part->split_req = MPI_REQUEST_NULL;
        parent->split_part->parent = parent;
    }
    *out = parent->split_part;
    return mpi_ok(MPI_Iallgather(parent->split_mine, 2, MPI_INT, parent->split_all, 2, MPI_INT,
                                 parent->comm, &parent->split_req),
                  "MPI_Iallgather");
}

/* The part of parent's finished split: its color's ranks ordered by key, then parent rank. */
static gp_status make_part(gp_nccl_comm *parent) {
    gp_nccl_comm *part = parent->split_part;
    int size = 1;
    MPI_Comm_size(parent->comm, &size);
    int *ranks = malloc((size_t)size * sizeof *ranks), n = 0;
    if (!ranks) return host->error(GP_OUT_OF_MEMORY, "fake NCCL split");
    const int *all = parent->split_all;
    for (int r = 0; r < size; r++)
        if (all[2 * r] == parent->split_mine[0]) {
            int at = n++;
            while (at > 0 && all[2 * ranks[at - 1] + 1] > all[2 * r + 1]) ranks[at] = ranks[at - 1], at--;
            ranks[at] = r;
        }
    MPI_Group g, mine;
    MPI_Comm_group(parent->comm, &g);
    MPI_Group_incl(g, n, ranks, &mine);
    const gp_status s = mpi_ok(MPI_Comm_create_group(parent->comm, mine, 0, &part->comm),
                               "MPI_Comm_create_group");
    MPI_Group_free(&mine);
    MPI_Group_free(&g);
    free(ranks);
    part->parent = NULL;
    return s;
}

/* Calls other than a split are done when they return. (The asynchronous error shows in op_done
 * only: its exchange
 * is MPI_Sendrecv, which would leave a partner that failed between two exchanges waiting in
 * MPI, where NCCL's would be queued.) */
static gp_status ready(gp_nccl_comm *c, bool *done) {
    *done = true;
    gp_nccl_comm *p = c->parent ? c->parent : c; /* a part waits for its parent's split */
    if (p->split_req == MPI_REQUEST_NULL) return GP_OK;
    int flag = 0;
    if (MPI_Test(&p->split_req, &flag, MPI_STATUS_IGNORE) != MPI_SUCCESS)
        return host->error(GP_IO, "fake NCCL: MPI_Test (a split) failed");
    *done = flag != 0;
    if (!flag) return GP_OK;
    const gp_status s = p->split_part ? make_part(p) : GP_OK;
    free(p->split_all);
    p->split_all = NULL;
    return s;
}

static void comm_free(gp_nccl_comm *c) {
    if (!c) return;
    n_free++;
    if (c->comm != MPI_COMM_NULL) MPI_Comm_free(&c->comm);
    free(c->split_all);
    free(c);
}

/* No MPI call: a failed run ends in MPI_Abort, and its peers may never match anything. Ends a
 * stuck collective, as ncclCommAbort ends NCCL's kernels. */
static void comm_abort(gp_nccl_comm *c) {
    if (!c) return;
    n_abort++;
    stuck = 0;
    if (c->split_req == MPI_REQUEST_NULL) free(c->split_all); /* else MPI may still write it */
    free(c);
}

static gp_status exchange(gp_nccl_comm *c, gp_device *dev, const void *sendbuf, int to,
                          void *recvbuf, int from, size_t nbytes) {
    (void)dev;
    n_exchange++;
    if (never_joined()) return GP_OK;
    return mpi_ok(MPI_Sendrecv(sendbuf, (int)nbytes, MPI_BYTE, to, 0, recvbuf, (int)nbytes,
                               MPI_BYTE, from, 0, c->comm, MPI_STATUS_IGNORE),
                  "MPI_Sendrecv");
}

/* A ring's order, as NCCL's ring all-reduce adds: ((x0 + x1) + x2) + ..., not the pairwise
 * rounds' tree, so a path that calls it where the rounds belong gives other bits. */
static gp_status allreduce_f32(gp_nccl_comm *c, gp_device *dev, float *x, int64_t n) {
    (void)dev;
    n_allreduce++;
    if (never_joined()) return GP_OK;
    int size = 1;
    MPI_Comm_size(c->comm, &size);
    float *all = malloc((size_t)size * (size_t)n * sizeof *all);
    if (!all) return host->error(GP_OUT_OF_MEMORY, "fake NCCL all-reduce");
    const gp_status s = mpi_ok(MPI_Allgather(x, (int)n, MPI_FLOAT, all, (int)n, MPI_FLOAT, c->comm),
                               "MPI_Allgather");
    for (int64_t i = 0; s == GP_OK && i < n; i++) {
        float acc = all[i];
        for (int r = 1; r < size; r++) acc += all[(size_t)r * (size_t)n + (size_t)i];
        x[i] = acc;
    }
    free(all);
    return s;
}

static gp_status op_new(void **op) {
    fake_op *o = malloc(sizeof *o);
    if (!o) return host->error(GP_OUT_OF_MEMORY, "fake NCCL operation");
    o->req = MPI_REQUEST_NULL;
    o->stuck = 0;
    *op = o;
    return GP_OK;
}

static void op_forget(void *op) {
    fake_op *o = op;
    if (!o) return;
    if (o->req != MPI_REQUEST_NULL) MPI_Request_free(&o->req);
    free(o);
}

static gp_status op_done(void *op, bool *done) {
    int flag = 0;
    gp_status s = async_error();
    if (s == GP_OK) s = mpi_ok(MPI_Test(&((fake_op *)op)->req, &flag, MPI_STATUS_IGNORE), "MPI_Test");
    if (((fake_op *)op)->stuck && stuck) flag = 0;
    *done = s != GP_OK || flag;
    if (*done) op_forget(op);
    return s;
}

static gp_status send(gp_nccl_comm *c, gp_device *dev, const void *buf, size_t nbytes, int peer,
                      void **op) {
    (void)dev;
    *op = NULL;
    if (!strcmp(injected(), "send"))
        return host->error(GP_IO, "fake NCCL: ncclSend failed (injected)");
    n_send++;
    if (op_new(op) != GP_OK) return GP_OUT_OF_MEMORY;
    if (!strcmp(injected(), "lose")) return GP_OK; /* done at once, never arrives */
    const gp_status s = mpi_ok(MPI_Isend(buf, (int)nbytes, MPI_BYTE, peer, 0, c->comm,
                                         &((fake_op *)*op)->req),
                               "MPI_Isend");
    if (s != GP_OK) op_forget(*op), *op = NULL;
    return s;
}

static gp_status recv(gp_nccl_comm *c, gp_device *dev, void *buf, size_t nbytes, int peer,
                      void **op) {
    (void)dev;
    *op = NULL;
    n_recv++;
    if (op_new(op) != GP_OK) return GP_OUT_OF_MEMORY;
    const gp_status s = mpi_ok(MPI_Irecv(buf, (int)nbytes, MPI_BYTE, peer, 0, c->comm,
                                         &((fake_op *)*op)->req),
                               "MPI_Irecv");
    if (s != GP_OK) op_forget(*op), *op = NULL;
    return s;
}

/* The exchanges and all-reduces are done when they return: the mark has nothing to wait for,
 * unless one is stuck ("join"): then it is never done. */
static gp_status mark(gp_nccl_comm *c, gp_device *dev, void **op) {
    (void)c, (void)dev;
    if (op_new(op) != GP_OK) return GP_OUT_OF_MEMORY;
    ((fake_op *)*op)->stuck = stuck;
    return GP_OK;
}

static const gp_nccl_calls calls = {
    .unique_id = unique_id, .gpu_uuid = gpu_uuid, .comm_new = comm_new,
    .comm_split = comm_split, .ready = ready, .comm_free = comm_free, .comm_abort = comm_abort,
    .exchange = exchange, .allreduce_f32 = allreduce_f32, .send = send, .recv = recv,
    .mark = mark, .op_done = op_done, .op_forget = op_forget};

static const gp_cuda_module fake = {
    .abi = GP_CUDA_MODULE_ABI, .bind = bind, .device_count = no_gpu, .nccl = &calls};

GP_EXPORT const gp_cuda_module *gp_cuda_module_entry(void) { return &fake; }

/* The host's wait for the stream, as cudaStreamSynchronize: for good behind a stuck collective
 * (until an abort ends it). */
GP_EXPORT void gp_fake_nccl_stream_wait(void) {
    while (stuck) sleep(1);
}

GP_EXPORT void gp_fake_nccl_counts(long out[7]) {
    out[0] = n_send, out[1] = n_recv, out[2] = n_exchange, out[3] = n_allreduce, out[4] = n_split;
    out[5] = n_abort, out[6] = n_free;
}
