/* Tests of the Transformer layer family (linear, embeddings, layer norm,
 * GELU, ReLU, dropout, causal attention, the composite block): finite
 * differences, naive references, causality, dropout masks, the tanh/exp
 * approximations, costs and error messages, the bf16 weight copies read. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/cpu/cpu_kernels.h"
#include "layers/transformer_block_tp.h"
#include "layers/transformer_ops.h"
#include "testutil.h"

static bool quick(void) {
    const char *q = getenv("GP_TEST_QUICK");
    return q && q[0] == '1';
}

/* Parameters from the test RNG (trainable) or their init constants
 * (buffers), gradients zeroed. */
static void alloc_params(gp_layer *l, gp_device *dev, uint64_t seed, float lo, float hi) {
    for (int i = 0; i < l->nparams; i++) {
        gp_param *p = &l->params[i];
        REQUIRE_OK(gp_tensor_alloc(dev, GP_MEM_PARAMS, p->shape, GP_F32, &p->value));
        gp_test_fill(p->value.data, gp_tensor_nelem(&p->value), seed, 300 + (uint32_t)i, lo, hi);
        REQUIRE_OK(gp_tensor_zeros(dev, GP_MEM_GRADS, p->shape, GP_F32, &p->grad));
    }
}

static void free_params(gp_layer *l) {
    for (int i = 0; i < l->nparams; i++) {
        gp_tensor_release(&l->params[i].value);
        gp_tensor_release(&l->params[i].grad);
    }
}

static float *P(gp_layer *l, int i) { return l->params[i].value.data; }

/* Runs forward into a fresh y (released by the caller), keeping c alive. */
static void run_forward(gp_layer *l, gp_device *dev, const gp_run *run, gp_ctx *c,
                        const gp_tensor *x, gp_tensor *y) {
    gp_shape os;
    REQUIRE_OK(l->ops->out_shape(l, &x->shape, x->dtype, &os));
    REQUIRE_OK(gp_tensor_alloc(dev, GP_MEM_ACTIVATIONS, os, GP_F32, y));
    gp_ctx_init(c, dev, run);
    c->x = x;
    c->y = y;
    REQUIRE_OK(l->ops->forward(l, c, x, y));
}

static double max_abs_diff(const float *a, const float *b, int64_t n) {
    double m = 0;
    for (int64_t i = 0; i < n; i++) m = fmax(m, fabs((double)a[i] - (double)b[i]));
    return m;
}

/* ------------------------------------------------------- approximations */

static void test_tanh_exp_accuracy(void) {
    double worst = 0, worst_x = 0;
    /* A dense grid through both branches and the switch at 0.55, plus tiny
     * and huge magnitudes. */
    for (int i = -240000; i <= 240000; i++) {
        float x = (float)i * 5e-5f;
        double ref = tanh((double)x);
        double got = gp_cpu_tanhf(x);
        double rel = ref != 0 ? fabs(got - ref) / fabs(ref) : fabs(got);
        if (rel > worst) worst = rel, worst_x = x;
    }
    const float special[] = {1e-30f, -1e-20f, 1e-7f, 3e-4f, 0.54999f, 0.55f, 0.55001f,
                             9.0f, 9.5f, -10.0f, 20.0f, -1e4f, 1e30f, 0.0f};
    for (size_t i = 0; i < sizeof special / sizeof *special; i++) {
        double ref = tanh((double)special[i]), got = gp_cpu_tanhf(special[i]);
        double rel = ref != 0 ? fabs(got - ref) / fabs(ref) : fabs(got);
        if (rel > worst) worst = rel, worst_x = special[i];
    }
    if (worst > 1e-6) fprintf(stderr, "tanh: relative error %.3g at x = %.9g\n", worst, worst_x);
    CHECK(worst <= 1e-6);
    CHECK(isnan(gp_cpu_tanhf(NAN)));
    CHECK(gp_cpu_tanhf(INFINITY) == 1.0f && gp_cpu_tanhf(-INFINITY) == -1.0f);
    CHECK(gp_cpu_tanhf(-0.3f) == -gp_cpu_tanhf(0.3f));

    /* The array form must equal the scalar one bit for bit (vectorized or not). */
    enum { N = 1003 };
    float x[N], y[N];
    gp_test_fill(x, N, 5, 1, 0.0f, 12.0f);
    gp_cpu_tanh(N, x, y);
    int same = 0;
    for (int i = 0; i < N; i++) same += y[i] == gp_cpu_tanhf(x[i]);
    CHECK_EQ_INT(same, N);

    double ew = 0;
    for (int i = -8700; i <= 8800; i++) {
        float v = (float)i * 0.01f;
        double ref = exp((double)v), rel = fabs(gp_cpu_expf(v) - ref) / ref;
        ew = fmax(ew, rel);
    }
    if (ew > 1e-6) fprintf(stderr, "exp: relative error %.3g\n", ew);
    CHECK(ew <= 1e-6);
    CHECK(gp_cpu_expf(-200.0f) == 0.0f);
    CHECK(isnan(gp_cpu_expf(NAN)));
    printf("  tanh max relative error %.3g (at %.6g), exp %.3g\n", worst, worst_x, ew);
}

static void test_gelu_values(void) {
    enum { N = 4001 };
    static float x[N], y[N], dy[N], dx[N];
    for (int i = 0; i < N; i++) x[i] = -10.0f + 20.0f * (float)i / (N - 1);
    for (int i = 0; i < N; i++) dy[i] = 1.0f;
    const gp_kernels *K = gp_cpu_kernels();
    REQUIRE_OK(K->gelu_forward(NULL, N, x, y, NULL));
    REQUIRE_OK(K->gelu_backward(NULL, 1, N, x, dy, dx, NULL));
    const double k0 = sqrt(2.0 / 3.14159265358979323846), k1 = 0.044715;
    double ey = 0, ed = 0;
    for (int i = 0; i < N; i++) {
        double v = x[i], u = k0 * (v + k1 * v * v * v), t = tanh(u);
        double ref = 0.5 * v * (1 + t);
        double dref = 0.5 * (1 + t) + 0.5 * v * (1 - t * t) * k0 * (1 + 3 * k1 * v * v);
        ey = fmax(ey, fabs(y[i] - ref) / fmax(1.0, fabs(ref)));
        ed = fmax(ed, fabs(dx[i] - dref));
    }
    CHECK(ey <= 2e-6);
    CHECK(ed <= 2e-6);
    if (ey > 2e-6 || ed > 2e-6) fprintf(stderr, "gelu: error %.3g, gradient error %.3g\n", ey, ed);
    /* Extreme inputs stay finite: no inf * 0 in the gradient. */
    float big[4] = {1e20f, -1e20f, 1e38f, -1e38f}, ones[4] = {1, 1, 1, 1}, gb[4], yb[4];
    REQUIRE_OK(K->gelu_forward(NULL, 4, big, yb, NULL));
    REQUIRE_OK(K->gelu_backward(NULL, 1, 4, big, ones, gb, NULL));
    CHECK(yb[0] == 1e20f && yb[1] == 0.0f && gb[0] == 1.0f && gb[1] == 0.0f);
    CHECK(gb[2] == 1.0f && gb[3] == 0.0f);
}

/* ------------------------------------------------------------ gradchecks */

static void gradcheck_layer(gp_layer *l, gp_shape in, gp_dtype dt, uint64_t seed,
                            const gp_gradcheck_opts *o, const char *what) {
    if (!l) {
        fprintf(stderr, "%s: constructor failed: %s\n", what, gp_last_error());
        gp_test_failures++;
        return;
    }
    int bad = gp_gradcheck(l, in, dt, seed, o);
    if (bad) fprintf(stderr, "gradcheck of %s: %d mismatches\n", what, bad);
    gp_layer_free(l);
}

static void test_gradchecks(void) {
    gp_gradcheck_opts o = gp_gradcheck_defaults();
    if (quick()) o.samples = 12;
    /* Linear acts on the last dimension of 2-4 dimensional inputs. */
    gradcheck_layer(gp_linear(5, 4, true), gp_shape2(3, 5), GP_F32, 11, &o, "linear 2d");
    gradcheck_layer(gp_linear(6, 7, false), gp_shape3(2, 3, 6), GP_F32, 12, &o, "linear 3d");
    gradcheck_layer(gp_linear(3, 2, true), gp_shape4(2, 2, 3, 3), GP_F32, 13, &o, "linear 4d");

    gp_gradcheck_opts oe = o;
    oe.vocab = 7;
    gradcheck_layer(gp_embedding(7, 6), gp_shape2(3, 5), GP_I32, 21, &oe, "embedding");
    gradcheck_layer(gp_embedding(9, 16), gp_shape2(2, 9), GP_I32, 22, &oe, "embedding 2");
    gradcheck_layer(gp_pos_embedding(6, 5), gp_shape3(2, 4, 5), GP_F32, 23, &o, "pos_embedding");
    gradcheck_layer(gp_pos_embedding(4, 3), gp_shape3(3, 4, 3), GP_F32, 24, &o, "pos_embedding T=max");

    /* Layer norm: dims below, at and above the 16-wide lanes, with a tail. */
    gradcheck_layer(gp_layernorm(7), gp_shape2(3, 7), GP_F32, 31, &o, "layernorm 7");
    gradcheck_layer(gp_layernorm(16), gp_shape3(2, 3, 16), GP_F32, 32, &o, "layernorm 16");
    gradcheck_layer(gp_layernorm(37), gp_shape4(2, 2, 1, 37), GP_F32, 33, &o, "layernorm 37");

    gradcheck_layer(gp_gelu(), gp_shape2(4, 9), GP_F32, 41, &o, "gelu");
    gradcheck_layer(gp_gelu(), gp_shape4(2, 3, 2, 5), GP_F32, 42, &o, "gelu 4d");
    gradcheck_layer(gp_relu(), gp_shape3(2, 3, 7), GP_F32, 43, &o, "relu");
    gradcheck_layer(gp_dropout(0.3f), gp_shape3(2, 5, 7), GP_F32, 44, &o, "dropout 0.3");
    gradcheck_layer(gp_dropout(0.0f), gp_shape2(3, 4), GP_F32, 45, &o, "dropout 0");

    /* Attention: several head counts; T = 70 crosses the 64-row causal block. */
    gradcheck_layer(gp_causal_attention(8, 2, 0.0f), gp_shape3(2, 5, 8), GP_F32, 51, &o,
                    "attention 2 heads");
    gradcheck_layer(gp_causal_attention(12, 3, 0.0f), gp_shape3(1, 7, 12), GP_F32, 52, &o,
                    "attention 3 heads");
    gradcheck_layer(gp_causal_attention(6, 1, 0.0f), gp_shape3(2, 70, 6), GP_F32, 53, &o,
                    "attention T=70");
    gradcheck_layer(gp_causal_attention(8, 4, 0.3f), gp_shape3(2, 6, 8), GP_F32, 54, &o,
                    "attention dropout 0.3");

    gradcheck_layer(gp_transformer_block(8, 2, 16, 0.0f), gp_shape3(2, 5, 8), GP_F32, 61, &o,
                    "block");
    gradcheck_layer(gp_transformer_block(12, 3, 20, 0.0f), gp_shape3(1, 6, 12), GP_F32, 62, &o,
                    "block 3 heads");
    gradcheck_layer(gp_transformer_block(8, 2, 16, 0.3f), gp_shape3(2, 5, 8), GP_F32, 63, &o,
                    "block dropout 0.3");
    if (!quick())
        gradcheck_layer(gp_transformer_block(4, 1, 8, 0.0f), gp_shape3(1, 67, 4), GP_F32, 64, &o,
                        "block T=67");
}

/* ---------------------------------------------------- naive references */

/* Attention forward against a direct double-precision evaluation. */
static void test_attention_reference(void) {
    const int B = 2, T = 67, C = 12, H = 3, hd = C / H;
    gp_device *dev;
    REQUIRE_OK(gp_device_cpu_new("attn-ref", &dev));
    gp_layer *l = gp_causal_attention(C, H, 0.0f);
    alloc_params(l, dev, 7, 0.05f, 0.5f);
    gp_tensor x, y;
    REQUIRE_OK(gp_tensor_alloc(dev, GP_MEM_ACTIVATIONS, gp_shape3(B, T, C), GP_F32, &x));
    gp_test_fill(x.data, B * T * C, 7, 1, 0.1f, 1.0f);
    gp_run run = {.training = true, .seed = 1};
    gp_ctx c;
    run_forward(l, dev, &run, &c, &x, &y);
    const float *wq = P(l, 0), *bq = P(l, 1), *wp = P(l, 2), *bp = P(l, 3);
    double *qkv = malloc(sizeof(double) * T * 3 * C), *att = malloc(sizeof(double) * T * C);
    double worst = 0;
    for (int b = 0; b < B; b++) {
        const float *xb = F32(x) + b * T * C;
        for (int t = 0; t < T; t++)
            for (int o = 0; o < 3 * C; o++) {
                double s = bq[o];
                for (int i = 0; i < C; i++) s += (double)xb[t * C + i] * wq[o * C + i];
                qkv[t * 3 * C + o] = s;
            }
        for (int h = 0; h < H; h++)
            for (int t = 0; t < T; t++) {
                double sc[128], m = -1e300, z = 0;
                for (int j = 0; j <= t; j++) {
                    double s = 0;
                    for (int e = 0; e < hd; e++)
                        s += qkv[t * 3 * C + h * hd + e] * qkv[j * 3 * C + C + h * hd + e];
                    sc[j] = s / sqrt((double)hd);
                    m = fmax(m, sc[j]);
                }
                for (int j = 0; j <= t; j++) z += (sc[j] = exp(sc[j] - m));
                for (int e = 0; e < hd; e++) {
                    double s = 0;
                    for (int j = 0; j <= t; j++) s += sc[j] / z * qkv[j * 3 * C + 2 * C + h * hd + e];
                    att[t * C + h * hd + e] = s;
                }
            }
        for (int t = 0; t < T; t++)
            for (int o = 0; o < C; o++) {
                double s = bp[o];
                for (int i = 0; i < C; i++) s += att[t * C + i] * wp[o * C + i];
                worst = fmax(worst, fabs(s - F32(y)[(b * T + t) * C + o]));
            }
    }
    if (worst > 1e-4) fprintf(stderr, "attention vs reference: max error %.3g\n", worst);
    CHECK(worst <= 1e-4);
    /* What forward saves is exactly what cost() announces, and what saved_bytes says on the
     * device (the planner's figure). */
    gp_cost cost = l->ops->cost(l, &x.shape);
    CHECK_EQ_INT(gp_ctx_saved_bytes(&c), cost.saved_bytes);
    CHECK_EQ_INT(gp_ctx_saved_bytes(&c), l->ops->saved_bytes(l, dev, &x.shape));
    free(qkv);
    free(att);
    gp_ctx_release(&c);
    gp_tensor_release(&y);
    gp_tensor_release(&x);
    free_params(l);
    gp_layer_free(l);
    gp_device_free(dev);
}

/* The block must equal the same math through the single layers. */
static void test_block_matches_layers(void) {
    const int B = 2, T = 9, C = 16, H = 4, F = 40;
    gp_device *dev;
    REQUIRE_OK(gp_device_cpu_new("block-ref", &dev));
    gp_layer *blk = gp_transformer_block(C, H, F, 0.0f);
    gp_layer *ln1 = gp_layernorm(C), *att = gp_causal_attention(C, H, 0.0f);
    gp_layer *ln2 = gp_layernorm(C), *fc = gp_linear(C, F, true), *act = gp_gelu();
    gp_layer *pr = gp_linear(F, C, true);
    alloc_params(blk, dev, 9, 0.05f, 0.6f);
    gp_layer *parts[] = {ln1, att, ln2, fc, pr};
    int k = 0;
    for (size_t i = 0; i < sizeof parts / sizeof *parts; i++) {
        alloc_params(parts[i], dev, 1, 0.1f, 0.2f);
        for (int j = 0; j < parts[i]->nparams; j++, k++)
            memcpy(parts[i]->params[j].value.data, blk->params[k].value.data,
                   (size_t)gp_tensor_nelem(&blk->params[k].value) * sizeof(float));
    }
    CHECK_EQ_INT(k, blk->nparams);
    gp_tensor x, y;
    REQUIRE_OK(gp_tensor_alloc(dev, GP_MEM_ACTIVATIONS, gp_shape3(B, T, C), GP_F32, &x));
    gp_test_fill(x.data, B * T * C, 9, 1, 0.1f, 2.0f);
    gp_run run = {.training = true, .seed = 3};
    gp_ctx c;
    run_forward(blk, dev, &run, &c, &x, &y);
    gp_cost cost = blk->ops->cost(blk, &x.shape);
    CHECK_EQ_INT(gp_ctx_saved_bytes(&c), cost.saved_bytes);
    CHECK_EQ_INT(gp_ctx_saved_bytes(&c), blk->ops->saved_bytes(blk, dev, &x.shape));
    gp_ctx_release(&c);

    gp_tensor a, b2, h, d, e, f, g;
    gp_ctx c1;
    run_forward(ln1, dev, &run, &c1, &x, &a);
    gp_ctx_release(&c1);
    run_forward(att, dev, &run, &c1, &a, &b2);
    gp_ctx_release(&c1);
    REQUIRE_OK(gp_tensor_alloc(dev, GP_MEM_ACTIVATIONS, x.shape, GP_F32, &h));
    for (int i = 0; i < B * T * C; i++) F32(h)[i] = F32(x)[i] + F32(b2)[i];
    run_forward(ln2, dev, &run, &c1, &h, &d);
    gp_ctx_release(&c1);
    run_forward(fc, dev, &run, &c1, &d, &e);
    gp_ctx_release(&c1);
    run_forward(act, dev, &run, &c1, &e, &f);
    gp_ctx_release(&c1);
    run_forward(pr, dev, &run, &c1, &f, &g);
    gp_ctx_release(&c1);
    for (int i = 0; i < B * T * C; i++) F32(g)[i] += F32(h)[i];
    double err = max_abs_diff(y.data, g.data, B * T * C);
    if (err > 1e-5) fprintf(stderr, "block vs single layers: max error %.3g\n", err);
    CHECK(err <= 1e-5);
    gp_tensor *ts[] = {&x, &y, &a, &b2, &h, &d, &e, &f, &g};
    for (size_t i = 0; i < sizeof ts / sizeof *ts; i++) gp_tensor_release(ts[i]);
    free_params(blk);
    gp_layer_free(blk);
    for (size_t i = 0; i < sizeof parts / sizeof *parts; i++) {
        free_params(parts[i]);
        gp_layer_free(parts[i]);
    }
    gp_layer_free(act);
    gp_mem_stats st;
    gp_device_mem_stats(dev, &st);
    CHECK_EQ_INT(st.live_total, 0);
    gp_device_free(dev);
}

/* Linear and layer norm against direct double evaluations. */
static void test_linear_layernorm_reference(void) {
    const int R = 6, I = 19, O = 5;
    gp_device *dev;
    REQUIRE_OK(gp_device_cpu_new("ref", &dev));
    gp_layer *lin = gp_linear(I, O, true), *ln = gp_layernorm(I);
    alloc_params(lin, dev, 4, 0.1f, 1.0f);
    alloc_params(ln, dev, 5, 0.1f, 1.0f);
    gp_tensor x, y, z;
    REQUIRE_OK(gp_tensor_alloc(dev, GP_MEM_ACTIVATIONS, gp_shape2(R, I), GP_F32, &x));
    gp_test_fill(x.data, R * I, 4, 1, 0.1f, 3.0f);
    F32(x)[0] = 1000.0f; /* a large offset: the two-pass variance must not cancel */
    gp_run run = {.training = false};
    gp_ctx c;
    run_forward(lin, dev, &run, &c, &x, &y);
    gp_ctx_release(&c);
    double e1 = 0, e2 = 0;
    for (int r = 0; r < R; r++)
        for (int o = 0; o < O; o++) {
            double s = P(lin, 1)[o];
            for (int i = 0; i < I; i++) s += (double)F32(x)[r * I + i] * P(lin, 0)[o * I + i];
            e1 = fmax(e1, fabs(s - F32(y)[r * O + o]) / fmax(1.0, fabs(s)));
        }
    run_forward(ln, dev, &run, &c, &x, &z);
    gp_ctx_release(&c);
    for (int r = 0; r < R; r++) {
        double m = 0, v = 0;
        for (int i = 0; i < I; i++) m += F32(x)[r * I + i];
        m /= I;
        for (int i = 0; i < I; i++) v += (F32(x)[r * I + i] - m) * (F32(x)[r * I + i] - m);
        v /= I;
        for (int i = 0; i < I; i++) {
            double ref = (F32(x)[r * I + i] - m) / sqrt(v + 1e-5) * P(ln, 0)[i] + P(ln, 1)[i];
            e2 = fmax(e2, fabs(ref - F32(z)[r * I + i]));
        }
    }
    CHECK(e1 <= 1e-5);
    CHECK(e2 <= 1e-5);
    if (e1 > 1e-5 || e2 > 1e-5) fprintf(stderr, "linear error %.3g, layernorm error %.3g\n", e1, e2);
    gp_tensor_release(&x);
    gp_tensor_release(&y);
    gp_tensor_release(&z);
    free_params(lin);
    free_params(ln);
    gp_layer_free(lin);
    gp_layer_free(ln);
    gp_device_free(dev);
}

/* ------------------------------------------------------------- causality */

/* Changing x at position t0 must leave outputs at positions < t0 bit-identical
 * and change those at t0. */
static void check_causal(gp_layer *l, int B, int T, int C, int t0, const char *what) {
    gp_device *dev;
    REQUIRE_OK(gp_device_cpu_new("causal", &dev));
    alloc_params(l, dev, 17, 0.1f, 1.0f);
    gp_tensor x, y1, y2;
    REQUIRE_OK(gp_tensor_alloc(dev, GP_MEM_ACTIVATIONS, gp_shape3(B, T, C), GP_F32, &x));
    gp_test_fill(x.data, (int64_t)B * T * C, 17, 1, 0.1f, 1.0f);
    gp_run run = {.training = true, .seed = 5, .step = 2};
    gp_ctx c;
    run_forward(l, dev, &run, &c, &x, &y1);
    gp_ctx_release(&c);
    for (int b = 0; b < B; b++)
        for (int i = 0; i < C; i++) F32(x)[((int64_t)b * T + t0) * C + i] += 0.5f;
    run_forward(l, dev, &run, &c, &x, &y2);
    gp_ctx_release(&c);
    for (int b = 0; b < B; b++) {
        const size_t before = (size_t)t0 * C * sizeof(float);
        const int64_t off = (int64_t)b * T * C;
        if (memcmp(F32(y1) + off, F32(y2) + off, before) != 0) {
            fprintf(stderr, "%s: outputs before t = %d changed (batch %d)\n", what, t0, b);
            gp_test_failures++;
        }
        CHECK(max_abs_diff(F32(y1) + off + (int64_t)t0 * C, F32(y2) + off + (int64_t)t0 * C, C) >
              1e-4);
    }
    gp_tensor_release(&x);
    gp_tensor_release(&y1);
    gp_tensor_release(&y2);
    free_params(l);
    gp_layer_free(l);
    gp_device_free(dev);
}

static void test_causality(void) {
    check_causal(gp_causal_attention(8, 2, 0.0f), 2, 70, 8, 3, "attention t=3");
    check_causal(gp_causal_attention(8, 2, 0.0f), 2, 70, 8, 65, "attention t=65");
    check_causal(gp_causal_attention(8, 2, 0.2f), 1, 9, 8, 4, "attention with dropout");
    check_causal(gp_transformer_block(8, 2, 12, 0.0f), 2, 70, 8, 64, "block t=64");
    check_causal(gp_transformer_block(8, 4, 12, 0.1f), 2, 10, 8, 1, "block with dropout");
}

/* --------------------------------------------------------------- dropout */

static void test_dropout_masks(void) {
    const int64_t n = quick() ? 20000 : 200000;
    const float p = 0.3f;
    gp_device *dev;
    REQUIRE_OK(gp_device_cpu_new("dropout", &dev));
    gp_layer *l = gp_dropout(p);
    l->index = 5;
    gp_tensor x, y1, y2, y3, y4;
    REQUIRE_OK(gp_tensor_alloc(dev, GP_MEM_ACTIVATIONS, gp_shape2(n / 100, 100), GP_F32, &x));
    gp_test_fill(x.data, n, 3, 1, 0.5f, 1.0f);
    gp_run run = {.training = true, .seed = 42, .step = 7, .micro_batch = 0};
    gp_ctx c;
    run_forward(l, dev, &run, &c, &x, &y1);
    gp_ctx_release(&c);
    run_forward(l, dev, &run, &c, &x, &y2);
    gp_ctx_release(&c);
    CHECK(memcmp(y1.data, y2.data, (size_t)n * sizeof(float)) == 0);
    gp_run other = run;
    other.micro_batch = 1;
    run_forward(l, dev, &other, &c, &x, &y3);
    gp_ctx_release(&c);
    int64_t kept = 0, differ = 0, exact = 0;
    for (int64_t i = 0; i < n; i++) {
        kept += F32(y1)[i] != 0.0f;
        differ += (F32(y1)[i] != 0.0f) != (F32(y3)[i] != 0.0f);
        exact += F32(y1)[i] == 0.0f || F32(y1)[i] == F32(x)[i] * (1.0f / (1.0f - p));
    }
    const double frac = (double)kept / (double)n;
    CHECK_NEAR(frac, 1.0 - p, 0.01);
    CHECK(differ > n / 4); /* independent masks differ in ~42% of places */
    CHECK_EQ_INT(exact, n);
    /* The mask is keyed by the layer index, the step and the seed too. */
    gp_run later = run;
    later.step = 8;
    run_forward(l, dev, &later, &c, &x, &y4);
    gp_ctx_release(&c);
    CHECK(memcmp(y1.data, y4.data, (size_t)n * sizeof(float)) != 0);
    gp_tensor_release(&y4);
    /* Backward regenerates the same mask. */
    gp_tensor dy, dx;
    REQUIRE_OK(gp_tensor_alloc(dev, GP_MEM_ACTIVATIONS, x.shape, GP_F32, &dy));
    REQUIRE_OK(gp_tensor_alloc(dev, GP_MEM_ACTIVATIONS, x.shape, GP_F32, &dx));
    for (int64_t i = 0; i < n; i++) F32(dy)[i] = 1.0f;
    run_forward(l, dev, &run, &c, &x, &y4);
    REQUIRE_OK(l->ops->backward(l, &c, &dy, &dx));
    gp_ctx_release(&c);
    int64_t agree = 0;
    for (int64_t i = 0; i < n; i++) agree += (F32(dx)[i] != 0.0f) == (F32(y1)[i] != 0.0f);
    CHECK_EQ_INT(agree, n);
    /* Evaluation mode: identity. */
    gp_run eval = run;
    eval.training = false;
    gp_tensor_release(&y4);
    run_forward(l, dev, &eval, &c, &x, &y4);
    gp_ctx_release(&c);
    CHECK(memcmp(y4.data, x.data, (size_t)n * sizeof(float)) == 0);
    gp_tensor *ts[] = {&x, &y1, &y2, &y3, &y4, &dy, &dx};
    for (size_t i = 0; i < sizeof ts / sizeof *ts; i++) gp_tensor_release(ts[i]);
    gp_layer_free(l);
    gp_device_free(dev);
}

/* A block with dropout: two forwards of the same run agree bit for bit
 * (what recomputation relies on); another micro-batch differs. */
static void test_block_dropout_repeatable(void) {
    gp_device *dev;
    REQUIRE_OK(gp_device_cpu_new("block-drop", &dev));
    gp_layer *l = gp_transformer_block(8, 2, 16, 0.25f);
    l->index = 2;
    alloc_params(l, dev, 8, 0.1f, 1.0f);
    gp_tensor x, y1, y2, y3;
    REQUIRE_OK(gp_tensor_alloc(dev, GP_MEM_ACTIVATIONS, gp_shape3(2, 6, 8), GP_F32, &x));
    gp_test_fill(x.data, 96, 8, 1, 0.1f, 1.0f);
    gp_run run = {.training = true, .seed = 9, .step = 1, .micro_batch = 2};
    gp_ctx c;
    run_forward(l, dev, &run, &c, &x, &y1);
    gp_ctx_release(&c);
    gp_run rec = run;
    rec.recompute = true;
    run_forward(l, dev, &rec, &c, &x, &y2);
    gp_ctx_release(&c);
    CHECK(memcmp(y1.data, y2.data, 96 * sizeof(float)) == 0);
    gp_run other = run;
    other.micro_batch = 3;
    run_forward(l, dev, &other, &c, &x, &y3);
    gp_ctx_release(&c);
    CHECK(memcmp(y1.data, y3.data, 96 * sizeof(float)) != 0);
    gp_tensor_release(&x);
    gp_tensor_release(&y1);
    gp_tensor_release(&y2);
    gp_tensor_release(&y3);
    free_params(l);
    gp_layer_free(l);
    gp_device_free(dev);
}

/* Backward twice from the same state gives bit-identical gradients. */
/* On a bf16 device the block keeps ln1(x), att, ln2(h) and gelu(u), read only as operands of its
 * products, in bf16: 2 bytes less for each of their N (C + C/T + C + F/T) elements, in what
 * forward saves and in what saved_bytes announces for the device (the planner's figure), and
 * the forward's and backward's bits of keeping them in fp32 (GP_BF16_ACTIVATIONS=fp32, which
 * the cost's device-free figure counts). For the whole block and a shard of two. */
static void test_block_bf16_saved(void) {
    const int B = 2, T = 9, C = 16, H = 4, F = 40, N = B * T;
    gp_device *dev;
    REQUIRE_OK(gp_device_cpu_new("bf16-saved", &dev));
    REQUIRE_OK(gp_device_set_precision(dev, GP_PRECISION_BF16));
    gp_layer *l = gp_transformer_block(C, H, F, 0.1f);
    alloc_params(l, dev, 12, 0.05f, 0.6f);
    gp_tensor x, dy, y[2], dx[2];
    const gp_shape s = gp_shape3(B, T, C);
    REQUIRE_OK(gp_tensor_alloc(dev, GP_MEM_ACTIVATIONS, s, GP_F32, &x));
    REQUIRE_OK(gp_tensor_alloc(dev, GP_MEM_ACTIVATIONS, s, GP_F32, &dy));
    gp_test_fill(x.data, N * C, 12, 1, 0.1f, 2.0f);
    gp_test_fill(dy.data, N * C, 12, 2, 0.1f, 1.0f);
    const gp_run run = {.training = true, .seed = 5};
    const uint64_t cost = l->ops->cost(l, &s).saved_bytes;
    /* 2 bytes x N (C + C + C + F): 3168 less than the fp32 figure */
    const uint64_t want[2] = {cost - 3168, cost};
    float *g[2][GP_LAYER_MAX_PARAMS];
    for (int mode = 0; mode < 2; mode++) { /* 0: bf16 (the default), 1: fp32 kept */
        if (mode) setenv("GP_BF16_ACTIVATIONS", "fp32", 1);
        gp_ctx c;
        run_forward(l, dev, &run, &c, &x, &y[mode]);
        CHECK_EQ_INT(gp_ctx_saved_bytes(&c), want[mode]);
        CHECK_EQ_INT(l->ops->saved_bytes(l, dev, &s), want[mode]);
        REQUIRE_OK(gp_tensor_alloc(dev, GP_MEM_ACTIVATIONS, s, GP_F32, &dx[mode]));
        REQUIRE_OK(l->ops->backward(l, &c, &dy, &dx[mode]));
        gp_ctx_release(&c);
        for (int i = 0; i < l->nparams; i++) {
            const size_t nb = gp_tensor_nbytes(&l->params[i].grad);
            g[mode][i] = malloc(nb);
            memcpy(g[mode][i], l->params[i].grad.data, nb);
            memset(l->params[i].grad.data, 0, nb);
        }
        unsetenv("GP_BF16_ACTIVATIONS");
    }
    CHECK(memcmp(y[0].data, y[1].data, gp_tensor_nbytes(&x)) == 0);
    CHECK(memcmp(dx[0].data, dx[1].data, gp_tensor_nbytes(&x)) == 0);
    for (int i = 0; i < l->nparams; i++) {
        CHECK(memcmp(g[0][i], g[1][i], gp_tensor_nbytes(&l->params[i].grad)) == 0);
        free(g[0][i]), free(g[1][i]);
    }
    /* a shard of two: C/T and F/T of att and gelu(u): 2 x N (C + 8 + C + 20) = 2160 less */
    gp_layer *sh = gp_transformer_block_shard(C, H, F, 0.1f, 2);
    CHECK_EQ_INT(sh->ops->saved_bytes(sh, dev, &s), sh->ops->cost(sh, &s).saved_bytes - 2160);
    REQUIRE_OK(gp_device_set_precision(dev, GP_PRECISION_FP32));
    CHECK_EQ_INT(l->ops->saved_bytes(l, dev, &s), cost); /* fp32: as it was */
    gp_layer_free(sh);
    gp_tensor *ts[] = {&x, &dy, &y[0], &y[1], &dx[0], &dx[1]};
    for (size_t i = 0; i < sizeof ts / sizeof *ts; i++) gp_tensor_release(ts[i]);
    free_params(l);
    gp_layer_free(l);
    gp_device_free(dev);
}

/* Layer l's forward and backward on x, dy: y, dx and the gradients (copied, malloc'd) in out,
 * the gradients zeroed after. */
static void forward_backward(gp_layer *l, gp_device *dev, const gp_tensor *x, const gp_tensor *dy,
                             void *out[GP_LAYER_MAX_PARAMS + 2]) {
    const gp_run run = {.training = true, .seed = 5};
    gp_ctx c;
    gp_tensor y, dx;
    run_forward(l, dev, &run, &c, x, &y);
    REQUIRE_OK(gp_tensor_alloc(dev, GP_MEM_ACTIVATIONS, x->shape, GP_F32, &dx));
    REQUIRE_OK(l->ops->backward(l, &c, dy, &dx));
    gp_ctx_release(&c);
    const gp_tensor *t[2] = {&y, &dx};
    for (int i = 0; i < l->nparams + 2; i++) {
        const gp_tensor *g = i < 2 ? t[i] : &l->params[i - 2].grad;
        out[i] = malloc(gp_tensor_nbytes(g));
        memcpy(out[i], g->data, gp_tensor_nbytes(g));
        if (i >= 2) memset(g->data, 0, gp_tensor_nbytes(g));
    }
    gp_tensor_release(&y);
    gp_tensor_release(&dx);
}

/* On a bf16 device a layer reads its product weights (gp_param.product: exactly `nproduct` of
 * them) from their bf16 copies where value16 is set (the store sets them, model/store.h): copies
 * holding the weights rounded give the bits of no copies at all (y, dx, every gradient), and
 * copies of other values (the weights negated) give another output: the layer reads the copy. */
static void check_weight16(gp_layer *l, gp_shape s, int nproduct, const char *what) {
    gp_device *dev;
    REQUIRE_OK(gp_device_cpu_new("w16", &dev));
    REQUIRE_OK(gp_device_set_precision(dev, GP_PRECISION_BF16));
    alloc_params(l, dev, 21, -0.6f, 0.6f);
    const int64_t n = gp_shape_nelem(&s);
    gp_tensor x, dy;
    REQUIRE_OK(gp_tensor_alloc(dev, GP_MEM_ACTIVATIONS, s, GP_F32, &x));
    REQUIRE_OK(gp_tensor_alloc(dev, GP_MEM_ACTIVATIONS, s, GP_F32, &dy));
    gp_test_fill(x.data, n, 21, 1, -1.0f, 1.0f);
    gp_test_fill(dy.data, n, 21, 2, -1.0f, 1.0f);
    void *r[3][GP_LAYER_MAX_PARAMS + 2]; /* without copies, the weights', other values' */
    forward_backward(l, dev, &x, &dy, r[0]);
    int products = 0;
    for (int mode = 1; mode < 3; mode++) {
        for (int i = 0; i < l->nparams; i++) {
            gp_param *p = &l->params[i];
            if (!p->product) continue;
            products += mode == 1;
            const int64_t k = gp_tensor_nelem(&p->value);
            float *v = malloc((size_t)k * sizeof *v);
            for (int64_t j = 0; j < k; j++) v[j] = mode == 1 ? P(l, i)[j] : -P(l, i)[j];
            REQUIRE_OK(gp_tensor_alloc(dev, GP_MEM_PARAMS, p->shape, GP_BF16, &p->value16));
            REQUIRE_OK(gp_kernels_of(dev)->bf16_store(dev, v, p->value16.data, k));
            free(v);
        }
        forward_backward(l, dev, &x, &dy, r[mode]);
        for (int i = 0; i < l->nparams; i++) gp_tensor_release(&l->params[i].value16);
    }
    CHECK_EQ_INT(products, nproduct);
    int same = 1;
    for (int i = 0; i < l->nparams + 2; i++) {
        const size_t nb = i < 2 ? (size_t)n * 4 : gp_tensor_nbytes(&l->params[i - 2].grad);
        same &= memcmp(r[1][i], r[0][i], nb) == 0;
    }
    if (!same) {
        fprintf(stderr, "%s: with its weights' bf16 copies NOT the bits without them\n", what);
        gp_test_failures++;
    }
    if (memcmp(r[2][0], r[0][0], (size_t)n * 4) == 0) {
        fprintf(stderr, "%s: copies of other values gave the same output: not read\n", what);
        gp_test_failures++;
    }
    for (int m = 0; m < 3; m++)
        for (int i = 0; i < l->nparams + 2; i++) free(r[m][i]);
    gp_tensor_release(&x);
    gp_tensor_release(&dy);
    free_params(l);
    gp_layer_free(l);
    gp_device_free(dev);
}

static void test_weight16(void) {
    const int B = 2, T = 9, C = 16;
    check_weight16(gp_linear(C, C, true), gp_shape3(B, T, C), 1, "linear");
    check_weight16(gp_causal_attention(C, 4, 0.1f), gp_shape3(B, T, C), 2, "causal_attention");
    check_weight16(gp_transformer_block(C, 4, 40, 0.1f), gp_shape3(B, T, C), 4,
                   "transformer_block");
}

static void test_backward_deterministic(void) {
    gp_device *dev;
    REQUIRE_OK(gp_device_cpu_new("det", &dev));
    gp_layer *l = gp_transformer_block(16, 4, 32, 0.1f);
    alloc_params(l, dev, 10, 0.05f, 0.5f);
    gp_tensor x, y, dy, dx1, dx2;
    gp_shape s = gp_shape3(2, 70, 16);
    REQUIRE_OK(gp_tensor_alloc(dev, GP_MEM_ACTIVATIONS, s, GP_F32, &x));
    REQUIRE_OK(gp_tensor_alloc(dev, GP_MEM_ACTIVATIONS, s, GP_F32, &dy));
    REQUIRE_OK(gp_tensor_alloc(dev, GP_MEM_ACTIVATIONS, s, GP_F32, &dx1));
    REQUIRE_OK(gp_tensor_alloc(dev, GP_MEM_ACTIVATIONS, s, GP_F32, &dx2));
    gp_test_fill(x.data, 2 * 70 * 16, 10, 1, 0.1f, 1.0f);
    gp_test_fill(dy.data, 2 * 70 * 16, 10, 2, 0.1f, 1.0f);
    gp_run run = {.training = true, .seed = 4};
    gp_ctx c;
    run_forward(l, dev, &run, &c, &x, &y);
    REQUIRE_OK(l->ops->backward(l, &c, &dy, &dx1));
    float *g1[GP_LAYER_MAX_PARAMS];
    for (int i = 0; i < l->nparams; i++) {
        int64_t n = gp_tensor_nelem(&l->params[i].grad);
        g1[i] = malloc((size_t)n * sizeof(float));
        memcpy(g1[i], l->params[i].grad.data, (size_t)n * sizeof(float));
        memset(l->params[i].grad.data, 0, (size_t)n * sizeof(float));
    }
    REQUIRE_OK(l->ops->backward(l, &c, &dy, &dx2));
    CHECK(memcmp(dx1.data, dx2.data, gp_tensor_nbytes(&dx1)) == 0);
    for (int i = 0; i < l->nparams; i++) {
        CHECK(memcmp(g1[i], l->params[i].grad.data, gp_tensor_nbytes(&l->params[i].grad)) == 0);
        free(g1[i]);
    }
    /* Backward without dx still produces every parameter gradient. */
    for (int i = 0; i < l->nparams; i++)
        memset(l->params[i].grad.data, 0, gp_tensor_nbytes(&l->params[i].grad));
    REQUIRE_OK(l->ops->backward(l, &c, &dy, NULL));
    CHECK(F32(l->params[0].grad)[0] != 0.0f && F32(l->params[1].grad)[0] != 0.0f);
    gp_ctx_release(&c);
    gp_mem_stats st;
    gp_device_mem_stats(dev, &st);
    CHECK_EQ_INT(st.live[GP_MEM_WORKSPACE], 0); /* workspaces returned */
    CHECK(st.peak[GP_MEM_WORKSPACE] > 0);
    gp_tensor *ts[] = {&x, &y, &dy, &dx1, &dx2};
    for (size_t i = 0; i < sizeof ts / sizeof *ts; i++) gp_tensor_release(ts[i]);
    free_params(l);
    gp_layer_free(l);
    gp_device_free(dev);
}

/* ---------------------------------------------------- errors and metadata */

static void test_embedding_errors(void) {
    gp_device *dev;
    REQUIRE_OK(gp_device_cpu_new("emb", &dev));
    gp_layer *l = gp_embedding(10, 4);
    l->index = 0;
    alloc_params(l, dev, 1, 0.1f, 1.0f);
    gp_tensor x, y;
    REQUIRE_OK(gp_tensor_alloc(dev, GP_MEM_ACTIVATIONS, gp_shape2(2, 3), GP_I32, &x));
    REQUIRE_OK(gp_tensor_alloc(dev, GP_MEM_ACTIVATIONS, gp_shape3(2, 3, 4), GP_F32, &y));
    int32_t *ids = (int32_t *)x.data;
    for (int i = 0; i < 6; i++) ids[i] = i;
    gp_run run = {.training = true};
    gp_ctx c;
    gp_ctx_init(&c, dev, &run);
    c.x = &x;
    c.y = &y;
    CHECK_OK(l->ops->forward(l, &c, &x, &y));
    CHECK(memcmp(F32(y) + 3 * 4, P(l, 0) + 3 * 4, 4 * sizeof(float)) == 0);
    ids[4] = 10;
    CHECK_FAILS(l->ops->forward(l, &c, &x, &y), GP_INVALID_ARGUMENT, "token id 10 at position 4");
    CHECK(strstr(gp_last_error(), "layer 0 (embedding)") != NULL);
    ids[4] = -3;
    CHECK_FAILS(l->ops->forward(l, &c, &x, &y), GP_INVALID_ARGUMENT, "token id -3");
    CHECK(strstr(gp_last_error(), "row 1, column 1") != NULL);
    gp_ctx_release(&c);
    gp_shape os, bad = gp_shape2(2, 3);
    CHECK_FAILS(l->ops->out_shape(l, &bad, GP_F32, &os), GP_SHAPE, "dtype float32, expected int32");
    gp_tensor_release(&x);
    gp_tensor_release(&y);
    free_params(l);
    gp_layer_free(l);
    gp_device_free(dev);
}

static void test_constructor_and_shape_errors(void) {
    CHECK(gp_causal_attention(10, 3, 0.0f) == NULL);
    CHECK(strstr(gp_last_error(), "dim = 10 must be a positive multiple of heads = 3") != NULL);
    CHECK(gp_causal_attention(8, 2, 1.0f) == NULL);
    CHECK(gp_causal_attention(8, 0, 0.0f) == NULL);
    CHECK(gp_transformer_block(8, 3, 16, 0.0f) == NULL);
    CHECK(strstr(gp_last_error(), "gp_transformer_block") != NULL);
    CHECK(gp_transformer_block(8, 2, 0, 0.0f) == NULL);
    CHECK(gp_transformer_block(8, 2, 16, -0.1f) == NULL);
    CHECK(gp_transformer_block(8, 2, 16, NAN) == NULL);
    CHECK(gp_dropout(1.0f) == NULL);
    CHECK(strstr(gp_last_error(), "0 <= p < 1") != NULL);
    CHECK(gp_dropout(-0.5f) == NULL);
    CHECK(gp_linear(0, 4, true) == NULL);
    CHECK(strstr(gp_last_error(), "in_features = 0") != NULL);
    CHECK(gp_embedding(0, 4) == NULL);
    CHECK(gp_pos_embedding(4, -1) == NULL);
    CHECK(gp_layernorm(0) == NULL);

    gp_shape os;
    gp_layer *lin = gp_linear(8, 3, true);
    lin->index = 4;
    gp_shape in = gp_shape3(2, 5, 7);
    CHECK_FAILS(lin->ops->out_shape(lin, &in, GP_F32, &os), GP_SHAPE, "in_features = 8 at axis 2");
    CHECK(strstr(gp_last_error(), "layer 4 (linear)") && strstr(gp_last_error(), "(2, 5, 7)"));
    in = gp_shape1(8);
    CHECK_FAILS(lin->ops->out_shape(lin, &in, GP_F32, &os), GP_SHAPE, "expected 2 to 4");
    in = gp_shape4(2, 3, 4, 8);
    CHECK_OK(lin->ops->out_shape(lin, &in, GP_F32, &os));
    CHECK(os.ndim == 4 && os.dim[3] == 3 && os.dim[2] == 4);
    CHECK_FAILS(lin->ops->out_shape(lin, &in, GP_I32, &os), GP_SHAPE, "int32");
    gp_layer_free(lin);

    gp_layer *att = gp_causal_attention(8, 2, 0.0f);
    in = gp_shape3(2, 5, 6);
    CHECK_FAILS(att->ops->out_shape(att, &in, GP_F32, &os), GP_SHAPE, "C (dim) = 8");
    in = gp_shape2(5, 8);
    CHECK_FAILS(att->ops->out_shape(att, &in, GP_F32, &os), GP_SHAPE, "expected 3 (B, T, C)");
    gp_layer_free(att);

    gp_layer *pos = gp_pos_embedding(4, 8);
    in = gp_shape3(2, 5, 8);
    CHECK_FAILS(pos->ops->out_shape(pos, &in, GP_F32, &os), GP_SHAPE, "T = 5 exceeds max_len = 4");
    gp_layer_free(pos);

    gp_layer *ln = gp_layernorm(6);
    in = gp_shape2(3, 5);
    CHECK_FAILS(ln->ops->out_shape(ln, &in, GP_F32, &os), GP_SHAPE, "dim = 6");
    gp_layer_free(ln);

    /* Forward before the parameters exist is a clean error, not a crash. */
    gp_device *dev;
    REQUIRE_OK(gp_device_cpu_new("noparams", &dev));
    gp_layer *blk = gp_transformer_block(8, 2, 16, 0.0f);
    gp_tensor x, y;
    REQUIRE_OK(gp_tensor_zeros(dev, GP_MEM_ACTIVATIONS, gp_shape3(1, 2, 8), GP_F32, &x));
    REQUIRE_OK(gp_tensor_zeros(dev, GP_MEM_ACTIVATIONS, gp_shape3(1, 2, 8), GP_F32, &y));
    gp_run run = {0};
    gp_ctx c;
    gp_ctx_init(&c, dev, &run);
    c.x = &x;
    c.y = &y;
    CHECK_FAILS(blk->ops->forward(blk, &c, &x, &y), GP_INVALID_ARGUMENT, "not allocated");
    gp_ctx_release(&c);
    gp_tensor_release(&x);
    gp_tensor_release(&y);
    gp_layer_free(blk);
    gp_device_free(dev);
}

static void test_params_and_costs(void) {
    gp_layer *blk = gp_transformer_block(16, 4, 64, 0.0f);
    const char *names[] = {"ln1.weight", "ln1.bias", "attn.qkv.weight", "attn.qkv.bias",
                           "attn.proj.weight", "attn.proj.bias", "ln2.weight", "ln2.bias",
                           "mlp.fc.weight", "mlp.fc.bias", "mlp.proj.weight", "mlp.proj.bias"};
    CHECK_EQ_INT(blk->nparams, 12);
    for (int i = 0; i < 12 && i < blk->nparams; i++) {
        const gp_param *p = &blk->params[i];
        if (strcmp(p->name, names[i])) {
            fprintf(stderr, "block parameter %d is %s, expected %s\n", i, p->name, names[i]);
            gp_test_failures++;
        }
        CHECK(p->decay == (p->shape.ndim >= 2));
        CHECK(p->trainable);
        if (p->shape.ndim == 2) CHECK(p->init == GP_INIT_NORMAL && p->init_scale == 0.02f);
    }
    CHECK(blk->params[0].init == GP_INIT_ONES && blk->params[1].init == GP_INIT_ZEROS);
    CHECK(blk->params[3].init == GP_INIT_ZEROS);
    CHECK_EQ_INT(blk->params[8].shape.dim[0], 64);
    CHECK_EQ_INT(blk->params[10].shape.dim[1], 64);

    gp_layer *att = gp_causal_attention(16, 4, 0.0f);
    const char *an[] = {"qkv.weight", "qkv.bias", "proj.weight", "proj.bias"};
    CHECK_EQ_INT(att->nparams, 4);
    for (int i = 0; i < 4 && i < att->nparams; i++) CHECK(!strcmp(att->params[i].name, an[i]));
    CHECK_EQ_INT(att->params[0].shape.dim[0], 48);

    gp_layer *lin = gp_linear(12, 5, true);
    CHECK(lin->params[0].init == GP_INIT_UNIFORM && lin->params[1].init == GP_INIT_UNIFORM);
    CHECK_NEAR(lin->params[0].init_scale, 1.0 / sqrt(12.0), 1e-7);
    CHECK(lin->params[0].decay && !lin->params[1].decay);
    gp_layer *emb = gp_embedding(30, 8);
    CHECK(emb->params[0].init == GP_INIT_NORMAL && emb->params[0].init_scale == 0.02f);

    /* Linear FLOPs: exactly 2 B T in out for the product (+ B T out bias adds). */
    const int64_t B = 3, T = 7;
    gp_shape in = gp_shape3(B, T, 12);
    gp_layer *nob = gp_linear(12, 5, false);
    gp_cost c = nob->ops->cost(nob, &in);
    CHECK(c.fwd_flops == 2.0 * B * T * 12 * 5);
    CHECK(c.bwd_flops == 2.0 * c.fwd_flops);
    CHECK_EQ_INT(c.param_bytes, 12 * 5 * 4);
    CHECK_EQ_INT(c.out_bytes, B * T * 5 * 4);
    c = lin->ops->cost(lin, &in);
    CHECK(c.fwd_flops == 2.0 * B * T * 12 * 5 + B * T * 5);
    CHECK_EQ_INT(c.param_bytes, (12 * 5 + 5) * 4);

    /* Block: the GEMM FLOPs at T1 shapes are the bulk of its cost, and the
     * backward about twice the forward. */
    gp_layer *t1 = gp_transformer_block(512, 8, 2048, 0.0f);
    gp_shape s1 = gp_shape3(32, 128, 512);
    gp_cost ct = t1->ops->cost(t1, &s1);
    const double N = 32 * 128, C = 512, F = 2048;
    const double lin_flops = 2 * N * C * (3 * C + C + 2 * F);
    CHECK(ct.fwd_flops > lin_flops && ct.fwd_flops < 1.1 * lin_flops);
    CHECK(ct.bwd_flops > 1.9 * ct.fwd_flops && ct.bwd_flops < 2.1 * ct.fwd_flops);
    CHECK_EQ_INT(ct.param_bytes, (uint64_t)(4 * C * C + 2 * F * C + 9 * C + F) * 4);
    CHECK_EQ_INT(ct.out_bytes, (uint64_t)(N * C * 4));
    gp_layer *ls[] = {blk, att, lin, emb, nob, t1};
    for (size_t i = 0; i < sizeof ls / sizeof *ls; i++) gp_layer_free(ls[i]);
}

int main(void) {
    test_tanh_exp_accuracy();
    test_gelu_values();
    test_linear_layernorm_reference();
    test_attention_reference();
    test_block_matches_layers();
    test_block_bf16_saved();
    test_weight16();
    test_causality();
    test_dropout_masks();
    test_block_dropout_repeatable();
    test_backward_deterministic();
    test_embedding_errors();
    test_constructor_and_shape_errors();
    test_params_and_costs();
    test_gradchecks();
    return gp_test_finish("test_layers_transformer");
}
