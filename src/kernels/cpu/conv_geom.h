/* What both convolution paths of the CPU (im2col with OpenBLAS, conv_kernels.c; the direct tile,
 * conv_direct.c) share: the input gradient of a stride-1 convolution as a convolution. */
#ifndef GP_KERNELS_CPU_CONV_GEOM_H
#define GP_KERNELS_CPU_CONV_GEOM_H

#include <stdbool.h>
#include <stdint.h>

#include "kernels/kernel_table.h"

/* The input gradient of a stride-1 convolution is itself a stride-1 convolution: of dy with
 * the weights flipped in space and with their channel axes swapped, padded by k - 1 - pad.
 * It writes dx once, instead of a K x P dcol that col2im adds back onto dx. *gt is that
 * convolution's geometry; false for other strides, for padding beyond k - 1, and for 1x1
 * convolutions without padding (their dx is one GEMM, W^T dy). */
static inline bool gp_conv_dx_geom(const gp_conv_geom *g, int64_t out_ch, gp_conv_geom *gt) {
    if (g->stride != 1 || g->pad > g->kernel - 1 || (g->kernel == 1 && g->pad == 0)) return false;
    *gt = (gp_conv_geom){.channels = out_ch, .height = g->out_h, .width = g->out_w,
                         .kernel = g->kernel, .stride = 1, .pad = g->kernel - 1 - g->pad,
                         .out_h = g->height, .out_w = g->width};
    return true;
}

/* wflip (C, OC, k, k) [c][o][ki][kj] = w (OC, C, k, k) [o][c][k-1-ki][k-1-kj]. */
static inline void gp_conv_flip_weights(const gp_conv_geom *g, int64_t oc, const float *w,
                                        float *wflip) {
    const int64_t C = g->channels, k = g->kernel, kk = k * k;
    for (int64_t c = 0; c < C; c++)
        for (int64_t o = 0; o < oc; o++)
            for (int64_t i = 0; i < kk; i++)
                wflip[(c * oc + o) * kk + i] = w[(o * C + c) * kk + (kk - 1 - i)];
}

#endif
