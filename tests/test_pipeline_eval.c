/* gp_pipeline_evaluate_batches: for the ConvNet (batch norm on running statistics) and the
 * Transformer, five batches (the last one smaller) give the loss sum, correct predictions and
 * count of the single-device model's gp_model_evaluate batch by batch, bit for bit, on K = 1..4
 * stages with the stages at work at once, and batch after batch where that does not apply
 * (interleaved cells, a device memory limit; an inference-only pipeline as well); no activation
 * byte stays behind;
 * bad batches are named errors before anything runs, and a failure inside a stage (a label out
 * of range, found by the last stage) names its stage and batch, stops every stage, and leaves a
 * pipeline that evaluates again. gp_pipeline_predict_batches gives the model's logits bit for
 * bit on the same pipelines, and gp_score_views of one view on them the same figures; of two,
 * the mean softmax's figures worked out here. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "testutil.h"

#define NB 5
static const int64_t sizes[NB] = {8, 8, 8, 8, 3};
static const uint64_t SEED = 91;

typedef struct figures {
    double loss;
    int64_t correct, count;
} figures;

/* Each batch's logits from the single-device model (reference) and room for a pipeline's. */
static float *want_logits[NB], *got_logits[NB];
static gp_tensor logits_view(float *data, gp_model *m, int64_t batch) {
    gp_shape ws;
    REQUIRE_OK(gp_model_shape(m, gp_model_nlayers(m) - 1, batch, &ws));
    return gp_tensor_view(data, ws, GP_F32);
}
static size_t logits_bytes(gp_model *m, int64_t batch) {
    gp_shape ws;
    REQUIRE_OK(gp_model_shape(m, gp_model_nlayers(m) - 1, batch, &ws));
    return (size_t)gp_shape_nelem(&ws) * sizeof(float);
}

static void make_batches(gp_test_net net, gp_test_batch *b, gp_tensor *xs, gp_tensor *ys) {
    for (int i = 0; i < NB; i++) {
        gp_test_net_batch(net, sizes[i], 500 + (uint64_t)i, &b[i]);
        xs[i] = b[i].x;
        ys[i] = b[i].y_t;
    }
}

/* The single-device model, batch by batch, the sums in batch order. */
static figures reference(gp_test_net net, const gp_tensor *xs, const gp_tensor *ys) {
    gp_model *m = gp_test_net_build(net);
    gp_device *dev;
    REQUIRE_OK(gp_device_cpu_new("ref", &dev));
    REQUIRE_OK(gp_model_init(m, dev, SEED));
    figures f = {0};
    for (int i = 0; i < NB; i++) {
        double l = 0;
        int64_t c = 0, n = 0;
        REQUIRE_OK(gp_model_evaluate(m, &xs[i], &ys[i], &l, &c, &n));
        f.loss += l, f.correct += c, f.count += n;
        free(want_logits[i]);
        free(got_logits[i]);
        want_logits[i] = malloc(logits_bytes(m, sizes[i]));
        got_logits[i] = malloc(logits_bytes(m, sizes[i]));
        if (!want_logits[i] || !got_logits[i]) exit(2);
        gp_tensor lg = logits_view(want_logits[i], m, sizes[i]);
        REQUIRE_OK(gp_model_predict(m, &xs[i], &lg));
    }
    gp_model_free(m);
    gp_device_free(dev);
    return f;
}

static void check_same(const figures *got, const figures *want, const char *what) {
    const bool same = memcmp(&got->loss, &want->loss, sizeof got->loss) == 0 &&
                      got->correct == want->correct && got->count == want->count;
    if (!same)
        fprintf(stderr, "%s: loss %.17g correct %lld count %lld, expected %.17g %lld %lld\n",
                what, got->loss, (long long)got->correct, (long long)got->count, want->loss,
                (long long)want->correct, (long long)want->count);
    CHECK(same);
}

static void no_activations_left(gp_pipeline *p) {
    for (int k = 0; k < gp_pipeline_stages(p); k++) {
        gp_mem_stats ms;
        CHECK_OK(gp_pipeline_mem_stats(p, k, &ms));
        CHECK_EQ_INT(ms.live[GP_MEM_ACTIVATIONS], 0);
    }
}

static void one_pipeline(gp_test_net net, const gp_pipeline_opts *po, bool inference,
                         const gp_tensor *xs, const gp_tensor *ys, const figures *want,
                         const char *what) {
    gp_model *m = gp_test_net_build(net);
    gp_optim_opts o = gp_test_net_optim(net);
    gp_pipeline *p;
    REQUIRE_OK(gp_pipeline_new(m, inference ? NULL : &o, po, SEED, &p));
    for (int rep = 0; rep < 2; rep++) { /* the second time on the devices' cached blocks */
        figures f = {0};
        CHECK_OK(gp_pipeline_evaluate_batches(p, NB, xs, ys, &f.loss, &f.correct, &f.count));
        check_same(&f, want, what);
        no_activations_left(p);
        /* the logits of gp_pipeline_predict_batches, and gp_score_views of one view on them */
        gp_tensor lg[NB];
        for (int i = 0; i < NB; i++) {
            memset(got_logits[i], 0xff, logits_bytes(m, sizes[i]));
            lg[i] = logits_view(got_logits[i], m, sizes[i]);
        }
        CHECK_OK(gp_pipeline_predict_batches(p, NB, xs, lg));
        figures g = {0};
        for (int i = 0; i < NB; i++) {
            CHECK(memcmp(got_logits[i], want_logits[i], logits_bytes(m, sizes[i])) == 0);
            double l = 0;
            int64_t c = 0, n = 0;
            CHECK_OK(gp_score_views(1, &lg[i], &ys[i], &l, &c, &n));
            g.loss += l, g.correct += c, g.count += n;
        }
        check_same(&g, want, what);
        no_activations_left(p);
    }
    gp_pipeline_free(p);
    gp_model_free(m);
}

static void errors(gp_test_net net, gp_tensor *xs, gp_tensor *ys, const figures *want) {
    gp_model *m = gp_test_net_build(net);
    gp_optim_opts o = gp_test_net_optim(net);
    gp_pipeline_opts po = {.stages = 3, .micro_batches = 1};
    gp_pipeline *p;
    REQUIRE_OK(gp_pipeline_new(m, &o, &po, SEED, &p));
    figures f = {0};
    CHECK_FAILS(gp_pipeline_evaluate_batches(NULL, NB, xs, ys, &f.loss, &f.correct, &f.count),
                GP_INVALID_ARGUMENT, "NULL");
    CHECK_FAILS(gp_pipeline_evaluate_batches(p, -1, xs, ys, &f.loss, &f.correct, &f.count),
                GP_INVALID_ARGUMENT, "-1 batches");
    CHECK_FAILS(gp_pipeline_evaluate_batches(p, NB, xs, NULL, &f.loss, &f.correct, &f.count),
                GP_INVALID_ARGUMENT, "NULL");
    /* batch 2's labels for another batch size: named before any stage starts */
    gp_tensor keep = ys[2];
    ys[2] = ys[4];
    CHECK_FAILS(gp_pipeline_evaluate_batches(p, NB, xs, ys, &f.loss, &f.correct, &f.count),
                GP_SHAPE, "batch 2 of 5");
    ys[2] = keep;
    /* a label out of range in batch 3: the last stage finds it, every stage stops */
    int32_t *lab = ys[3].data, saved = lab[1];
    lab[1] = 1000;
    gp_status s = gp_pipeline_evaluate_batches(p, NB, xs, ys, &f.loss, &f.correct, &f.count);
    CHECK(s != GP_OK);
    CHECK(strstr(gp_last_error(), "stage 2, batch 3") != NULL);
    lab[1] = saved;
    no_activations_left(p);
    CHECK_OK(gp_pipeline_evaluate_batches(p, NB, xs, ys, &f.loss, &f.correct, &f.count));
    check_same(&f, want, "after a failed evaluation");
    /* predict_batches: logits of the wrong shape or not in host memory, named before anything
     * runs */
    gp_tensor lg[NB];
    for (int i = 0; i < NB; i++) lg[i] = logits_view(got_logits[i], m, sizes[i]);
    CHECK_FAILS(gp_pipeline_predict_batches(p, NB, xs, NULL), GP_INVALID_ARGUMENT, "NULL");
    lg[1] = lg[4];
    CHECK_FAILS(gp_pipeline_predict_batches(p, NB, xs, lg), GP_SHAPE, "batch 1 of 5");
    lg[1] = logits_view(NULL, m, sizes[1]);
    CHECK_FAILS(gp_pipeline_predict_batches(p, NB, xs, lg), GP_SHAPE, "host memory");
    lg[1] = logits_view(got_logits[1], m, sizes[1]);
    CHECK_OK(gp_pipeline_predict_batches(p, NB, xs, lg));
    CHECK(memcmp(got_logits[3], want_logits[3], logits_bytes(m, sizes[3])) == 0);
    figures z = {.loss = 1, .correct = 1, .count = 1};
    CHECK_OK(gp_pipeline_evaluate_batches(p, 0, NULL, NULL, &z.loss, &z.correct, &z.count));
    CHECK(z.loss == 0 && z.correct == 0 && z.count == 0);
    gp_pipeline_free(p);
    gp_model_free(m);
}

static void net_cases(gp_test_net net) {
    gp_test_batch *b = malloc(NB * sizeof *b);
    gp_tensor xs[NB], ys[NB];
    if (!b) exit(2);
    make_batches(net, b, xs, ys);
    const figures want = reference(net, xs, ys);
    CHECK(want.count > 0);
    char what[128];
    for (int K = 1; K <= 4; K++) {
        gp_pipeline_opts po = {.stages = K, .micro_batches = 1};
        snprintf(what, sizeof what, "%s, K = %d", net == GP_TEST_CONVNET ? "convnet" : "transformer", K);
        one_pipeline(net, &po, false, xs, ys, &want, what);
    }
    gp_pipeline_opts il = {.stages = 2, .micro_batches = 2, .schedule = GP_SCHEDULE_INTERLEAVED,
                           .chunks = 2};
    one_pipeline(net, &il, false, xs, ys, &want, "interleaved, K = 2, V = 2: batch after batch");
    gp_pipeline_opts inf = {.stages = 3, .micro_batches = 1};
    one_pipeline(net, &inf, true, xs, ys, &want, "inference-only pipeline, K = 3");
    gp_pipeline_opts lim = {.stages = 2, .micro_batches = 1, .memory_limit = (uint64_t)1 << 30};
    one_pipeline(net, &lim, false, xs, ys, &want, "under a memory limit, K = 2: batch after batch");
    errors(net, xs, ys, &want);
    free(b);
}

/* gp_score_views against the mean softmax worked out here in double: three rows of four
 * classes in two views; the mean is right where view a is wrong (row 0) and picks a class
 * neither view's argmax does (row 1); a label -1 is not counted (row 2). */
static void score_views(void) {
    float a[12] = {2.0f, 1.0f, 0.0f, -1.0f, 3.0f, 0.0f, 2.9f, 0.0f, 0.5f, 0.5f, 0.5f, 0.5f};
    float b[12] = {1.0f, 2.5f, 0.0f, 0.0f, 0.0f, 3.0f, 2.9f, 0.0f, 9.0f, 0.0f, 0.0f, 0.0f};
    int32_t lab[3] = {1, 2, -1};
    gp_tensor v[2] = {gp_tensor_view(a, gp_shape2(3, 4), GP_F32),
                      gp_tensor_view(b, gp_shape2(3, 4), GP_F32)};
    gp_tensor y = gp_tensor_view(lab, gp_shape1(3), GP_I32);
    double want_loss = 0;
    int64_t want_correct = 0;
    for (int r = 0; r < 2; r++) {
        double mean[4] = {0};
        for (int k = 0; k < 2; k++) {
            const float *row = (k ? b : a) + 4 * r;
            double z = 0;
            for (int c = 0; c < 4; c++) z += exp(row[c]);
            for (int c = 0; c < 4; c++) mean[c] += exp(row[c]) / z / 2;
        }
        int best = 0;
        for (int c = 1; c < 4; c++) best = mean[c] > mean[best] ? c : best;
        want_loss -= log(mean[lab[r]]);
        want_correct += best == lab[r];
    }
    CHECK_EQ_INT(want_correct, 2);
    double l = 0;
    int64_t c = 0, n = 0;
    CHECK_OK(gp_score_views(2, v, &y, &l, &c, &n));
    CHECK(fabs(l - want_loss) < 1e-12 * want_loss);
    CHECK_EQ_INT(c, 2);
    CHECK_EQ_INT(n, 2);
    /* view a alone: argmax 0 in both rows, both wrong; the loss log-softmax's at the labels */
    double l1 = 0, want1 = 0;
    int64_t c1 = 0, n1 = 0;
    CHECK_OK(gp_score_views(1, v, &y, &l1, &c1, &n1));
    for (int r = 0; r < 2; r++) {
        double z = 0;
        for (int k = 0; k < 4; k++) z += exp(a[4 * r + k]);
        want1 -= a[4 * r + lab[r]] - log(z);
    }
    CHECK(fabs(l1 - want1) < 1e-5 * want1);
    CHECK(c1 == 0 && n1 == 2);
    /* errors: no views, views of different shapes, labels of another count or out of range */
    CHECK_FAILS(gp_score_views(0, v, &y, &l, &c, &n), GP_INVALID_ARGUMENT, "0 views");
    gp_tensor odd[2] = {v[0], gp_tensor_view(b, gp_shape2(4, 3), GP_F32)};
    CHECK_FAILS(gp_score_views(2, odd, &y, &l, &c, &n), GP_SHAPE, "view 1");
    gp_tensor y2 = gp_tensor_view(lab, gp_shape1(2), GP_I32);
    CHECK_FAILS(gp_score_views(2, v, &y2, &l, &c, &n), GP_SHAPE, "one per row");
    lab[2] = 4;
    CHECK_FAILS(gp_score_views(2, v, &y, &l, &c, &n), GP_INVALID_ARGUMENT, "label 4 of row 2");
}

int main(void) {
    score_views();
    net_cases(GP_TEST_CONVNET);
    net_cases(GP_TEST_TRANSFORMER);
    for (int i = 0; i < NB; i++) free(want_logits[i]), free(got_logits[i]);
    return gp_test_finish("test_pipeline_eval");
}
