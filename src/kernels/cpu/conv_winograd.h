/* 3x3 stride-1 convolutions by Winograd's minimal filtering F(2x2, 3x3), for the CPU's conv2d
 * in the kernels' variants with AVX2 and FMA (isa.h).
 *
 * Each 2x2 block of outputs is A^T [ U (.) V ] A, with V = B^T d B the transform of the 4x4
 * input tile d under it and U = G w G^T the transform of a 3x3 kernel: 16 multiplies per channel
 * pair where the direct sum has 36. Across channels the 16 products are 16 independent matrix
 * products M_p (OC, tiles) = U_p (OC, C) V_p (C, tiles), which run on a register tile of 6 output
 * channels by 16 tiles reading V_p row by row; the transforms run on 8 tiles at a time.
 *
 * Rounding differs from the direct sum (within a few units in the last place of the largest
 * term; test_kernels compares both with the float64 reference) but not with the threads or the
 * batch: each output is the same expression of its tile's inputs, the sum over channels in
 * channel order, whatever chunk or thread holds the tile. The input gradient of such a
 * convolution is one too (the flipped convolution, gp_conv_dx_geom), so it runs here as well;
 * so does the weight gradient, dw = G^T [sum over tiles of (A dy A^T) . V] G, summed in groups
 * of tile rows fixed by the batch and the geometry (not by the threads). */
#ifndef GP_KERNELS_CPU_CONV_WINOGRAD_H
#define GP_KERNELS_CPU_CONV_WINOGRAD_H

#include <stdbool.h>
#include <stdint.h>

#include "core/device.h"
#include "kernels/cpu/isa_names.h"
#include "kernels/kernel_table.h"

/* Whether this path serves a convolution of g with oc output channels: the variant has AVX2
 * and FMA, the path is on (conv_path.h), g is 3x3 at stride 1 with padding 1, and its channels
 * are within the range where it was measured faster than the direct tile (the variant in use's
 * answers, for tests: gp_conv_winograd_applies and gp_conv_winograd_dw_applies, isa.h). */
bool gp_conv_winograd_serves(const gp_conv_geom *g, int64_t oc);

/* Workspace floats of gp_conv_winograd_forward. */
int64_t gp_conv_winograd_ws(gp_device *dev, const gp_conv_geom *g, int64_t batch, int64_t oc);
/* Floats of the weights' transform U (gp_conv_winograd_weights): a pure function of the
 * weights, the channels and flipped, which the forward otherwise makes in its workspace. */
int64_t gp_conv_winograd_wt_floats(const gp_conv_geom *g, int64_t oc);
/* U (gp_conv_winograd_wt_floats) = the transform of w as gp_conv_winograd_forward takes it. */
void gp_conv_winograd_weights(gp_device *dev, const gp_conv_geom *g, int64_t oc, const float *w,
                              bool flipped, float *U);
/* y (batch, oc, H, W) = the convolution of x (batch, C, H, W) with w (oc, C, 3, 3), padding 1,
 * or, flipped, with w (C, oc, 3, 3) flipped (gp_conv_flip_weights: the input gradient of the
 * convolution with those weights, x its output gradient); the threads split chunks of rows of
 * tiles. U: NULL, or gp_conv_winograd_weights of the same w and flipped, read instead of
 * transforming w into the workspace (the same bits). */
void gp_conv_winograd_forward(gp_device *dev, const gp_conv_geom *g, int64_t batch, int64_t oc,
                              const float *x, const float *w, const float *U, bool flipped,
                              float *y, float *ws);

/* Whether gp_conv_winograd_dw serves the weight gradient of g at this batch (where
 * gp_conv_winograd_serves and the batch has enough tiles). */
bool gp_conv_winograd_dw_serves(const gp_conv_geom *g, int64_t batch, int64_t oc);
/* Workspace floats of gp_conv_winograd_dw. */
int64_t gp_conv_winograd_dw_ws(gp_device *dev, const gp_conv_geom *g, int64_t batch, int64_t oc);
/* dw (oc, C, 3, 3) += the weight gradient of the convolution of x (batch, C, H, W) with output
 * gradient dy (batch, oc, H, W): per position of the transformed tiles, the output gradient's
 * transforms times the input's over the batch's tiles, summed in groups of tile rows fixed by
 * the batch and the geometry, groups in order (the threads split the groups). */
void gp_conv_winograd_dw(gp_device *dev, const gp_conv_geom *g, int64_t batch, int64_t oc,
                         const float *x, const float *dy, float *dw, float *ws);

#endif
