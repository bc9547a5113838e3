/* Weights tied across stages: the test Transformer with its head's weight tied to its token
 * embedding starts with both equal and keeps them equal bit for bit through training on one
 * device and on K stages; its update is the SGD step of the two uses' gradients summed, clipped
 * by a norm that counts the tied matrix once (against the host's arithmetic); tied training
 * differs from untied; every stage counts the copy it holds; and configs that cannot tie (a head
 * of another shape, no head, a non-boolean key, a tie after initialization) are named errors.
 * The bitwise checks across K, schedules, re-materialization and launchers are test_pipeline's
 * and test_pipeline_mpi's (the tied network), the checkpoints test_checkpoint's. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "pipeline/pipeline_hooks.h"
#include "testutil.h"

#define M_MICRO 2
#define BATCH 4
static const uint64_t SEED = 5;

static bool same_bits(const gp_tensor *a, const gp_tensor *b) {
    return gp_tensor_nbytes(a) == gp_tensor_nbytes(b) &&
           memcmp(a->data, b->data, gp_tensor_nbytes(a)) == 0;
}

static gp_pipeline *pipeline(gp_model *m, const gp_optim_opts *o, int K) {
    gp_pipeline_opts po = {.stages = K, .micro_batches = M_MICRO};
    gp_pipeline *p;
    REQUIRE_OK(gp_pipeline_new(m, o, &po, SEED, &p));
    return p;
}

/* Both copies start equal and stay equal on 1 and 2 stages; the untied head starts apart and
 * trains to other parameters. */
static void tie_takes_effect(void) {
    gp_model *tied = gp_test_net_build(GP_TEST_TRANSFORMER_TIED);
    gp_model *untied = gp_test_net_build(GP_TEST_TRANSFORMER);
    const int L = gp_model_nlayers(tied);
    gp_device *dev;
    REQUIRE_OK(gp_device_cpu_new("tied", &dev));
    REQUIRE_OK(gp_model_init(tied, dev, SEED));
    REQUIRE_OK(gp_model_init(untied, dev, SEED));
    gp_param_info e = gp_test_param_of(tied, 0, "weight"), h = gp_test_param_of(tied, L - 1, "weight");
    CHECK(same_bits(e.value, h.value));
    CHECK(!same_bits(gp_test_param_of(untied, 0, "weight").value, gp_test_param_of(untied, L - 1, "weight").value));
    float *init = malloc(gp_tensor_nbytes(e.value));
    memcpy(init, e.value->data, gp_tensor_nbytes(e.value));
    gp_model_free(tied);
    gp_model_free(untied);
    gp_device_free(dev);

    uint64_t hash[2] = {0, 0}, untied_hash = 0;
    for (int K = 1; K <= 2; K++) {
        gp_model *m = gp_test_net_build(GP_TEST_TRANSFORMER_TIED);
        gp_optim_opts o = gp_test_net_optim(GP_TEST_TRANSFORMER_TIED);
        gp_pipeline *p = pipeline(m, &o, K);
        float loss;
        for (int s = 0; s < 2; s++) {
            gp_test_batch b;
            gp_test_net_batch(GP_TEST_TRANSFORMER_TIED, BATCH, 40 + (uint64_t)s, &b);
            REQUIRE_OK(gp_pipeline_step(p, &b.x, &b.y_t, &loss));
        }
        e = gp_test_param_of(m, 0, "weight"), h = gp_test_param_of(m, L - 1, "weight");
        CHECK(e.value->dev != h.value->dev || K == 1); /* K = 2: a copy on each stage */
        CHECK(same_bits(e.value, h.value));
        CHECK(memcmp(e.value->data, init, gp_tensor_nbytes(e.value)) != 0); /* it trained */
        REQUIRE_OK(gp_pipeline_params_fnv1a64(p, &hash[K - 1]));
        gp_pipeline_free(p);
        gp_model_free(m);
    }
    CHECK(hash[0] == hash[1]);
    gp_model *m = gp_test_net_build(GP_TEST_TRANSFORMER);
    gp_optim_opts o = gp_test_net_optim(GP_TEST_TRANSFORMER);
    gp_pipeline *p = pipeline(m, &o, 2);
    float loss;
    for (int s = 0; s < 2; s++) {
        gp_test_batch b;
        gp_test_net_batch(GP_TEST_TRANSFORMER, BATCH, 40 + (uint64_t)s, &b);
        REQUIRE_OK(gp_pipeline_step(p, &b.x, &b.y_t, &loss));
    }
    REQUIRE_OK(gp_pipeline_params_fnv1a64(p, &untied_hash));
    gp_pipeline_free(p);
    gp_model_free(m);
    CHECK(untied_hash != hash[0]);
    printf("tied: copies equal after 2 steps on K = 1 and 2, params %016llx (untied %016llx)\n",
           (unsigned long long)hash[0], (unsigned long long)untied_hash);
    free(init);
}

/* One accumulated step, then the update by hand: SGD without momentum or decay, clipped to a
 * norm small enough to clip. The tied matrix moves by lr c (g_embedding + g_head) at both uses,
 * c = clip / (norm + 1e-6), the norm counting every gradient once and the tied one as its sum.
 * The host adds in double and the library in float: the updates (about 1e-3) agree within 1e-7
 * (float32 rounding of the weights, about 2e-9, and of c); counting the tied gradient twice, or
 * a use's alone, is off by more than 1e-5. The same on K = 1 and K = 2, bit for bit. */
static void tie_sums_gradients(void) {
    uint64_t hash[2];
    for (int K = 1; K <= 2; K++) {
        gp_model *m = gp_test_net_build(GP_TEST_TRANSFORMER_TIED);
        const int L = gp_model_nlayers(m);
        gp_optim_opts o = gp_sgd_defaults(0.5f, 0.0f);
        o.clip_norm = 0.05f;
        gp_pipeline *p = pipeline(m, &o, K);
        gp_test_batch b;
        gp_test_net_batch(GP_TEST_TRANSFORMER_TIED, BATCH, 7, &b);
        float loss;
        REQUIRE_OK(gp_pipeline_accumulate(p, &b.x, &b.y_t, &loss));
        gp_param_info e = gp_test_param_of(m, 0, "weight"), h = gp_test_param_of(m, L - 1, "weight");
        const int64_t n = gp_tensor_nelem(e.value);
        float *w0 = malloc((size_t)n * sizeof *w0), *g = malloc((size_t)n * sizeof *g);
        double sumsq = 0, head = 0;
        for (int64_t i = 0; i < n; i++) {
            w0[i] = F32(*e.value)[i];
            g[i] = F32(*e.grad)[i] + F32(*h.grad)[i];
            sumsq += (double)g[i] * g[i];
            head += (double)F32(*h.grad)[i] * F32(*h.grad)[i];
        }
        for (int i = 0; i < gp_model_nparam_tensors(m); i++) {
            gp_param_info pi;
            REQUIRE_OK(gp_model_param(m, i, &pi));
            if (!pi.trainable || ((pi.layer == 0 || pi.layer == L - 1) && !strcmp(pi.name, "weight")))
                continue;
            for (int64_t j = 0; j < gp_tensor_nelem(pi.grad); j++)
                sumsq += (double)F32(*pi.grad)[j] * F32(*pi.grad)[j];
        }
        const double norm = sqrt(sumsq), c = o.clip_norm / (norm + 1e-6);
        CHECK(c < 1.0);
        CHECK(sqrt(head) > 1e-2); /* the head's use matters */
        REQUIRE_OK(gp_pipeline_apply(p));
        double worst = 0;
        for (int64_t i = 0; i < n; i++) {
            const double want = (double)w0[i] - o.lr * c * g[i];
            worst = fmax(worst, fabs(F32(*e.value)[i] - want));
        }
        printf("tied K=%d: global norm %.6g (head's use %.3g), clip %.4g, largest error of the "
               "tied update %.3g (limit 1e-7)\n",
               K, norm, sqrt(head), c, worst);
        CHECK(worst <= 1e-7);
        CHECK(same_bits(e.value, h.value));
        REQUIRE_OK(gp_pipeline_params_fnv1a64(p, &hash[K - 1]));
        free(w0);
        free(g);
        gp_pipeline_free(p);
        gp_model_free(m);
    }
    CHECK(hash[0] == hash[1]);
}

/* Each stage counts the copy it holds: the tied model's stage bytes are the untied one's. */
static void copy_counted(void) {
    gp_mem_stats ms[2][2];
    for (int tied = 0; tied < 2; tied++) {
        const gp_test_net net = tied ? GP_TEST_TRANSFORMER_TIED : GP_TEST_TRANSFORMER;
        gp_model *m = gp_test_net_build(net);
        gp_optim_opts o = gp_test_net_optim(net);
        gp_pipeline *p = pipeline(m, &o, 2);
        for (int k = 0; k < 2; k++) CHECK_OK(gp_pipeline_mem_stats(p, k, &ms[tied][k]));
        gp_pipeline_free(p);
        gp_model_free(m);
    }
    for (int k = 0; k < 2; k++)
        for (int c = GP_MEM_PARAMS; c <= GP_MEM_OPTIM; c++)
            CHECK_EQ_INT(ms[1][k].live[c], ms[0][k].live[c]);
    CHECK(ms[1][1].live[GP_MEM_PARAMS] >= 64 * 32 * sizeof(float)); /* the head's copy */
}

static void tie_errors(void) {
    gp_model *m = NULL;
    static const char *const wrong_shape =
        "{\"input\": {\"shape\": [16], \"dtype\": \"int32\"}, \"tie_embeddings\": true, "
        "\"layers\": [{\"kind\": \"embedding\", \"vocab\": 64, \"dim\": 32}, "
        "{\"kind\": \"linear\", \"in\": 32, \"out\": 48, \"bias\": false}]}";
    CHECK_FAILS(gp_model_from_json_string(wrong_shape, "wrong.json", &m), GP_SHAPE,
                "weight has shape (48, 32)");
    CHECK_FAILS(gp_model_from_json_string(wrong_shape, "wrong.json", &m), GP_SHAPE,
                "wrong.json: tie_embeddings");
    CHECK(m == NULL);
    static const char *const no_head =
        "{\"input\": {\"shape\": [16], \"dtype\": \"int32\"}, \"tie_embeddings\": true, "
        "\"layers\": [{\"kind\": \"embedding\", \"vocab\": 64, \"dim\": 32}]}";
    CHECK_FAILS(gp_model_from_json_string(no_head, "nohead.json", &m), GP_CONFIG,
                "needs an embedding layer and a linear layer after it");
    static const char *const not_bool =
        "{\"family\": \"transformer\", \"vocab\": 64, \"dim\": 32, \"tie_embeddings\": 1}";
    CHECK_FAILS(gp_model_from_json_string(not_bool, "one.json", &m), GP_CONFIG,
                "tie_embeddings: expected true or false");
    static const char *const family =
        "{\"family\": \"transformer\", \"vocab\": 64, \"dim\": 32, \"heads\": 4, \"d_ff\": 64, "
        "\"layers\": 1, \"seq_len\": 8, \"tie_embeddings\": true}";
    REQUIRE_OK(gp_model_from_json_string(family, "family.json", &m));
    CHECK_EQ_INT(m->nties, 1);
    CHECK_FAILS(gp_model_tie_embeddings(m), GP_INVALID_ARGUMENT, "tied already");
    gp_model_free(m);
    gp_model *u = gp_test_net_build(GP_TEST_TRANSFORMER);
    gp_device *dev;
    REQUIRE_OK(gp_device_cpu_new("tie", &dev));
    REQUIRE_OK(gp_model_init(u, dev, SEED));
    CHECK_FAILS(gp_model_tie_embeddings(u), GP_INVALID_ARGUMENT, "before the model is initialized");
    CHECK_EQ_INT(u->nties, 0);
    gp_model_free(u);
    gp_device_free(dev);
}

int main(void) {
    tie_takes_effect();
    tie_sums_gradients();
    copy_counted();
    tie_errors();
    return gp_test_finish("test_tied");
}
