// CUDA optimizer updates over flat arrays (AdamW's four floats a thread: math.cuh), the CPU's
// formulas step for step (no contraction into FMAs: -fmad=false), so the updates match the
// CPU's bit for bit.
#include "kernels/cuda/cuda_kernels.h"
#include "kernels/cuda/math.cuh"

static __global__ void sgd_kernel(int64_t n, float *w, const float *g, float *buf, float lr,
                                  float wd, float momentum) {
    GP_CUDA_FOR(i, n) {
        if (buf) {
            const float d = g[i] + wd * w[i];
            buf[i] = momentum * buf[i] + d;
            w[i] -= lr * buf[i];
        } else {
            w[i] -= lr * (g[i] + wd * w[i]);
        }
    }
}

extern "C" gp_status gp_cuda_sgd_update(gp_device *dev, int64_t n, float *w, const float *g,
                                        float *buf, float lr, float wd, float momentum) {
    gp_status s;
    gp_cuda_ctx *c = gp_cuda_begin(dev, &s);
    if (!c) return s;
    if (n > 0) GP_CUDA_LAUNCH(c, sgd_kernel, n, n, w, g, buf, lr, wd, momentum);
    return GP_OK;
}

// One element of AdamW: m and v updated, the new w returned.
__device__ inline float adamw1(float w, float g, float *m, float *v, const gp_adamw_step &st) {
    const float wi = w * st.decay;
    const float mi = *m * st.beta1 + g * (1.0f - st.beta1);
    const float vi = *v * st.beta2 + g * g * (1.0f - st.beta2);
    *m = mi;
    *v = vi;
    const float denom = sqrtf(vi) / st.bc2_sqrt + st.eps;
    return wi - st.step_size * (mi / denom);
}

static __global__ void adamw_kernel(int64_t n, float *w, const float *g, float *m, float *v,
                                    gp_adamw_step st, bool vec) {
    const int64_t n4 = gp_cuda_vecs(vec, n);
    GP_CUDA_FOR(i, n4) {
        float wv[4], gv[4], mv[4], vv[4];
        gp_ld4(w, i, wv);
        gp_ld4(g, i, gv);
        gp_ld4(m, i, mv);
        gp_ld4(v, i, vv);
        for (int k = 0; k < 4; k++) wv[k] = adamw1(wv[k], gv[k], &mv[k], &vv[k], st);
        gp_st4(m, i, mv);
        gp_st4(v, i, vv);
        gp_st4(w, i, wv);
    }
    GP_CUDA_FOR_TAIL(i, n4, n) w[i] = adamw1(w[i], g[i], &m[i], &v[i], st);
}

extern "C" gp_status gp_cuda_adamw_update(gp_device *dev, int64_t n, float *w, const float *g,
                                          float *m, float *v, const gp_adamw_step *st) {
    gp_status s;
    gp_cuda_ctx *c = gp_cuda_begin(dev, &s);
    if (!c) return s;
    if (n <= 0) return GP_OK;
    const bool vec = gp_cuda_aligned16(w, g, m, v);
    adamw_kernel<<<gp_cuda_vec_blocks(vec, n), GP_CUDA_THREADS, 0, c->stream>>>(n, w, g, m, v,
                                                                               *st, vec);
    return gp_cuda_launched(c, "adamw_kernel");
}
