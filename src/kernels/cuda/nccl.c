/* NCCL between processes, one GPU each (the calls of kernels/cuda_module.h's gp_nccl_calls):
 * communicators made from a unique id that MPI carried, the grouped exchange and the all-reduce
 * of the data-parallel gradient sum on the device's stream, and messages on a communicator's own
 * stream ordered against the device's by events. Communicators are non-blocking, so the library
 * bounds every wait for NCCL by its own deadline (ready, op_done) and aborts a communicator
 * after a failure instead of waiting on it. Every NCCL and CUDA call is checked and an error
 * names the device, the call and NCCL's words. Only compiled with GP_NCCL. */
#ifdef GP_HAVE_NCCL
#include <nccl.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "kernels/cuda/cuda_context.h"
#include "kernels/cuda/nccl.h"

_Static_assert(sizeof(ncclUniqueId) == GP_NCCL_ID_BYTES, "ncclUniqueId is GP_NCCL_ID_BYTES");

struct gp_nccl_comm {
    ncclComm_t comm;
    cudaStream_t stream; /* the communicator's messages (send, recv) */
    int ordinal;
};

/* An operation the library polls (op_done): an event and the communicator whose asynchronous
 * errors it also reports. */
typedef struct nccl_op {
    cudaEvent_t event;
    ncclComm_t comm;
} nccl_op;

/* ncclInProgress is no failure on a non-blocking communicator: ready() then waits for it. */
static gp_status nccl_check(const gp_cuda_ctx *c, ncclResult_t r, const char *call) {
    if (r == ncclSuccess || r == ncclInProgress) return GP_OK;
    return gp_error(r == ncclSystemError || r == ncclRemoteError ? GP_IO : GP_INTERNAL,
                    "device %s: %s failed: %s (%s)", c ? c->name : "cuda", call,
                    ncclGetErrorString(r), ncclGetLastError(NULL));
}

static gp_status nccl_unique_id(unsigned char id[GP_NCCL_ID_BYTES]) {
    ncclUniqueId u;
    GP_TRY(nccl_check(NULL, ncclGetUniqueId(&u), "ncclGetUniqueId"));
    memcpy(id, &u, sizeof u);
    return GP_OK;
}

static gp_status nccl_gpu_uuid(gp_device *dev, unsigned char uuid[16]) {
    gp_status s;
    gp_cuda_ctx *c = gp_cuda_begin(dev, &s);
    if (!c) return s;
    struct cudaDeviceProp prop;
    GP_TRY(gp_cuda_check(c, cudaGetDeviceProperties(&prop, c->ordinal), "cudaGetDeviceProperties"));
    memcpy(uuid, prop.uuid.bytes, 16);
    return GP_OK;
}

/* The communicator's state around comm (NULL: nothing), with its stream. */
static gp_status wrap(gp_cuda_ctx *c, ncclComm_t comm, gp_nccl_comm **out) {
    *out = NULL;
    if (!comm) return GP_OK;
    gp_nccl_comm *n = calloc(1, sizeof *n);
    if (!n) {
        ncclCommAbort(comm); /* it may still be in progress */
        return gp_error(GP_OUT_OF_MEMORY, "device %s: cannot hold an NCCL communicator", c->name);
    }
    n->comm = comm;
    n->ordinal = c->ordinal;
    const gp_status s = gp_cuda_check(
        c, cudaStreamCreateWithFlags(&n->stream, cudaStreamNonBlocking), "cudaStreamCreateWithFlags");
    if (s != GP_OK) {
        ncclCommAbort(comm);
        free(n);
        return s;
    }
    *out = n;
    return GP_OK;
}

static gp_status nccl_comm_new(gp_device *dev, const unsigned char id[GP_NCCL_ID_BYTES],
                               int nranks, int rank, gp_nccl_comm **out) {
    *out = NULL;
    gp_status s;
    gp_cuda_ctx *c = gp_cuda_begin(dev, &s);
    if (!c) return s;
    ncclUniqueId u;
    memcpy(&u, id, sizeof u);
    ncclComm_t comm = NULL;
    ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
    cfg.blocking = 0;
    GP_TRY(nccl_check(c, ncclCommInitRankConfig(&comm, nranks, u, rank, &cfg),
                      "ncclCommInitRankConfig"));
    return wrap(c, comm, out);
}

static gp_status nccl_comm_split(gp_nccl_comm *parent, gp_device *dev, int color, int key,
                                 gp_nccl_comm **out) {
    *out = NULL;
    gp_status s;
    gp_cuda_ctx *c = gp_cuda_begin(dev, &s);
    if (!c) return s;
    ncclComm_t comm = NULL;
    ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
    cfg.blocking = 0;
    GP_TRY(nccl_check(c, ncclCommSplit(parent->comm, color < 0 ? NCCL_SPLIT_NOCOLOR : color, key,
                                       &comm, &cfg),
                      "ncclCommSplit"));
    return wrap(c, comm, out);
}

static gp_status async_state(ncclComm_t comm, bool *done) {
    ncclResult_t a = ncclSuccess;
    const ncclResult_t r = ncclCommGetAsyncError(comm, &a);
    *done = r == ncclSuccess && a == ncclSuccess;
    if (r == ncclSuccess && a == ncclInProgress) return GP_OK;
    if (r != ncclSuccess) return nccl_check(NULL, r, "ncclCommGetAsyncError");
    return nccl_check(NULL, a, "an NCCL operation (ncclCommGetAsyncError)");
}

static gp_status nccl_ready(gp_nccl_comm *n, bool *done) { return async_state(n->comm, done); }

static void nccl_comm_free(gp_nccl_comm *n) {
    if (!n) return;
    if (cudaSetDevice(n->ordinal) == cudaSuccess) {
        (void)cudaStreamSynchronize(n->stream);
        (void)cudaStreamDestroy(n->stream);
    }
    ncclCommDestroy(n->comm);
    free(n);
}

static void nccl_comm_abort(gp_nccl_comm *n) {
    if (!n) return;
    ncclCommAbort(n->comm); /* ends its kernels, so the stream can go without a wait */
    if (cudaSetDevice(n->ordinal) == cudaSuccess) (void)cudaStreamDestroy(n->stream);
    free(n);
}

static gp_status nccl_exchange(gp_nccl_comm *n, gp_device *dev, const void *sendbuf, int to,
                               void *recvbuf, int from, size_t nbytes) {
    gp_status s;
    gp_cuda_ctx *c = gp_cuda_begin(dev, &s);
    if (!c) return s;
    GP_TRY(nccl_check(c, ncclGroupStart(), "ncclGroupStart"));
    if (to >= 0)
        s = nccl_check(c, ncclSend(sendbuf, nbytes, ncclInt8, to, n->comm, c->stream), "ncclSend");
    if (s == GP_OK && from >= 0)
        s = nccl_check(c, ncclRecv(recvbuf, nbytes, ncclInt8, from, n->comm, c->stream),
                       "ncclRecv");
    const gp_status e = nccl_check(c, ncclGroupEnd(), "ncclGroupEnd");
    return s != GP_OK ? s : e;
}

static gp_status nccl_allreduce_f32(gp_nccl_comm *n, gp_device *dev, float *x, int64_t count) {
    gp_status s;
    gp_cuda_ctx *c = gp_cuda_begin(dev, &s);
    if (!c) return s;
    return nccl_check(c, ncclAllReduce(x, x, (size_t)count, ncclFloat32, ncclSum, n->comm,
                                       c->stream),
                      "ncclAllReduce");
}

/* An event recorded on `on` that `waiter` then waits for; destroyed at once (CUDA releases it
 * when it completes). */
static gp_status order(gp_cuda_ctx *c, cudaStream_t on, cudaStream_t waiter) {
    cudaEvent_t e = NULL;
    gp_status s = gp_cuda_check(c, cudaEventCreateWithFlags(&e, cudaEventDisableTiming),
                                "cudaEventCreateWithFlags");
    if (s == GP_OK) s = gp_cuda_check(c, cudaEventRecord(e, on), "cudaEventRecord");
    if (s == GP_OK) s = gp_cuda_check(c, cudaStreamWaitEvent(waiter, e, 0), "cudaStreamWaitEvent");
    if (e) (void)cudaEventDestroy(e);
    return s;
}

/* *op: an event recorded on `on` after its work so far, with n's errors. */
static gp_status op_new(gp_cuda_ctx *c, gp_nccl_comm *n, cudaStream_t on, void **op) {
    *op = NULL;
    nccl_op *o = calloc(1, sizeof *o);
    if (!o) return gp_error(GP_OUT_OF_MEMORY, "device %s: cannot hold an NCCL operation", c->name);
    o->comm = n->comm;
    gp_status s = gp_cuda_check(c, cudaEventCreateWithFlags(&o->event, cudaEventDisableTiming),
                                "cudaEventCreateWithFlags");
    if (s == GP_OK) s = gp_cuda_check(c, cudaEventRecord(o->event, on), "cudaEventRecord");
    if (s != GP_OK) {
        if (o->event) (void)cudaEventDestroy(o->event);
        free(o);
        return s;
    }
    *op = o;
    return GP_OK;
}

static void nccl_op_forget(void *op) {
    nccl_op *o = op;
    if (!o) return;
    (void)cudaEventDestroy(o->event);
    free(o);
}

static gp_status nccl_op_done(void *op, bool *done) {
    *done = true;
    nccl_op *o = op;
    if (!o) return GP_OK;
    bool ready = false;
    gp_status s = async_state(o->comm, &ready);
    if (s == GP_OK && ready) {
        const cudaError_t r = cudaEventQuery(o->event);
        if (r == cudaErrorNotReady) ready = false;
        else s = gp_cuda_check(NULL, r, "cudaEventQuery (an NCCL operation)");
    }
    *done = s != GP_OK || ready;
    if (*done) nccl_op_forget(o); /* gone once done or failed: the caller polls it no more */
    return s;
}

static gp_status nccl_send(gp_nccl_comm *n, gp_device *dev, const void *buf, size_t nbytes,
                           int peer, void **op) {
    *op = NULL;
    gp_status s;
    gp_cuda_ctx *c = gp_cuda_begin(dev, &s);
    if (!c) return s;
    GP_TRY(order(c, c->stream, n->stream)); /* after the message's producers */
    GP_TRY(nccl_check(c, ncclSend(buf, nbytes, ncclInt8, peer, n->comm, n->stream), "ncclSend"));
    return op_new(c, n, n->stream, op);
}

static gp_status nccl_recv(gp_nccl_comm *n, gp_device *dev, void *buf, size_t nbytes, int peer,
                           void **op) {
    *op = NULL;
    gp_status s;
    gp_cuda_ctx *c = gp_cuda_begin(dev, &s);
    if (!c) return s;
    GP_TRY(order(c, c->stream, n->stream)); /* after the buffer's earlier readers */
    GP_TRY(nccl_check(c, ncclRecv(buf, nbytes, ncclInt8, peer, n->comm, n->stream), "ncclRecv"));
    GP_TRY(order(c, n->stream, c->stream)); /* before its readers */
    return op_new(c, n, n->stream, op);
}

static gp_status nccl_mark(gp_nccl_comm *n, gp_device *dev, void **op) {
    *op = NULL;
    gp_status s;
    gp_cuda_ctx *c = gp_cuda_begin(dev, &s);
    if (!c) return s;
    return op_new(c, n, c->stream, op);
}

const gp_nccl_calls gp_cuda_nccl_calls = {
    .unique_id = nccl_unique_id,
    .gpu_uuid = nccl_gpu_uuid,
    .comm_new = nccl_comm_new,
    .comm_split = nccl_comm_split,
    .ready = nccl_ready,
    .comm_free = nccl_comm_free,
    .comm_abort = nccl_comm_abort,
    .exchange = nccl_exchange,
    .allreduce_f32 = nccl_allreduce_f32,
    .send = nccl_send,
    .recv = nccl_recv,
    .mark = nccl_mark,
    .op_done = nccl_op_done,
    .op_forget = nccl_op_forget,
};
#else
typedef int gp_cuda_nccl_not_built;
#endif
