/* Checkpoints through the library: 2N steps straight equal N steps, a save, a fresh model that
 * loads the file and N more steps (losses and params_fnv1a64 bit for bit), on one device and on
 * pipelines, also across K (saved on K = 4, resumed on 1, 2, 3 and the reverse), for the
 * Transformer with dropout (AdamW) and the ConvNet with batch norm (SGD with momentum). Then
 * loads that must fail (another model, another optimizer, a missing or extra tensor) name the
 * file and the tensor and leave the model unchanged. Multi-part sets as a multi-process pipeline
 * writes them (one part per stage and an index committing them) resume on any K and on one
 * device bit for bit; damaged parts and malformed indexes are named errors that change
 * nothing. gp_checkpoint_check_model refuses another model's checkpoint from headers alone,
 * before the model is allocated. The Transformer with tied embeddings stores the tied matrix
 * once and resumes on any K, from one file or a set, bit for bit; a tied model and an untied
 * checkpoint (or the reverse) refuse each other. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "testutil.h"

#define M_MICRO 2
#define BATCH 4
#define NSTEPS 3 /* N: 2N straight vs N + N */

#define REQUIRE_FILE(f)                                                                    \
    do {                                                                                   \
        if (!(f)) {                                                                        \
            perror(__FILE__ ": a scratch file");                                           \
            exit(1);                                                                       \
        }                                                                                  \
    } while (0)

/* The pipeline test's networks, with a cosine schedule for the Transformer so a resumed run
 * must follow it. */
static gp_optim_opts optim_for(gp_test_net net) {
    gp_optim_opts o = gp_test_net_optim(net);
    if (net != GP_TEST_CONVNET) {
        o.warmup_steps = 2;
        o.total_steps = 2 * NSTEPS;
    }
    return o;
}

/* A training session on one device (K = 0: initialized by the caller on a device of its own)
 * or a pipeline of K stages (initializing the model itself). */
typedef struct session {
    gp_test_net net;
    int K;
    gp_model *m;
    gp_device *dev;
    gp_pipeline *p;
    gp_optim_opts o;
} session;

static const uint64_t SEED = 91;

static void session_new(session *s, gp_test_net net, int K) {
    memset(s, 0, sizeof *s);
    s->net = net;
    s->K = K;
    s->m = gp_test_net_build(net);
    s->o = optim_for(net);
    if (K == 0) {
        REQUIRE_OK(gp_device_cpu_new("one", &s->dev));
        REQUIRE_OK(gp_model_init(s->m, s->dev, SEED));
        s->p = gp_test_single(s->m, &s->o, M_MICRO);
    } else {
        gp_pipeline_opts po = {.stages = K, .micro_batches = M_MICRO};
        REQUIRE_OK(gp_pipeline_new(s->m, &s->o, &po, SEED, &s->p));
    }
}

static void session_free(session *s) {
    gp_pipeline_free(s->p);
    gp_model_free(s->m);
    gp_device_free(s->dev);
}

static int session_step(const session *s) {
    return gp_pipeline_steps_done(s->p);
}

static void session_run(session *s, int nsteps, float *losses) {
    for (int i = 0; i < nsteps; i++) {
        gp_test_batch b;
        int step = session_step(s);
        gp_test_net_batch(s->net, BATCH, 500 + (uint64_t)step, &b);
        REQUIRE_OK(gp_pipeline_step(s->p, &b.x, &b.y_t, &losses[step]));
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
    REQUIRE_OK(gp_pipeline_set_step(s->p, step));
    CHECK(strcmp(gp_safetensors_meta(f, "note"), "test") == 0);
    gp_safetensors_free(f);
}

/* Straight 2N steps on K_ref; N steps on K_save, saved; loaded on K_resume for N more. */
static void check_resume(gp_test_net net, int K_ref, int K_save, int K_resume) {
    float want[2 * NSTEPS], got[2 * NSTEPS];
    session a, b, c;
    session_new(&a, net, K_ref);
    session_run(&a, 2 * NSTEPS, want);
    uint64_t want_hash = gp_test_hash(a.m);
    session_free(&a);

    const char *path = gp_scratch_path("ckpt.safetensors");
    session_new(&b, net, K_save);
    session_run(&b, NSTEPS, got);
    session_save(&b, path);
    session_free(&b);

    session_new(&c, net, K_resume);
    session_load(&c, path);
    session_run(&c, NSTEPS, got);
    uint64_t got_hash = gp_test_hash(c.m);
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
    uint64_t before = gp_test_hash(other);
    CHECK_FAILS(gp_checkpoint_load(f, other, NULL), GP_SHAPE, "layers.0.weight\" has shape (64, 32)");
    CHECK(gp_test_hash(other) == before);
    gp_model_free(other);
    /* Another family altogether. */
    gp_model *conv = gp_test_net_build(GP_TEST_CONVNET);
    REQUIRE_OK(gp_model_init(conv, dev, 3));
    before = gp_test_hash(conv);
    CHECK_FAILS(gp_checkpoint_load(f, conv, NULL), GP_FORMAT, "a checkpoint of another model");
    CHECK(gp_test_hash(conv) == before);
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
    before = gp_test_hash(s.m);
    CHECK_FAILS(gp_checkpoint_load(f, s.m, NULL), GP_FORMAT, "no tensor \"layers.1.weight\"");
    CHECK_FAILS(gp_checkpoint_load(f, s.m, &s.o), GP_FORMAT, "not a gpipe checkpoint");
    CHECK(gp_test_hash(s.m) == before);
    gp_safetensors_free(f);
    REQUIRE_OK(gp_safetensors_writer_new(&w));
    REQUIRE_OK(gp_safetensors_writer_add(w, "layers.9.weight", GP_F32, gp_shape1(4), buf));
    REQUIRE_OK(gp_safetensors_writer_write(w, path));
    gp_safetensors_writer_free(w);
    REQUIRE_OK(gp_safetensors_read(path, &f));
    CHECK_FAILS(gp_checkpoint_load(f, s.m, NULL), GP_FORMAT, "\"layers.9.weight\" is not a parameter");
    CHECK_FAILS(gp_checkpoint_step(f, &(int){0}), GP_FORMAT, "\"step\"");
    gp_safetensors_free(f);
    CHECK(gp_test_hash(s.m) == before);
    /* Saving refuses what is not there. */
    CHECK_FAILS(gp_checkpoint_save(path, s.m, 2, 1, &s.o, 1, NULL, 0), GP_INVALID_ARGUMENT,
                "layer range");
    session_free(&s);
    remove(path);
}

/* A multi-part set of s's model as the MPI launcher writes it: one part per stage of a K-stage
 * split (the pipeline's own on K stages), each written alone, then the index. */
static void session_save_parts(session *s, int K, const char *base, const char **index) {
    int L = gp_model_nlayers(s->m), step = session_step(s);
    gp_checkpoint_part parts[8];
    static char files[8][64], paths[8][600];
    for (int k = 0; k < K; k++) {
        parts[k].first = s->K ? gp_pipeline_cell_first(s->p, k) : k * L / K;
        parts[k].last = k + 1 < K ? (s->K ? gp_pipeline_cell_first(s->p, k + 1) : (k + 1) * L / K)
                                  : L;
        snprintf(files[k], sizeof files[k], "%s-%05d-of-%05d.safetensors", base, k + 1, K);
        snprintf(paths[k], sizeof paths[k], "%s", gp_scratch_path(files[k]));
        parts[k].file = files[k];
        REQUIRE_OK(gp_checkpoint_save(paths[k], s->m, parts[k].first, parts[k].last, &s->o, step,
                                      NULL, 0));
        REQUIRE_OK(gp_checkpoint_file_info(paths[k], &parts[k].bytes, &parts[k].crc32));
    }
    char name[128];
    snprintf(name, sizeof name, "%s.safetensors.index.json", base);
    *index = gp_scratch_path(name);
    gp_checkpoint_kv kv[] = {{"note", "parts"}};
    REQUIRE_OK(gp_checkpoint_commit(*index, s->m, parts, K, &s->o, step, kv, 1));
}

static void remove_set(const char *base, int K) {
    char name[128];
    for (int k = 0; k < K; k++) {
        snprintf(name, sizeof name, "%s-%05d-of-%05d.safetensors", base, k + 1, K);
        remove(gp_scratch_path(name));
    }
    snprintf(name, sizeof name, "%s.safetensors.index.json", base);
    remove(gp_scratch_path(name));
}

/* Straight 2N steps on one device; N steps on K_save stages saved as a set; resumed on
 * K_resume (0: one device, through gp_checkpoint_load_layers; else each stage's layers through
 * gp_pipeline_checkpoint_load). */
static void check_resume_parts(gp_test_net net, int K_save, int K_resume) {
    float want[2 * NSTEPS], got[2 * NSTEPS];
    session a, b, c;
    session_new(&a, net, 0);
    session_run(&a, 2 * NSTEPS, want);
    uint64_t want_hash = gp_test_hash(a.m);
    session_free(&a);

    const char *index;
    session_new(&b, net, K_save);
    session_run(&b, NSTEPS, got);
    session_save_parts(&b, K_save, "set", &index);
    session_free(&b);

    session_new(&c, net, K_resume);
    gp_checkpoint *ck;
    REQUIRE_OK(gp_checkpoint_open(index, &ck));
    CHECK_EQ_INT(gp_checkpoint_nparts(ck), K_save);
    CHECK(gp_checkpoint_meta(ck, "note") && strcmp(gp_checkpoint_meta(ck, "note"), "parts") == 0);
    int step = -1;
    REQUIRE_OK(gp_checkpoint_saved_step(ck, &step));
    CHECK_EQ_INT(step, NSTEPS);
    REQUIRE_OK(gp_pipeline_checkpoint_load(c.p, ck));
    gp_checkpoint_close(ck);
    REQUIRE_OK(gp_pipeline_set_step(c.p, step));
    session_run(&c, NSTEPS, got);
    uint64_t got_hash = gp_test_hash(c.m);
    session_free(&c);
    remove_set("set", K_save);
    if (memcmp(want, got, sizeof want) != 0 || want_hash != got_hash)
        fprintf(stderr, "set saved on K %d, resumed on K %d: hash %016llx vs %016llx\n", K_save,
                K_resume, (unsigned long long)want_hash, (unsigned long long)got_hash);
    CHECK(memcmp(want, got, sizeof want) == 0 && want_hash == got_hash);
}

/* Rewrites the scratch file name with its first `from` replaced by `to`. */
static void edit_file(const char *name, const char *from, const char *to) {
    const char *path = gp_scratch_path(name);
    FILE *f = fopen(path, "rb");
    REQUIRE_FILE(f);
    static char buf[1 << 16];
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = '\0';
    char *at = strstr(buf, from);
    REQUIRE_FILE(at);
    char out[(1 << 16) + 256];
    snprintf(out, sizeof out, "%.*s%s%s", (int)(at - buf), buf, to, at + strlen(from));
    f = fopen(path, "wb");
    REQUIRE_FILE(f);
    fputs(out, f);
    fclose(f);
}

/* Sets that must not load: each error names the index or the part and changes nothing. */
static void check_bad_sets(void) {
    session s;
    session_new(&s, GP_TEST_TRANSFORMER, 0);
    float l[NSTEPS];
    session_run(&s, 1, l);
    const char *index;
    char idx_copy[700];
    session_save_parts(&s, 2, "bad", &index);
    snprintf(idx_copy, sizeof idx_copy, "%s", index);
    uint64_t before = gp_test_hash(s.m);
    gp_checkpoint *ck;

    /* One byte of the second part flipped after the commit. */
    const char *p2 = gp_scratch_path("bad-00002-of-00002.safetensors");
    FILE *f = fopen(p2, "r+b");
    REQUIRE_FILE(f);
    fseek(f, -40, SEEK_END);
    int ch = fgetc(f);
    fseek(f, -40, SEEK_END);
    fputc(ch ^ 1, f);
    fclose(f);
    REQUIRE_OK(gp_checkpoint_open(idx_copy, &ck));
    CHECK_FAILS(gp_checkpoint_load_layers(ck, s.m, 0, gp_model_nlayers(s.m), &s.o), GP_FORMAT,
                "part 2 of 2 is");
    CHECK(gp_test_hash(s.m) == before); /* part 1 was fine, yet nothing copied */
    /* The first part's layers alone still load: a range reads only the parts it needs. */
    int split = gp_model_nlayers(s.m) / 2;
    REQUIRE_OK(gp_checkpoint_load_layers(ck, s.m, 0, split, &s.o));
    CHECK_FAILS(gp_checkpoint_load_layers(ck, s.m, split - 1, split + 1, &s.o), GP_FORMAT,
                "damaged or replaced");
    gp_checkpoint_close(ck);
    /* A missing part. */
    remove(p2);
    REQUIRE_OK(gp_checkpoint_open(idx_copy, &ck));
    CHECK_FAILS(gp_checkpoint_load_layers(ck, s.m, 0, gp_model_nlayers(s.m), &s.o), GP_IO,
                "cannot open");
    gp_checkpoint_close(ck);
    /* A part file opened alone for the whole model. */
    REQUIRE_OK(gp_checkpoint_open(gp_scratch_path("bad-00001-of-00002.safetensors"), &ck));
    CHECK_FAILS(gp_checkpoint_load_layers(ck, s.m, 0, gp_model_nlayers(s.m), &s.o), GP_FORMAT,
                "holds layers 0-");
    gp_checkpoint_close(ck);
    remove_set("bad", 2);

    /* Malformed indexes: each a named error at open. */
    static const char *const edits[][3] = {
        {"\"file\":\t\"bad-00002", "\"file\":\t\"../bad-00002", "a file name in the index's folder"},
        {"\"crc32\":\t\"", "\"crc32\":\t\"z", "\"crc32\" must be 8 hex digits"},
        {"\"parts\":", "\"parts\": [], \"x\":", "expected an array of 1..4096 parts"},
        {"\"format\":", "\"format\": 3, \"y\":", "is not a string"},
        {"{", "[", "not a JSON object"},
    };
    for (size_t i = 0; i < sizeof edits / sizeof edits[0]; i++) {
        session_save_parts(&s, 2, "bad", &index);
        edit_file("bad.safetensors.index.json", edits[i][0], edits[i][1]);
        CHECK_FAILS(gp_checkpoint_open(idx_copy, &ck), GP_FORMAT, edits[i][2]);
        CHECK(strstr(gp_last_error(), "bad.safetensors.index.json") != NULL);
        gp_checkpoint_close(ck); /* NULL after a failure */
        remove_set("bad", 2);
    }
    /* A gap between the parts' layers. */
    session_save_parts(&s, 3, "gap", &index);
    char from[64], to[64];
    snprintf(from, sizeof from, "\"layers\":\t[%d,", gp_model_nlayers(s.m) / 3);
    snprintf(to, sizeof to, "\"layers\":\t[%d,", gp_model_nlayers(s.m) / 3 + 1);
    edit_file("gap.safetensors.index.json", from, to);
    CHECK_FAILS(gp_checkpoint_open(index, &ck), GP_FORMAT, "without gaps");
    remove_set("gap", 3);
    /* Committing parts that do not cover the model is refused. */
    gp_checkpoint_part one = {"x.safetensors", 0, 1, 0, 0};
    CHECK_FAILS(gp_checkpoint_commit(gp_scratch_path("x.safetensors.index.json"), s.m, &one, 1,
                                     &s.o, 1, NULL, 0),
                GP_INVALID_ARGUMENT, "covering 0..");
    session_free(&s);
}

/* Flips the bit 0x01 of the byte `back` bytes before the end of path. */
static void flip_from_end(const char *path, long back) {
    FILE *f = fopen(path, "r+b");
    REQUIRE_FILE(f);
    fseek(f, -back, SEEK_END);
    int ch = fgetc(f);
    fseek(f, -back, SEEK_END);
    fputc(ch ^ 1, f);
    fclose(f);
}

/* gp_checkpoint_check_model on models never initialized: a one-file checkpoint and a set of it
 * pass; another model's widths are refused naming the tensor and both shapes, another family by
 * its layers, a part opened alone for the whole model, a part of another size than the index
 * committed; and nothing of the model is allocated. Loading still checks every tensor's bytes:
 * a flipped byte in optimizer state the load does not copy fails it, the model unchanged. */
static void check_model_headers(void) {
    session s;
    session_new(&s, GP_TEST_TRANSFORMER, 0);
    float l[NSTEPS];
    session_run(&s, 1, l);
    char path[600];
    snprintf(path, sizeof path, "%s", gp_scratch_path("hdr.safetensors"));
    session_save(&s, path);
    const char *index;
    session_save_parts(&s, 2, "hdr", &index);
    char idx[600], part1[600], part2[600];
    snprintf(idx, sizeof idx, "%s", index);
    snprintf(part1, sizeof part1, "%s", gp_scratch_path("hdr-00001-of-00002.safetensors"));
    snprintf(part2, sizeof part2, "%s", gp_scratch_path("hdr-00002-of-00002.safetensors"));

    gp_model *fresh = gp_test_net_build(GP_TEST_TRANSFORMER);
    gp_model *conv = gp_test_net_build(GP_TEST_CONVNET);
    gp_transformer_config wide = {.vocab = 64, .dim = 48, .heads = 4, .d_ff = 64, .layers = 4,
                                  .seq_len = 16};
    gp_model *other;
    REQUIRE_OK(gp_model_transformer(&wide, &other));
    gp_checkpoint *ck;
    REQUIRE_OK(gp_checkpoint_open(path, &ck));
    CHECK_OK(gp_checkpoint_check_model(ck, fresh));
    CHECK(gp_checkpoint_part_path(ck, 0) && strcmp(gp_checkpoint_part_path(ck, 0), path) == 0);
    CHECK(gp_checkpoint_part_path(ck, 1) == NULL);
    CHECK_FAILS(gp_checkpoint_check_model(ck, other), GP_SHAPE,
                "tensor \"layers.0.weight\" has shape (64, 32), the model's is (64, 48)");
    CHECK(strstr(gp_last_error(), path) != NULL);
    CHECK_FAILS(gp_checkpoint_check_model(ck, conv), GP_FORMAT, "a checkpoint of another model");
    gp_checkpoint_close(ck);

    REQUIRE_OK(gp_checkpoint_open(idx, &ck));
    CHECK_OK(gp_checkpoint_check_model(ck, fresh));
    CHECK(gp_checkpoint_part_path(ck, 1) && strcmp(gp_checkpoint_part_path(ck, 1), part2) == 0);
    CHECK_FAILS(gp_checkpoint_check_model(ck, other), GP_SHAPE, "the model's is (64, 48)");
    FILE *f = fopen(part2, "ab");
    REQUIRE_FILE(f);
    fputc(0, f);
    fclose(f);
    CHECK_FAILS(gp_checkpoint_check_model(ck, fresh), GP_FORMAT, "the index committed");
    gp_checkpoint_close(ck);
    REQUIRE_OK(gp_checkpoint_open(part1, &ck));
    CHECK_FAILS(gp_checkpoint_check_model(ck, fresh), GP_FORMAT, "holds layers 0-");
    gp_checkpoint_close(ck);
    gp_param_info pi;
    REQUIRE_OK(gp_model_param(fresh, 0, &pi));
    CHECK(pi.value->data == NULL); /* checked from the headers alone */

    /* The last bytes of the file are optimizer state, which a load without o does not copy. */
    flip_from_end(path, 4);
    REQUIRE_OK(gp_checkpoint_open(path, &ck));
    uint64_t before = gp_test_hash(s.m);
    CHECK_OK(gp_checkpoint_check_model(ck, fresh)); /* headers are fine */
    CHECK_FAILS(gp_checkpoint_load_layers(ck, s.m, 0, gp_model_nlayers(s.m), NULL), GP_FORMAT,
                "CRC-32");
    CHECK(gp_test_hash(s.m) == before);
    gp_checkpoint_close(ck);
    gp_model_free(fresh);
    gp_model_free(conv);
    gp_model_free(other);
    remove(path);
    remove_set("hdr", 2);
    session_free(&s);
}

/* A pipeline on threads saves one file through gp_pipeline_checkpoint_save. */
static void check_pipeline_save_threads(void) {
    session s;
    session_new(&s, GP_TEST_CONVNET, 2);
    float l[NSTEPS];
    session_run(&s, 1, l);
    char written[700], base[600];
    snprintf(base, sizeof base, "%s", gp_scratch_path("pipe"));
    REQUIRE_OK(gp_pipeline_checkpoint_save(s.p, base, 1, NULL, 0, written, sizeof written));
    CHECK(strcmp(written + strlen(written) - strlen("pipe.safetensors"), "pipe.safetensors") == 0);
    gp_checkpoint *ck;
    REQUIRE_OK(gp_checkpoint_open(written, &ck));
    CHECK_EQ_INT(gp_checkpoint_nparts(ck), 1);
    uint64_t h = gp_test_hash(s.m);
    REQUIRE_OK(gp_pipeline_checkpoint_load(s.p, ck));
    CHECK(gp_test_hash(s.m) == h);
    gp_checkpoint_close(ck);
    remove(written);
    session_free(&s);
}

/* The whole of a file (malloc'd), *n its size. */
static unsigned char *slurp(const char *path, long *n) {
    FILE *f = fopen(path, "rb");
    REQUIRE_FILE(f);
    fseek(f, 0, SEEK_END);
    *n = ftell(f);
    rewind(f);
    unsigned char *b = malloc((size_t)*n + 1);
    REQUIRE_FILE(b && fread(b, 1, (size_t)*n, f) == (size_t)*n);
    fclose(f);
    return b;
}

/* A save in the background (gp_pipeline_checkpoint_begin/finish) on 2 stages: the file holds
 * the parameters of the step it began at although two more steps ran while it was written,
 * byte for byte what gp_pipeline_checkpoint_save writes at that step; one save at a time; a
 * write that fails is reported by the finish, naming the file, and the next save goes on. */
static void check_pipeline_save_background(void) {
    session s;
    session_new(&s, GP_TEST_TRANSFORMER, 2);
    float l[2 * NSTEPS];
    session_run(&s, 1, l);
    char sync_base[600], bg_base[600], path[700];
    snprintf(sync_base, sizeof sync_base, "%s", gp_scratch_path("sync"));
    snprintf(bg_base, sizeof bg_base, "%s", gp_scratch_path("bg"));
    gp_checkpoint_kv kv[] = {{"note", "background"}};
    REQUIRE_OK(gp_pipeline_checkpoint_save(s.p, sync_base, 1, kv, 1, NULL, 0));
    gp_checkpoint_saved d;
    REQUIRE_OK(gp_pipeline_checkpoint_finish(s.p, true, &d));
    CHECK_EQ_INT(d.step, -1); /* nothing in flight */
    CHECK(!gp_test_thread_named("gp-ckpt-writer", 0));
    REQUIRE_OK(gp_pipeline_checkpoint_begin(s.p, bg_base, 1, kv, 1));
    CHECK(gp_test_thread_named("gp-ckpt-writer", 10)); /* the writer says what it is */
    CHECK_EQ_INT(gp_pipeline_checkpoint_begin(s.p, bg_base, 1, kv, 1), GP_INVALID_ARGUMENT);
    CHECK(strstr(gp_last_error(), "the save of step 1 is still in flight") != NULL);
    session_run(&s, 2, l); /* the parameters move on while the copy is written */
    REQUIRE_OK(gp_pipeline_checkpoint_finish(s.p, true, &d));
    CHECK_EQ_INT(d.step, 1);
    CHECK(!d.pending);
    snprintf(path, sizeof path, "%s.safetensors", bg_base);
    CHECK(strcmp(d.path, path) == 0);
    long na, nb;
    unsigned char *a = slurp(path, &na);
    snprintf(path, sizeof path, "%s.safetensors", sync_base);
    unsigned char *b = slurp(path, &nb);
    CHECK(na == nb && memcmp(a, b, (size_t)na) == 0);
    free(a);
    free(b);
    remove(path);
    snprintf(path, sizeof path, "%s.safetensors", bg_base);
    remove(path);
    /* A folder that is not there: the copy succeeds, the write fails, the finish says so. */
    char missing[700];
    snprintf(missing, sizeof missing, "%s/none/ckpt", gp_scratch_path("bg_missing"));
    REQUIRE_OK(gp_pipeline_checkpoint_begin(s.p, missing, 3, NULL, 0));
    session_run(&s, 1, l);
    CHECK_EQ_INT(gp_pipeline_checkpoint_finish(s.p, true, &d), GP_IO);
    CHECK(strstr(gp_last_error(), "none/ckpt.safetensors") != NULL);
    /* Reported once: the next save begins and finishes. */
    REQUIRE_OK(gp_pipeline_checkpoint_begin(s.p, bg_base, 4, NULL, 0));
    REQUIRE_OK(gp_pipeline_checkpoint_finish(s.p, true, &d));
    CHECK_EQ_INT(d.step, 4);
    remove(path);
    /* Freed with a save in flight: written first, nothing is cut short. */
    REQUIRE_OK(gp_pipeline_checkpoint_begin(s.p, bg_base, 4, NULL, 0));
    session_free(&s);
    gp_checkpoint *ck;
    REQUIRE_OK(gp_checkpoint_open(path, &ck));
    gp_checkpoint_close(ck);
    remove(path);
}

/* A checkpoint written before parameters lived in flat blocks (tests/data/
 * convnet_before_flat_step3.safetensors: the test ConvNet after 3 steps of session_run on one
 * device, seed 91, SGD with momentum, batch-norm buffers) still loads with every value exactly as
 * stored, and resumes: 3 more steps on one device and on 2 stages give the same bits, and where
 * the old version recorded its own continuation (OpenBLAS core Zen, one thread), the same first
 * loss (the forward pass from the loaded values) within an ulp: since the 14x14 convolution's
 * examples go into one GEMM in chunks, its outputs round as that GEMM's shape makes them (the old
 * first loss 0x1.475d9cp+1, now 0x1.475d9ep+1). Its later bits differ by design: a
 * convolution's weight gradient now adds its examples in groups (kernels/cpu/conv_kernels.c),
 * which rounds differently from the old example-by-example sum (the old continuation's hash was
 * 932a68b5d563ee46). */
static void check_before_flat(void) {
    const char *path = "tests/data/convnet_before_flat_step3.safetensors";
    gp_safetensors *f;
    REQUIRE_OK(gp_safetensors_read(path, &f));
    int step = -1;
    REQUIRE_OK(gp_checkpoint_step(f, &step));
    CHECK_EQ_INT(step, 3);
    uint64_t hash[2];
    float losses[2][2 * NSTEPS];
    for (int i = 0; i < 2; i++) {
        session s;
        session_new(&s, GP_TEST_CONVNET, i == 0 ? 0 : 2);
        REQUIRE_OK(gp_checkpoint_load(f, s.m, &s.o));
        int64_t differ = 0;
        for (int j = 0; j < gp_model_nparam_tensors(s.m); j++) {
            gp_param_info pi;
            REQUIRE_OK(gp_model_param(s.m, j, &pi));
            char name[128];
            snprintf(name, sizeof name, "layers.%d.%s", pi.layer, pi.name);
            size_t n = gp_tensor_nbytes(pi.value);
            float *want = malloc(n);
            REQUIRE_OK(gp_safetensors_get(f, name, GP_F32, &pi.value->shape, want));
            differ += memcmp(want, pi.value->data, n) != 0;
            free(want);
        }
        CHECK_EQ_INT(differ, 0);
        REQUIRE_OK(gp_pipeline_set_step(s.p, step));
        session_run(&s, NSTEPS, losses[i]);
        hash[i] = gp_test_hash(s.m);
        session_free(&s);
    }
    gp_safetensors_free(f);
    CHECK(hash[0] == hash[1]);
    CHECK(memcmp(losses[0] + NSTEPS, losses[1] + NSTEPS, NSTEPS * sizeof(float)) == 0);
    /* The old version's first loss after the load, recorded on OpenBLAS core Zen. Loading the
     * old layout exactly (checked bitwise above) leaves only the kernels' rounding between the
     * two: every OpenBLAS kernel set measured gives its bits, the im2col convolution path
     * (GP_CPU_CONV=im2col) 2 ulp more; 1e-6 relative (8 ulp) allows that on any processor,
     * where a wrongly loaded tensor moves the loss by far more. */
    const float old_first_loss = 0x1.475d9cp+1f;
    CHECK_NEAR(losses[0][NSTEPS], old_first_loss, 1e-6 * fabsf(old_first_loss));
    printf("before-flat checkpoint: resumed alike on 1 and 2 stages, the first loss %a against "
           "the old version's %a (OpenBLAS core %s); parameters after 3 steps %016llx\n",
           (double)losses[0][NSTEPS], (double)old_first_loss, gp_blas_corename(),
           (unsigned long long)hash[0]);
}

/* The tied Transformer's checkpoint holds the tied matrix once, under the embedding's name, and
 * says so in "tied"; the untied model refuses it, the tied model refuses an untied one, and a
 * file naming the head's weight of a tied model is refused rather than loaded beside it. */
static void check_tied_file(void) {
    char path[600], base[600];
    snprintf(path, sizeof path, "%s", gp_scratch_path("tied.safetensors"));
    snprintf(base, sizeof base, "%s", gp_scratch_path("tied"));
    session t, u;
    float losses[NSTEPS];
    session_new(&t, GP_TEST_TRANSFORMER_TIED, 2);
    session_run(&t, NSTEPS, losses);
    const int L = gp_model_nlayers(t.m);
    char head[64], tie[96];
    snprintf(head, sizeof head, "layers.%d.weight", L - 1);
    snprintf(tie, sizeof tie, "%s=layers.0.weight", head);
    REQUIRE_OK(gp_pipeline_checkpoint_save(t.p, base, NSTEPS, NULL, 0, NULL, 0));
    gp_safetensors *f;
    REQUIRE_OK(gp_safetensors_read(path, &f));
    CHECK(gp_safetensors_find(f, "layers.0.weight") && gp_safetensors_find(f, "layers.0.weight.adam_m"));
    CHECK(!gp_safetensors_find(f, head));
    char head_m[80];
    snprintf(head_m, sizeof head_m, "%s.adam_m", head);
    CHECK(!gp_safetensors_find(f, head_m));
    CHECK(gp_safetensors_meta(f, "tied") && strcmp(gp_safetensors_meta(f, "tied"), tie) == 0);
    session_new(&u, GP_TEST_TRANSFORMER, 0);
    CHECK_FAILS(gp_checkpoint_load(f, u.m, &u.o), GP_FORMAT, "the checkpoint's model ties");
    gp_safetensors_free(f);
    session_run(&u, NSTEPS, losses);
    session_save(&u, path);
    REQUIRE_OK(gp_safetensors_read(path, &f));
    CHECK_FAILS(gp_checkpoint_load(f, t.m, &t.o), GP_FORMAT, "ties no weights, this model ties");
    gp_safetensors_free(f);
    /* A foreign weights file (no gpipe metadata) with both matrices. */
    gp_safetensors_writer *w;
    static float buf[64 * 32];
    REQUIRE_OK(gp_safetensors_writer_new(&w));
    REQUIRE_OK(gp_safetensors_writer_add(w, "layers.0.weight", GP_F32, gp_shape2(64, 32), buf));
    REQUIRE_OK(gp_safetensors_writer_add(w, head, GP_F32, gp_shape2(64, 32), buf));
    REQUIRE_OK(gp_safetensors_writer_write(w, path));
    gp_safetensors_writer_free(w);
    REQUIRE_OK(gp_safetensors_read(path, &f));
    CHECK_FAILS(gp_checkpoint_load(f, t.m, NULL), GP_FORMAT, "is tied to layers.0.weight");
    gp_safetensors_free(f);
    /* A set: the head's part holds no copy, so loading the head's layers alone reads the
     * embedding's part for it. */
    const char *index;
    session_save_parts(&t, 2, "tiedset", &index);
    gp_model *m2 = gp_test_net_build(GP_TEST_TRANSFORMER_TIED);
    gp_device *dev;
    REQUIRE_OK(gp_device_cpu_new("m2", &dev));
    REQUIRE_OK(gp_model_init(m2, dev, SEED + 1));
    gp_checkpoint *ck;
    REQUIRE_OK(gp_checkpoint_open(index, &ck));
    REQUIRE_OK(gp_checkpoint_load_layers(ck, m2, L - 1, L, NULL));
    gp_checkpoint_close(ck);
    gp_param_info saved, got_head, got_emb;
    REQUIRE_OK(gp_model_param(t.m, 0, &saved));
    REQUIRE_OK(gp_model_param(m2, 0, &got_emb));
    REQUIRE_OK(gp_model_param(m2, gp_model_nparam_tensors(m2) - 1, &got_head));
    CHECK(got_head.layer == L - 1 && !strcmp(got_head.name, "weight"));
    CHECK(memcmp(got_head.value->data, saved.value->data, gp_tensor_nbytes(saved.value)) == 0);
    CHECK(memcmp(got_emb.value->data, saved.value->data, gp_tensor_nbytes(saved.value)) != 0);
    gp_model_free(m2);
    gp_device_free(dev);
    remove_set("tiedset", 2);
    session_free(&t);
    session_free(&u);
    remove(path);
}

int main(void) {
    gp_scratch_init("test_checkpoint");
    check_before_flat();
    for (int net = 0; net < 2; net++) {
        check_resume((gp_test_net)net, 0, 0, 0); /* one device */
        check_resume((gp_test_net)net, 2, 2, 2); /* a pipeline */
        for (int K = 1; K <= 3; K++) {
            check_resume((gp_test_net)net, 0, 4, K); /* saved on 4 stages, resumed on K */
            check_resume((gp_test_net)net, 0, K, 4); /* and the reverse */
        }
        check_resume((gp_test_net)net, 0, 0, 3); /* one device to a pipeline */
    }
    /* The tied Transformer: stored once, resumed on other K bit for bit. */
    check_resume(GP_TEST_TRANSFORMER_TIED, 2, 2, 2);
    check_resume(GP_TEST_TRANSFORMER_TIED, 0, 4, 1);
    check_resume(GP_TEST_TRANSFORMER_TIED, 0, 1, 3);
    check_tied_file();
    check_bad_loads();
    for (int net = 0; net < 2; net++) {
        check_resume_parts((gp_test_net)net, 2, 0); /* a set to one device */
        check_resume_parts((gp_test_net)net, 2, 3); /* to another K */
        check_resume_parts((gp_test_net)net, 4, 1);
    }
    check_resume_parts(GP_TEST_TRANSFORMER_TIED, 2, 0); /* the head's part reads the embedding's */
    check_resume_parts(GP_TEST_TRANSFORMER_TIED, 3, 2);
    check_bad_sets();
    check_model_headers();
    check_pipeline_save_threads();
    check_pipeline_save_background();
    gp_scratch_cleanup();
    return gp_test_finish("test_checkpoint");
}
