/* Convolutions without im2col: an AVX2/FMA register tile that reads the taps straight from a
 * zero-padded copy of each example, for the CPU's conv2d in the kernels' variants with AVX2 and
 * FMA (isa.h).
 *
 * The im2col path writes every example's K x P column matrix, OpenBLAS packs it again, and a
 * chunk of examples' outputs is scattered back to NCHW: at the small channel counts of the
 * ConvNets (24-96) that costs a good part of a convolution's time. Here a tile of MR output
 * pixels by NR x 8 output channels (12 accumulators; 8 in the 8 x 8 tile) walks the K taps,
 * each step broadcasting one input value per pixel from the padded image (an address, not a
 * copy) against NR vectors of the packed weights, and stores NCHW outputs; the weight gradient is the
 * same tile with taps for pixels and pixels (of a chunk of examples) for the steps. The widths
 * come from the channel count (multiples of 24 in panels of 24, others in panels of 16 and
 * one of 8) so that few lanes are padding.
 *
 * Sums run in an order fixed by the geometry and the batch alone: over the taps in order for
 * an output; over a chunk's examples and pixels in order for the weight gradient, chunks in
 * order. The bits therefore do not depend on the number of threads. The tests run every
 * convolution case on both paths (test_kernels). */
#ifndef GP_KERNELS_CPU_CONV_DIRECT_H
#define GP_KERNELS_CPU_CONV_DIRECT_H

#include <stdbool.h>
#include <stdint.h>

#include "core/device.h"
#include "kernels/cpu/isa_names.h"
#include "kernels/kernel_table.h"

/* Whether this path serves a convolution of g with oc output channels: the variant has AVX2
 * and FMA, the path is on (conv_path.h), and one example's buffers stay within bounds (the
 * variant in use's answer, for tests: gp_conv_direct_applies, isa.h). */
bool gp_conv_direct_serves(const gp_conv_geom *g, int64_t oc);

/* Whether gp_conv_direct_backward computes the input gradient of g: at stride 1 as the
 * flipped convolution (gp_conv_dx_geom), at larger strides phase by phase; not for a 1x1
 * convolution without padding (one GEMM, W^T dy, does it) nor at stride 1 with padding beyond
 * k - 1. */
bool gp_conv_direct_dx(const gp_conv_geom *g, int64_t oc);
/* Workspace floats of gp_conv_direct_forward (backward false) or gp_conv_direct_backward
 * (with the input gradient, where gp_conv_direct_dx, or without one). */
int64_t gp_conv_direct_ws(gp_device *dev, const gp_conv_geom *g, int64_t batch, int64_t oc,
                          bool backward, bool with_dx);
/* y (batch, oc, P) = the convolution of x (batch, C, H, W) with w (oc, C, k, k); the threads
 * split the examples. */
void gp_conv_direct_forward(gp_device *dev, const gp_conv_geom *g, int64_t batch, int64_t oc,
                            const float *x, const float *w, float *y, float *ws);
/* dw += the weight gradient (if dw), dx = the input gradient (if dx; only where
 * gp_conv_direct_dx). At stride s the input pixels split into s x s phases by (ih + pad) mod s
 * and (iw + pad) mod s, each receiving only every s-th tap: per phase the tile runs a stride-1
 * correlation of a padded copy of dy with that sub-kernel, over the phase's pixels. The weight gradient goes chunk by chunk of
 * examples (a number fixed by the geometry and the batch): their inputs padded and dy
 * transposed into shared buffers (the threads splitting the examples), then the chunk's tiles
 * split over the threads, each adding its sum over the chunk's examples and pixels, in order,
 * into dw: dw = ((dw + chunk 0) + chunk 1) + ... on any number of threads. */
void gp_conv_direct_backward(gp_device *dev, const gp_conv_geom *g, int64_t batch, int64_t oc,
                             const float *x, const float *w, const float *dy, float *dx,
                             float *dw, float *ws);

#endif
