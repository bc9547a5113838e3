/* safetensors files (the format of Hugging Face's `safetensors` package): an 8-byte
 * little-endian header length N, N bytes of JSON {"name": {"dtype", "shape", "data_offsets"},
 * "__metadata__": {string: string}}, then the raw little-endian tensor data. The reader trusts
 * nothing: every size, offset, name and type is checked before any byte is used, and a tensor
 * whose CRC-32 is in the metadata ("crc32:<name>") must match it. A file is read header first:
 * the length is checked against the file's size before the header is read, and the header
 * before any tensor, whose bytes are read only when asked for (gp_safetensors_get), so a
 * hostile length or a sparse file of gigabytes costs neither memory nor time. The writer goes
 * through gp_file_out, so a file is complete under its name or absent. */
#include <cjson/cJSON.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <zlib.h>

#include "core/error.h"
#include "core/read_file.h"
#include "io/safetensors_internal.h"

#define ST_MAX_HEADER ((uint64_t)100 << 20) /* the reference implementation's limit */
#define ST_MAX_TENSORS (1 << 20)
#define ST_MAX_NAME 512
#define ST_MAX_ELEMS ((int64_t)1 << 40)
#define ST_CRC_PREFIX "crc32:"

struct gp_safetensors {
    char *origin;
    unsigned char *buf;  /* parsed from memory: the whole file, owned; else NULL */
    int fd;              /* read from a file: its descriptor, owned; else -1 */
    uint64_t data_first; /* offset of the data section in the file */
    uint64_t ndata;      /* bytes of data */
    cJSON *header;
    const cJSON *meta; /* inside header; NULL if absent */
    int n;
    gp_st_entry *entries; /* (n), sorted by name; names point into header */
    uint32_t *crc;        /* (n) beside entries: the metadata's CRC-32 of each tensor */
    unsigned char *has_crc; /* (n) whether the metadata has one */
};

static uint64_t le64(const unsigned char *b) {
    uint64_t v = 0;
    for (int i = 7; i >= 0; i--) v = v << 8 | b[i];
    return v;
}

void gp_safetensors_free(gp_safetensors *f) {
    if (!f) return;
    cJSON_Delete(f->header);
    free(f->entries);
    free(f->crc);
    free(f->has_crc);
    free(f->buf);
    if (f->fd >= 0) close(f->fd);
    free(f->origin);
    free(f);
}

static const char *dtype_st_name(gp_dtype t) { return t == GP_I32 ? "I32" : "F32"; }

/* An integer JSON number in [0, max], exactly representable. */
static bool json_u64(const cJSON *j, double max, uint64_t *out) {
    if (!cJSON_IsNumber(j)) return false;
    double v = j->valuedouble;
    if (!(v >= 0 && v <= max) || v != (double)(uint64_t)v) return false;
    *out = (uint64_t)v;
    return true;
}
static gp_status parse_entry(gp_safetensors *f, const cJSON *e, gp_st_entry *t) {
    const char *o = f->origin, *name = e->string;
    if (!name[0] || strlen(name) > ST_MAX_NAME)
        return gp_error(GP_FORMAT, "%s: a tensor name is empty or longer than %d bytes", o,
                        ST_MAX_NAME);
    if (!cJSON_IsObject(e))
        return gp_error(GP_FORMAT, "%s: tensor \"%s\": expected an object with dtype, shape and "
                                   "data_offsets",
                        o, name);
    const cJSON *dt = NULL, *sh = NULL, *off = NULL;
    for (const cJSON *c = e->child; c; c = c->next) {
        const cJSON **slot = strcmp(c->string, "dtype") == 0          ? &dt
                             : strcmp(c->string, "shape") == 0        ? &sh
                             : strcmp(c->string, "data_offsets") == 0 ? &off
                                                                      : NULL;
        if (!slot)
            return gp_error(GP_FORMAT, "%s: tensor \"%s\": unknown key \"%s\" (expected dtype, "
                                       "shape, data_offsets)",
                            o, name, c->string);
        if (*slot)
            return gp_error(GP_FORMAT, "%s: tensor \"%s\": duplicate key \"%s\"", o, name,
                            c->string);
        *slot = c;
    }
    if (!cJSON_IsString(dt) || !cJSON_IsArray(sh) || !cJSON_IsArray(off))
        return gp_error(GP_FORMAT, "%s: tensor \"%s\": expected dtype (a string), shape and "
                                   "data_offsets (arrays)",
                        o, name);
    t->name = name;
    if (strcmp(dt->valuestring, "F32") == 0)
        t->dtype = GP_F32;
    else if (strcmp(dt->valuestring, "I32") == 0)
        t->dtype = GP_I32;
    else
        return gp_error(GP_FORMAT, "%s: tensor \"%s\": dtype \"%.32s\" is not supported (expected "
                                   "F32 or I32)",
                        o, name, dt->valuestring);
    int ndim = cJSON_GetArraySize(sh);
    if (ndim > GP_MAX_DIMS)
        return gp_error(GP_FORMAT, "%s: tensor \"%s\": %d dimensions, at most %d supported", o,
                        name, ndim, GP_MAX_DIMS);
    t->shape.ndim = ndim;
    int64_t nelem = 1;
    int d = 0;
    for (const cJSON *v = sh->child; v; v = v->next, d++) {
        uint64_t dim;
        if (!json_u64(v, (double)ST_MAX_ELEMS, &dim))
            return gp_error(GP_FORMAT, "%s: tensor \"%s\": shape[%d] is not an integer in "
                                       "[0, 2^40]",
                            o, name, d);
        t->shape.dim[d] = (int64_t)dim;
        if (dim && nelem > ST_MAX_ELEMS / (int64_t)dim)
            return gp_error(GP_FORMAT, "%s: tensor \"%s\": more than 2^40 elements", o, name);
        nelem *= (int64_t)dim;
    }
    uint64_t b = 0, en = 0;
    if (cJSON_GetArraySize(off) == 2 && json_u64(off->child, 9007199254740992.0, &b) &&
        json_u64(off->child->next, 9007199254740992.0, &en) && b <= en && en > f->ndata)
        return gp_error(GP_FORMAT, "%s: tensor \"%s\": data_offsets [%llu, %llu] end past the %llu "
                                   "data bytes of the file (truncated?)",
                        o, name, (unsigned long long)b, (unsigned long long)en,
                        (unsigned long long)f->ndata);
    if (cJSON_GetArraySize(off) != 2 || !json_u64(off->child, 9007199254740992.0, &b) ||
        !json_u64(off->child->next, 9007199254740992.0, &en) || en < b || en > f->ndata)
        return gp_error(GP_FORMAT, "%s: tensor \"%s\": data_offsets must be [begin, end] with "
                                   "0 <= begin <= end <= %llu (the data size)",
                        o, name, (unsigned long long)f->ndata);
    t->begin = b;
    t->end = en;
    if (en - b != (uint64_t)nelem * 4)
        return gp_error(GP_FORMAT, "%s: tensor \"%s\": data_offsets [%llu, %llu] hold %llu bytes, "
                                   "expected %lld elements x 4 = %llu",
                        o, name, (unsigned long long)b, (unsigned long long)en,
                        (unsigned long long)(en - b), (long long)nelem,
                        (unsigned long long)nelem * 4);
    return GP_OK;
}

static int by_begin(const void *a, const void *b) {
    const gp_st_entry *x = a, *y = b;
    if (x->begin != y->begin) return x->begin < y->begin ? -1 : 1;
    return x->end < y->end ? -1 : x->end > y->end;
}

static int by_name(const void *a, const void *b) {
    return strcmp(((const gp_st_entry *)a)->name, ((const gp_st_entry *)b)->name);
}

/* Tensors tile the data section exactly, as the format requires: sorted by
 * offset, each starts where the last ended and the last ends at the end. */
static gp_status check_layout(gp_safetensors *f) {
    qsort(f->entries, (size_t)f->n, sizeof *f->entries, by_name);
    for (int i = 1; i < f->n; i++)
        if (strcmp(f->entries[i].name, f->entries[i - 1].name) == 0)
            return gp_error(GP_FORMAT, "%s: tensor \"%s\" appears twice in the header", f->origin,
                            f->entries[i].name);
    qsort(f->entries, (size_t)f->n, sizeof *f->entries, by_begin);
    uint64_t at = 0;
    for (int i = 0; i < f->n; i++) {
        const gp_st_entry *e = &f->entries[i];
        if (e->begin < at)
            return gp_error(GP_FORMAT, "%s: tensor \"%s\": data_offsets [%llu, %llu] overlap "
                                       "tensor \"%s\" (which ends at %llu)",
                            f->origin, e->name, (unsigned long long)e->begin,
                            (unsigned long long)e->end, f->entries[i - 1].name,
                            (unsigned long long)at);
        if (e->begin > at)
            return gp_error(GP_FORMAT, "%s: tensor \"%s\": data_offsets start at %llu, expected "
                                       "%llu (no gaps between tensors)",
                            f->origin, e->name, (unsigned long long)e->begin,
                            (unsigned long long)at);
        at = e->end;
    }
    if (at != f->ndata)
        return gp_error(GP_FORMAT, "%s: the tensors cover %llu data bytes, but %llu follow the "
                                   "header (truncated or trailing bytes)",
                        f->origin, (unsigned long long)at, (unsigned long long)f->ndata);
    qsort(f->entries, (size_t)f->n, sizeof *f->entries, by_name); /* for lookups */
    return GP_OK;
}

static int by_str(const void *a, const void *b) {
    return strcmp(*(const char *const *)a, *(const char *const *)b);
}

/* The checksums of the metadata, "crc32:<name>" = 8 hex digits naming a tensor of the file,
 * kept beside the entries; whether the bytes match is checked where they are read. */
static gp_status read_checksums(gp_safetensors *f) {
    f->crc = calloc((size_t)f->n + 1, sizeof *f->crc);
    f->has_crc = calloc((size_t)f->n + 1, 1);
    if (!f->crc || !f->has_crc)
        return gp_error(GP_OUT_OF_MEMORY, "%s: %d checksums", f->origin, f->n);
    for (const cJSON *c = f->meta ? f->meta->child : NULL; c; c = c->next) {
        if (strncmp(c->string, ST_CRC_PREFIX, strlen(ST_CRC_PREFIX)) != 0) continue;
        const char *name = c->string + strlen(ST_CRC_PREFIX);
        const gp_st_entry *e = gp_safetensors_find(f, name);
        if (!e)
            return gp_error(GP_FORMAT, "%s: __metadata__ has a checksum of tensor \"%.64s\", "
                                       "which the file does not hold",
                            f->origin, name);
        char *endp;
        errno = 0;
        unsigned long want = strtoul(c->valuestring, &endp, 16);
        if (strlen(c->valuestring) != 8 || *endp || errno)
            return gp_error(GP_FORMAT, "%s: __metadata__ \"%.64s\": expected 8 hex digits, got "
                                       "\"%.32s\"",
                            f->origin, c->string, c->valuestring);
        f->crc[e - f->entries] = (uint32_t)want;
        f->has_crc[e - f->entries] = 1;
    }
    return GP_OK;
}

/* Metadata: an object of strings, each key once; then the checksums. */
static gp_status check_meta(gp_safetensors *f) {
    if (f->meta) {
        if (!cJSON_IsObject(f->meta))
            return gp_error(GP_FORMAT, "%s: __metadata__ must be an object of strings", f->origin);
        int nkeys = cJSON_GetArraySize(f->meta);
        if (nkeys > 2 * ST_MAX_TENSORS)
            return gp_error(GP_FORMAT, "%s: __metadata__ has %d keys, at most %d", f->origin,
                            nkeys, 2 * ST_MAX_TENSORS);
        const char **keys = malloc(((size_t)nkeys + 1) * sizeof *keys);
        if (!keys) return gp_error(GP_OUT_OF_MEMORY, "%s: %d metadata keys", f->origin, nkeys);
        int k = 0;
        for (const cJSON *c = f->meta->child; c; c = c->next) keys[k++] = c->string;
        qsort(keys, (size_t)nkeys, sizeof *keys, by_str);
        for (k = 1; k < nkeys && strcmp(keys[k], keys[k - 1]) != 0; k++) {}
        gp_status dup = k < nkeys ? gp_error(GP_FORMAT, "%s: __metadata__ \"%.64s\" appears twice",
                                             f->origin, keys[k])
                                  : GP_OK;
        free(keys);
        if (dup != GP_OK) return dup;
        for (const cJSON *c = f->meta->child; c; c = c->next)
            if (!cJSON_IsString(c))
                return gp_error(GP_FORMAT, "%s: __metadata__ \"%.64s\": expected a string value",
                                f->origin, c->string);
    }
    return read_checksums(f);
}

static gp_status crc_mismatch(const gp_safetensors *f, const gp_st_entry *e, uint32_t got) {
    return gp_error(GP_FORMAT, "%s: tensor \"%s\" (data bytes %llu..%llu): CRC-32 %08lx, "
                               "expected %08lx from the metadata (the file is corrupt)",
                    f->origin, e->name, (unsigned long long)e->begin, (unsigned long long)e->end,
                    (unsigned long)got, (unsigned long)f->crc[e - f->entries]);
}

gp_status gp_st_verify(const gp_safetensors *f, const gp_st_entry *e) {
    if (!f->has_crc[e - f->entries]) return GP_OK;
    uint32_t crc;
    if (f->buf)
        crc = gp_crc32_bytes((uint32_t)crc32(0L, Z_NULL, 0), f->buf + f->data_first + e->begin,
                             e->end - e->begin);
    else
        GP_TRY(gp_crc32_file_range(f->fd, f->origin, f->data_first + e->begin, e->end - e->begin,
                                   &crc));
    return crc == f->crc[e - f->entries] ? GP_OK : crc_mismatch(f, e, crc);
}

gp_status gp_st_file_crc(const gp_safetensors *f, uint32_t *crc) {
    if (f->fd < 0) return gp_error(GP_INTERNAL, "%s: not read from a file", f->origin);
    return gp_crc32_file_range(f->fd, f->origin, 0, f->data_first + f->ndata, crc);
}

static gp_safetensors *st_new(const char *origin) {
    gp_safetensors *f = calloc(1, sizeof *f);
    if (!f) return NULL;
    f->fd = -1;
    f->origin = strdup(origin ? origin : "safetensors");
    if (!f->origin) {
        free(f);
        return NULL;
    }
    return f;
}

/* The header length (bytes 0..7) against the file's nbytes, before the header is read. */
static gp_status check_length(const char *o, uint64_t nheader, uint64_t nbytes) {
    if (nheader > ST_MAX_HEADER)
        return gp_error(GP_FORMAT, "%s: header length %llu (bytes 0..7) is over the %llu-byte "
                                   "limit",
                        o, (unsigned long long)nheader, (unsigned long long)ST_MAX_HEADER);
    if (nheader > nbytes - 8)
        return gp_error(GP_FORMAT, "%s: header length %llu (bytes 0..7) runs past the end of the "
                                   "file: only %llu bytes follow (truncated?)",
                        o, (unsigned long long)nheader, (unsigned long long)(nbytes - 8));
    if (nheader < 2)
        return gp_error(GP_FORMAT, "%s: header length %llu (bytes 0..7) is too short for the "
                                   "JSON header (at least 2 bytes, \"{}\"): not a safetensors file",
                        o, (unsigned long long)nheader);
    return GP_OK;
}

static gp_status not_an_object(const char *o, uint64_t nheader) {
    return gp_error(GP_FORMAT, "%s: the header (bytes 8..%llu) must be a JSON object starting "
                               "with '{'",
                    o, (unsigned long long)(8 + nheader));
}

/* Parses and checks the header text (nheader bytes, from byte 8 of a file of nbytes): the JSON,
 * every entry against the data size, the tiling of the data, the metadata. */
static gp_status parse_header(gp_safetensors *f, const char *text, uint64_t nheader,
                              uint64_t nbytes) {
    const char *o = f->origin;
    if (text[0] != '{') return not_an_object(o, nheader);
    f->data_first = 8 + nheader;
    f->ndata = nbytes - 8 - nheader;
    const char *end = NULL;
    f->header = cJSON_ParseWithLengthOpts(text, (size_t)nheader, &end, false);
    if (!f->header || !cJSON_IsObject(f->header)) {
        size_t at = end ? 8 + (size_t)(end - text) : 8;
        return gp_error(GP_FORMAT, "%s: the header is not a well-formed JSON object (error near "
                                   "byte %zu)",
                        o, f->header ? (size_t)8 : at);
    }
    /* Only padding may follow the object. */
    for (const char *p = end; p < text + nheader; p++)
        if (*p != ' ' && *p != '\t' && *p != '\n' && *p != '\r' && *p != '\0')
            return gp_error(GP_FORMAT, "%s: stray byte 0x%02x after the header's JSON object at "
                                       "byte %zu",
                            o, (unsigned)(unsigned char)*p, 8 + (size_t)(p - text));
    int n = cJSON_GetArraySize(f->header);
    if (n > ST_MAX_TENSORS)
        return gp_error(GP_FORMAT, "%s: %d header entries, at most %d", o, n, ST_MAX_TENSORS);
    f->entries = calloc((size_t)n + 1, sizeof *f->entries);
    if (!f->entries) return gp_error(GP_OUT_OF_MEMORY, "%s: %d tensors", o, n);
    for (const cJSON *e = f->header->child; e; e = e->next) {
        if (strcmp(e->string, "__metadata__") == 0) {
            if (f->meta) return gp_error(GP_FORMAT, "%s: __metadata__ appears twice", o);
            f->meta = e;
            continue;
        }
        GP_TRY(parse_entry(f, e, &f->entries[f->n]));
        f->n++;
    }
    GP_TRY(check_layout(f));
    return check_meta(f);
}

/* Takes buf (malloc'd) in every case. In memory every checksum is verified at once. */
static gp_status parse_owned(unsigned char *buf, size_t nbytes, const char *origin,
                             gp_safetensors **out) {
    *out = NULL;
    gp_safetensors *f = st_new(origin);
    if (!f) {
        free(buf);
        return gp_error(GP_OUT_OF_MEMORY, "%s: out of host memory", origin);
    }
    f->buf = buf;
    gp_status s = GP_OK;
    if (nbytes < 8)
        s = gp_error(GP_FORMAT, "%s: %zu bytes, shorter than the 8-byte header length "
                                "(truncated?)",
                     f->origin, nbytes);
    uint64_t nheader = s == GP_OK ? le64(buf) : 0;
    if (s == GP_OK) s = check_length(f->origin, nheader, nbytes);
    if (s == GP_OK) s = parse_header(f, (const char *)buf + 8, nheader, nbytes);
    for (int i = 0; i < f->n && s == GP_OK; i++) s = gp_st_verify(f, &f->entries[i]);
    if (s != GP_OK) {
        gp_safetensors_free(f);
        return s;
    }
    *out = f;
    return GP_OK;
}

gp_status gp_safetensors_parse(const void *bytes, size_t nbytes, const char *origin,
                               gp_safetensors **out) {
    if (!out || (!bytes && nbytes))
        return gp_error(GP_INVALID_ARGUMENT, "gp_safetensors_parse: NULL argument");
    unsigned char *buf = malloc(nbytes ? nbytes : 1);
    if (!buf) return gp_error(GP_OUT_OF_MEMORY, "%s: %zu bytes", origin, nbytes);
    if (nbytes) memcpy(buf, bytes, nbytes);
    return parse_owned(buf, nbytes, origin, out);
}

/* The length, then its first byte, then the header: each checked before the next is read. */
static gp_status read_header(gp_safetensors *f, uint64_t nbytes) {
    const char *o = f->origin;
    unsigned char len[9];
    if (nbytes < 8)
        return gp_error(GP_FORMAT, "%s: %llu bytes, shorter than the 8-byte header length "
                                   "(truncated?)",
                        o, (unsigned long long)nbytes);
    GP_TRY(gp_pread_all(f->fd, o, 0, len, 8));
    uint64_t nheader = le64(len);
    GP_TRY(check_length(o, nheader, nbytes));
    GP_TRY(gp_pread_all(f->fd, o, 8, len + 8, 1));
    if (len[8] != '{') return not_an_object(o, nheader);
    char *text = malloc((size_t)nheader + 1);
    if (!text) return gp_error(GP_OUT_OF_MEMORY, "%s: a %llu-byte header", o,
                               (unsigned long long)nheader);
    gp_status s = gp_pread_all(f->fd, o, 8, text, (size_t)nheader);
    if (s == GP_OK) s = parse_header(f, text, nheader, nbytes);
    free(text); /* cJSON copied what it keeps */
    return s;
}

gp_status gp_st_read_fd(int fd, uint64_t nbytes, const char *path, gp_safetensors **out) {
    *out = NULL;
    gp_safetensors *f = st_new(path);
    if (!f) {
        close(fd);
        return gp_error(GP_OUT_OF_MEMORY, "%s: out of host memory", path);
    }
    f->fd = fd;
    gp_status s = read_header(f, nbytes);
    if (s != GP_OK) {
        gp_safetensors_free(f);
        return s;
    }
    *out = f;
    return GP_OK;
}

gp_status gp_safetensors_read(const char *path, gp_safetensors **out) {
    if (!path || !out) return gp_error(GP_INVALID_ARGUMENT, "gp_safetensors_read: NULL argument");
    *out = NULL;
    int fd;
    uint64_t nbytes;
    GP_TRY(gp_open_regular(path, &fd, &nbytes));
    return gp_st_read_fd(fd, nbytes, path, out);
}

const char *gp_safetensors_origin(const gp_safetensors *f) { return f ? f->origin : ""; }
int gp_safetensors_count(const gp_safetensors *f) { return f ? f->n : 0; }

const gp_st_entry *gp_safetensors_entry(const gp_safetensors *f, int i) {
    return f && i >= 0 && i < f->n ? &f->entries[i] : NULL;
}

const gp_st_entry *gp_safetensors_find(const gp_safetensors *f, const char *name) {
    if (!f || !name || f->n == 0) return NULL;
    gp_st_entry key = {.name = name};
    return bsearch(&key, f->entries, (size_t)f->n, sizeof *f->entries, by_name);
}

const char *gp_safetensors_meta(const gp_safetensors *f, const char *key) {
    if (!f || !f->meta || !key) return NULL;
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(f->meta, key);
    return cJSON_IsString(v) ? v->valuestring : NULL;
}

gp_status gp_safetensors_get(const gp_safetensors *f, const char *name, gp_dtype dtype,
                             const gp_shape *shape, void *dst) {
    char a[96], b[96];
    if (!f || !name || !dst)
        return gp_error(GP_INVALID_ARGUMENT, "gp_safetensors_get: NULL argument");
    const gp_st_entry *e = gp_safetensors_find(f, name);
    if (!e) return gp_error(GP_FORMAT, "%s: no tensor \"%s\"", f->origin, name);
    if (e->dtype != dtype)
        return gp_error(GP_FORMAT, "%s: tensor \"%s\" is %s, expected %s", f->origin, name,
                        dtype_st_name(e->dtype), dtype_st_name(dtype));
    if (shape && !gp_shape_equal(&e->shape, shape))
        return gp_error(GP_SHAPE, "%s: tensor \"%s\" has shape %s, expected %s", f->origin, name,
                        gp_shape_str(&e->shape, a, sizeof a), gp_shape_str(shape, b, sizeof b));
    const uint64_t nbytes = e->end - e->begin;
    if (f->buf)
        memcpy(dst, f->buf + f->data_first + e->begin, (size_t)nbytes);
    else
        GP_TRY(gp_pread_all(f->fd, f->origin, f->data_first + e->begin, dst, (size_t)nbytes));
    /* The bytes as read, so a file changed since it was opened is caught too. */
    if (f->has_crc[e - f->entries]) {
        uint32_t crc = gp_crc32_bytes((uint32_t)crc32(0L, Z_NULL, 0), dst, nbytes);
        if (crc != f->crc[e - f->entries]) return crc_mismatch(f, e, crc);
    }
#if !(defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__)
    uint32_t *w = dst; /* float and int32 as their 32-bit patterns, little-endian in the file */
    for (uint64_t i = 0; i < nbytes / 4; i++) {
        const unsigned char *p = (const unsigned char *)&w[i];
        w[i] = (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
    }
#endif
    return GP_OK;
}

/* ------------------------------------------------------------------ writer */

typedef struct st_item {
    char *name;
    gp_dtype dtype;
    gp_shape shape;
    const void *data; /* borrowed */
    uint64_t nbytes;
} st_item;

struct gp_safetensors_writer {
    st_item *items;
    int n, cap;
    cJSON *meta;
};

gp_status gp_safetensors_writer_new(gp_safetensors_writer **out) {
    if (!out) return gp_error(GP_INVALID_ARGUMENT, "gp_safetensors_writer_new: out is NULL");
    gp_safetensors_writer *w = calloc(1, sizeof *w);
    if (w) w->meta = cJSON_CreateObject();
    if (!w || !w->meta) {
        free(w);
        return gp_error(GP_OUT_OF_MEMORY, "safetensors writer: out of host memory");
    }
    *out = w;
    return GP_OK;
}

void gp_safetensors_writer_free(gp_safetensors_writer *w) {
    if (!w) return;
    for (int i = 0; i < w->n; i++) free(w->items[i].name);
    free(w->items);
    cJSON_Delete(w->meta);
    free(w);
}

gp_status gp_safetensors_writer_add(gp_safetensors_writer *w, const char *name, gp_dtype dtype,
                                    gp_shape shape, const void *data) {
    if (!w || !name || (!data && gp_shape_nelem(&shape)))
        return gp_error(GP_INVALID_ARGUMENT, "safetensors writer: NULL argument");
    if (!name[0] || strlen(name) > ST_MAX_NAME || strcmp(name, "__metadata__") == 0)
        return gp_error(GP_INVALID_ARGUMENT, "safetensors writer: tensor name \"%.64s\" is empty, "
                                             "reserved or longer than %d bytes",
                        name, ST_MAX_NAME);
    if (dtype != GP_F32 && dtype != GP_I32)
        return gp_error(GP_INVALID_ARGUMENT, "safetensors writer: tensor \"%s\": unknown dtype",
                        name);
    for (int i = 0; i < w->n; i++)
        if (strcmp(w->items[i].name, name) == 0)
            return gp_error(GP_INVALID_ARGUMENT, "safetensors writer: tensor \"%s\" added twice",
                            name);
    if (w->n == w->cap) {
        int cap = w->cap ? 2 * w->cap : 64;
        st_item *it = realloc(w->items, (size_t)cap * sizeof *it);
        if (!it) return gp_error(GP_OUT_OF_MEMORY, "safetensors writer: %d tensors", cap);
        w->items = it;
        w->cap = cap;
    }
    st_item *it = &w->items[w->n];
    it->name = strdup(name);
    if (!it->name) return gp_error(GP_OUT_OF_MEMORY, "safetensors writer: tensor \"%s\"", name);
    it->dtype = dtype;
    it->shape = shape;
    it->data = data;
    it->nbytes = (uint64_t)gp_shape_nelem(&shape) * 4;
    w->n++;
    return GP_OK;
}

gp_status gp_safetensors_writer_meta(gp_safetensors_writer *w, const char *key,
                                     const char *value) {
    if (!w || !key || !value)
        return gp_error(GP_INVALID_ARGUMENT, "safetensors writer: NULL metadata key or value");
    if (strncmp(key, ST_CRC_PREFIX, strlen(ST_CRC_PREFIX)) == 0)
        return gp_error(GP_INVALID_ARGUMENT, "safetensors writer: metadata key \"%s\" is reserved "
                                             "for checksums",
                        key);
    cJSON *v = cJSON_CreateString(value);
    if (!v) return gp_error(GP_OUT_OF_MEMORY, "safetensors writer: metadata \"%s\"", key);
    if (cJSON_GetObjectItemCaseSensitive(w->meta, key))
        cJSON_ReplaceItemInObjectCaseSensitive(w->meta, key, v);
    else
        cJSON_AddItemToObject(w->meta, key, v);
    return GP_OK;
}

/* The header: tensors in the order added, data back to back, a CRC-32 of each in the metadata. */
static char *build_header(const gp_safetensors_writer *w) {
    cJSON *h = cJSON_CreateObject(), *meta = cJSON_Duplicate(w->meta, true);
    if (!h || !meta) goto fail;
    uint64_t at = 0;
    for (int i = 0; i < w->n; i++) {
        const st_item *it = &w->items[i];
        char key[ST_MAX_NAME + 16], hex[16];
        uint32_t crc = gp_crc32_bytes((uint32_t)crc32(0L, Z_NULL, 0), it->data, it->nbytes);
        snprintf(key, sizeof key, ST_CRC_PREFIX "%s", it->name);
        snprintf(hex, sizeof hex, "%08lx", (unsigned long)crc);
        cJSON *e = cJSON_CreateObject(), *shape = cJSON_CreateArray(),
              *off = cJSON_CreateArray();
        if (!e || !shape || !off || !cJSON_AddItemToObject(h, it->name, e)) {
            cJSON_Delete(e);
            cJSON_Delete(shape);
            cJSON_Delete(off);
            goto fail;
        }
        cJSON_AddStringToObject(e, "dtype", dtype_st_name(it->dtype));
        for (int d = 0; d < it->shape.ndim; d++)
            cJSON_AddItemToArray(shape, cJSON_CreateNumber((double)it->shape.dim[d]));
        cJSON_AddItemToObject(e, "shape", shape);
        cJSON_AddItemToArray(off, cJSON_CreateNumber((double)at));
        cJSON_AddItemToArray(off, cJSON_CreateNumber((double)(at + it->nbytes)));
        cJSON_AddItemToObject(e, "data_offsets", off);
        if (!cJSON_AddStringToObject(meta, key, hex)) goto fail;
        at += it->nbytes;
    }
    cJSON_AddItemToObject(h, "__metadata__", meta);
    meta = NULL;
    char *text = cJSON_PrintUnformatted(h);
    cJSON_Delete(h);
    return text;
fail:
    cJSON_Delete(h);
    cJSON_Delete(meta);
    return NULL;
}

gp_status gp_safetensors_writer_write(const gp_safetensors_writer *w, const char *path) {
    if (!w || !path) return gp_error(GP_INVALID_ARGUMENT, "safetensors writer: NULL argument");
    char *text = build_header(w);
    if (!text) return gp_error(GP_OUT_OF_MEMORY, "%s: cannot build the safetensors header", path);
    size_t n = strlen(text);
    size_t padded = (n + 7) / 8 * 8; /* the data starts 8-byte aligned */
    unsigned char len[8];
    for (int i = 0; i < 8; i++) len[i] = (unsigned char)((uint64_t)padded >> (8 * i));
    gp_file_out o;
    gp_status s = gp_file_out_open(&o, path);
    if (s != GP_OK) {
        free(text);
        return s;
    }
    gp_file_out_write_bytes(&o, len, 8);
    gp_file_out_write_bytes(&o, text, n);
    gp_file_out_write_bytes(&o, "        ", padded - n);
    free(text);
    for (int i = 0; i < w->n; i++) {
        const st_item *it = &w->items[i];
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
        gp_file_out_write_bytes(&o, it->data, (size_t)it->nbytes);
#else
        const uint32_t *v = it->data;
        for (uint64_t k = 0; k < it->nbytes / 4; k++) {
            unsigned char b[4] = {(unsigned char)v[k], (unsigned char)(v[k] >> 8),
                                  (unsigned char)(v[k] >> 16), (unsigned char)(v[k] >> 24)};
            gp_file_out_write_bytes(&o, b, 4);
        }
#endif
    }
    return gp_file_out_close(&o, true);
}
