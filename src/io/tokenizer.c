/* Byte-level BPE tokenizers from a Hugging Face tokenizer.json (GPT-2's scheme): each token of
 * model.vocab is a string of the 256 stand-in characters of GPT-2's bytes_to_unicode, one per
 * byte, so an id decodes to its bytes alone and a sequence to their concatenation; added tokens
 * decode to their content. */
#include <cjson/cJSON.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "core/read_file.h"

#define TOKENIZER_MAX_BYTES (256u << 20)

typedef struct tok_entry {
    uint8_t *bytes; /* NULL: no token has this id */
    size_t len;
} tok_entry;

struct gp_tokenizer {
    tok_entry *tok;
    int64_t n; /* ids 0..n-1 */
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
        if (!cJSON_IsNumber(e) || e->valuedouble != (double)(int64_t)e->valuedouble ||
            e->valuedouble < 0 || e->valuedouble > INT32_MAX)
            return gp_error(GP_FORMAT, "%s: model.vocab: token \"%s\": id is not an integer from "
                            "0 to 2^31 - 1", path, e->string);
        if (e->valuedouble > max) max = e->valuedouble;
    }
    cJSON_ArrayForEach(e, added) {
        const cJSON *id = cJSON_GetObjectItemCaseSensitive(e, "id");
        const cJSON *content = cJSON_GetObjectItemCaseSensitive(e, "content");
        if (!cJSON_IsNumber(id) || !cJSON_IsString(content) || id->valuedouble < 0 ||
            id->valuedouble > INT32_MAX || id->valuedouble != (double)(int64_t)id->valuedouble)
            return gp_error(GP_FORMAT, "%s: added_tokens: an entry without an integer id and a "
                            "content string", path);
        if (id->valuedouble > max) max = id->valuedouble;
    }
    if (max < 0) return gp_error(GP_FORMAT, "%s: model.vocab is empty", path);
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
    return GP_OK;
}

gp_status gp_tokenizer_load(const char *path, gp_tokenizer **out) {
    if (!out) return gp_error(GP_INVALID_ARGUMENT, "gp_tokenizer_load: out is NULL");
    *out = NULL;
    if (!path) return gp_error(GP_INVALID_ARGUMENT, "gp_tokenizer_load: path is NULL");
    unsigned char *text;
    size_t n;
    GP_TRY(gp_read_file(path, TOKENIZER_MAX_BYTES, &text, &n));
    cJSON *root = cJSON_ParseWithLength((const char *)text, n);
    free(text);
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
