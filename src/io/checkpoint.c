/* Checkpoints: a model's parameters, buffers and optimizer state with the training position, as
 * a safetensors file with readable per-layer names ("layers.3.attn.qkv.weight", "...adam_m").
 * Names and metadata do not depend on which device or stage held a layer, which is what lets a
 * run saved on K stages resume on any other K. Loading checks the whole file against the model
 * before it copies one byte, so a wrong file leaves the model as it was. */
#include <errno.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#include "io/checkpoint_internal.h"
#include "io/safetensors_internal.h"
#include "model/model_internal.h"
#include "optim/optim.h"

#define CKPT_FORMAT "gpipe.checkpoint"
#define CKPT_VERSION "1"
#define CKPT_NAME_MAX 600

static const char *state_suffix(const gp_optim_opts *o, int k) {
    if (o->kind == GP_OPTIM_ADAMW) return k == 0 ? "adam_m" : "adam_v";
    return "momentum";
}

static const char *optim_kind_name(gp_optim_kind k) {
    return k == GP_OPTIM_ADAMW ? "adamw" : "sgd";
}

/* "embedding,pos_embedding,transformer_block,..." (malloc'd). */
static char *layer_kinds(const gp_model *m) {
    size_t n = 1;
    for (int i = 0; i < m->nlayers; i++) n += strlen(m->layers[i]->ops->kind) + 1;
    char *s = malloc(n);
    if (!s) return NULL;
    s[0] = '\0';
    for (int i = 0; i < m->nlayers; i++) {
        if (i) strcat(s, ",");
        strcat(s, m->layers[i]->ops->kind);
    }
    return s;
}

static void optim_json(const gp_optim_opts *o, char *buf, size_t n) {
    snprintf(buf, n,
             "{\"kind\":\"%s\",\"lr\":%.9g,\"momentum\":%.9g,\"beta1\":%.9g,\"beta2\":%.9g,"
             "\"eps\":%.9g,\"weight_decay\":%.9g,\"warmup_steps\":%d,\"total_steps\":%d,"
             "\"min_lr\":%.9g,\"clip_norm\":%.9g}",
             optim_kind_name(o->kind), (double)o->lr, (double)o->momentum, (double)o->beta1,
             (double)o->beta2, (double)o->eps, (double)o->weight_decay, o->warmup_steps,
             o->total_steps, (double)o->min_lr, (double)o->clip_norm);
}

/* Host copies of device tensors, kept until the writer has written them (it borrows data). */
typedef struct staging {
    void **buf;
    int n, cap;
} staging;

static void staging_free(staging *st) {
    for (int i = 0; i < st->n; i++) free(st->buf[i]);
    free(st->buf);
}

/* t's bytes as host memory: t's own when the host can read them, else a copy kept in st. */
static gp_status host_bytes(const gp_tensor *t, staging *st, const void **out) {
    if ((*out = gp_tensor_host_data(t))) return GP_OK;
    if (st->n == st->cap) {
        int cap = st->cap ? 2 * st->cap : 64;
        void **b = realloc(st->buf, (size_t)cap * sizeof *b);
        if (!b) return gp_error(GP_OUT_OF_MEMORY, "checkpoint: staging %d tensors", cap);
        st->buf = b;
        st->cap = cap;
    }
    size_t n = gp_tensor_nbytes(t);
    void *copy = malloc(n ? n : 1);
    if (!copy) return gp_error(GP_OUT_OF_MEMORY, "checkpoint: %zu bytes of host staging", n);
    st->buf[st->n++] = copy;
    *out = copy;
    return gp_tensor_to_host(t, copy, n);
}

/* Names live in one block so the writer, which borrows nothing but data, can copy them. */
static gp_status add_tensor(gp_safetensors_writer *w, staging *st, const char *path, int li,
                            const char *pname, const char *suffix, const gp_tensor *t) {
    char name[CKPT_NAME_MAX];
    snprintf(name, sizeof name, "layers.%d.%s%s%s", li, pname, suffix ? "." : "",
             suffix ? suffix : "");
    if (!t->data)
        return gp_error(GP_INVALID_ARGUMENT, "checkpoint %s: tensor \"%s\" is not allocated "
                                             "(initialize the model and create its pipeline "
                                             "first)",
                        path, name);
    const void *bytes;
    GP_TRY(host_bytes(t, st, &bytes));
    return gp_safetensors_writer_add(w, name, GP_F32, t->shape, bytes);
}

gp_status gp_ckpt_tensor_name(const gp_model *m, const gp_optim_opts *o, int li, int j, int k,
                              char *buf, size_t n) {
    const gp_param *p = &m->layers[li]->params[j];
    int len = snprintf(buf, n, "layers.%d.%s%s%s", li, p->name, k >= 0 ? "." : "",
                       k >= 0 ? state_suffix(o, k) : "");
    if (len < 0 || (size_t)len >= n)
        return gp_error(GP_INVALID_ARGUMENT, "checkpoint: tensor name of layer %d parameter %s "
                                             "longer than %zu bytes",
                        li, p->name, n - 1);
    return GP_OK;
}

int gp_ckpt_nstates(const gp_model *m, const gp_optim_opts *o, int li, int j) {
    return m->layers[li]->params[j].trainable ? gp_optim_state_count(o) : 0;
}

int gp_ckpt_nstored(const gp_model *m, const gp_optim_opts *o, int li, int j) {
    return gp_model_tie_copy(m, li, j) >= 0 ? 0 : 1 + gp_ckpt_nstates(m, o, li, j);
}

/* "layers.7.weight=layers.0.weight,..." (each tie's copy, then its owner), or "" untied. */
static void ties_str(const gp_model *m, char *buf, size_t n) {
    size_t used = 0;
    buf[0] = '\0';
    for (int i = 0; i < m->nties && used < n; i++) {
        const gp_tie *t = &m->ties[i];
        used += (size_t)snprintf(buf + used, n - used, "%slayers.%d.%s=layers.%d.%s",
                                 i ? "," : "", t->layer[1],
                                 m->layers[t->layer[1]]->params[t->param[1]].name, t->layer[0],
                                 m->layers[t->layer[0]]->params[t->param[0]].name);
    }
}

gp_status gp_ckpt_meta(const gp_model *m, int first, int last, const gp_optim_opts *o, int step,
                       const gp_checkpoint_kv *extra, int nextra, gp_ckpt_put put, void *ctx) {
    char buf[512], *kinds = layer_kinds(m);
    if (!kinds) return gp_error(GP_OUT_OF_MEMORY, "checkpoint: layer kinds");
    gp_status s = put(ctx, "format", CKPT_FORMAT);
    if (s == GP_OK) s = put(ctx, "format_version", CKPT_VERSION);
    if (s == GP_OK) s = put(ctx, "layer_kinds", kinds);
    snprintf(buf, sizeof buf, "%d-%d", first, last - 1);
    if (s == GP_OK) s = put(ctx, "layers", buf);
    snprintf(buf, sizeof buf, "%d", step);
    if (s == GP_OK) s = put(ctx, "step", buf);
    snprintf(buf, sizeof buf, "%" PRIu64, m->seed);
    if (s == GP_OK) s = put(ctx, "seed", buf);
    if (o) optim_json(o, buf, sizeof buf);
    if (s == GP_OK && o) s = put(ctx, "optimizer", buf);
    ties_str(m, buf, sizeof buf);
    if (s == GP_OK && m->nties) s = put(ctx, "tied", buf);
    for (int i = 0; i < nextra && s == GP_OK; i++) s = put(ctx, extra[i].key, extra[i].value);
    free(kinds);
    return s;
}

static gp_status put_writer(void *ctx, const char *key, const char *value) {
    return gp_safetensors_writer_meta(ctx, key, value);
}

gp_status gp_checkpoint_save(const char *path, gp_model *m, int first, int last,
                             const gp_optim_opts *o, int step, const gp_checkpoint_kv *extra,
                             int nextra) {
    if (!path || !m || (nextra > 0 && !extra))
        return gp_error(GP_INVALID_ARGUMENT, "gp_checkpoint_save: NULL argument");
    if (first < 0 || last > m->nlayers || first >= last)
        return gp_error(GP_INVALID_ARGUMENT, "checkpoint %s: layer range [%d, %d) outside the "
                                             "model's 0..%d",
                        path, first, last, m->nlayers);
    if (step < 0)
        return gp_error(GP_INVALID_ARGUMENT, "checkpoint %s: step %d, expected >= 0", path, step);
    gp_safetensors_writer *w;
    GP_TRY(gp_safetensors_writer_new(&w));
    staging st = {0};
    gp_status s = GP_OK;
    const int nstate = gp_optim_state_count(o);
    for (int li = first; li < last && s == GP_OK; li++) {
        gp_layer *l = m->layers[li];
        for (int j = 0; j < l->nparams && s == GP_OK; j++) {
            gp_param *p = &l->params[j];
            if (gp_model_tie_copy(m, li, j) >= 0) continue; /* stored once: its owner's */
            s = add_tensor(w, &st, path, li, p->name, NULL, &p->value);
            for (int k = 0; k < nstate && p->trainable && s == GP_OK; k++)
                s = add_tensor(w, &st, path, li, p->name, state_suffix(o, k), &p->state[k]);
        }
    }
    if (s == GP_OK) s = gp_ckpt_meta(m, first, last, o, step, extra, nextra, put_writer, w);
    if (s == GP_OK) s = gp_safetensors_writer_write(w, path);
    gp_safetensors_writer_free(w);
    staging_free(&st);
    return s;
}

gp_status gp_ckpt_parse_step(const char *v, const char *origin, int *step) {
    char *end;
    errno = 0;
    long n = v ? strtol(v, &end, 10) : -1;
    if (!v || !*v || *end || errno || n < 0 || n > 0x7fffffff)
        return gp_error(GP_FORMAT, "%s: __metadata__ \"step\": expected a step count from 0 to "
                                   "2^31-1, got %s%s%s",
                        origin, v ? "\"" : "", v ? v : "none", v ? "\"" : "");
    *step = (int)n;
    return GP_OK;
}

gp_status gp_checkpoint_step(const gp_safetensors *f, int *step) {
    if (!f || !step) return gp_error(GP_INVALID_ARGUMENT, "gp_checkpoint_step: NULL argument");
    return gp_ckpt_parse_step(gp_safetensors_meta(f, "step"), gp_safetensors_origin(f), step);
}

/* What lookup found a name to be besides the parameter itself (-1) or optimizer state k >= 0. */
enum { STATE_NOT_LOADED = -2 }; /* an optimizer state, recognized but not loaded (no optimizer) */

/* The model parameter a file name stands for, "layers.<li>.<param>[.<state suffix>]", or NULL;
 * *state: -1 the parameter's value, k >= 0 the optimizer's state k, or STATE_NOT_LOADED. */
static gp_param *lookup(const gp_model *m, const gp_optim_opts *o, const char *name, int *state,
                        int *layer) {
    *state = -1;
    if (strncmp(name, "layers.", 7) != 0 || name[7] < '0' || name[7] > '9') return NULL;
    char *end;
    errno = 0;
    long li = strtol(name + 7, &end, 10);
    if (errno || *end != '.' || li < 0 || li >= m->nlayers) return NULL;
    if (end - (name + 7) > 1 && name[7] == '0') return NULL; /* one spelling per layer */
    const char *rest = end + 1;
    gp_layer *l = m->layers[li];
    *layer = (int)li;
    for (int j = 0; j < l->nparams; j++) {
        gp_param *p = &l->params[j];
        size_t n = strlen(p->name);
        if (strncmp(rest, p->name, n) != 0) continue;
        if (rest[n] == '\0') return p;
        if (rest[n] != '.' || !p->trainable) continue;
        const char *suf = rest + n + 1;
        static const char *const all[] = {"adam_m", "adam_v", "momentum"};
        for (int k = 0; k < 3; k++)
            if (strcmp(suf, all[k]) == 0) {
                *state = STATE_NOT_LOADED;
                if (!o) return p;
                for (int q = 0; q < gp_optim_state_count(o); q++)
                    if (strcmp(suf, state_suffix(o, q)) == 0) {
                        *state = q;
                        return p;
                    }
                return NULL;
            }
    }
    return NULL;
}

static gp_tensor *target(gp_param *p, int state) {
    return state < 0 ? &p->value : &p->state[state];
}

static gp_status check_meta(const gp_safetensors *f, const gp_model *m, const gp_optim_opts *o) {
    const char *path = gp_safetensors_origin(f);
    const char *fmt = gp_safetensors_meta(f, "format");
    if (!fmt) {
        if (!o) return GP_OK; /* a foreign weights file: the tensors are checked one by one */
        return gp_error(GP_FORMAT, "%s: not a gpipe checkpoint (no \"format\" in __metadata__; "
                                   "expected \"%s\"), so there is no optimizer state to resume",
                        path, CKPT_FORMAT);
    }
    const char *ver = gp_safetensors_meta(f, "format_version");
    if (strcmp(fmt, CKPT_FORMAT) != 0 || !ver || strcmp(ver, CKPT_VERSION) != 0)
        return gp_error(GP_FORMAT, "%s: format \"%.40s\" version \"%.10s\", expected \"%s\" "
                                   "version %s",
                        path, fmt, ver ? ver : "none", CKPT_FORMAT, CKPT_VERSION);
    const char *kinds = gp_safetensors_meta(f, "layer_kinds");
    char *want = layer_kinds(m);
    if (!want) return gp_error(GP_OUT_OF_MEMORY, "%s: layer kinds", path);
    gp_status s = GP_OK;
    if (!kinds || strcmp(kinds, want) != 0) {
        /* Name the first layer that differs. */
        const char *a = kinds ? kinds : "", *b = want;
        int li = 0;
        while (*a && *a == *b) {
            if (*a == ',') li++;
            a++, b++;
        }
        s = gp_error(GP_FORMAT, "%s: a checkpoint of another model: its layers are \"%.200s\", "
                                "the model's \"%.200s\" (they differ from layer %d on)",
                     path, kinds ? kinds : "(none)", want, li);
    }
    free(want);
    GP_TRY(s);
    /* Tied weights are stored once: a file of the model tied otherwise lacks or has extras. */
    const char *tied = gp_safetensors_meta(f, "tied");
    char mine[512];
    ties_str(m, mine, sizeof mine);
    if (strcmp(tied ? tied : "", mine) != 0)
        return gp_error(GP_FORMAT, "%s: the checkpoint's model ties %s%.200s%s, this model ties "
                                   "%s%.200s%s (\"tie_embeddings\" in the config): load it into a "
                                   "model tied as it was saved",
                        path, tied ? "\"" : "", tied ? tied : "no weights", tied ? "\"" : "",
                        m->nties ? "\"" : "", m->nties ? mine : "no weights",
                        m->nties ? "\"" : "");
    /* The reader verified every checksum it found; a gpipe checkpoint must have all of them. */
    for (int i = 0; i < gp_safetensors_count(f); i++) {
        char key[CKPT_NAME_MAX + 8];
        const char *name = gp_safetensors_entry(f, i)->name;
        snprintf(key, sizeof key, "crc32:%s", name);
        if (!gp_safetensors_meta(f, key))
            return gp_error(GP_FORMAT, "%s: tensor \"%s\" has no checksum (\"%s\" in "
                                       "__metadata__), which every tensor of a gpipe checkpoint has",
                            path, name, key);
    }
    if (o) {
        const char *oj = gp_safetensors_meta(f, "optimizer");
        char key[64];
        snprintf(key, sizeof key, "{\"kind\":\"%s\"", optim_kind_name(o->kind));
        if (!oj || strncmp(oj, key, strlen(key)) != 0)
            return gp_error(GP_FORMAT, "%s: the checkpoint's optimizer is %.60s, expected %s "
                                       "state",
                            path, oj ? oj : "none (parameters only)", optim_kind_name(o->kind));
    }
    return GP_OK;
}

gp_status gp_ckpt_part_range(const gp_safetensors *f, const gp_model *m, int *first, int *last) {
    const char *v = gp_safetensors_meta(f, "layers");
    *first = 0;
    *last = m->nlayers;
    if (!v) return GP_OK; /* a foreign weights file: the whole model */
    int a = -1, b = -1, n = 0;
    if (sscanf(v, "%d-%d%n", &a, &b, &n) != 2 || v[n] || a < 0 || b < a || b >= m->nlayers)
        return gp_error(GP_FORMAT, "%s: __metadata__ \"layers\" is \"%.40s\", expected "
                                   "\"FIRST-LAST\" within the model's layers 0-%d",
                        gp_safetensors_origin(f), v, m->nlayers - 1);
    *first = a;
    *last = b + 1;
    return GP_OK;
}

/* Every tensor of f must be one of m's in the layers [pf, pl) the file says it holds; those of
 * layers [lo, hi) must have their parameter's dtype (F32) and declared shape, so this works on
 * a model not yet initialized. loading: only the tensors that will be copied are checked, and
 * they must be allocated. */
static gp_status check_tensors(const gp_safetensors *f, const gp_model *m, const gp_optim_opts *o,
                               int pf, int pl, int lo, int hi, bool loading) {
    const char *path = gp_safetensors_origin(f);
    char a[96], b[96];
    for (int i = 0; i < gp_safetensors_count(f); i++) {
        const gp_st_entry *e = gp_safetensors_entry(f, i);
        int state, li = -1;
        gp_param *p = lookup(m, o, e->name, &state, &li);
        if (!p)
            return gp_error(GP_FORMAT, "%s: tensor \"%s\" is not a parameter%s of this model "
                                       "(expected layers.<0..%d>.<parameter>%s)",
                            path, e->name, o ? " or optimizer state" : "", m->nlayers - 1,
                            o ? "[.adam_m|.adam_v|.momentum]" : "");
        const int tie = gp_model_tie_copy(m, li, (int)(p - m->layers[li]->params));
        if (tie >= 0)
            return gp_error(GP_FORMAT, "%s: tensor \"%s\" is tied to layers.%d.%s in this model, "
                                       "which takes its values from there (a file of the model "
                                       "untied?)",
                            path, e->name, m->ties[tie].layer[0],
                            m->layers[m->ties[tie].layer[0]]->params[m->ties[tie].param[0]].name);
        if (li < pf || li >= pl)
            return gp_error(GP_FORMAT, "%s: tensor \"%s\" is outside the layers %d-%d the file "
                                       "holds (__metadata__ \"layers\")",
                            path, e->name, pf, pl - 1);
        if (li < lo || li >= hi || (loading && state == STATE_NOT_LOADED)) continue;
        if (loading && !target(p, state)->data)
            return gp_error(GP_INVALID_ARGUMENT, "%s: tensor \"%s\": the model's is not allocated "
                                                 "(initialize the model and create its pipeline "
                                                 "first)",
                            path, e->name);
        if (e->dtype != GP_F32)
            return gp_error(GP_FORMAT, "%s: tensor \"%s\" is %s, expected F32", path, e->name,
                            e->dtype == GP_I32 ? "I32" : "F32");
        if (!gp_shape_equal(&e->shape, &p->shape))
            return gp_error(GP_SHAPE, "%s: tensor \"%s\" has shape %s, the model's is %s", path,
                            e->name, gp_shape_str(&e->shape, a, sizeof a),
                            gp_shape_str(&p->shape, b, sizeof b));
    }
    return GP_OK;
}

/* Every tensor of m's layers [lo, hi) (with o's states) must be in f, which holds [pf, pl). */
static gp_status check_present(const gp_safetensors *f, const gp_model *m, const gp_optim_opts *o,
                               int pf, int pl, int lo, int hi) {
    char name[CKPT_NAME_MAX];
    for (int li = lo; li < hi; li++) {
        const gp_layer *l = m->layers[li];
        for (int j = 0; j < l->nparams; j++)
            for (int k = -1; k < gp_ckpt_nstored(m, o, li, j) - 1; k++) {
                GP_TRY(gp_ckpt_tensor_name(m, o, li, j, k, name, sizeof name));
                if (!gp_safetensors_find(f, name))
                    return gp_error(GP_FORMAT, "%s: no tensor \"%s\" (layer %d, %s, %s %s)%s",
                                    gp_safetensors_origin(f), name, li, l->ops->kind,
                                    k >= 0 ? "optimizer state of" : "parameter",
                                    l->params[j].name,
                                    pf > 0 || pl < m->nlayers
                                        ? ": the file holds only some layers (one part of a "
                                          "multi-part checkpoint? open its index)"
                                        : "");
            }
    }
    return GP_OK;
}

/* Tensor `name` of f into t (checked dtype and shape): straight into t's memory when the host
 * can write it, else through a host copy. */
static gp_status copy_into(const gp_safetensors *f, const char *name, gp_tensor *t) {
    void *direct = gp_tensor_host_data(t);
    if (direct) return gp_safetensors_get(f, name, GP_F32, &t->shape, direct);
    size_t n = gp_tensor_nbytes(t);
    void *host = malloc(n ? n : 1);
    if (!host) return gp_error(GP_OUT_OF_MEMORY, "%s: %zu bytes of host staging", name, n);
    gp_status s = gp_safetensors_get(f, name, GP_F32, &t->shape, host);
    if (s == GP_OK) s = gp_tensor_from_host(t, host, n);
    free(host);
    return s;
}

gp_status gp_ckpt_check_header(const gp_safetensors *f, const gp_model *m, int lo, int hi) {
    int pf, pl;
    GP_TRY(check_meta(f, m, NULL));
    GP_TRY(gp_ckpt_part_range(f, m, &pf, &pl));
    if (lo < pf || hi > pl)
        return gp_error(GP_FORMAT, "%s: holds layers %d-%d only, layers %d-%d were asked for (one "
                                   "part of a multi-part checkpoint? open its index)",
                        gp_safetensors_origin(f), pf, pl - 1, lo, hi - 1);
    GP_TRY(check_tensors(f, m, NULL, pf, pl, lo, hi, false));
    return check_present(f, m, NULL, pf, pl, lo, hi);
}

gp_status gp_ckpt_check(const gp_safetensors *f, gp_model *m, const gp_optim_opts *o, int lo,
                        int hi) {
    int pf, pl;
    GP_TRY(check_meta(f, m, o));
    GP_TRY(gp_ckpt_part_range(f, m, &pf, &pl));
    GP_TRY(check_tensors(f, m, o, pf, pl, lo, hi, true));
    return check_present(f, m, o, pf, pl, lo, hi);
}

gp_status gp_ckpt_verify(const gp_safetensors *f) {
    for (int i = 0; i < gp_safetensors_count(f); i++)
        GP_TRY(gp_st_verify(f, gp_safetensors_entry(f, i)));
    return GP_OK;
}

gp_status gp_ckpt_copy(const gp_safetensors *f, gp_model *m, const gp_optim_opts *o, int lo,
                       int hi) {
    for (int i = 0; i < gp_safetensors_count(f); i++) {
        const gp_st_entry *e = gp_safetensors_entry(f, i);
        int state, li = -1;
        gp_param *p = lookup(m, o, e->name, &state, &li);
        if (!p || state == STATE_NOT_LOADED) continue;
        if (li >= lo && li < hi) GP_TRY(copy_into(f, e->name, target(p, state)));
        /* A tied copy in the range takes its owner's tensor, wherever the owner is. */
        for (int t = 0; t < m->nties; t++) {
            const gp_tie *tie = &m->ties[t];
            if (tie->layer[0] == li && &m->layers[li]->params[tie->param[0]] == p &&
                tie->layer[1] >= lo && tie->layer[1] < hi)
                GP_TRY(copy_into(f, e->name,
                                 target(&m->layers[tie->layer[1]]->params[tie->param[1]], state)));
        }
    }
    return GP_OK;
}

bool gp_ckpt_needs_layer(const gp_model *m, int li, int lo, int hi) {
    if (li >= lo && li < hi) return true;
    for (int t = 0; t < m->nties; t++)
        if (m->ties[t].layer[0] == li && m->ties[t].layer[1] >= lo && m->ties[t].layer[1] < hi)
            return true;
    return false;
}

gp_status gp_checkpoint_load(const gp_safetensors *f, gp_model *m, const gp_optim_opts *o) {
    if (!f || !m) return gp_error(GP_INVALID_ARGUMENT, "gp_checkpoint_load: NULL argument");
    GP_TRY(gp_ckpt_check(f, m, o, 0, m->nlayers));
    GP_TRY(gp_ckpt_verify(f));
    return gp_ckpt_copy(f, m, o, 0, m->nlayers); /* all checked: copy */
}
