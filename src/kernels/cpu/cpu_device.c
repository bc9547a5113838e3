/* The CPU device: host memory behind the device interface (aligned allocations, memcpy,
 * memset; nothing is queued, so sync has nothing to wait for), its thread pool (the device's
 * context) and its kernel table, the functions of this folder in the variant in use (isa.h). */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "core/device.h"
#include "core/error.h"
#include "kernels/cpu/cpu_device.h"
#include "kernels/cpu/gemm.h"
#include "kernels/cpu/isa.h"
#include "kernels/cpu/pool.h"

static gp_status cpu_alloc(void *ctx, size_t nbytes, void **ptr) {
    (void)ctx;
    *ptr = aligned_alloc(64, nbytes); /* nbytes is a multiple of 64: the wrapper pads */
    if (!*ptr) return gp_error(GP_OUT_OF_MEMORY, "host allocation of %zu bytes failed", nbytes);
    return GP_OK;
}

static void cpu_free(void *ctx, void *ptr) {
    (void)ctx;
    free(ptr);
}

static gp_status cpu_copy(void *ctx, void *dst, const void *src, size_t nbytes,
                          gp_copy_kind kind) {
    (void)ctx, (void)kind; /* host memory either way */
    memmove(dst, src, nbytes);
    return GP_OK;
}

static gp_status cpu_fill(void *ctx, void *dst, size_t nbytes, int byte) {
    (void)ctx;
    memset(dst, byte, nbytes);
    return GP_OK;
}

static gp_status cpu_sync(void *ctx) {
    (void)ctx;
    return GP_OK;
}

static void cpu_destroy(void *ctx) { gp_cpu_pool_free(ctx); }

static const gp_device_iface cpu_iface = {
    .kind = "cpu",
    .host_memory = true,
    .alloc = cpu_alloc,
    .free = cpu_free,
    .copy = cpu_copy,
    .fill = cpu_fill,
    .sync = cpu_sync,
    .destroy = cpu_destroy,
};

const gp_kernels *gp_cpu_kernels(void) { return gp_cpu_isa_active()->kernels; }

static pthread_once_t blas_once = PTHREAD_ONCE_INIT;
static void blas_single_thread(void) { gp_cpu_blas_set_threads(1); }

gp_status gp_device_cpu_new_isa(const char *name, int threads, const gp_cpu_variant *isa,
                                gp_device **out) {
    if (!out)
        return gp_error(GP_INVALID_ARGUMENT, "CPU device %s: out is NULL", name ? name : "cpu");
    *out = NULL;
    if (threads < 1 || threads > GP_CPU_MAX_THREADS)
        return gp_error(GP_INVALID_ARGUMENT,
                        "CPU device %s: %d threads, expected 1 to %d", name ? name : "cpu",
                        threads, GP_CPU_MAX_THREADS);
    /* The device's own threads run every kernel, GEMMs included (each part one BLAS call):
     * OpenBLAS's pool would only spin against them. */
    pthread_once(&blas_once, blas_single_thread);
    gp_cpu_pool *pool;
    GP_TRY(gp_cpu_pool_new(threads, &pool));
    gp_status s = gp_device_new(name ? name : "cpu", &cpu_iface, pool, isa->kernels, out);
    if (s != GP_OK) gp_cpu_pool_free(pool);
    return s;
}

gp_status gp_device_cpu_new_threads(const char *name, int threads, gp_device **out) {
    if (out) *out = NULL;
    /* a GP_CPU_ISA that cannot run fails here, before any kernel could be an illegal
     * instruction */
    GP_TRY(gp_cpu_isa_check());
    return gp_device_cpu_new_isa(name, threads, gp_cpu_isa_active(), out);
}

gp_status gp_device_cpu_new(const char *name, gp_device **out) {
    return gp_device_cpu_new_threads(name, 1, out);
}

int gp_device_threads(const gp_device *dev) {
    return gp_cpu_pool_threads(gp_cpu_pool_of((gp_device *)dev));
}
