/* The built-in model families: the GPT-style Transformer LM of workload T1 (and GPT-2, the same
 * layers with tied, padded embeddings) and the Fashion-MNIST ConvNet of workload C1
 * (docs/WORKLOADS.md). */
#include <stdint.h>

#include "core/error.h"
#include "gpipe.h"

gp_transformer_config gp_transformer_defaults(void) {
    return (gp_transformer_config){.vocab = 256, .dim = 512, .heads = 8, .d_ff = 2048,
                                   .layers = 8, .seq_len = 128, .dropout = 0.0f};
}

gp_transformer_config gp_gpt2_defaults(void) {
    return (gp_transformer_config){.vocab = 50257, .vocab_padded = 50304, .dim = 768,
                                   .heads = 12, .d_ff = 3072, .layers = 12, .seq_len = 1024,
                                   .max_len = 1024, .dropout = 0.0f, .tie_embeddings = true};
}

gp_convnet_config gp_convnet_defaults(void) {
    return (gp_convnet_config){.in_ch = 1, .height = 28, .width = 28, .classes = 10,
                               .ch1 = 32, .ch2 = 64, .hidden = 256};
}

#define ADD(layer)                                                         \
    do {                                                                   \
        gp_status s_ = gp_model_add(m, (layer));                           \
        if (s_ != GP_OK) {                                                 \
            gp_model_free(m);                                              \
            return s_;                                                     \
        }                                                                  \
    } while (0)

gp_status gp_model_transformer(const gp_transformer_config *c, gp_model **out) {
    if (!c || !out) return gp_error(GP_INVALID_ARGUMENT, "gp_model_transformer: NULL argument");
    *out = NULL;
    if (c->vocab < 1 || c->dim < 1 || c->heads < 1 || c->d_ff < 1 || c->layers < 0 ||
        c->seq_len < 1)
        return gp_error(GP_CONFIG,
                        "transformer: vocab %d, dim %d, heads %d, d_ff %d, seq_len %d must be >= 1 "
                        "and layers %d >= 0",
                        c->vocab, c->dim, c->heads, c->d_ff, c->seq_len, c->layers);
    const int rows = c->vocab_padded ? c->vocab_padded : c->vocab;
    const int max_len = c->max_len ? c->max_len : c->seq_len;
    if (rows < c->vocab || max_len < c->seq_len)
        return gp_error(GP_CONFIG,
                        "transformer: vocab_padded %d must be >= vocab %d (or 0), and max_len %d "
                        ">= seq_len %d (or 0)",
                        c->vocab_padded, c->vocab, c->max_len, c->seq_len);
    gp_model *m;
    GP_TRY(gp_model_new(gp_shape1(c->seq_len), GP_I32, &m));
    ADD(gp_embedding(rows, c->dim));
    ADD(gp_pos_embedding(max_len, c->dim));
    for (int i = 0; i < c->layers; i++)
        ADD(gp_transformer_block(c->dim, c->heads, c->d_ff, c->dropout));
    ADD(gp_layernorm(c->dim));
    ADD(gp_linear_padded(c->dim, c->vocab, false, rows));
    if (c->tie_embeddings) {
        gp_status s = gp_model_tie_embeddings(m);
        if (s != GP_OK) {
            gp_model_free(m);
            return s;
        }
    }
    *out = m;
    return GP_OK;
}

gp_status gp_model_convnet(const gp_convnet_config *c, gp_model **out) {
    if (!c || !out) return gp_error(GP_INVALID_ARGUMENT, "gp_model_convnet: NULL argument");
    *out = NULL;
    if (c->in_ch < 1 || c->height < 4 || c->width < 4 || c->classes < 1 || c->ch1 < 1 ||
        c->ch2 < 1 || c->hidden < 1)
        return gp_error(GP_CONFIG,
                        "convnet: in_ch %d, classes %d, ch1 %d, ch2 %d, hidden %d must be >= 1 and "
                        "height %d, width %d >= 4 (two 2x2 poolings)",
                        c->in_ch, c->classes, c->ch1, c->ch2, c->hidden, c->height, c->width);
    gp_model *m;
    GP_TRY(gp_model_new(gp_shape3(c->in_ch, c->height, c->width), GP_F32, &m));
    int chans[4][2] = {{c->in_ch, c->ch1}, {c->ch1, c->ch1}, {c->ch1, c->ch2}, {c->ch2, c->ch2}};
    for (int i = 0; i < 4; i++) {
        ADD(gp_conv2d(chans[i][0], chans[i][1], 3, 1, 1, false));
        ADD(gp_batchnorm2d(chans[i][1]));
        ADD(gp_relu());
        if (i % 2 == 1) ADD(gp_maxpool2d(2, 2));
    }
    ADD(gp_flatten());
    int64_t flat = (int64_t)c->ch2 * (c->height / 4) * (c->width / 4);
    if (flat > INT32_MAX) {
        gp_model_free(m);
        return gp_error(GP_CONFIG, "convnet: %d channels of %dx%d after pooling is %lld features, "
                                   "more than a linear layer takes (%d)",
                        c->ch2, c->height / 4, c->width / 4, (long long)flat, INT32_MAX);
    }
    ADD(gp_linear((int)flat, c->hidden, true));
    ADD(gp_relu());
    ADD(gp_linear(c->hidden, c->classes, true));
    *out = m;
    return GP_OK;
}
