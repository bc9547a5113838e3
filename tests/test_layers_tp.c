/* Tensor-parallel shard layers against the whole layers: for the Transformer block (with and
 * without dropout), causal attention, the token embedding and the vocabulary head, T = 2, 3, 4
 * shards built by the layer's own shard op, each given its part of the whole layer's parameters
 * by the layout (layers/layout.c), run on T threads over a threads transport: every shard's
 * output and input gradient has the same bits on every shard and matches the whole layer's
 * within 1e-5 relative (the row-parallel sums add partial products in another order), and the
 * shards' parameter gradients put back together match the whole layer's. Also the split
 * cross-entropy against gp_softmax_xent, the layouts' divisibility errors naming layer,
 * dimension and mesh axis, and a shard run without its group refused. */
#include <pthread.h>
#include <string.h>

#include "comm/transport.h"
#include "layers/layout.h"
#include "layers/tp_ops.h"
#include "testutil.h"

#define MAXT 4

/* ------------------------------------------------------ the group over threads */

typedef struct tgroup {
    gp_transport *tr;
    int rank;
} tgroup;

static gp_status g_allreduce(void *ctx, gp_device *dev, float *x, int64_t n, gp_reduce_op op) {
    (void)dev;
    tgroup *g = ctx;
    return gp_transport_allreduce_f32(g->tr, g->rank, x, n, op);
}

static gp_status g_allgather(void *ctx, gp_device *dev, const float *x, int64_t n, float *out) {
    (void)dev;
    tgroup *g = ctx;
    return gp_transport_allgather_f32(g->tr, g->rank, x, n, out);
}

/* --------------------------------------------------------------- parameters */

static void alloc_params(gp_layer *l, gp_device *dev) {
    for (int j = 0; j < l->nparams; j++) {
        gp_param *p = &l->params[j];
        REQUIRE_OK(gp_tensor_alloc(dev, GP_MEM_PARAMS, p->shape, GP_F32, &p->value));
        if (p->trainable)
            REQUIRE_OK(gp_tensor_zeros(dev, GP_MEM_GRADS, p->shape, GP_F32, &p->grad));
    }
}

/* The whole layer's parameters random (non-zero biases and norms too), shard t's its parts. */
static void fill_whole(gp_layer *l, uint64_t seed) {
    for (int j = 0; j < l->nparams; j++)
        gp_test_fill(F32(l->params[j].value), gp_tensor_nelem(&l->params[j].value), seed, 100 + j,
                     0.05f, 0.6f);
}

static void scatter(gp_layer *whole, gp_layer *shard, int T, int t, bool last) {
    gp_layout lo;
    gp_layout_of(whole, last, &lo);
    CHECK_EQ_INT(shard->nparams, whole->nparams);
    for (int j = 0; j < whole->nparams; j++) {
        const gp_layout_split *sp = gp_layout_split_of(&lo, j);
        gp_shape want = gp_layout_shard_shape(&whole->params[j].shape, sp, T);
        CHECK(gp_shape_equal(&want, &shard->params[j].shape));
        CHECK(strcmp(whole->params[j].name, shard->params[j].name) == 0);
        gp_layout_copy(sp, &whole->params[j].shape, T, t, F32(whole->params[j].value),
                       F32(shard->params[j].value), true);
    }
}

/* ------------------------------------------------------------------ running */

typedef struct shard_run {
    gp_layer *l;
    gp_device *dev;
    tgroup tg;
    gp_coll_group g;
    gp_run run;
    const gp_tensor *x, *dy;
    gp_tensor y, dx;
    gp_status st;
    char msg[512];
} shard_run;

static void *shard_main(void *arg) {
    shard_run *r = arg;
    gp_ctx c;
    gp_ctx_init(&c, r->dev, &r->run);
    c.x = r->x;
    c.y = &r->y;
    r->st = r->l->ops->forward(r->l, &c, r->x, &r->y);
    if (r->st == GP_OK)
        r->st = r->l->ops->backward(r->l, &c, r->dy, r->dx.data ? &r->dx : NULL);
    if (r->st != GP_OK) snprintf(r->msg, sizeof r->msg, "%s", gp_last_error());
    gp_ctx_release(&c);
    return NULL;
}

static double rel_err(const float *a, const float *b, int64_t n) {
    double num = 0, den = 0;
    for (int64_t i = 0; i < n; i++) {
        const double d = (double)a[i] - b[i];
        num += d * d;
        den += (double)b[i] * b[i];
    }
    return den > 0 ? sqrt(num / den) : sqrt(num);
}

/* Runs the whole layer and T shards on x (dy for backward) and compares; returns the worst
 * relative error seen. */
static double compare(const char *name, gp_layer *whole, int T, gp_shape in, gp_dtype dt,
                      int vocab, bool last, bool training) {
    gp_device *dev;
    REQUIRE_OK(gp_device_cpu_new("tp", &dev));
    alloc_params(whole, dev);
    fill_whole(whole, 7);
    gp_shape out;
    REQUIRE_OK(whole->ops->out_shape(whole, &in, dt, &out));
    gp_tensor x, dy, y, dx = {0};
    REQUIRE_OK(gp_tensor_alloc(dev, GP_MEM_ACTIVATIONS, in, dt, &x));
    REQUIRE_OK(gp_tensor_alloc(dev, GP_MEM_ACTIVATIONS, out, GP_F32, &y));
    if (dt == GP_I32) {
        for (int64_t i = 0; i < gp_tensor_nelem(&x); i++) I32(x)[i] = (int32_t)((i * 37 + 5) % vocab);
    } else {
        gp_test_fill(F32(x), gp_tensor_nelem(&x), 11, 1, 0.1f, 1.0f);
        REQUIRE_OK(gp_tensor_alloc(dev, GP_MEM_ACTIVATIONS, in, GP_F32, &dx));
    }
    /* With a split output (the head) each shard gets its columns of dy. */
    REQUIRE_OK(gp_tensor_alloc(dev, GP_MEM_ACTIVATIONS, out, GP_F32, &dy));
    gp_test_fill(F32(dy), gp_tensor_nelem(&dy), 12, 2, 0.1f, 1.0f);
    gp_run run = {.training = training, .seed = 99, .step = 3, .micro_batch = 1};
    gp_ctx c;
    gp_ctx_init(&c, dev, &run);
    c.x = &x;
    c.y = &y;
    REQUIRE_OK(whole->ops->forward(whole, &c, &x, &y));
    REQUIRE_OK(whole->ops->backward(whole, &c, &dy, dx.data ? &dx : NULL));
    gp_ctx_release(&c);

    gp_layout lo;
    gp_layout_of(whole, last, &lo);
    gp_transport *tr;
    gp_transport_opts to = {.nranks = T, .timeout_s = 30};
    REQUIRE_OK(gp_transport_threads_new(&to, &tr));
    shard_run runs[MAXT];
    pthread_t th[MAXT];
    gp_tensor dyl[MAXT];
    const int64_t cols = out.dim[out.ndim - 1], rows = gp_shape_nelem(&out) / cols;
    for (int t = 0; t < T; t++) {
        shard_run *r = &runs[t];
        memset(r, 0, sizeof *r);
        r->l = whole->ops->shard(whole, T);
        REQUIRE_OK(r->l ? GP_OK : GP_INTERNAL);
        r->l->index = whole->index;
        REQUIRE_OK(gp_device_cpu_new("shard", &r->dev));
        alloc_params(r->l, r->dev);
        scatter(whole, r->l, T, t, last);
        r->tg = (tgroup){tr, t};
        r->g = (gp_coll_group){.rank = t, .size = T, .allreduce = g_allreduce,
                               .allgather = g_allgather, .ctx = &r->tg};
        r->run = run;
        r->run.tp = &r->g;
        r->x = &x;
        gp_shape os;
        REQUIRE_OK(r->l->ops->out_shape(r->l, &in, dt, &os));
        REQUIRE_OK(gp_tensor_alloc(r->dev, GP_MEM_ACTIVATIONS, os, GP_F32, &r->y));
        REQUIRE_OK(gp_tensor_alloc(r->dev, GP_MEM_ACTIVATIONS, os, GP_F32, &dyl[t]));
        const int64_t lc = os.dim[os.ndim - 1];
        for (int64_t i = 0; i < rows; i++) /* shard t's columns of dy (all of them if whole) */
            memcpy(F32(dyl[t]) + i * lc, F32(dy) + i * cols + (lc == cols ? 0 : t * lc),
                   (size_t)lc * sizeof(float));
        r->dy = &dyl[t];
        if (dx.data) REQUIRE_OK(gp_tensor_alloc(r->dev, GP_MEM_ACTIVATIONS, in, GP_F32, &r->dx));
    }
    for (int t = 0; t < T; t++) CHECK(pthread_create(&th[t], NULL, shard_main, &runs[t]) == 0);
    for (int t = 0; t < T; t++) pthread_join(th[t], NULL);
    double worst = 0;
    for (int t = 0; t < T; t++) {
        shard_run *r = &runs[t];
        if (r->st != GP_OK) {
            fprintf(stderr, "%s T=%d shard %d: %s\n", name, T, t, r->msg);
            gp_test_failures++;
            continue;
        }
        const int64_t lc = r->y.shape.dim[r->y.shape.ndim - 1];
        if (lc == cols) {
            /* the whole output on every shard, the same bits */
            CHECK(memcmp(r->y.data, runs[0].y.data, gp_tensor_nbytes(&r->y)) == 0);
            worst = fmax(worst, rel_err(F32(r->y), F32(y), gp_tensor_nelem(&y)));
        } else {
            float *want = malloc((size_t)(rows * lc) * sizeof *want);
            for (int64_t i = 0; i < rows; i++)
                memcpy(want + i * lc, F32(y) + i * cols + t * lc, (size_t)lc * sizeof *want);
            worst = fmax(worst, rel_err(F32(r->y), want, rows * lc));
            free(want);
        }
        if (dx.data) {
            CHECK(memcmp(r->dx.data, runs[0].dx.data, gp_tensor_nbytes(&dx)) == 0);
            worst = fmax(worst, rel_err(F32(r->dx), F32(dx), gp_tensor_nelem(&dx)));
        }
    }
    /* The shards' gradients put together: the whole layer's. Replicated ones: every shard's
     * is the whole one's, the same bits on every shard. */
    for (int j = 0; j < whole->nparams && gp_test_failures == 0; j++) {
        gp_param *p = &whole->params[j];
        if (!p->trainable) continue;
        const gp_layout_split *sp = gp_layout_split_of(&lo, j);
        const int64_t n = gp_tensor_nelem(&p->grad);
        float *g = calloc((size_t)n, sizeof *g);
        for (int t = 0; t < T; t++) {
            gp_layout_copy(sp, &p->shape, T, t, g, F32(runs[t].l->params[j].grad), false);
            if (!sp)
                CHECK(memcmp(runs[t].l->params[j].grad.data, runs[0].l->params[j].grad.data,
                             (size_t)n * sizeof *g) == 0);
        }
        const double e = rel_err(g, F32(p->grad), n);
        if (e > 1e-5) fprintf(stderr, "  %s T=%d: gradient of %s: relative error %.3g\n", name, T, p->name, e);
        worst = fmax(worst, e);
        free(g);
    }
    printf("%s, T = %d: worst relative error %.3g (output, input gradient, parameter gradients)\n",
           name, T, worst);
    CHECK(worst <= 1e-5);
    CHECK(worst > 0 || dt == GP_I32); /* a row-parallel sum reorders: not bitwise */
    for (int t = 0; t < T; t++) {
        gp_tensor_release(&runs[t].y);
        gp_tensor_release(&runs[t].dx);
        gp_tensor_release(&dyl[t]);
        gp_layer_free(runs[t].l);
        gp_mem_stats ms;
        gp_device_mem_stats(runs[t].dev, &ms);
        CHECK_EQ_INT(ms.live_total, 0);
        gp_device_free(runs[t].dev);
    }
    gp_transport_free(tr);
    gp_tensor_release(&x);
    gp_tensor_release(&y);
    gp_tensor_release(&dy);
    gp_tensor_release(&dx);
    gp_layer_free(whole);
    gp_device_free(dev);
    return worst;
}

/* ------------------------------------------------------ split cross-entropy */

typedef struct xent_run {
    gp_device *dev; /* its own: a device is used by one thread at a time */
    gp_tensor logits, dl;
    const gp_tensor *labels;
    tgroup tg;
    gp_coll_group g;
    int64_t vocab, first;
    double smoothing, loss;
    gp_status st;
} xent_run;

static void *xent_main(void *arg) {
    xent_run *r = arg;
    r->st = gp_softmax_xent_shard(&r->logits, r->labels, r->vocab, r->first, &r->g, 37.0,
                                  r->smoothing, &r->loss, &r->dl);
    return NULL;
}

/* The shards' loss and gradient against the whole logits' (label smoothing as given). */
static void split_xent(int T, double smoothing) {
    const int64_t rows = 40, V = 12 * T;
    gp_device *dev;
    REQUIRE_OK(gp_device_cpu_new("xent", &dev));
    gp_tensor lg, lab, dl;
    REQUIRE_OK(gp_tensor_alloc(dev, GP_MEM_ACTIVATIONS, gp_shape2(rows, V), GP_F32, &lg));
    REQUIRE_OK(gp_tensor_alloc(dev, GP_MEM_ACTIVATIONS, gp_shape2(rows, V), GP_F32, &dl));
    REQUIRE_OK(gp_tensor_alloc(dev, GP_MEM_ACTIVATIONS, gp_shape1(rows), GP_I32, &lab));
    gp_test_fill(F32(lg), rows * V, 5, 3, 0.5f, 6.0f);
    for (int64_t r = 0; r < rows; r++) I32(lab)[r] = r % 7 == 3 ? -1 : (int32_t)((r * 5) % V);
    double want;
    REQUIRE_OK(gp_softmax_xent_smoothed(&lg, &lab, 37.0, smoothing, &want, &dl));
    gp_transport *tr;
    gp_transport_opts to = {.nranks = T, .timeout_s = 30};
    REQUIRE_OK(gp_transport_threads_new(&to, &tr));
    xent_run runs[MAXT];
    pthread_t th[MAXT];
    const int64_t lc = V / T;
    for (int t = 0; t < T; t++) {
        xent_run *r = &runs[t];
        memset(r, 0, sizeof *r);
        REQUIRE_OK(gp_device_cpu_new("shard", &r->dev));
        REQUIRE_OK(gp_tensor_alloc(r->dev, GP_MEM_ACTIVATIONS, gp_shape2(rows, lc), GP_F32, &r->logits));
        REQUIRE_OK(gp_tensor_alloc(r->dev, GP_MEM_ACTIVATIONS, gp_shape2(rows, lc), GP_F32, &r->dl));
        for (int64_t i = 0; i < rows; i++)
            memcpy(F32(r->logits) + i * lc, F32(lg) + i * V + t * lc, (size_t)lc * sizeof(float));
        r->labels = &lab;
        r->tg = (tgroup){tr, t};
        r->g = (gp_coll_group){.rank = t, .size = T, .allreduce = g_allreduce,
                               .allgather = g_allgather, .ctx = &r->tg};
        r->vocab = V;
        r->first = t * lc;
        r->smoothing = smoothing;
    }
    for (int t = 0; t < T; t++) CHECK(pthread_create(&th[t], NULL, xent_main, &runs[t]) == 0);
    for (int t = 0; t < T; t++) pthread_join(th[t], NULL);
    double worst = 0;
    for (int t = 0; t < T; t++) {
        CHECK_OK(runs[t].st);
        CHECK(runs[t].loss == runs[0].loss); /* the same bits on every shard */
        float *want_dl = malloc((size_t)(rows * lc) * sizeof *want_dl);
        for (int64_t i = 0; i < rows; i++)
            memcpy(want_dl + i * lc, F32(dl) + i * V + t * lc, (size_t)lc * sizeof(float));
        worst = fmax(worst, rel_err(F32(runs[t].dl), want_dl, rows * lc));
        free(want_dl);
        gp_tensor_release(&runs[t].logits);
        gp_tensor_release(&runs[t].dl);
        gp_device_free(runs[t].dev);
    }
    const double lerr = fabs(runs[0].loss - want) / fabs(want);
    printf("split cross-entropy, T = %d, smoothing %g: loss %.9g vs %.9g (relative %.3g), "
           "dlogits %.3g\n",
           T, smoothing, runs[0].loss, want, lerr, worst);
    CHECK(lerr <= 1e-6);
    CHECK(worst <= 1e-5);
    gp_transport_free(tr);
    gp_tensor_release(&lg);
    gp_tensor_release(&dl);
    gp_tensor_release(&lab);
    gp_device_free(dev);
}

/* ------------------------------------------------------------------- errors */

static void errors(void) {
    gp_layer *b = gp_transformer_block(24, 4, 60, 0.0f);
    b->index = 3;
    gp_layout lo;
    gp_layout_of(b, false, &lo);
    CHECK_OK(gp_layout_check(b, &lo, 2));
    CHECK_FAILS(gp_layout_check(b, &lo, 3), GP_CONFIG,
                "layer 3 (transformer_block): heads = 4 does not divide evenly over mesh axis "
                "\"tensor\" of size 3");
    CHECK_FAILS(gp_layout_check(b, &lo, 8), GP_CONFIG, "heads = 4");
    gp_layer_free(b);
    b = gp_transformer_block(24, 8, 60, 0.0f);
    b->index = 1;
    gp_layout_of(b, false, &lo);
    CHECK_OK(gp_layout_check(b, &lo, 4));
    CHECK_FAILS(gp_layout_check(b, &lo, 8), GP_CONFIG,
                "layer 1 (transformer_block): d_ff = 60 does not divide evenly over mesh axis "
                "\"tensor\" of size 8");
    gp_layer_free(b);
    gp_layer *h = gp_linear(8, 10, false);
    h->index = 7;
    gp_layout_of(h, true, &lo);
    CHECK(lo.output_split);
    CHECK_FAILS(gp_layout_check(h, &lo, 4), GP_CONFIG,
                "layer 7 (linear): out_features = 10 does not divide evenly over mesh axis "
                "\"tensor\" of size 4");
    gp_layout_of(h, false, &lo); /* not last: replicated, nothing to check */
    CHECK_EQ_INT(lo.nsplits, 0);
    CHECK_OK(gp_layout_check(h, &lo, 4));
    gp_layer_free(h);
    /* A shard without its group. */
    gp_layer *w = gp_embedding(8, 4), *s = w->ops->shard(w, 2);
    gp_device *dev;
    REQUIRE_OK(gp_device_cpu_new("e", &dev));
    alloc_params(s, dev);
    int32_t ids[2] = {1, 5};
    gp_tensor x = gp_tensor_view(ids, gp_shape2(1, 2), GP_I32), y;
    REQUIRE_OK(gp_tensor_alloc(dev, GP_MEM_ACTIVATIONS, gp_shape3(1, 2, 4), GP_F32, &y));
    gp_ctx c;
    gp_ctx_init(&c, dev, NULL);
    CHECK_FAILS(s->ops->forward(s, &c, &x, &y), GP_INVALID_ARGUMENT,
                "a shard of 2 runs with its tensor-parallel group of 2 (the pipeline gives it), "
                "got none");
    gp_ctx_release(&c);
    gp_tensor_release(&y);
    gp_layer_free(s);
    gp_layer_free(w);
    gp_device_free(dev);
}

int main(void) {
    errors();
    for (int T = 2; T <= MAXT; T++) {
        split_xent(T, 0.0);
        split_xent(T, 0.1);
        if (T != 3) {
            compare("transformer_block", gp_transformer_block(32, 4, 64, 0.0f), T,
                    gp_shape3(2, 9, 32), GP_F32, 0, false, true);
            compare("transformer_block, dropout 0.1", gp_transformer_block(32, 4, 64, 0.1f), T,
                    gp_shape3(2, 9, 32), GP_F32, 0, false, true);
            compare("causal_attention, dropout 0.1", gp_causal_attention(32, 4, 0.1f), T,
                    gp_shape3(2, 7, 32), GP_F32, 0, false, true);
        } else {
            compare("transformer_block (6 heads, d_ff 48)", gp_transformer_block(24, 6, 48, 0.1f),
                    T, gp_shape3(2, 5, 24), GP_F32, 0, false, true);
        }
        compare("embedding", gp_embedding(12 * T, 16), T, gp_shape2(3, 10), GP_I32, 12 * T, false,
                true);
        compare("linear head", gp_linear(16, 12 * T, true), T, gp_shape3(2, 5, 16), GP_F32, 0,
                true, true);
    }
    return gp_test_finish("test_layers_tp");
}
