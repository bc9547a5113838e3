/* The state of one CUDA device and what every file of the CUDA backend shares: making the GPU
 * current, checking CUDA and cuBLAS calls into gpipe's errors (the device, the call, CUDA's own
 * words; never an exit), launching over n elements, pinned host scratch for what comes back to
 * the host, and workspace counted on the device. C and CUDA C++ both include it. */
#ifndef GP_KERNELS_CUDA_CUDA_CONTEXT_H
#define GP_KERNELS_CUDA_CUDA_CONTEXT_H

#include <cublas_v2.h>
#include <cuda_runtime_api.h>
#include <stddef.h>
#include <stdint.h>

#include "gpipe.h"

#ifdef __cplusplus
extern "C" {
#endif

struct gp_kernels;
struct gp_cuda_host;
struct gp_cuda_profile;
struct gp_cuda_lt;

typedef struct gp_cuda_ctx {
    char name[64]; /* the device's name, for messages */
    int ordinal;
    gp_device *dev;      /* the device whose state this is: its bound on waits */
    cudaStream_t stream; /* every kernel, copy and fill of the device, in order */
    cublasHandle_t blas; /* bound to stream */
    void *host;          /* pinned host scratch (gp_cuda_host_scratch) */
    size_t host_cap;
    /* Scratch outgrown, freed with the device: cudaFreeHost waits for the whole GPU, NCCL's
     * kernels on other streams too, whose peers may be waiting for this rank. It doubles, so
     * this many outgrown blocks cannot happen before the address space runs out. */
    void *host_old[64];
    int nhost_old;
    struct gp_cuda_profile *profile; /* GP_CUDA_PROFILE (profile.h); NULL when off */
    /* Shared-memory bytes a block of the fused attention (flash_attention.cu) may use: the GPU's
     * opt-in limit, read once; 0 with GP_CUDA_ATTENTION=gemm (attention through cuBLAS and the
     * softmax kernels even where the fused kernels would fit: the fallback, and the comparison) */
    size_t attention_smem;
    /* cuBLASLt for the bf16 linear forward's bias and residual epilogue (gemm_lt.h); NULL with
     * GP_CUDA_EPILOGUE=prefill (a prefill pass, then cuBLAS with beta 1: the fallback, and the
     * comparison) */
    struct gp_cuda_lt *lt;
} gp_cuda_ctx;

/* Binds the library's calls the module makes (host_calls.c; kernels/cuda_module.h). */
void gp_cuda_bind_host(const struct gp_cuda_host *host);

/* The device's state; makes its GPU current on the calling thread (a stream can only take
 * work from the thread whose current device is its own). NULL with the message set on failure. */
gp_cuda_ctx *gp_cuda_begin(gp_device *dev, gp_status *status);
gp_status gp_cuda_select(gp_cuda_ctx *c);

/* GP_OK for cudaSuccess, else an error "device NAME: CALL failed: CUDA's message (its name)";
 * running out of memory is GP_MEMORY_LIMIT, a missing or unusable GPU GP_UNSUPPORTED. */
gp_status gp_cuda_check(const gp_cuda_ctx *c, cudaError_t e, const char *call);
gp_status gp_cuda_blas_check(const gp_cuda_ctx *c, cublasStatus_t s, const char *call);
/* The same words for a cuBLAS call that queued nothing (a handle, a descriptor, a heuristic),
 * which the profile does not mark. */
gp_status gp_cuda_blas_status(const gp_cuda_ctx *c, cublasStatus_t s, const char *call);
/* After a kernel launch: the launch's own error, if any. */
gp_status gp_cuda_launched(const gp_cuda_ctx *c, const char *kernel);
/* gp_cuda_check of a call that queued work on the stream (a copy, a fill); it and
 * gp_cuda_launched, and gp_cuda_blas_check on success, mark the call for the profile. */
gp_status gp_cuda_queued(const gp_cuda_ctx *c, cudaError_t e, const char *call);
/* Waits for the stream's work (cudaStreamSynchronize), then tells the profile; the device's
 * bound on waits (gp_device_wait_bounded: NCCL's sums on the stream) comes first. */
gp_status gp_cuda_wait(gp_cuda_ctx *c);

/* At least nbytes of pinned host memory, valid until the next call on the device. */
gp_status gp_cuda_host_scratch(gp_cuda_ctx *c, size_t nbytes, void **out);
/* Copies nbytes from the device to host (pinned scratch or any host memory) and waits. */
gp_status gp_cuda_to_host(gp_cuda_ctx *c, void *host, const void *src, size_t nbytes);
/* Copies host memory to the device and waits until the host memory may be reused. */
gp_status gp_cuda_from_host(gp_cuda_ctx *c, void *dst, const void *host, size_t nbytes);

/* Device workspace counted under GP_MEM_WORKSPACE (gp_device_alloc) and its release. A block
 * released while kernels still use it is safe: the device's free (cudaFree) waits for the GPU,
 * and a block handed out again from the cache is used on the same stream, after them. */
void *gp_cuda_workspace(gp_device *dev, size_t nbytes, gp_status *status);
void gp_cuda_workspace_release(gp_device *dev, void *p);

/* Blocks of GP_CUDA_THREADS threads covering n items (at most 2^31 - 1 blocks). */
#define GP_CUDA_THREADS 256
unsigned gp_cuda_blocks(int64_t n);

/* The largest sizes passed to cuBLAS (int), checked: GP_UNSUPPORTED naming the op otherwise. */
gp_status gp_kernels_check_int(const gp_cuda_ctx *c, const char *op, int64_t v, const char *what);

#ifdef __cplusplus
}
#endif

#endif
