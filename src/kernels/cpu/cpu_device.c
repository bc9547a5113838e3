/* The CPU device: host memory behind the device interface (aligned allocations, memcpy,
 * memset; nothing is queued, so sync has nothing to wait for), its thread pool (the device's
 * context) and its kernel table, the functions of this folder. */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "core/device.h"
#include "core/error.h"
#include "kernels/cpu/cpu_kernels.h"
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

static const gp_kernels cpu_kernels = {
    .name = "cpu",
    .gemm = gp_cpu_gemm,
    .gemm_batched = gp_cpu_gemm_batched,
    .fill = gp_cpu_fill,
    .scale = gp_cpu_scale,
    .axpy = gp_cpu_axpy,
    .sum_rows_add = gp_cpu_sum_rows_add,
    .sumsq = gp_cpu_sumsq,
    .linear_forward = gp_cpu_linear_forward,
    .linear_backward = gp_cpu_linear_backward,
    .layernorm_forward = gp_cpu_layernorm_forward,
    .layernorm_backward = gp_cpu_layernorm_backward,
    .gelu_forward = gp_cpu_gelu_forward,
    .gelu_backward = gp_cpu_gelu_backward,
    .dropout = gp_cpu_dropout,
    .attention_forward = gp_cpu_attention_forward,
    .attention_backward_ws = gp_cpu_attention_backward_ws,
    .attention_backward = gp_cpu_attention_backward,
    .embedding_forward = gp_cpu_embedding_forward,
    .embedding_backward = gp_cpu_embedding_backward,
    .pos_embedding_forward = gp_cpu_pos_embedding_forward,
    .pos_embedding_backward = gp_cpu_pos_embedding_backward,
    .softmax_xent = gp_cpu_softmax_xent,
    .conv2d_ws = gp_cpu_conv2d_ws,
    .conv2d_forward = gp_cpu_conv2d_forward,
    .conv2d_backward = gp_cpu_conv2d_backward,
    .channel_bias_add = gp_cpu_channel_bias_add,
    .channel_bias_grad = gp_cpu_channel_bias_grad,
    .batchnorm_forward = gp_cpu_batchnorm_forward,
    .batchnorm_backward = gp_cpu_batchnorm_backward,
    .relu_forward = gp_cpu_relu_forward,
    .relu_backward = gp_cpu_relu_backward,
    .maxpool_forward = gp_cpu_maxpool_forward,
    .maxpool_backward = gp_cpu_maxpool_backward,
    .avgpool_forward = gp_cpu_avgpool_forward,
    .avgpool_backward = gp_cpu_avgpool_backward,
    .sgd_update = gp_cpu_sgd_update,
    .adamw_update = gp_cpu_adamw_update,
    .embedding_shard_forward = gp_cpu_embedding_shard_forward,
    .embedding_shard_backward = gp_cpu_embedding_shard_backward,
    .row_max = gp_cpu_row_max,
    .xent_shard_sums = gp_cpu_xent_shard_sums,
    .xent_shard_finish = gp_cpu_xent_shard_finish,
};

const gp_kernels *gp_cpu_kernels(void) { return &cpu_kernels; }

static pthread_once_t blas_once = PTHREAD_ONCE_INIT;
static void blas_single_thread(void) { gp_cpu_blas_set_threads(1); }

gp_status gp_device_cpu_new_threads(const char *name, int threads, gp_device **out) {
    if (!out) return gp_error(GP_INVALID_ARGUMENT, "gp_device_cpu_new_threads: out is NULL");
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
    gp_status s = gp_device_new(name ? name : "cpu", &cpu_iface, pool, &cpu_kernels, out);
    if (s != GP_OK) gp_cpu_pool_free(pool);
    return s;
}

gp_status gp_device_cpu_new(const char *name, gp_device **out) {
    return gp_device_cpu_new_threads(name, 1, out);
}

int gp_device_threads(const gp_device *dev) {
    return gp_cpu_pool_threads(gp_cpu_pool_of((gp_device *)dev));
}
