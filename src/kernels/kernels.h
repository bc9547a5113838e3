/* The kernel op table: every computation a layer, the loss or the optimizer does on tensor data,
 * one table per kind of device (kernels/cpu/ for the CPU; a GPU registers its own). Layers call
 * only the table of the device their tensors live on (gp_kernels_of), so a layer is written once
 * for every device. Pointers are device pointers of that device; scalars that come back to the
 * caller (a loss, a sum of squares) are host pointers. Every op returns a status; the CPU's fail
 * only on bad input they detect (a token id or label out of range), with a message that names
 * it, before writing any output.
 *
 * Determinism: every reduction adds in an order fixed by the op's code and the shapes, never by
 * timing, so the same inputs give the same bits on every run. On the CPU the order does not
 * depend on the number of threads either, except inside the GEMMs (gemm, gemm_batched and the
 * linear ops), which the same thread count cuts the same way. The CPU's order is documented
 * per op where the rest of the library relies on it.
 *
 * Each op's signature is written once, in kernel_ops.def, from which this table's members and
 * every device's prototypes and table are generated. */
#ifndef GP_KERNELS_KERNELS_H
#define GP_KERNELS_KERNELS_H

#include <stdbool.h>
#include <stdint.h>

#include "core/device.h"
#include "gpipe.h"

/* Causal multi-head attention dimensions: qkv (B, T, 3C), head h uses columns h*hd..(h+1)*hd-1
 * of each of q, k, v; head_dim hd = C / H. */
typedef struct gp_attn_dims {
    int64_t batch, seq, dim, heads; /* B, T, C, H */
} gp_attn_dims;

/* One 2-D convolution over one example, square kernel. */
typedef struct gp_conv_geom {
    int64_t channels, height, width; /* input (C, H, W) */
    int64_t kernel, stride, pad;
    int64_t out_h, out_w; /* (H + 2 pad - k) / stride + 1, same for W */
} gp_conv_geom;

/* NCHW planes of batch norm: (B, C, HW). */
typedef struct gp_bn_dims {
    int64_t batch, channels, hw;
    double eps, momentum;
} gp_bn_dims;

/* Max pooling without padding over `planes` (B * C) planes of (H, W). */
typedef struct gp_pool_dims {
    int64_t planes, height, width, out_h, out_w, kernel, stride;
} gp_pool_dims;

/* One AdamW update's scalars (PyTorch's rule, bias corrections precomputed by the caller). */
typedef struct gp_adamw_step {
    float decay;     /* 1 - lr * weight_decay (1: no decay) */
    float beta1, beta2, eps;
    float step_size; /* lr / (1 - beta1^t) */
    float bc2_sqrt;  /* sqrt(1 - beta2^t) */
} gp_adamw_step;

/* One device kind's ops (kernel_ops.def lists them, with what each computes). */
typedef struct gp_kernels {
    const char *name; /* "cpu" */
#define GP_KERNEL_OP(op, ret, params) ret(*op) params;
#include "kernels/kernel_ops.def"
#undef GP_KERNEL_OP
} gp_kernels;

/* The table for memory on dev; NULL (a host view) gets the CPU's, which works on host memory. */
const gp_kernels *gp_kernels_of(const gp_device *dev);
/* Whether memory on a and on b can go to one kernel call: the same device, or both host memory
 * (NULL or a device whose memory is the host's). */
bool gp_kernels_same_memory(const gp_device *a, const gp_device *b);

/* checks.c: the checks of the ops that read ids or labels, before they write anything (host
 * arrays): every id in [0, vocab) (named by position, row and column); every label in [-1,
 * classes) (-1: ignored; *counted, may be NULL, gets the others); a vocabulary shard
 * [first, first + rows) within [0, vocab) and not empty (`what` names it); the normalizer > 0
 * where any row is labelled. */
gp_status gp_kernels_check_ids(int64_t n, int64_t row_len, int64_t vocab, const int32_t *ids);
gp_status gp_kernels_check_labels(int64_t rows, int64_t classes, const int32_t *labels,
                                  int64_t *counted);
gp_status gp_kernels_check_shard(int64_t vocab, int64_t first, int64_t rows, const char *what);
gp_status gp_kernels_check_normalizer(double normalizer, int64_t counted);
/* A label smoothing in [0, 1), or an error naming it. */
gp_status gp_kernels_check_smoothing(double smoothing);

#endif
