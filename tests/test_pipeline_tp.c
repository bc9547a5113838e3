/* The tensor axis on the threads launcher: the test Transformer (4 heads, d_ff 64, vocabulary
 * 64, dropout 0.1) trained with T = 2 and 4 tensor-parallel shards per stage against T = 1:
 *   - losses and every parameter within 1e-5 relative after 5 steps (not bitwise: a row-split
 *     matmul adds its partial products in another order);
 *   - for a fixed T, every K = 1..4 and both schedules (and both re-materialization modes) give
 *     bit-identical losses and parameters, and a run repeats bit for bit;
 *   - each shard's device holds exactly its part: parameters, gradients and AdamW state of the
 *     split layers divided by T, the replicated ones whole, as its allocator counts them;
 *   - evaluation through the shards gives the whole model's logits (to rounding);
 *   - a checkpoint saved with T = 2 keeps whole tensors under their names and resumes with
 *     T = 1, 4 and another K from exactly the saved values (parameters and optimizer state);
 *   - layouts that do not divide are errors naming layer, dimension and mesh axis.
 * The parameters are compared through checkpoints: with T > 1 the values live in the shards. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "testutil.h"

#define STEPS 5
#define M_MICRO 4
#define BATCH 8
static const uint64_t SEED = 77;

typedef struct run {
    float loss[STEPS];
    uint64_t hash;
    uint64_t tensor_bytes; /* the last step's, every device's together */
} run;

static void batch_of(int step, gp_test_batch *b) {
    gp_test_net_batch(GP_TEST_TRANSFORMER, BATCH, 1000 + (uint64_t)step, b);
}

/* SGD: with AdamW the key part of attn.qkv.bias, whose true gradient is zero (softmax ignores
 * a shift shared by every key), gets a gradient of pure rounding noise, which AdamW scales up
 * to steps of size lr whatever its size, so the order of a sum decides those few values (see
 * the MPI launcher's D = 2 test). With SGD the noise stays noise-sized. */
static gp_optim_opts sgd(void) {
    gp_optim_opts o = gp_sgd_defaults(0.05f, 0.9f);
    o.clip_norm = 0.5f;
    return o;
}

/* Label smoothing of the runs below (0: none). */
static double g_smoothing;

/* Trains steps steps with T shards on K stages; saves a checkpoint (whole tensors) at `save`
 * when not NULL. */
static void train(int T, int K, gp_schedule_kind sk, gp_remat rm, const gp_optim_opts *o,
                  int steps, const char *save, run *r) {
    gp_model *m = gp_test_net_build(GP_TEST_TRANSFORMER);
    gp_pipeline_opts po = {.stages = K, .micro_batches = M_MICRO, .schedule = sk, .remat = rm,
                           .tensor_parallel = T, .label_smoothing = g_smoothing};
    gp_pipeline *p;
    REQUIRE_OK(gp_pipeline_new(m, o, &po, SEED, &p));
    CHECK_EQ_INT(gp_pipeline_tensor_parallel(p), T);
    for (int s = 0; s < steps; s++) {
        gp_test_batch b;
        batch_of(s, &b);
        REQUIRE_OK(gp_pipeline_step(p, &b.x, &b.y_t, &r->loss[s]));
    }
    REQUIRE_OK(gp_pipeline_params_fnv1a64(p, &r->hash));
    uint64_t tb[64];
    REQUIRE_OK(gp_pipeline_bytes_tensor(p, tb, 64));
    r->tensor_bytes = 0;
    for (int i = 0; i < 64; i++) r->tensor_bytes += tb[i];
    if (save) {
        char written[1024];
        REQUIRE_OK(gp_pipeline_checkpoint_save(p, save, steps, NULL, 0, written, sizeof written));
    }
    gp_pipeline_free(p);
    gp_model_free(m);
}

/* A fresh whole model holding the values of checkpoint `base` (.safetensors). */
static gp_model *whole_from(const char *base, gp_device *dev) {
    char path[1024];
    snprintf(path, sizeof path, "%s.safetensors", base);
    gp_model *m = gp_test_net_build(GP_TEST_TRANSFORMER);
    REQUIRE_OK(gp_model_init(m, dev, 1));
    gp_checkpoint *c;
    REQUIRE_OK(gp_checkpoint_open(path, &c));
    REQUIRE_OK(gp_checkpoint_load_layers(c, m, 0, gp_model_nlayers(m), NULL));
    gp_checkpoint_close(c);
    return m;
}

/* Largest per-tensor relative L2 error of a against b. */
static double max_rel_error(gp_model *a, gp_model *b, const char *what) {
    double worst = 0;
    for (int i = 0; i < gp_model_nparam_tensors(a); i++) {
        gp_param_info pa, pb;
        REQUIRE_OK(gp_model_param(a, i, &pa));
        REQUIRE_OK(gp_model_param(b, i, &pb));
        double num = 0, den = 0;
        for (int64_t j = 0; j < gp_tensor_nelem(pa.value); j++) {
            const double d = (double)F32(*pa.value)[j] - F32(*pb.value)[j];
            num += d * d;
            den += (double)F32(*pb.value)[j] * F32(*pb.value)[j];
        }
        const double rel = den > 0 ? sqrt(num / den) : sqrt(num);
        if (rel > 1e-5)
            fprintf(stderr, "  %s: layer %d %s: relative error %.3g\n", what, pa.layer, pa.name, rel);
        worst = rel > worst ? rel : worst;
    }
    return worst;
}

static void across_t(void) {
    const gp_optim_opts o = sgd();
    gp_device *dev;
    REQUIRE_OK(gp_device_cpu_new("whole", &dev));
    run ref;
    train(1, 1, GP_SCHEDULE_GPIPE, GP_REMAT_CELL, &o, STEPS, gp_scratch_path("t1"), &ref);
    gp_scratch_remember(gp_scratch_path("t1.safetensors"));
    CHECK(ref.loss[STEPS - 1] < ref.loss[0]); /* it trains */
    gp_model *want = whole_from(gp_scratch_path("t1"), dev);
    for (int T = 2; T <= 4; T *= 2) {
        char base[64];
        snprintf(base, sizeof base, "t%d", T);
        run r;
        train(T, 2, GP_SCHEDULE_1F1B, GP_REMAT_CELL, &o, STEPS, gp_scratch_path(base), &r);
        snprintf(base, sizeof base, "t%d.safetensors", T);
        gp_scratch_remember(gp_scratch_path(base));
        snprintf(base, sizeof base, "t%d", T);
        gp_model *got = whole_from(gp_scratch_path(base), dev);
        double lerr = 0;
        for (int s = 0; s < STEPS; s++)
            lerr = fmax(lerr, fabs((double)r.loss[s] - ref.loss[s]) / fabs((double)ref.loss[s]));
        const double perr = max_rel_error(got, want, base);
        printf("T = %d (K = 2, 1f1b) vs T = 1, %d steps: losses within %.3g, parameters within "
               "%.3g relative (limit 1e-5); hash %016llx vs %016llx\n",
               T, STEPS, lerr, perr, (unsigned long long)r.hash, (unsigned long long)ref.hash);
        CHECK(lerr <= 1e-5);
        CHECK(perr <= 1e-5);
        CHECK(perr > 0); /* not bitwise: the row-split sums reorder */
        /* The whole model's hash is computed from the whole tensors, as with T = 1. */
        CHECK_EQ_INT(gp_test_hash(got), r.hash);
        gp_model_free(got);
    }
    gp_model_free(want);
    gp_device_free(dev);
}

/* Label smoothing with the vocabulary head split: the shards' losses follow one device's
 * smoothed ones (and differ from the plain cross-entropy's, which near the uniform prediction
 * of a fresh model takes a large smoothing to show), on zbv with T = 2. */
static void smoothing_across_t(void) {
    const gp_optim_opts o = sgd();
    run plain, ref, r;
    train(1, 1, GP_SCHEDULE_GPIPE, GP_REMAT_CELL, &o, STEPS, NULL, &plain);
    g_smoothing = 0.5;
    train(1, 1, GP_SCHEDULE_GPIPE, GP_REMAT_CELL, &o, STEPS, NULL, &ref);
    train(2, 2, GP_SCHEDULE_ZBV, GP_REMAT_CELL, &o, STEPS, NULL, &r);
    g_smoothing = 0;
    double lerr = 0;
    for (int s = 0; s < STEPS; s++)
        lerr = fmax(lerr, fabs((double)r.loss[s] - ref.loss[s]) / fabs((double)ref.loss[s]));
    printf("smoothing 0.5, T = 2 (K = 2, zbv) vs T = 1: losses within %.3g (limit 1e-5); first "
           "loss %.6f smoothed, %.6f plain\n",
           lerr, ref.loss[0], plain.loss[0]);
    CHECK(lerr <= 1e-5);
    CHECK(fabs((double)ref.loss[0] - plain.loss[0]) > 1e-3);
}

/* Fixed T: every K, schedule and re-materialization mode gives the same bits. */
static void fixed_t(int T, int maxk, bool quick) {
    const gp_optim_opts o = gp_test_net_optim(GP_TEST_TRANSFORMER); /* AdamW */
    run ref;
    train(T, 1, GP_SCHEDULE_GPIPE, GP_REMAT_CELL, &o, 3, NULL, &ref);
    int runs = 0;
    uint64_t tensor_bytes[2] = {0, 0}; /* per remat mode: the same on every K and schedule */
    gp_model *shape = gp_test_net_build(GP_TEST_TRANSFORMER);
    const int L = gp_model_nlayers(shape);
    gp_model_free(shape);
    for (int K = 1; K <= maxk; K++)
        for (int sk = 0; sk <= GP_SCHEDULE_ZBV; sk++)
            for (int rm = 0; rm < 2; rm++) {
                if (quick && rm == 1 && K != 2) continue;
                /* two cells per stage (interleaved: M a multiple of K): K > 1, 2K layers */
                const bool two_cells = sk == GP_SCHEDULE_INTERLEAVED || sk == GP_SCHEDULE_ZBV;
                if (two_cells && (K == 1 || 2 * K > L)) continue;
                if (sk == GP_SCHEDULE_INTERLEAVED && M_MICRO % K) continue;
                run r;
                train(T, K, (gp_schedule_kind)sk, (gp_remat)rm, &o, 3, NULL, &r);
                runs++;
                /* each cell's collectives counted, V cells per stage included */
                if (!tensor_bytes[rm]) tensor_bytes[rm] = r.tensor_bytes;
                if (r.tensor_bytes != tensor_bytes[rm] || r.tensor_bytes == 0) {
                    fprintf(stderr, "T = %d K = %d %s remat %s: %llu bytes to the tensor axis, "
                                    "%llu on the first run\n",
                            T, K, gp_schedule_kind_name((gp_schedule_kind)sk),
                            gp_remat_name((gp_remat)rm), (unsigned long long)r.tensor_bytes,
                            (unsigned long long)tensor_bytes[rm]);
                    gp_test_failures++;
                }
                if (memcmp(r.loss, ref.loss, 3 * sizeof *r.loss) || r.hash != ref.hash) {
                    fprintf(stderr, "T = %d K = %d %s remat %s: not bit-identical (hash %016llx vs "
                                    "%016llx)\n",
                            T, K, gp_schedule_kind_name((gp_schedule_kind)sk),
                            gp_remat_name((gp_remat)rm), (unsigned long long)r.hash,
                            (unsigned long long)ref.hash);
                    gp_test_failures++;
                }
            }
    printf("T = %d: %d runs (K = 1..%d x gpipe/1f1b/zbh1/interleaved/zbv x remat cell/none) "
           "bit-identical, as many bytes to the tensor axis (%llu remat cell, %llu none): loss "
           "%.6f -> %.6f, params %016llx\n",
           T, runs, maxk, (unsigned long long)tensor_bytes[0], (unsigned long long)tensor_bytes[1],
           ref.loss[0], ref.loss[2], (unsigned long long)ref.hash);
}

/* Each shard's device counts exactly its part of the stage's parameters. */
static void memory(void) {
    const int T = 2, K = 2;
    gp_model *m = gp_test_net_build(GP_TEST_TRANSFORMER);
    gp_optim_opts o = gp_test_net_optim(GP_TEST_TRANSFORMER);
    gp_pipeline_opts po = {.stages = K, .micro_batches = M_MICRO, .tensor_parallel = T};
    gp_pipeline *p;
    REQUIRE_OK(gp_pipeline_new(m, &o, &po, SEED, &p));
    gp_test_batch b;
    batch_of(0, &b);
    float loss;
    REQUIRE_OK(gp_pipeline_step(p, &b.x, &b.y_t, &loss));
    uint64_t total_params = 0;
    for (int k = 0; k < K; k++) {
        const int first = gp_pipeline_cell_first(p, k);
        const int last = k + 1 < K ? gp_pipeline_cell_first(p, k + 1) : gp_model_nlayers(m);
        /* The whole model's figures by hand: transformer blocks split all but their layer
         * norms and output biases; embedding and the head split; positions, the final norm
         * replicated. */
        uint64_t want = 0, want_train = 0;
        for (int li = first; li < last; li++) {
            const gp_layer *l = gp_model_layer(m, li);
            const char *kind = gp_layer_kind(l);
            for (int j = 0; j < l->nparams; j++) {
                const char *name = l->params[j].name;
                bool split = !strcmp(kind, "embedding") || !strcmp(kind, "linear") ||
                             (!strcmp(kind, "transformer_block") && !strstr(name, "ln") &&
                              strcmp(name, "attn.proj.bias") && strcmp(name, "mlp.proj.bias"));
                const uint64_t n = (uint64_t)gp_shape_nelem(&l->params[j].shape) / (split ? T : 1);
                want += 4 * n;
                if (l->params[j].trainable) want_train += 4 * n;
            }
        }
        for (int t = 0; t < T; t++) {
            gp_mem_stats ms;
            CHECK_OK(gp_pipeline_mem_stats_shard(p, k, t, &ms));
            CHECK_EQ_INT(ms.live[GP_MEM_PARAMS], want);
            CHECK_EQ_INT(ms.live[GP_MEM_GRADS], want_train);
            CHECK_EQ_INT(ms.live[GP_MEM_OPTIM], 2 * want_train);
            CHECK_EQ_INT(ms.live[GP_MEM_ACTIVATIONS], 0);
            total_params += ms.live[GP_MEM_PARAMS];
        }
    }
    /* Together the shards hold the whole model plus T - 1 copies of the replicated part. */
    CHECK(total_params > 4 * (uint64_t)gp_model_nparams(m));
    CHECK(total_params < 2 * 4 * (uint64_t)gp_model_nparams(m));
    gp_mem_stats none;
    CHECK_FAILS(gp_pipeline_mem_stats_shard(p, 0, T, &none), GP_INVALID_ARGUMENT, "shard 2 outside 0..1");
    uint64_t tb[4];
    CHECK_OK(gp_pipeline_bytes_tensor(p, tb, 4));
    for (int w = 0; w < K * T; w++) CHECK(tb[w] > 0);
    CHECK_EQ_INT(tb[0], tb[1]); /* a stage's shards call the same collectives */
    CHECK_EQ_INT(tb[2], tb[3]);
    CHECK_FAILS(gp_pipeline_bytes_tensor(p, tb, 3), GP_INVALID_ARGUMENT, "room for 3 devices, 4");
    /* The model's own layers hold nothing while the shards do; one pipeline per model. */
    gp_pipeline *p2 = NULL;
    CHECK_FAILS(gp_pipeline_new(m, &o, &po, SEED, &p2), GP_INVALID_ARGUMENT, "already has a pipeline");
    /* Evaluation through the shards against the whole model's. */
    gp_tensor logits;
    REQUIRE_OK(gp_tensor_alloc(NULL == m ? NULL : gp_pipeline_device(p, 0), GP_MEM_WORKSPACE,
                               gp_shape3(BATCH, 16, 64), GP_F32, &logits));
    CHECK_OK(gp_pipeline_predict(p, &b.x, &logits));
    double lsum;
    int64_t nc, cnt;
    CHECK_OK(gp_pipeline_evaluate(p, &b.x, &b.y_t, &lsum, &nc, &cnt));
    REQUIRE_OK(gp_pipeline_checkpoint_save(p, gp_scratch_path("mem"), 1, NULL, 0, NULL, 0));
    gp_scratch_remember(gp_scratch_path("mem.safetensors"));
    gp_device *dev;
    REQUIRE_OK(gp_device_cpu_new("whole", &dev));
    gp_model *w = whole_from(gp_scratch_path("mem"), dev);
    gp_tensor want;
    REQUIRE_OK(gp_tensor_alloc(dev, GP_MEM_WORKSPACE, gp_shape3(BATCH, 16, 64), GP_F32, &want));
    CHECK_OK(gp_model_predict(w, &b.x, &want));
    double wsum;
    int64_t wnc, wcnt;
    CHECK_OK(gp_model_evaluate(w, &b.x, &b.y_t, &wsum, &wnc, &wcnt));
    double num = 0, den = 0;
    for (int64_t i = 0; i < gp_tensor_nelem(&want); i++) {
        const double d = (double)F32(logits)[i] - F32(want)[i];
        num += d * d, den += (double)F32(want)[i] * F32(want)[i];
    }
    printf("evaluation with T = 2: logits within %.3g relative of the whole model's, loss %.9g "
           "vs %.9g\n", sqrt(num / den), lsum, wsum);
    CHECK(sqrt(num / den) <= 1e-5);
    CHECK(fabs(lsum - wsum) <= 1e-5 * fabs(wsum));
    CHECK_EQ_INT(cnt, wcnt);
    gp_tensor_release(&want);
    gp_tensor_release(&logits);
    gp_model_free(w);
    gp_device_free(dev);
    gp_pipeline_free(p);
    gp_model_free(m);
}

/* The tensors of two checkpoints, bit for bit (values and optimizer state). */
static void same_tensors(const char *a, const char *b) {
    gp_safetensors *fa, *fb;
    REQUIRE_OK(gp_safetensors_read(a, &fa));
    REQUIRE_OK(gp_safetensors_read(b, &fb));
    CHECK_EQ_INT(gp_safetensors_count(fa), gp_safetensors_count(fb));
    int compared = 0;
    for (int i = 0; i < gp_safetensors_count(fa); i++) {
        const gp_st_entry *e = gp_safetensors_entry(fa, i);
        const gp_st_entry *f = gp_safetensors_find(fb, e->name);
        CHECK(f != NULL && gp_shape_equal(&e->shape, &f->shape));
        if (!f) continue;
        size_t n = (size_t)gp_shape_nelem(&e->shape) * 4;
        void *x = malloc(n), *y = malloc(n);
        CHECK_OK(gp_safetensors_get(fa, e->name, GP_F32, &e->shape, x));
        CHECK_OK(gp_safetensors_get(fb, e->name, GP_F32, &e->shape, y));
        if (memcmp(x, y, n) != 0) {
            fprintf(stderr, "tensor %s differs between %s and %s\n", e->name, a, b);
            gp_test_failures++;
        }
        compared++;
        free(x);
        free(y);
    }
    CHECK(compared > 3 * 16); /* parameters and both AdamW moments */
    gp_safetensors_free(fa);
    gp_safetensors_free(fb);
}

/* Saved with T = 2 on 2 stages after 3 steps, loaded with T = 1, 4 and other K: the same values
 * and optimizer state (saved again: every tensor bit-identical), then training goes on. */
static void resume_across_t(void) {
    const gp_optim_opts o = gp_test_net_optim(GP_TEST_TRANSFORMER);
    run r;
    train(2, 2, GP_SCHEDULE_GPIPE, GP_REMAT_CELL, &o, 3, gp_scratch_path("saved2"), &r);
    const char *saved = "saved2.safetensors";
    char saved_path[1024];
    snprintf(saved_path, sizeof saved_path, "%s", gp_scratch_path(saved));
    gp_scratch_remember(saved_path);
    static const int ts[] = {1, 4, 2}, ks[] = {1, 3, 4};
    for (int i = 0; i < 3; i++) {
        gp_model *m = gp_test_net_build(GP_TEST_TRANSFORMER);
        gp_pipeline_opts po = {.stages = ks[i], .micro_batches = M_MICRO, .tensor_parallel = ts[i]};
        gp_pipeline *p;
        REQUIRE_OK(gp_pipeline_new(m, &o, &po, SEED, &p));
        gp_checkpoint *c;
        REQUIRE_OK(gp_checkpoint_open(saved_path, &c));
        CHECK_OK(gp_pipeline_checkpoint_load(p, c));
        gp_checkpoint_close(c);
        REQUIRE_OK(gp_pipeline_set_step(p, 3));
        uint64_t h;
        CHECK_OK(gp_pipeline_params_fnv1a64(p, &h));
        CHECK_EQ_INT(h, r.hash); /* exactly the saved values */
        char again[64];
        snprintf(again, sizeof again, "again%d", i);
        CHECK_OK(gp_pipeline_checkpoint_save(p, gp_scratch_path(again), 3, NULL, 0, NULL, 0));
        snprintf(again, sizeof again, "again%d.safetensors", i);
        char again_path[1024];
        snprintf(again_path, sizeof again_path, "%s", gp_scratch_path(again));
        gp_scratch_remember(again_path);
        same_tensors(saved_path, again_path);
        float l0, l1;
        gp_test_batch b;
        batch_of(3, &b);
        CHECK_OK(gp_pipeline_step(p, &b.x, &b.y_t, &l0));
        batch_of(4, &b);
        CHECK_OK(gp_pipeline_step(p, &b.x, &b.y_t, &l1));
        printf("saved with T = 2, K = 2; resumed with T = %d, K = %d: the same %d tensors bit for "
               "bit, then losses %.6f, %.6f\n",
               ts[i], ks[i], 3 * 42, l0, l1);
        CHECK(l0 > 0 && l1 > 0);
        gp_pipeline_free(p);
        gp_model_free(m);
    }
}

static void errors(void) {
    gp_model *m = gp_test_net_build(GP_TEST_TRANSFORMER);
    gp_optim_opts o = gp_test_net_optim(GP_TEST_TRANSFORMER);
    gp_pipeline *p = NULL;
    gp_pipeline_opts po = {.stages = 2, .micro_batches = 2, .tensor_parallel = 3};
    CHECK_FAILS(gp_pipeline_new(m, &o, &po, SEED, &p), GP_CONFIG,
                "layer 0 (embedding): vocab = 64 does not divide evenly over mesh axis \"tensor\" "
                "of size 3");
    CHECK(p == NULL);
    po.tensor_parallel = 8;
    CHECK_FAILS(gp_pipeline_new(m, &o, &po, SEED, &p), GP_CONFIG,
                "layer 2 (transformer_block): heads = 4 does not divide evenly over mesh axis "
                "\"tensor\" of size 8");
    po.tensor_parallel = -2;
    CHECK_FAILS(gp_pipeline_new(m, &o, &po, SEED, &p), GP_INVALID_ARGUMENT,
                "tensor_parallel -2: expected 1 to 4096");
    po.tensor_parallel = 2;
    po.balance = GP_BALANCE_TIME;
    CHECK_FAILS(gp_pipeline_new(m, &o, &po, SEED, &p), GP_UNSUPPORTED,
                "balance time with 2 tensor-parallel shards: a shard layer cannot be timed");
    po.balance = GP_BALANCE_COST;
    po.label_smoothing = 1.0;
    CHECK_FAILS(gp_pipeline_new(m, &o, &po, SEED, &p), GP_INVALID_ARGUMENT,
                "label_smoothing 1: expected in [0, 1)");
    po.label_smoothing = 0;
    /* The ConvNet: its classifier head of 10 classes splits over 2 (its convolutions are
     * replicated), not over 4. */
    gp_model *c = gp_test_net_build(GP_TEST_CONVNET);
    gp_optim_opts oc = gp_test_net_optim(GP_TEST_CONVNET);
    gp_pipeline_opts pc = {.stages = 1, .micro_batches = 2, .tensor_parallel = 4};
    CHECK_FAILS(gp_pipeline_new(c, &oc, &pc, SEED, &p), GP_CONFIG,
                "(linear): out_features = 10 does not divide evenly over mesh axis \"tensor\" of "
                "size 4");
    gp_model_free(c);
    /* Nothing was allocated on the failures. */
    for (int i = 0; i < gp_model_nparam_tensors(m); i++) {
        gp_param_info pi;
        CHECK_OK(gp_model_param(m, i, &pi));
        CHECK(pi.value->data == NULL);
    }
    gp_model_free(m);
}

/* A shard that runs out of memory stops every worker of the step (the others waiting in a
 * collective or for a message are woken by the abort of every transport): the step fails with
 * the limit's status, no worker holds an activation after it, and the next step fails the same
 * way. */
static void shard_failure(void) {
    gp_model *m = gp_test_net_build(GP_TEST_TRANSFORMER);
    gp_optim_opts o = gp_test_net_optim(GP_TEST_TRANSFORMER);
    /* Enough for the plan at one example per micro-batch (the batch is not given), too little
     * for the step's micro-batches of 4. */
    gp_pipeline_opts po = {.stages = 2, .micro_batches = 2, .tensor_parallel = 2,
                           .memory_limit = 224 * 1024, .comm_timeout_s = 30};
    gp_pipeline *p;
    REQUIRE_OK(gp_pipeline_new(m, &o, &po, SEED, &p));
    for (int rep = 0; rep < 2; rep++) {
        gp_test_batch b;
        batch_of(rep, &b);
        float loss = -1;
        const gp_status st = gp_pipeline_step(p, &b.x, &b.y_t, &loss);
        if (st != GP_MEMORY_LIMIT) printf("shard_failure: %s\n", gp_last_error());
        CHECK_EQ_INT(st, GP_MEMORY_LIMIT);
        CHECK(strstr(gp_last_error(), "shard") != NULL);
        CHECK(loss == -1);
        for (int k = 0; k < 2; k++)
            for (int t = 0; t < 2; t++) {
                gp_mem_stats ms;
                CHECK_OK(gp_pipeline_mem_stats_shard(p, k, t, &ms));
                CHECK_EQ_INT(ms.live[GP_MEM_ACTIVATIONS], 0);
            }
    }
    gp_pipeline_free(p);
    gp_model_free(m);
}

/* The ConvNet over T = 2 (its head split, the rest replicated) against T = 1. */
static void convnet(void) {
    gp_optim_opts o = gp_test_net_optim(GP_TEST_CONVNET);
    float l1[3], l2[3];
    for (int T = 1; T <= 2; T++) {
        gp_model *m = gp_test_net_build(GP_TEST_CONVNET);
        gp_pipeline_opts po = {.stages = 2, .micro_batches = 2, .tensor_parallel = T};
        gp_pipeline *p;
        REQUIRE_OK(gp_pipeline_new(m, &o, &po, SEED, &p));
        for (int s = 0; s < 3; s++) {
            gp_test_batch b;
            gp_test_net_batch(GP_TEST_CONVNET, BATCH, 500 + (uint64_t)s, &b);
            REQUIRE_OK(gp_pipeline_step(p, &b.x, &b.y_t, T == 1 ? &l1[s] : &l2[s]));
        }
        gp_pipeline_free(p);
        gp_model_free(m);
    }
    for (int s = 0; s < 3; s++) CHECK(fabs((double)l1[s] - l2[s]) <= 1e-5 * fabs((double)l1[s]));
    printf("convnet T = 2 vs T = 1: losses %.7f/%.7f ... %.7f/%.7f\n", l2[0], l1[0], l2[2], l1[2]);
}

int main(void) {
    const bool quick = getenv("GP_TEST_QUICK") != NULL;
    gp_scratch_init("test_pipeline_tp");
    errors();
    across_t();
    smoothing_across_t();
    fixed_t(2, 4, quick);
    if (!quick) fixed_t(4, 2, quick);
    memory();
    resume_across_t();
    shard_failure();
    convnet();
    gp_scratch_cleanup();
    return gp_test_finish("test_pipeline_tp");
}
