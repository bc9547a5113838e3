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
 * every device's prototypes and table are generated. This header is the table's type and the
 * types of its arguments; kernels.h finds a device's table. */
#ifndef GP_KERNELS_KERNEL_TABLE_H
#define GP_KERNELS_KERNEL_TABLE_H

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

#endif
