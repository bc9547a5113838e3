// The fused bf16 attention kernels of the CUDA device (src/kernels/cuda/flash_attention.cu) run
// on the host, on any machine: a std::thread per CUDA thread, barriers for __syncthreads and
// __syncwarp, shuffles through a warp's own slots, and WMMA by its documented rules (each
// fragment pointer 32-byte aligned, ldm a multiple of 16 bytes, asserted); shared memory comes
// from the heap filled with NaN bytes, so that a read of what no thread wrote shows. Their
// outputs are compared with the CPU device's bf16 attention (forward and backward) within the
// bound test_kernels_cuda holds the GPU to: 1/128 of the output's largest magnitude. Built where
// the CUDA headers are (the kernels include them); needs no GPU.
#include <barrier>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <random>
#include <thread>
#include <type_traits>
#include <vector>

// ---- what CUDA gives a kernel, on the host
#define __global__
#define __device__
#define __host__
#define __launch_bounds__(...)

struct u3 {
    unsigned x, y, z;
};
static thread_local u3 threadIdx, blockIdx;
static u3 blockDim, gridDim;
static unsigned char *g_smem;
static std::barrier<> *g_block_bar;
static std::barrier<> *g_warp_bar[32];
static float g_shfl[32][32];

static void __syncthreads() { g_block_bar->arrive_and_wait(); }
static void __syncwarp(unsigned = 0xffffffffu) { g_warp_bar[threadIdx.x >> 5]->arrive_and_wait(); }
template <typename T>
static T __shfl_xor_sync(unsigned, T v, int o) {
    static_assert(sizeof(T) == sizeof(float), "32-bit shuffles only");
    const unsigned w = threadIdx.x >> 5, l = threadIdx.x & 31;
    __syncwarp();
    memcpy(&g_shfl[w][l], &v, sizeof v);
    __syncwarp();
    T r;
    memcpy(&r, &g_shfl[w][l ^ (unsigned)o], sizeof r);
    __syncwarp();
    return r;
}
static float __uint_as_float(uint32_t u) {
    float f;
    memcpy(&f, &u, 4);
    return f;
}
static uint32_t __float_as_uint(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}
static uint32_t __umulhi(uint32_t a, uint32_t b) { return (uint32_t)(((uint64_t)a * b) >> 32); }

// __nv_bfloat16 is CUDA's own (cuda_bf16.h, host code too, through cuBLAS's headers).
#include <cuda_bf16.h>
static float bf16_value(__nv_bfloat16 b) {
    uint16_t raw;
    memcpy(&raw, &b, sizeof raw);
    return __uint_as_float((uint32_t)raw << 16);
}

namespace wmma {
struct matrix_a {};
struct matrix_b {};
struct accumulator {};
struct row_major {};
struct col_major {};
enum layout_t { mem_row_major, mem_col_major };
// A fragment's 16 x 16 values, whole in lane 0 of the warp, which alone loads, multiplies and
// stores them (the hardware spreads them over the lanes; no kernel here reads a fragment's
// elements, so the other lanes' copies are never used).
template <typename Use, int M, int N, int K, typename T, typename L = void>
struct fragment {
    float v[16][16];
};
static void check_ptr(const void *p, unsigned ldm, unsigned elem) {
    if ((uintptr_t)p % 32 || (ldm * elem) % 16) {
        fprintf(stderr, "test_flash_emulated: WMMA pointer %p / ldm %u: not 32-byte aligned or "
                        "ldm not a multiple of 16 bytes\n", p, ldm);
        abort();
    }
}
template <typename Use, typename L>
static void load_matrix_sync(fragment<Use, 16, 16, 16, __nv_bfloat16, L> &f, const __nv_bfloat16 *p,
                             unsigned ldm) {
    check_ptr(p, ldm, 2);
    __syncwarp();
    const bool rm = std::is_same<L, row_major>::value;
    if ((threadIdx.x & 31) == 0)
        for (int i = 0; i < 16; i++)
            for (int j = 0; j < 16; j++) f.v[i][j] = bf16_value(rm ? p[i * ldm + j] : p[j * ldm + i]);
    __syncwarp();
}
static void load_matrix_sync(fragment<accumulator, 16, 16, 16, float> &f, const float *p,
                             unsigned ldm, layout_t lay) {
    check_ptr(p, ldm, 4);
    __syncwarp();
    if ((threadIdx.x & 31) == 0)
        for (int i = 0; i < 16; i++)
            for (int j = 0; j < 16; j++) f.v[i][j] = lay == mem_row_major ? p[i * ldm + j] : p[j * ldm + i];
    __syncwarp();
}
static void store_matrix_sync(float *p, const fragment<accumulator, 16, 16, 16, float> &f,
                              unsigned ldm, layout_t lay) {
    check_ptr(p, ldm, 4);
    __syncwarp();
    if ((threadIdx.x & 31) == 0)
        for (int i = 0; i < 16; i++)
            for (int j = 0; j < 16; j++) (lay == mem_row_major ? p[i * ldm + j] : p[j * ldm + i]) = f.v[i][j];
    __syncwarp();
}
static void fill_fragment(fragment<accumulator, 16, 16, 16, float> &f, float x) {
    for (auto &row : f.v)
        for (float &e : row) e = x;
}
template <typename LA, typename LB>
static void mma_sync(fragment<accumulator, 16, 16, 16, float> &d,
                     const fragment<matrix_a, 16, 16, 16, __nv_bfloat16, LA> &a,
                     const fragment<matrix_b, 16, 16, 16, __nv_bfloat16, LB> &b,
                     const fragment<accumulator, 16, 16, 16, float> &c) {
    if ((threadIdx.x & 31) != 0) return;
    fragment<accumulator, 16, 16, 16, float> r;
    for (int i = 0; i < 16; i++)
        for (int j = 0; j < 16; j++) {
            float s = c.v[i][j];
            for (int k = 0; k < 16; k++) s += a.v[i][k] * b.v[k][j];
            r.v[i][j] = s;
        }
    d = r;
}
} // namespace wmma

#define FA_SHARED(name) unsigned char *name = g_smem
#define GP_CUDA_HOST_EMULATION
#include "kernels/cuda/flash_attention.cu"

extern "C" {
#include "kernels/kernels.h"
}

// ---- the launch: every block of the grid in turn, its threads at once
template <typename F>
static void launch(F kernel, u3 grid, unsigned threads, size_t smem, const fa_args &a) {
    gridDim = grid, blockDim = {threads, 1, 1};
    for (unsigned z = 0; z < grid.z; z++)
        for (unsigned y = 0; y < grid.y; y++)
            for (unsigned x = 0; x < grid.x; x++) {
                std::vector<unsigned char> mem(smem + 128, 0xff); // NaN bytes
                g_smem = mem.data() + (128 - (uintptr_t)mem.data() % 128) % 128;
                std::barrier<> block(threads);
                std::vector<std::unique_ptr<std::barrier<>>> warps;
                for (unsigned w = 0; w < threads / 32; w++) {
                    warps.emplace_back(new std::barrier<>(32));
                    g_warp_bar[w] = warps.back().get();
                }
                g_block_bar = &block;
                std::vector<std::thread> th;
                for (unsigned t = 0; t < threads; t++)
                    th.emplace_back([&, t] {
                        threadIdx = {t, 0, 0};
                        blockIdx = {x, y, z};
                        kernel(a);
                    });
                for (auto &t : th) t.join();
            }
}

static int failures;

// got against the CPU's ref: within 1/128 of (|ref| + ref's largest magnitude), element by element.
static void compare(const char *what, const float *got, const float *ref, size_t n) {
    double mag = 0, worst = 0;
    for (size_t i = 0; i < n; i++) mag = std::fmax(mag, std::fabs(ref[i]));
    int bad = 0;
    for (size_t i = 0; i < n; i++) {
        const double err = std::fabs((double)got[i] - ref[i]) / (std::fabs(ref[i]) + mag + 1e-30);
        if (!(err <= 1.0 / 128) && bad++ < 3)
            fprintf(stderr, "  %s[%zu]: fused %.9g, cpu %.9g\n", what, i, got[i], ref[i]);
        worst = err > worst || err != err ? (err != err ? INFINITY : err) : worst;
    }
    printf("  %-5s worst %.2e%s\n", what, worst, bad ? "  FAILED" : "");
    failures += bad != 0;
}

static void check_case(gp_device *cpu, int64_t B, int64_t T, int64_t C, int64_t H, float spread) {
    const gp_attn_dims d = {B, T, C, H};
    const int64_t hd = C / H, nq = B * T * 3 * C, na = B * T * C;
    printf("B %lld T %lld C %lld H %lld (head size %lld), inputs of spread %g\n", (long long)B,
           (long long)T, (long long)C, (long long)H, (long long)hd, spread);
    std::mt19937 g((unsigned)(1234 + T + 7 * C));
    std::normal_distribution<float> wide(0, spread), unit(0, 1);
    std::vector<float> qkv(nq), datt(na);
    for (float &x : qkv) x = wide(g);
    for (float &x : datt) x = unit(g);
    // the CPU device in bf16: the reference
    const gp_kernels *K = gp_kernels_of(cpu);
    std::vector<float> probs(K->attention_saved(cpu, &d)), att_c(na), dqkv_c(nq);
    std::vector<float> ws(K->attention_backward_ws(cpu, &d));
    if (K->attention_forward(cpu, &d, qkv.data(), probs.data(), att_c.data(), NULL) != GP_OK ||
        K->attention_backward(cpu, &d, qkv.data(), probs.data(), att_c.data(), NULL, datt.data(),
                              dqkv_c.data(), NULL, ws.data()) != GP_OK) {
        fprintf(stderr, "test_flash_emulated: the CPU's attention: %s\n", gp_last_error());
        exit(1);
    }
    // the fused kernels, outputs NaN until written
    std::vector<float> att(na, NAN), lse(B * H * T, NAN), dsum(B * H * T, NAN), dqkv(nq, NAN);
    fa_args a = {};
    a.T = T, a.C = C, a.H = H, a.hd = hd, a.scale = 1.0f / std::sqrt((float)hd);
    a.qkv = qkv.data(), a.out = att.data(), a.lse = lse.data();
    const unsigned tiles = (unsigned)((T + FA_BM - 1) / FA_BM);
    launch(fa_forward_kernel, {tiles, (unsigned)H, (unsigned)B}, FA_THREADS, smem_forward(hd), a);
    a.att = att.data(), a.datt = datt.data(), a.dsum = dsum.data(), a.dqkv = dqkv.data();
    launch(fa_dsum_kernel, {(unsigned)((H * T + 255) / 256), (unsigned)B, 1}, 256, 0, a);
    launch(fa_dkdv_kernel, {tiles, (unsigned)H, (unsigned)B}, FA_THREADS, smem_dkdv(hd), a);
    launch(fa_dq_kernel, {tiles, (unsigned)H, (unsigned)B}, FA_THREADS, smem_dq(hd), a);
    compare("att", att.data(), att_c.data(), (size_t)na);
    // dq, dk and dv each against its own magnitude: one small beside another hides nothing
    const auto compare_dqkv = [&](const std::vector<float> &dqkv_got, const char *const names[3]) {
        for (int part = 0; part < 3; part++) {
            std::vector<float> got(na), ref(na);
            for (int64_t r = 0; r < B * T; r++)
                for (int64_t c = 0; c < C; c++) {
                    got[r * C + c] = dqkv_got[r * 3 * C + part * C + c];
                    ref[r * C + c] = dqkv_c[r * 3 * C + part * C + c];
                }
            compare(names[part], got.data(), ref.data(), (size_t)na);
        }
    };
    static const char *const names[3] = {"dq", "dk", "dv"};
    compare_dqkv(dqkv, names);
    // The output kept in bf16 (out16): the bits of the fp32 output's rounding; the backward
    // reading it for D (att16) within the same bound of the CPU's.
    std::vector<uint16_t> att16(na, 0xffff);
    std::vector<float> lse16(B * H * T, NAN), dqkv16(nq, NAN);
    fa_args a16 = a;
    a16.out = nullptr, a16.out16 = att16.data(), a16.lse = lse16.data();
    launch(fa_forward_kernel, {tiles, (unsigned)H, (unsigned)B}, FA_THREADS, smem_forward(hd), a16);
    int bad16 = 0;
    for (int64_t i = 0; i < na; i++)
        if (att16[i] != gp_bf16_bits(att[i]) && bad16++ < 3)
            fprintf(stderr, "  att16[%lld]: 0x%04x, the bf16 of %.9g is 0x%04x\n", (long long)i,
                    att16[i], att[i], gp_bf16_bits(att[i]));
    printf("  att16 %s\n", bad16 ? "FAILED" : "the bits of att rounded");
    failures += bad16 != 0;
    a16.att = nullptr, a16.att16 = att16.data(), a16.dqkv = dqkv16.data();
    launch(fa_dsum_kernel, {(unsigned)((H * T + 255) / 256), (unsigned)B, 1}, 256, 0, a16);
    launch(fa_dkdv_kernel, {tiles, (unsigned)H, (unsigned)B}, FA_THREADS, smem_dkdv(hd), a16);
    launch(fa_dq_kernel, {tiles, (unsigned)H, (unsigned)B}, FA_THREADS, smem_dq(hd), a16);
    static const char *const names16[3] = {"dq16", "dk16", "dv16"};
    compare_dqkv(dqkv16, names16);
}

int main() {
    gp_device *cpu;
    if (gp_device_cpu_new("cpu", &cpu) != GP_OK ||
        gp_device_set_precision(cpu, GP_PRECISION_BF16) != GP_OK) {
        fprintf(stderr, "test_flash_emulated: %s\n", gp_last_error());
        return 1;
    }
    check_case(cpu, 2, 100, 64, 2, 1.0f);  // head size 32, two query tiles, the last short
    check_case(cpu, 1, 130, 256, 2, 1.0f); // head size 128 (T3's), three tiles
    check_case(cpu, 1, 1, 16, 1, 1.0f);    // one row, head size 16: dS = 0, so dq = dk = 0
    check_case(cpu, 1, 65, 96, 2, 1.0f);   // head size 48, a tile of one row
    check_case(cpu, 2, 130, 64, 1, 2.5f);  // head size 64, sharp scores
    gp_device_free(cpu);
    if (failures) fprintf(stderr, "test_flash_emulated: %d comparison(s) FAILED\n", failures);
    else printf("test_flash_emulated: all comparisons within 1/128\n");
    return failures ? 1 : 0;
}
