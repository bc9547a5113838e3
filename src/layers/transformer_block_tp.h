/* The Transformer block's shards over the tensor axis (transformer_block_tp.c). */
#ifndef GP_LAYERS_TRANSFORMER_BLOCK_TP_H
#define GP_LAYERS_TRANSFORMER_BLOCK_TP_H

#include "layers/layer_base.h"

/* The shard block of gp_transformer_block(dim, heads, d_ff, dropout) for nshards (heads and
 * d_ff divisible by it). */
gp_layer *gp_transformer_block_shard(int dim, int heads, int d_ff, float dropout, int nshards);

#endif
