/* Model and trainer: family sizes, keyed initialization independent of
 * placement, micro-batch gradient equivalence, memory accounting, errors. */
#include <string.h>

#include "pipeline/pipeline_hooks.h"
#include "testutil.h"

static gp_model *small_lm(int layers) {
    gp_transformer_config c = {.vocab = 64, .dim = 32, .heads = 4, .d_ff = 64, .layers = layers,
                               .seq_len = 16, .dropout = 0.0f};
    gp_model *m;
    REQUIRE_OK(gp_model_transformer(&c, &m));
    return m;
}

static void fill_tokens(gp_tensor *x, gp_tensor *y, int vocab, uint64_t seed) {
    int32_t *xs = (int32_t *)x->data, *ys = (int32_t *)y->data;
    gp_rng_stream s = {.seed = seed, .purpose = GP_RNG_TEST, .a = 11};
    for (int64_t i = 0; i < gp_tensor_nelem(x); i++) {
        xs[i] = (int32_t)(gp_rng_u64(&s, (uint64_t)i) % (uint64_t)vocab);
        ys[i] = (int32_t)((xs[i] * 7 + 3) % vocab);
    }
}

static void test_family_sizes(void) {
    gp_transformer_config t1 = gp_transformer_defaults();
    gp_model *m;
    REQUIRE_OK(gp_model_transformer(&t1, &m));
    CHECK_EQ_INT(gp_model_nparams(m), 25547776);
    CHECK_EQ_INT(gp_model_nlayers(m), 12);
    gp_shape s;
    REQUIRE_OK(gp_model_shape(m, gp_model_nlayers(m) - 1, 32, &s));
    CHECK(gp_shape_equal(&s, &(gp_shape){3, {32, 128, 256}}));
    gp_model_free(m);
    gp_transformer_config t2 = gp_transformer_defaults();
    t2.dim = 256, t2.heads = 4, t2.d_ff = 1024, t2.layers = 32;
    REQUIRE_OK(gp_model_transformer(&t2, &m));
    CHECK_EQ_INT(gp_model_nparams(m), 25436672);
    gp_model_free(m);
    gp_convnet_config c1 = gp_convnet_defaults();
    REQUIRE_OK(gp_model_convnet(&c1, &m));
    CHECK_EQ_INT(gp_model_nparams(m), 870826);
    REQUIRE_OK(gp_model_shape(m, gp_model_nlayers(m) - 1, 5, &s));
    CHECK(gp_shape_equal(&s, &(gp_shape){2, {5, 10}}));
    gp_model_free(m);
    t1.heads = 7;
    CHECK_FAILS(gp_model_transformer(&t1, &m), GP_INVALID_ARGUMENT, "");
    t1 = gp_transformer_defaults();
    t1.seq_len = 0;
    CHECK_FAILS(gp_model_transformer(&t1, &m), GP_CONFIG, "seq_len 0");
}

/* Initialization is keyed by (seed, layer, parameter): splitting the model
 * over two devices gives the same bits as one device. */
static void test_keyed_init(void) {
    gp_device *d0, *d1, *d2;
    REQUIRE_OK(gp_device_cpu_new("one", &d0));
    REQUIRE_OK(gp_device_cpu_new("a", &d1));
    REQUIRE_OK(gp_device_cpu_new("b", &d2));
    gp_model *a = small_lm(3), *b = small_lm(3), *c = small_lm(3);
    REQUIRE_OK(gp_model_init(a, d0, 7));
    REQUIRE_OK(gp_model_init_range(b, 3, gp_model_nlayers(b), d2, 7)); /* second half first */
    REQUIRE_OK(gp_model_init_range(b, 0, 3, d1, 7));
    REQUIRE_OK(gp_model_init(c, d0, 8));
    CHECK(gp_test_hash(a) == gp_test_hash(b));
    CHECK(gp_test_hash(a) != gp_test_hash(c));
    /* A pipeline takes an initialized model as it is: here from two devices onto the one it
     * makes for its single stage, values unchanged, nothing left behind; freeing the pipeline
     * frees that device and leaves those layers without values. */
    gp_optim_opts o = gp_adamw_defaults(1e-3f, 0.0f);
    gp_mem_stats st;
    const uint64_t before = gp_test_hash(b);
    gp_pipeline *t = gp_test_single(b, &o, 1);
    CHECK(gp_test_hash(b) == before);
    CHECK(gp_pipeline_device(t, 0) != d1 && gp_pipeline_device(t, 0) != d2);
    gp_device_mem_stats(d1, &st);
    CHECK_EQ_INT(st.live_total, 0);
    gp_pipeline_free(t);
    CHECK(gp_test_hash(b) == GP_TEST_FNV_EMPTY);
    /* Initialized on one device: the pipeline trains it there. */
    t = gp_test_single(a, &o, 1);
    CHECK(gp_pipeline_device(t, 0) == d0);
    gp_pipeline_free(t);
    CHECK(gp_test_hash(a) == before); /* the parameters stay with the model */
    /* Partly initialized: refused, naming the first layer without values. */
    gp_model *u = small_lm(1);
    REQUIRE_OK(gp_model_init_range(u, 0, 2, d1, 7));
    CHECK_FAILS(gp_pipeline_new(u, &o, NULL, 7, &t), GP_INVALID_ARGUMENT,
                "partly initialized (layer 2, transformer_block");
    gp_model_free(u);
    gp_model_free(a);
    gp_model_free(b);
    gp_model_free(c);
    gp_device_mem_stats(d0, &st);
    CHECK_EQ_INT(st.live_total, 0);
    gp_device_free(d0);
    gp_device_free(d1);
    gp_device_free(d2);
}

/* Gradients with M micro-batches agree with M = 1 (no batch norm). */
static void test_micro_batches(void) {
    gp_device *d;
    REQUIRE_OK(gp_device_cpu_new("mb", &d));
    gp_tensor x, y;
    REQUIRE_OK(gp_tensor_alloc(d, GP_MEM_WORKSPACE, gp_shape2(8, 16), GP_I32, &x));
    REQUIRE_OK(gp_tensor_alloc(d, GP_MEM_WORKSPACE, gp_shape2(8, 16), GP_I32, &y));
    fill_tokens(&x, &y, 64, 3);
    gp_optim_opts o = gp_adamw_defaults(1e-3f, 0.0f);
    float *ref = NULL;
    int64_t total = 0;
    float ref_loss = 0;
    int ms[] = {1, 2, 4, 8};
    for (int k = 0; k < 4; k++) {
        gp_model *m = small_lm(2);
        REQUIRE_OK(gp_model_init(m, d, 5));
        gp_pipeline *t = gp_test_single(m, &o, ms[k]);
        float loss;
        REQUIRE_OK(gp_pipeline_accumulate(t, &x, &y, &loss));
        if (!ref) {
            total = 0;
            for (int i = 0; i < gp_model_nparam_tensors(m); i++) {
                gp_param_info pi;
                REQUIRE_OK(gp_model_param(m, i, &pi));
                total += gp_tensor_nelem(pi.grad);
            }
            ref = malloc((size_t)total * sizeof *ref);
            ref_loss = loss;
        }
        int64_t off = 0, bad = 0;
        for (int i = 0; i < gp_model_nparam_tensors(m); i++) {
            gp_param_info pi;
            REQUIRE_OK(gp_model_param(m, i, &pi));
            int64_t n = gp_tensor_nelem(pi.grad);
            /* Relative to the tensor's largest gradient: single elements
             * near zero carry only cancellation noise. */
            float scale = 0;
            for (int64_t j = 0; j < n; j++) scale = fmaxf(scale, fabsf(F32(*pi.grad)[j]));
            for (int64_t j = 0; j < n; j++) {
                float g = F32(*pi.grad)[j];
                if (k == 0)
                    ref[off + j] = g;
                else if (fabsf(g - ref[off + j]) > 1e-5f * scale)
                    bad++;
            }
            off += n;
        }
        if (bad) fprintf(stderr, "M=%d: %lld gradient values differ from M=1 by > 1e-5 relative\n", ms[k], (long long)bad);
        CHECK_EQ_INT(bad, 0);
        CHECK_NEAR(loss, ref_loss, 1e-5 * ref_loss);
        gp_pipeline_free(t);
        gp_model_free(m);
    }
    free(ref);
    gp_tensor_release(&x);
    gp_tensor_release(&y);
    gp_device_free(d);
}

static void test_training_and_memory(void) {
    gp_device *d;
    REQUIRE_OK(gp_device_cpu_new("train", &d));
    gp_model *m = small_lm(2);
    REQUIRE_OK(gp_model_init(m, d, 9));
    gp_mem_stats st;
    gp_device_mem_stats(d, &st);
    uint64_t param_bytes = (uint64_t)gp_model_nparams(m) * 4;
    CHECK_EQ_INT(st.live[GP_MEM_PARAMS], param_bytes);
    gp_optim_opts o = gp_adamw_defaults(1e-2f, 0.0f);
    gp_pipeline *t = gp_test_single(m, &o, 2);
    gp_device_mem_stats(d, &st);
    CHECK_EQ_INT(st.live[GP_MEM_GRADS], param_bytes);
    CHECK_EQ_INT(st.live[GP_MEM_OPTIM], 2 * param_bytes);
    gp_tensor x, y;
    REQUIRE_OK(gp_tensor_alloc(d, GP_MEM_WORKSPACE, gp_shape2(4, 16), GP_I32, &x));
    REQUIRE_OK(gp_tensor_alloc(d, GP_MEM_WORKSPACE, gp_shape2(4, 16), GP_I32, &y));
    fill_tokens(&x, &y, 64, 4);
    float first = 0, loss = 0;
    for (int s = 0; s < 30; s++) {
        REQUIRE_OK(gp_pipeline_step(t, &x, &y, &loss));
        if (s == 0) first = loss;
    }
    CHECK(loss < 0.5f * first);
    CHECK_EQ_INT(gp_pipeline_steps_done(t), 30);
    gp_device_mem_stats(d, &st);
    CHECK_EQ_INT(st.live[GP_MEM_ACTIVATIONS], 0); /* everything released after a step */
    CHECK(st.peak[GP_MEM_ACTIVATIONS] > 0);

    /* Evaluation: accuracy on the learned mapping. */
    double lsum;
    int64_t correct, count;
    REQUIRE_OK(gp_model_evaluate(m, &x, &y, &lsum, &correct, &count));
    CHECK_EQ_INT(count, 64);
    CHECK(correct > 32);

    /* Bad batches: named numbers, nothing trained. */
    gp_tensor x3 = gp_tensor_view(x.data, gp_shape2(3, 16), GP_I32);
    gp_tensor y3 = gp_tensor_view(y.data, gp_shape2(3, 16), GP_I32);
    CHECK_FAILS(gp_pipeline_step(t, &x3, &y3, &loss), GP_INVALID_ARGUMENT,
                "batch 3 is not divisible by 2 micro-batches");
    gp_tensor xw = gp_tensor_view(x.data, gp_shape2(4, 8), GP_I32);
    CHECK_FAILS(gp_pipeline_step(t, &xw, &y, &loss), GP_SHAPE, "expected (4, 16) int32");
    ((int32_t *)x.data)[5] = 64; /* out of vocabulary */
    CHECK_FAILS(gp_pipeline_step(t, &x, &y, &loss), GP_INVALID_ARGUMENT, "layer 0");
    ((int32_t *)x.data)[5] = 1;
    CHECK_EQ_INT(gp_pipeline_steps_done(t), 30);

    /* A device limit turns into a clean error during the step. */
    gp_device_mem_stats(d, &st);
    REQUIRE_OK(gp_device_set_limit(d, st.live_total + 1024));
    CHECK_FAILS(gp_pipeline_step(t, &x, &y, &loss), GP_MEMORY_LIMIT, "device train");
    REQUIRE_OK(gp_device_set_limit(d, 0));
    CHECK_OK(gp_pipeline_step(t, &x, &y, &loss));
    gp_device_mem_stats(d, &st);
    CHECK_EQ_INT(st.live[GP_MEM_ACTIVATIONS], 0);

    /* One pipeline per model. */
    gp_pipeline *t2;
    CHECK_FAILS(gp_pipeline_new(m, &o, NULL, 0, &t2), GP_INVALID_ARGUMENT, "already has a pipeline");

    /* A non-finite gradient: no update, and the next step is unharmed. */
    REQUIRE_OK(gp_pipeline_accumulate(t, &x, &y, &loss));
    gp_param_info pi;
    REQUIRE_OK(gp_model_param(m, 2, &pi));
    F32(*pi.grad)[0] = INFINITY;
    uint64_t before = gp_test_hash(m);
    CHECK_FAILS(gp_pipeline_apply(t), GP_NUMERIC, "gradient norm is not finite");
    CHECK(gp_test_hash(m) == before);
    CHECK_OK(gp_pipeline_step(t, &x, &y, &loss));
    CHECK_EQ_INT(gp_pipeline_steps_done(t), 32);
    CHECK(isfinite(loss));

    /* The model says what it takes. */
    CHECK_EQ_INT(gp_model_input_dtype(m), GP_I32);
    gp_shape ex = gp_model_example_shape(m);
    CHECK(gp_shape_equal(&ex, &(gp_shape){1, {16}}));

    gp_pipeline_free(t);
    gp_device_mem_stats(d, &st);
    CHECK_EQ_INT(st.live[GP_MEM_GRADS] + st.live[GP_MEM_OPTIM], 0);
    gp_tensor_release(&x);
    gp_tensor_release(&y);
    gp_model_free(m);
    gp_device_mem_stats(d, &st);
    CHECK_EQ_INT(st.live_total, 0);
    gp_device_free(d);
}

static void test_model_errors(void) {
    gp_model *m;
    CHECK_FAILS(gp_model_new(gp_shape2(0, 3), GP_F32, &m), GP_SHAPE, "(0, 3)");
    REQUIRE_OK(gp_model_new(gp_shape1(10), GP_F32, &m));
    CHECK_OK(gp_model_add(m, gp_linear(10, 4, true)));
    CHECK_FAILS(gp_model_add(m, gp_linear(5, 2, true)), GP_SHAPE, "layer 1 (linear)");
    CHECK_FAILS(gp_model_add(m, gp_linear(0, 2, true)), GP_INVALID_ARGUMENT, "layer 1");
    CHECK_EQ_INT(gp_model_nlayers(m), 1);
    gp_cost c;
    REQUIRE_OK(gp_model_cost(m, 0, 8, &c));
    CHECK_NEAR(c.fwd_flops, 2.0 * 8 * 10 * 4, 8 * 4 + 1);
    CHECK_EQ_INT(c.param_bytes, 44 * 4);
    gp_model_free(m);
    /* Shapes too large for 64-bit byte counts are refused when added. */
    REQUIRE_OK(gp_model_new(gp_shape3(1, 1, 1), GP_F32, &m));
    CHECK_FAILS(gp_model_add(m, gp_conv2d(1, 16777216, 1, 1, 16777216, false)), GP_SHAPE,
                "at most 2^40 elements");
    CHECK_EQ_INT(gp_model_input_dtype(m), GP_F32);
    gp_model_free(m);
    gp_convnet_config cc = gp_convnet_defaults();
    cc.ch2 = 16777216, cc.height = 64, cc.width = 64;
    CHECK_FAILS(gp_model_convnet(&cc, &m), GP_CONFIG, "more than a linear layer takes");
}

int main(void) {
    test_family_sizes();
    test_keyed_init();
    test_micro_batches();
    test_training_and_memory();
    test_model_errors();
    return gp_test_finish("test_model");
}
