/* NCCL between processes, one GPU each (the calls of kernels/cuda_module.h's gp_nccl_calls):
 * communicators made from a unique id that MPI carried, the grouped exchange and the all-reduce
 * of the data-parallel gradient sum on the device's stream, and messages on a communicator's own
 * stream ordered against the device's by events. Every NCCL and CUDA call is checked and an
 * error names the device, the call and NCCL's words. Only compiled with GP_NCCL. */
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

static gp_status nccl_check(const gp_cuda_ctx *c, ncclResult_t r, const char *call) {
    if (r == ncclSuccess) return GP_OK;
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
        ncclCommDestroy(comm);
        return gp_error(GP_OUT_OF_MEMORY, "device %s: cannot hold an NCCL communicator", c->name);
    }
    n->comm = comm;
    n->ordinal = c->ordinal;
    const gp_status s = gp_cuda_check(
        c, cudaStreamCreateWithFlags(&n->stream, cudaStreamNonBlocking), "cudaStreamCreateWithFlags");
    if (s != GP_OK) {
        ncclCommDestroy(comm);
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
    GP_TRY(nccl_check(c, ncclCommInitRank(&comm, nranks, u, rank), "ncclCommInitRank"));
    return wrap(c, comm, out);
}

static gp_status nccl_comm_split(gp_nccl_comm *parent, gp_device *dev, int color, int key,
                                 gp_nccl_comm **out) {
    *out = NULL;
    gp_status s;
    gp_cuda_ctx *c = gp_cuda_begin(dev, &s);
    if (!c) return s;
    ncclComm_t comm = NULL;
    GP_TRY(nccl_check(c, ncclCommSplit(parent->comm, color < 0 ? NCCL_SPLIT_NOCOLOR : color, key,
                                       &comm, NULL),
                      "ncclCommSplit"));
    return wrap(c, comm, out);
}

static void nccl_comm_free(gp_nccl_comm *n) {
    if (!n) return;
    if (cudaSetDevice(n->ordinal) == cudaSuccess) {
        (void)cudaStreamSynchronize(n->stream);
        (void)cudaStreamDestroy(n->stream);
    }
    ncclCommDestroy(n->comm);
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

static gp_status nccl_send(gp_nccl_comm *n, gp_device *dev, const void *buf, size_t nbytes,
                           int peer, void **sent) {
    *sent = NULL;
    gp_status s;
    gp_cuda_ctx *c = gp_cuda_begin(dev, &s);
    if (!c) return s;
    GP_TRY(order(c, c->stream, n->stream)); /* after the message's producers */
    GP_TRY(nccl_check(c, ncclSend(buf, nbytes, ncclInt8, peer, n->comm, n->stream), "ncclSend"));
    cudaEvent_t e = NULL;
    s = gp_cuda_check(c, cudaEventCreateWithFlags(&e, cudaEventDisableTiming),
                      "cudaEventCreateWithFlags");
    if (s == GP_OK) s = gp_cuda_check(c, cudaEventRecord(e, n->stream), "cudaEventRecord");
    if (s != GP_OK) {
        if (e) (void)cudaEventDestroy(e);
        return s;
    }
    *sent = e;
    return GP_OK;
}

static gp_status nccl_send_done(void *sent, bool *done) {
    *done = true;
    if (!sent) return GP_OK;
    const cudaError_t r = cudaEventQuery((cudaEvent_t)sent);
    if (r == cudaErrorNotReady) {
        *done = false;
        return GP_OK;
    }
    (void)cudaEventDestroy((cudaEvent_t)sent);
    return gp_cuda_check(NULL, r, "cudaEventQuery (an NCCL send)");
}

static gp_status nccl_recv(gp_nccl_comm *n, gp_device *dev, void *buf, size_t nbytes, int peer) {
    gp_status s;
    gp_cuda_ctx *c = gp_cuda_begin(dev, &s);
    if (!c) return s;
    GP_TRY(order(c, c->stream, n->stream)); /* after the buffer's earlier readers */
    GP_TRY(nccl_check(c, ncclRecv(buf, nbytes, ncclInt8, peer, n->comm, n->stream), "ncclRecv"));
    return order(c, n->stream, c->stream); /* before its readers */
}

const gp_nccl_calls gp_cuda_nccl_calls = {
    .unique_id = nccl_unique_id,
    .gpu_uuid = nccl_gpu_uuid,
    .comm_new = nccl_comm_new,
    .comm_split = nccl_comm_split,
    .comm_free = nccl_comm_free,
    .exchange = nccl_exchange,
    .allreduce_f32 = nccl_allreduce_f32,
    .send = nccl_send,
    .send_done = nccl_send_done,
    .recv = nccl_recv,
};
#else
typedef int gp_cuda_nccl_not_built;
#endif
