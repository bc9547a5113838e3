// The ways a bf16-operand GEMM with fp32 data can run on a GPU, timed on T3's shapes: (1) round
// both operands into bf16 copies, then cuBLAS's bf16 GEMM (what the CUDA device does), (2) the
// fp32 operands straight to cuBLAS with CUBLAS_COMPUTE_32F_FAST_16BF (the library converts
// inside its kernels), (3) the bf16 GEMM alone on operands rounded beforehand: the rate bf16
// storage would reach, the ceiling of the other two. Also how far (2)'s results lie from (1)'s:
// whether the library rounds as core/bf16.h does (to nearest, ties to even). One JSON object on
// stdout; bench/gpu/run.sh puts it in its summary.
//
//   gp_gemm_paths [--reps N]
#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define CHECK_CUDA(x)                                                                        \
    do {                                                                                     \
        cudaError_t e_ = (x);                                                                \
        if (e_ != cudaSuccess) {                                                             \
            fprintf(stderr, "gp_gemm_paths: %s: %s\n", #x, cudaGetErrorString(e_));          \
            exit(1);                                                                         \
        }                                                                                    \
    } while (0)
#define CHECK_BLAS(x)                                                                        \
    do {                                                                                     \
        cublasStatus_t s_ = (x);                                                             \
        if (s_ != CUBLAS_STATUS_SUCCESS) {                                                   \
            fprintf(stderr, "gp_gemm_paths: %s: cuBLAS status %d\n", #x, (int)s_);           \
            exit(1);                                                                         \
        }                                                                                    \
    } while (0)

static __global__ void round_kernel(const float4 *x, __nv_bfloat162 *y, int64_t n4) {
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n4;
         i += (int64_t)blockDim.x * gridDim.x) {
        const float4 v = x[i];
        y[2 * i] = __floats2bfloat162_rn(v.x, v.y);
        y[2 * i + 1] = __floats2bfloat162_rn(v.z, v.w);
    }
}

static __global__ void fill_kernel(float *x, int64_t n, uint32_t seed) {
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (int64_t)blockDim.x * gridDim.x) {
        uint32_t h = (uint32_t)i * 2654435761u ^ seed;
        h ^= h >> 15, h *= 2246822519u, h ^= h >> 13;
        x[i] = (float)(h >> 8) * (2.0f / 16777216.0f) - 1.0f;
    }
}

typedef struct shape {
    const char *name;
    int m, n, k; // column-major C (m x n) = A (m x k) B (k x n)
} shape;

static void round_into(cudaStream_t st, const float *x, __nv_bfloat16 *y, int64_t n) {
    const int64_t n4 = n / 4; // every size here is a multiple of 4
    round_kernel<<<(unsigned)((n4 + 255) / 256), 256, 0, st>>>((const float4 *)x,
                                                               (__nv_bfloat162 *)y, n4);
    CHECK_CUDA(cudaGetLastError());
}

int main(int argc, char **argv) {
    int reps = 10;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--reps") == 0 && i + 1 < argc && atoi(argv[i + 1]) > 0) {
            reps = atoi(argv[++i]);
        } else {
            fprintf(stderr, "usage: gp_gemm_paths [--reps N] (N >= 1)\n");
            return 2;
        }
    }
    static const shape shapes[] = {
        {"square 4096", 4096, 4096, 4096},
        {"T3 qkv forward (8192 tokens x 2048 -> 6144)", 6144, 8192, 2048},
        {"T3 ff1 forward (2048 -> 8192)", 8192, 8192, 2048},
        {"T3 ff2 forward (8192 -> 2048)", 2048, 8192, 8192},
    };
    cudaDeviceProp prop;
    CHECK_CUDA(cudaGetDeviceProperties(&prop, 0));
    cudaStream_t st;
    CHECK_CUDA(cudaStreamCreate(&st));
    cublasHandle_t h;
    CHECK_BLAS(cublasCreate(&h));
    CHECK_BLAS(cublasSetStream(h, st));
    cudaEvent_t e0, e1;
    CHECK_CUDA(cudaEventCreate(&e0));
    CHECK_CUDA(cudaEventCreate(&e1));
    printf("{\"gpu\": \"%s\", \"reps\": %d, \"rows\": [", prop.name, reps);
    for (size_t si = 0; si < sizeof shapes / sizeof shapes[0]; si++) {
        const shape s = shapes[si];
        const int64_t na = (int64_t)s.m * s.k, nb = (int64_t)s.k * s.n, nc = (int64_t)s.m * s.n;
        float *a, *b, *c1, *c2;
        __nv_bfloat16 *a16, *b16;
        CHECK_CUDA(cudaMalloc(&a, na * 4));
        CHECK_CUDA(cudaMalloc(&b, nb * 4));
        CHECK_CUDA(cudaMalloc(&c1, nc * 4));
        CHECK_CUDA(cudaMalloc(&c2, nc * 4));
        CHECK_CUDA(cudaMalloc(&a16, na * 2));
        CHECK_CUDA(cudaMalloc(&b16, nb * 2));
        fill_kernel<<<1024, 256, 0, st>>>(a, na, 1u);
        fill_kernel<<<1024, 256, 0, st>>>(b, nb, 2u);
        const float one = 1.0f, zero = 0.0f;
        double ms[3];
        for (int path = 0; path < 3; path++) {
            float *c = path == 1 ? c2 : c1;
            if (path == 2) { // rounded once, outside the timing
                round_into(st, a, a16, na);
                round_into(st, b, b16, nb);
            }
            for (int r = -2; r < reps; r++) { // two untimed calls first
                if (r == 0) CHECK_CUDA(cudaEventRecord(e0, st));
                if (path == 0) {
                    round_into(st, a, a16, na);
                    round_into(st, b, b16, nb);
                }
                if (path == 1)
                    CHECK_BLAS(cublasGemmEx(h, CUBLAS_OP_N, CUBLAS_OP_N, s.m, s.n, s.k, &one, a,
                                            CUDA_R_32F, s.m, b, CUDA_R_32F, s.k, &zero, c,
                                            CUDA_R_32F, s.m, CUBLAS_COMPUTE_32F_FAST_16BF,
                                            CUBLAS_GEMM_DEFAULT));
                else
                    CHECK_BLAS(cublasGemmEx(h, CUBLAS_OP_N, CUBLAS_OP_N, s.m, s.n, s.k, &one, a16,
                                            CUDA_R_16BF, s.m, b16, CUDA_R_16BF, s.k, &zero, c,
                                            CUDA_R_32F, s.m, CUBLAS_COMPUTE_32F,
                                            CUBLAS_GEMM_DEFAULT));
            }
            CHECK_CUDA(cudaEventRecord(e1, st));
            CHECK_CUDA(cudaEventSynchronize(e1));
            float t;
            CHECK_CUDA(cudaEventElapsedTime(&t, e0, e1));
            ms[path] = t / reps;
        }
        float *h1 = (float *)malloc(nc * 4), *h2 = (float *)malloc(nc * 4);
        if (!h1 || !h2) {
            fprintf(stderr, "gp_gemm_paths: host memory\n");
            return 1;
        }
        CHECK_CUDA(cudaMemcpy(h1, c1, nc * 4, cudaMemcpyDeviceToHost));
        CHECK_CUDA(cudaMemcpy(h2, c2, nc * 4, cudaMemcpyDeviceToHost));
        double mag = 0, worst = 0;
        int64_t same = 0;
        for (int64_t i = 0; i < nc; i++) mag = fmax(mag, fabs(h1[i]));
        for (int64_t i = 0; i < nc; i++) {
            worst = fmax(worst, fabs((double)h1[i] - h2[i]) / (mag > 0 ? mag : 1));
            same += memcmp(&h1[i], &h2[i], 4) == 0;
        }
        const double flop = 2.0 * s.m * s.n * (double)s.k;
        printf("%s{\"shape\": \"%s\", \"m\": %d, \"n\": %d, \"k\": %d, "
               "\"round_then_bf16_ms\": %.4f, \"fast_16bf_ms\": %.4f, \"bf16_only_ms\": %.4f, "
               "\"round_then_bf16_tflops\": %.1f, \"fast_16bf_tflops\": %.1f, "
               "\"bf16_only_tflops\": %.1f, \"fast_vs_round_worst_rel\": %.3e, "
               "\"fast_vs_round_same_bits\": %.6f}",
               si ? ", " : "", s.name, s.m, s.n, s.k, ms[0], ms[1], ms[2], flop / ms[0] * 1e-9,
               flop / ms[1] * 1e-9, flop / ms[2] * 1e-9, worst, (double)same / (double)nc);
        fflush(stdout);
        free(h1), free(h2);
        cudaFree(a), cudaFree(b), cudaFree(c1), cudaFree(c2), cudaFree(a16), cudaFree(b16);
    }
    printf("]}\n");
    cublasDestroy(h);
    cudaStreamDestroy(st);
    return 0;
}
