/* JSON model configs: both forms build the expected layers and parameter
 * counts (the explicit ConvNet and Transformer match the built-in families
 * bit for bit after init), and every kind of bad input is a GP_CONFIG error
 * naming the origin and the key's path. */
#include <string.h>
#include <unistd.h>

#include "testutil.h"

static gp_device *dev;

static gp_model *from_string(const char *json, const char *origin) {
    gp_model *m = NULL;
    gp_status s = gp_model_from_json_string(json, origin, &m);
    if (s != GP_OK) {
        fprintf(stderr, "%s: %s: %s\n", origin, gp_status_name(s), gp_last_error());
        gp_test_failures++;
        return NULL;
    }
    return m;
}

static void check_kinds(gp_model *m, const char *const *kinds, int n, const char *what) {
    CHECK_EQ_INT(gp_model_nlayers(m), n);
    for (int i = 0; i < n && i < gp_model_nlayers(m); i++)
        if (strcmp(gp_layer_kind(gp_model_layer(m, i)), kinds[i]) != 0) {
            fprintf(stderr, "%s: layer %d is %s, expected %s\n", what, i,
                    gp_layer_kind(gp_model_layer(m, i)), kinds[i]);
            gp_test_failures++;
        }
}

static void check_out_shape(const gp_model *m, int i, gp_shape want) {
    gp_shape got;
    char g[64], w[64];
    CHECK_OK(gp_model_shape(m, i, 2, &got));
    if (!gp_shape_equal(&got, &want)) {
        fprintf(stderr, "layer %d output %s, expected %s\n", i, gp_shape_str(&got, g, sizeof g),
                gp_shape_str(&want, w, sizeof w));
        gp_test_failures++;
    }
}

/* Same layers, same shapes, same parameter bits after init with one seed. */
static void check_same_model(gp_model *a, gp_model *b, const char *what) {
    CHECK_EQ_INT(gp_model_nlayers(a), gp_model_nlayers(b));
    CHECK_EQ_INT(gp_model_nparams(a), gp_model_nparams(b));
    int n = gp_model_nlayers(a) < gp_model_nlayers(b) ? gp_model_nlayers(a) : gp_model_nlayers(b);
    for (int i = -1; i < n; i++) {
        gp_shape sa, sb;
        CHECK_OK(gp_model_shape(a, i, 3, &sa));
        CHECK_OK(gp_model_shape(b, i, 3, &sb));
        if (!gp_shape_equal(&sa, &sb)) {
            fprintf(stderr, "%s: layer %d shapes differ\n", what, i);
            gp_test_failures++;
        }
    }
    CHECK_OK(gp_model_init(a, dev, 77));
    CHECK_OK(gp_model_init(b, dev, 77));
    if (gp_test_hash(a) != gp_test_hash(b)) {
        fprintf(stderr, "%s: parameter hashes differ after init with the same seed\n", what);
        gp_test_failures++;
    }
}

static void test_families(void) {
    gp_model *m, *ref;
    /* {"family": ...} alone takes the WORKLOADS defaults (T1 and C1) */
    if ((m = from_string("{\"family\": \"transformer\"}", "t1"))) {
        CHECK_EQ_INT(gp_model_nparams(m), 25547776);
        CHECK_EQ_INT(gp_model_nlayers(m), 12);
        gp_model_free(m);
    }
    if ((m = from_string("{\"family\": \"convnet\"}", "c1"))) {
        CHECK_EQ_INT(gp_model_nparams(m), 870826);
        gp_model_free(m);
    }
    /* overrides, checked against the C builder with the same values */
    const char *small = "{\"family\": \"transformer\", \"vocab\": 256, \"dim\": 64, \"heads\": 4,"
                        " \"d_ff\": 256, \"layers\": 2, \"seq_len\": 32, \"dropout\": 0.0}";
    if ((m = from_string(small, "small"))) {
        static const char *const kinds[] = {"embedding", "pos_embedding", "transformer_block",
                                            "transformer_block", "layernorm", "linear"};
        check_kinds(m, kinds, 6, "small transformer");
        CHECK_EQ_INT(gp_model_nparams(m), 134912);
        check_out_shape(m, 5, gp_shape3(2, 32, 256));
        gp_transformer_config c = gp_transformer_defaults();
        c.dim = 64, c.heads = 4, c.d_ff = 256, c.layers = 2, c.seq_len = 32;
        REQUIRE_OK(gp_model_transformer(&c, &ref));
        check_same_model(m, ref, "small transformer vs gp_model_transformer");
        gp_model_free(ref);
        gp_model_free(m);
    }
    /* GPT-2 small: 50257 padded to 50304 rows, 1024 positions, the head a tied copy of the
     * table; the count is HF's 124,439,808 plus 47 padding rows of 768 and the head's copy */
    if ((m = from_string("{\"family\": \"gpt2\"}", "gpt2"))) {
        CHECK_EQ_INT(gp_model_nlayers(m), 16);
        CHECK_EQ_INT(gp_model_nparams(m), 124439808 + 47 * 768 + 50304 * 768);
        check_out_shape(m, 15, gp_shape3(2, 1024, 50257));
        gp_model_free(m);
    }
    /* vocab alone pads to a multiple of 64; seq_len alone sets the positions */
    if ((m = from_string("{\"family\": \"gpt2\", \"vocab\": 100, \"dim\": 32, \"heads\": 4, "
                         "\"d_ff\": 64, \"layers\": 1, \"seq_len\": 8}", "tiny gpt2"))) {
        check_out_shape(m, 4, gp_shape3(2, 8, 100));
        /* 128 x 32 table, 8 x 32 positions, the block, ln_f, the head's 128 x 32 copy */
        CHECK_EQ_INT(gp_model_nparams(m), 128 * 32 + 8 * 32 + 8544 + 64 + 128 * 32);
        gp_model_free(m);
    }
    /* the explicit form: a linear layer's "rows" pads its weight */
    if ((m = from_string("{\"input\": {\"shape\": [8], \"dtype\": \"int32\"}, \"layers\": ["
                         "{\"kind\": \"embedding\", \"vocab\": 64, \"dim\": 16}, "
                         "{\"kind\": \"linear\", \"in\": 16, \"out\": 50, \"bias\": false, "
                         "\"rows\": 64}], \"tie_embeddings\": true}", "rows"))) {
        check_out_shape(m, 1, gp_shape3(2, 8, 50));
        CHECK_EQ_INT(gp_model_nparams(m), 2 * 64 * 16);
        gp_model_free(m);
    }
    if ((m = from_string("{\"family\": \"convnet\", \"classes\": 5, \"hidden\": 32, "
                         "\"ch1\": 8, \"ch2\": 16, \"height\": 12, \"width\": 16}", "cnn"))) {
        /* 72 + 16 + 576 + 16 + 1152 + 32 + 2304 + 32 + (16*3*4*32 + 32) + (32*5 + 5) */
        CHECK_EQ_INT(gp_model_nparams(m), 72 + 16 + 576 + 16 + 1152 + 32 + 2304 + 32 + 6176 + 165);
        check_out_shape(m, gp_model_nlayers(m) - 1, gp_shape2(2, 5));
        gp_model_free(m);
    }
    if ((m = NULL, gp_model_from_json_file("examples/demo_lm.json", &m) == GP_OK)) {
        CHECK_EQ_INT(gp_model_nparams(m), 875264 - 64 * 128); /* seq_len 64 */
        CHECK_EQ_INT(gp_model_nlayers(m), 8);
        check_out_shape(m, 7, gp_shape3(2, 64, 256));
        gp_model_free(m);
    } else {
        fprintf(stderr, "examples/demo_lm.json: %s\n", gp_last_error());
        gp_test_failures++;
    }
}

/* The transformer and gpt2 configs as JSON and back. */
static void test_config_text(void) {
    gp_transformer_config c = gp_gpt2_defaults(), d;
    c.dim = 64, c.dropout = 0.1f, c.seq_len = 256;
    char json[512], tiny[16];
    bool gpt2 = false;
    CHECK_OK(gp_transformer_config_json(&c, "gpt2", json, sizeof json));
    CHECK_OK(gp_transformer_config_from_json(json, "text", &d, &gpt2));
    CHECK(gpt2);
    CHECK(d.vocab == c.vocab && d.vocab_padded == c.vocab_padded && d.dim == c.dim &&
          d.heads == c.heads && d.d_ff == c.d_ff && d.layers == c.layers &&
          d.seq_len == c.seq_len && d.max_len == c.max_len && d.dropout == c.dropout &&
          d.tie_embeddings == c.tie_embeddings);
    CHECK_FAILS(gp_transformer_config_json(&c, "gpt2", tiny, sizeof tiny), GP_INVALID_ARGUMENT,
                "16 bytes of buffer");
    CHECK_FAILS(gp_transformer_config_from_json("{\"family\": \"convnet\"}", "cnn", &d, &gpt2),
                GP_CONFIG, "cnn: family: expected \"gpt2\" or \"transformer\"");
    CHECK_OK(gp_transformer_config_from_json("{\"family\": \"transformer\"}", "t", &d, &gpt2));
    CHECK(!gpt2 && d.vocab == 256 && d.vocab_padded == 0 && !d.tie_embeddings);
}

static void test_explicit(void) {
    gp_model *m = NULL, *ref;
    /* the C1 ConvNet written out layer by layer is the convnet family */
    if (gp_model_from_json_file("examples/convnet.json", &m) == GP_OK) {
        CHECK_EQ_INT(gp_model_nparams(m), 870826);
        gp_convnet_config c = gp_convnet_defaults();
        REQUIRE_OK(gp_model_convnet(&c, &ref));
        check_same_model(m, ref, "examples/convnet.json vs gp_model_convnet");
        for (int i = 0; i < gp_model_nlayers(m) && i < gp_model_nlayers(ref); i++)
            CHECK(strcmp(gp_layer_kind(gp_model_layer(m, i)),
                         gp_layer_kind(gp_model_layer(ref, i))) == 0);
        gp_model_free(ref);
        gp_model_free(m);
    } else {
        fprintf(stderr, "examples/convnet.json: %s\n", gp_last_error());
        gp_test_failures++;
    }
    m = NULL;
    if (gp_model_from_json_file("examples/tiny_transformer.json", &m) == GP_OK) {
        CHECK_EQ_INT(gp_model_nparams(m), 134912);
        gp_transformer_config c = gp_transformer_defaults();
        c.dim = 64, c.heads = 4, c.d_ff = 256, c.layers = 2, c.seq_len = 32;
        REQUIRE_OK(gp_model_transformer(&c, &ref));
        check_same_model(m, ref, "examples/tiny_transformer.json vs gp_model_transformer");
        gp_model_free(ref);
        gp_model_free(m);
    } else {
        fprintf(stderr, "examples/tiny_transformer.json: %s\n", gp_last_error());
        gp_test_failures++;
    }

    /* every image-side kind, with optional keys left out and given */
    const char *img =
        "{\"input\": {\"shape\": [3, 8, 8]}, \"layers\": ["
        "{\"kind\": \"conv2d\", \"in\": 3, \"out\": 4, \"kernel\": 3, \"pad\": 1},"          /* 0 */
        "{\"kind\": \"batchnorm2d\", \"channels\": 4},"                                      /* 1 */
        "{\"kind\": \"relu\"},"                                                              /* 2 */
        "{\"kind\": \"maxpool2d\", \"kernel\": 2},"                                          /* 3 */
        "{\"kind\": \"conv2d\", \"in\": 4, \"out\": 6, \"kernel\": 3, \"stride\": 2,"
        " \"pad\": 1, \"bias\": false},"                                                     /* 4 */
        "{\"kind\": \"global_avgpool\"},"                                                    /* 5 */
        "{\"kind\": \"linear\", \"in\": 6, \"out\": 5},"                                     /* 6 */
        "{\"kind\": \"gelu\"},"                                                              /* 7 */
        "{\"kind\": \"dropout\", \"p\": 0.25},"                                              /* 8 */
        "{\"kind\": \"layernorm\", \"dim\": 5},"                                             /* 9 */
        "{\"kind\": \"flatten\"},"                                                          /* 10 */
        "{\"kind\": \"linear\", \"in\": 5, \"out\": 3, \"bias\": false},"                   /* 11 */
        "{\"kind\": \"maxpool2d\", \"kernel\": 1, \"stride\": 1}]}"; /* refused: wants NCHW */
    gp_model *bad = NULL;
    gp_status s = gp_model_from_json_string(img, "img.json", &bad);
    CHECK(s != GP_OK && bad == NULL);
    CHECK(strstr(gp_last_error(), "img.json: layers[12] (maxpool2d)") != NULL);
    char img_ok[2048];
    const char *cut = strstr(img, ",{\"kind\": \"maxpool2d\", \"kernel\": 1,");
    CHECK(cut != NULL);
    snprintf(img_ok, sizeof img_ok, "%.*s]}", cut ? (int)(cut - img) : 0, img);
    if ((m = from_string(img_ok, "img_ok.json"))) {
        static const char *const kinds[] = {"conv2d",    "batchnorm2d", "relu",   "maxpool2d",
                                            "conv2d",    "global_avgpool", "linear", "gelu",
                                            "dropout",   "layernorm",   "flatten", "linear"};
        check_kinds(m, kinds, 12, "img_ok.json");
        CHECK_EQ_INT(gp_model_nparams(m),
                     (108 + 4) + 8 + 216 + (30 + 5) + 10 + 15); /* conv, bn, conv, lin, ln, lin */
        check_out_shape(m, 0, gp_shape4(2, 4, 8, 8));
        check_out_shape(m, 3, gp_shape4(2, 4, 4, 4)); /* stride defaults to the kernel */
        check_out_shape(m, 4, gp_shape4(2, 6, 2, 2)); /* stride 2, pad 1 */
        check_out_shape(m, 5, gp_shape2(2, 6));
        check_out_shape(m, 11, gp_shape2(2, 3));
        gp_model_free(m);
    }
    /* every sequence-side kind */
    const char *seq = "{\"input\": {\"shape\": [6], \"dtype\": \"int32\"}, \"layers\": ["
                      "{\"kind\": \"embedding\", \"vocab\": 10, \"dim\": 8},"
                      "{\"kind\": \"pos_embedding\", \"max_len\": 16, \"dim\": 8},"
                      "{\"kind\": \"causal_attention\", \"dim\": 8, \"heads\": 2},"
                      "{\"kind\": \"causal_attention\", \"dim\": 8, \"heads\": 4,"
                      " \"dropout\": 0.1},"
                      "{\"kind\": \"transformer_block\", \"dim\": 8, \"heads\": 2, \"d_ff\": 12,"
                      " \"dropout\": 0.5},"
                      "{\"kind\": \"layernorm\", \"dim\": 8},"
                      "{\"kind\": \"linear\", \"in\": 8, \"out\": 10, \"bias\": true}]}";
    if ((m = from_string(seq, "seq.json"))) {
        int64_t attn = 8 * 24 + 24 + 8 * 8 + 8;
        int64_t block = 16 + attn + 16 + (8 * 12 + 12) + (12 * 8 + 8);
        CHECK_EQ_INT(gp_model_nparams(m), 80 + 128 + 2 * attn + block + 16 + 90);
        check_out_shape(m, 1, gp_shape3(2, 6, 8));
        check_out_shape(m, 6, gp_shape3(2, 6, 10));
        gp_model_free(m);
    }
}

/* A bad config must fail with `want`, leave *out NULL, and say origin and key. */
static void expect_bad(const char *json, gp_status want, const char *needle, const char *needle2,
                       int line) {
    gp_model *m = (gp_model *)&m; /* not NULL: must be reset */
    gp_status s = gp_model_from_json_string(json, "bad.json", &m);
    gp_test_check_fails_(s, want, needle, json, __FILE__, line);
    const char *msg = gp_last_error();
    if (s != GP_OK && strncmp(msg, "bad.json", 8) != 0) {
        fprintf(stderr, "%s:%d: message \"%s\" does not start with the origin\n", __FILE__, line,
                msg);
        gp_test_failures++;
    }
    if (needle2 && !strstr(msg, needle2)) {
        fprintf(stderr, "%s:%d: message \"%s\" does not contain \"%s\"\n", __FILE__, line, msg,
                needle2);
        gp_test_failures++;
    }
    if (m != NULL) {
        fprintf(stderr, "%s:%d: *out not NULL after a failure\n", __FILE__, line);
        gp_test_failures++;
        if (s == GP_OK) gp_model_free(m);
    }
}
#define BAD(json, needle, needle2) expect_bad(json, GP_CONFIG, needle, needle2, __LINE__)

#define IN "\"input\": {\"shape\": [1, 8, 8]}, "
#define CONV(extra) "{\"kind\": \"conv2d\", \"in\": 1, \"out\": 2, \"kernel\": 3" extra "}"

static void test_bad_configs(void) {
    /* unknown keys, at each level */
    BAD("{" IN "\"layers\": [{\"kind\": \"relu\"}, {\"kind\": \"relu\"}, {\"kind\": \"relu\"},"
        CONV(", \"kernal\": 3") "]}", "bad.json: layers[3].kernal: unknown key",
        "expected one of: kind, name, in, out, kernel, stride, pad, bias");
    BAD("{" IN "\"layers\": [" CONV("") "], \"optimizer\": {}}", "bad.json: optimizer: unknown key",
        "input, layers");
    BAD("{\"input\": {\"shape\": [1, 8, 8], \"shap\": 1}, \"layers\": [" CONV("") "]}",
        "input.shap: unknown key", NULL);
    BAD("{\"family\": \"transformer\", \"dimm\": 64}", "bad.json: dimm: unknown key",
        "transformer family");
    BAD("{\"family\": \"convnet\", \"vocab\": 64}", "vocab: unknown key", "convnet family");
    BAD("{\"family\": \"transformer\", \"layers\": []}", "layers: expected an integer", NULL);
    BAD("{" IN "\"layers\": [" CONV(", \"pad\": 1, \"pad\": 1") "]}",
        "layers[0].pad: duplicate key", NULL);
    /* unknown kinds and families */
    BAD("{" IN "\"layers\": [" CONV("") ", {\"kind\": \"conv3d\"}]}",
        "layers[1].kind: unknown layer kind \"conv3d\"", "conv2d");
    BAD("{\"family\": \"resnet\"}", "family: unknown family \"resnet\"", NULL);
    /* wrong JSON types */
    BAD("{" IN "\"layers\": [" CONV(", \"bias\": \"yes\"") "]}",
        "layers[0].bias: expected true or false, got a string", NULL);
    BAD("{" IN "\"layers\": [{\"kind\": \"conv2d\", \"in\": \"1\", \"out\": 2, \"kernel\": 3}]}",
        "layers[0].in: expected an integer", "got a string");
    BAD("{" IN "\"layers\": [{\"kind\": \"dropout\", \"p\": true}]}",
        "layers[0].p: expected a number", "got a boolean");
    BAD("{" IN "\"layers\": [{\"kind\": 3}]}", "layers[0].kind: expected a layer kind string",
        NULL);
    BAD("{" IN "\"layers\": [\"relu\"]}", "layers[0]: expected an object", NULL);
    BAD("{" IN "\"layers\": {\"kind\": \"relu\"}}", "layers: expected a non-empty array",
        "got an object");
    BAD("{" IN "\"layers\": []}", "layers: expected a non-empty array", "empty array");
    BAD("{\"input\": {\"shape\": 28}, \"layers\": [" CONV("") "]}",
        "input.shape: expected an array", "got a number");
    BAD("{\"input\": [1, 8, 8], \"layers\": [" CONV("") "]}", "input: expected an object", NULL);
    BAD("{\"input\": {\"shape\": [1, 8, 8], \"dtype\": \"float64\"}, \"layers\": [" CONV("") "]}",
        "input.dtype: unknown dtype \"float64\"", NULL);
    BAD("{\"input\": {\"shape\": [1, 8, 8], \"dtype\": 32}, \"layers\": [" CONV("") "]}",
        "input.dtype: expected \"float32\" or \"int32\"", NULL);
    BAD("{\"family\": 3}", "family: expected \"transformer\", \"gpt2\" or \"convnet\", got a number",
        NULL);
    BAD("[1, 2]", "bad.json: top level: expected a JSON object, got an array", NULL);
    BAD("{\"family\": \"gpt2\", \"vocab\": 100, \"vocab_padded\": 99}",
        "vocab_padded 99 must be >= vocab 100", NULL);
    BAD("{\"family\": \"gpt2\", \"seq_len\": 64, \"max_len\": 32}", "max_len 32", NULL);
    expect_bad("{\"input\": {\"shape\": [8], \"dtype\": \"int32\"}, \"layers\": [{\"kind\": "
               "\"embedding\", \"vocab\": 64, \"dim\": 16}, {\"kind\": \"linear\", \"in\": 16, "
               "\"out\": 50, \"rows\": 40}]}",
               GP_INVALID_ARGUMENT, "layers[1] (linear)", "rows = 40 at least out_features",
               __LINE__);
    BAD("{\"family\": \"gpt2\", \"n_embd\": 32}", "n_embd: unknown key for the gpt2 family",
        NULL);
    BAD("{\"family\": \"convnet\", \"hidden\": null}", "hidden: expected an integer", "got null");
    /* missing required keys */
    BAD("{" IN "\"layers\": [{\"kind\": \"conv2d\", \"in\": 1, \"kernel\": 3}]}",
        "layers[0]: missing required key \"out\" for a conv2d layer", NULL);
    BAD("{" IN "\"layers\": [{\"in\": 1}]}", "layers[0]: missing required key \"kind\"", NULL);
    BAD("{\"layers\": [" CONV("") "]}", "top level: missing required key \"input\"", NULL);
    BAD("{" IN "\"layer\": [" CONV("") "]}", "layer: unknown key", NULL);
    BAD("{\"input\": {\"shape\": [1, 8, 8]}}", "top level: missing required key \"layers\"", NULL);
    BAD("{\"input\": {\"dtype\": \"float32\"}, \"layers\": [" CONV("") "]}",
        "input: missing required key \"shape\"", NULL);
    BAD("{}", "top level: missing required key \"input\"", NULL);
    BAD("{" IN "\"layers\": [{\"kind\": \"dropout\"}]}", "missing required key \"p\"", NULL);
    /* non-integer and out-of-range numbers */
    BAD("{" IN "\"layers\": [" CONV(", \"stride\": 1.5") "]}",
        "layers[0].stride: expected an integer from 1 to 16777216, got 1.5", NULL);
    BAD("{" IN "\"layers\": [" CONV(", \"stride\": 0") "]}", "layers[0].stride: expected an "
        "integer from 1", "got 0");
    BAD("{" IN "\"layers\": [" CONV(", \"pad\": -1") "]}", "layers[0].pad: expected an integer "
        "from 0", "got -1");
    BAD("{" IN "\"layers\": [" CONV(", \"pad\": 1e12") "]}", "layers[0].pad", "1000000000000");
    BAD("{" IN "\"layers\": [{\"kind\": \"dropout\", \"p\": 1.0}]}",
        "layers[0].p: expected a number in [0, 1), got 1", NULL);
    BAD("{" IN "\"layers\": [{\"kind\": \"dropout\", \"p\": -0.5}]}", "layers[0].p", "-0.5");
    BAD("{\"family\": \"transformer\", \"dropout\": 2}", "dropout: expected a number in [0, 1)",
        NULL);
    BAD("{\"family\": \"transformer\", \"heads\": 0}", "heads: expected an integer from 1", NULL);
    BAD("{\"input\": {\"shape\": [1, 0, 8]}, \"layers\": [" CONV("") "]}",
        "input.shape[1]: expected an integer from 1", "got 0");
    BAD("{\"input\": {\"shape\": [1, 2, 3, 4]}, \"layers\": [" CONV("") "]}",
        "input.shape: expected an array of 1 to 3 sizes", NULL);
    BAD("{\"input\": {\"shape\": []}, \"layers\": [" CONV("") "]}", "input.shape", "empty array");
    BAD("{\"input\": {\"shape\": [4096, 4096, 4096]}, \"layers\": [" CONV("") "]}",
        "input.shape: 68719476736 elements per example", NULL);
    /* invalid JSON: where */
    BAD("{\n  \"family\": \"convnet\",\n  \"hidden\": 12x\n}", "bad.json: invalid JSON at line 3",
        NULL);
    BAD("{\"family\": \"convnet\"} trailing", "invalid JSON at line 1, column 23",
        "near \"trailing\"");
    BAD("", "invalid JSON at line 1, column 1", "at the end of the text");
    BAD("{\"family\": \"conv", "invalid JSON", NULL);
    /* A syntax error near escaped characters: the excerpt grows (found by fuzz_config). */
    BAD("{\"a\": \"\t\t\t\t\t\t\t\t\t\t\t\t\t\t\t\t\t\t\t\t\t\t", "invalid JSON",
        "\\t\\t\\t\\t\\t\\t\\t\\t\\t\\t\\t\\t\\t\\t\\t\\t\\t\\t\\t\"");
    /* Layer counts that would take gigabytes before any parameter (found by fuzz_config). */
    BAD("{\"family\": \"transformer\", \"d_ff\": 8, \"layers\": 4e5}",
        "layers: expected an integer from 0 to 9996, got 400000", NULL);
    {
        size_t n = 10001, cap = 64 + n * 18;
        char *big = malloc(cap);
        REQUIRE_OK(big ? GP_OK : GP_OUT_OF_MEMORY);
        size_t at = (size_t)snprintf(big, cap, "{%s\"layers\": [", IN);
        for (size_t i = 0; i < n; i++)
            at += (size_t)snprintf(big + at, cap - at, "%s{\"kind\":\"relu\"}", i ? "," : "");
        snprintf(big + at, cap - at, "]}");
        BAD(big, "layers: 10001 layers, at most 10000", NULL);
        free(big);
    }

    /* layer construction and shape errors keep their status, with origin and
     * position prefixed */
    gp_model *m = NULL;
    gp_status s = gp_model_from_json_string(
        "{\"input\": {\"shape\": [4], \"dtype\": \"int32\"}, \"layers\": ["
        "{\"kind\": \"embedding\", \"vocab\": 10, \"dim\": 8},"
        "{\"kind\": \"transformer_block\", \"dim\": 8, \"heads\": 3, \"d_ff\": 12}]}",
        "heads.json", &m);
    CHECK(s != GP_OK && m == NULL);
    CHECK(strstr(gp_last_error(), "heads.json: layers[1] (transformer_block): ") ==
          gp_last_error());
    CHECK(strstr(gp_last_error(), "heads = 3") != NULL);
    s = gp_model_from_json_string(
        "{\"input\": {\"shape\": [1, 8, 8]}, \"layers\": [" CONV(", \"pad\": 1") ","
        "{\"kind\": \"flatten\"}, {\"kind\": \"linear\", \"in\": 100, \"out\": 3}]}",
        "shape.json", &m);
    CHECK_EQ_INT(s, GP_SHAPE);
    CHECK(strstr(gp_last_error(), "shape.json: layers[2] (linear): ") == gp_last_error());
    CHECK(strstr(gp_last_error(), "128") != NULL); /* what it got: 2 * 8 * 8 features */
    s = gp_model_from_json_string(
        "{\"input\": {\"shape\": [1, 8, 8]}, \"layers\": [{\"kind\": \"embedding\", "
        "\"vocab\": 10, \"dim\": 4}]}", "dtype.json", &m);
    CHECK(s != GP_OK && m == NULL);
    CHECK(strstr(gp_last_error(), "dtype.json: layers[0] (embedding): ") == gp_last_error());
    s = gp_model_from_json_string("{\"family\": \"transformer\", \"dim\": 64, \"heads\": 5}",
                                  "fam.json", &m);
    CHECK(s != GP_OK && m == NULL);
    CHECK(strstr(gp_last_error(), "fam.json: family transformer: ") == gp_last_error());
    /* a NULL origin still says where */
    CHECK_FAILS(gp_model_from_json_string("{\"family\": \"x\"}", NULL, &m), GP_CONFIG,
                "<string>: family");
    CHECK_FAILS(gp_model_from_json_string(NULL, "o", &m), GP_INVALID_ARGUMENT, "NULL json");
}

static void test_files(void) {
    gp_model *m = (gp_model *)&m;
    CHECK_FAILS(gp_model_from_json_file("tests/data/config_typo.json", &m), GP_CONFIG,
                "tests/data/config_typo.json: layers[3].kernal: unknown key for a conv2d layer");
    CHECK(m == NULL);
    CHECK_FAILS(gp_model_from_json_file("tests/data/config_syntax.json", &m), GP_CONFIG,
                "tests/data/config_syntax.json: invalid JSON at line 5");
    CHECK_FAILS(gp_model_from_json_file("tests/data/no_such_config.json", &m), GP_IO,
                "tests/data/no_such_config.json: cannot open");
    CHECK_FAILS(gp_model_from_json_file("tests/data", &m), GP_IO, "tests/data");
    char path[] = "/tmp/gp_test_config_XXXXXX";
    int fd = mkstemp(path);
    if (fd >= 0) {
        static const char nul[] = "{\"family\": \"convnet\"}\0junk";
        CHECK(write(fd, nul, sizeof nul - 1) == (ssize_t)(sizeof nul - 1));
        close(fd);
        CHECK_FAILS(gp_model_from_json_file(path, &m), GP_CONFIG, "NUL byte at offset 21");
        CHECK(strstr(gp_last_error(), path) != NULL);
        remove(path);
    }
    CHECK(m == NULL);
}

int main(void) {
    REQUIRE_OK(gp_device_cpu_new("cpu0", &dev));
    test_families();
    test_config_text();
    test_explicit();
    test_bad_configs();
    test_files();
    gp_device_free(dev);
    return gp_test_finish("test_config");
}
