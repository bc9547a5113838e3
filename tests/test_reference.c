/* gpipe against PyTorch: the fixtures in tests/reference/fixtures/ (written by
 * tests/reference/make_fixtures.py in float64) hold fixed weights and inputs of a small Transformer
 * and ConvNet with their logits, loss, every gradient (also against label-smoothed targets), 5
 * optimizer-step losses and the final parameters; this test rebuilds both models and compares every
 * value within 1e-4 relative (RTOL, FLOOR and ATOL below). */
#include <stdint.h>
#include <string.h>

#include "core/error.h"
#include "pipeline/pipeline_hooks.h"
#include "testutil.h"

/* |got - want| <= RTOL * max(|got|, |want|, FLOOR * the tensor's largest |want|) + ATOL,
 * element by element. The floor is for elements far smaller than their tensor's largest: a
 * float32 dot product's rounding follows the size of its terms, not of its sum, so a logit near
 * 1e-3 among logits near 1 carries the error of those (7.5e-7 measured on Haswell's and Zen's
 * kernels, 0.67 of ATOL alone). */
#define RTOL 1e-4
#define ATOL 1e-6
#define FLOOR 1e-2

/* ------------------------------------------------------------ safetensors */

/* The fixtures are read (and validated) by the library's safetensors reader;
 * each tensor is decoded once into host memory for the comparisons. */
typedef struct st_tensor {
    const char *name; /* the library's entry name */
    gp_dtype dtype;
    gp_shape shape;
    int64_t nelem;
    void *data; /* float or int32_t, malloc'd */
} st_tensor;

typedef struct st_file {
    const char *path;
    gp_safetensors *sf;
    int ntensors;
    st_tensor *tensors;
} st_file;

static void st_free(st_file *f) {
    for (int i = 0; i < f->ntensors; i++) free(f->tensors[i].data);
    free(f->tensors);
    gp_safetensors_free(f->sf);
    memset(f, 0, sizeof *f);
}

static gp_status st_load(const char *path, st_file *f) {
    memset(f, 0, sizeof *f);
    f->path = path;
    GP_TRY(gp_safetensors_read(path, &f->sf));
    int n = gp_safetensors_count(f->sf);
    f->tensors = calloc((size_t)n + 1, sizeof *f->tensors);
    if (!f->tensors) return gp_error(GP_OUT_OF_MEMORY, "%s: %d tensors", path, n);
    for (int i = 0; i < n; i++) {
        const gp_st_entry *e = gp_safetensors_entry(f->sf, i);
        st_tensor *t = &f->tensors[f->ntensors++];
        t->name = e->name;
        t->dtype = e->dtype;
        t->shape = e->shape;
        t->nelem = gp_shape_nelem(&e->shape);
        t->data = malloc((size_t)t->nelem * 4 + 1);
        if (!t->data) return gp_error(GP_OUT_OF_MEMORY, "%s: tensor \"%s\"", path, e->name);
        GP_TRY(gp_safetensors_get(f->sf, e->name, e->dtype, NULL, t->data));
    }
    return GP_OK;
}

static const st_tensor *st_find(const st_file *f, const char *name) {
    for (int i = 0; i < f->ntensors; i++)
        if (strcmp(f->tensors[i].name, name) == 0) return &f->tensors[i];
    return NULL;
}

/* Looks a tensor up by name and checks its dtype and (if want is given) shape. */
static const st_tensor *st_get(const st_file *f, const char *name, gp_dtype dtype,
                               const gp_shape *want) {
    const st_tensor *t = st_find(f, name);
    char a[96], b[96];
    if (!t) {
        fprintf(stderr, "%s: no tensor \"%s\"\n", f->path, name);
    } else if (t->dtype != dtype) {
        fprintf(stderr, "%s: tensor \"%s\" is %s, expected %s\n", f->path, name,
                gp_dtype_name(t->dtype), gp_dtype_name(dtype));
        t = NULL;
    } else if (want && !gp_shape_equal(&t->shape, want)) {
        fprintf(stderr, "%s: tensor \"%s\" has shape %s, gpipe's is %s\n", f->path, name,
                gp_shape_str(&t->shape, a, sizeof a), gp_shape_str(want, b, sizeof b));
        t = NULL;
    }
    if (!t) gp_test_failures++;
    return t;
}

static const char *st_meta(const st_file *f, const char *key) {
    const char *v = gp_safetensors_meta(f->sf, key);
    if (v) return v;
    fprintf(stderr, "%s: __metadata__ has no string \"%s\"\n", f->path, key);
    exit(1); /* the fixture is unusable: nothing else can be compared */
}

static int meta_int(const st_file *f, const char *key) { return atoi(st_meta(f, key)); }
static float meta_float(const st_file *f, const char *key) {
    return strtof(st_meta(f, key), NULL);
}

/* ------------------------------------------------------------ comparison */

typedef struct worst {
    char what[128];
    double excess; /* |diff| / tolerance of the worst element so far */
    int ntensors;
} worst;

/* Compares n values; on a mismatch prints the count and the worst element. */
static void compare(worst *w, const char *what, const float *got, const float *want, int64_t n) {
    double max_excess = 0, mag = 0;
    int64_t at = 0, nbad = 0;
    for (int64_t i = 0; i < n; i++) mag = fmax(mag, fabs(want[i]));
    for (int64_t i = 0; i < n; i++) {
        double g = got[i], r = want[i];
        double tol = RTOL * fmax(fmax(fabs(g), fabs(r)), FLOOR * mag) + ATOL;
        double excess = fabs(g - r) / tol;
        if (!(excess <= 1)) nbad++;
        if (!(excess <= max_excess)) {
            max_excess = isnan(excess) ? INFINITY : excess;
            at = i;
        }
    }
    w->ntensors++;
    if (getenv("GP_REFERENCE_VERBOSE") || nbad)
        fprintf(nbad ? stderr : stdout,
                "  %-4s %-42s n=%-6lld worst [%lld]: gpipe %.9g vs torch %.9g (%.3f of tol)\n",
                nbad ? "FAIL" : "ok", what, (long long)n, (long long)at, (double)got[at],
                (double)want[at], max_excess);
    if (nbad) {
        fprintf(stderr, "       %lld of %lld elements outside |d| <= %g*max(|x|, %g*%g) + %g\n",
                (long long)nbad, (long long)n, RTOL, FLOOR, mag, ATOL);
        gp_test_failures++;
    }
    if (max_excess >= w->excess) {
        w->excess = max_excess;
        snprintf(w->what, sizeof w->what, "%s[%lld]", what, (long long)at);
    }
}

static void compare_named(worst *w, const st_file *f, const char *name, const gp_tensor *got) {
    const st_tensor *want = st_get(f, name, GP_F32, &got->shape);
    if (want) compare(w, name, got->data, want->data, gp_tensor_nelem(got));
}

/* ------------------------------------------------------------ model plumbing */

/* Overwrites every parameter and buffer with fixture tensor "<prefix>layers.<i>.<name>" (prefix
 * ""), or compares them with it (prefix "final."), and checks that the fixture has no
 * "<prefix>layers.*" tensor that gpipe lacks. */
static void params_load_or_compare(gp_model *m, const st_file *f, const char *prefix, worst *w) {
    int n = gp_model_nparam_tensors(m), nmatched = 0;
    for (int k = 0; k < n; k++) {
        gp_param_info pi;
        REQUIRE_OK(gp_model_param(m, k, &pi));
        char name[160];
        snprintf(name, sizeof name, "%slayers.%d.%s", prefix, pi.layer, pi.name);
        if (w) {
            compare_named(w, f, name, pi.value);
            nmatched++;
            continue;
        }
        const st_tensor *t = st_get(f, name, GP_F32, &pi.value->shape);
        if (!t) continue;
        memcpy(pi.value->data, t->data, gp_tensor_nbytes(pi.value));
        nmatched++;
    }
    int nfixture = 0;
    size_t plen = strlen(prefix);
    for (int i = 0; i < f->ntensors; i++)
        if (strncmp(f->tensors[i].name, prefix, plen) == 0 &&
            strncmp(f->tensors[i].name + plen, "layers.", 7) == 0)
            nfixture++;
    if (nfixture != nmatched) {
        fprintf(stderr, "%s: %d \"%slayers.*\" tensors in the fixture, gpipe has %d\n", f->path,
                nfixture, prefix, nmatched);
        gp_test_failures++;
    }
}

static void compare_grads(gp_model *m, const st_file *f, const char *prefix, const char *tag,
                          worst *w) {
    for (int k = 0; k < gp_model_nparam_tensors(m); k++) {
        gp_param_info pi;
        REQUIRE_OK(gp_model_param(m, k, &pi));
        if (!pi.trainable) continue;
        char name[160], what[200];
        snprintf(name, sizeof name, "%sgrad.layers.%d.%s", prefix, pi.layer, pi.name);
        snprintf(what, sizeof what, "%s%s", name, tag);
        const st_tensor *t = st_get(f, name, GP_F32, &pi.grad->shape);
        if (t) compare(w, what, pi.grad->data, t->data, gp_tensor_nelem(pi.grad));
    }
}

/* A tensor on dev holding fixture tensor `name`. */
static gp_tensor fixture_tensor(gp_device *dev, const st_file *f, const char *name, gp_dtype dtype) {
    const st_tensor *t = st_get(f, name, dtype, NULL);
    if (!t) exit(1);
    gp_tensor x;
    REQUIRE_OK(gp_tensor_alloc(dev, GP_MEM_ACTIVATIONS, t->shape, dtype, &x));
    memcpy(x.data, t->data, (size_t)t->nelem * 4);
    return x;
}

static void compare_predict(gp_model *m, gp_device *dev, const st_file *f, const gp_tensor *x,
                            const char *name, worst *w) {
    gp_shape s;
    REQUIRE_OK(gp_model_shape(m, gp_model_nlayers(m) - 1, x->shape.dim[0], &s));
    gp_tensor logits;
    REQUIRE_OK(gp_tensor_alloc(dev, GP_MEM_ACTIVATIONS, s, GP_F32, &logits));
    CHECK_OK(gp_model_predict(m, x, &logits));
    compare_named(w, f, name, &logits);
    gp_tensor_release(&logits);
}

/* The whole comparison for one fixture: logits (transformer: training == eval), loss and
 * gradients at the initial point (also against label-smoothed targets), the losses of the optimizer steps, the final parameters and
 * buffers, and eval-mode logits after the steps. */
static void run_fixture(const char *path) {
    st_file f;
    REQUIRE_OK(st_load(path, &f));
    const char *family = st_meta(&f, "family");
    bool transformer = strcmp(family, "transformer") == 0;
    gp_model *m;
    if (transformer) {
        gp_transformer_config c = {.vocab = meta_int(&f, "vocab"), .dim = meta_int(&f, "dim"),
                                   .heads = meta_int(&f, "heads"), .d_ff = meta_int(&f, "d_ff"),
                                   .layers = meta_int(&f, "layers"),
                                   .seq_len = meta_int(&f, "seq_len"), .dropout = 0.0f};
        REQUIRE_OK(gp_model_transformer(&c, &m));
    } else if (strcmp(family, "resnet") == 0) {
        /* A model written as a JSON layer list: the stem, residual blocks, pooling, a head. */
        REQUIRE_OK(gp_model_from_json_string(st_meta(&f, "model_json"), path, &m));
    } else {
        CHECK(strcmp(family, "convnet") == 0);
        gp_convnet_config c = {.in_ch = meta_int(&f, "in_ch"), .height = meta_int(&f, "height"),
                               .width = meta_int(&f, "width"), .classes = meta_int(&f, "classes"),
                               .ch1 = meta_int(&f, "ch1"), .ch2 = meta_int(&f, "ch2"),
                               .hidden = meta_int(&f, "hidden")};
        REQUIRE_OK(gp_model_convnet(&c, &m));
    }
    gp_optim_opts oo;
    if (strcmp(st_meta(&f, "opt.kind"), "adamw") == 0) {
        oo = gp_adamw_defaults(meta_float(&f, "opt.lr"), meta_float(&f, "opt.weight_decay"));
        oo.beta1 = meta_float(&f, "opt.beta1");
        oo.beta2 = meta_float(&f, "opt.beta2");
        oo.eps = meta_float(&f, "opt.eps");
    } else {
        oo = gp_sgd_defaults(meta_float(&f, "opt.lr"), meta_float(&f, "opt.momentum"));
        oo.weight_decay = meta_float(&f, "opt.weight_decay");
    }
    oo.warmup_steps = 0;
    oo.total_steps = 0; /* constant learning rate */
    int nsteps = meta_int(&f, "steps");

    gp_device *dev;
    REQUIRE_OK(gp_device_cpu_new("reference", &dev));
    REQUIRE_OK(gp_model_init(m, dev, 1));
    params_load_or_compare(m, &f, "", NULL);
    gp_tensor x = fixture_tensor(dev, &f, "input", transformer ? GP_I32 : GP_F32);
    gp_tensor y = fixture_tensor(dev, &f, "labels", GP_I32);
    worst w = {.what = "", .excess = 0};

    if (transformer) compare_predict(m, dev, &f, &x, "logits", &w);

    /* Gradients at the initial point; then with 2 micro-batches, which must sum to the same
     * (the transformer has no batch statistics; the convnets' differ per micro-batch). */
    for (int M = 1; M <= (transformer ? 2 : 1); M++) {
        gp_pipeline *t = gp_test_single(m, &oo, M);
        float loss = NAN;
        CHECK_OK(gp_pipeline_accumulate(t, &x, &y, &loss));
        const st_tensor *want = st_get(&f, "loss", GP_F32, NULL);
        if (want) compare(&w, M == 1 ? "loss" : "loss (M=2)", &loss, want->data, 1);
        compare_grads(m, &f, "", M == 1 ? "" : " (M=2)", &w);
        gp_pipeline_free(t);
        /* This forward moved batch-norm running statistics: start the steps from the fixture. */
        params_load_or_compare(m, &f, "", NULL);
    }
    /* The same point against label-smoothed targets (CrossEntropyLoss(label_smoothing=...)). */
    {
        gp_pipeline_opts po = {.stages = 1, .schedule = GP_SCHEDULE_1F1B, .remat = GP_REMAT_NONE,
                               .label_smoothing = meta_float(&f, "label_smoothing")};
        CHECK(po.label_smoothing > 0);
        gp_pipeline *t = NULL;
        REQUIRE_OK(gp_pipeline_new(m, &oo, &po, 0, &t));
        float loss = NAN;
        CHECK_OK(gp_pipeline_accumulate(t, &x, &y, &loss));
        const st_tensor *want = st_get(&f, "smoothed.loss", GP_F32, NULL);
        if (want) compare(&w, "smoothed.loss", &loss, want->data, 1);
        compare_grads(m, &f, "smoothed.", "", &w);
        gp_pipeline_free(t);
        params_load_or_compare(m, &f, "", NULL);
    }

    gp_pipeline *t = gp_test_single(m, &oo, 1);
    float *losses = calloc((size_t)nsteps, sizeof *losses);
    for (int s = 0; s < nsteps; s++) CHECK_OK(gp_pipeline_step(t, &x, &y, &losses[s]));
    gp_shape ls = gp_shape1(nsteps);
    const st_tensor *want = st_get(&f, "step_losses", GP_F32, &ls);
    if (want) compare(&w, "step_losses", losses, want->data, nsteps);
    free(losses);
    params_load_or_compare(m, &f, "final.", &w);
    compare_predict(m, dev, &f, &x, "final.logits", &w);

    printf("%s: %d tensors within %g relative (+%g); worst %s at %.3f of the tolerance\n", path,
           w.ntensors, RTOL, ATOL, w.what, w.excess);
    gp_pipeline_free(t);
    gp_tensor_release(&x);
    gp_tensor_release(&y);
    gp_model_free(m);
    gp_device_free(dev);
    st_free(&f);
}

int main(void) {
    run_fixture("tests/reference/fixtures/transformer.safetensors");
    run_fixture("tests/reference/fixtures/convnet.safetensors");
    run_fixture("tests/reference/fixtures/resnet.safetensors");
    return gp_test_finish("test_reference");
}
