/* The CUDA backend's shared helpers (cuda_context.h): errors that name the device, the call and
 * CUDA's message; pinned host scratch; copies that wait; counted workspace. */
#include "kernels/cuda/cuda_context.h"

#include <limits.h>

#include "core/device.h"
#include "core/error.h"
#include "kernels/cuda/profile.h"

gp_status gp_cuda_check(const gp_cuda_ctx *c, cudaError_t e, const char *call) {
    if (e == cudaSuccess) return GP_OK;
    gp_status s = GP_INTERNAL;
    if (e == cudaErrorMemoryAllocation) s = GP_MEMORY_LIMIT;
    if (e == cudaErrorNoDevice || e == cudaErrorInsufficientDriver || e == cudaErrorInvalidDevice)
        s = GP_UNSUPPORTED;
    return gp_error(s, "device %s: %s failed: %s (%s)", c ? c->name : "cuda", call,
                    cudaGetErrorString(e), cudaGetErrorName(e));
}

gp_status gp_cuda_blas_status(const gp_cuda_ctx *c, cublasStatus_t s, const char *call) {
    if (s == CUBLAS_STATUS_SUCCESS) return GP_OK;
    return gp_error(s == CUBLAS_STATUS_ALLOC_FAILED ? GP_MEMORY_LIMIT : GP_INTERNAL,
                    "device %s: %s failed: %s (%s)", c ? c->name : "cuda", call,
                    cublasGetStatusString(s), cublasGetStatusName(s));
}

gp_status gp_cuda_blas_check(const gp_cuda_ctx *c, cublasStatus_t s, const char *call) {
    GP_TRY(gp_cuda_blas_status(c, s, call));
    if (c && c->profile) gp_cuda_profile_mark(c->profile, c->stream, call);
    return GP_OK;
}

gp_status gp_cuda_queued(const gp_cuda_ctx *c, cudaError_t e, const char *call) {
    const gp_status s = gp_cuda_check(c, e, call);
    if (s == GP_OK && c && c->profile) gp_cuda_profile_mark(c->profile, c->stream, call);
    return s;
}

gp_status gp_cuda_launched(const gp_cuda_ctx *c, const char *kernel) {
    return gp_cuda_queued(c, cudaGetLastError(), kernel);
}

gp_status gp_cuda_wait(gp_cuda_ctx *c) {
    if (c->dev) GP_TRY(gp_device_wait_bounded(c->dev, "cudaStreamSynchronize"));
    GP_TRY(gp_cuda_check(c, cudaStreamSynchronize(c->stream), "cudaStreamSynchronize"));
    if (c->profile) gp_cuda_profile_synced(c->profile);
    return GP_OK;
}

gp_status gp_cuda_select(gp_cuda_ctx *c) {
    return gp_cuda_check(c, cudaSetDevice(c->ordinal), "cudaSetDevice");
}

gp_cuda_ctx *gp_cuda_begin(gp_device *dev, gp_status *status) {
    gp_cuda_ctx *c = gp_device_context(dev);
    *status = c ? gp_cuda_select(c)
                : gp_error(GP_INVALID_ARGUMENT, "a CUDA kernel called without its device");
    return *status == GP_OK ? c : NULL;
}

gp_status gp_cuda_host_scratch(gp_cuda_ctx *c, size_t nbytes, void **out) {
    if (nbytes > c->host_cap) {
        size_t cap = c->host_cap ? c->host_cap : 4096;
        while (cap < nbytes) cap *= 2;
        /* The old scratch may still be the target of a copy in flight: kept until the device
         * goes, where no wait is made here. */
        if (c->host && c->nhost_old == (int)(sizeof c->host_old / sizeof *c->host_old))
            return gp_error(GP_INTERNAL, "device %s: pinned scratch outgrown %d times", c->name,
                            c->nhost_old);
        void *h = NULL;
        GP_TRY(gp_cuda_check(c, cudaMallocHost(&h, cap), "cudaMallocHost"));
        if (c->host) c->host_old[c->nhost_old++] = c->host;
        c->host = h;
        c->host_cap = cap;
    }
    *out = c->host;
    return GP_OK;
}

gp_status gp_cuda_to_host(gp_cuda_ctx *c, void *host, const void *src, size_t nbytes) {
    if (!nbytes) return GP_OK;
    GP_TRY(gp_cuda_queued(c, cudaMemcpyAsync(host, src, nbytes, cudaMemcpyDeviceToHost, c->stream),
                          "cudaMemcpyAsync (device to host)"));
    return gp_cuda_wait(c);
}

gp_status gp_cuda_from_host(gp_cuda_ctx *c, void *dst, const void *host, size_t nbytes) {
    if (!nbytes) return GP_OK;
    GP_TRY(gp_cuda_queued(c, cudaMemcpyAsync(dst, host, nbytes, cudaMemcpyHostToDevice, c->stream),
                          "cudaMemcpyAsync (host to device)"));
    /* From pinned memory the copy is still in flight when cudaMemcpyAsync returns. */
    return gp_cuda_wait(c);
}

void *gp_cuda_workspace(gp_device *dev, size_t nbytes, gp_status *status) {
    return gp_device_alloc(dev, GP_MEM_WORKSPACE, nbytes, status);
}

void gp_cuda_workspace_release(gp_device *dev, void *p) { gp_device_release(dev, p); }

unsigned gp_cuda_blocks(int64_t n) {
    const int64_t b = (n + GP_CUDA_THREADS - 1) / GP_CUDA_THREADS;
    return (unsigned)(b < 1 ? 1 : b > INT_MAX ? INT_MAX : b);
}

gp_status gp_kernels_check_int(const gp_cuda_ctx *c, const char *op, int64_t v, const char *what) {
    if (v >= 0 && v <= INT_MAX) return GP_OK;
    return gp_error(GP_UNSUPPORTED, "device %s: %s: %s = %lld is beyond what cuBLAS takes (%d)",
                    c->name, op, what, (long long)v, INT_MAX);
}
