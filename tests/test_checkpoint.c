/* Checkpoints through the library: 2N steps straight equal N steps, a save, a fresh model that
 * loads the file and N more steps (losses and params_fnv1a64 bit for bit), on one device and on
 * pipelines, also across K (saved on K = 4, resumed on 1, 2, 3 and the reverse), for the
 * Transformer with dropout (AdamW) and the ConvNet with batch norm (SGD with momentum). Then
 * loads that must fail (another model, another optimizer, a missing or extra tensor) name the
 * file and the tensor and leave the model unchanged. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "testutil.h"

#define M_MICRO 2
#define BATCH 4
#define NSTEPS 3 /* N: 2N straight vs N + N */

/* The pipeline test's networks, with a cosine schedule for the Transformer so a resumed run
 * must follow it. */
static gp_optim_opts optim_for(gp_test_net net) {
    gp_optim_opts o = gp_test_net_optim(net);
    if (net == GP_TEST_TRANSFORMER) {
        o.warmup_steps = 2;
        o.total_steps = 2 * NSTEPS;
    }
    return o;
}

/* A training session on one device (K = 0) or a pipeline of K stages. */
typedef struct session {
    gp_test_net net;
    gp_model *m;
    gp_device *dev;
    gp_trainer *t;
    gp_pipeline *p;
    gp_optim_opts o;
} session;

static const uint64_t SEED = 91;

static void session_new(session *s, gp_test_net net, int K) {
    memset(s, 0, sizeof *s);
    s->net = net;
    s->m = gp_test_net_build(net);
    s->o = optim_for(net);
    if (K == 0) {
        REQUIRE_OK(gp_device_cpu_new("one", &s->dev));
        REQUIRE_OK(gp_model_init(s->m, s->dev, SEED));
        gp_trainer_opts to = {.micro_batches = M_MICRO};
        REQUIRE_OK(gp_trainer_new(s->m, &s->o, &to, &s->t));
    } else {
        gp_pipeline_opts po = {.stages = K, .micro_batches = M_MICRO};
        REQUIRE_OK(gp_pipeline_new(s->m, &s->o, &po, SEED, &s->p));
    }
}

static void session_free(session *s) {
    gp_trainer_free(s->t);
    gp_pipeline_free(s->p);
    gp_model_free(s->m);
    gp_device_free(s->dev);
}

static int session_step(const session *s) {
    return s->t ? gp_trainer_steps_done(s->t) : gp_pipeline_steps_done(s->p);
}

static void session_run(session *s, int nsteps, float *losses) {
    for (int i = 0; i < nsteps; i++) {
        gp_test_batch b;
        int step = session_step(s);
        gp_test_net_batch(s->net, BATCH, 500 + (uint64_t)step, &b);
        REQUIRE_OK(s->t ? gp_trainer_step(s->t, &b.x, &b.y_t, &losses[step])
                        : gp_pipeline_step(s->p, &b.x, &b.y_t, &losses[step]));
    }
}

static void session_save(session *s, const char *path) {
    gp_checkpoint_kv kv[] = {{"note", "test"}};
    REQUIRE_OK(gp_checkpoint_save(path, s->m, 0, gp_model_nlayers(s->m), &s->o, session_step(s),
                                  kv, 1));
}

static void session_load(session *s, const char *path) {
    gp_safetensors *f;
    REQUIRE_OK(gp_safetensors_read(path, &f));
    int step;
    REQUIRE_OK(gp_checkpoint_step(f, &step));
    CHECK_EQ_INT(step, NSTEPS);
    REQUIRE_OK(gp_checkpoint_load(f, s->m, &s->o));
    REQUIRE_OK(s->t ? gp_trainer_set_step(s->t, step) : gp_pipeline_set_step(s->p, step));
    CHECK(strcmp(gp_safetensors_meta(f, "note"), "test") == 0);
    gp_safetensors_free(f);
}

/* Straight 2N steps on K_ref; N steps on K_save, saved; loaded on K_resume for N more. */
static void check_resume(gp_test_net net, int K_ref, int K_save, int K_resume) {
    float want[2 * NSTEPS], got[2 * NSTEPS];
    session a, b, c;
    session_new(&a, net, K_ref);
    session_run(&a, 2 * NSTEPS, want);
    uint64_t want_hash = gp_model_params_fnv1a64(a.m);
    session_free(&a);

    const char *path = gp_scratch_path("ckpt.safetensors");
    session_new(&b, net, K_save);
    session_run(&b, NSTEPS, got);
    session_save(&b, path);
    session_free(&b);

    session_new(&c, net, K_resume);
    session_load(&c, path);
    session_run(&c, NSTEPS, got);
    uint64_t got_hash = gp_model_params_fnv1a64(c.m);
    session_free(&c);
    remove(path);

    int same = memcmp(want, got, sizeof want) == 0 && want_hash == got_hash;
    if (!same) {
        fprintf(stderr, "%s: K %d straight vs K %d saved, K %d resumed: hash %016llx vs %016llx\n",
                net == GP_TEST_TRANSFORMER ? "transformer" : "convnet", K_ref, K_save, K_resume,
                (unsigned long long)want_hash, (unsigned long long)got_hash);
        for (int i = 0; i < 2 * NSTEPS; i++)
            fprintf(stderr, "  step %d: %.9g vs %.9g\n", i, (double)want[i], (double)got[i]);
    }
    CHECK(same);
}

/* Loads that must fail, naming file and tensor, and leave the model's bits unchanged. */
static void check_bad_loads(void) {
    const char *path = gp_scratch_path("good.safetensors");
    session s;
    session_new(&s, GP_TEST_TRANSFORMER, 0);
    float l[NSTEPS];
    session_run(&s, 1, l);
    session_save(&s, path);

    gp_safetensors *f;
    REQUIRE_OK(gp_safetensors_read(path, &f));
    /* Another model: the same kinds of layers, other widths. */
    gp_transformer_config wide = {.vocab = 64, .dim = 48, .heads = 4, .d_ff = 64, .layers = 4,
                                  .seq_len = 16};
    gp_model *other;
    REQUIRE_OK(gp_model_transformer(&wide, &other));
    gp_device *dev;
    REQUIRE_OK(gp_device_cpu_new("other", &dev));
    REQUIRE_OK(gp_model_init(other, dev, 3));
    uint64_t before = gp_model_params_fnv1a64(other);
    CHECK_FAILS(gp_checkpoint_load(f, other, NULL), GP_SHAPE, "layers.0.weight\" has shape (64, 32)");
    CHECK(gp_model_params_fnv1a64(other) == before);
    gp_model_free(other);
    /* Another family altogether. */
    gp_model *conv = gp_test_net_build(GP_TEST_CONVNET);
    REQUIRE_OK(gp_model_init(conv, dev, 3));
    before = gp_model_params_fnv1a64(conv);
    CHECK_FAILS(gp_checkpoint_load(f, conv, NULL), GP_FORMAT, "a checkpoint of another model");
    CHECK(gp_model_params_fnv1a64(conv) == before);
    gp_model_free(conv);
    gp_device_free(dev);
    /* The same model with another optimizer. */
    gp_optim_opts sgd = gp_sgd_defaults(0.1f, 0.9f);
    CHECK_FAILS(gp_checkpoint_load(f, s.m, &sgd), GP_FORMAT, "expected sgd state");
    gp_safetensors_free(f);

    /* A file missing one tensor, and one with a tensor the model lacks. */
    gp_safetensors_writer *w;
    float buf[64 * 32];
    memset(buf, 0, sizeof buf);
    REQUIRE_OK(gp_safetensors_writer_new(&w));
    REQUIRE_OK(gp_safetensors_writer_add(w, "layers.0.weight", GP_F32, gp_shape2(64, 32), buf));
    REQUIRE_OK(gp_safetensors_writer_write(w, path));
    gp_safetensors_writer_free(w);
    REQUIRE_OK(gp_safetensors_read(path, &f));
    before = gp_model_params_fnv1a64(s.m);
    CHECK_FAILS(gp_checkpoint_load(f, s.m, NULL), GP_FORMAT, "no tensor \"layers.1.weight\"");
    CHECK_FAILS(gp_checkpoint_load(f, s.m, &s.o), GP_FORMAT, "not a gpipe checkpoint");
    CHECK(gp_model_params_fnv1a64(s.m) == before);
    gp_safetensors_free(f);
    REQUIRE_OK(gp_safetensors_writer_new(&w));
    REQUIRE_OK(gp_safetensors_writer_add(w, "layers.9.weight", GP_F32, gp_shape1(4), buf));
    REQUIRE_OK(gp_safetensors_writer_write(w, path));
    gp_safetensors_writer_free(w);
    REQUIRE_OK(gp_safetensors_read(path, &f));
    CHECK_FAILS(gp_checkpoint_load(f, s.m, NULL), GP_FORMAT, "\"layers.9.weight\" is not a parameter");
    CHECK_FAILS(gp_checkpoint_step(f, &(int){0}), GP_FORMAT, "\"step\"");
    gp_safetensors_free(f);
    CHECK(gp_model_params_fnv1a64(s.m) == before);
    /* Saving refuses what is not there. */
    CHECK_FAILS(gp_checkpoint_save(path, s.m, 2, 1, &s.o, 1, NULL, 0), GP_INVALID_ARGUMENT,
                "layer range");
    session_free(&s);
    remove(path);
}

int main(void) {
    gp_scratch_init("test_checkpoint");
    gp_blas_set_threads(1); /* pipelines run one BLAS thread per stage: compare like with like */
    for (int net = 0; net < 2; net++) {
        check_resume((gp_test_net)net, 0, 0, 0); /* one device */
        check_resume((gp_test_net)net, 2, 2, 2); /* a pipeline */
        for (int K = 1; K <= 3; K++) {
            check_resume((gp_test_net)net, 0, 4, K); /* saved on 4 stages, resumed on K */
            check_resume((gp_test_net)net, 0, K, 4); /* and the reverse */
        }
        check_resume((gp_test_net)net, 0, 0, 3); /* one device to a pipeline */
    }
    check_bad_loads();
    gp_scratch_cleanup();
    return gp_test_finish("test_checkpoint");
}
