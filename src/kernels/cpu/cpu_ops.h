/* The CPU's implementation of the op table (kernel_ops.def), gp_cpu_<op>, one function per op,
 * defined by gemm.c (compiled once), and, in each variant (isa.h, whose isa_names.h renames
 * them), by vector_kernels.c (vectors, ReLU, optimizer updates), transformer_kernels.c (linear,
 * layer norm, GELU, dropout, embeddings), attention_kernels.c, loss_kernels.c, conv_kernels.c
 * (convolutions, channel biases, batch norm, pooling) and shard_kernels.c (the tensor-parallel
 * shards' ops); isa_table.c puts them in each variant's table. Each takes the table's
 * arguments; dev is unused on the CPU (there is no queue). */
#ifndef GP_KERNELS_CPU_CPU_OPS_H
#define GP_KERNELS_CPU_CPU_OPS_H

#include "kernels/cpu/isa_names.h"
#include "kernels/kernel_table.h"

#define GP_KERNEL_OP(op, ret, params) ret gp_cpu_##op params;
#include "kernels/kernel_ops.def"
#undef GP_KERNEL_OP

#endif
