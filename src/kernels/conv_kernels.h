/* CPU kernels of the ConvNet layers: im2col / col2im (convolution as GEMM) and
 * double-precision reductions in a fixed lane order (same bits on any compiler). */
#ifndef GP_KERNELS_CONV_KERNELS_H
#define GP_KERNELS_CONV_KERNELS_H

#include <stdint.h>

/* Geometry of one 2-D convolution over one example, square kernel. */
typedef struct gp_conv_geom {
    int64_t channels, height, width; /* input (C, H, W) */
    int64_t kernel, stride, pad;
    int64_t out_h, out_w; /* (H + 2 pad - k) / stride + 1, same for W */
} gp_conv_geom;

/* col (C*k*k, (oh1-oh0)*OW) <- the patches of output rows [oh0, oh1) of x
 * (C, H, W); out-of-image taps are 0. Row r = (c*k + ki)*k + kj matches the
 * weight layout (OC, C, k, k). A band of rows keeps the columns in cache. */
void gp_im2col(const gp_conv_geom *g, const float *x, int64_t oh0, int64_t oh1, float *col);
/* x (C, H, W) += the patches in col (C*k*k, (oh1-oh0)*OW): the adjoint of
 * gp_im2col. */
void gp_col2im_add(const gp_conv_geom *g, const float *col, int64_t oh0, int64_t oh1, float *x);

/* sum x[i], in double, in a fixed order. */
double gp_sum_f64(const float *x, int64_t n);
/* sum (x[i] - mean)^2, in double, in a fixed order. */
double gp_sumsq_dev_f64(const float *x, int64_t n, double mean);
/* sum a[i] * (b[i] - mean_b), in double, in a fixed order. */
double gp_dot_dev_f64(const float *a, const float *b, int64_t n, double mean_b);

#endif
