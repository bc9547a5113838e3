/* gp_transformer_block: one pre-LayerNorm GPT block as a single layer,
 *   h = x + drop0(attn(ln1(x)));  y = h + drop1(proj(gelu(fc(ln2(h))))),
 * residuals inside: the skeleton of block_skeleton.c without a group, its layout over the
 * tensor axis, and its shards (transformer_block_tp.c). */
#include "layers/block_skeleton.h"
#include "layers/transformer_block_tp.h"

/* Megatron's layout: attention by heads (qkv by rows, q, k and v alike; the output projection
 * by columns), the MLP by d_ff (fc by rows, its bias too; the output projection by columns);
 * layer norms and the output biases replicated. */
static void block_layout(const gp_layer *l, gp_layout *out) {
    const gp_block_impl *p = l->impl;
    *out = (gp_layout){.ndims = 2,
                       .dims = {{"heads", p->heads, "tensor"}, {"d_ff", p->d_ff, "tensor"}},
                       .nsplits = 6,
                       .splits = {{GP_BLK_QKV_W, 0, 3, 0},
                                  {GP_BLK_QKV_B, 0, 3, 0},
                                  {GP_BLK_PROJ_W, 1, 1, 0},
                                  {GP_BLK_FC_W, 0, 1, 1},
                                  {GP_BLK_FC_B, 0, 1, 1},
                                  {GP_BLK_MLP_W, 1, 1, 1}}};
}

static gp_layer *block_shard(const gp_layer *l, int nshards) {
    if (nshards == 1) return gp_layer_copy(l, sizeof(gp_block_impl)); /* replicated */
    const gp_block_impl *p = l->impl;
    return gp_transformer_block_shard(p->dim, p->heads, p->d_ff, p->dropout, nshards);
}

static const gp_layer_ops block_ops = {
    GP_BLOCK_OPS,
    .layout = block_layout,
    .shard = block_shard,
};

gp_layer *gp_transformer_block(int dim, int heads, int d_ff, float dropout) {
    if (dim < 1 || heads < 1 || dim % heads != 0 || d_ff < 1) {
        gp_error(GP_INVALID_ARGUMENT,
                 "gp_transformer_block: dim = %d must be a positive multiple of heads = %d, "
                 "and d_ff = %d must be >= 1",
                 dim, heads, d_ff);
        return NULL;
    }
    if (!(dropout >= 0.0f && dropout < 1.0f)) {
        gp_error(GP_INVALID_ARGUMENT,
                 "gp_transformer_block: dropout = %g must satisfy 0 <= p < 1", (double)dropout);
        return NULL;
    }
    const gp_block_impl p = {.dim = dim, .heads = heads, .d_ff = d_ff, .dropout = dropout,
                             .nshards = 1};
    return gp_block_new(&block_ops, &p);
}
