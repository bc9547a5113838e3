/* One variant of the CPU kernels, compiled once per instruction set with the kernel files
 * (isa.h): its op table, and the features its code needs, read from the compiler's own
 * predefined macros for the flags the build gave. */
#include "kernels/cpu/isa.h"

#include "kernels/cpu/conv_direct.h"
#include "kernels/cpu/conv_winograd.h"
#include "kernels/cpu/cpu_kernels.h"
#include "kernels/cpu/simd.h"

#define GP_ISA_STR_(x) #x
#define GP_ISA_STR(x) GP_ISA_STR_(x)

static const gp_kernels cpu_kernels = {
    .name = "cpu",
    .gemm = gp_cpu_gemm,
    .gemm_batched = gp_cpu_gemm_batched,
    .fill = gp_cpu_fill,
    .scale = gp_cpu_scale,
    .axpy = gp_cpu_axpy,
    .sum_rows_add = gp_cpu_sum_rows_add,
    .sumsq = gp_cpu_sumsq,
    .linear_forward = gp_cpu_linear_forward,
    .linear_backward = gp_cpu_linear_backward,
    .layernorm_forward = gp_cpu_layernorm_forward,
    .layernorm_backward = gp_cpu_layernorm_backward,
    .gelu_forward = gp_cpu_gelu_forward,
    .gelu_backward = gp_cpu_gelu_backward,
    .dropout = gp_cpu_dropout,
    .attention_forward = gp_cpu_attention_forward,
    .attention_backward_ws = gp_cpu_attention_backward_ws,
    .attention_backward = gp_cpu_attention_backward,
    .embedding_forward = gp_cpu_embedding_forward,
    .embedding_backward = gp_cpu_embedding_backward,
    .pos_embedding_forward = gp_cpu_pos_embedding_forward,
    .pos_embedding_backward = gp_cpu_pos_embedding_backward,
    .softmax_xent = gp_cpu_softmax_xent,
    .conv2d_ws = gp_cpu_conv2d_ws,
    .conv2d_forward = gp_cpu_conv2d_forward,
    .conv2d_backward = gp_cpu_conv2d_backward,
    .channel_bias_add = gp_cpu_channel_bias_add,
    .channel_bias_grad = gp_cpu_channel_bias_grad,
    .batchnorm_forward = gp_cpu_batchnorm_forward,
    .batchnorm_backward = gp_cpu_batchnorm_backward,
    .relu_forward = gp_cpu_relu_forward,
    .relu_backward = gp_cpu_relu_backward,
    .maxpool_forward = gp_cpu_maxpool_forward,
    .maxpool_backward = gp_cpu_maxpool_backward,
    .avgpool_forward = gp_cpu_avgpool_forward,
    .avgpool_backward = gp_cpu_avgpool_backward,
    .sgd_update = gp_cpu_sgd_update,
    .adamw_update = gp_cpu_adamw_update,
    .embedding_shard_forward = gp_cpu_embedding_shard_forward,
    .embedding_shard_backward = gp_cpu_embedding_shard_backward,
    .row_max = gp_cpu_row_max,
    .xent_shard_sums = gp_cpu_xent_shard_sums,
    .xent_shard_finish = gp_cpu_xent_shard_finish,
};

/* The features the compiler was allowed to use here (x86-64's SSE and SSE2 go without saying). */
static const uint32_t needs = 0
#ifdef __SSE3__
    | GP_CPU_BIT(GP_CPU_SSE3)
#endif
#ifdef __SSSE3__
    | GP_CPU_BIT(GP_CPU_SSSE3)
#endif
#ifdef __SSE4_1__
    | GP_CPU_BIT(GP_CPU_SSE41)
#endif
#ifdef __SSE4_2__
    | GP_CPU_BIT(GP_CPU_SSE42)
#endif
#ifdef __POPCNT__
    | GP_CPU_BIT(GP_CPU_POPCNT)
#endif
#ifdef __AVX__
    | GP_CPU_BIT(GP_CPU_AVX)
#endif
#ifdef __AVX2__
    | GP_CPU_BIT(GP_CPU_AVX2)
#endif
#ifdef __FMA__
    | GP_CPU_BIT(GP_CPU_FMA)
#endif
#ifdef __BMI__
    | GP_CPU_BIT(GP_CPU_BMI1)
#endif
#ifdef __BMI2__
    | GP_CPU_BIT(GP_CPU_BMI2)
#endif
#ifdef __F16C__
    | GP_CPU_BIT(GP_CPU_F16C)
#endif
#ifdef __LZCNT__
    | GP_CPU_BIT(GP_CPU_LZCNT)
#endif
#ifdef __MOVBE__
    | GP_CPU_BIT(GP_CPU_MOVBE)
#endif
#ifdef __AVX512F__
    | GP_CPU_BIT(GP_CPU_AVX512F)
#endif
#ifdef __AVX512BW__
    | GP_CPU_BIT(GP_CPU_AVX512BW)
#endif
#ifdef __AVX512CD__
    | GP_CPU_BIT(GP_CPU_AVX512CD)
#endif
#ifdef __AVX512DQ__
    | GP_CPU_BIT(GP_CPU_AVX512DQ)
#endif
#ifdef __AVX512VL__
    | GP_CPU_BIT(GP_CPU_AVX512VL)
#endif
    ;

const gp_cpu_variant GP_ISA_NAME(gp_cpu_variant) = {
    .name = GP_ISA_STR(GP_ISA_VARIANT),
    .needs = needs,
    .kernels = &cpu_kernels,
    .conv_tiles = GP_HAVE_AVX2,
    .expf = gp_cpu_expf,
    .tanhf = gp_cpu_tanhf,
    .tanh = gp_cpu_tanh,
    .conv_direct_applies = gp_conv_direct_applies,
    .conv_winograd_applies = gp_conv_winograd_applies,
    .conv_winograd_dw_applies = gp_conv_winograd_dw_applies,
};
