/* The GEMM rate of a device through its own kernel table, in its precision: the ceiling a benchmark
 * divides its achieved rate by, measured in the same process with the same library (OpenBLAS
 * on the CPU, cuBLAS on a GPU) the training steps call. */
#include <stdlib.h>
#include <time.h>

#include "core/error.h"
#include "kernels/kernels.h"

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

gp_status gp_device_gemm_rate(gp_device *dev, int64_t n, int reps, double *gflops) {
    if (!dev || !gflops || n < 1 || n > 65536 || reps < 1)
        return gp_error(GP_INVALID_ARGUMENT,
                        "gp_device_gemm_rate: needs a device, 1 <= n <= 65536 and reps >= 1 "
                        "(n %lld, reps %d)", (long long)n, reps);
    gp_tensor t[3] = {{0}};
    float *host = malloc((size_t)(n * n) * sizeof *host);
    gp_status s = host ? GP_OK : gp_error(GP_OUT_OF_MEMORY, "gp_device_gemm_rate: host buffer");
    /* Random operands: a GPU runs constant or zero data measurably faster (less switching). */
    gp_rng_stream r = {.seed = 1, .purpose = GP_RNG_DATA, .a = 0, .b = 0};
    if (s == GP_OK) gp_rng_uniform(&r, 0, host, n * n);
    for (int i = 0; i < 3 && s == GP_OK; i++) {
        s = gp_tensor_alloc(dev, GP_MEM_WORKSPACE, gp_shape2(n, n), GP_F32, &t[i]);
        if (s == GP_OK && i < 2) s = gp_tensor_from_host(&t[i], host, (size_t)(n * n) * sizeof *host);
    }
    const gp_kernels *k = gp_kernels_of(dev);
    double t0 = 0;
    /* One untimed call first: a library's first call sets up (handles, workspaces, kernels). */
    for (int i = 0; i <= reps && s == GP_OK; i++) {
        if (i == 1) {
            s = gp_device_sync(dev);
            t0 = now();
            if (s != GP_OK) break;
        }
        s = k->gemm(dev, false, false, n, n, n, 1.0f, t[0].data, n, t[1].data, n, 0.0f,
                    t[2].data, n);
    }
    if (s == GP_OK) s = gp_device_sync(dev);
    if (s == GP_OK) {
        const double dt = now() - t0;
        *gflops = dt > 0 ? 2.0 * (double)n * (double)n * (double)n * reps / dt * 1e-9 : 0;
    }
    for (int i = 0; i < 3; i++) gp_tensor_release(&t[i]);
    free(host);
    return s == GP_OK ? s : gp_error_context(s, "gp_device_gemm_rate on %s", gp_device_name(dev));
}
