/* The split backward (zero-bubble schedules): for every layer kind that splits its backward into
 * an input part and a weight part (linear with and without bias, conv2d with and without bias,
 * the token and position embeddings, causal attention and the Transformer block with dropout,
 * the residual block with an identity and a projection shortcut), training under zbh1 gives the
 * losses and parameters of gpipe bit for bit, on one stage (every layer split) and on two;
 * the kinds that do not split (layer norm, batch norm, activations, pooling) run whole in the
 * input part alongside them; and the tensor-parallel shards of the sequence model's kinds on
 * T = 2. */
#include <stdlib.h>
#include <string.h>

#include "layers/layer.h"
#include "testutil.h"

#define BATCH 4
#define M 2
#define STEPS 2

static const char *const SEQ_MODEL =
    "{\"input\": {\"shape\": [6], \"dtype\": \"int32\"}, \"layers\": ["
    "{\"kind\": \"embedding\", \"vocab\": 10, \"dim\": 8},"
    "{\"kind\": \"pos_embedding\", \"max_len\": 16, \"dim\": 8},"
    "{\"kind\": \"causal_attention\", \"dim\": 8, \"heads\": 2, \"dropout\": 0.1},"
    "{\"kind\": \"transformer_block\", \"dim\": 8, \"heads\": 2, \"d_ff\": 12, \"dropout\": 0.2},"
    "{\"kind\": \"layernorm\", \"dim\": 8},"
    "{\"kind\": \"linear\", \"in\": 8, \"out\": 8, \"bias\": true},"
    "{\"kind\": \"gelu\"},"
    "{\"kind\": \"linear\", \"in\": 8, \"out\": 10, \"bias\": false}]}";

static const char *const IMAGE_MODEL =
    "{\"input\": {\"shape\": [1, 8, 8], \"dtype\": \"float32\"}, \"layers\": ["
    "{\"kind\": \"conv2d\", \"in\": 1, \"out\": 4, \"kernel\": 3, \"pad\": 1, \"bias\": true},"
    "{\"kind\": \"batchnorm2d\", \"channels\": 4},"
    "{\"kind\": \"relu\"},"
    "{\"kind\": \"residual_block\", \"in\": 4, \"out\": 4},"
    "{\"kind\": \"residual_block\", \"in\": 4, \"out\": 8, \"stride\": 2},"
    "{\"kind\": \"conv2d\", \"in\": 8, \"out\": 8, \"kernel\": 3, \"pad\": 1, \"bias\": false},"
    "{\"kind\": \"maxpool2d\", \"kernel\": 2},"
    "{\"kind\": \"flatten\"},"
    "{\"kind\": \"linear\", \"in\": 32, \"out\": 3}]}";

typedef struct batch {
    int32_t ids[BATCH * 6], labels[BATCH * 6];
    float img[BATCH * 64];
    int32_t classes[BATCH];
    gp_tensor x, y;
} batch;

static void make_batch(bool seq, int step, batch *b) {
    gp_rng_stream s = {.seed = 77, .purpose = GP_RNG_TEST, .a = (uint64_t)step};
    if (seq) {
        for (int i = 0; i < BATCH * 6; i++) {
            b->ids[i] = (int32_t)(gp_rng_u64(&s, (uint64_t)i) % 10);
            b->labels[i] = (int32_t)(gp_rng_u64(&s, (uint64_t)(1000 + i)) % 10);
        }
        b->x = gp_tensor_view(b->ids, gp_shape2(BATCH, 6), GP_I32);
        b->y = gp_tensor_view(b->labels, gp_shape2(BATCH, 6), GP_I32);
    } else {
        gp_rng_normal(&s, 0, b->img, BATCH * 64);
        for (int i = 0; i < BATCH; i++) b->classes[i] = (int32_t)(gp_rng_u64(&s, 5000u + i) % 3);
        b->x = gp_tensor_view(b->img, gp_shape4(BATCH, 1, 8, 8), GP_F32);
        b->y = gp_tensor_view(b->classes, gp_shape1(BATCH), GP_I32);
    }
}

typedef struct outcome {
    float loss[STEPS];
    uint64_t hash;
} outcome;

static void train(const char *json, int K, int T, gp_schedule_kind sk, gp_remat rm,
                  outcome *out) {
    gp_model *m;
    REQUIRE_OK(gp_model_from_json_string(json, "test", &m));
    const bool seq = gp_model_input_dtype(m) == GP_I32;
    gp_optim_opts o = seq ? gp_adamw_defaults(1e-2f, 0.01f) : gp_sgd_defaults(0.1f, 0.9f);
    gp_pipeline_opts po = {.stages = K, .micro_batches = M, .schedule = sk, .remat = rm,
                           .batch = BATCH, .tensor_parallel = T};
    gp_pipeline *p;
    REQUIRE_OK(gp_pipeline_new(m, &o, &po, 3, &p));
    for (int s = 0; s < STEPS; s++) {
        batch b;
        make_batch(seq, s, &b);
        CHECK_OK(gp_pipeline_step(p, &b.x, &b.y, &out->loss[s]));
    }
    /* through the stages (with T > 1 the values live in the shards) */
    CHECK_OK(gp_pipeline_params_fnv1a64(p, &out->hash));
    CHECK(out->hash != GP_TEST_FNV_EMPTY);
    gp_pipeline_free(p);
    gp_model_free(m);
}

/* The kinds of these models that split: the ones the header lists, and no other. */
static void kinds_split(const char *json, const char *const *want, int nwant) {
    gp_model *m;
    REQUIRE_OK(gp_model_from_json_string(json, "test", &m));
    for (int i = 0; i < gp_model_nlayers(m); i++) {
        const gp_layer *l = gp_model_layer(m, i);
        bool listed = false;
        for (int j = 0; j < nwant; j++) listed |= strcmp(l->ops->kind, want[j]) == 0;
        if (listed != gp_layer_splits_backward(l))
            printf("layer %d (%s): splits %d, expected %d\n", i, l->ops->kind,
                   gp_layer_splits_backward(l), listed);
        CHECK(listed == gp_layer_splits_backward(l));
    }
    gp_model_free(m);
}

int main(void) {
    static const char *const seq_split[] = {"embedding", "pos_embedding", "causal_attention",
                                            "transformer_block", "linear"};
    static const char *const img_split[] = {"conv2d", "residual_block", "linear"};
    kinds_split(SEQ_MODEL, seq_split, 5);
    kinds_split(IMAGE_MODEL, img_split, 3);
    const char *const models[2] = {SEQ_MODEL, IMAGE_MODEL};
    for (int mi = 0; mi < 2; mi++) {
        outcome ref;
        train(models[mi], 1, 1, GP_SCHEDULE_GPIPE, GP_REMAT_NONE, &ref);
        CHECK(ref.loss[0] != ref.loss[STEPS - 1]); /* it trains */
        for (int K = 1; K <= 2; K++)
            for (int rm = 0; rm < 2; rm++) {
                outcome got;
                train(models[mi], K, 1, GP_SCHEDULE_ZBH1, (gp_remat)rm, &got);
                const bool same =
                    memcmp(got.loss, ref.loss, sizeof ref.loss) == 0 && got.hash == ref.hash;
                if (!same)
                    printf("%s model, K = %d, remat %s: zbh1 differs from gpipe (hash %016llx "
                           "vs %016llx)\n",
                           mi ? "image" : "sequence", K, gp_remat_name((gp_remat)rm),
                           (unsigned long long)got.hash, (unsigned long long)ref.hash);
                CHECK(same);
            }
        printf("%s model: zbh1 on K = 1, 2 x remat cell, none: the bits of gpipe (params "
               "%016llx)\n",
               mi ? "image" : "sequence", (unsigned long long)ref.hash);
    }
    /* The tensor-parallel shards (attention, Transformer block, embedding, vocabulary head) on
     * T = 2: zbh1 gives the bits of gpipe at the same T. */
    outcome ref, got;
    train(SEQ_MODEL, 1, 2, GP_SCHEDULE_GPIPE, GP_REMAT_NONE, &ref);
    for (int K = 1; K <= 2; K++) {
        train(SEQ_MODEL, K, 2, GP_SCHEDULE_ZBH1, GP_REMAT_CELL, &got);
        CHECK(memcmp(got.loss, ref.loss, sizeof ref.loss) == 0 && got.hash == ref.hash);
    }
    printf("sequence model on T = 2 shards: zbh1 on K = 1, 2 the bits of gpipe (params %016llx)\n",
           (unsigned long long)ref.hash);
    return gp_test_finish("test_backward_split");
}
