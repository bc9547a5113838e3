/* Tests of gp_softmax_xent and gp_count_labels: values by hand in double,
 * ignored labels, finite differences, bad labels, and that micro-batch losses
 * with the whole batch's normalizer add up to the whole batch's loss. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "testutil.h"

/* The loss of one row, straight from the definition, in double. */
static double row_loss(const float *x, int64_t classes, int32_t y) {
    double s = 0;
    for (int64_t j = 0; j < classes; j++) s += exp((double)x[j]);
    return log(s) - x[y];
}

static void test_small_by_hand(void) {
    float lg[6] = {1, 2, 3, 0.5f, -1, 2}, d[6];
    int32_t lb[2] = {2, 0};
    gp_tensor logits = gp_tensor_view(lg, gp_shape2(2, 3), GP_F32);
    gp_tensor labels = gp_tensor_view(lb, gp_shape1(2), GP_I32);
    gp_tensor dl = gp_tensor_view(d, logits.shape, GP_F32);
    double loss = -1;
    CHECK_OK(gp_softmax_xent(&logits, &labels, 2.0, &loss, &dl));
    /* row 0: log(e + e^2 + e^3) - 3 = log(1 + e^-1 + e^-2) = 0.40760596444438...
     * row 1: log(e^0.5 + e^-1 + e^2) - 0.5 = 1.7619...  */
    double l0 = log(1 + exp(-1.0) + exp(-2.0)), l1 = log(exp(0.5) + exp(-1.0) + exp(2.0)) - 0.5;
    CHECK_NEAR(l0, 0.40760596444438, 1e-13);
    CHECK_NEAR(loss, (l0 + l1) / 2, 1e-6);
    CHECK_NEAR(loss, (row_loss(lg, 3, 2) + row_loss(lg + 3, 3, 0)) / 2, 1e-6);
    /* dlogits = (softmax - onehot) / 2 */
    double s0 = exp(1.0) + exp(2.0) + exp(3.0), s1 = exp(0.5) + exp(-1.0) + exp(2.0);
    const double want[6] = {exp(1.0) / s0 / 2,       exp(2.0) / s0 / 2,  (exp(3.0) / s0 - 1) / 2,
                            (exp(0.5) / s1 - 1) / 2, exp(-1.0) / s1 / 2, exp(2.0) / s1 / 2};
    for (int i = 0; i < 6; i++) CHECK_NEAR(d[i], want[i], 1e-7);
    /* every row of dlogits sums to zero */
    CHECK_NEAR(d[0] + d[1] + d[2], 0, 1e-7);

    /* without dlogits: the same loss */
    double loss2 = -1;
    CHECK_OK(gp_softmax_xent(&logits, &labels, 2.0, &loss2, NULL));
    CHECK(loss2 == loss);
    /* dlogits in place of the logits */
    CHECK_OK(gp_softmax_xent(&logits, &labels, 2.0, &loss2, &logits));
    CHECK(loss2 == loss);
    CHECK(memcmp(lg, d, sizeof d) == 0);
}

static void test_ignored_and_3d(void) {
    /* (B=2, T=3, V=4) logits, (B, T) labels with two ignored rows */
    float lg[24], d[24];
    gp_test_fill(lg, 24, 5, 1, 0.0f, 3.0f);
    for (int i = 0; i < 24; i++) d[i] = NAN; /* every entry must be written */
    int32_t lb[6] = {1, -1, 3, 0, 2, -1};
    gp_tensor logits = gp_tensor_view(lg, gp_shape3(2, 3, 4), GP_F32);
    gp_tensor labels = gp_tensor_view(lb, gp_shape2(2, 3), GP_I32);
    gp_tensor dl = gp_tensor_view(d, logits.shape, GP_F32);
    CHECK_EQ_INT(gp_count_labels(&labels), 4);
    double loss;
    CHECK_OK(gp_softmax_xent(&logits, &labels, 4.0, &loss, &dl));
    double want = 0;
    for (int r = 0; r < 6; r++)
        if (lb[r] != -1) want += row_loss(lg + 4 * r, 4, lb[r]);
    CHECK_NEAR(loss, want / 4, 1e-6);
    for (int j = 0; j < 4; j++) {
        CHECK(d[4 + j] == 0.0f);  /* row 1 ignored */
        CHECK(d[20 + j] == 0.0f); /* row 5 ignored */
    }
    for (int i = 0; i < 24; i++) CHECK(!isnan(d[i]));

    /* all rows ignored: loss 0, zero gradient, and any normalizer is accepted */
    int32_t none[6] = {-1, -1, -1, -1, -1, -1};
    gp_tensor nl = gp_tensor_view(none, gp_shape2(2, 3), GP_I32);
    CHECK_EQ_INT(gp_count_labels(&nl), 0);
    CHECK_OK(gp_softmax_xent(&logits, &nl, 0.0, &loss, &dl));
    CHECK(loss == 0.0);
    for (int i = 0; i < 24; i++) CHECK(d[i] == 0.0f);
    CHECK_EQ_INT(gp_count_labels(NULL), 0);
}

/* d(loss)/d(logit) by central differences on the double loss. */
static void test_finite_differences(void) {
    enum { R = 5, V = 7 };
    float lg[R * V], d[R * V];
    gp_test_fill(lg, R * V, 11, 1, 0.0f, 2.0f);
    int32_t lb[R] = {0, 6, -1, 3, 3};
    gp_tensor logits = gp_tensor_view(lg, gp_shape2(R, V), GP_F32);
    gp_tensor labels = gp_tensor_view(lb, gp_shape1(R), GP_I32);
    gp_tensor dl = gp_tensor_view(d, logits.shape, GP_F32);
    const double norm = 6.0; /* e.g. a micro-batch of a larger mini-batch */
    double loss;
    CHECK_OK(gp_softmax_xent(&logits, &labels, norm, &loss, &dl));
    const float eps = 1.0f / 256; /* exact in float, so x +- eps is exact */
    int bad = 0;
    for (int i = 0; i < R * V; i++) {
        float keep = lg[i];
        double fp, fm;
        lg[i] = keep + eps;
        CHECK_OK(gp_softmax_xent(&logits, &labels, norm, &fp, NULL));
        lg[i] = keep - eps;
        CHECK_OK(gp_softmax_xent(&logits, &labels, norm, &fm, NULL));
        lg[i] = keep;
        double num = (fp - fm) / (2.0 * eps);
        if (fabs(num - d[i]) > 1e-5 + 1e-3 * fabs(num)) {
            fprintf(stderr, "dlogits[%d]: numeric %.8g vs analytic %.8g\n", i, num, d[i]);
            bad++;
        }
    }
    CHECK_EQ_INT(bad, 0);
}

static void test_errors(void) {
    float lg[6] = {0};
    int32_t lb[2] = {0, 3};
    gp_tensor logits = gp_tensor_view(lg, gp_shape2(2, 3), GP_F32);
    gp_tensor labels = gp_tensor_view(lb, gp_shape1(2), GP_I32);
    double loss;
    CHECK_FAILS(gp_softmax_xent(&logits, &labels, 2.0, &loss, NULL), GP_INVALID_ARGUMENT,
                "label 3 at row 1 is outside [-1, 3)");
    lb[1] = -2;
    CHECK_FAILS(gp_softmax_xent(&logits, &labels, 2.0, &loss, NULL), GP_INVALID_ARGUMENT,
                "label -2 at row 1");
    lb[1] = 1;
    CHECK_FAILS(gp_softmax_xent(&logits, &labels, 0.0, &loss, NULL), GP_INVALID_ARGUMENT,
                "normalizer 0 with 2 labelled rows");
    CHECK_FAILS(gp_softmax_xent(&logits, &labels, -1.0, &loss, NULL), GP_INVALID_ARGUMENT,
                "expected > 0");
    CHECK_FAILS(gp_softmax_xent(&logits, &labels, NAN, &loss, NULL), GP_INVALID_ARGUMENT,
                "normalizer");
    gp_tensor three = gp_tensor_view(lb, gp_shape1(1), GP_I32);
    CHECK_FAILS(gp_softmax_xent(&logits, &three, 1.0, &loss, NULL), GP_SHAPE,
                "expected one per row of logits (2, 3) (2 rows)");
    gp_tensor flt = gp_tensor_view(lg, gp_shape1(2), GP_F32);
    CHECK_FAILS(gp_softmax_xent(&logits, &flt, 1.0, &loss, NULL), GP_INVALID_ARGUMENT,
                "expected float32 and int32");
    float d[5];
    gp_tensor dl = gp_tensor_view(d, gp_shape2(1, 5), GP_F32);
    CHECK_FAILS(gp_softmax_xent(&logits, &labels, 1.0, &loss, &dl), GP_SHAPE,
                "expected float32 (2, 3)");
    CHECK_FAILS(gp_softmax_xent(NULL, &labels, 1.0, &loss, NULL), GP_INVALID_ARGUMENT, "NULL");
}

/* Micro-batches: each half with the whole batch's normalizer adds up to the whole. */
static void test_halves_add_up(void) {
    enum { B = 8, T = 16, V = 256 };
    float *lg = malloc(sizeof(float) * B * T * V), *d = malloc(sizeof(float) * B * T * V);
    float *dh = malloc(sizeof(float) * B * T * V);
    int32_t lb[B * T];
    gp_test_fill(lg, B * T * V, 21, 1, 0.0f, 8.0f);
    for (int i = 0; i < B * T; i++)
        lb[i] = (int32_t)(gp_rng_u64(&(gp_rng_stream){.seed = 21, .purpose = GP_RNG_TEST, .a = 2},
                                     (uint64_t)i) %
                          (V + 1)) -
                1; /* about 1 in 257 ignored */
    lb[3] = -1;
    gp_tensor logits = gp_tensor_view(lg, gp_shape3(B, T, V), GP_F32);
    gp_tensor labels = gp_tensor_view(lb, gp_shape2(B, T), GP_I32);
    gp_tensor dl = gp_tensor_view(d, logits.shape, GP_F32);
    double n = (double)gp_count_labels(&labels), whole, half[2];
    CHECK(n < B * T && n > B * T - 10);
    CHECK_OK(gp_softmax_xent(&logits, &labels, n, &whole, &dl));
    for (int h = 0; h < 2; h++) {
        int64_t off = (int64_t)h * (B / 2) * T;
        gp_tensor lh = gp_tensor_view(lg + off * V, gp_shape3(B / 2, T, V), GP_F32);
        gp_tensor yh = gp_tensor_view(lb + off, gp_shape2(B / 2, T), GP_I32);
        gp_tensor dhh = gp_tensor_view(dh + off * V, lh.shape, GP_F32);
        CHECK_OK(gp_softmax_xent(&lh, &yh, n, &half[h], &dhh));
    }
    CHECK_NEAR(half[0] + half[1], whole, 1e-6);
    CHECK(memcmp(d, dh, sizeof(float) * B * T * V) == 0); /* row-wise: bitwise the same */
    CHECK(whole > 1.0 && isfinite(whole));
    free(lg);
    free(d);
    free(dh);
}

/* Large logits: no overflow (the row maximum is subtracted). */
static void test_stability(void) {
    float lg[4] = {1000, 0, -1000, 999};
    int32_t lb[2] = {1, 0};
    float d[4];
    gp_tensor logits = gp_tensor_view(lg, gp_shape2(2, 2), GP_F32);
    gp_tensor labels = gp_tensor_view(lb, gp_shape1(2), GP_I32);
    gp_tensor dl = gp_tensor_view(d, logits.shape, GP_F32);
    double loss;
    CHECK_OK(gp_softmax_xent(&logits, &labels, 2.0, &loss, &dl));
    /* row 0: 1000 - 0; row 1: log(e^-1000 + e^999) + 1000 = 1999 */
    CHECK_NEAR(loss, (1000.0 + 1999.0) / 2, 1e-9);
    CHECK_NEAR(d[0], 0.5, 0);
    CHECK_NEAR(d[1], -0.5, 0);
    CHECK_NEAR(d[2], -0.5, 0);
    CHECK_NEAR(d[3], 0.5, 0);
}

int main(void) {
    test_small_by_hand();
    test_ignored_and_3d();
    test_finite_differences();
    test_errors();
    test_halves_add_up();
    test_stability();
    return gp_test_finish("test_loss");
}
