/* GPT-2 between gpipe and Hugging Face's GPT2LMHeadModel files (config.json and
 * model.safetensors): their names, Conv1D's (in, out) weights against gpipe's (out, in), the
 * vocabulary padding gpipe adds and HF does not, and the config options gpipe computes. */
#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "core/read_file.h"

#define HF_MAX_CONFIG_BYTES (16u << 20)
#define HF_MAX_NAME 160

/* ------------------------------------------------------------ config.json */

static gp_status hf_int(const char *path, const cJSON *root, const char *key, int def, int lo,
                        int *out) {
    const cJSON *j = cJSON_GetObjectItemCaseSensitive(root, key);
    if (!j || cJSON_IsNull(j)) {
        *out = def;
        return GP_OK;
    }
    if (!cJSON_IsNumber(j) || j->valuedouble != floor(j->valuedouble) || j->valuedouble < lo ||
        j->valuedouble > (1 << 24))
        return gp_error(GP_CONFIG, "%s: \"%s\": expected an integer from %d to %d", path, key, lo,
                        1 << 24);
    *out = (int)j->valuedouble;
    return GP_OK;
}

/* A key gpipe computes one way only: absent, or the value it computes. */
static gp_status hf_require(const char *path, const cJSON *root, const char *key,
                            const char *want_str, int want_bool, double want_num) {
    const cJSON *j = cJSON_GetObjectItemCaseSensitive(root, key);
    if (!j || cJSON_IsNull(j)) return GP_OK;
    bool ok = want_str   ? cJSON_IsString(j) && strcmp(j->valuestring, want_str) == 0
              : want_bool >= 0 ? cJSON_IsBool(j) && cJSON_IsTrue(j) == (want_bool != 0)
                               : cJSON_IsNumber(j) && fabs(j->valuedouble - want_num) <= 1e-12;
    if (ok) return GP_OK;
    char *got = cJSON_PrintUnformatted(j);
    gp_status s = gp_error(GP_UNSUPPORTED,
                           "%s: \"%s\" is %.80s: gpipe's GPT-2 supports only %s%s%s", path, key,
                           got ? got : "?", want_str ? "\"" : "",
                           want_str ? want_str : want_bool == 1 ? "true" : want_bool == 0 ? "false"
                                                                                : "1e-05",
                           want_str ? "\"" : "");
    free(got);
    return s;
}

/* GPT2Config's keys that change what is computed; the rest (dropout, token ids, generation and
 * summary settings) do not. Dropout is left out: an imported model trains without it. */
static gp_status hf_parse_config(const char *path, const cJSON *root, gp_transformer_config *c) {
    if (!cJSON_IsObject(root))
        return gp_error(GP_CONFIG, "%s: expected a JSON object (a GPT2Config)", path);
    GP_TRY(hf_require(path, root, "model_type", "gpt2", -1, 0));
    const cJSON *act = cJSON_GetObjectItemCaseSensitive(root, "activation_function");
    if (!(act && cJSON_IsString(act) && strcmp(act->valuestring, "gelu_pytorch_tanh") == 0))
        GP_TRY(hf_require(path, root, "activation_function", "gelu_new", -1, 0));
    GP_TRY(hf_require(path, root, "layer_norm_epsilon", NULL, -1, 1e-5));
    GP_TRY(hf_require(path, root, "scale_attn_weights", NULL, 1, 0));
    GP_TRY(hf_require(path, root, "scale_attn_by_inverse_layer_idx", NULL, 0, 0));
    GP_TRY(hf_require(path, root, "add_cross_attention", NULL, 0, 0));
    GP_TRY(hf_require(path, root, "tie_word_embeddings", NULL, 1, 0));
    *c = gp_gpt2_defaults();
    GP_TRY(hf_int(path, root, "vocab_size", 50257, 1, &c->vocab));
    GP_TRY(hf_int(path, root, "n_positions", 1024, 1, &c->max_len));
    GP_TRY(hf_int(path, root, "n_embd", 768, 1, &c->dim));
    GP_TRY(hf_int(path, root, "n_layer", 12, 0, &c->layers));
    GP_TRY(hf_int(path, root, "n_head", 12, 1, &c->heads));
    GP_TRY(hf_int(path, root, "n_inner", 4 * c->dim, 1, &c->d_ff));
    if (c->dim % c->heads != 0)
        return gp_error(GP_CONFIG, "%s: n_embd %d must be a multiple of n_head %d", path, c->dim,
                        c->heads);
    c->seq_len = c->max_len;
    c->vocab_padded = (c->vocab + 63) / 64 * 64;
    c->dropout = 0.0f;
    c->tie_embeddings = true;
    return GP_OK;
}

gp_status gp_hf_gpt2_config(const char *path, gp_transformer_config *out) {
    if (!path || !out) return gp_error(GP_INVALID_ARGUMENT, "gp_hf_gpt2_config: NULL argument");
    cJSON *root;
    GP_TRY(gp_read_json(path, HF_MAX_CONFIG_BYTES, &root));
    if (!root) return gp_error(GP_CONFIG, "%s: not valid JSON (expected a GPT2Config)", path);
    gp_status s = hf_parse_config(path, root, out);
    cJSON_Delete(root);
    return s;
}

/* ------------------------------------------------------------ the tensors */

/* One gpipe tensor of a GPT-2 model and its HF counterpart. Transposed: HF's Conv1D (in, out)
 * against gpipe's (out, in). Rows: how many of gpipe's rows HF holds (the vocabulary padding's
 * are gpipe's only). */
typedef struct hf_map {
    char ours[HF_MAX_NAME], theirs[HF_MAX_NAME];
    gp_shape shape; /* gpipe's */
    bool transposed;
    int64_t rows;
} hf_map;

static int hf_maps(const gp_transformer_config *c, hf_map *m) {
    static const struct {
        const char *ours, *theirs;
        int rows, cols; /* 0: dim, 1: 3 dim, 2: d_ff, -1: a vector */
        bool t;
    } block[] = {
        {"ln1.weight", "ln_1.weight", 0, -1, false},
        {"ln1.bias", "ln_1.bias", 0, -1, false},
        {"attn.qkv.weight", "attn.c_attn.weight", 1, 0, true},
        {"attn.qkv.bias", "attn.c_attn.bias", 1, -1, false},
        {"attn.proj.weight", "attn.c_proj.weight", 0, 0, true},
        {"attn.proj.bias", "attn.c_proj.bias", 0, -1, false},
        {"ln2.weight", "ln_2.weight", 0, -1, false},
        {"ln2.bias", "ln_2.bias", 0, -1, false},
        {"mlp.fc.weight", "mlp.c_fc.weight", 2, 0, true},
        {"mlp.fc.bias", "mlp.c_fc.bias", 2, -1, false},
        {"mlp.proj.weight", "mlp.c_proj.weight", 0, 2, true},
        {"mlp.proj.bias", "mlp.c_proj.bias", 0, -1, false},
    };
    const int64_t size[3] = {c->dim, 3 * (int64_t)c->dim, c->d_ff};
    const int rows = c->vocab_padded ? c->vocab_padded : c->vocab;
    const int max_len = c->max_len ? c->max_len : c->seq_len;
    int n = 0;
    m[n] = (hf_map){.shape = gp_shape2(rows, c->dim), .rows = c->vocab};
    snprintf(m[n].ours, HF_MAX_NAME, "layers.0.weight");
    snprintf(m[n++].theirs, HF_MAX_NAME, "wte.weight");
    m[n] = (hf_map){.shape = gp_shape2(max_len, c->dim), .rows = max_len};
    snprintf(m[n].ours, HF_MAX_NAME, "layers.1.weight");
    snprintf(m[n++].theirs, HF_MAX_NAME, "wpe.weight");
    for (int i = 0; i < c->layers; i++)
        for (size_t j = 0; j < sizeof block / sizeof block[0]; j++) {
            const int64_t r = size[block[j].rows];
            m[n] = (hf_map){.shape = block[j].cols < 0 ? gp_shape1(r)
                                                       : gp_shape2(r, size[block[j].cols]),
                            .transposed = block[j].t, .rows = r};
            snprintf(m[n].ours, HF_MAX_NAME, "layers.%d.%s", 2 + i, block[j].ours);
            snprintf(m[n++].theirs, HF_MAX_NAME, "h.%d.%s", i, block[j].theirs);
        }
    for (int j = 0; j < 2; j++) {
        m[n] = (hf_map){.shape = gp_shape1(c->dim), .rows = c->dim};
        snprintf(m[n].ours, HF_MAX_NAME, "layers.%d.%s", 2 + c->layers, j ? "bias" : "weight");
        snprintf(m[n++].theirs, HF_MAX_NAME, "ln_f.%s", j ? "bias" : "weight");
    }
    return n;
}

/* HF's shape of a mapped tensor. */
static gp_shape hf_shape(const hf_map *m) {
    if (m->shape.ndim == 1) return m->shape;
    return m->transposed ? gp_shape2(m->shape.dim[1], m->shape.dim[0])
                         : gp_shape2(m->rows, m->shape.dim[1]);
}

/* src (HF's layout) into dst (gpipe's) or back: a transpose, or the first rows copied and the
 * padding rows zero. */
static void hf_convert(const hf_map *m, const float *src, float *dst, bool to_gpipe) {
    const int64_t R = m->shape.dim[0], C = m->shape.ndim == 2 ? m->shape.dim[1] : 1;
    if (m->transposed) {
        for (int64_t r = 0; r < R; r++)
            for (int64_t k = 0; k < C; k++) {
                if (to_gpipe)
                    dst[r * C + k] = src[k * R + r];
                else
                    dst[k * R + r] = src[r * C + k];
            }
        return;
    }
    memcpy(dst, src, (size_t)(m->rows * C) * sizeof(float));
    if (to_gpipe && m->rows < R)
        memset(dst + m->rows * C, 0, (size_t)((R - m->rows) * C) * sizeof(float));
}

static int hf_ntensors(const gp_transformer_config *c) { return 4 + 12 * c->layers; }

/* The name under which f holds HF's tensor `name`: with the "transformer." prefix or without. */
static const gp_st_entry *hf_find(const gp_safetensors *f, const char *name, bool prefixed) {
    char full[HF_MAX_NAME + 16];
    snprintf(full, sizeof full, "%s%s", prefixed ? "transformer." : "", name);
    return gp_safetensors_find(f, full);
}

/* Tensors an HF file may hold beyond the parameters: the tied head, and the causal-mask buffers
 * of older versions. */
static bool hf_ignorable(const char *name) {
    const char *dot = strrchr(name, '.');
    return strcmp(name, "lm_head.weight") == 0 ||
           (dot && (strcmp(dot, ".masked_bias") == 0 ||
                    (strcmp(dot, ".bias") == 0 && dot - name >= 5 &&
                     strncmp(dot - 5, ".attn", 5) == 0)));
}

gp_status gp_hf_gpt2_import(const char *dir, const char *out_path, gp_transformer_config *cfg) {
    if (!dir || !out_path || !cfg)
        return gp_error(GP_INVALID_ARGUMENT, "gp_hf_gpt2_import: NULL argument");
    char cpath[4096], wpath[4096];
    snprintf(cpath, sizeof cpath, "%s/config.json", dir);
    snprintf(wpath, sizeof wpath, "%s/model.safetensors", dir);
    gp_transformer_config c;
    GP_TRY(gp_hf_gpt2_config(cpath, &c));
    gp_safetensors *f;
    GP_TRY(gp_safetensors_read(wpath, &f));
    const int nt = hf_ntensors(&c);
    hf_map *maps = calloc((size_t)nt, sizeof *maps);
    float **bufs = calloc((size_t)nt, sizeof *bufs);
    gp_safetensors_writer *w = NULL;
    gp_status s = maps && bufs ? gp_safetensors_writer_new(&w)
                               : gp_error(GP_OUT_OF_MEMORY, "%s: out of host memory", wpath);
    const bool prefixed = gp_safetensors_find(f, "transformer.wte.weight") != NULL;
    if (s == GP_OK) hf_maps(&c, maps);
    /* Every tensor of the file is one gpipe reads or one it may ignore. */
    for (int i = 0; s == GP_OK && i < gp_safetensors_count(f); i++) {
        const char *name = gp_safetensors_entry(f, i)->name;
        const char *bare = prefixed && strncmp(name, "transformer.", 12) == 0 ? name + 12 : name;
        bool known = hf_ignorable(name);
        for (int k = 0; k < nt && !known; k++) known = strcmp(bare, maps[k].theirs) == 0;
        if (!known)
            s = gp_error(GP_FORMAT, "%s: tensor \"%s\" is not part of a GPT2LMHeadModel of %d "
                         "layers (config %s)", wpath, name, c.layers, cpath);
    }
    for (int k = 0; s == GP_OK && k < nt; k++) {
        const hf_map *m = &maps[k];
        const gp_st_entry *e = hf_find(f, m->theirs, prefixed);
        const gp_shape want = hf_shape(m);
        char a[64], b[64];
        if (!e) {
            s = gp_error(GP_FORMAT, "%s: missing tensor \"%s%s\" (shape %s; config %s)", wpath,
                         prefixed ? "transformer." : "", m->theirs,
                         gp_shape_str(&want, a, sizeof a), cpath);
            break;
        }
        if (!gp_shape_equal(&e->shape, &want)) {
            s = gp_error(GP_SHAPE, "%s: tensor \"%s\" has shape %s, expected %s from %s", wpath,
                         e->name, gp_shape_str(&e->shape, a, sizeof a),
                         gp_shape_str(&want, b, sizeof b), cpath);
            break;
        }
        const int64_t n = gp_shape_nelem(&m->shape);
        float *hf = malloc((size_t)gp_shape_nelem(&want) * sizeof *hf);
        bufs[k] = malloc((size_t)n * sizeof(float));
        if (!hf || !bufs[k]) s = gp_error(GP_OUT_OF_MEMORY, "%s: out of host memory for %s",
                                          wpath, e->name);
        if (s == GP_OK) s = gp_safetensors_get(f, e->name, GP_F32, &want, hf);
        if (s == GP_OK) {
            hf_convert(m, hf, bufs[k], true);
            s = gp_safetensors_writer_add(w, m->ours, GP_F32, m->shape, bufs[k]);
        }
        free(hf);
    }
    char config[512];
    if (s == GP_OK) s = gp_transformer_config_json(&c, "gpt2", config, sizeof config);
    if (s == GP_OK) s = gp_safetensors_writer_meta(w, "model_config", config);
    if (s == GP_OK) s = gp_safetensors_writer_meta(w, "source", wpath);
    if (s == GP_OK) s = gp_safetensors_writer_write(w, out_path);
    gp_safetensors_writer_free(w);
    for (int k = 0; bufs && k < nt; k++) free(bufs[k]);
    free(bufs);
    free(maps);
    gp_safetensors_free(f);
    if (s == GP_OK) *cfg = c;
    return s;
}

/* ------------------------------------------------------------ export */

static gp_status hf_find_param(gp_model *m, const char *ours, gp_param_info *out) {
    const int n = gp_model_nparam_tensors(m);
    for (int i = 0; i < n; i++) {
        GP_TRY(gp_model_param(m, i, out));
        char name[HF_MAX_NAME];
        snprintf(name, sizeof name, "layers.%d.%s", out->layer, out->name);
        if (strcmp(name, ours) == 0) return GP_OK;
    }
    return gp_error(GP_CONFIG, "gpt2 export: the model has no parameter %s (expected a gpt2 "
                               "family model)", ours);
}

static gp_status hf_write_config(const gp_transformer_config *c, const char *path) {
    char text[2048];
    const int max_len = c->max_len ? c->max_len : c->seq_len;
    int n = snprintf(text, sizeof text,
                     "{\n  \"architectures\": [\"GPT2LMHeadModel\"],\n"
                     "  \"model_type\": \"gpt2\",\n  \"activation_function\": \"gelu_new\",\n"
                     "  \"vocab_size\": %d,\n  \"n_positions\": %d,\n  \"n_ctx\": %d,\n"
                     "  \"n_embd\": %d,\n  \"n_layer\": %d,\n  \"n_head\": %d,\n"
                     "  \"n_inner\": %d,\n  \"layer_norm_epsilon\": 1e-05,\n"
                     "  \"resid_pdrop\": %g,\n  \"embd_pdrop\": 0.0,\n  \"attn_pdrop\": 0.0,\n"
                     "  \"scale_attn_weights\": true,\n"
                     "  \"scale_attn_by_inverse_layer_idx\": false,\n"
                     "  \"reorder_and_upcast_attn\": false,\n  \"tie_word_embeddings\": true,\n"
                     "  \"initializer_range\": 0.02,\n  \"bos_token_id\": %d,\n"
                     "  \"eos_token_id\": %d,\n  \"torch_dtype\": \"float32\"\n}\n",
                     c->vocab, max_len, max_len, c->dim, c->layers, c->heads, c->d_ff,
                     (double)c->dropout, c->vocab - 1, c->vocab - 1);
    gp_file_out fo;
    GP_TRY(gp_file_out_open(&fo, path));
    gp_file_out_write_bytes(&fo, text, (size_t)n);
    return gp_file_out_close(&fo, true);
}

gp_status gp_hf_gpt2_export(gp_model *model, const gp_transformer_config *c, const char *dir) {
    if (!model || !c || !dir)
        return gp_error(GP_INVALID_ARGUMENT, "gp_hf_gpt2_export: NULL argument");
    if (!c->tie_embeddings)
        return gp_error(GP_UNSUPPORTED, "gpt2 export: the model's embeddings are not tied "
                                        "(GPT2LMHeadModel's lm_head is wte)");
    char wpath[4096], cpath[4096];
    snprintf(wpath, sizeof wpath, "%s/model.safetensors", dir);
    snprintf(cpath, sizeof cpath, "%s/config.json", dir);
    const int nt = hf_ntensors(c);
    hf_map *maps = calloc((size_t)nt, sizeof *maps);
    float **bufs = calloc((size_t)nt, sizeof *bufs);
    gp_safetensors_writer *w = NULL;
    gp_status s = maps && bufs ? gp_safetensors_writer_new(&w)
                               : gp_error(GP_OUT_OF_MEMORY, "gpt2 export: out of host memory");
    if (s == GP_OK) hf_maps(c, maps);
    for (int k = 0; s == GP_OK && k < nt; k++) {
        const hf_map *m = &maps[k];
        gp_param_info p;
        s = hf_find_param(model, m->ours, &p);
        char a[64], b[64];
        if (s == GP_OK && !gp_shape_equal(&p.value->shape, &m->shape))
            s = gp_error(GP_SHAPE, "gpt2 export: %s has shape %s, expected %s from the config",
                         m->ours, gp_shape_str(&p.value->shape, a, sizeof a),
                         gp_shape_str(&m->shape, b, sizeof b));
        const int64_t n = gp_shape_nelem(&m->shape);
        float *ours = NULL;
        if (s == GP_OK) {
            ours = malloc((size_t)n * sizeof *ours);
            bufs[k] = malloc((size_t)n * sizeof(float));
            if (!ours || !bufs[k])
                s = gp_error(GP_OUT_OF_MEMORY, "gpt2 export: out of host memory for %s", m->ours);
        }
        if (s == GP_OK) s = gp_tensor_to_host(p.value, ours, (size_t)n * sizeof(float));
        if (s == GP_OK) {
            hf_convert(m, ours, bufs[k], false);
            char name[HF_MAX_NAME + 16];
            snprintf(name, sizeof name, "transformer.%s", m->theirs);
            s = gp_safetensors_writer_add(w, name, GP_F32, hf_shape(m), bufs[k]);
        }
        free(ours);
    }
    /* what save_pretrained writes: transformers reads "pt" files as PyTorch tensors */
    if (s == GP_OK) s = gp_safetensors_writer_meta(w, "format", "pt");
    if (s == GP_OK) s = gp_safetensors_writer_write(w, wpath);
    if (s == GP_OK) s = hf_write_config(c, cpath);
    gp_safetensors_writer_free(w);
    for (int k = 0; bufs && k < nt; k++) free(bufs[k]);
    free(bufs);
    free(maps);
    return s;
}
