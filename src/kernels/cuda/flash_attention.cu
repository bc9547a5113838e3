// Causal attention of a bf16 device without the T x T matrix: tiles of 64 queries and 64 keys in
// shared memory, the products on the tensor cores (WMMA, bf16 in, fp32 sums), an online softmax
// in the forward, and a backward that recomputes the probabilities from the forward's row
// log-sum-exp. Deterministic: every output element is summed by one warp in a fixed order of
// tiles, no atomics: the key tiles' dK and dV by one kernel (a block per key tile, over the
// query tiles at or after it), dQ by another (a block per query tile, over the key tiles at or
// before it), each recomputing what it needs. q, k, v and dout are rounded to bf16 as they are
// loaded (core/bf16.h, the CPU's rounding); the probabilities and dS before their products.
// What it saves for the backward is the row log-sum-exp, B H T floats at the start of the
// layer's probs buffer. Its output may be written in bf16 (out16: the layer keeps it so for the
// projection's products), which the backward then reads for D.
//
// tests/test_flash_emulated.cpp compiles the kernels on the host (GP_CUDA_HOST_EMULATION: its
// own threads, barriers, shuffles and WMMA stand in for CUDA's) and checks them against the
// CPU's attention on every machine; the host code at the end is the GPU's alone.
#ifndef GP_CUDA_HOST_EMULATION
#include <cuda_bf16.h>
#include <mma.h>

#include "kernels/cuda/cuda_kernels.h"
using namespace nvcuda;
#define FA_SHARED(name) extern __shared__ __align__(128) unsigned char name[]
#endif
#include "core/bf16.h"
#include "kernels/cuda/math.cuh"

#define FA_BM 64 // query rows of a tile
#define FA_BN 64 // key rows of a tile
#define FA_WARPS 4
#define FA_THREADS (FA_WARPS * 32)
#define FA_PAD16 8 // bf16 row padding (shared-memory banks; rows stay 16-byte multiples)
#define FA_PAD32 4 // fp32 row padding
#define FA_MAX_HD 128

typedef __nv_bfloat16 bf16;
typedef wmma::fragment<wmma::matrix_a, 16, 16, 16, bf16, wmma::row_major> frag_a_row;
typedef wmma::fragment<wmma::matrix_a, 16, 16, 16, bf16, wmma::col_major> frag_a_col;
typedef wmma::fragment<wmma::matrix_b, 16, 16, 16, bf16, wmma::row_major> frag_b_row;
typedef wmma::fragment<wmma::matrix_b, 16, 16, 16, bf16, wmma::col_major> frag_b_col;
typedef wmma::fragment<wmma::accumulator, 16, 16, 16, float> frag_acc;

typedef struct fa_args {
    const float *qkv;  // (B, T, 3C)
    const float *att;  // (B, T, C): the forward's output (the backward's D), or
    const uint16_t *att16; // that output in bf16 when not NULL
    const float *datt; // (B, T, C)
    float *out;        // att (forward), or
    uint16_t *out16;   // att in bf16 when not NULL
    float *lse;        // (B, H, T): saved by the forward
    float *dsum;       // (B, H, T): D = rowsum(dout o att), the backward's
    float *dqkv;       // (B, T, 3C)
    int64_t T, C, H, hd;
    float scale;
} fa_args;

// Shared-memory row lengths.
struct fa_lds {
    int b, f, s, p; // bf16 rows of hd, fp32 rows of hd, fp32 rows of a tile, bf16 rows of a tile
    __host__ __device__ explicit fa_lds(int64_t hd)
        : b((int)hd + FA_PAD16), f((int)hd + FA_PAD32), s(FA_BN + FA_PAD32), p(FA_BN + FA_PAD16) {}
};

// A tile of 64 rows x hd from fp32 (rows ld floats apart, row0 on) into bf16 rows of lds, rows
// at or past T as zeros.
__device__ static void load_tile(bf16 *dst, int lds, const float *src, int64_t ld, int64_t row0,
                                 int64_t T, int hd) {
    uint16_t *d = reinterpret_cast<uint16_t *>(dst);
    for (int i = threadIdx.x; i < FA_BM * hd; i += blockDim.x) {
        const int r = i / hd, c = i - r * hd;
        const int64_t t = row0 + r;
        d[r * lds + c] = t < T ? gp_bf16_bits(src[t * ld + c]) : (uint16_t)0;
    }
}

// 64 floats of a row vector (T long) from row0 on, zeros past T.
__device__ static void load_rows(float *dst, const float *src, int64_t row0, int64_t T) {
    for (int i = threadIdx.x; i < FA_BM; i += blockDim.x)
        dst[i] = row0 + i < T ? src[row0 + i] : 0.0f;
}

__device__ static inline uint16_t bf16_of(float x) { return gp_bf16_bits(x); }

// acc (16 x 16 at out, fp32 rows ldo) = A (16 x hd, bf16 rows lda) B^T where B is 16 x hd (rows
// ldb): a tile of S = q k^T or of dP = dout v^T.
__device__ static void tile_abt(float *out, int ldo, const bf16 *a, int lda, const bf16 *b,
                                int ldb, int hd) {
    frag_acc acc;
    wmma::fill_fragment(acc, 0.0f);
    for (int kk = 0; kk < hd; kk += 16) {
        frag_a_row fa;
        frag_b_col fb;
        wmma::load_matrix_sync(fa, a + kk, lda);
        wmma::load_matrix_sync(fb, b + kk, ldb);
        wmma::mma_sync(acc, fa, fb, acc);
    }
    wmma::store_matrix_sync(out, acc, ldo, wmma::mem_row_major);
}

// The backward's two products of a warp's 16 rows with a tile of 64 (FA_BM = FA_BN rows, bf16
// rows ld apart): o1 = a1 b1^T and o2 = a2 b2^T (S and dP, or their transposes).
__device__ static void tiles_abt2(float *o1, float *o2, int ldo, const bf16 *a1, const bf16 *b1,
                                  const bf16 *a2, const bf16 *b2, int ld, int hd) {
    for (int j = 0; j < FA_BN; j += 16) {
        tile_abt(o1 + j, ldo, a1, ld, b1 + j * ld, ld, hd);
        tile_abt(o2 + j, ldo, a2, ld, b2 + j * ld, ld, hd);
    }
}

// C (16 x hd, fp32 rows ldc) += A (16 x 64, bf16 rows lda) B (64 x hd, bf16 rows ldb); with
// zero_c, C = A B.
__device__ static void rows_ab(float *c, int ldc, const bf16 *a, int lda, const bf16 *b, int ldb,
                               int hd, bool zero_c) {
    for (int d = 0; d < hd; d += 16) {
        frag_acc acc;
        if (zero_c)
            wmma::fill_fragment(acc, 0.0f);
        else
            wmma::load_matrix_sync(acc, c + d, ldc, wmma::mem_row_major);
        for (int kk = 0; kk < FA_BN; kk += 16) {
            frag_a_row fa;
            frag_b_row fb;
            wmma::load_matrix_sync(fa, a + kk, lda);
            wmma::load_matrix_sync(fb, b + (int64_t)kk * ldb + d, ldb);
            wmma::mma_sync(acc, fa, fb, acc);
        }
        wmma::store_matrix_sync(c + d, acc, ldc, wmma::mem_row_major);
    }
}

// ------------------------------------------------------------------------------- forward

// Block (query tile, head, example); warp w owns the tile's queries 16 w .. 16 w + 15.
static __global__ void __launch_bounds__(FA_THREADS) fa_forward_kernel(fa_args a) {
    FA_SHARED(smem);
    const int hd = (int)a.hd, warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const fa_lds L(a.hd);
    const int wsz = L.s > L.f ? L.s : L.f; // a warp's scratch rows: S, then its P v
    bf16 *Qs = reinterpret_cast<bf16 *>(smem), *Ks = Qs + FA_BM * L.b, *Vs = Ks + FA_BN * L.b;
    bf16 *Ps = Vs + FA_BN * L.b;
    float *Os = reinterpret_cast<float *>(Ps + FA_BM * L.p);
    float *W = Os + FA_BM * L.f + warp * 16 * wsz;
    float *m = Os + FA_BM * L.f + FA_WARPS * 16 * wsz, *l = m + FA_BM, *alpha = l + FA_BM;
    // the last query tiles (the most key tiles) first: the short ones fill the grid's tail
    const int64_t T = a.T, C = a.C, ld = 3 * C, qb = gridDim.x - 1 - blockIdx.x, h = blockIdx.y,
                  b = blockIdx.z;
    const int64_t q0 = qb * FA_BM;
    const float *x = a.qkv + b * T * ld + h * hd;
    load_tile(Qs, L.b, x, ld, q0, T, hd);
    for (int i = threadIdx.x; i < FA_BM * L.f; i += blockDim.x) Os[i] = 0.0f;
    for (int i = threadIdx.x; i < FA_BM; i += blockDim.x) m[i] = -INFINITY, l[i] = 0.0f;
    const int i = lane >> 1, half = lane & 1, ri = warp * 16 + i; // a row, half of its keys
    const int64_t t = q0 + ri;
    for (int64_t kb = 0; kb <= qb; kb++) {
        __syncthreads(); // the tiles before are read
        load_tile(Ks, L.b, x + C, ld, kb * FA_BN, T, hd);
        load_tile(Vs, L.b, x + 2 * C, ld, kb * FA_BN, T, hd);
        __syncthreads();
        for (int j = 0; j < FA_BN; j += 16)
            tile_abt(W + j, L.s, Qs + warp * 16 * L.b, L.b, Ks + j * L.b, L.b, hd);
        __syncwarp();
        float mx = -INFINITY;
        for (int c = half * 32; c < half * 32 + 32; c++) {
            const int64_t u = kb * FA_BN + c;
            const float s = t < T && u <= t ? a.scale * W[i * L.s + c] : -INFINITY;
            W[i * L.s + c] = s;
            mx = gp_max_nan(mx, s);
        }
        mx = gp_max_nan(mx, __shfl_xor_sync(GP_CUDA_FULL_WARP, mx, 1));
        const float m_old = m[ri], m_new = gp_max_nan(m_old, mx);
        float sum = 0.0f;
        uint16_t *P16 = reinterpret_cast<uint16_t *>(Ps);
        for (int c = half * 32; c < half * 32 + 32; c++) {
            const float s = W[i * L.s + c];
            const float p = s == -INFINITY ? 0.0f : gp_cuda_exp(s - m_new);
            P16[ri * L.p + c] = bf16_of(p);
            sum += p;
        }
        sum += __shfl_xor_sync(GP_CUDA_FULL_WARP, sum, 1);
        __syncwarp();
        if (half == 0) {
            const float al = m_old == -INFINITY ? 0.0f : gp_cuda_exp(m_old - m_new);
            alpha[ri] = al;
            l[ri] = l[ri] * al + sum;
            m[ri] = m_new;
        }
        // the warp's P v into its scratch (S is spent), then O = alpha O + P v
        rows_ab(W, L.f, Ps + warp * 16 * L.p, L.p, Vs, L.b, hd, true);
        __syncwarp();
        for (int e = lane; e < 16 * hd; e += 32) {
            const int r = e / hd, c = e - r * hd;
            float *o = &Os[(warp * 16 + r) * L.f + c];
            *o = *o * alpha[warp * 16 + r] + W[r * L.f + c];
        }
        __syncwarp();
    }
    for (int e = lane; e < 16 * hd; e += 32) {
        const int r = e / hd, c = e - r * hd;
        const int64_t tr = q0 + warp * 16 + r;
        if (tr >= T) continue;
        const float o = Os[(warp * 16 + r) * L.f + c] / l[warp * 16 + r];
        const int64_t at = (b * T + tr) * C + h * hd + c;
        if (a.out16) a.out16[at] = bf16_of(o);
        else a.out[at] = o;
    }
    if (half == 0 && t < T) a.lse[(b * a.H + h) * T + t] = m[ri] + logf(l[ri]);
}

// -------------------------------------------------------------------------------- backward

// D = rowsum(dout o att) for each (example, head, query): a thread each, the head's columns in
// order. dout rounded to bf16 as in its products: att is P v with v rounded, so this is
// rowsum(P dP) with dP = dout v^T of rounded operands, the CPU's dot; with dout unrounded, dS
// moved by up to 2^-8 of dP (a row of one key has dS = 0 only then). From att16, att itself is
// rounded: D moves by up to 2^-9 of each term (a row of one key keeps dS = 0: its att is v,
// already bf16).
static __global__ void fa_dsum_kernel(fa_args a) {
    const int64_t b = blockIdx.y;
    for (int64_t r = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; r < a.H * a.T;
         r += (int64_t)blockDim.x * gridDim.x) {
        const int64_t h = r / a.T, t = r - h * a.T;
        const int64_t at = (b * a.T + t) * a.C + h * a.hd;
        const float *g = a.datt + at;
        float acc = 0.0f;
        for (int64_t c = 0; c < a.hd; c++) {
            const float o = a.att16 ? gp_bf16_float(a.att16[at + c]) : a.att[at + c];
            acc = fmaf(gp_bf16_round(g[c]), o, acc);
        }
        a.dsum[(b * a.H + h) * a.T + t] = acc;
    }
}

// One (query, key) pair of the backward, valid where the key is at or before the query: p =
// exp(scale s - lse) (into *p16 unless NULL) and dS = p (dP - D) scale, rounded to bf16; zeros
// where not valid.
__device__ static inline void recompute(const fa_args &a, bool valid, float s, float dp,
                                        float lse, float dsum, uint16_t *p16, uint16_t *ds16) {
    const float p = valid ? gp_cuda_exp(a.scale * s - lse) : 0.0f;
    const float ds = valid ? p * (dp - dsum) * a.scale : 0.0f;
    if (p16) *p16 = bf16_of(p);
    *ds16 = bf16_of(ds);
}

// Block (key tile, head, example); warp w owns the tile's keys 16 w .. 16 w + 15, and their
// rows of dK and dV.
static __global__ void __launch_bounds__(FA_THREADS) fa_dkdv_kernel(fa_args a) {
    FA_SHARED(smem);
    const int hd = (int)a.hd, warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const fa_lds L(a.hd);
    bf16 *Ks = reinterpret_cast<bf16 *>(smem), *Vs = Ks + FA_BN * L.b, *Qs = Vs + FA_BN * L.b;
    bf16 *Gs = Qs + FA_BM * L.b; // dout
    bf16 *Pt = Gs + FA_BM * L.b, *Dt = Pt + FA_BN * L.p; // P^T and dS^T, bf16
    float *dK = reinterpret_cast<float *>(Dt + FA_BN * L.p), *dV = dK + FA_BN * L.f;
    float *St = dV + FA_BN * L.f + warp * 2 * 16 * L.s, *Gt = St + 16 * L.s; // S^T, dP^T
    float *lse = dV + FA_BN * L.f + FA_WARPS * 2 * 16 * L.s, *dsum = lse + FA_BM;
    const int64_t T = a.T, C = a.C, ld = 3 * C, kb = blockIdx.x, h = blockIdx.y, b = blockIdx.z;
    const int64_t k0 = kb * FA_BN, nq = (T + FA_BM - 1) / FA_BM;
    const float *x = a.qkv + b * T * ld + h * hd, *g = a.datt + b * T * C + h * hd;
    const float *lse_g = a.lse + (b * a.H + h) * T, *dsum_g = a.dsum + (b * a.H + h) * T;
    load_tile(Ks, L.b, x + C, ld, k0, T, hd);
    load_tile(Vs, L.b, x + 2 * C, ld, k0, T, hd);
    for (int i = threadIdx.x; i < FA_BN * L.f; i += blockDim.x) dK[i] = 0.0f, dV[i] = 0.0f;
    uint16_t *P16 = reinterpret_cast<uint16_t *>(Pt), *D16 = reinterpret_cast<uint16_t *>(Dt);
    for (int64_t qb = kb; qb < nq; qb++) {
        const int64_t q0 = qb * FA_BM;
        __syncthreads(); // the tiles before are read
        load_tile(Qs, L.b, x, ld, q0, T, hd);
        load_tile(Gs, L.b, g, C, q0, T, hd);
        load_rows(lse, lse_g, q0, T);
        load_rows(dsum, dsum_g, q0, T);
        __syncthreads();
        tiles_abt2(St, Gt, L.s, Ks + warp * 16 * L.b, Qs, Vs + warp * 16 * L.b, Gs, L.b, hd);
        __syncwarp();
        for (int e = lane; e < 16 * FA_BM; e += 32) {
            const int r = e / FA_BM, c = e - r * FA_BM;
            const int64_t u = k0 + warp * 16 + r, t = q0 + c;
            recompute(a, t < T && u <= t, St[r * L.s + c], Gt[r * L.s + c], lse[c], dsum[c],
                      &P16[(warp * 16 + r) * L.p + c], &D16[(warp * 16 + r) * L.p + c]);
        }
        __syncwarp();
        rows_ab(dV + warp * 16 * L.f, L.f, Pt + warp * 16 * L.p, L.p, Gs, L.b, hd, false);
        rows_ab(dK + warp * 16 * L.f, L.f, Dt + warp * 16 * L.p, L.p, Qs, L.b, hd, false);
    }
    __syncthreads();
    for (int e = threadIdx.x; e < FA_BN * hd; e += blockDim.x) {
        const int r = e / hd, c = e - r * hd;
        const int64_t u = k0 + r;
        if (u >= T) continue;
        float *row = a.dqkv + (b * T + u) * ld + h * hd + c;
        row[C] = dK[r * L.f + c];
        row[2 * C] = dV[r * L.f + c];
    }
}

// Block (query tile, head, example); warp w owns the tile's queries 16 w .. 16 w + 15, and their
// rows of dQ.
static __global__ void __launch_bounds__(FA_THREADS) fa_dq_kernel(fa_args a) {
    FA_SHARED(smem);
    const int hd = (int)a.hd, warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const fa_lds L(a.hd);
    bf16 *Qs = reinterpret_cast<bf16 *>(smem), *Gs = Qs + FA_BM * L.b, *Ks = Gs + FA_BM * L.b;
    bf16 *Vs = Ks + FA_BN * L.b, *Ds = Vs + FA_BN * L.b; // dS, bf16
    float *dQ = reinterpret_cast<float *>(Ds + FA_BM * L.p);
    float *S = dQ + FA_BM * L.f + warp * 2 * 16 * L.s, *G = S + 16 * L.s; // S, dP
    float *lse = dQ + FA_BM * L.f + FA_WARPS * 2 * 16 * L.s, *dsum = lse + FA_BM;
    const int64_t T = a.T, C = a.C, ld = 3 * C, qb = gridDim.x - 1 - blockIdx.x, h = blockIdx.y,
                  b = blockIdx.z; // the longest first, as the forward
    const int64_t q0 = qb * FA_BM;
    const float *x = a.qkv + b * T * ld + h * hd, *g = a.datt + b * T * C + h * hd;
    load_tile(Qs, L.b, x, ld, q0, T, hd);
    load_tile(Gs, L.b, g, C, q0, T, hd);
    load_rows(lse, a.lse + (b * a.H + h) * T, q0, T);
    load_rows(dsum, a.dsum + (b * a.H + h) * T, q0, T);
    for (int i = threadIdx.x; i < FA_BM * L.f; i += blockDim.x) dQ[i] = 0.0f;
    uint16_t *D16 = reinterpret_cast<uint16_t *>(Ds);
    for (int64_t kb = 0; kb <= qb; kb++) {
        __syncthreads();
        load_tile(Ks, L.b, x + C, ld, kb * FA_BN, T, hd);
        load_tile(Vs, L.b, x + 2 * C, ld, kb * FA_BN, T, hd);
        __syncthreads();
        tiles_abt2(S, G, L.s, Qs + warp * 16 * L.b, Ks, Gs + warp * 16 * L.b, Vs, L.b, hd);
        __syncwarp();
        for (int e = lane; e < 16 * FA_BN; e += 32) {
            const int r = e / FA_BN, c = e - r * FA_BN, ri = warp * 16 + r;
            const int64_t t = q0 + ri, u = kb * FA_BN + c;
            recompute(a, t < T && u <= t, S[r * L.s + c], G[r * L.s + c], lse[ri], dsum[ri], NULL,
                      &D16[ri * L.p + c]);
        }
        __syncwarp();
        rows_ab(dQ + warp * 16 * L.f, L.f, Ds + warp * 16 * L.p, L.p, Ks, L.b, hd, false);
    }
    __syncwarp();
    for (int e = lane; e < 16 * hd; e += 32) {
        const int r = e / hd, c = e - r * hd;
        const int64_t t = q0 + warp * 16 + r;
        if (t < T) a.dqkv[(b * T + t) * ld + h * hd + c] = dQ[(warp * 16 + r) * L.f + c];
    }
}

// ------------------------------------------------------------------------------- the calls

// Shared-memory bytes of each kernel for head size hd.
static size_t smem_forward(int64_t hd) {
    const fa_lds L(hd);
    const int wsz = L.s > L.f ? L.s : L.f;
    return (size_t)(3 * FA_BM * L.b + FA_BM * L.p) * sizeof(bf16) +
           (size_t)(FA_BM * L.f + FA_WARPS * 16 * wsz + 3 * FA_BM) * sizeof(float);
}
static size_t smem_dkdv(int64_t hd) {
    const fa_lds L(hd);
    return (size_t)(4 * FA_BM * L.b + 2 * FA_BN * L.p) * sizeof(bf16) +
           (size_t)(2 * FA_BN * L.f + FA_WARPS * 2 * 16 * L.s + 2 * FA_BM) * sizeof(float);
}
static size_t smem_dq(int64_t hd) {
    const fa_lds L(hd);
    return (size_t)(4 * FA_BM * L.b + FA_BM * L.p) * sizeof(bf16) +
           (size_t)(FA_BM * L.f + FA_WARPS * 2 * 16 * L.s + 2 * FA_BM) * sizeof(float);
}

#ifndef GP_CUDA_HOST_EMULATION
extern "C" bool gp_cuda_flash_fits(gp_device *dev, const gp_attn_dims *d) {
    if (gp_device_precision(dev) != GP_PRECISION_BF16 || d->heads <= 0 || d->dim % d->heads)
        return false;
    const int64_t hd = d->dim / d->heads;
    if (hd < 16 || hd > FA_MAX_HD || hd % 16 || d->seq <= 0 || d->batch <= 0) return false;
    if (d->batch > 65535 || d->heads > 65535) return false; // grid dimensions y and z
    const gp_cuda_ctx *c = (const gp_cuda_ctx *)gp_device_context(dev);
    const size_t room = c ? c->attention_smem : 0; // 0: GP_CUDA_ATTENTION=gemm
    return smem_forward(hd) <= room && smem_dkdv(hd) <= room && smem_dq(hd) <= room;
}

template <typename K>
static gp_status launch(gp_cuda_ctx *c, K kernel, const char *name, dim3 grid, size_t smem,
                        const fa_args &a) {
    GP_TRY(gp_cuda_check(c, cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                                 (int)smem),
                         "cudaFuncSetAttribute"));
    kernel<<<grid, FA_THREADS, smem, c->stream>>>(a);
    return gp_cuda_launched(c, name);
}

static fa_args args_of(const gp_attn_dims *d) {
    fa_args a = {};
    a.T = d->seq, a.C = d->dim, a.H = d->heads, a.hd = d->dim / d->heads;
    a.scale = 1.0f / sqrtf((float)a.hd);
    return a;
}

extern "C" gp_status gp_cuda_flash_forward(gp_device *dev, const gp_attn_dims *d,
                                           const float *qkv, float *lse, float *att,
                                           uint16_t *att16) {
    gp_status s;
    gp_cuda_ctx *c = gp_cuda_begin(dev, &s);
    if (!c) return s;
    fa_args a = args_of(d);
    a.qkv = qkv, a.lse = lse, a.out = att, a.out16 = att16;
    const dim3 grid((unsigned)((a.T + FA_BM - 1) / FA_BM), (unsigned)a.H, (unsigned)d->batch);
    return launch(c, fa_forward_kernel, "fa_forward_kernel", grid, smem_forward(a.hd), a);
}

extern "C" gp_status gp_cuda_flash_backward(gp_device *dev, const gp_attn_dims *d,
                                            const float *qkv, const float *lse, const float *att,
                                            const uint16_t *att16, const float *datt, float *dqkv,
                                            float *dsum) {
    gp_status s;
    gp_cuda_ctx *c = gp_cuda_begin(dev, &s);
    if (!c) return s;
    fa_args a = args_of(d);
    a.qkv = qkv, a.lse = (float *)lse, a.att = att, a.att16 = att16, a.datt = datt, a.dqkv = dqkv;
    a.dsum = dsum;
    const unsigned tiles = (unsigned)((a.T + FA_BM - 1) / FA_BM);
    const dim3 rows(gp_cuda_blocks(a.H * a.T), (unsigned)d->batch);
    fa_dsum_kernel<<<rows, GP_CUDA_THREADS, 0, c->stream>>>(a);
    GP_TRY(gp_cuda_launched(c, "fa_dsum_kernel"));
    const dim3 grid(tiles, (unsigned)a.H, (unsigned)d->batch);
    GP_TRY(launch(c, fa_dkdv_kernel, "fa_dkdv_kernel", grid, smem_dkdv(a.hd), a));
    return launch(c, fa_dq_kernel, "fa_dq_kernel", grid, smem_dq(a.hd), a);
}
#endif
