/* NCCL in the CUDA module (nccl.c, built with GP_NCCL): the table the module's entry hands the
 * library (kernels/cuda_module.h, gp_nccl_calls). */
#ifndef GP_KERNELS_CUDA_NCCL_H
#define GP_KERNELS_CUDA_NCCL_H

#include "kernels/cuda_module.h"

#ifdef GP_HAVE_NCCL
extern const gp_nccl_calls gp_cuda_nccl_calls;
#endif

#endif
