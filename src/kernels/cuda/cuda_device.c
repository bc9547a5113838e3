/* The CUDA device: GPU memory behind the device interface (cudaMalloc / cudaFree; copies and
 * fills queued on the device's one stream), its state (cuda_context.h) and its kernel table,
 * the functions of this folder's .cu files, given to the library through the module's entry
 * (kernels/cuda_module.h). The wrapper in core/device.c does the accounting, the limit and the
 * cache, as for every device. */
#include <stdlib.h>
#include <string.h>

#include "core/device.h"
#include "core/error.h"
#include "kernels/cuda/cuda_context.h"
#include "kernels/cuda/cuda_kernels.h"
#include "kernels/cuda/gemm_lt.h"
#include "kernels/cuda/nccl.h"
#include "kernels/cuda/profile.h"
#include "kernels/cuda_module.h"

static gp_status cuda_alloc(void *ctx, size_t nbytes, void **ptr) {
    gp_cuda_ctx *c = ctx;
    *ptr = NULL;
    GP_TRY(gp_cuda_select(c));
    /* cudaMalloc aligns to 256 bytes at least: the 64 the interface asks for. */
    return gp_cuda_check(c, cudaMalloc(ptr, nbytes), "cudaMalloc");
}

static void cuda_free(void *ctx, void *ptr) {
    gp_cuda_ctx *c = ctx;
    /* cudaFree waits for the GPU's work, so a block kernels still read can be freed. A failure
     * here has no caller to report to: the memory is lost, and the next call's check says why. */
    if (gp_cuda_select(c) == GP_OK) (void)cudaFree(ptr);
}

static gp_status cuda_copy(void *ctx, void *dst, const void *src, size_t nbytes,
                           gp_copy_kind kind) {
    gp_cuda_ctx *c = ctx;
    GP_TRY(gp_cuda_select(c));
    switch (kind) {
    case GP_COPY_HOST_TO_DEVICE: return gp_cuda_from_host(c, dst, src, nbytes);
    case GP_COPY_DEVICE_TO_HOST: return gp_cuda_to_host(c, dst, src, nbytes);
    case GP_COPY_DEVICE_TO_DEVICE:
        /* Queued behind the kernels that write src, ahead of those that read dst. */
        return gp_cuda_queued(c, cudaMemcpyAsync(dst, src, nbytes, cudaMemcpyDeviceToDevice,
                                                 c->stream),
                              "cudaMemcpyAsync (device to device)");
    }
    return gp_error(GP_INVALID_ARGUMENT, "device %s: unknown copy kind %d", c->name, (int)kind);
}

/* A message between two stage devices: on the receiver's stream after an event of the sender's
 * (the data's producers), and the sender's stream then waits for the copy (its later work may
 * reuse the block), so neither device's host thread waits. The events are destroyed at once:
 * CUDA releases them when they complete. */
static gp_status cuda_copy_peer(void *ctx, void *dst, void *from_ctx, const void *src,
                                size_t nbytes) {
    gp_cuda_ctx *c = ctx, *f = from_ctx;
    cudaEvent_t produced = NULL, copied = NULL;
    GP_TRY(gp_cuda_select(f)); /* an event is recorded on a stream of its own GPU */
    gp_status s = gp_cuda_check(f, cudaEventCreateWithFlags(&produced, cudaEventDisableTiming),
                                "cudaEventCreateWithFlags");
    if (s == GP_OK) s = gp_cuda_check(f, cudaEventRecord(produced, f->stream), "cudaEventRecord");
    if (s == GP_OK) s = gp_cuda_select(c);
    if (s == GP_OK)
        s = gp_cuda_check(c, cudaStreamWaitEvent(c->stream, produced, 0), "cudaStreamWaitEvent");
    if (s == GP_OK)
        s = gp_cuda_queued(c, cudaMemcpyPeerAsync(dst, c->ordinal, src, f->ordinal, nbytes,
                                                  c->stream),
                           "cudaMemcpyPeerAsync (between devices)");
    if (s == GP_OK)
        s = gp_cuda_check(c, cudaEventCreateWithFlags(&copied, cudaEventDisableTiming),
                          "cudaEventCreateWithFlags");
    if (s == GP_OK) s = gp_cuda_check(c, cudaEventRecord(copied, c->stream), "cudaEventRecord");
    if (s == GP_OK)
        s = gp_cuda_check(f, cudaStreamWaitEvent(f->stream, copied, 0), "cudaStreamWaitEvent");
    if (produced) (void)cudaEventDestroy(produced);
    if (copied) (void)cudaEventDestroy(copied);
    return s;
}

static gp_status cuda_fill(void *ctx, void *dst, size_t nbytes, int byte) {
    gp_cuda_ctx *c = ctx;
    GP_TRY(gp_cuda_select(c));
    return gp_cuda_queued(c, cudaMemsetAsync(dst, byte, nbytes, c->stream), "cudaMemsetAsync");
}

static gp_status cuda_sync(void *ctx) {
    gp_cuda_ctx *c = ctx;
    GP_TRY(gp_cuda_select(c));
    return gp_cuda_wait(c);
}

/* Frees what was made; ctx may be partly built (gp_device_cuda_new's failure path). */
static void cuda_destroy(void *ctx) {
    gp_cuda_ctx *c = ctx;
    if (!c) return;
    if (gp_cuda_select(c) == GP_OK) {
        if (c->stream) (void)cudaStreamSynchronize(c->stream);
        gp_cuda_profile_free(c->profile); /* the table, GP_CUDA_PROFILE */
        if (c->blas) (void)cublasDestroy(c->blas);
        gp_cuda_lt_free(c->lt);
        if (c->stream) (void)cudaStreamDestroy(c->stream);
        if (c->host) (void)cudaFreeHost(c->host);
        for (int i = 0; i < c->nhost_old; i++) (void)cudaFreeHost(c->host_old[i]);
    }
    free(c);
}

static const gp_device_iface cuda_iface = {
    .kind = "cuda",
    .host_memory = false,
    .alloc = cuda_alloc,
    .free = cuda_free,
    .copy = cuda_copy,
    .fill = cuda_fill,
    .sync = cuda_sync,
    .copy_peer = cuda_copy_peer,
    .destroy = cuda_destroy,
};

static const gp_kernels cuda_kernels = {
    .name = "cuda",
#define GP_KERNEL_OP(op, ret, params) .op = gp_cuda_##op,
#include "kernels/kernel_ops.def"
#undef GP_KERNEL_OP
};

static gp_status cuda_device_count(int *count) {
    *count = 0;
    int n = 0;
    cudaError_t e = cudaGetDeviceCount(&n);
    if (e != cudaSuccess)
        return gp_error(GP_UNSUPPORTED, "no CUDA GPU available: cudaGetDeviceCount failed: %s (%s)",
                        cudaGetErrorString(e), cudaGetErrorName(e));
    if (n < 1)
        return gp_error(GP_UNSUPPORTED, "no CUDA GPU available: cudaGetDeviceCount found none");
    *count = n;
    return GP_OK;
}

/* The free bytes of a GPU the library has checked is in range: cudaMemGetInfo on it, the
 * calling thread's current device put back after. */
static gp_status cuda_device_memory(int ordinal, size_t *free_bytes) {
    *free_bytes = 0;
    int current = 0;
    cudaError_t e = cudaGetDevice(&current);
    if (e == cudaSuccess) e = cudaSetDevice(ordinal);
    size_t total = 0;
    if (e == cudaSuccess) e = cudaMemGetInfo(free_bytes, &total);
    const cudaError_t back = cudaSetDevice(current);
    if (e == cudaSuccess) e = back;
    if (e != cudaSuccess)
        return gp_error(GP_UNSUPPORTED, "free memory of GPU %d: cudaMemGetInfo failed: %s (%s)",
                        ordinal, cudaGetErrorString(e), cudaGetErrorName(e));
    return GP_OK;
}

/* The library's gp_device_cuda_new has checked out and name. */
static gp_status cuda_device_new(const char *name, int ordinal, gp_device **out) {
    int count;
    gp_status s = cuda_device_count(&count);
    if (s != GP_OK) return gp_error_context(s, "CUDA device %s (GPU %d)", name, ordinal);
    if (ordinal < 0 || ordinal >= count)
        return gp_error(GP_INVALID_ARGUMENT, "CUDA device %s: GPU %d, expected 0 to %d", name,
                        ordinal, count - 1);
    const char *attn = getenv("GP_CUDA_ATTENTION");
    if (attn && *attn && strcmp(attn, "fused") != 0 && strcmp(attn, "gemm") != 0)
        return gp_error(GP_INVALID_ARGUMENT,
                        "CUDA device %s: GP_CUDA_ATTENTION=%s: expected fused (the default: the "
                        "fused kernels where they fit) or gemm (cuBLAS and the softmax kernels)",
                        name, attn);
    const char *epi = getenv("GP_CUDA_EPILOGUE");
    if (epi && *epi && strcmp(epi, "lt") != 0 && strcmp(epi, "prefill") != 0)
        return gp_error(GP_INVALID_ARGUMENT,
                        "CUDA device %s: GP_CUDA_EPILOGUE=%s: expected lt (the default: a bf16 "
                        "linear's bias and residual in cuBLASLt's epilogue) or prefill (a pass "
                        "that writes them first, then cuBLAS)",
                        name, epi);
    gp_cuda_ctx *c = calloc(1, sizeof *c);
    if (!c) return gp_error(GP_OUT_OF_MEMORY, "CUDA device %s: cannot allocate its state", name);
    snprintf(c->name, sizeof c->name, "%s", name);
    c->ordinal = ordinal;
    s = gp_cuda_select(c);
    int optin = 0;
    if (s == GP_OK && !(attn && strcmp(attn, "gemm") == 0)) {
        s = gp_cuda_check(c, cudaDeviceGetAttribute(&optin,
                                                    cudaDevAttrMaxSharedMemoryPerBlockOptin,
                                                    ordinal),
                          "cudaDeviceGetAttribute (shared memory per block)");
        c->attention_smem = optin > 0 ? (size_t)optin : 0;
    }
    if (s == GP_OK)
        s = gp_cuda_check(c, cudaStreamCreateWithFlags(&c->stream, cudaStreamNonBlocking),
                          "cudaStreamCreateWithFlags");
    if (s == GP_OK) s = gp_cuda_blas_check(c, cublasCreate(&c->blas), "cublasCreate");
    if (s == GP_OK) s = gp_cuda_blas_check(c, cublasSetStream(c->blas, c->stream), "cublasSetStream");
    /* fp32 as the CPU computes it: the default math mode never uses TF32 (or other reduced
     * precision) unless asked to, and is said here so that no global default can change it. */
    if (s == GP_OK)
        s = gp_cuda_blas_check(c, cublasSetMathMode(c->blas, CUBLAS_DEFAULT_MATH),
                               "cublasSetMathMode");
    if (s == GP_OK)
        s = gp_cuda_blas_check(c, cublasSetPointerMode(c->blas, CUBLAS_POINTER_MODE_HOST),
                               "cublasSetPointerMode");
    if (s == GP_OK && !(epi && strcmp(epi, "prefill") == 0)) c->lt = gp_cuda_lt_new(c, &s);
    if (s == GP_OK) s = gp_device_new(name, &cuda_iface, c, &cuda_kernels, out);
    if (s != GP_OK) {
        cuda_destroy(c);
        return s;
    }
    c->dev = *out;
    /* After the set-up calls, which are none of the device's work. */
    c->profile = gp_cuda_profile_new(name, ordinal, *out);
    return GP_OK;
}

static const gp_cuda_module cuda_module = {
    .abi = GP_CUDA_MODULE_ABI,
    .bind = gp_cuda_bind_host,
    .device_count = cuda_device_count,
    .device_new = cuda_device_new,
    .device_memory = cuda_device_memory,
    .kernels = &cuda_kernels,
#ifdef GP_HAVE_NCCL
    .nccl = &gp_cuda_nccl_calls,
#endif
};

__attribute__((visibility("default"))) const gp_cuda_module *gp_cuda_module_entry(void) {
    return &cuda_module;
}
