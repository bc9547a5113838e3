// CUDA convolutions as cuBLAS GEMMs over im2col columns, and the channel biases. Examples go in
// chunks whose columns fit a bounded workspace (a number set by the geometry and the batch
// alone); each chunk is one im2col launch and one strided-batched GEMM. The weight gradient
// of a chunk is one partial per example, added in example order by one thread per weight, and
// the input gradient goes back from its columns by gathering (each input element sums the
// taps that read it, in a fixed order): no atomics anywhere, the same bits on every run.
#include "kernels/cuda/cuda_kernels.h"
#include "kernels/cuda/math.cuh"

// Floats of columns per chunk at most (64 MiB).
#define COL_MAX ((int64_t)1 << 24)

// 1x1, stride 1, no padding: the input already is the column matrix.
static bool is_direct(const gp_conv_geom *g) {
    return g->kernel == 1 && g->stride == 1 && g->pad == 0;
}

static int64_t kdim_of(const gp_conv_geom *g) { return g->channels * g->kernel * g->kernel; }
static int64_t npix_of(const gp_conv_geom *g) { return g->out_h * g->out_w; }

// Examples per chunk.
static int64_t chunk_of(const gp_conv_geom *g, int64_t batch) {
    const int64_t per = kdim_of(g) * npix_of(g);
    int64_t n = COL_MAX / (per > 0 ? per : 1);
    if (n < 1) n = 1;
    return n < batch ? n : (batch > 0 ? batch : 1);
}

// The backward workspace of a chunk: columns of x (none when direct), columns of dx when
// wanted, the examples' weight-gradient partials.
typedef struct bwd_layout {
    int64_t chunk, col, dcol, partial;
} bwd_layout;

static bwd_layout bwd_layout_of(const gp_conv_geom *g, int64_t batch, int64_t out_ch,
                                bool want_dx) {
    bwd_layout L;
    L.chunk = chunk_of(g, batch);
    const int64_t cols = L.chunk * kdim_of(g) * npix_of(g);
    L.col = is_direct(g) ? 0 : cols;
    L.dcol = want_dx && !is_direct(g) ? cols : 0;
    L.partial = L.chunk * out_ch * kdim_of(g);
    return L;
}

extern "C" int64_t gp_cuda_conv2d_ws(gp_device *dev, const gp_conv_geom *g, int64_t batch,
                                     int64_t out_ch, bool backward, bool want_dx) {
    if (!backward) return is_direct(g) ? 0 : chunk_of(g, batch) * kdim_of(g) * npix_of(g);
    const bwd_layout L = bwd_layout_of(g, batch, out_ch, want_dx);
    return L.col + L.dcol + L.partial;
}

// col (nb, K, P) of examples x (nb, C, H, W): row (c * k + ki) * k + kj of an example's
// columns, as the weights (OC, C, k, k) are laid out; taps outside the image are 0.
static __global__ void im2col_kernel(gp_conv_geom g, int64_t nb, const float *x, float *col) {
    const int64_t k = g.kernel, P = g.out_h * g.out_w, K = g.channels * k * k;
    GP_CUDA_FOR(i, nb * K * P) {
        const int64_t e = i / (K * P), row = i / P % K, p = i % P;
        const int64_t c = row / (k * k), ki = row / k % k, kj = row % k;
        const int64_t ih = p / g.out_w * g.stride - g.pad + ki;
        const int64_t iw = p % g.out_w * g.stride - g.pad + kj;
        col[i] = ih >= 0 && ih < g.height && iw >= 0 && iw < g.width
                     ? x[((e * g.channels + c) * g.height + ih) * g.width + iw]
                     : 0.0f;
    }
}

// dx (nb, C, H, W) = the adjoint of im2col on dcol: each input element adds the taps (ki, kj)
// that read it, in order.
static __global__ void col2im_kernel(gp_conv_geom g, int64_t nb, const float *dcol, float *dx) {
    const int64_t k = g.kernel, s = g.stride, P = g.out_h * g.out_w, K = g.channels * k * k;
    const int64_t hw = g.height * g.width;
    GP_CUDA_FOR(i, nb * g.channels * hw) {
        const int64_t e = i / (g.channels * hw), c = i / hw % g.channels;
        const int64_t ih = i % hw / g.width, iw = i % g.width;
        float acc = 0.0f;
        for (int64_t ki = 0; ki < k; ki++) {
            const int64_t th = ih + g.pad - ki; // oh * s
            if (th < 0 || th % s || th / s >= g.out_h) continue;
            for (int64_t kj = 0; kj < k; kj++) {
                const int64_t tw = iw + g.pad - kj;
                if (tw < 0 || tw % s || tw / s >= g.out_w) continue;
                acc += dcol[(e * K + (c * k + ki) * k + kj) * P + th / s * g.out_w + tw / s];
            }
        }
        dx[i] = acc;
    }
}

// The GEMMs read the weights as they are: no transform to make beforehand.
extern "C" int64_t gp_cuda_conv2d_wt_floats(gp_device *, const gp_conv_geom *, int64_t, bool) {
    return 0;
}

extern "C" gp_status gp_cuda_conv2d_wt(gp_device *, const gp_conv_geom *, int64_t, const float *,
                                       bool, float *) {
    return gp_error(GP_INVALID_ARGUMENT,
                    "conv2d_wt: the CUDA convolutions take no transformed weights "
                    "(conv2d_wt_floats is 0)");
}

extern "C" gp_status gp_cuda_conv2d_forward(gp_device *dev, const gp_conv_geom *g, int64_t batch,
                                            int64_t out_ch, const float *x, const float *w,
                                            const float *, float *y, float *ws) {
    gp_status s;
    gp_cuda_ctx *c = gp_cuda_begin(dev, &s);
    if (!c) return s;
    const int64_t K = kdim_of(g), P = npix_of(g), in_elems = g->channels * g->height * g->width;
    const int64_t chunk = chunk_of(g, batch);
    for (int64_t b0 = 0; b0 < batch; b0 += chunk) {
        const int64_t nb = batch - b0 < chunk ? batch - b0 : chunk;
        const float *col = x + b0 * in_elems;
        if (!is_direct(g)) {
            GP_CUDA_LAUNCH(c, im2col_kernel, nb * K * P, *g, nb, x + b0 * in_elems, ws);
            col = ws;
        }
        // y_b (OC, P) = W (OC, K) col_b (K, P), the same W for every example
        GP_TRY(gp_cuda_sgemm_strided(dev, false, false, out_ch, P, K, 1.0f, w, K, 0, col, P,
                                     K * P, 0.0f, y + b0 * out_ch * P, P, out_ch * P, nb));
    }
    return GP_OK;
}

// dw[i] += the chunk's partials of weight i, examples in order.
static __global__ void partial_reduce_kernel(int64_t n, int64_t nb, const float *partial,
                                             float *dw) {
    GP_CUDA_FOR(i, n) {
        float s = partial[i];
        for (int64_t e = 1; e < nb; e++) s += partial[e * n + i];
        dw[i] += s;
    }
}

extern "C" gp_status gp_cuda_conv2d_backward(gp_device *dev, const gp_conv_geom *g,
                                             int64_t batch, int64_t out_ch, const float *x,
                                             const float *w, const float *, const float *dy,
                                             float *dx, float *dw, float *ws) {
    gp_status s;
    gp_cuda_ctx *c = gp_cuda_begin(dev, &s);
    if (!c) return s;
    const int64_t K = kdim_of(g), P = npix_of(g), in_elems = g->channels * g->height * g->width;
    const bwd_layout L = bwd_layout_of(g, batch, out_ch, dx != NULL);
    float *col_ws = ws, *dcol = ws + L.col, *partial = ws + L.col + L.dcol;
    for (int64_t b0 = 0; b0 < batch; b0 += L.chunk) {
        const int64_t nb = batch - b0 < L.chunk ? batch - b0 : L.chunk;
        const float *dyb = dy + b0 * out_ch * P;
        if (dw) {
            const float *col = x + b0 * in_elems;
            if (!is_direct(g)) {
                GP_CUDA_LAUNCH(c, im2col_kernel, nb * K * P, *g, nb, x + b0 * in_elems, col_ws);
                col = col_ws;
            }
            // partial_b (OC, K) = dy_b (OC, P) col_b^T (P, K)
            GP_TRY(gp_cuda_sgemm_strided(dev, false, true, out_ch, K, P, 1.0f, dyb, P,
                                         out_ch * P, col, P, K * P, 0.0f, partial, K, out_ch * K,
                                         nb));
            GP_CUDA_LAUNCH(c, partial_reduce_kernel, out_ch * K, out_ch * K, nb, partial, dw);
        }
        if (dx) {
            // dcol_b (K, P) = W^T (K, OC) dy_b (OC, P); direct: that is dx_b itself
            float *target = is_direct(g) ? dx + b0 * in_elems : dcol;
            GP_TRY(gp_cuda_sgemm_strided(dev, true, false, K, P, out_ch, 1.0f, w, K, 0, dyb, P,
                                         out_ch * P, 0.0f, target, P, K * P, nb));
            if (!is_direct(g))
                GP_CUDA_LAUNCH(c, col2im_kernel, nb * in_elems, *g, nb, dcol, dx + b0 * in_elems);
        }
    }
    return GP_OK;
}

// ----------------------------------------------------------------------------- channel bias

static __global__ void bias_add_kernel(int64_t n, int64_t channels, int64_t npix,
                                       const float *bias, float *y) {
    GP_CUDA_FOR(i, n) y[i] += bias[i / npix % channels];
}

extern "C" gp_status gp_cuda_channel_bias_add(gp_device *dev, int64_t batch, int64_t channels,
                                              int64_t npix, const float *bias, float *y) {
    gp_status s;
    gp_cuda_ctx *c = gp_cuda_begin(dev, &s);
    if (!c) return s;
    const int64_t n = batch * channels * npix;
    if (n > 0) GP_CUDA_LAUNCH(c, bias_add_kernel, n, n, channels, npix, bias, y);
    return GP_OK;
}

// A block per channel: each example's plane summed in double in a fixed order, the examples in
// order, rounded once.
static __global__ void bias_grad_kernel(int64_t batch, int64_t channels, int64_t npix,
                                        const float *dy, float *db) {
    __shared__ double sh[GP_CUDA_THREADS];
    for (int64_t o = blockIdx.x; o < channels; o += gridDim.x) {
        double acc = 0;
        for (int64_t b = 0; b < batch; b++) {
            const float *p = dy + (b * channels + o) * npix;
            double t = 0;
            for (int64_t i = threadIdx.x; i < npix; i += blockDim.x) t += (double)p[i];
            acc += gp_block_sum(t, sh);
        }
        if (threadIdx.x == 0) db[o] += (float)acc;
    }
}

extern "C" gp_status gp_cuda_channel_bias_grad(gp_device *dev, int64_t batch, int64_t channels,
                                               int64_t npix, const float *dy, float *db) {
    gp_status s;
    gp_cuda_ctx *c = gp_cuda_begin(dev, &s);
    if (!c) return s;
    if (channels > 0) {
        const unsigned blocks =
            (unsigned)(channels < GP_CUDA_MAX_GRID ? channels : GP_CUDA_MAX_GRID);
        GP_CUDA_LAUNCH_BLOCKS(c, bias_grad_kernel, blocks, batch, channels, npix, dy, db);
    }
    return GP_OK;
}
