/* Every function a file compiled once per CPU variant (isa.h) defines for other files, renamed by
 * the variant's suffix (gp_cpu_fill -> gp_cpu_fill_avx2) where the build defines GP_ISA_VARIANT
 * (its name): the headers of those files include this one ahead of their declarations, so the
 * variants link side by side and each reaches only its own functions. A function missing here
 * is defined by every variant under one name, which the link refuses. */
#ifndef GP_KERNELS_CPU_ISA_NAMES_H
#define GP_KERNELS_CPU_ISA_NAMES_H

#ifdef GP_ISA_VARIANT
#define GP_ISA_CAT_(a, b) a##_##b
#define GP_ISA_CAT(a, b) GP_ISA_CAT_(a, b)
#define GP_ISA_NAME(name) GP_ISA_CAT(name, GP_ISA_VARIANT)

/* vector_kernels.c */
#define gp_cpu_fill GP_ISA_NAME(gp_cpu_fill)
#define gp_cpu_scale GP_ISA_NAME(gp_cpu_scale)
#define gp_cpu_axpy GP_ISA_NAME(gp_cpu_axpy)
#define gp_cpu_sum_rows_add GP_ISA_NAME(gp_cpu_sum_rows_add)
#define gp_cpu_sumsq GP_ISA_NAME(gp_cpu_sumsq)
#define gp_cpu_relu_forward GP_ISA_NAME(gp_cpu_relu_forward)
#define gp_cpu_relu_backward GP_ISA_NAME(gp_cpu_relu_backward)
#define gp_cpu_sgd_update GP_ISA_NAME(gp_cpu_sgd_update)
#define gp_cpu_adamw_update GP_ISA_NAME(gp_cpu_adamw_update)

/* transformer_kernels.c */
#define gp_cpu_linear_forward GP_ISA_NAME(gp_cpu_linear_forward)
#define gp_cpu_linear_backward GP_ISA_NAME(gp_cpu_linear_backward)
#define gp_cpu_layernorm_forward GP_ISA_NAME(gp_cpu_layernorm_forward)
#define gp_cpu_layernorm_backward GP_ISA_NAME(gp_cpu_layernorm_backward)
#define gp_cpu_gelu_forward GP_ISA_NAME(gp_cpu_gelu_forward)
#define gp_cpu_gelu_backward GP_ISA_NAME(gp_cpu_gelu_backward)
#define gp_cpu_dropout GP_ISA_NAME(gp_cpu_dropout)
#define gp_cpu_embedding_forward GP_ISA_NAME(gp_cpu_embedding_forward)
#define gp_cpu_embedding_backward GP_ISA_NAME(gp_cpu_embedding_backward)
#define gp_cpu_pos_embedding_forward GP_ISA_NAME(gp_cpu_pos_embedding_forward)
#define gp_cpu_pos_embedding_backward GP_ISA_NAME(gp_cpu_pos_embedding_backward)

/* attention_kernels.c */
#define gp_cpu_attention_forward GP_ISA_NAME(gp_cpu_attention_forward)
#define gp_cpu_attention_saved GP_ISA_NAME(gp_cpu_attention_saved)
#define gp_cpu_attention_backward_ws GP_ISA_NAME(gp_cpu_attention_backward_ws)
#define gp_cpu_attention_backward GP_ISA_NAME(gp_cpu_attention_backward)

/* loss_kernels.c */
#define gp_cpu_softmax_xent GP_ISA_NAME(gp_cpu_softmax_xent)

/* conv_kernels.c */
#define gp_cpu_conv2d_ws GP_ISA_NAME(gp_cpu_conv2d_ws)
#define gp_cpu_conv2d_wt_floats GP_ISA_NAME(gp_cpu_conv2d_wt_floats)
#define gp_cpu_conv2d_wt GP_ISA_NAME(gp_cpu_conv2d_wt)
#define gp_cpu_conv2d_forward GP_ISA_NAME(gp_cpu_conv2d_forward)
#define gp_cpu_conv2d_backward GP_ISA_NAME(gp_cpu_conv2d_backward)
#define gp_cpu_channel_bias_add GP_ISA_NAME(gp_cpu_channel_bias_add)
#define gp_cpu_channel_bias_grad GP_ISA_NAME(gp_cpu_channel_bias_grad)
#define gp_cpu_batchnorm_forward GP_ISA_NAME(gp_cpu_batchnorm_forward)
#define gp_cpu_batchnorm_backward GP_ISA_NAME(gp_cpu_batchnorm_backward)
#define gp_cpu_maxpool_forward GP_ISA_NAME(gp_cpu_maxpool_forward)
#define gp_cpu_maxpool_backward GP_ISA_NAME(gp_cpu_maxpool_backward)
#define gp_cpu_avgpool_forward GP_ISA_NAME(gp_cpu_avgpool_forward)
#define gp_cpu_avgpool_backward GP_ISA_NAME(gp_cpu_avgpool_backward)

/* shard_kernels.c */
#define gp_cpu_embedding_shard_forward GP_ISA_NAME(gp_cpu_embedding_shard_forward)
#define gp_cpu_embedding_shard_backward GP_ISA_NAME(gp_cpu_embedding_shard_backward)
#define gp_cpu_row_max GP_ISA_NAME(gp_cpu_row_max)
#define gp_cpu_xent_shard_sums GP_ISA_NAME(gp_cpu_xent_shard_sums)
#define gp_cpu_xent_shard_finish GP_ISA_NAME(gp_cpu_xent_shard_finish)

/* conv_direct.c */
#define gp_conv_direct_serves GP_ISA_NAME(gp_conv_direct_serves)
#define gp_conv_direct_dx GP_ISA_NAME(gp_conv_direct_dx)
#define gp_conv_direct_ws GP_ISA_NAME(gp_conv_direct_ws)
#define gp_conv_direct_forward GP_ISA_NAME(gp_conv_direct_forward)
#define gp_conv_direct_backward GP_ISA_NAME(gp_conv_direct_backward)

/* conv_winograd.c */
#define gp_conv_winograd_serves GP_ISA_NAME(gp_conv_winograd_serves)
#define gp_conv_winograd_ws GP_ISA_NAME(gp_conv_winograd_ws)
#define gp_conv_winograd_wt_floats GP_ISA_NAME(gp_conv_winograd_wt_floats)
#define gp_conv_winograd_weights GP_ISA_NAME(gp_conv_winograd_weights)
#define gp_conv_winograd_forward GP_ISA_NAME(gp_conv_winograd_forward)
#define gp_conv_winograd_dw_serves GP_ISA_NAME(gp_conv_winograd_dw_serves)
#define gp_conv_winograd_dw_ws GP_ISA_NAME(gp_conv_winograd_dw_ws)
#define gp_conv_winograd_dw GP_ISA_NAME(gp_conv_winograd_dw)

#endif /* GP_ISA_VARIANT */

#endif
