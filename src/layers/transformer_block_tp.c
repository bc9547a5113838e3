/* One shard of a pre-LN Transformer block split over the tensor axis (Megatron's layout): the
 * shard holds H/T heads (its rows of qkv, its columns of the attention's output projection) and
 * d_ff/T hidden units (its rows of fc, its columns of the MLP's output projection); layer norms
 * and the two output biases are replicated. Forward: two all-reduces of (B, T, C) (after each
 * row-parallel projection); backward: two more (the partial input gradients of the attention's
 * qkv and of the MLP's fc, before their layer norms). Every shard holds the whole activation
 * between blocks, the same bits on every shard. */
#include "layers/block_skeleton.h"
#include "layers/transformer_block_tp.h"

/* The skeleton of block_skeleton.c in the call's group; no layout or shards of its own. */
static const gp_layer_ops shard_ops = {
    GP_BLOCK_OPS,
};

gp_layer *gp_transformer_block_shard(int dim, int heads, int d_ff, float dropout, int nshards) {
    if (nshards < 1 || heads % nshards || d_ff % nshards || dim % heads) {
        gp_error(GP_CONFIG,
                 "transformer_block: heads = %d and d_ff = %d must divide by %d shards (dim %d)",
                 heads, d_ff, nshards, dim);
        return NULL;
    }
    const gp_block_impl p = {.dim = dim, .heads = heads, .d_ff = d_ff, .dropout = dropout,
                             .nshards = nshards, .shard = true};
    return gp_block_new(&shard_ops, &p);
}
