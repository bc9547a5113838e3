/* Byte-level BPE tokenizers from a Hugging Face tokenizer.json (GPT-2's scheme): each token of
 * model.vocab is a string of the 256 stand-in characters of GPT-2's bytes_to_unicode, one per
 * byte, so an id decodes to its bytes alone and a sequence to their concatenation; added tokens
 * decode to their content. Encoding splits the text at added tokens, then into GPT-2's
 * pre-tokens (its pattern, matched by hand below), then merges each pre-token's bytes by
 * model.merges, lowest rank first. */
#include <cjson/cJSON.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "core/hash.h"
#include "core/read_file.h"
#include "io/unicode_classes.h"

#define TOKENIZER_MAX_BYTES (256u << 20)

typedef struct tok_entry {
    uint8_t *bytes; /* NULL: no token has this id */
    size_t len;
} tok_entry;

/* A merge: the pair (a, b) of ids becomes id `to`; lower ranks merge first. */
typedef struct merge {
    int32_t a, b, to;
    int32_t rank; /* -1: an empty slot */
} merge;

struct gp_tokenizer {
    tok_entry *tok;
    int64_t n; /* ids 0..n-1 */
    /* encoding */
    int32_t *by_bytes; /* open addressing over the vocabulary's ids by their bytes; -1 empty */
    size_t nby;        /* slots, a power of two */
    merge *merges;     /* open addressing by (a, b) */
    size_t nmerges;    /* slots, a power of two */
    int32_t byte_id[256];
    int32_t *added; /* the added tokens' ids, matched in the text before anything else */
    int nadded;
    bool add_prefix_space, ignore_merges;
    char no_encode[200]; /* why this file cannot encode ("": it can) */
};

/* GPT-2's bytes_to_unicode, inverted: inv[cp] is the byte code point cp stands for, or -1.
 * Printable Latin-1 bytes stand for themselves; the other 68 are the code points 256, 257, ...
 * in byte order. */
enum { NCP = 324 };
static void byte_table(int16_t inv[NCP]) {
    for (int i = 0; i < NCP; i++) inv[i] = -1;
    int extra = 0;
    for (int b = 0; b < 256; b++) {
        bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || b >= 0xAE;
        inv[printable ? b : 256 + extra++] = (int16_t)b;
    }
}

/* The next code point of UTF-8 s[*i..n), or -1 for an invalid sequence. */
static int64_t next_cp(const uint8_t *s, size_t n, size_t *i) {
    uint8_t c = s[*i];
    int len = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 0;
    if (!len || *i + (size_t)len > n) return -1;
    uint32_t cp = len == 1 ? c : c & (0x7F >> len);
    for (int k = 1; k < len; k++) {
        if ((s[*i + (size_t)k] & 0xC0) != 0x80) return -1;
        cp = cp << 6 | (s[*i + (size_t)k] & 0x3F);
    }
    *i += (size_t)len;
    return cp;
}

static gp_status set_token(gp_tokenizer *t, const char *path, int64_t id, const uint8_t *b,
                           size_t len, const char *name) {
    if (id < 0 || id >= t->n)
        return gp_error(GP_FORMAT, "%s: token \"%s\" has id %lld, expected 0 to %lld", path, name,
                        (long long)id, (long long)t->n - 1);
    uint8_t *p = malloc(len ? len : 1);
    if (!p) return gp_error(GP_OUT_OF_MEMORY, "%s: out of memory", path);
    memcpy(p, b, len);
    free(t->tok[id].bytes); /* an added token replaces the vocabulary's entry of its id */
    t->tok[id] = (tok_entry){p, len};
    return GP_OK;
}

/* A vocabulary string's bytes: each code point a byte by bytes_to_unicode. */
static gp_status vocab_bytes(const char *path, const int16_t inv[NCP], const char *s, uint8_t *out,
                             size_t *len) {
    size_t n = strlen(s), i = 0;
    *len = 0;
    while (i < n) {
        int64_t cp = next_cp((const uint8_t *)s, n, &i);
        int b = cp < 0 || cp >= NCP ? -1 : inv[cp];
        if (b < 0)
            return gp_error(GP_FORMAT, "%s: model.vocab: token \"%s\" has a character that is "
                            "not one of byte-level BPE's 256 (expected GPT-2's bytes_to_unicode "
                            "alphabet)", path, s);
        out[(*len)++] = (uint8_t)b;
    }
    return GP_OK;
}

static uint64_t bytes_hash(const uint8_t *b, size_t n) {
    return gp_fnv1a64(GP_FNV1A64_INIT, b, n);
}

/* The id whose token is exactly these bytes, or -1. */
static int32_t find_bytes(const gp_tokenizer *t, const uint8_t *b, size_t n) {
    for (size_t h = bytes_hash(b, n) & (t->nby - 1);; h = (h + 1) & (t->nby - 1)) {
        int32_t id = t->by_bytes[h];
        if (id < 0) return -1;
        if (t->tok[id].len == n && memcmp(t->tok[id].bytes, b, n) == 0) return id;
    }
}

static size_t pair_slot(const gp_tokenizer *t, int32_t a, int32_t b) {
    size_t h = (size_t)(((uint64_t)(uint32_t)a * 0x9E3779B97F4A7C15ULL) ^ (uint32_t)b) *
               0xBF58476D1CE4E5B9ULL;
    for (h &= t->nmerges - 1;; h = (h + 1) & (t->nmerges - 1))
        if (t->merges[h].rank < 0 || (t->merges[h].a == a && t->merges[h].b == b)) return h;
}

static size_t pow2_above(size_t n) {
    size_t c = 16;
    while (c < 2 * n) c *= 2;
    return c;
}

/* A merge's two halves: "a b" (older files) or ["a", "b"]. */
static bool merge_halves(const cJSON *m, const char **a, size_t *alen, const char **b,
                         size_t *blen) {
    if (cJSON_IsString(m)) {
        const char *sp = strchr(m->valuestring, ' ');
        if (!sp || strchr(sp + 1, ' ')) return false;
        *a = m->valuestring;
        *alen = (size_t)(sp - m->valuestring);
        *b = sp + 1;
        *blen = strlen(sp + 1);
        return true;
    }
    const cJSON *x = cJSON_GetArrayItem(m, 0), *y = cJSON_GetArrayItem(m, 1);
    if (!cJSON_IsArray(m) || cJSON_GetArraySize(m) != 2 || !cJSON_IsString(x) || !cJSON_IsString(y))
        return false;
    *a = x->valuestring;
    *alen = strlen(*a);
    *b = y->valuestring;
    *blen = strlen(*b);
    return true;
}

/* The id of a vocabulary string (stand-in characters), or -1. */
static int32_t find_string(const gp_tokenizer *t, const int16_t inv[NCP], const char *s,
                           size_t n, uint8_t *buf) {
    size_t i = 0, len = 0;
    while (i < n) {
        int64_t cp = next_cp((const uint8_t *)s, n, &i);
        if (cp < 0 || cp >= NCP || inv[cp] < 0) return -1;
        buf[len++] = (uint8_t)inv[cp];
    }
    return find_bytes(t, buf, len);
}

/* What encoding needs: the ids by their bytes, the merges by pair, each byte's id, the added
 * tokens, the pre-tokenizer's options. A file this cannot encode still decodes: the reason is
 * kept for gp_tokenizer_encode. */
static gp_status load_encoder(gp_tokenizer *t, const char *path, const cJSON *root) {
    t->nby = pow2_above((size_t)t->n);
    t->by_bytes = malloc(t->nby * sizeof *t->by_bytes);
    if (!t->by_bytes) return gp_error(GP_OUT_OF_MEMORY, "%s: out of memory", path);
    for (size_t i = 0; i < t->nby; i++) t->by_bytes[i] = -1;
    for (int64_t id = 0; id < t->n; id++) {
        if (!t->tok[id].bytes) continue;
        size_t h = bytes_hash(t->tok[id].bytes, t->tok[id].len) & (t->nby - 1);
        while (t->by_bytes[h] >= 0) h = (h + 1) & (t->nby - 1);
        t->by_bytes[h] = (int32_t)id;
    }
    for (int b = 0; b < 256; b++) {
        uint8_t byte = (uint8_t)b;
        t->byte_id[b] = find_bytes(t, &byte, 1);
    }
    const cJSON *added = cJSON_GetObjectItemCaseSensitive(root, "added_tokens");
    int nadded = cJSON_GetArraySize(added);
    t->added = malloc(((size_t)nadded + 1) * sizeof *t->added);
    if (!t->added) return gp_error(GP_OUT_OF_MEMORY, "%s: out of memory", path);
    const cJSON *e;
    cJSON_ArrayForEach(e, added) {
        const cJSON *id = cJSON_GetObjectItemCaseSensitive(e, "id");
        if (t->tok[(int64_t)id->valuedouble].len > 0) t->added[t->nadded++] = (int32_t)id->valuedouble;
    }
    const cJSON *model = cJSON_GetObjectItemCaseSensitive(root, "model");
    t->ignore_merges = cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(model, "ignore_merges"));
    const cJSON *merges = cJSON_GetObjectItemCaseSensitive(model, "merges");
    int nm = cJSON_GetArraySize(merges);
    t->nmerges = pow2_above((size_t)nm);
    t->merges = malloc(t->nmerges * sizeof *t->merges);
    uint8_t *buf = malloc(2 * 4 * (size_t)65536); /* stand-in characters are at most 2 bytes */
    if (!t->merges || !buf) {
        free(buf);
        return gp_error(GP_OUT_OF_MEMORY, "%s: out of memory", path);
    }
    for (size_t i = 0; i < t->nmerges; i++) t->merges[i].rank = -1;
    int16_t inv[NCP];
    byte_table(inv);
    int rank = 0;
    cJSON_ArrayForEach(e, merges) {
        const char *a, *b;
        size_t alen, blen;
        if (!merge_halves(e, &a, &alen, &b, &blen) || alen + blen > 65536) {
            free(buf);
            return gp_error(GP_FORMAT, "%s: model.merges[%d]: expected \"a b\" or [\"a\", "
                            "\"b\"]", path, rank);
        }
        int32_t ia = find_string(t, inv, a, alen, buf), ib = find_string(t, inv, b, blen, buf);
        char *ab = malloc(alen + blen + 1);
        int32_t to = -1;
        if (ab) {
            memcpy(ab, a, alen);
            memcpy(ab + alen, b, blen);
            to = find_string(t, inv, ab, alen + blen, buf);
        }
        free(ab);
        if (ia < 0 || ib < 0 || to < 0) {
            free(buf);
            return gp_error(GP_FORMAT, "%s: model.merges[%d]: \"%.*s\" + \"%.*s\": a part or "
                            "the merged token is not in model.vocab", path, rank, (int)alen, a,
                            (int)blen, b);
        }
        size_t h = pair_slot(t, ia, ib);
        if (t->merges[h].rank < 0) t->merges[h] = (merge){ia, ib, to, rank}; /* the first wins */
        rank++;
    }
    free(buf);
    const cJSON *norm = cJSON_GetObjectItemCaseSensitive(root, "normalizer");
    const cJSON *pre = cJSON_GetObjectItemCaseSensitive(root, "pre_tokenizer");
    const cJSON *ptype = cJSON_GetObjectItemCaseSensitive(pre, "type");
    if (norm && !cJSON_IsNull(norm))
        snprintf(t->no_encode, sizeof t->no_encode, "it has a normalizer (this encoder has none)");
    else if (!cJSON_IsString(ptype) || strcmp(ptype->valuestring, "ByteLevel") != 0)
        snprintf(t->no_encode, sizeof t->no_encode,
                 "its pre_tokenizer is not ByteLevel (this encoder has only GPT-2's)");
    else if (cJSON_IsFalse(cJSON_GetObjectItemCaseSensitive(pre, "use_regex")))
        snprintf(t->no_encode, sizeof t->no_encode, "its ByteLevel pre_tokenizer has use_regex "
                 "false (this encoder has only GPT-2's pattern)");
    t->add_prefix_space = cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(pre, "add_prefix_space"));
    return GP_OK;
}

/* An integer id from 0 to 2^31 - 1 (range first: casting a larger double is undefined). */
static bool is_id(const cJSON *v) {
    return cJSON_IsNumber(v) && v->valuedouble >= 0 && v->valuedouble <= INT32_MAX &&
           v->valuedouble == (double)(int32_t)v->valuedouble;
}

static gp_status load(gp_tokenizer *t, const char *path, const cJSON *root) {
    const cJSON *model = cJSON_GetObjectItemCaseSensitive(root, "model");
    const cJSON *type = cJSON_GetObjectItemCaseSensitive(model, "type");
    const cJSON *vocab = cJSON_GetObjectItemCaseSensitive(model, "vocab");
    if (!cJSON_IsObject(model) || !cJSON_IsString(type) || strcmp(type->valuestring, "BPE") != 0)
        return gp_error(GP_FORMAT, "%s: model.type is not \"BPE\" (expected a byte-level BPE "
                        "tokenizer.json)", path);
    if (!cJSON_IsObject(vocab))
        return gp_error(GP_FORMAT, "%s: model.vocab is not an object of token -> id", path);
    const cJSON *dec = cJSON_GetObjectItemCaseSensitive(root, "decoder");
    const cJSON *dtype = cJSON_GetObjectItemCaseSensitive(dec, "type");
    if (!cJSON_IsString(dtype) || strcmp(dtype->valuestring, "ByteLevel") != 0)
        return gp_error(GP_FORMAT, "%s: decoder.type is not \"ByteLevel\" (only byte-level BPE "
                        "tokenizers decode to bytes this way)", path);
    const cJSON *added = cJSON_GetObjectItemCaseSensitive(root, "added_tokens");
    double max = -1;
    const cJSON *e;
    cJSON_ArrayForEach(e, vocab) {
        if (!is_id(e))
            return gp_error(GP_FORMAT, "%s: model.vocab: token \"%s\": id is not an integer from "
                            "0 to 2^31 - 1", path, e->string);
        if (e->valuedouble > max) max = e->valuedouble;
    }
    cJSON_ArrayForEach(e, added) {
        const cJSON *id = cJSON_GetObjectItemCaseSensitive(e, "id");
        const cJSON *content = cJSON_GetObjectItemCaseSensitive(e, "content");
        if (!is_id(id) || !cJSON_IsString(content))
            return gp_error(GP_FORMAT, "%s: added_tokens: an entry without an integer id and a "
                            "content string", path);
        if (id->valuedouble > max) max = id->valuedouble;
    }
    if (max < 0) return gp_error(GP_FORMAT, "%s: model.vocab is empty", path);
    /* Ids are (nearly) dense in every real file; a few gaps are allowed, but the table of ids is
     * never much larger than the file's own entries. */
    const int entries = cJSON_GetArraySize(vocab) + cJSON_GetArraySize(added);
    if (max >= (double)entries + 65536)
        return gp_error(GP_FORMAT, "%s: an id of %.0f among %d tokens (expected ids from 0 to "
                        "about the number of tokens)", path, max, entries);
    t->n = (int64_t)max + 1;
    t->tok = calloc((size_t)t->n, sizeof *t->tok);
    if (!t->tok) return gp_error(GP_OUT_OF_MEMORY, "%s: %lld ids: out of memory", path,
                                 (long long)t->n);
    int16_t inv[NCP];
    byte_table(inv);
    cJSON_ArrayForEach(e, vocab) {
        size_t len;
        uint8_t *buf = malloc(strlen(e->string) + 1);
        if (!buf) return gp_error(GP_OUT_OF_MEMORY, "%s: out of memory", path);
        gp_status s = vocab_bytes(path, inv, e->string, buf, &len);
        if (s == GP_OK) s = set_token(t, path, (int64_t)e->valuedouble, buf, len, e->string);
        free(buf);
        GP_TRY(s);
    }
    cJSON_ArrayForEach(e, added) {
        const cJSON *content = cJSON_GetObjectItemCaseSensitive(e, "content");
        GP_TRY(set_token(t, path, (int64_t)cJSON_GetObjectItemCaseSensitive(e, "id")->valuedouble,
                         (const uint8_t *)content->valuestring, strlen(content->valuestring),
                         content->valuestring));
    }
    return load_encoder(t, path, root);
}

gp_status gp_tokenizer_load(const char *path, gp_tokenizer **out) {
    if (!out) return gp_error(GP_INVALID_ARGUMENT, "gp_tokenizer_load: out is NULL");
    *out = NULL;
    if (!path) return gp_error(GP_INVALID_ARGUMENT, "gp_tokenizer_load: path is NULL");
    cJSON *root;
    GP_TRY(gp_read_json(path, TOKENIZER_MAX_BYTES, &root));
    if (!root) return gp_error(GP_FORMAT, "%s: not valid JSON (expected a tokenizer.json)", path);
    gp_tokenizer *t = calloc(1, sizeof *t);
    gp_status s = t ? load(t, path, root) : gp_error(GP_OUT_OF_MEMORY, "%s: out of memory", path);
    cJSON_Delete(root);
    if (s != GP_OK) {
        gp_tokenizer_free(t);
        return s;
    }
    *out = t;
    return GP_OK;
}

void gp_tokenizer_free(gp_tokenizer *t) {
    if (!t) return;
    for (int64_t i = 0; t->tok && i < t->n; i++) free(t->tok[i].bytes);
    free(t->tok);
    free(t->by_bytes);
    free(t->merges);
    free(t->added);
    free(t);
}

int64_t gp_tokenizer_size(const gp_tokenizer *t) { return t ? t->n : 0; }

gp_status gp_tokenizer_token(const gp_tokenizer *t, int64_t id, const uint8_t **bytes,
                             size_t *len) {
    if (!t || !bytes || !len)
        return gp_error(GP_INVALID_ARGUMENT, "gp_tokenizer_token: NULL tokenizer or output");
    if (id < 0 || id >= t->n || !t->tok[id].bytes)
        return gp_error(GP_INVALID_ARGUMENT, "gp_tokenizer_token: id %lld is no token of this "
                        "tokenizer (ids 0 to %lld)", (long long)id, (long long)t->n - 1);
    *bytes = t->tok[id].bytes;
    *len = t->tok[id].len;
    return GP_OK;
}

gp_status gp_tokenizer_decode(const gp_tokenizer *t, const int32_t *ids, int64_t n, uint8_t **out,
                              size_t *len) {
    if (!out || !len || (!ids && n > 0) || n < 0)
        return gp_error(GP_INVALID_ARGUMENT, "gp_tokenizer_decode: NULL ids or output");
    *out = NULL;
    *len = 0;
    size_t total = 0;
    for (int64_t i = 0; i < n; i++) {
        const uint8_t *b;
        size_t l;
        gp_status s = gp_tokenizer_token(t, ids[i], &b, &l);
        if (s != GP_OK)
            return gp_error_context(s, "gp_tokenizer_decode: id %lld of %lld", (long long)i,
                                    (long long)n);
        total += l;
    }
    uint8_t *p = malloc(total + 1);
    if (!p) return gp_error(GP_OUT_OF_MEMORY, "gp_tokenizer_decode: %zu bytes", total);
    for (int64_t i = 0; i < n; i++) {
        memcpy(p + *len, t->tok[ids[i]].bytes, t->tok[ids[i]].len);
        *len += t->tok[ids[i]].len;
    }
    p[*len] = 0;
    *out = p;
    return GP_OK;
}

/* ------------------------------------------------------------------ encoding */

typedef struct id_buf {
    int32_t *p;
    int64_t n, cap;
} id_buf;

static gp_status put(id_buf *o, int32_t id) {
    if (o->n == o->cap) {
        int64_t cap = o->cap ? 2 * o->cap : 256;
        int32_t *p = realloc(o->p, (size_t)cap * sizeof *p);
        if (!p) return gp_error(GP_OUT_OF_MEMORY, "gp_tokenizer_encode: out of memory");
        o->p = p;
        o->cap = cap;
    }
    o->p[o->n++] = id;
    return GP_OK;
}

/* One pre-token's ids: its bytes merged pair by pair, the pair of lowest rank first (the
 * leftmost among equals), until no pair merges. */
static gp_status bpe(const gp_tokenizer *t, const uint8_t *w, size_t n, id_buf *o) {
    int32_t whole = t->ignore_merges ? find_bytes(t, w, n) : -1;
    if (whole >= 0) return put(o, whole);
    int32_t *sym = malloc(n * sizeof *sym);
    if (!sym) return gp_error(GP_OUT_OF_MEMORY, "gp_tokenizer_encode: out of memory");
    for (size_t i = 0; i < n; i++) {
        sym[i] = t->byte_id[w[i]];
        if (sym[i] < 0) {
            free(sym);
            return gp_error(GP_FORMAT, "gp_tokenizer_encode: byte 0x%02X has no token in "
                            "model.vocab", w[i]);
        }
    }
    size_t m = n;
    for (;;) {
        size_t best = m;
        int32_t best_rank = INT32_MAX, to = -1;
        for (size_t i = 0; i + 1 < m; i++) {
            const merge *g = &t->merges[pair_slot(t, sym[i], sym[i + 1])];
            if (g->rank >= 0 && g->rank < best_rank) {
                best_rank = g->rank;
                best = i;
                to = g->to;
            }
        }
        if (best == m) break;
        sym[best] = to;
        memmove(sym + best + 1, sym + best + 2, (m - best - 2) * sizeof *sym);
        m--;
    }
    gp_status s = GP_OK;
    for (size_t i = 0; i < m && s == GP_OK; i++) s = put(o, sym[i]);
    free(sym);
    return s;
}

/* \s of the pattern: Unicode's White_Space. */
static bool is_space(int64_t c) {
    return (c >= 9 && c <= 13) || c == ' ' || c == 0x85 || c == 0xA0 || c == 0x1680 ||
           (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 || c == 0x202F ||
           c == 0x205F || c == 0x3000;
}

typedef enum { CL_LETTER, CL_NUMBER, CL_SPACE, CL_OTHER } char_class;

/* The class of the code point at s[i] (an invalid byte is "other", as one character) and its
 * length. */
static char_class class_at(const uint8_t *s, size_t n, size_t i, size_t *len) {
    size_t j = i;
    int64_t c = next_cp(s, n, &j);
    if (c < 0) {
        *len = 1;
        return CL_OTHER;
    }
    *len = j - i;
    return is_space(c)                            ? CL_SPACE
           : gp_unicode_is_letter((uint32_t)c)    ? CL_LETTER
           : gp_unicode_is_number((uint32_t)c)    ? CL_NUMBER
                                                  : CL_OTHER;
}

/* The end of the run of class k from i. */
static size_t run_end(const uint8_t *s, size_t n, size_t i, char_class k) {
    size_t len;
    while (i < n && class_at(s, n, i, &len) == k) i += len;
    return i;
}

/* The length of the pre-token at s[i] by GPT-2's pattern
 * 's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
 * whose alternatives are tried in order. */
static size_t pretoken(const uint8_t *s, size_t n, size_t i) {
    static const char *const contractions[] = {"'s", "'t", "'re", "'ve", "'m", "'ll", "'d"};
    for (int k = 0; k < 7; k++) {
        size_t l = strlen(contractions[k]);
        if (i + l <= n && memcmp(s + i, contractions[k], l) == 0) return l;
    }
    size_t j = i + (s[i] == ' ' && i + 1 < n ? 1 : 0), len; /* " ?" then a class's run */
    char_class k = class_at(s, n, j, &len);
    if (k != CL_SPACE) return run_end(s, n, j, k) - i;
    /* whitespace: the run, less its last character when something other than space follows
     * (that character then leads the next pre-token), but never empty */
    size_t end = run_end(s, n, i, CL_SPACE);
    if (end == n) return end - i;
    size_t last = i, p = i;
    while (p < end) {
        last = p;
        class_at(s, n, p, &len);
        p += len;
    }
    return last > i ? last - i : end - i;
}

gp_status gp_tokenizer_encode(const gp_tokenizer *t, const uint8_t *text, size_t n,
                              int32_t **ids, int64_t *nids) {
    if (!t || (!text && n) || !ids || !nids)
        return gp_error(GP_INVALID_ARGUMENT, "gp_tokenizer_encode: NULL tokenizer, text or "
                        "output");
    *ids = NULL;
    *nids = 0;
    if (t->no_encode[0])
        return gp_error(GP_UNSUPPORTED, "gp_tokenizer_encode: this tokenizer cannot encode: %s",
                        t->no_encode);
    id_buf o = {0};
    gp_status s = GP_OK;
    uint8_t *pre = malloc(n + 2); /* a segment, with the prefix space */
    if (!pre) return gp_error(GP_OUT_OF_MEMORY, "gp_tokenizer_encode: out of memory");
    size_t seg = 0; /* the start of the text not yet encoded */
    for (size_t i = 0; i <= n && s == GP_OK;) {
        /* an added token here (the longest), or the end: encode the segment before it */
        int32_t hit = -1;
        for (int a = 0; a < t->nadded && i < n; a++) {
            const tok_entry *e = &t->tok[t->added[a]];
            if (e->len <= n - i && memcmp(text + i, e->bytes, e->len) == 0 &&
                (hit < 0 || e->len > t->tok[hit].len))
                hit = t->added[a];
        }
        if (hit < 0 && i < n) {
            i++;
            continue;
        }
        size_t m = 0;
        if (t->add_prefix_space && i > seg && text[seg] != ' ') pre[m++] = ' ';
        memcpy(pre + m, text + seg, i - seg);
        m += i - seg;
        for (size_t p = 0; p < m && s == GP_OK;) {
            size_t l = pretoken(pre, m, p);
            s = bpe(t, pre + p, l, &o);
            p += l;
        }
        if (hit >= 0 && s == GP_OK) s = put(&o, hit);
        if (hit < 0) break;
        i += t->tok[hit].len;
        seg = i;
    }
    free(pre);
    if (s != GP_OK) {
        free(o.p);
        return s;
    }
    *ids = o.p;
    *nids = o.n;
    return GP_OK;
}
