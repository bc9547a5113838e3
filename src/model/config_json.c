/* Models from JSON configs: a built-in family with optional overrides, or an
 * explicit input and list of layers. Anything not understood (unknown keys
 * or kinds, wrong types, fractional or out-of-range numbers) is refused with
 * the origin, the key's path ("layers[3].kernal") and what was expected. */
#include <cjson/cJSON.h>
#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/error.h"
#include "core/read_file.h"

#define CFG_MAX_DIM (1 << 24)        /* any size or count in a config */
#define CFG_MAX_FILE_BYTES (16 << 20) /* a config is text; refuse a stray binary */
#define CFG_MAX_KEYS 12
/* Layers in a model: each costs a few KiB before any parameter exists, so an unbounded count
 * would let a tiny config ask for gigabytes of host memory. */
#define CFG_MAX_LAYERS 10000

typedef enum key_type { KEY_INT, KEY_BOOL, KEY_FLOAT } key_type;

/* One key of a layer or family. Integers must lie in [lo, hi]; floats in
 * [lo, hi) (a dropout probability may be 0 but not 1). */
typedef struct key_spec {
    const char *name;
    key_type type;
    bool required;
    double def, lo, hi;
} key_spec;

#define INT_REQ(n) {n, KEY_INT, true, 0, 1, CFG_MAX_DIM}
#define INT_OPT(n, d, lo) {n, KEY_INT, false, d, lo, CFG_MAX_DIM}
#define BOOL_OPT(n, d) {n, KEY_BOOL, false, d, 0, 1}
#define PROB_OPT(n) {n, KEY_FLOAT, false, 0, 0, 1}
#define PROB_REQ(n) {n, KEY_FLOAT, true, 0, 0, 1}

typedef struct kind_spec {
    const char *kind;
    key_spec keys[CFG_MAX_KEYS]; /* ends at the first NULL name */
    gp_layer *(*build)(const double *v); /* v: the keys' values, in order */
} kind_spec;

/* rows 0 stands for "omitted": the weight has out rows */
static gp_layer *build_linear(const double *v) {
    return gp_linear_padded((int)v[0], (int)v[1], v[2] != 0, v[3] == 0 ? (int)v[1] : (int)v[3]);
}
static gp_layer *build_embedding(const double *v) { return gp_embedding((int)v[0], (int)v[1]); }
static gp_layer *build_pos_embedding(const double *v) {
    return gp_pos_embedding((int)v[0], (int)v[1]);
}
static gp_layer *build_layernorm(const double *v) { return gp_layernorm((int)v[0]); }
static gp_layer *build_gelu(const double *v) { return gp_gelu(); }
static gp_layer *build_relu(const double *v) { return gp_relu(); }
static gp_layer *build_dropout(const double *v) { return gp_dropout((float)v[0]); }
static gp_layer *build_attention(const double *v) {
    return gp_causal_attention((int)v[0], (int)v[1], (float)v[2]);
}
static gp_layer *build_block(const double *v) {
    return gp_transformer_block((int)v[0], (int)v[1], (int)v[2], (float)v[3]);
}
static gp_layer *build_conv2d(const double *v) {
    return gp_conv2d((int)v[0], (int)v[1], (int)v[2], (int)v[3], (int)v[4], v[5] != 0);
}
static gp_layer *build_batchnorm2d(const double *v) { return gp_batchnorm2d((int)v[0]); }
static gp_layer *build_residual_block(const double *v) {
    return gp_residual_block((int)v[0], (int)v[1], (int)v[2]);
}
/* stride 0 stands for "omitted": pooling windows then tile the input, as in PyTorch */
static gp_layer *build_maxpool2d(const double *v) {
    return gp_maxpool2d((int)v[0], v[1] == 0 ? (int)v[0] : (int)v[1]);
}
static gp_layer *build_global_avgpool(const double *v) { return gp_global_avgpool(); }
static gp_layer *build_flatten(const double *v) { return gp_flatten(); }
static gp_layer *build_add(const double *v) { return gp_add_from((int)v[0]); }
static gp_layer *build_concat(const double *v) { return gp_concat_from((int)v[0]); }
/* A merge (skip connection): its "from" names an earlier layer, whose index build gets as v[0]. */
static bool is_merge(const kind_spec *ks) {
    return ks->build == build_add || ks->build == build_concat;
}

/* One entry per public layer constructor in gpipe.h. */
static const kind_spec kinds[] = {
    {"linear", {INT_REQ("in"), INT_REQ("out"), BOOL_OPT("bias", 1), INT_OPT("rows", 0, 1)},
     build_linear},
    {"embedding", {INT_REQ("vocab"), INT_REQ("dim")}, build_embedding},
    {"pos_embedding", {INT_REQ("max_len"), INT_REQ("dim")}, build_pos_embedding},
    {"layernorm", {INT_REQ("dim")}, build_layernorm},
    {"gelu", {{0}}, build_gelu},
    {"relu", {{0}}, build_relu},
    {"dropout", {PROB_REQ("p")}, build_dropout},
    {"causal_attention", {INT_REQ("dim"), INT_REQ("heads"), PROB_OPT("dropout")},
     build_attention},
    {"transformer_block",
     {INT_REQ("dim"), INT_REQ("heads"), INT_REQ("d_ff"), PROB_OPT("dropout")}, build_block},
    {"conv2d",
     {INT_REQ("in"), INT_REQ("out"), INT_REQ("kernel"), INT_OPT("stride", 1, 1),
      INT_OPT("pad", 0, 0), BOOL_OPT("bias", 1)},
     build_conv2d},
    {"batchnorm2d", {INT_REQ("channels")}, build_batchnorm2d},
    {"residual_block", {INT_REQ("in"), INT_REQ("out"), INT_OPT("stride", 1, 1)},
     build_residual_block},
    {"maxpool2d", {INT_REQ("kernel"), INT_OPT("stride", 0, 1)}, build_maxpool2d},
    {"global_avgpool", {{0}}, build_global_avgpool},
    {"flatten", {{0}}, build_flatten},
    {"add", {{0}}, build_add},
    {"concat", {{0}}, build_concat},
};
#define NKINDS ((int)(sizeof kinds / sizeof kinds[0]))

#define KEYS_END {NULL, KEY_INT, false, 0, 0, 0}
/* Family keys override gp_*_defaults() only when present; "def" is unused. */
static const key_spec transformer_keys[] = {
    INT_OPT("vocab", 0, 1), INT_OPT("dim", 0, 1),     INT_OPT("heads", 0, 1),
    INT_OPT("d_ff", 0, 1),  {"layers", KEY_INT, false, 0, 0, CFG_MAX_LAYERS - 4},
    INT_OPT("seq_len", 0, 1),
    PROB_OPT("dropout"),    BOOL_OPT("tie_embeddings", 0), INT_OPT("vocab_padded", 0, 1),
    INT_OPT("max_len", 0, 1), KEYS_END};
static const key_spec convnet_keys[] = {
    INT_OPT("in_ch", 0, 1), INT_OPT("height", 0, 1), INT_OPT("width", 0, 1),
    INT_OPT("classes", 0, 1), INT_OPT("ch1", 0, 1),  INT_OPT("ch2", 0, 1),
    INT_OPT("hidden", 0, 1), KEYS_END};

/* "<origin>: <path>: <what>", status GP_CONFIG. */
static gp_status cfg_error(const char *origin, const char *path, const char *fmt, ...)
    GP_PRINTF(3, 4);
static gp_status cfg_error(const char *origin, const char *path, const char *fmt, ...) {
    char what[768];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(what, sizeof what, fmt, ap);
    va_end(ap);
    return gp_error(GP_CONFIG, "%s: %s: %s", origin, path, what);
}

static const char *json_type(const cJSON *j) {
    if (cJSON_IsNumber(j)) return "a number";
    if (cJSON_IsString(j)) return "a string";
    if (cJSON_IsBool(j)) return "a boolean";
    if (cJSON_IsNull(j)) return "null";
    if (cJSON_IsArray(j)) return "an array";
    if (cJSON_IsObject(j)) return "an object";
    return "an invalid value";
}

/* path + "." + key (or path + "[i]" when key is NULL) into buf. */
static const char *join(char *buf, size_t nbytes, const char *path, const char *key, int i) {
    if (key)
        snprintf(buf, nbytes, "%s%s%s", path, path[0] ? "." : "", key);
    else
        snprintf(buf, nbytes, "%s[%d]", path, i);
    return buf;
}

static void list_names(const char *const *names, int n, char *buf, size_t nbytes) {
    size_t used = 0;
    buf[0] = '\0';
    for (int i = 0; i < n && used < nbytes; i++)
        used += (size_t)snprintf(buf + used, nbytes - used, "%s%s", i ? ", " : "", names[i]);
}

/* Every member of obj must be named in allowed[0..n-1], and only once. */
static gp_status check_keys(const char *origin, const char *path, const cJSON *obj,
                            const char *const *allowed, int n, const char *what) {
    for (const cJSON *c = obj->child; c; c = c->next) {
        char kp[256], list[512];
        bool known = false;
        for (int i = 0; i < n && !known; i++) known = strcmp(c->string, allowed[i]) == 0;
        if (!known) {
            list_names(allowed, n, list, sizeof list);
            return cfg_error(origin, join(kp, sizeof kp, path, c->string, 0),
                             "unknown key for %s (expected one of: %s)", what, list);
        }
        for (const cJSON *d = obj->child; d != c; d = d->next)
            if (strcmp(d->string, c->string) == 0)
                return cfg_error(origin, join(kp, sizeof kp, path, c->string, 0),
                                 "duplicate key");
    }
    return GP_OK;
}

static gp_status read_int(const char *origin, const char *kp, const cJSON *j, double lo,
                          double hi, double *out) {
    if (!cJSON_IsNumber(j))
        return cfg_error(origin, kp, "expected an integer from %.0f to %.0f, got %s", lo, hi,
                         json_type(j));
    double v = j->valuedouble;
    if (!isfinite(v) || v != floor(v) || v < lo || v > hi)
        return cfg_error(origin, kp, "expected an integer from %.0f to %.0f, got %.15g", lo, hi,
                         v);
    *out = v;
    return GP_OK;
}

static gp_status read_key(const char *origin, const char *kp, const cJSON *j, const key_spec *k,
                          double *out) {
    switch (k->type) {
    case KEY_INT:
        return read_int(origin, kp, j, k->lo, k->hi, out);
    case KEY_BOOL:
        if (!cJSON_IsBool(j))
            return cfg_error(origin, kp, "expected true or false, got %s", json_type(j));
        *out = cJSON_IsTrue(j) ? 1 : 0;
        return GP_OK;
    case KEY_FLOAT:
        if (!cJSON_IsNumber(j))
            return cfg_error(origin, kp, "expected a number in [%g, %g), got %s", k->lo, k->hi,
                             json_type(j));
        if (!(j->valuedouble >= k->lo && j->valuedouble < k->hi))
            return cfg_error(origin, kp, "expected a number in [%g, %g), got %.15g", k->lo,
                             k->hi, j->valuedouble);
        *out = j->valuedouble;
        return GP_OK;
    }
    return gp_error(GP_INTERNAL, "config: key type %d", (int)k->type);
}

/* Values of keys[] from obj (defaults where optional and absent), after
 * checking that obj has no other keys than keys[] and the nextra of `extra`. */
static gp_status read_keys(const char *origin, const char *path, const cJSON *obj,
                           const key_spec *keys, const char *const *extra, int nextra,
                           const char *what, double *v) {
    const char *names[CFG_MAX_KEYS + 3];
    int n = 0;
    for (int i = 0; i < nextra; i++) names[n++] = extra[i];
    for (int i = 0; keys[i].name; i++) names[n++] = keys[i].name;
    GP_TRY(check_keys(origin, path, obj, names, n, what));
    for (int i = 0; keys[i].name; i++) {
        const cJSON *j = cJSON_GetObjectItemCaseSensitive(obj, keys[i].name);
        char kp[256];
        join(kp, sizeof kp, path, keys[i].name, 0);
        if (!j) {
            if (keys[i].required)
                return cfg_error(origin, path[0] ? path : "top level",
                                 "missing required key \"%s\" for %s", keys[i].name, what);
            v[i] = keys[i].def;
        } else {
            GP_TRY(read_key(origin, kp, j, &keys[i], &v[i]));
        }
    }
    return GP_OK;
}

static bool has(const cJSON *obj, const char *key) {
    return cJSON_GetObjectItemCaseSensitive(obj, key) != NULL;
}

/* The transformer or gpt2 family's keys over its defaults. */
static gp_status read_transformer(const char *origin, const cJSON *root, bool gpt2,
                                  gp_transformer_config *out) {
    double v[CFG_MAX_KEYS] = {0};
    GP_TRY(read_keys(origin, "", root, transformer_keys, (const char *[]){"family"}, 1,
                     gpt2 ? "the gpt2 family" : "the transformer family", v));
    gp_transformer_config c = gpt2 ? gp_gpt2_defaults() : gp_transformer_defaults();
    int *f[] = {&c.vocab, &c.dim, &c.heads, &c.d_ff, &c.layers, &c.seq_len};
    for (int i = 0; i < 6; i++)
        if (has(root, transformer_keys[i].name)) *f[i] = (int)v[i];
    if (has(root, "dropout")) c.dropout = (float)v[6];
    if (has(root, "tie_embeddings")) c.tie_embeddings = v[7] != 0;
    /* GPT-2's table is padded to a multiple of 64 rows unless told otherwise, and its positions
     * follow a seq_len given alone */
    if (has(root, "vocab_padded"))
        c.vocab_padded = (int)v[8];
    else if (gpt2)
        c.vocab_padded = (c.vocab + 63) / 64 * 64;
    if (has(root, "max_len"))
        c.max_len = (int)v[9];
    else if (gpt2 && has(root, "seq_len"))
        c.max_len = 0;
    *out = c;
    return GP_OK;
}

static gp_status build_family(const char *origin, const cJSON *root, const char *family,
                              gp_model **out) {
    double v[CFG_MAX_KEYS] = {0};
    gp_status s;
    *out = NULL;
    const bool gpt2 = strcmp(family, "gpt2") == 0;
    if (gpt2 || strcmp(family, "transformer") == 0) {
        gp_transformer_config c;
        GP_TRY(read_transformer(origin, root, gpt2, &c));
        s = gp_model_transformer(&c, out);
    } else if (strcmp(family, "convnet") == 0) {
        GP_TRY(read_keys(origin, "", root, convnet_keys, (const char *[]){"family"}, 1,
                         "the convnet family", v));
        gp_convnet_config c = gp_convnet_defaults();
        int *f[] = {&c.in_ch, &c.height, &c.width, &c.classes, &c.ch1, &c.ch2, &c.hidden};
        for (int i = 0; i < 7; i++)
            if (has(root, convnet_keys[i].name)) *f[i] = (int)v[i];
        s = gp_model_convnet(&c, out);
    } else {
        return cfg_error(origin, "family", "unknown family \"%s\" (expected \"transformer\", "
                         "\"gpt2\" or \"convnet\")", family);
    }
    if (s != GP_OK) return gp_error_context(s, "%s: family %s", origin, family);
    return GP_OK;
}

static gp_status read_input(const char *origin, const cJSON *root, gp_shape *shape,
                            gp_dtype *dtype) {
    const cJSON *in = cJSON_GetObjectItemCaseSensitive(root, "input");
    if (!in) return cfg_error(origin, "top level", "missing required key \"input\"");
    if (!cJSON_IsObject(in))
        return cfg_error(origin, "input", "expected an object like {\"shape\": [1, 28, 28], "
                         "\"dtype\": \"float32\"}, got %s", json_type(in));
    static const char *const keys[] = {"shape", "dtype"};
    GP_TRY(check_keys(origin, "input", in, keys, 2, "the input"));
    const cJSON *sh = cJSON_GetObjectItemCaseSensitive(in, "shape");
    if (!sh) return cfg_error(origin, "input", "missing required key \"shape\"");
    int nd = cJSON_IsArray(sh) ? cJSON_GetArraySize(sh) : -1;
    if (nd < 1 || nd > GP_MAX_DIMS - 1)
        return cfg_error(origin, "input.shape", "expected an array of 1 to %d sizes (one "
                         "example, without the batch dimension), got %s%s", GP_MAX_DIMS - 1,
                         nd == 0 ? "an empty array" : json_type(sh),
                         nd > 0 ? " that is too long" : "");
    shape->ndim = nd;
    double nelem = 1;
    for (int i = 0; i < nd; i++) {
        char kp[64];
        double v = 0;
        GP_TRY(read_int(origin, join(kp, sizeof kp, "input.shape", NULL, i),
                        cJSON_GetArrayItem(sh, i), 1, CFG_MAX_DIM, &v));
        shape->dim[i] = (int64_t)v;
        nelem *= v;
    }
    if (nelem > CFG_MAX_DIM)
        return cfg_error(origin, "input.shape", "%.0f elements per example, expected at most %d",
                         nelem, CFG_MAX_DIM);
    *dtype = GP_F32; /* "dtype" may be left out for image inputs */
    const cJSON *dt = cJSON_GetObjectItemCaseSensitive(in, "dtype");
    if (dt) {
        if (cJSON_IsString(dt) && strcmp(dt->valuestring, "float32") == 0)
            *dtype = GP_F32;
        else if (cJSON_IsString(dt) && strcmp(dt->valuestring, "int32") == 0)
            *dtype = GP_I32;
        else if (cJSON_IsString(dt))
            return cfg_error(origin, "input.dtype", "unknown dtype \"%s\" (expected \"float32\" "
                             "or \"int32\")", dt->valuestring);
        else
            return cfg_error(origin, "input.dtype", "expected \"float32\" or \"int32\", got %s",
                             json_type(dt));
    }
    return GP_OK;
}

/* A layer's optional "name" (NULL: none): a non-empty string no other layer has. */
static gp_status read_name(const char *origin, const cJSON *layers, int i, const char **out) {
    char kp[64];
    const cJSON *n = cJSON_GetObjectItemCaseSensitive(cJSON_GetArrayItem(layers, i), "name");
    *out = NULL;
    if (!n) return GP_OK;
    snprintf(kp, sizeof kp, "layers[%d].name", i);
    if (!cJSON_IsString(n) || !n->valuestring[0])
        return cfg_error(origin, kp, "expected a non-empty string naming the layer, got %s",
                         cJSON_IsString(n) ? "an empty string" : json_type(n));
    int j = 0;
    for (const cJSON *o = layers->child; o && j < i; o = o->next, j++) {
        const cJSON *on = cJSON_IsObject(o) ? cJSON_GetObjectItemCaseSensitive(o, "name") : NULL;
        if (cJSON_IsString(on) && strcmp(on->valuestring, n->valuestring) == 0)
            return cfg_error(origin, kp, "duplicate layer name \"%s\" (layers[%d] has it)",
                             n->valuestring, j);
    }
    *out = n->valuestring;
    return GP_OK;
}

/* A merge's "from": the index of the earlier layer of that name. */
static gp_status read_from(const char *origin, const cJSON *layers, int i, const cJSON *from,
                           int *out) {
    char kp[64];
    snprintf(kp, sizeof kp, "layers[%d].from", i);
    if (!from) return cfg_error(origin, kp, "missing: a merge reads the output of an earlier layer "
                                "named by its \"name\"");
    if (!cJSON_IsString(from))
        return cfg_error(origin, kp, "expected the name of an earlier layer, got %s",
                         json_type(from));
    int j = 0;
    for (const cJSON *o = layers->child; o; o = o->next, j++) {
        const cJSON *on = cJSON_IsObject(o) ? cJSON_GetObjectItemCaseSensitive(o, "name") : NULL;
        if (!cJSON_IsString(on) || strcmp(on->valuestring, from->valuestring) != 0) continue;
        if (j >= i)
            return cfg_error(origin, kp, "layer \"%s\" is layers[%d]%s: a merge reads an "
                             "earlier layer's output", from->valuestring, j,
                             j == i ? ", this layer itself" : ", after this one");
        *out = j;
        return GP_OK;
    }
    return cfg_error(origin, kp, "no layer is named \"%s\" (give the earlier layer "
                     "\"name\": \"%s\")", from->valuestring, from->valuestring);
}

/* Checks layers[i] and constructs it (NULL layer with the message set when
 * the constructor refuses its arguments; gp_model_add then reports it). */
static gp_status read_layer(const char *origin, const cJSON *layers, const cJSON *j, int i,
                            const kind_spec **kind, gp_layer **out) {
    char path[32], kp[64];
    join(path, sizeof path, "layers", NULL, i);
    *out = NULL;
    if (!cJSON_IsObject(j))
        return cfg_error(origin, path, "expected an object like {\"kind\": \"relu\"}, got %s",
                         json_type(j));
    const cJSON *k = cJSON_GetObjectItemCaseSensitive(j, "kind");
    if (!k) return cfg_error(origin, path, "missing required key \"kind\"");
    join(kp, sizeof kp, path, "kind", 0);
    if (!cJSON_IsString(k))
        return cfg_error(origin, kp, "expected a layer kind string, got %s", json_type(k));
    const kind_spec *ks = NULL;
    for (int n = 0; n < NKINDS && !ks; n++)
        if (strcmp(kinds[n].kind, k->valuestring) == 0) ks = &kinds[n];
    if (!ks) {
        const char *names[NKINDS];
        char list[512];
        for (int n = 0; n < NKINDS; n++) names[n] = kinds[n].kind;
        list_names(names, NKINDS, list, sizeof list);
        return cfg_error(origin, kp, "unknown layer kind \"%s\" (expected one of: %s)",
                         k->valuestring, list);
    }
    char what[64];
    snprintf(what, sizeof what, "a %s layer", ks->kind);
    double v[CFG_MAX_KEYS] = {0};
    static const char *const extra[] = {"kind", "name", "from"};
    GP_TRY(read_keys(origin, path, j, ks->keys, extra, is_merge(ks) ? 3 : 2, what, v));
    const char *name;
    GP_TRY(read_name(origin, layers, i, &name));
    if (is_merge(ks)) {
        int from = 0;
        GP_TRY(read_from(origin, layers, i, cJSON_GetObjectItemCaseSensitive(j, "from"), &from));
        v[0] = from;
    }
    *kind = ks;
    *out = ks->build(v);
    return GP_OK;
}

static gp_status build_explicit(const char *origin, const cJSON *root, gp_model **out) {
    static const char *const top[] = {"input", "layers", "tie_embeddings"};
    GP_TRY(check_keys(origin, "", root, top, 3, "an explicit model (or give \"family\")"));
    const cJSON *tie = cJSON_GetObjectItemCaseSensitive(root, "tie_embeddings");
    if (tie && !cJSON_IsBool(tie))
        return cfg_error(origin, "tie_embeddings", "expected true or false, got %s",
                         json_type(tie));
    gp_shape shape = {0};
    gp_dtype dtype;
    GP_TRY(read_input(origin, root, &shape, &dtype));
    const cJSON *layers = cJSON_GetObjectItemCaseSensitive(root, "layers");
    if (!layers) return cfg_error(origin, "top level", "missing required key \"layers\"");
    if (!cJSON_IsArray(layers) || cJSON_GetArraySize(layers) == 0)
        return cfg_error(origin, "layers", "expected a non-empty array of layer objects, got %s",
                         cJSON_IsArray(layers) ? "an empty array" : json_type(layers));
    if (cJSON_GetArraySize(layers) > CFG_MAX_LAYERS)
        return cfg_error(origin, "layers", "%d layers, at most %d", cJSON_GetArraySize(layers),
                         CFG_MAX_LAYERS);
    gp_model *m;
    gp_status s = gp_model_new(shape, dtype, &m);
    if (s != GP_OK) return gp_error_context(s, "%s: input", origin);
    int i = 0;
    for (const cJSON *j = layers->child; j && s == GP_OK; j = j->next, i++) {
        const kind_spec *ks = NULL;
        gp_layer *l;
        s = read_layer(origin, layers, j, i, &ks, &l);
        if (s != GP_OK) break;
        s = gp_model_add(m, l);
        if (s != GP_OK) s = gp_error_context(s, "%s: layers[%d] (%s)", origin, i, ks->kind);
    }
    if (s == GP_OK && cJSON_IsTrue(tie) && (s = gp_model_tie_embeddings(m)) != GP_OK)
        s = gp_error_context(s, "%s: tie_embeddings", origin);
    if (s != GP_OK) {
        gp_model_free(m);
        return s;
    }
    *out = m;
    return GP_OK;
}

/* "line L, column C" of the byte at offset in text. */
static void locate(const char *text, size_t offset, int *line, int *col) {
    *line = 1;
    *col = 1;
    for (size_t i = 0; i < offset && text[i]; i++) {
        if (text[i] == '\n') {
            (*line)++;
            *col = 1;
        } else {
            (*col)++;
        }
    }
}

gp_status gp_model_from_json_string(const char *json, const char *origin, gp_model **out) {
    if (out) *out = NULL;
    if (!origin) origin = "<string>";
    if (!json || !out)
        return gp_error(GP_INVALID_ARGUMENT, "gp_model_from_json_string(%s): NULL %s", origin,
                        json ? "out" : "json");
    const char *end = NULL;
    cJSON *root = cJSON_ParseWithOpts(json, &end, 1);
    if (!root) {
        size_t off = end && end >= json ? (size_t)(end - json) : 0;
        size_t len = strlen(json);
        if (off > len) off = len;
        int line, col;
        locate(json, off, &line, &col);
        char near[48]; /* up to 20 bytes from the error on, printable (escapes take two) */
        size_t n = 0;
        for (size_t i = 0; i < 20 && json[off + i]; i++) {
            char ch = json[off + i];
            if (ch == '\n' || ch == '\r' || ch == '\t') {
                near[n++] = '\\';
                near[n++] = ch == '\n' ? 'n' : ch == '\r' ? 'r' : 't';
            } else {
                near[n++] = (ch >= 32 && ch < 127) ? ch : '?';
            }
        }
        near[n] = '\0';
        return gp_error(GP_CONFIG, "%s: invalid JSON at line %d, column %d (byte %zu)%s%s%s",
                        origin, line, col, off, n ? ": near \"" : ": at the end of the text",
                        near, n ? "\"" : "");
    }
    gp_status s;
    if (!cJSON_IsObject(root)) {
        s = cfg_error(origin, "top level", "expected a JSON object, got %s", json_type(root));
    } else {
        const cJSON *fam = cJSON_GetObjectItemCaseSensitive(root, "family");
        if (fam && !cJSON_IsString(fam))
            s = cfg_error(origin, "family",
                          "expected \"transformer\", \"gpt2\" or \"convnet\", got %s",
                          json_type(fam));
        else if (fam)
            s = build_family(origin, root, fam->valuestring, out);
        else
            s = build_explicit(origin, root, out);
    }
    cJSON_Delete(root);
    if (s != GP_OK) *out = NULL;
    return s;
}

gp_status gp_model_from_json_file(const char *path, gp_model **out) {
    if (out) *out = NULL;
    if (!path || !out)
        return gp_error(GP_INVALID_ARGUMENT, "gp_model_from_json_file: NULL %s",
                        path ? "out" : "path");
    int fd; /* a FIFO or device is refused, never waited on */
    uint64_t nbytes;
    GP_TRY(gp_open_regular(path, &fd, &nbytes));
    FILE *f = fdopen(fd, "rb");
    if (!f) {
        close(fd);
        return gp_error(GP_IO, "%s: cannot open the config: %s", path, strerror(errno));
    }
    char *buf = NULL;
    size_t n = 0, cap = 0;
    gp_status s = GP_OK;
    for (;;) {
        if (n + 4096 + 1 > cap) {
            cap = cap ? 2 * cap : 65536;
            char *p = realloc(buf, cap);
            if (!p) {
                s = gp_error(GP_OUT_OF_MEMORY, "%s: out of memory reading the config", path);
                break;
            }
            buf = p;
        }
        size_t want = cap - n - 1, r = fread(buf + n, 1, want, f);
        n += r;
        if (n > CFG_MAX_FILE_BYTES) {
            s = gp_error(GP_CONFIG, "%s: more than %d bytes: expected a JSON model config", path,
                         CFG_MAX_FILE_BYTES);
            break;
        }
        if (r < want) break; /* end of file or error */
    }
    if (s == GP_OK && ferror(f)) s = gp_error(GP_IO, "%s: read error: %s", path, strerror(errno));
    fclose(f);
    if (s == GP_OK) {
        buf[n] = '\0';
        if (memchr(buf, '\0', n))
            s = gp_error(GP_CONFIG, "%s: contains a NUL byte at offset %zu: expected JSON text",
                         path, (size_t)((char *)memchr(buf, '\0', n) - buf));
        else
            s = gp_model_from_json_string(buf, path, out);
    }
    free(buf);
    return s;
}

gp_status gp_transformer_config_from_json(const char *json, const char *origin,
                                          gp_transformer_config *out, bool *gpt2) {
    if (!json || !out || !gpt2)
        return gp_error(GP_INVALID_ARGUMENT, "gp_transformer_config_from_json: NULL argument");
    if (!origin) origin = "<string>";
    cJSON *root = cJSON_Parse(json);
    if (!root) return gp_error(GP_CONFIG, "%s: invalid JSON (expected a model config)", origin);
    const cJSON *fam = cJSON_GetObjectItemCaseSensitive(root, "family");
    gp_status s;
    if (!cJSON_IsString(fam) ||
        (strcmp(fam->valuestring, "gpt2") != 0 && strcmp(fam->valuestring, "transformer") != 0)) {
        s = cfg_error(origin, "family", "expected \"gpt2\" or \"transformer\"");
    } else {
        *gpt2 = strcmp(fam->valuestring, "gpt2") == 0;
        s = read_transformer(origin, root, *gpt2, out);
    }
    cJSON_Delete(root);
    return s;
}

gp_status gp_transformer_config_json(const gp_transformer_config *c, const char *family,
                                     char *buf, size_t nbytes) {
    if (!c || !family || !buf)
        return gp_error(GP_INVALID_ARGUMENT, "gp_transformer_config_json: NULL argument");
    int n = snprintf(buf, nbytes,
                     "{\"family\": \"%s\", \"vocab\": %d, \"vocab_padded\": %d, \"dim\": %d, "
                     "\"heads\": %d, \"d_ff\": %d, \"layers\": %d, \"seq_len\": %d, "
                     "\"max_len\": %d, \"dropout\": %.9g, \"tie_embeddings\": %s}",
                     family, c->vocab, c->vocab_padded ? c->vocab_padded : c->vocab, c->dim,
                     c->heads, c->d_ff, c->layers, c->seq_len,
                     c->max_len ? c->max_len : c->seq_len, (double)c->dropout,
                     c->tie_embeddings ? "true" : "false");
    if (n < 0 || (size_t)n >= nbytes)
        return gp_error(GP_INVALID_ARGUMENT, "gp_transformer_config_json: %zu bytes of buffer, "
                                             "%d needed", nbytes, n + 1);
    return GP_OK;
}
