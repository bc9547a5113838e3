/* GPT-2 against transformers' GPT2LMHeadModel: tests/reference/make_gpt2_fixture.py saved a
 * random tiny model with save_pretrained and what it computes in float64. Here gp_hf_gpt2_import
 * reads those files, and gpipe's logits, loss and gradients must match; the vocabulary padding
 * changes no bit of what the real columns compute and its rows get no gradient; export then
 * import gives back the same bits; bad files are errors naming the file and tensor or key. The
 * round trip through transformers itself is `make check-hf` (tests/hf/roundtrip.sh). */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "pipeline/pipeline_hooks.h"
#include "testutil.h"

#define FIX "tests/reference/fixtures/gpt2"

static gp_device *dev;

/* A model of the gpt2 family from an imported file's config, loaded with its values. */
static gp_model *load_imported(const char *path, gp_safetensors **keep) {
    gp_safetensors *f;
    REQUIRE_OK(gp_safetensors_read(path, &f));
    const char *config = gp_safetensors_meta(f, "model_config");
    REQUIRE_OK(config ? GP_OK : GP_FORMAT);
    gp_model *m;
    REQUIRE_OK(gp_model_from_json_string(config, path, &m));
    REQUIRE_OK(gp_model_init(m, dev, 3));
    REQUIRE_OK(gp_checkpoint_load(f, m, NULL));
    if (keep)
        *keep = f;
    else
        gp_safetensors_free(f);
    return m;
}

/* Worst |a - b| over n elements as a multiple of tol (<= 1 passes). */
static double worst(const float *a, const float *b, int64_t n, double tol) {
    double w = 0;
    for (int64_t i = 0; i < n; i++) {
        double d = fabs((double)a[i] - b[i]) / tol;
        if (!(d <= w)) w = d; /* NaN counts as a failure */
    }
    return w;
}

static double max_abs(const float *a, int64_t n) {
    double m = 0;
    for (int64_t i = 0; i < n; i++) m = fmax(m, fabs((double)a[i]));
    return m;
}

static void read_tensor(gp_safetensors *f, const char *name, gp_dtype dt, gp_tensor *t) {
    const gp_st_entry *e = gp_safetensors_find(f, name);
    REQUIRE_OK(e ? GP_OK : GP_FORMAT);
    REQUIRE_OK(gp_tensor_alloc(dev, GP_MEM_ACTIVATIONS, e->shape, dt, t));
    REQUIRE_OK(gp_safetensors_get(f, name, dt, NULL, t->data));
}

/* Logits within 1e-5 of the largest logit's magnitude (float32 through two blocks of dim 32:
 * measured about 1e-7 of it); loss and each gradient within 1e-4 of its tensor's largest
 * magnitude (measured below 1e-5). */
static void matches_transformers(void) {
    const char *wpath = gp_scratch_path("gpt2.safetensors");
    gp_transformer_config c;
    REQUIRE_OK(gp_hf_gpt2_import(FIX, wpath, &c));
    gp_scratch_remember(wpath);
    CHECK_EQ_INT(c.vocab, 100);
    CHECK_EQ_INT(c.vocab_padded, 128);
    CHECK_EQ_INT(c.layers, 2);
    CHECK_EQ_INT(c.max_len, 16);
    gp_model *m = load_imported(wpath, NULL);
    const int L = gp_model_nlayers(m);
    /* the padding rows of the table are zero */
    gp_param_info e = gp_test_param_of(m, 0, "weight"), h = gp_test_param_of(m, L - 1, "weight");
    CHECK_EQ_INT(e.value->shape.dim[0], 128);
    CHECK(max_abs(F32(*e.value) + 100 * 32, 28 * 32) == 0.0);
    CHECK(max_abs(F32(*e.value), 100 * 32) > 0.0);

    gp_safetensors *x;
    REQUIRE_OK(gp_safetensors_read(FIX "/expect.safetensors", &x));
    gp_tensor in, labels, want;
    read_tensor(x, "input", GP_I32, &in);
    read_tensor(x, "labels", GP_I32, &labels);
    read_tensor(x, "logits", GP_F32, &want);
    gp_tensor logits;
    REQUIRE_OK(gp_tensor_alloc(dev, GP_MEM_ACTIVATIONS, want.shape, GP_F32, &logits));
    REQUIRE_OK(gp_model_predict(m, &in, &logits));
    const int64_t n = gp_tensor_nelem(&want);
    const double big = max_abs(F32(want), n);
    double w = worst(F32(logits), F32(want), n, 1e-5 * big);
    printf("logits: worst %.3g of the tolerance (1e-5 x %.4g)\n", w, big);
    CHECK(w <= 1.0);

    float loss_want;
    REQUIRE_OK(gp_safetensors_get(x, "loss", GP_F32, NULL, &loss_want));
    gp_optim_opts o = gp_sgd_defaults(1e-3f, 0.0f);
    gp_pipeline *p = gp_test_single(m, &o, 1);
    float loss;
    REQUIRE_OK(gp_pipeline_accumulate(p, &in, &labels, &loss));
    printf("loss: gpipe %.9g, transformers %.9g\n", (double)loss, (double)loss_want);
    CHECK_NEAR(loss, loss_want, 1e-4 * fabs(loss_want));

    /* the gradients, through the same import (their tensors under the model's names) */
    const char *gpath = gp_scratch_path("gpt2_grads.safetensors");
    gp_transformer_config cg;
    REQUIRE_OK(gp_hf_gpt2_import(FIX "_grads", gpath, &cg));
    gp_scratch_remember(gpath);
    gp_safetensors *g;
    REQUIRE_OK(gp_safetensors_read(gpath, &g));
    int compared = 0;
    double worst_all = 0;
    for (int i = 0; i < gp_model_nparam_tensors(m); i++) {
        gp_param_info pi;
        REQUIRE_OK(gp_model_param(m, i, &pi));
        if (pi.layer == L - 1) continue; /* the tied head: its gradient is in the table's */
        char name[128];
        snprintf(name, sizeof name, "layers.%d.%s", pi.layer, pi.name);
        const int64_t k = gp_tensor_nelem(pi.grad);
        float *ref = malloc((size_t)k * sizeof *ref), *got = malloc((size_t)k * sizeof *got);
        REQUIRE_OK(gp_safetensors_get(g, name, GP_F32, &pi.grad->shape, ref));
        for (int64_t j = 0; j < k; j++)
            got[j] = F32(*pi.grad)[j] + (pi.layer == 0 ? F32(*h.grad)[j] : 0.0f);
        const double wg = worst(got, ref, k, 1e-4 * max_abs(ref, k));
        if (!(wg <= 1.0)) fprintf(stderr, "gradient of %s: %.3g of the tolerance\n", name, wg);
        CHECK(wg <= 1.0);
        worst_all = fmax(worst_all, wg);
        compared++;
        free(ref);
        free(got);
    }
    printf("gradients: %d tensors, worst %.3g of the tolerance\n", compared, worst_all);
    CHECK_EQ_INT(compared, 4 + 12 * 2);
    gp_safetensors_free(g);
    gp_pipeline_free(p);
    gp_tensor_release(&logits);
    gp_tensor_release(&in);
    gp_tensor_release(&labels);
    gp_tensor_release(&want);
    gp_safetensors_free(x);
    gp_model_free(m);
}

/* The padding is invisible: vocab 100 padded to 128 against the same model unpadded (the same
 * first 100 rows) gives the same logits, loss and gradients bit for bit, and the padding rows'
 * gradient is exactly zero. */
static void padding_is_invisible(void) {
    const char *base = "{\"family\": \"gpt2\", \"vocab\": 100, \"dim\": 32, \"heads\": 4, "
                       "\"d_ff\": 128, \"layers\": 2, \"seq_len\": 16, \"vocab_padded\": %d}";
    char json[256];
    gp_model *m[2];
    gp_pipeline *p[2];
    float loss[2];
    gp_test_batch b;
    for (int i = 0; i < 2; i++) {
        snprintf(json, sizeof json, base, i ? 100 : 128);
        REQUIRE_OK(gp_model_from_json_string(json, "pad", &m[i]));
        REQUIRE_OK(gp_model_init(m[i], dev, 11));
    }
    /* the padded model's first 100 rows from the unpadded one (init draws depend on the shape) */
    const int L = gp_model_nlayers(m[0]);
    gp_param_info e0 = gp_test_param_of(m[0], 0, "weight"), e1 = gp_test_param_of(m[1], 0, "weight");
    gp_param_info h0 = gp_test_param_of(m[0], L - 1, "weight");
    memcpy(e0.value->data, e1.value->data, 100 * 32 * sizeof(float));
    memcpy(h0.value->data, e1.value->data, 100 * 32 * sizeof(float));
    for (int64_t j = 100 * 32; j < 128 * 32; j++) F32(*e0.value)[j] = F32(*h0.value)[j] = 1e3f;
    for (int i = 0; i < gp_model_nparam_tensors(m[0]); i++) {
        gp_param_info a, c;
        REQUIRE_OK(gp_model_param(m[0], i, &a));
        REQUIRE_OK(gp_model_param(m[1], i, &c));
        if (a.layer != 0 && a.layer != L - 1)
            memcpy(a.value->data, c.value->data, gp_tensor_nbytes(a.value));
    }
    int32_t *ids = malloc(2 * 16 * sizeof *ids), *lab = malloc(2 * 16 * sizeof *lab);
    for (int j = 0; j < 32; j++) ids[j] = (j * 37 + 5) % 100, lab[j] = (j * 53 + 1) % 100;
    gp_tensor x = gp_tensor_view(ids, gp_shape2(2, 16), GP_I32);
    gp_tensor y = gp_tensor_view(lab, gp_shape2(2, 16), GP_I32);
    (void)b;
    gp_tensor logits[2];
    gp_optim_opts o = gp_sgd_defaults(1e-3f, 0.0f);
    for (int i = 0; i < 2; i++) {
        REQUIRE_OK(gp_tensor_alloc(dev, GP_MEM_ACTIVATIONS, gp_shape3(2, 16, 100), GP_F32,
                                   &logits[i]));
        REQUIRE_OK(gp_model_predict(m[i], &x, &logits[i]));
        p[i] = gp_test_single(m[i], &o, 1);
        REQUIRE_OK(gp_pipeline_accumulate(p[i], &x, &y, &loss[i]));
    }
    CHECK(memcmp(logits[0].data, logits[1].data, gp_tensor_nbytes(&logits[0])) == 0);
    CHECK(memcmp(&loss[0], &loss[1], sizeof(float)) == 0);
    for (int li = 0; li < L; li += L - 1) {
        gp_param_info a = gp_test_param_of(m[0], li, "weight"), c = gp_test_param_of(m[1], li, "weight");
        CHECK(memcmp(a.grad->data, c.grad->data, 100 * 32 * sizeof(float)) == 0);
        CHECK(max_abs(F32(*a.grad) + 100 * 32, 28 * 32) == 0.0);
    }
    for (int i = 0; i < 2; i++) {
        gp_pipeline_free(p[i]);
        gp_tensor_release(&logits[i]);
        gp_model_free(m[i]);
    }
    free(ids);
    free(lab);
}

/* Export then import gives back every parameter bit for bit, and the config. */
static void export_round_trip(void) {
    const char *wpath = gp_scratch_path("gpt2.safetensors");
    gp_transformer_config c;
    REQUIRE_OK(gp_hf_gpt2_import(FIX, wpath, &c));
    gp_scratch_remember(wpath);
    gp_model *m = load_imported(wpath, NULL);
    const char *out = gp_scratch_path("export");
    CHECK(mkdir(out, 0700) == 0);
    gp_scratch_remember(out);
    char sub[512];
    snprintf(sub, sizeof sub, "%s/model.safetensors", out);
    gp_scratch_remember(sub);
    snprintf(sub, sizeof sub, "%s/config.json", out);
    gp_scratch_remember(sub);
    REQUIRE_OK(gp_hf_gpt2_export(m, &c, out));
    const char *again = gp_scratch_path("again.safetensors");
    gp_transformer_config c2;
    REQUIRE_OK(gp_hf_gpt2_import(out, again, &c2));
    gp_scratch_remember(again);
    CHECK(c.vocab == c2.vocab && c.vocab_padded == c2.vocab_padded && c.dim == c2.dim &&
          c.heads == c2.heads && c.d_ff == c2.d_ff && c.layers == c2.layers &&
          c.seq_len == c2.seq_len && c.max_len == c2.max_len && c.dropout == c2.dropout &&
          c.tie_embeddings == c2.tie_embeddings);
    gp_model *m2 = load_imported(again, NULL);
    CHECK(gp_test_hash(m) == gp_test_hash(m2));
    gp_model_free(m2);
    gp_model_free(m);
}

/* ---------------------------------------------------------------- bad input */

static void write_text(const char *path, const char *text) {
    FILE *f = fopen(path, "w");
    REQUIRE_OK(f ? GP_OK : GP_IO);
    fputs(text, f);
    fclose(f);
}

/* dir/model.safetensors from the fixture's tensors (without their "transformer." prefix), one
 * renamed (to NULL: left out) or given another shape. */
static void write_weights(const char *dir, const char *victim, const char *rename,
                          bool reshape) {
    gp_safetensors *f;
    REQUIRE_OK(gp_safetensors_read(FIX "/model.safetensors", &f));
    gp_safetensors_writer *w;
    REQUIRE_OK(gp_safetensors_writer_new(&w));
    const int n = gp_safetensors_count(f);
    void **bufs = calloc((size_t)n, sizeof *bufs);
    for (int i = 0; i < n; i++) {
        const gp_st_entry *e = gp_safetensors_entry(f, i);
        bufs[i] = malloc(e->end - e->begin + 4);
        REQUIRE_OK(gp_safetensors_get(f, e->name, GP_F32, NULL, bufs[i]));
        gp_shape s = e->shape;
        const char *name = strncmp(e->name, "transformer.", 12) == 0 ? e->name + 12 : e->name;
        if (strcmp(name, victim) == 0) {
            if (!rename && !reshape) continue;
            if (rename) name = rename;
            if (reshape) s = gp_shape2(s.dim[1], s.dim[0]);
        }
        REQUIRE_OK(gp_safetensors_writer_add(w, name, GP_F32, s, bufs[i]));
    }
    char path[512];
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    REQUIRE_OK(gp_safetensors_writer_write(w, path));
    gp_safetensors_writer_free(w);
    for (int i = 0; i < n; i++) free(bufs[i]);
    free(bufs);
    gp_safetensors_free(f);
}

static void bad_input(void) {
    const char *dir = gp_scratch_path("bad");
    CHECK(mkdir(dir, 0700) == 0);
    gp_scratch_remember(dir);
    char cpath[512], wpath[512];
    snprintf(cpath, sizeof cpath, "%s/config.json", dir);
    snprintf(wpath, sizeof wpath, "%s/model.safetensors", dir);
    gp_scratch_remember(cpath);
    gp_scratch_remember(wpath);
    const char *out = gp_scratch_path("never.safetensors");
    gp_transformer_config c;
    char *good = gp_test_read_file(FIX "/config.json");
    REQUIRE_OK(good ? GP_OK : GP_IO);
    write_text(cpath, good);
    const char *cut = "{\"n_embd\": 32, \"n_head\": 4, \"n_layer\": 2, \"n_positions\": 16, "
                      "\"vocab_size\": 100, ";
    char text[512];
    static const struct {
        const char *extra, *needle;
        gp_status want;
    } configs[] = {
        {"\"activation_function\": \"relu\"}", "\"activation_function\" is \"relu\"",
         GP_UNSUPPORTED},
        {"\"scale_attn_by_inverse_layer_idx\": true}", "scale_attn_by_inverse_layer_idx",
         GP_UNSUPPORTED},
        {"\"layer_norm_epsilon\": 1e-6}", "layer_norm_epsilon", GP_UNSUPPORTED},
        {"\"tie_word_embeddings\": false}", "tie_word_embeddings", GP_UNSUPPORTED},
        {"\"model_type\": \"llama\"}", "model_type", GP_UNSUPPORTED},
        {"\"n_head\": 5}", "n_head", GP_CONFIG},
        {"\"n_inner\": 1.5}", "\"n_inner\": expected an integer", GP_CONFIG},
    };
    write_weights(dir, "", NULL, false);
    for (size_t i = 0; i < sizeof configs / sizeof configs[0]; i++) {
        if (strstr(configs[i].extra, "n_head"))
            snprintf(text, sizeof text, "{\"n_embd\": 32, \"n_layer\": 2, %s", configs[i].extra);
        else
            snprintf(text, sizeof text, "%s%s", cut, configs[i].extra);
        write_text(cpath, text);
        CHECK_FAILS(gp_hf_gpt2_import(dir, out, &c), configs[i].want, configs[i].needle);
        CHECK_FAILS(gp_hf_gpt2_import(dir, out, &c), configs[i].want, cpath);
    }
    write_text(cpath, "{\"n_embd\": 32,");
    CHECK_FAILS(gp_hf_gpt2_import(dir, out, &c), GP_CONFIG, "not valid JSON");
    write_text(cpath, good);
    /* the names without "transformer." (the fixture, as save_pretrained writes it, has it) */
    write_weights(dir, "h.1.mlp.c_fc.bias", NULL, false);
    CHECK_FAILS(gp_hf_gpt2_import(dir, out, &c), GP_FORMAT, "missing tensor \"h.1.mlp.c_fc.bias\"");
    CHECK_FAILS(gp_hf_gpt2_import(dir, out, &c), GP_FORMAT, wpath);
    write_weights(dir, "h.0.attn.c_attn.weight", NULL, true);
    CHECK_FAILS(gp_hf_gpt2_import(dir, out, &c), GP_SHAPE,
                "\"h.0.attn.c_attn.weight\" has shape (96, 32), expected (32, 96)");
    write_weights(dir, "h.0.ln_1.bias", "h.0.ln_3.bias", false);
    CHECK_FAILS(gp_hf_gpt2_import(dir, out, &c), GP_FORMAT, "tensor \"h.0.ln_3.bias\" is not");
    write_weights(dir, "", NULL, false);
    REQUIRE_OK(gp_hf_gpt2_import(dir, out, &c));
    gp_scratch_remember(out);
    const char *ref = gp_scratch_path("ref.safetensors");
    REQUIRE_OK(gp_hf_gpt2_import(FIX, ref, &c));
    gp_scratch_remember(ref);
    gp_model *a = load_imported(out, NULL), *b = load_imported(ref, NULL);
    CHECK(gp_test_hash(a) == gp_test_hash(b));
    gp_model_free(a);
    gp_model_free(b);
    free(good);
    /* export needs the model the config describes */
    gp_model *m = load_imported(out, NULL);
    c.heads = 4, c.dim = 64;
    CHECK_FAILS(gp_hf_gpt2_export(m, &c, dir), GP_SHAPE, "layers.0.weight has shape (128, 32)");
    c.tie_embeddings = false;
    CHECK_FAILS(gp_hf_gpt2_export(m, &c, dir), GP_UNSUPPORTED, "not tied");
    gp_model_free(m);
}

int main(void) {
    gp_scratch_init("test_gpt2");
    REQUIRE_OK(gp_device_cpu_new("cpu", &dev));
    matches_transformers();
    padding_is_invisible();
    export_round_trip();
    bad_input();
    gp_device_free(dev);
    gp_scratch_cleanup();
    return gp_test_finish("test_gpt2");
}
