// CUDA causal multi-head attention. A bf16 device whose head size is a multiple of 16 up to 128
// takes the fused kernels of flash_attention.cu (no T x T matrix). Otherwise: for each example,
// the heads' GEMMs in one strided-batched cuBLAS call straight on the q, k, v columns of qkv
// (head h starts h * hd columns in, so the heads are `hd` floats apart), and a fused masked
// softmax with one warp per row. The GEMMs compute the whole T x T square (the softmax zeroes
// what lies above the diagonal), where the CPU skips most of the masked triangle: simpler, at up
// to twice the GEMM work. A bf16 device's products (gpipe.h, gp_precision) take bf16 operands,
// as the CPU's. An output kept in bf16 (att16, kernel_ops.def) is written so by the fused
// kernels; here an example's is made in fp32 in workspace, then rounded into it.
#include "core/bf16.h"
#include "kernels/cuda/cuda_kernels.h"
#include "kernels/cuda/math.cuh"

// A warp per row (lanes on neighbouring columns; reductions by shuffles, no barriers), the
// row's first n = t + 1 columns in registers for T up to 32 x GP_CUDA_ROW_PER_MAX = 1024
// (math.cuh): the masked columns are neither read nor computed, only zeroed. On the H200 this
// took 82-84 us for T3's 16 x 1024 rows of an example, against 77 for a block per row with a tree
// of barriers: no faster yet (the fused kernels replace it where they fit).
#define ROWS_PER_BLOCK (GP_CUDA_THREADS / 32)

static unsigned warp_row_blocks(int64_t rows) {
    const int64_t b = (rows + ROWS_PER_BLOCK - 1) / ROWS_PER_BLOCK;
    return (unsigned)(b < 1 ? 1 : b < GP_CUDA_MAX_GRID ? b : GP_CUDA_MAX_GRID);
}

#define WARP_ROWS(r, nrows)                                                                  \
    for (int64_t r = (int64_t)blockIdx.x * ROWS_PER_BLOCK + (threadIdx.x >> 5); r < (nrows);  \
         r += (int64_t)gridDim.x * ROWS_PER_BLOCK)

// Rows of (nrows, T), row r being query t = r % T: softmax of columns 0..t in place (the CPU's
// exp and its order of operations: max, exp, 1 / sum, scale), zeros above.
template <int PER>
static __global__ void causal_softmax_kernel(int64_t nrows, int64_t T, float *s) {
    const int lane = threadIdx.x & 31;
    float e[PER ? PER : 1];
    WARP_ROWS(r, nrows) {
        float *row = s + r * T;
        const int64_t n = r % T + 1;
        float m = -INFINITY;
        GP_CUDA_ROW_FOR(PER, k, j, lane, 32, T) if (j < n) {
            const float v = row[j];
            if (PER) e[GP_CUDA_ROW_REG(PER, k)] = v;
            m = gp_max_nan(m, v);
        }
        m = gp_warp_max_nan(m);
        float acc = 0.0f;
        GP_CUDA_ROW_FOR(PER, k, j, lane, 32, T) if (j < n) {
            const float v = gp_cuda_exp((PER ? e[GP_CUDA_ROW_REG(PER, k)] : row[j]) - m);
            if (PER) e[GP_CUDA_ROW_REG(PER, k)] = v;
            else row[j] = v;
            acc += v;
        }
        const float inv = 1.0f / gp_warp_sum(acc);
        GP_CUDA_ROW_FOR(PER, k, j, lane, 32, T) if (j < T)
            row[j] = j < n ? (PER ? e[GP_CUDA_ROW_REG(PER, k)] : row[j]) * inv : 0.0f;
    }
}

// On a bf16 device an example's q, k and v are rounded once, as one block (its T rows of qkv:
// what every product reads of q, k or v lies in it), rather than each product rounding the span
// of its own operand, which for q, k and v alike is nearly the whole block (their rows are 3 C
// apart). at16(p, n): element n of such a copy (NULL on an fp32 device: nothing was rounded).
static const void *at16(const void *p, int64_t n) {
    return p ? (const void *)((const uint16_t *)p + n) : NULL;
}

extern "C" gp_status gp_cuda_attention_forward(gp_device *dev, const gp_attn_dims *d,
                                               const float *qkv, float *probs, float *att,
                                               uint16_t *att16) {
    gp_status s;
    gp_cuda_ctx *c = gp_cuda_begin(dev, &s);
    if (!c) return s;
    const int64_t B = d->batch, T = d->seq, C = d->dim, H = d->heads;
    if (B <= 0 || T <= 0 || H <= 0) return GP_OK;
    if (gp_cuda_flash_fits(dev, d)) return gp_cuda_flash_forward(dev, d, qkv, probs, att, att16);
    const int64_t hd = C / H, ld = 3 * C;
    const float scale = 1.0f / sqrtf((float)hd);
    float *ex = NULL; // one example's output in fp32, for att16
    if (att16) {
        ex = (float *)gp_cuda_workspace(dev, (size_t)(T * C) * sizeof(float), &s);
        if (!ex) return s;
    }
    gp_status st = GP_OK;
    for (int64_t b = 0; b < B && st == GP_OK; b++) {
        const float *q = qkv + b * T * ld, *k = q + C, *v = q + 2 * C;
        float *P = probs + b * H * T * T;
        void *qkv16 = NULL; // the example's q, k and v (at16)
        st = gp_cuda_round_operand(dev, q, T * ld, &qkv16);
        // S (H, T, T) = scale q k^T per head
        if (st == GP_OK)
            st = gp_cuda_gemm_rounded(dev, false, true, T, T, hd, scale, q, qkv16, ld, hd, k,
                                      at16(qkv16, C), ld, hd, 0.0f, P, T, T * T, H);
        if (st == GP_OK) {
            GP_CUDA_ROW_QUEUE(c, causal_softmax_kernel, gp_cuda_row_per(T, 32),
                              warp_row_blocks(H * T), GP_CUDA_THREADS, H * T, T, P);
            st = gp_cuda_launched(c, "causal_softmax_kernel");
        }
        // att (T, hd per head, row stride C) = P v
        if (st == GP_OK)
            st = gp_cuda_gemm_rounded(dev, false, false, T, hd, T, 1.0f, P, NULL, T, T * T, v,
                                      at16(qkv16, 2 * C), ld, hd, 0.0f, ex ? ex : att + b * T * C,
                                      C, hd, H);
        if (st == GP_OK && ex) st = gp_cuda_bf16_store(dev, ex, att16 + b * T * C, T * C);
        gp_cuda_workspace_release(dev, qkv16);
    }
    gp_cuda_workspace_release(dev, ex);
    return st;
}

// dS = P (dP - rowsum(P dP)) scale over the row's columns 0..t, zeros above (in place on dP).
template <int PER>
static __global__ void softmax_backward_kernel(int64_t nrows, int64_t T, float scale,
                                               const float *P, float *dS) {
    const int lane = threadIdx.x & 31;
    float p[PER ? PER : 1], d[PER ? PER : 1];
    WARP_ROWS(r, nrows) {
        const float *pr = P + r * T;
        float *sr = dS + r * T;
        const int64_t n = r % T + 1;
        float acc = 0.0f;
        GP_CUDA_ROW_FOR(PER, k, j, lane, 32, T) if (j < n) {
            const float pv = pr[j], dv = sr[j];
            if (PER) p[GP_CUDA_ROW_REG(PER, k)] = pv, d[GP_CUDA_ROW_REG(PER, k)] = dv;
            acc = fmaf(pv, dv, acc);
        }
        const float dot = gp_warp_sum(acc);
        GP_CUDA_ROW_FOR(PER, k, j, lane, 32, T) if (j < T) {
            if (j >= n) {
                sr[j] = 0.0f;
                continue;
            }
            const float pv = PER ? p[GP_CUDA_ROW_REG(PER, k)] : pr[j];
            const float dv = PER ? d[GP_CUDA_ROW_REG(PER, k)] : sr[j];
            sr[j] = pv * (dv - dot) * scale;
        }
    }
}

extern "C" int64_t gp_cuda_attention_saved(gp_device *dev, const gp_attn_dims *d) {
    const int64_t rows = d->batch * d->heads * d->seq; // the fused kernels' log-sum-exps
    return gp_cuda_flash_fits(dev, d) ? rows : rows * d->seq;
}

extern "C" int64_t gp_cuda_attention_backward_ws(gp_device *dev, const gp_attn_dims *d) {
    if (gp_cuda_flash_fits(dev, d)) return d->batch * d->heads * d->seq; // D of every row
    return d->heads * d->seq * d->seq; // one example's dS at a time
}

extern "C" gp_status gp_cuda_attention_backward(gp_device *dev, const gp_attn_dims *d,
                                                const float *qkv, const float *probs,
                                                const float *att, const uint16_t *att16,
                                                const float *datt, float *dqkv, float *dbias,
                                                float *ws) {
    gp_status s;
    gp_cuda_ctx *c = gp_cuda_begin(dev, &s);
    if (!c) return s;
    const int64_t B = d->batch, T = d->seq, C = d->dim, H = d->heads;
    if (B <= 0 || T <= 0 || H <= 0) return GP_OK;
    if (gp_cuda_flash_fits(dev, d)) {
        if (!att && !att16)
            return gp_error(GP_INVALID_ARGUMENT,
                            "device %s: attention_backward: the fused kernels need the forward's "
                            "att (NULL given)",
                            c->name);
        GP_TRY(gp_cuda_flash_backward(dev, d, qkv, probs, att, att16, datt, dqkv, ws));
        return dbias ? gp_cuda_sum_rows_add(dev, dqkv, B * T, 3 * C, dbias) : GP_OK;
    }
    const int64_t hd = C / H, ld = 3 * C;
    const float scale = 1.0f / sqrtf((float)hd);
    // dout and dS each feed two products: on a bf16 device each is rounded once for both (the
    // spans are those of the products: dout's T rows of C, dS's H squares); q, k, v as one block
    // (at16).
    const int64_t dout_span = gp_bf16_operand_span(false, T, hd, C, hd, H);
    const int64_t ds_span = gp_bf16_operand_span(false, T, T, T, T * T, H);
    gp_status st = GP_OK;
    for (int64_t b = 0; b < B && st == GP_OK; b++) {
        const float *q = qkv + b * T * ld, *k = q + C, *v = q + 2 * C;
        const float *P = probs + b * H * T * T, *dout = datt + b * T * C;
        float *dq = dqkv + b * T * ld, *dk = dq + C, *dv = dq + 2 * C;
        void *dout16 = NULL, *ds16 = NULL, *qkv16 = NULL;
        st = gp_cuda_round_operand(dev, dout, dout_span, &dout16);
        if (st == GP_OK) st = gp_cuda_round_operand(dev, q, T * ld, &qkv16);
        // dP (H, T, T) = dout v^T, then dS in place
        if (st == GP_OK)
            st = gp_cuda_gemm_rounded(dev, false, true, T, T, hd, 1.0f, dout, dout16, C, hd, v,
                                      at16(qkv16, 2 * C), ld, hd, 0.0f, ws, T, T * T, H);
        if (st == GP_OK) {
            GP_CUDA_ROW_QUEUE(c, softmax_backward_kernel, gp_cuda_row_per(T, 32),
                              warp_row_blocks(H * T), GP_CUDA_THREADS, H * T, T, scale, P, ws);
            st = gp_cuda_launched(c, "softmax_backward_kernel");
        }
        if (st == GP_OK) st = gp_cuda_round_operand(dev, ws, ds_span, &ds16);
        // dq = dS k, dk = dS^T q, dv = P^T dout
        if (st == GP_OK)
            st = gp_cuda_gemm_rounded(dev, false, false, T, hd, T, 1.0f, ws, ds16, T, T * T, k,
                                      at16(qkv16, C), ld, hd, 0.0f, dq, ld, hd, H);
        if (st == GP_OK)
            st = gp_cuda_gemm_rounded(dev, true, false, T, hd, T, 1.0f, ws, ds16, T, T * T, q,
                                      qkv16, ld, hd, 0.0f, dk, ld, hd, H);
        if (st == GP_OK)
            st = gp_cuda_gemm_rounded(dev, true, false, T, hd, T, 1.0f, P, NULL, T, T * T, dout,
                                      dout16, C, hd, 0.0f, dv, ld, hd, H);
        gp_cuda_workspace_release(dev, ds16);
        gp_cuda_workspace_release(dev, qkv16);
        gp_cuda_workspace_release(dev, dout16);
    }
    GP_TRY(st);
    // The bias gradient: the rows of dqkv in order, by columns (the CPU's order).
    return dbias ? gp_cuda_sum_rows_add(dev, dqkv, B * T, 3 * C, dbias) : GP_OK;
}
