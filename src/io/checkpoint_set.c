/* Checkpoints to load from, in either form: one safetensors file, or a multi-part set that a
 * multi-process pipeline writes (one part per stage) and commits with an index,
 * "<base>.safetensors.index.json". The index is the commit: it is written, atomically, only
 * after every part is durable, and it records each part's layers, size and CRC-32, so a set
 * without its index is never taken for a checkpoint and a part changed since is caught before
 * one byte is loaded. Its "weight_map" (tensor -> part file) is the layout of sharded
 * safetensors checkpoints that PyTorch tooling reads. Loading a layer range reads only the
 * parts that hold it, which is how a run resumes on another number of stages. */
#include <cjson/cJSON.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/read_file.h"
#include "io/checkpoint_internal.h"
#include "io/safetensors_internal.h"
#include "model/model_internal.h"

#define INDEX_MAX_BYTES (16u << 20)
#define MAX_PARTS 4096

typedef struct ckpt_part {
    char *file; /* as in the index: a name in the index's folder */
    char *path; /* folder + file */
    int first, last;
    uint64_t bytes;
    uint32_t crc;
} ckpt_part;

struct gp_checkpoint {
    char *path;
    gp_safetensors *single; /* the one-file form, or NULL */
    cJSON *index;           /* the set form: the parsed index */
    const cJSON *meta;      /* its "metadata" object */
    ckpt_part *parts;
    int nparts;
};

gp_status gp_checkpoint_file_info(const char *path, uint64_t *bytes, uint32_t *crc32_out) {
    if (!path || !bytes || !crc32_out)
        return gp_error(GP_INVALID_ARGUMENT, "gp_checkpoint_file_info: NULL argument");
    int fd;
    GP_TRY(gp_open_regular(path, &fd, bytes));
    gp_status s = gp_crc32_file_range(fd, path, 0, *bytes, crc32_out);
    close(fd);
    return s;
}

/* ------------------------------------------------------------------ commit */

static gp_status put_json(void *ctx, const char *key, const char *value) {
    cJSON *s = cJSON_CreateString(value);
    if (!s || !cJSON_AddItemToObject(ctx, key, s)) {
        cJSON_Delete(s);
        return gp_error(GP_OUT_OF_MEMORY, "checkpoint index: metadata \"%s\"", key);
    }
    return GP_OK;
}

static bool plain_name(const char *f) {
    return f && *f && *f != '.' && !strchr(f, '/') && !strchr(f, '\\') && strlen(f) < 1024;
}

gp_status gp_checkpoint_commit(const char *index_path, const gp_model *m,
                               const gp_checkpoint_part *parts, int nparts,
                               const gp_optim_opts *o, int step, const gp_checkpoint_kv *extra,
                               int nextra) {
    if (!index_path || !m || !parts || (nextra > 0 && !extra))
        return gp_error(GP_INVALID_ARGUMENT, "gp_checkpoint_commit: NULL argument");
    if (nparts < 1 || nparts > MAX_PARTS)
        return gp_error(GP_INVALID_ARGUMENT, "checkpoint index %s: %d parts, expected 1..%d",
                        index_path, nparts, MAX_PARTS);
    for (int i = 0; i < nparts; i++) {
        int want = i ? parts[i - 1].last : 0;
        if (!plain_name(parts[i].file) || parts[i].first != want ||
            parts[i].last <= parts[i].first || parts[i].last > m->nlayers ||
            (i == nparts - 1 && parts[i].last != m->nlayers))
            return gp_error(GP_INVALID_ARGUMENT, "checkpoint index %s: part %d (\"%s\", layers "
                                                 "[%d, %d)): expected a file name in the "
                                                 "index's folder and layers from %d on, the "
                                                 "parts covering 0..%d in order",
                            index_path, i, parts[i].file ? parts[i].file : "(null)",
                            parts[i].first, parts[i].last, want, m->nlayers);
    }
    cJSON *root = cJSON_CreateObject(), *meta = cJSON_AddObjectToObject(root, "metadata");
    cJSON *arr = cJSON_AddArrayToObject(root, "parts"), *wm = cJSON_AddObjectToObject(root, "weight_map");
    gp_status s = root && meta && arr && wm ? GP_OK
                                            : gp_error(GP_OUT_OF_MEMORY, "checkpoint index %s",
                                                       index_path);
    if (s == GP_OK) s = gp_ckpt_meta(m, 0, m->nlayers, o, step, extra, nextra, put_json, meta);
    char name[700], crc[16];
    for (int i = 0; i < nparts && s == GP_OK; i++) {
        cJSON *e = cJSON_CreateObject();
        cJSON *ly = cJSON_CreateIntArray((const int[]){parts[i].first, parts[i].last}, 2);
        snprintf(crc, sizeof crc, "%08x", (unsigned)parts[i].crc32);
        if (!e || !ly || !cJSON_AddStringToObject(e, "file", parts[i].file) ||
            !cJSON_AddItemToObject(e, "layers", ly) ||
            !cJSON_AddNumberToObject(e, "bytes", (double)parts[i].bytes) ||
            !cJSON_AddStringToObject(e, "crc32", crc) || !cJSON_AddItemToArray(arr, e)) {
            cJSON_Delete(e);
            s = gp_error(GP_OUT_OF_MEMORY, "checkpoint index %s", index_path);
            break;
        }
        for (int li = parts[i].first; li < parts[i].last && s == GP_OK; li++)
            for (int j = 0; j < m->layers[li]->nparams && s == GP_OK; j++)
                for (int k = -1; k < gp_ckpt_nstored(m, o, li, j) - 1 && s == GP_OK; k++) {
                    s = gp_ckpt_tensor_name(m, o, li, j, k, name, sizeof name);
                    if (s == GP_OK && !cJSON_AddStringToObject(wm, name, parts[i].file))
                        s = gp_error(GP_OUT_OF_MEMORY, "checkpoint index %s", index_path);
                }
    }
    char *text = s == GP_OK ? cJSON_Print(root) : NULL;
    cJSON_Delete(root);
    if (s == GP_OK && !text) s = gp_error(GP_OUT_OF_MEMORY, "checkpoint index %s", index_path);
    if (s == GP_OK) {
        gp_file_out out;
        s = gp_file_out_open(&out, index_path);
        if (s == GP_OK) {
            gp_file_out_write(&out, text);
            gp_file_out_write(&out, "\n");
            s = gp_file_out_close(&out, true);
        }
    }
    cJSON_free(text);
    return s;
}

/* -------------------------------------------------------------------- open */

static bool ends_with(const char *s, const char *suffix) {
    size_t n = strlen(s), k = strlen(suffix);
    return n >= k && strcmp(s + n - k, suffix) == 0;
}

/* A non-negative integer that a double holds exactly. */
static bool json_uint(const cJSON *j, double max, double *v) {
    if (!cJSON_IsNumber(j)) return false;
    double d = j->valuedouble;
    if (!(d >= 0 && d <= max) || d != (double)(uint64_t)d) return false;
    *v = d;
    return true;
}

static gp_status parse_parts(gp_checkpoint *c) {
    const char *path = c->path;
    const cJSON *arr = cJSON_GetObjectItemCaseSensitive(c->index, "parts");
    int n = cJSON_IsArray(arr) ? cJSON_GetArraySize(arr) : -1;
    if (n < 1 || n > MAX_PARTS)
        return gp_error(GP_FORMAT, "%s: \"parts\": expected an array of 1..%d parts", path,
                        MAX_PARTS);
    c->parts = calloc((size_t)n, sizeof *c->parts);
    if (!c->parts) return gp_error(GP_OUT_OF_MEMORY, "%s: %d parts", path, n);
    const char *slash = strrchr(path, '/');
    size_t dirlen = slash ? (size_t)(slash - path) + 1 : 0;
    int i = 0;
    for (const cJSON *e = arr->child; e; e = e->next, i++) {
        ckpt_part *p = &c->parts[i];
        c->nparts = i + 1;
        const cJSON *file = cJSON_GetObjectItemCaseSensitive(e, "file");
        const cJSON *ly = cJSON_GetObjectItemCaseSensitive(e, "layers");
        const cJSON *by = cJSON_GetObjectItemCaseSensitive(e, "bytes");
        const cJSON *cr = cJSON_GetObjectItemCaseSensitive(e, "crc32");
        double a, b, nb;
        unsigned crc = 0;
        int used = 0;
        int want = i ? c->parts[i - 1].last : 0;
        if (!cJSON_IsString(file) || !plain_name(file->valuestring))
            return gp_error(GP_FORMAT, "%s: part %d: \"file\" must be a file name in the index's "
                                       "folder (no '/', not hidden)",
                            path, i);
        if (!cJSON_IsArray(ly) || cJSON_GetArraySize(ly) != 2 ||
            !json_uint(cJSON_GetArrayItem(ly, 0), 1e6, &a) ||
            !json_uint(cJSON_GetArrayItem(ly, 1), 1e6, &b) || (int)a != want || b <= a)
            return gp_error(GP_FORMAT, "%s: part %d (%s): \"layers\" must be [first, last) with "
                                       "first = %d (the parts in order, without gaps) and "
                                       "last > first",
                            path, i, file->valuestring, want);
        if (!json_uint(by, 9007199254740992.0, &nb))
            return gp_error(GP_FORMAT, "%s: part %d (%s): \"bytes\" must be a byte count", path, i,
                            file->valuestring);
        if (!cJSON_IsString(cr) || strlen(cr->valuestring) != 8 ||
            sscanf(cr->valuestring, "%8x%n", &crc, &used) != 1 || used != 8)
            return gp_error(GP_FORMAT, "%s: part %d (%s): \"crc32\" must be 8 hex digits", path,
                            i, file->valuestring);
        p->file = strdup(file->valuestring);
        p->path = malloc(dirlen + strlen(file->valuestring) + 1);
        if (!p->file || !p->path) return gp_error(GP_OUT_OF_MEMORY, "%s: part %d", path, i);
        memcpy(p->path, path, dirlen);
        strcpy(p->path + dirlen, file->valuestring);
        p->first = (int)a;
        p->last = (int)b;
        p->bytes = (uint64_t)nb;
        p->crc = crc;
    }
    return GP_OK;
}

static gp_status open_index(gp_checkpoint *c) {
    GP_TRY(gp_read_json(c->path, INDEX_MAX_BYTES, &c->index));
    if (!cJSON_IsObject(c->index))
        return gp_error(GP_FORMAT, "%s: not a JSON object (a checkpoint index, \"<base>."
                                   "safetensors.index.json\", is one)",
                        c->path);
    c->meta = cJSON_GetObjectItemCaseSensitive(c->index, "metadata");
    if (!cJSON_IsObject(c->meta))
        return gp_error(GP_FORMAT, "%s: no \"metadata\" object", c->path);
    for (const cJSON *e = c->meta->child; e; e = e->next)
        if (!cJSON_IsString(e))
            return gp_error(GP_FORMAT, "%s: metadata \"%.100s\" is not a string", c->path,
                            e->string ? e->string : "");
    return parse_parts(c);
}

gp_status gp_checkpoint_open(const char *path, gp_checkpoint **out) {
    if (!path || !out) return gp_error(GP_INVALID_ARGUMENT, "gp_checkpoint_open: NULL argument");
    *out = NULL;
    gp_checkpoint *c = calloc(1, sizeof *c);
    if (!c || !(c->path = strdup(path))) {
        free(c);
        return gp_error(GP_OUT_OF_MEMORY, "gp_checkpoint_open: %s", path);
    }
    gp_status s = ends_with(path, ".json") ? open_index(c) : gp_safetensors_read(path, &c->single);
    if (s != GP_OK) {
        gp_checkpoint_close(c);
        return s;
    }
    *out = c;
    return GP_OK;
}

void gp_checkpoint_close(gp_checkpoint *c) {
    if (!c) return;
    for (int i = 0; i < c->nparts; i++) {
        free(c->parts[i].file);
        free(c->parts[i].path);
    }
    free(c->parts);
    cJSON_Delete(c->index);
    gp_safetensors_free(c->single);
    free(c->path);
    free(c);
}

int gp_checkpoint_nparts(const gp_checkpoint *c) { return c ? (c->single ? 1 : c->nparts) : 0; }

const char *gp_checkpoint_meta(const gp_checkpoint *c, const char *key) {
    if (!c || !key) return NULL;
    if (c->single) return gp_safetensors_meta(c->single, key);
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(c->meta, key);
    return cJSON_IsString(v) ? v->valuestring : NULL;
}

gp_status gp_checkpoint_saved_step(const gp_checkpoint *c, int *step) {
    if (!c || !step) return gp_error(GP_INVALID_ARGUMENT, "gp_checkpoint_saved_step: NULL argument");
    return gp_ckpt_parse_step(gp_checkpoint_meta(c, "step"), c->path, step);
}

/* -------------------------------------------------------------------- load */

/* Opens part i and reads its header, checking first that it is a regular file of the size the
 * index committed, so a damaged or replaced part costs no more than its header. */
static gp_status open_part(const gp_checkpoint *c, int i, const gp_model *m,
                           gp_safetensors **f) {
    const ckpt_part *p = &c->parts[i];
    int fd;
    uint64_t n;
    *f = NULL;
    gp_status s = gp_open_regular(p->path, &fd, &n);
    if (s != GP_OK)
        return gp_error_context(s, "%s: part %d of %d (layers %d-%d) of the set", c->path, i + 1,
                                c->nparts, p->first, p->last - 1);
    if (n != p->bytes) {
        close(fd);
        return gp_error(GP_FORMAT, "%s: part %d of %d is %llu bytes, the index committed %llu "
                                   "bytes: the part was damaged or replaced after the set was "
                                   "saved",
                        p->path, i + 1, c->nparts, (unsigned long long)n,
                        (unsigned long long)p->bytes);
    }
    s = gp_st_read_fd(fd, n, p->path, f);
    if (s != GP_OK)
        return gp_error_context(s, "%s: part %d of %d (layers %d-%d) of the set", c->path, i + 1,
                                c->nparts, p->first, p->last - 1);
    int pf = 0, pl = 0;
    s = gp_ckpt_part_range(*f, m, &pf, &pl);
    if (s == GP_OK && (pf != p->first || pl != p->last))
        s = gp_error(GP_FORMAT, "%s: holds layers %d-%d, the index %s says %d-%d", p->path, pf,
                     pl - 1, c->path, p->first, p->last - 1);
    if (s != GP_OK) {
        gp_safetensors_free(*f);
        *f = NULL;
    }
    return s;
}

/* Reads part i, checking it against the index: size, its layers, the CRC-32 of the whole file
 * (streamed: it covers every tensor's bytes, so they need no second pass) and its step; then
 * against the model for layers [lo, hi). */
static gp_status read_part(const gp_checkpoint *c, int i, gp_model *m, const gp_optim_opts *o,
                           int lo, int hi, gp_safetensors **f) {
    const ckpt_part *p = &c->parts[i];
    GP_TRY(open_part(c, i, m, f));
    uint32_t crc = 0;
    int step = -1, pstep = -1;
    gp_status s = gp_st_file_crc(*f, &crc);
    if (s == GP_OK && crc != p->crc)
        s = gp_error(GP_FORMAT, "%s: part %d of %d is %llu bytes with CRC-32 %08x, the index "
                                "committed %llu bytes with CRC-32 %08x: the part was damaged "
                                "or replaced after the set was saved",
                     p->path, i + 1, c->nparts, (unsigned long long)p->bytes, (unsigned)crc,
                     (unsigned long long)p->bytes, (unsigned)p->crc);
    if (s == GP_OK) s = gp_checkpoint_step(*f, &pstep);
    if (s == GP_OK) s = gp_checkpoint_saved_step(c, &step);
    if (s == GP_OK && pstep != step)
        s = gp_error(GP_FORMAT, "%s: saved at step %d, the index %s at step %d", p->path, pstep,
                     c->path, step);
    if (s == GP_OK) s = gp_ckpt_check(*f, m, o, lo, hi);
    if (s != GP_OK) {
        gp_safetensors_free(*f);
        *f = NULL;
    }
    return s;
}

gp_status gp_checkpoint_load_layers(gp_checkpoint *c, gp_model *m, int first, int last,
                                    const gp_optim_opts *o) {
    if (!c || !m) return gp_error(GP_INVALID_ARGUMENT, "gp_checkpoint_load_layers: NULL argument");
    if (first < 0 || last > m->nlayers || first >= last)
        return gp_error(GP_INVALID_ARGUMENT, "%s: layer range [%d, %d) outside the model's 0..%d",
                        c->path, first, last, m->nlayers);
    if (c->single) {
        int pf, pl;
        GP_TRY(gp_ckpt_part_range(c->single, m, &pf, &pl));
        if (first < pf || last > pl)
            return gp_error(GP_FORMAT, "%s: holds layers %d-%d only, layers %d-%d were asked for "
                                       "(one part of a multi-part checkpoint? open its index)",
                            c->path, pf, pl - 1, first, last - 1);
        GP_TRY(gp_ckpt_check(c->single, m, o, first, last));
        GP_TRY(gp_ckpt_verify(c->single));
        return gp_ckpt_copy(c->single, m, o, first, last);
    }
    if (c->parts[c->nparts - 1].last != m->nlayers)
        return gp_error(GP_FORMAT, "%s: the parts hold layers 0-%d, the model has %d layers",
                        c->path, c->parts[c->nparts - 1].last - 1, m->nlayers);
    /* Check every part needed before copying one byte: a bad part leaves m as it was. */
    gp_safetensors **f = calloc((size_t)c->nparts, sizeof *f);
    if (!f) return gp_error(GP_OUT_OF_MEMORY, "%s: %d parts", c->path, c->nparts);
    gp_status s = GP_OK;
    for (int i = 0; i < c->nparts && s == GP_OK; i++) {
        int lo = c->parts[i].first > first ? c->parts[i].first : first;
        int hi = c->parts[i].last < last ? c->parts[i].last : last;
        bool owner = false; /* the part holds the owner of a tied copy asked for */
        for (int li = c->parts[i].first; li < c->parts[i].last && !owner; li++)
            owner = gp_ckpt_needs_layer(m, li, first, last);
        if (lo < hi || owner) s = read_part(c, i, m, o, lo < hi ? lo : first, lo < hi ? hi : first, &f[i]);
    }
    for (int i = 0; i < c->nparts && s == GP_OK; i++)
        if (f[i]) s = gp_ckpt_copy(f[i], m, o, first, last);
    for (int i = 0; i < c->nparts; i++) gp_safetensors_free(f[i]);
    free(f);
    return s;
}

/* ------------------------------------------------------------------- check */

const char *gp_checkpoint_part_path(const gp_checkpoint *c, int i) {
    if (!c || i < 0 || i >= gp_checkpoint_nparts(c)) return NULL;
    return c->single ? c->path : c->parts[i].path;
}

gp_status gp_checkpoint_check_model(gp_checkpoint *c, const gp_model *m) {
    if (!c || !m) return gp_error(GP_INVALID_ARGUMENT, "gp_checkpoint_check_model: NULL argument");
    if (c->single) return gp_ckpt_check_header(c->single, m, 0, m->nlayers);
    if (c->parts[c->nparts - 1].last != m->nlayers)
        return gp_error(GP_FORMAT, "%s: the parts hold layers 0-%d, the model has %d layers",
                        c->path, c->parts[c->nparts - 1].last - 1, m->nlayers);
    /* Each part's header only: the data is checked (CRC-32s) when it is loaded. */
    for (int i = 0; i < c->nparts; i++) {
        gp_safetensors *f;
        GP_TRY(open_part(c, i, m, &f));
        gp_status s = gp_ckpt_check_header(f, m, c->parts[i].first, c->parts[i].last);
        gp_safetensors_free(f);
        GP_TRY(s);
    }
    return GP_OK;
}
