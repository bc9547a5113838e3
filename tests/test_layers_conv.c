/* Tests of the ConvNet layers (conv2d, batchnorm2d, maxpool2d, global average
 * pool, flatten): finite-difference gradients, a naive direct convolution as the
 * reference, batch-norm running statistics, and the error messages. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/device.h"
#include "kernels/cpu/isa.h"
#include "testutil.h"

static bool quick(void) {
    const char *q = getenv("GP_TEST_QUICK");
    return q && q[0] == '1';
}

/* Allocates a layer's parameters (values from the test RNG for trainable ones,
 * their init constants for buffers) and zeroed gradients. */
static void alloc_params(gp_layer *l, gp_device *dev, uint64_t seed) {
    for (int i = 0; i < l->nparams; i++) {
        gp_param *p = &l->params[i];
        REQUIRE_OK(gp_tensor_alloc(dev, GP_MEM_PARAMS, p->shape, GP_F32, &p->value));
        int64_t n = gp_tensor_nelem(&p->value);
        if (p->trainable)
            gp_test_fill(p->value.data, n, seed, 200 + (uint32_t)i, 0.1f, 1.0f);
        else
            for (int64_t k = 0; k < n; k++)
                F32(p->value)[k] = p->init == GP_INIT_ONES ? 1.0f : 0.0f;
        REQUIRE_OK(gp_tensor_zeros(dev, GP_MEM_GRADS, p->shape, GP_F32, &p->grad));
    }
}

static void free_params(gp_layer *l) {
    for (int i = 0; i < l->nparams; i++) {
        gp_tensor_release(&l->params[i].value);
        gp_tensor_release(&l->params[i].grad);
    }
}

static gp_param *param(gp_layer *l, const char *name) {
    for (int i = 0; i < l->nparams; i++)
        if (!strcmp(l->params[i].name, name)) return &l->params[i];
    return NULL;
}

/* ----------------------------------------------------------- gradchecks */

static void test_gradchecks(void) {
    gp_gradcheck_opts o = gp_gradcheck_defaults();
    if (quick()) o.samples = 12;
    struct {
        int in_ch, out_ch, k, s, p;
        bool bias;
        gp_shape in;
    } convs[] = {
        {2, 3, 3, 1, 1, true, gp_shape4(2, 2, 5, 5)},  /* "same" 3x3 */
        {2, 4, 3, 2, 0, false, gp_shape4(2, 2, 7, 6)}, /* stride 2, no pad, non-square */
        {2, 3, 3, 2, 1, true, gp_shape4(2, 2, 6, 5)},  /* stride 2, pad 1 */
        {3, 2, 1, 1, 0, true, gp_shape4(2, 3, 4, 4)},  /* 1x1: the direct GEMM path */
        {2, 2, 1, 2, 0, false, gp_shape4(2, 2, 5, 5)}, /* 1x1 strided: im2col path */
        {2, 3, 5, 1, 2, true, gp_shape4(1, 2, 6, 6)},  /* 5x5 same */
        {2, 2, 5, 2, 1, false, gp_shape4(2, 2, 7, 8)}, /* 5x5, stride 2, pad 1 */
        {1, 2, 3, 1, 1, false, gp_shape4(3, 1, 4, 4)}, /* C1's first layer */
        {32, 32, 3, 1, 1, false, gp_shape4(11, 32, 10, 10)}, /* Winograd: forward, dx, dw */
    };
    { /* (the last case reaches every part of Winograd where the CPU has AVX2 and FMA) */
        const gp_conv_geom g = {.channels = 32, .height = 10, .width = 10, .kernel = 3,
                                .stride = 1, .pad = 1, .out_h = 10, .out_w = 10};
        if (gp_conv_direct_applies(&g, 32)) {
            CHECK(gp_conv_winograd_applies(&g, 32));
            CHECK(gp_conv_winograd_dw_applies(&g, 11, 32));
        }
    }
    for (size_t i = 0; i < sizeof convs / sizeof convs[0]; i++) {
        gp_layer *l = gp_conv2d(convs[i].in_ch, convs[i].out_ch, convs[i].k, convs[i].s, convs[i].p,
                                convs[i].bias);
        REQUIRE_OK(l ? GP_OK : GP_INTERNAL);
        int bad = gp_gradcheck(l, convs[i].in, GP_F32, 10 + i, &o);
        if (bad) fprintf(stderr, "conv2d case %zu: %d mismatches\n", i, bad);
        gp_layer_free(l);
    }

    gp_layer *bn = gp_batchnorm2d(3);
    gp_gradcheck_opts ob = o;
    ob.eps = 1e-3;
    CHECK_EQ_INT(gp_gradcheck(bn, gp_shape4(4, 3, 3, 2), GP_F32, 21, &ob), 0); /* batch stats */
    ob.training = false;
    CHECK_EQ_INT(gp_gradcheck(bn, gp_shape4(2, 3, 2, 2), GP_F32, 22, &ob), 0); /* running stats */
    gp_layer_free(bn);

    /* small eps: a step must not change which element of a window is the max */
    gp_gradcheck_opts om = o;
    om.eps = 1e-3;
    gp_layer *mp = gp_maxpool2d(2, 2);
    CHECK_EQ_INT(gp_gradcheck(mp, gp_shape4(2, 3, 6, 5), GP_F32, 31, &om), 0);
    gp_layer_free(mp);
    mp = gp_maxpool2d(3, 2); /* overlapping windows */
    CHECK_EQ_INT(gp_gradcheck(mp, gp_shape4(2, 2, 7, 7), GP_F32, 32, &om), 0);
    gp_layer_free(mp);

    /* Residual blocks: identity shortcut, projection for a stride, projection for channels.
     * With running statistics every case; with batch statistics the identity case only: a
     * finite difference through two ReLUs and batch-statistics normalization in float32 crosses
     * a kink in some channel for the projection cases at every step size tried (1e-2 .. 5e-4),
     * so those are checked against PyTorch's BasicBlock instead (test_reference). */
    struct {
        int in_ch, out_ch, stride;
        gp_shape in;
    } rb[] = {{3, 3, 1, gp_shape4(4, 3, 5, 5)},
              {2, 4, 2, gp_shape4(4, 2, 6, 5)},
              {3, 4, 1, gp_shape4(3, 3, 4, 4)}};
    for (size_t i = 0; i < sizeof rb / sizeof rb[0]; i++) {
        gp_layer *l = gp_residual_block(rb[i].in_ch, rb[i].out_ch, rb[i].stride);
        REQUIRE_OK(l ? GP_OK : GP_INTERNAL);
        CHECK_EQ_INT(l->nparams, rb[i].stride != 1 || rb[i].in_ch != rb[i].out_ch ? 15 : 10);
        gp_gradcheck_opts orb = o;
        orb.eps = 1e-3;
        int bad = 0;
        if (i == 0) bad += gp_gradcheck(l, rb[i].in, GP_F32, 61 + i, &orb);
        orb.training = false;
        bad += gp_gradcheck(l, rb[i].in, GP_F32, 71 + i, &orb);
        if (bad) fprintf(stderr, "residual_block case %zu: %d mismatches\n", i, bad);
        CHECK_EQ_INT(bad, 0);
        gp_layer_free(l);
    }

    gp_layer *gap = gp_global_avgpool();
    CHECK_EQ_INT(gp_gradcheck(gap, gp_shape4(2, 3, 4, 5), GP_F32, 41, &o), 0);
    gp_layer_free(gap);
    gp_layer *fl = gp_flatten();
    CHECK_EQ_INT(gp_gradcheck(fl, gp_shape4(2, 3, 2, 2), GP_F32, 51, &o), 0);
    CHECK_EQ_INT(gp_gradcheck(fl, gp_shape3(3, 4, 5), GP_F32, 52, &o), 0);
    gp_layer_free(fl);
}

/* ------------------------------------------------ conv against a naive loop */

typedef struct conv_case {
    int in_ch, out_ch, k, s, p;
    bool bias;
    int64_t b, h, w;
} conv_case;

/* Direct convolution, its input gradient and its weight gradient, in double. */
static void naive_conv(const conv_case *c, const float *x, const float *w, const float *bias,
                       const float *dy, double *y, double *dx, double *dw, double *db) {
    int64_t oh_n = (c->h + 2 * c->p - c->k) / c->s + 1, ow_n = (c->w + 2 * c->p - c->k) / c->s + 1;
    memset(dx, 0, sizeof(double) * (size_t)(c->b * c->in_ch * c->h * c->w));
    memset(dw, 0, sizeof(double) * (size_t)(c->out_ch * c->in_ch * c->k * c->k));
    memset(db, 0, sizeof(double) * (size_t)c->out_ch);
    for (int64_t b = 0; b < c->b; b++)
        for (int64_t o = 0; o < c->out_ch; o++)
            for (int64_t oh = 0; oh < oh_n; oh++)
                for (int64_t ow = 0; ow < ow_n; ow++) {
                    int64_t yi = ((b * c->out_ch + o) * oh_n + oh) * ow_n + ow;
                    double acc = bias ? bias[o] : 0.0;
                    db[o] += dy[yi];
                    for (int64_t ci = 0; ci < c->in_ch; ci++)
                        for (int64_t ki = 0; ki < c->k; ki++)
                            for (int64_t kj = 0; kj < c->k; kj++) {
                                int64_t ih = oh * c->s - c->p + ki, iw = ow * c->s - c->p + kj;
                                if (ih < 0 || ih >= c->h || iw < 0 || iw >= c->w) continue;
                                int64_t xi = ((b * c->in_ch + ci) * c->h + ih) * c->w + iw;
                                int64_t wi = ((o * c->in_ch + ci) * c->k + ki) * c->k + kj;
                                acc += (double)x[xi] * w[wi];
                                dx[xi] += (double)dy[yi] * w[wi];
                                dw[wi] += (double)dy[yi] * x[xi];
                            }
                    y[yi] = acc;
                }
}

/* max |a - b| relative to max(1, max |b|): float sums of many products */
static double max_rel_diff(const float *a, const double *b, int64_t n) {
    double m = 0, scale = 1;
    for (int64_t i = 0; i < n; i++) {
        m = fmax(m, fabs((double)a[i] - b[i]));
        scale = fmax(scale, fabs(b[i]));
    }
    return m / scale;
}

static void test_conv_vs_naive(void) {
    const conv_case cases[] = {
        {3, 4, 3, 1, 1, true, 2, 7, 6},    {2, 5, 3, 2, 1, false, 3, 9, 8},
        {4, 3, 1, 1, 0, true, 2, 5, 5},    {2, 3, 5, 2, 2, true, 2, 9, 7},
        {3, 2, 2, 3, 0, true, 1, 8, 9},    {2, 2, 3, 1, 3, false, 1, 2, 3}, /* pad > image */
        {64, 2, 5, 1, 2, true, 1, 3, 660}, /* 1600 x 660 columns per row: one row per band */
    };
    gp_device *dev;
    REQUIRE_OK(gp_device_cpu_new("naive", &dev));
    gp_run run = {.training = true};
    for (size_t ci = 0; ci < sizeof cases / sizeof cases[0]; ci++) {
        const conv_case *c = &cases[ci];
        gp_layer *l = gp_conv2d(c->in_ch, c->out_ch, c->k, c->s, c->p, c->bias);
        REQUIRE_OK(l ? GP_OK : GP_INTERNAL);
        alloc_params(l, dev, 300 + ci);
        gp_shape in = gp_shape4(c->b, c->in_ch, c->h, c->w), os;
        REQUIRE_OK(l->ops->out_shape(l, &in, GP_F32, &os));
        gp_tensor x, y, dy, dx;
        REQUIRE_OK(gp_tensor_alloc(dev, GP_MEM_ACTIVATIONS, in, GP_F32, &x));
        REQUIRE_OK(gp_tensor_alloc(dev, GP_MEM_ACTIVATIONS, in, GP_F32, &dx));
        REQUIRE_OK(gp_tensor_alloc(dev, GP_MEM_ACTIVATIONS, os, GP_F32, &y));
        REQUIRE_OK(gp_tensor_alloc(dev, GP_MEM_ACTIVATIONS, os, GP_F32, &dy));
        gp_test_fill(x.data, gp_tensor_nelem(&x), ci, 1, 0.0f, 1.0f);
        gp_test_fill(dy.data, gp_tensor_nelem(&dy), ci, 2, 0.0f, 1.0f);
        for (int64_t i = 0; i < gp_tensor_nelem(&dx); i++) F32(dx)[i] = NAN; /* must be written */
        gp_ctx ctx;
        gp_ctx_init(&ctx, dev, &run);
        ctx.x = &x;
        ctx.y = &y;
        CHECK_OK(l->ops->forward(l, &ctx, &x, &y));
        CHECK_OK(l->ops->backward(l, &ctx, &dy, &dx));

        int64_t ny = gp_tensor_nelem(&y), nx = gp_tensor_nelem(&x);
        int64_t nw = gp_tensor_nelem(&l->params[0].value);
        double *ry = malloc(sizeof(double) * (size_t)(ny + nx + nw + c->out_ch));
        double *rdx = ry + ny, *rdw = rdx + nx, *rdb = rdw + nw;
        naive_conv(c, x.data, l->params[0].value.data, c->bias ? l->params[1].value.data : NULL,
                   dy.data, ry, rdx, rdw, rdb);
        double ey = max_rel_diff(y.data, ry, ny), edx = max_rel_diff(dx.data, rdx, nx);
        double edw = max_rel_diff(l->params[0].grad.data, rdw, nw);
        if (!(ey < 4e-6 && edx < 4e-6 && edw < 4e-6))
            fprintf(stderr, "conv case %zu: max relative error y %g dx %g dw %g\n", ci, ey, edx,
                    edw);
        CHECK(ey < 4e-6);
        CHECK(edx < 4e-6);
        CHECK(edw < 4e-6);
        if (c->bias) CHECK(max_rel_diff(l->params[1].grad.data, rdb, c->out_ch) < 4e-6);
        free(ry);
        gp_ctx_release(&ctx);
        gp_tensor_release(&x);
        gp_tensor_release(&dx);
        gp_tensor_release(&y);
        gp_tensor_release(&dy);
        free_params(l);
        gp_layer_free(l);
    }
    gp_mem_stats st;
    gp_device_mem_stats(dev, &st);
    CHECK_EQ_INT(st.live_total, 0);
    CHECK(st.peak[GP_MEM_WORKSPACE] > 0); /* im2col went through the allocator */
    gp_device_free(dev);
}

/* A 3x3 image 1..9, kernel [[1, 0], [0, -1]], stride 2, pad 1, bias 0.5, by hand:
 * y[oh][ow] = x[2oh-1][2ow-1] - x[2oh][2ow] + 0.5 with zeros outside. */
static void test_conv_by_hand(void) {
    gp_device *dev;
    REQUIRE_OK(gp_device_cpu_new("hand", &dev));
    gp_layer *l = gp_conv2d(1, 1, 2, 2, 1, true);
    alloc_params(l, dev, 1);
    const float w[4] = {1, 0, 0, -1};
    memcpy(l->params[0].value.data, w, sizeof w);
    F32(l->params[1].value)[0] = 0.5f;
    float xs[9] = {1, 2, 3, 4, 5, 6, 7, 8, 9}, ys[4];
    gp_tensor x = gp_tensor_view(xs, gp_shape4(1, 1, 3, 3), GP_F32);
    gp_tensor y = gp_tensor_view(ys, gp_shape4(1, 1, 2, 2), GP_F32);
    gp_run run = {.training = true};
    gp_ctx ctx;
    gp_ctx_init(&ctx, dev, &run);
    ctx.x = &x;
    ctx.y = &y;
    CHECK_OK(l->ops->forward(l, &ctx, &x, &y));
    const float want[4] = {-0.5f, -2.5f, -6.5f, -3.5f};
    for (int i = 0; i < 4; i++) CHECK_NEAR(ys[i], want[i], 0);
    /* dy = 1: dw[ki][kj] = the sum of the taps it saw over the four outputs */
    float dys[4] = {1, 1, 1, 1}, dxs[9];
    gp_tensor dy = gp_tensor_view(dys, y.shape, GP_F32), dx = gp_tensor_view(dxs, x.shape, GP_F32);
    CHECK_OK(l->ops->backward(l, &ctx, &dy, &dx));
    CHECK_NEAR(F32(l->params[0].grad)[0], 5, 0);  /* x[-1][-1], x[-1][1], x[1][-1], x[1][1]=5 */
    CHECK_NEAR(F32(l->params[0].grad)[1], 10, 0); /* x[-1][0], x[-1][2], x[1][0]=4, x[1][2]=6 */
    CHECK_NEAR(F32(l->params[0].grad)[2], 10, 0); /* x[0][-1], x[0][1]=2, x[2][-1], x[2][1]=8 */
    CHECK_NEAR(F32(l->params[0].grad)[3], 20, 0); /* 1 + 3 + 7 + 9 */
    CHECK_NEAR(F32(l->params[1].grad)[0], 4, 0);
    const float wantdx[9] = {-1, 0, -1, 0, 1, 0, -1, 0, -1};
    for (int i = 0; i < 9; i++) CHECK_NEAR(dxs[i], wantdx[i], 0);
    gp_ctx_release(&ctx);
    free_params(l);
    gp_layer_free(l);
    gp_device_free(dev);
}

/* dx == NULL (first layer): same parameter gradients, nothing written. */
static void test_null_dx(void) {
    gp_device *dev;
    REQUIRE_OK(gp_device_cpu_new("nulldx", &dev));
    gp_run run = {.training = true};
    gp_layer *layers[] = {gp_conv2d(2, 3, 3, 1, 1, true),
                          gp_conv2d(2, 3, 1, 1, 0, false),
                          gp_batchnorm2d(2),
                          gp_maxpool2d(2, 2),
                          gp_global_avgpool(),
                          gp_flatten()};
    gp_shape in = gp_shape4(2, 2, 4, 4);
    for (size_t li = 0; li < sizeof layers / sizeof layers[0]; li++) {
        gp_layer *l = layers[li];
        alloc_params(l, dev, 7);
        gp_shape os;
        REQUIRE_OK(l->ops->out_shape(l, &in, GP_F32, &os));
        gp_tensor x, y, dy, dx;
        REQUIRE_OK(gp_tensor_alloc(dev, GP_MEM_ACTIVATIONS, in, GP_F32, &x));
        REQUIRE_OK(gp_tensor_alloc(dev, GP_MEM_ACTIVATIONS, in, GP_F32, &dx));
        REQUIRE_OK(gp_tensor_alloc(dev, GP_MEM_ACTIVATIONS, os, GP_F32, &y));
        REQUIRE_OK(gp_tensor_alloc(dev, GP_MEM_ACTIVATIONS, os, GP_F32, &dy));
        gp_test_fill(x.data, gp_tensor_nelem(&x), 3, 1, 0.1f, 1.0f);
        gp_test_fill(dy.data, gp_tensor_nelem(&dy), 3, 2, 0.1f, 1.0f);
        float *g1[GP_LAYER_MAX_PARAMS] = {0};
        for (int pass = 0; pass < 2; pass++) {
            gp_ctx ctx;
            gp_ctx_init(&ctx, dev, &run);
            ctx.x = &x;
            ctx.y = &y;
            CHECK_OK(l->ops->forward(l, &ctx, &x, &y));
            CHECK_OK(l->ops->backward(l, &ctx, &dy, pass == 0 ? &dx : NULL));
            gp_ctx_release(&ctx);
            for (int i = 0; i < l->nparams; i++) {
                gp_param *p = &l->params[i];
                if (!p->trainable) continue;
                size_t nb = gp_tensor_nbytes(&p->grad);
                if (pass == 0) {
                    g1[i] = malloc(nb);
                    memcpy(g1[i], p->grad.data, nb);
                    memset(p->grad.data, 0, nb);
                } else {
                    CHECK(memcmp(g1[i], p->grad.data, nb) == 0); /* bitwise equal */
                    free(g1[i]);
                }
            }
        }
        gp_tensor_release(&x);
        gp_tensor_release(&dx);
        gp_tensor_release(&y);
        gp_tensor_release(&dy);
        free_params(l);
        gp_layer_free(l);
    }
    gp_mem_stats st;
    gp_device_mem_stats(dev, &st);
    CHECK_EQ_INT(st.live_total, 0);
    gp_device_free(dev);
}

/* ------------------------------------------------------------ batch norm */

static void bn_run(gp_layer *l, gp_device *dev, const gp_run *run, float *xs, float *ys,
                   gp_shape s) {
    gp_tensor x = gp_tensor_view(xs, s, GP_F32), y = gp_tensor_view(ys, s, GP_F32);
    gp_ctx ctx;
    gp_ctx_init(&ctx, dev, run);
    ctx.x = &x;
    ctx.y = &y;
    CHECK_OK(l->ops->forward(l, &ctx, &x, &y));
    gp_ctx_release(&ctx);
}

static void test_batchnorm_stats(void) {
    gp_device *dev;
    REQUIRE_OK(gp_device_cpu_new("bn", &dev));
    gp_layer *l = gp_batchnorm2d(2);
    alloc_params(l, dev, 1);
    float *g = param(l, "weight")->value.data, *b = param(l, "bias")->value.data;
    float *rm = param(l, "running_mean")->value.data, *rv = param(l, "running_var")->value.data;
    CHECK(param(l, "running_mean") && !param(l, "running_mean")->trainable);
    g[0] = 1, g[1] = 2, b[0] = 0, b[1] = -1;
    CHECK(rm[0] == 0 && rm[1] == 0 && rv[0] == 1 && rv[1] == 1);
    /* (B=2, C=2, H=1, W=2): channel 0 holds 1, 2, 3, 4; channel 1 holds -2, -2, 2, 2 */
    gp_shape s = gp_shape4(2, 2, 1, 2);
    float xs[8] = {1, 2, -2, -2, 3, 4, 2, 2}, ys[8];
    gp_run train = {.training = true}, recompute = {.training = true, .recompute = true},
           eval = {.training = false};

    bn_run(l, dev, &train, xs, ys, s);
    /* channel 0: mean 2.5, biased var 1.25, unbiased 5/3; channel 1: mean 0, var 4, 16/3 */
    double is0 = 1 / sqrt(1.25 + 1e-5), is1 = 1 / sqrt(4 + 1e-5);
    CHECK_NEAR(ys[0], (1 - 2.5) * is0, 1e-6);
    CHECK_NEAR(ys[5], (4 - 2.5) * is0, 1e-6);
    CHECK_NEAR(ys[2], 2 * (-2 * is1) - 1, 1e-6);
    CHECK_NEAR(ys[7], 2 * (2 * is1) - 1, 1e-6);
    CHECK_NEAR(rm[0], 0.25, 1e-7);
    CHECK_NEAR(rv[0], 0.9 + 0.1 * 5.0 / 3.0, 1e-7);
    CHECK_NEAR(rm[1], 0.0, 1e-7);
    CHECK_NEAR(rv[1], 0.9 + 0.1 * 16.0 / 3.0, 1e-7);

    /* a recomputation and an eval forward leave the running statistics alone */
    float keep[4] = {rm[0], rm[1], rv[0], rv[1]}, ys2[8];
    bn_run(l, dev, &recompute, xs, ys2, s);
    CHECK(memcmp(ys, ys2, sizeof ys) == 0); /* same normalization as the first forward */
    bn_run(l, dev, &eval, xs, ys2, s);
    CHECK(rm[0] == keep[0] && rm[1] == keep[1] && rv[0] == keep[2] && rv[1] == keep[3]);

    /* eval uses the running statistics */
    for (int i = 0; i < 8; i++) {
        int c = (i / 2) % 2;
        double want = (xs[i] - keep[c]) / sqrt(keep[2 + c] + 1e-5) * g[c] + b[c];
        CHECK_NEAR(ys2[i], want, 1e-6);
    }

    /* a second training forward updates once more: 0.9 * old + 0.1 * batch */
    bn_run(l, dev, &train, xs, ys, s);
    CHECK_NEAR(rm[0], 0.9 * 0.25 + 0.25, 1e-7);
    CHECK_NEAR(rv[0], 0.9 * (0.9 + 0.5 / 3.0) + 0.5 / 3.0, 1e-6);
    CHECK_NEAR(rv[1], 0.9 * (0.9 + 1.6 / 3.0) + 1.6 / 3.0, 1e-6);

    /* one value per channel cannot be normalized by batch statistics */
    float one[2] = {1, 2}, out1[2];
    gp_tensor x1 = gp_tensor_view(one, gp_shape4(1, 2, 1, 1), GP_F32);
    gp_tensor y1 = gp_tensor_view(out1, x1.shape, GP_F32);
    gp_ctx ctx;
    gp_ctx_init(&ctx, dev, &train);
    ctx.x = &x1;
    ctx.y = &y1;
    CHECK_FAILS(l->ops->forward(l, &ctx, &x1, &y1), GP_SHAPE, "more than 1 value per channel");
    gp_ctx_release(&ctx);
    gp_ctx_init(&ctx, dev, &eval);
    CHECK_OK(l->ops->forward(l, &ctx, &x1, &y1)); /* eval mode is fine */
    gp_ctx_release(&ctx);

    free_params(l);
    gp_layer_free(l);
    gp_device_free(dev);
}

/* --------------------------------------------------------------- pooling */

static void test_pool_values(void) {
    gp_device *dev;
    REQUIRE_OK(gp_device_cpu_new("pool", &dev));
    gp_run run = {.training = true};
    gp_layer *mp = gp_maxpool2d(2, 2);
    /* (1, 1, 2, 4): a tie in the first window (the first one wins), distinct in the second */
    float xs[8] = {3, 1, 0, 5, 3, 3, 7, -1}, ys[2], dys[2] = {10, 20}, dxs[8];
    gp_tensor x = gp_tensor_view(xs, gp_shape4(1, 1, 2, 4), GP_F32);
    gp_tensor y = gp_tensor_view(ys, gp_shape4(1, 1, 1, 2), GP_F32);
    gp_tensor dy = gp_tensor_view(dys, y.shape, GP_F32), dx = gp_tensor_view(dxs, x.shape, GP_F32);
    gp_ctx ctx;
    gp_ctx_init(&ctx, dev, &run);
    ctx.x = &x;
    ctx.y = &y;
    CHECK_OK(mp->ops->forward(mp, &ctx, &x, &y));
    CHECK_NEAR(ys[0], 3, 0);
    CHECK_NEAR(ys[1], 7, 0);
    CHECK_EQ_INT(ctx.saved[0].dtype, GP_I32);
    CHECK_OK(mp->ops->backward(mp, &ctx, &dy, &dx));
    const float want[8] = {10, 0, 0, 0, 0, 0, 20, 0};
    for (int i = 0; i < 8; i++) CHECK_NEAR(dxs[i], want[i], 0);
    gp_ctx_release(&ctx);
    gp_layer_free(mp);

    gp_layer *gap = gp_global_avgpool();
    float gx[8] = {1, 2, 3, 4, -1, -1, -1, 5}, gy[2], gdy[2] = {4, 8}, gdx[8];
    x = gp_tensor_view(gx, gp_shape4(1, 2, 2, 2), GP_F32);
    y = gp_tensor_view(gy, gp_shape2(1, 2), GP_F32);
    dy = gp_tensor_view(gdy, y.shape, GP_F32);
    dx = gp_tensor_view(gdx, x.shape, GP_F32);
    gp_ctx_init(&ctx, dev, &run);
    ctx.x = &x;
    ctx.y = &y;
    CHECK_OK(gap->ops->forward(gap, &ctx, &x, &y));
    CHECK_NEAR(gy[0], 2.5, 0);
    CHECK_NEAR(gy[1], 0.5, 0);
    CHECK_OK(gap->ops->backward(gap, &ctx, &dy, &dx));
    CHECK_NEAR(gdx[0], 1, 0);
    CHECK_NEAR(gdx[7], 2, 0);
    gp_ctx_release(&ctx);
    gp_layer_free(gap);
    gp_device_free(dev);
}

/* --------------------------------------------------- parameters and cost */

static void test_params_and_cost(void) {
    gp_layer *c = gp_conv2d(3, 8, 3, 1, 1, true);
    CHECK_EQ_INT(c->nparams, 2);
    CHECK(!strcmp(c->params[0].name, "weight") && c->params[0].decay);
    CHECK(c->params[0].init == GP_INIT_NORMAL);
    CHECK_NEAR(c->params[0].init_scale, sqrt(2.0 / 27.0), 1e-7);
    CHECK(!strcmp(c->params[1].name, "bias") && !c->params[1].decay);
    CHECK(c->params[1].init == GP_INIT_ZEROS);
    gp_shape in = gp_shape4(4, 3, 10, 10), out;
    CHECK_OK(c->ops->out_shape(c, &in, GP_F32, &out));
    CHECK(gp_shape_equal(&out, &(gp_shape){4, {4, 8, 10, 10}}));
    gp_cost k = c->ops->cost(c, &in);
    double macs = 4.0 * 8 * 100 * 27;
    CHECK_NEAR(k.fwd_flops, 2 * macs + 4 * 8 * 100, 0);
    CHECK_NEAR(k.bwd_flops, 4 * macs + 4 * 8 * 100, 0);
    CHECK_EQ_INT(k.param_bytes, (8 * 27 + 8) * 4);
    CHECK_EQ_INT(k.out_bytes, 4 * 8 * 100 * 4);
    gp_layer_free(c);

    gp_layer *s2 = gp_conv2d(2, 2, 3, 2, 0, false);
    CHECK_EQ_INT(s2->nparams, 1);
    in = gp_shape4(1, 2, 8, 7);
    CHECK_OK(s2->ops->out_shape(s2, &in, GP_F32, &out));
    CHECK(gp_shape_equal(&out, &(gp_shape){4, {1, 2, 3, 3}})); /* floor((8-3)/2)+1, (7-3)/2+1 */
    gp_layer_free(s2);

    gp_layer *bn = gp_batchnorm2d(5);
    CHECK_EQ_INT(bn->nparams, 4);
    for (int i = 0; i < 4; i++) CHECK(!bn->params[i].decay);
    CHECK(bn->params[0].init == GP_INIT_ONES && bn->params[1].init == GP_INIT_ZEROS);
    CHECK(bn->params[3].init == GP_INIT_ONES && !bn->params[3].trainable);
    CHECK(!strcmp(bn->params[2].name, "running_mean") &&
          !strcmp(bn->params[3].name, "running_var"));
    in = gp_shape4(2, 5, 3, 3);
    CHECK_EQ_INT(bn->ops->cost(bn, &in).param_bytes, 4 * 5 * 4);
    gp_layer_free(bn);

    gp_layer *mp = gp_maxpool2d(2, 2);
    in = gp_shape4(2, 3, 7, 9);
    CHECK_OK(mp->ops->out_shape(mp, &in, GP_F32, &out));
    CHECK(gp_shape_equal(&out, &(gp_shape){4, {2, 3, 3, 4}}));
    CHECK_EQ_INT(mp->ops->cost(mp, &in).saved_bytes, 2 * 3 * 3 * 4 * 4);
    gp_layer_free(mp);

    gp_layer *fl = gp_flatten();
    in = gp_shape4(6, 64, 7, 7);
    CHECK_OK(fl->ops->out_shape(fl, &in, GP_F32, &out));
    CHECK(gp_shape_equal(&out, &(gp_shape){2, {6, 3136}}));
    gp_layer_free(fl);
}

/* ------------------------------------------------------------- errors */

static void test_errors(void) {
    CHECK(gp_conv2d(0, 4, 3, 1, 1, true) == NULL);
    CHECK_FAILS(GP_INVALID_ARGUMENT, GP_INVALID_ARGUMENT, "in_ch must be >= 1, got 0");
    CHECK(gp_conv2d(2, -1, 3, 1, 1, true) == NULL);
    CHECK_FAILS(GP_INVALID_ARGUMENT, GP_INVALID_ARGUMENT, "out_ch must be >= 1, got -1");
    CHECK(gp_conv2d(2, 4, 0, 1, 1, true) == NULL);
    CHECK_FAILS(GP_INVALID_ARGUMENT, GP_INVALID_ARGUMENT, "kernel must be >= 1");
    CHECK(gp_conv2d(2, 4, 3, 0, 1, true) == NULL);
    CHECK_FAILS(GP_INVALID_ARGUMENT, GP_INVALID_ARGUMENT, "stride must be >= 1, got 0");
    CHECK(gp_conv2d(2, 4, 3, 1, -1, true) == NULL);
    CHECK_FAILS(GP_INVALID_ARGUMENT, GP_INVALID_ARGUMENT, "pad must be >= 0, got -1");
    CHECK(gp_batchnorm2d(0) == NULL);
    CHECK_FAILS(GP_INVALID_ARGUMENT, GP_INVALID_ARGUMENT, "channels must be >= 1");
    CHECK(gp_maxpool2d(0, 2) == NULL);
    CHECK_FAILS(GP_INVALID_ARGUMENT, GP_INVALID_ARGUMENT, "kernel must be >= 1, got 0");
    CHECK(gp_maxpool2d(2, -3) == NULL);
    CHECK_FAILS(GP_INVALID_ARGUMENT, GP_INVALID_ARGUMENT, "stride must be >= 1, got -3");

    gp_shape out, in;
    gp_layer *c = gp_conv2d(3, 4, 5, 1, 1, true);
    c->index = 2;
    in = gp_shape4(2, 4, 8, 8);
    CHECK_FAILS(c->ops->out_shape(c, &in, GP_F32, &out), GP_SHAPE,
                "input channels C = 3 at axis 1");
    CHECK_FAILS(c->ops->out_shape(c, &in, GP_F32, &out), GP_SHAPE, "layer 2 (conv2d)");
    in = gp_shape4(2, 3, 2, 8);
    CHECK_FAILS(c->ops->out_shape(c, &in, GP_F32, &out), GP_SHAPE,
                "kernel 5 is larger than the padded input 4x10");
    in = gp_shape3(2, 3, 8);
    CHECK_FAILS(c->ops->out_shape(c, &in, GP_F32, &out), GP_SHAPE, "expected 4 (B, C, H, W)");
    in = gp_shape4(2, 3, 8, 8);
    CHECK_FAILS(c->ops->out_shape(c, &in, GP_I32, &out), GP_SHAPE, "int32, expected float32");
    CHECK_OK(c->ops->out_shape(c, &in, GP_F32, &out));
    /* forward before the parameters exist, and into a wrong-shaped output */
    gp_device *dev;
    REQUIRE_OK(gp_device_cpu_new("err", &dev));
    gp_run run = {.training = true};
    float buf[2 * 3 * 8 * 8] = {0}, ybuf[2 * 4 * 6 * 6];
    gp_tensor x = gp_tensor_view(buf, in, GP_F32), y = gp_tensor_view(ybuf, out, GP_F32);
    gp_ctx ctx;
    gp_ctx_init(&ctx, dev, &run);
    CHECK_FAILS(c->ops->forward(c, &ctx, &x, &y), GP_INVALID_ARGUMENT, "weight is not allocated");
    alloc_params(c, dev, 1);
    gp_tensor ybad = gp_tensor_view(ybuf, gp_shape4(2, 4, 6, 5), GP_F32);
    CHECK_FAILS(c->ops->forward(c, &ctx, &x, &ybad), GP_SHAPE, "expected (2, 4, 6, 6)");
    gp_ctx_release(&ctx);
    free_params(c);
    gp_layer_free(c);
    gp_device_free(dev);

    gp_layer *bn = gp_batchnorm2d(3);
    in = gp_shape4(2, 4, 8, 8);
    CHECK_FAILS(bn->ops->out_shape(bn, &in, GP_F32, &out), GP_SHAPE, "channels C = 3");
    gp_layer_free(bn);
    gp_layer *mp = gp_maxpool2d(3, 1);
    in = gp_shape4(1, 1, 2, 5);
    CHECK_FAILS(mp->ops->out_shape(mp, &in, GP_F32, &out), GP_SHAPE,
                "kernel 3 is larger than the input 2x5");
    gp_layer_free(mp);
    gp_layer *gap = gp_global_avgpool();
    in = gp_shape2(2, 4);
    CHECK_FAILS(gap->ops->out_shape(gap, &in, GP_F32, &out), GP_SHAPE, "expected 4 (B, C, H, W)");
    gp_layer_free(gap);
    gp_layer *fl = gp_flatten();
    in = gp_shape1(5);
    CHECK_FAILS(fl->ops->out_shape(fl, &in, GP_F32, &out), GP_SHAPE, "expected at least 2");
    gp_layer_free(fl);
}

/* Same inputs, same bits: forward and backward twice. */
static void test_determinism(void) {
    gp_device *dev;
    REQUIRE_OK(gp_device_cpu_new("det", &dev));
    gp_run run = {.training = true};
    gp_layer *l = gp_conv2d(8, 16, 3, 1, 1, true);
    alloc_params(l, dev, 5);
    gp_shape in = gp_shape4(4, 8, 12, 12), os;
    REQUIRE_OK(l->ops->out_shape(l, &in, GP_F32, &os));
    gp_tensor x, y[2], dy, dx[2];
    REQUIRE_OK(gp_tensor_alloc(dev, GP_MEM_ACTIVATIONS, in, GP_F32, &x));
    REQUIRE_OK(gp_tensor_alloc(dev, GP_MEM_ACTIVATIONS, os, GP_F32, &dy));
    gp_test_fill(x.data, gp_tensor_nelem(&x), 9, 1, 0.0f, 1.0f);
    gp_test_fill(dy.data, gp_tensor_nelem(&dy), 9, 2, 0.0f, 1.0f);
    float *gw[2];
    for (int r = 0; r < 2; r++) {
        REQUIRE_OK(gp_tensor_alloc(dev, GP_MEM_ACTIVATIONS, os, GP_F32, &y[r]));
        REQUIRE_OK(gp_tensor_alloc(dev, GP_MEM_ACTIVATIONS, in, GP_F32, &dx[r]));
        memset(l->params[0].grad.data, 0, gp_tensor_nbytes(&l->params[0].grad));
        gp_ctx ctx;
        gp_ctx_init(&ctx, dev, &run);
        ctx.x = &x;
        ctx.y = &y[r];
        CHECK_OK(l->ops->forward(l, &ctx, &x, &y[r]));
        CHECK_OK(l->ops->backward(l, &ctx, &dy, &dx[r]));
        gp_ctx_release(&ctx);
        gw[r] = malloc(gp_tensor_nbytes(&l->params[0].grad));
        memcpy(gw[r], l->params[0].grad.data, gp_tensor_nbytes(&l->params[0].grad));
    }
    CHECK(memcmp(y[0].data, y[1].data, gp_tensor_nbytes(&y[0])) == 0);
    CHECK(memcmp(dx[0].data, dx[1].data, gp_tensor_nbytes(&dx[0])) == 0);
    CHECK(memcmp(gw[0], gw[1], gp_tensor_nbytes(&l->params[0].grad)) == 0);
    for (int r = 0; r < 2; r++) {
        free(gw[r]);
        gp_tensor_release(&y[r]);
        gp_tensor_release(&dx[r]);
    }
    gp_tensor_release(&x);
    gp_tensor_release(&dy);
    free_params(l);
    gp_layer_free(l);
    gp_device_free(dev);
}

/* -------------------------------------------- transformed weights kept per generation */

/* One training forward and backward (with the input gradient) of l: y and dx copied out. */
static void forward_backward(gp_layer *l, gp_device *dev, const gp_tensor *x, const gp_tensor *dy,
                             gp_shape os, float *y_out, float *dx_out) {
    gp_run run = {.training = true};
    gp_tensor y, dx;
    REQUIRE_OK(gp_tensor_alloc(dev, GP_MEM_ACTIVATIONS, os, GP_F32, &y));
    REQUIRE_OK(gp_tensor_alloc(dev, GP_MEM_ACTIVATIONS, x->shape, GP_F32, &dx));
    gp_ctx ctx;
    gp_ctx_init(&ctx, dev, &run);
    ctx.x = x;
    ctx.y = &y;
    CHECK_OK(l->ops->forward(l, &ctx, x, &y));
    CHECK_OK(l->ops->backward(l, &ctx, dy, &dx));
    gp_ctx_release(&ctx);
    memcpy(y_out, y.data, gp_tensor_nbytes(&y));
    memcpy(dx_out, dx.data, gp_tensor_nbytes(&dx));
    gp_tensor_release(&y);
    gp_tensor_release(&dx);
}

static void set_generation(gp_layer *l, uint64_t gen) {
    for (int i = 0; i < l->nparams; i++) l->params[i].gen = gen;
}

static uint64_t workspace_live(gp_device *dev) {
    gp_mem_stats st;
    gp_device_mem_stats(dev, &st);
    return st.live[GP_MEM_WORKSPACE];
}

/* A convolution keeps the transform of its weights (the CPU's Winograd path, forward and input
 * gradient) only under one generation of them (gp_param.gen: set by a training run, ended by
 * the update, model/store.h). Under a generation the forward and the input gradient give the
 * bits of those made without one; after the weights change under a new generation, the bits of
 * the new weights made without one (a transform kept from the old weights gives others); the
 * transforms are held, counted as workspace (the bytes derived_bytes tells the memory model),
 * until drop_derived; without a generation none is kept. conv2d on its own and as the parts of a residual block, which see its parameters. */
static void test_weights_generations(void) {
    gp_device *dev;
    REQUIRE_OK(gp_device_cpu_new("generations", &dev));
    const gp_shape in = gp_shape4(2, 24, 12, 12);
    const gp_conv_geom g = {.channels = 24, .height = 12, .width = 12, .kernel = 3, .stride = 1,
                            .pad = 1, .out_h = 12, .out_w = 12};
    const bool winograd = gp_conv_winograd_applies(&g, 24); /* AVX2 and FMA */
    gp_layer *layers[] = {gp_conv2d(24, 24, 3, 1, 1, false), gp_residual_block(24, 24, 1)};
    for (size_t li = 0; li < sizeof layers / sizeof layers[0]; li++) {
        gp_layer *l = layers[li];
        alloc_params(l, dev, 11);
        gp_shape os;
        REQUIRE_OK(l->ops->out_shape(l, &in, GP_F32, &os));
        gp_tensor x, dy;
        REQUIRE_OK(gp_tensor_alloc(dev, GP_MEM_ACTIVATIONS, in, GP_F32, &x));
        REQUIRE_OK(gp_tensor_alloc(dev, GP_MEM_ACTIVATIONS, os, GP_F32, &dy));
        gp_test_fill(x.data, gp_tensor_nelem(&x), 13, 1, 0.0f, 1.0f);
        gp_test_fill(dy.data, gp_tensor_nelem(&dy), 13, 2, 0.0f, 1.0f);
        const size_t ny = gp_tensor_nbytes(&dy), nx = gp_tensor_nbytes(&x);
        float *ref_y = malloc(ny), *ref_dx = malloc(nx), *y = malloc(ny), *dx = malloc(nx);
        float *old_y = malloc(ny);
        forward_backward(l, dev, &x, &dy, os, ref_y, ref_dx); /* no generation */
        CHECK_EQ_INT(workspace_live(dev), 0);
        set_generation(l, 1001);
        for (int rep = 0; rep < 2; rep++) { /* making the transforms, then reading them */
            forward_backward(l, dev, &x, &dy, os, y, dx);
            CHECK(memcmp(y, ref_y, ny) == 0);
            CHECK(memcmp(dx, ref_dx, nx) == 0);
            /* what the memory model counts (none without Winograd's tiles) */
            CHECK_EQ_INT(workspace_live(dev), l->ops->derived_bytes(l, dev, &in, true));
            CHECK(winograd == (workspace_live(dev) > 0));
        }
        memcpy(old_y, y, ny);
        /* an update: new weights, a new generation */
        for (int i = 0; i < l->nparams; i++)
            if (l->params[i].shape.ndim == 4)
                gp_test_fill(l->params[i].value.data, gp_tensor_nelem(&l->params[i].value), 17,
                             (uint32_t)i, 0.1f, 1.0f);
        set_generation(l, 1002);
        forward_backward(l, dev, &x, &dy, os, y, dx);
        l->ops->drop_derived(l);
        set_generation(l, 0);
        CHECK_EQ_INT(workspace_live(dev), 0);
        forward_backward(l, dev, &x, &dy, os, ref_y, ref_dx);
        CHECK(memcmp(ref_y, old_y, ny) != 0); /* the weights did change */
        CHECK(memcmp(y, ref_y, ny) == 0);
        CHECK(memcmp(dx, ref_dx, nx) == 0);
        CHECK_EQ_INT(workspace_live(dev), 0);
        free(ref_y), free(ref_dx), free(y), free(dx), free(old_y);
        gp_tensor_release(&x);
        gp_tensor_release(&dy);
        free_params(l);
        gp_layer_free(l);
    }
    gp_device_free(dev);
}

/* The values of every parameter and buffer of m, copied out (restore: copied back in). */
static float **snapshot(gp_model *m, bool restore, float **saved) {
    const int n = gp_model_nparam_tensors(m);
    float **v = saved ? saved : calloc((size_t)n, sizeof *v);
    for (int i = 0; i < n; i++) {
        gp_param_info pi;
        REQUIRE_OK(gp_model_param(m, i, &pi));
        const size_t nb = gp_tensor_nbytes(pi.value);
        if (restore) {
            memcpy(pi.value->data, v[i], nb);
            free(v[i]);
        } else {
            v[i] = malloc(nb);
            memcpy(v[i], pi.value->data, nb);
        }
    }
    if (restore) free(v);
    return restore ? NULL : v;
}

/* Through a pipeline (2 stages, zbh1: the input gradients' transforms apart from the forward's;
 * a residual block whose convolutions Winograd serves on the second stage's thread), steps 2
 * and 3 give the losses and parameters of a new model and pipeline given the values after step
 * 1 (through gp_model_param, outside the runs), whose layers have kept nothing: SGD without
 * momentum, the values are the whole state. A transform kept from step 1's weights into step 2
 * (by their address alone, or under a generation that did not change) would make others. */
static void test_pipeline_generations(void) {
    static const char *json =
        "{\"input\": {\"shape\": [1, 12, 12], \"dtype\": \"float32\"}, \"layers\": ["
        "{\"kind\": \"conv2d\", \"in\": 1, \"out\": 24, \"kernel\": 3, \"stride\": 1, "
        "\"pad\": 1, \"bias\": false}, {\"kind\": \"batchnorm2d\", \"channels\": 24}, "
        "{\"kind\": \"relu\"}, {\"kind\": \"residual_block\", \"in\": 24, \"out\": 24}, "
        "{\"kind\": \"global_avgpool\"}, {\"kind\": \"linear\", \"in\": 24, \"out\": 10}]}";
    enum { B = 8, NSTEPS = 3 };
    float x[NSTEPS][B * 144];
    int32_t y[NSTEPS][B];
    for (int s = 0; s < NSTEPS; s++) {
        gp_test_fill(x[s], B * 144, 23, (uint32_t)s, 0.0f, 1.0f);
        for (int b = 0; b < B; b++) y[s][b] = (s * 7 + b * 3) % 10;
    }
    const gp_optim_opts o = gp_sgd_defaults(0.1f, 0.0f);
    const gp_pipeline_opts po = {.stages = 2, .micro_batches = 2, .schedule = GP_SCHEDULE_ZBH1,
                                 .remat = GP_REMAT_NONE};
    float loss[2][NSTEPS];
    uint64_t hash[2];
    float **after1 = NULL;
    for (int run = 0; run < 2; run++) { /* all the steps; then a new pipeline from step 1's */
        gp_model *m;
        REQUIRE_OK(gp_model_from_json_string(json, "test_pipeline_generations", &m));
        gp_device *dev;
        REQUIRE_OK(gp_device_cpu_new("host", &dev));
        REQUIRE_OK(gp_model_init(m, dev, 21));
        gp_pipeline *p;
        REQUIRE_OK(gp_pipeline_new(m, &o, &po, 0, &p));
        if (run) {
            after1 = snapshot(m, true, after1);
            REQUIRE_OK(gp_pipeline_set_step(p, 1));
        }
        for (int s = run; s < NSTEPS; s++) {
            gp_tensor xt = gp_tensor_view(x[s], gp_shape4(B, 1, 12, 12), GP_F32);
            gp_tensor yt = gp_tensor_view(y[s], gp_shape1(B), GP_I32);
            REQUIRE_OK(gp_pipeline_step(p, &xt, &yt, &loss[run][s]));
            if (s == 0) after1 = snapshot(m, false, NULL);
        }
        hash[run] = gp_test_hash(m);
        gp_pipeline_free(p);
        gp_model_free(m);
        gp_device_free(dev);
    }
    for (int s = 1; s < NSTEPS; s++) CHECK(memcmp(&loss[0][s], &loss[1][s], sizeof(float)) == 0);
    CHECK(hash[0] == hash[1]);
    CHECK(loss[0][1] != loss[0][2]); /* the steps did train */
}

int main(void) {
    test_gradchecks();
    test_conv_vs_naive();
    test_conv_by_hand();
    test_null_dx();
    test_batchnorm_stats();
    test_pool_values();
    test_params_and_cost();
    test_errors();
    test_determinism();
    test_weights_generations();
    test_pipeline_generations();
    return gp_test_finish("test_layers_conv");
}
