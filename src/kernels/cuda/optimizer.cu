// CUDA optimizer updates over flat arrays: one thread per element, the CPU's formulas step for
// step (no contraction into FMAs: -fmad=false), so the updates match the CPU's bit for bit.
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

static __global__ void adamw_kernel(int64_t n, float *w, const float *g, float *m, float *v,
                                    gp_adamw_step st) {
    GP_CUDA_FOR(i, n) {
        const float wi = w[i] * st.decay;
        const float mi = m[i] * st.beta1 + g[i] * (1.0f - st.beta1);
        const float vi = v[i] * st.beta2 + g[i] * g[i] * (1.0f - st.beta2);
        m[i] = mi;
        v[i] = vi;
        const float denom = sqrtf(vi) / st.bc2_sqrt + st.eps;
        w[i] = wi - st.step_size * (mi / denom);
    }
}

extern "C" gp_status gp_cuda_adamw_update(gp_device *dev, int64_t n, float *w, const float *g,
                                          float *m, float *v, const gp_adamw_step *st) {
    gp_status s;
    gp_cuda_ctx *c = gp_cuda_begin(dev, &s);
    if (!c) return s;
    if (n > 0) GP_CUDA_LAUNCH(c, adamw_kernel, n, n, w, g, m, v, *st);
    return GP_OK;
}
