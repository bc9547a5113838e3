/* A stand-in for the CUDA module's NCCL calls (kernels/cuda_module.h, gp_nccl_calls) over MPI on
 * the CPU, which test_gpu_comm loads through GP_CUDA_MODULE so that gpipe's side of NCCL (the
 * choice with the GPUs' identities gathered, the communicators and their splits, the stage
 * messages' payload hook, the pairwise gradient rounds) runs under mpirun without a GPU. Its
 * "GPU memory" is host memory (the test's devices say it is not host memory, as a GPU's is not):
 * a communicator is an MPI communicator, a send MPI_Isend, an exchange MPI_Sendrecv, the
 * all-reduce a gather summed in rank order. Every rank
 * has a GPU of its own unless GP_FAKE_NCCL_SHARED is set (then all share one). It has no CUDA
 * device; gp_fake_nccl_counts says how many calls of each kind the process made. */
#include <mpi.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/cuda_module.h"

#define GP_EXPORT __attribute__((visibility("default")))

static const gp_cuda_host *host;
static long n_send, n_recv, n_exchange, n_allreduce, n_split;

struct gp_nccl_comm {
    MPI_Comm comm;
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
    if (!(*out = malloc(sizeof **out))) return host->error(GP_OUT_OF_MEMORY, "fake NCCL comm");
    (*out)->comm = c;
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
    n_split++;
    MPI_Comm c = MPI_COMM_NULL;
    if (MPI_Comm_split(parent->comm, color < 0 ? MPI_UNDEFINED : color, key, &c) != MPI_SUCCESS)
        return host->error(GP_IO, "fake NCCL: MPI_Comm_split failed");
    return wrap(c, out);
}

static void comm_free(gp_nccl_comm *c) {
    if (!c) return;
    MPI_Comm_free(&c->comm);
    free(c);
}

static gp_status exchange(gp_nccl_comm *c, gp_device *dev, const void *sendbuf, int to,
                          void *recvbuf, int from, size_t nbytes) {
    (void)dev;
    n_exchange++;
    return mpi_ok(MPI_Sendrecv(sendbuf, (int)nbytes, MPI_BYTE, to, 0, recvbuf, (int)nbytes,
                               MPI_BYTE, from, 0, c->comm, MPI_STATUS_IGNORE),
                  "MPI_Sendrecv");
}

/* A ring's order, as NCCL's ring all-reduce adds: ((x0 + x1) + x2) + ..., not the pairwise
 * rounds' tree, so a path that calls it where the rounds belong gives other bits. */
static gp_status allreduce_f32(gp_nccl_comm *c, gp_device *dev, float *x, int64_t n) {
    (void)dev;
    n_allreduce++;
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

static gp_status send(gp_nccl_comm *c, gp_device *dev, const void *buf, size_t nbytes, int peer,
                      void **sent) {
    (void)dev;
    n_send++;
    MPI_Request *req = malloc(sizeof *req);
    if (!req) return host->error(GP_OUT_OF_MEMORY, "fake NCCL send");
    const gp_status s = mpi_ok(MPI_Isend(buf, (int)nbytes, MPI_BYTE, peer, 0, c->comm, req),
                               "MPI_Isend");
    if (s != GP_OK) free(req);
    *sent = s == GP_OK ? req : NULL;
    return s;
}

static gp_status send_done(void *sent, bool *done) {
    int flag = 0;
    const gp_status s = mpi_ok(MPI_Test(sent, &flag, MPI_STATUS_IGNORE), "MPI_Test");
    *done = flag != 0;
    if (*done) free(sent);
    return s;
}

static gp_status recv(gp_nccl_comm *c, gp_device *dev, void *buf, size_t nbytes, int peer) {
    (void)dev;
    n_recv++;
    return mpi_ok(MPI_Recv(buf, (int)nbytes, MPI_BYTE, peer, 0, c->comm, MPI_STATUS_IGNORE),
                  "MPI_Recv");
}

static const gp_nccl_calls calls = {
    .unique_id = unique_id, .gpu_uuid = gpu_uuid, .comm_new = comm_new,
    .comm_split = comm_split, .comm_free = comm_free, .exchange = exchange,
    .allreduce_f32 = allreduce_f32, .send = send, .send_done = send_done, .recv = recv};

static const gp_cuda_module fake = {
    .abi = GP_CUDA_MODULE_ABI, .bind = bind, .device_count = no_gpu, .nccl = &calls};

GP_EXPORT const gp_cuda_module *gp_cuda_module_entry(void) { return &fake; }

GP_EXPORT void gp_fake_nccl_counts(long out[5]) {
    out[0] = n_send, out[1] = n_recv, out[2] = n_exchange, out[3] = n_allreduce, out[4] = n_split;
}
