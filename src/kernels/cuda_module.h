/* The boundary between the library and the CUDA device's module (libgpipe_cuda.so, built from
 * kernels/cuda/): the one symbol the module exports, and the tables passed each way through it.
 * The library loads the module (kernels/cuda_module.c) the first time a CUDA device is asked
 * for, so that a process that never asks maps neither it nor the CUDA libraries it needs. C and
 * CUDA C++ both include it. */
#ifndef GP_KERNELS_CUDA_MODULE_H
#define GP_KERNELS_CUDA_MODULE_H

#include <stddef.h>

#include "core/device.h"
#include "gpipe.h"

#ifdef __cplusplus
extern "C" {
#endif

struct gp_kernels;

/* NCCL between processes, one GPU each (kernels/cuda/nccl.c, in a module built with GP_NCCL):
 * the calls the MPI launcher makes, so that only the module links libnccl. A communicator
 * (gp_nccl_comm) has a stream of its own on its GPU. */
#define GP_NCCL_ID_BYTES 128 /* ncclUniqueId, which every rank gets from rank 0 (over MPI) */
typedef struct gp_nccl_comm gp_nccl_comm;
typedef struct gp_nccl_calls {
    /* A new ncclUniqueId (rank 0), and the identity of dev's GPU (its UUID): ranks whose
     * identities are equal share a GPU, which NCCL cannot do. */
    gp_status (*unique_id)(unsigned char id[GP_NCCL_ID_BYTES]);
    gp_status (*gpu_uuid)(gp_device *dev, unsigned char uuid[16]);
    /* ncclCommInitRankConfig on dev's GPU; ncclCommSplit of a communicator (color < 0: this
     * rank in no part, *out NULL), collective over parent's ranks. Communicators are
     * non-blocking (ncclConfig_t blocking = 0): a call may return while NCCL is still at work,
     * and the caller polls ready() within its own deadline before the next call on it, so that
     * no wait of NCCL's outlives the run's timeout. */
    gp_status (*comm_new)(gp_device *dev, const unsigned char id[GP_NCCL_ID_BYTES], int nranks,
                          int rank, gp_nccl_comm **out);
    gp_status (*comm_split)(gp_nccl_comm *parent, gp_device *dev, int color, int key,
                            gp_nccl_comm **out);
    /* ncclCommGetAsyncError: *done false while a call is still in progress; an asynchronous
     * error (a peer gone, a network failure) is returned as it is. */
    gp_status (*ready)(gp_nccl_comm *c, bool *done);
    /* After a good run: its work finished, then ncclCommDestroy. */
    void (*comm_free)(gp_nccl_comm *c);
    /* After a failure: ncclCommAbort, which ends the communicator's unmatched operations, and
     * no stream synchronisation (it would wait for a peer that never comes). */
    void (*comm_abort)(gp_nccl_comm *c);
    /* On dev's stream, after its work so far: one grouped send of nbytes at sendbuf to rank `to`
     * and receive from rank `from` into recvbuf (either side absent with a rank < 0). */
    gp_status (*exchange)(gp_nccl_comm *c, gp_device *dev, const void *sendbuf, int to,
                          void *recvbuf, int from, size_t nbytes);
    /* ncclAllReduce (sum) of n floats in place on dev's stream: NCCL's order. */
    gp_status (*allreduce_f32)(gp_nccl_comm *c, gp_device *dev, float *x, int64_t n);
    /* A message on the communicator's own stream, so that links do not wait for each other: the
     * send starts once dev's work so far is done; the receive lands before dev's later work.
     * Each gives *op, an operation op_done() polls (c's asynchronous errors, then an event). */
    gp_status (*send)(gp_nccl_comm *c, gp_device *dev, const void *buf, size_t nbytes, int peer,
                      void **op);
    gp_status (*recv)(gp_nccl_comm *c, gp_device *dev, void *buf, size_t nbytes, int peer,
                      void **op);
    /* *op: dev's work so far (the gradient sums on its stream), with c's errors. */
    gp_status (*mark)(gp_nccl_comm *c, gp_device *dev, void **op);
    /* true once op is done; op is gone once this says done or fails. op_forget: gone without
     * waiting (after an abort). */
    gp_status (*op_done)(void *op, bool *done);
    void (*op_forget)(void *op);
} gp_nccl_calls;

/* The module's one exported function, resolved by name. */
#define GP_CUDA_MODULE_ENTRY "gp_cuda_module_entry"

/* The library's calls the module makes, passed to it rather than linked: a program linked with
 * libgpipe.a exports none of its symbols to a module it loads, and a module with no undefined
 * gpipe symbol links with --no-undefined and cannot bind to another copy of the library. Each
 * is the function of the same name in core/ (error.h, device.h) or gpipe.h. */
typedef struct gp_cuda_host {
    gp_status (*error)(gp_status s, const char *fmt, ...);
    gp_status (*error_context)(gp_status s, const char *fmt, ...);
    void (*abort_)(const char *file, int line, const char *what);
    gp_status (*device_new)(const char *name, const gp_device_iface *iface, void *ctx,
                            const struct gp_kernels *kernels, gp_device **out);
    void *(*device_context)(const gp_device *dev);
    void *(*device_alloc)(gp_device *dev, gp_mem_category cat, size_t nbytes, gp_status *status);
    void (*device_release)(gp_device *dev, void *p);
    gp_precision (*device_precision)(const gp_device *dev);
    gp_status (*device_wait_bounded)(gp_device *dev, const char *what);
} gp_cuda_host;

/* What the module gives. `abi` comes first and stays first in every version, so that the
 * library can read it from any module before it relies on anything else: the version and a
 * hash of the headers both sides share (GP_CUDA_MODULE_ABI, set by the build), and a module
 * whose abi differs from the library's is refused. bind is called once, before anything else,
 * with tables that live as long as the process. */
typedef struct gp_cuda_module {
    const char *abi;
    void (*bind)(const gp_cuda_host *host);
    gp_status (*device_count)(int *count);
    gp_status (*device_new)(const char *name, int ordinal, gp_device **out);
    /* GPU ordinal's free bytes now (cudaMemGetInfo); ordinal in range, checked by the library */
    gp_status (*device_memory)(int ordinal, size_t *free_bytes);
    const struct gp_kernels *kernels;
    const gp_nccl_calls *nccl; /* NULL: the module was built without NCCL (GP_NCCL=OFF) */
} gp_cuda_module;

/* The entry, defined by the module (kernels/cuda/cuda_device.c) and found with dlsym. */
const gp_cuda_module *gp_cuda_module_entry(void);
typedef const gp_cuda_module *(*gp_cuda_module_entry_fn)(void);

/* The library's side (kernels/cuda_module.c): the CUDA kernel table, from the module, which is
 * loaded the first time anything asks for it. */
gp_status gp_cuda_kernels(const struct gp_kernels **table);
/* GPU ordinal's free bytes, from the module (GP_INVALID_ARGUMENT for an ordinal out of range). */
gp_status gp_cuda_memory(int ordinal, uint64_t *available);
/* The module's NCCL calls: GP_UNSUPPORTED naming why where the build has no CUDA or no NCCL. */
gp_status gp_cuda_nccl(const gp_nccl_calls **table);

#ifdef __cplusplus
}
#endif

#endif
