/* Token files and tokenizers, from files written here (no Python needed): an llm.c shard and raw
 * uint16 / uint32 files opened, their windows, every kind of bad file refused with the byte
 * offset; a byte-level BPE tokenizer.json written by hand (the 256 byte tokens in byte order,
 * three merges, an added token) decoding and encoding by GPT-2's pre-tokenizer pattern. */
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "testutil.h"

static const char *write_bytes(const char *name, const void *p, size_t n) {
    const char *path = gp_scratch_path(name);
    FILE *f = fopen(path, "wb");
    if (!f || (n && fwrite(p, 1, n, f) != n)) {
        fprintf(stderr, "cannot write %s\n", path);
        exit(1);
    }
    fclose(f);
    gp_scratch_remember(path);
    return path;
}

/* An llm.c shard of n uint16 ids with the given header words. */
static const char *write_llmc(const char *name, int32_t magic, int32_t version, int32_t count,
                              const uint16_t *ids, size_t n) {
    size_t size = 1024 + 2 * n;
    uint8_t *b = calloc(1, size);
    int32_t h[3] = {magic, version, count};
    memcpy(b, h, sizeof h);
    memcpy(b + 1024, ids, 2 * n);
    const char *path = write_bytes(name, b, size);
    free(b);
    return path;
}

static void test_files(gp_device *dev) {
    const uint16_t ids[10] = {5, 300, 7, 8, 9, 10, 11, 12, 13, 299};
    gp_token_shard s;
    CHECK_OK(gp_tokens_open(write_llmc("a.bin", 20240520, 1, 10, ids, 10), GP_TOKENS_LLMC, 301, &s));
    CHECK_EQ_INT(s.ntokens, 10);
    CHECK_EQ_INT(s.width, 2);
    CHECK_EQ_INT((int64_t)s.offset, 1024);
    gp_tensor x, y;
    REQUIRE_OK(gp_tensor_alloc(dev, GP_MEM_ACTIVATIONS, gp_shape2(2, 3), GP_I32, &x));
    REQUIRE_OK(gp_tensor_alloc(dev, GP_MEM_ACTIVATIONS, gp_shape2(2, 3), GP_I32, &y));
    const int64_t starts[2] = {0, 6};
    CHECK_OK(gp_tokens_batch(s.ids, s.width, s.ntokens, starts, 2, 3, &x, &y));
    const int32_t *xd = gp_tensor_host_data(&x), *yd = gp_tensor_host_data(&y);
    const int32_t wx[6] = {5, 300, 7, 11, 12, 13}, wy[6] = {300, 7, 8, 12, 13, 299};
    for (int i = 0; i < 6; i++) {
        CHECK_EQ_INT(xd[i], wx[i]);
        CHECK_EQ_INT(yd[i], wy[i]);
    }
    const int64_t late[2] = {0, 7};
    CHECK_FAILS(gp_tokens_batch(s.ids, s.width, s.ntokens, late, 2, 3, &x, &y),
                GP_INVALID_ARGUMENT, "starts[1] = 7, expected 0 to n - seq_len - 1 = 6");
    CHECK_FAILS(gp_tokens_batch(s.ids, 3, s.ntokens, starts, 2, 3, &x, &y), GP_INVALID_ARGUMENT,
                "ids of 3 bytes");
    gp_tokens_close(&s);
    CHECK(s.map == NULL);

    /* uint32 ids past 65535, and the same ids as uint16 */
    const uint32_t big[4] = {70000, 1, 2, 65536};
    CHECK_OK(gp_tokens_open(write_bytes("a.u32", big, sizeof big), GP_TOKENS_U32, 70001, &s));
    CHECK_EQ_INT(s.ntokens, 4);
    CHECK_EQ_INT(s.width, 4);
    gp_tensor_release(&x);
    gp_tensor_release(&y);
    REQUIRE_OK(gp_tensor_alloc(dev, GP_MEM_ACTIVATIONS, gp_shape2(1, 3), GP_I32, &x));
    REQUIRE_OK(gp_tensor_alloc(dev, GP_MEM_ACTIVATIONS, gp_shape2(1, 3), GP_I32, &y));
    CHECK_OK(gp_tokens_batch(s.ids, s.width, s.ntokens, starts, 1, 3, &x, &y));
    xd = gp_tensor_host_data(&x);
    yd = gp_tensor_host_data(&y);
    CHECK_EQ_INT(xd[0], 70000);
    CHECK_EQ_INT(yd[2], 65536);
    gp_tokens_close(&s);
    CHECK_OK(gp_tokens_open(write_bytes("a.u16", ids, sizeof ids), GP_TOKENS_U16, 301, &s));
    CHECK_EQ_INT(s.ntokens, 10);
    CHECK_EQ_INT((int64_t)s.offset, 0);
    gp_tokens_close(&s);
    gp_tensor_release(&x);
    gp_tensor_release(&y);

    /* bad files, each named with the byte offset of what is wrong */
    CHECK_FAILS(gp_tokens_open(write_llmc("magic.bin", 7, 1, 10, ids, 10), GP_TOKENS_LLMC, 301, &s),
                GP_FORMAT, "magic.bin: byte offset 0: magic 7, expected 20240520");
    CHECK_FAILS(gp_tokens_open(write_llmc("ver.bin", 20240520, 2, 10, ids, 10), GP_TOKENS_LLMC, 301,
                               &s),
                GP_FORMAT, "ver.bin: byte offset 4: version 2, expected 1");
    CHECK_FAILS(gp_tokens_open(write_llmc("cut.bin", 20240520, 1, 11, ids, 10), GP_TOKENS_LLMC, 301,
                               &s),
                GP_FORMAT, "the header says 11 tokens, 1046 bytes in all, but the file ends at byte "
                           "offset 1044");
    CHECK_FAILS(gp_tokens_open(write_llmc("long.bin", 20240520, 1, 9, ids, 10), GP_TOKENS_LLMC, 301,
                               &s),
                GP_FORMAT, "the file has 2 more bytes from byte offset 1042");
    CHECK_FAILS(gp_tokens_open(write_llmc("neg.bin", 20240520, 1, -1, ids, 10), GP_TOKENS_LLMC, 301,
                               &s),
                GP_FORMAT, "byte offset 8: the header's token count is -1");
    CHECK_FAILS(gp_tokens_open(write_llmc("id.bin", 20240520, 1, 10, ids, 10), GP_TOKENS_LLMC, 300,
                               &s),
                GP_FORMAT, "id.bin: byte offset 1026: token id 300 (token 1 of the file) is not "
                           "below the vocabulary of 300");
    CHECK_FAILS(gp_tokens_open(write_bytes("id.u32", big, sizeof big), GP_TOKENS_U32, 65536, &s),
                GP_FORMAT, "id.u32: byte offset 0: token id 70000");
    CHECK_FAILS(gp_tokens_open(write_bytes("odd.u32", big, 7), GP_TOKENS_U32, 70001, &s), GP_FORMAT,
                "odd.u32: 7 bytes, not a whole number of uint32 token ids (a partial id at byte "
                "offset 4");
    CHECK_FAILS(gp_tokens_open(write_bytes("short.bin", ids, 20), GP_TOKENS_LLMC, 301, &s),
                GP_FORMAT, "short.bin: 20 bytes, shorter than llm.c's header of 1024 bytes");
    CHECK_FAILS(gp_tokens_open(write_bytes("empty.u16", ids, 0), GP_TOKENS_U16, 301, &s), GP_FORMAT,
                "empty.u16: empty");
    CHECK_FAILS(gp_tokens_open(gp_scratch_dir(), GP_TOKENS_U16, 301, &s), GP_IO, "");
    CHECK_FAILS(gp_tokens_open("a.u16", GP_TOKENS_U16, 0, &s), GP_INVALID_ARGUMENT,
                "vocabulary 0, expected 1 to 2^31");
    CHECK_FAILS(gp_tokens_open(NULL, GP_TOKENS_U16, 10, &s), GP_INVALID_ARGUMENT, "path is NULL");
}

/* GPT-2's bytes_to_unicode: the character that stands for byte b, as UTF-8 into out. */
static int stand_in(int b, char *out) {
    int cp = b, extra = 0;
    for (int c = 0; c < 256; c++) {
        bool printable = (c >= '!' && c <= '~') || (c >= 0xA1 && c <= 0xAC) || c >= 0xAE;
        if (!printable) {
            if (c == b) cp = 256 + extra;
            extra++;
        }
    }
    if (cp < 0x80) {
        out[0] = (char)cp;
        return 1;
    }
    out[0] = (char)(0xC0 | cp >> 6);
    out[1] = (char)(0x80 | (cp & 0x3F));
    return 2;
}

/* A JSON string of the stand-ins of `bytes`. */
static void json_token(const char *bytes, char *out) {
    size_t n = 0;
    out[n++] = '"';
    for (const char *p = bytes; *p; p++) {
        char c[2];
        int len = stand_in((uint8_t)*p, c);
        if (len == 1 && (c[0] == '"' || c[0] == '\\')) out[n++] = '\\';
        memcpy(out + n, c, (size_t)len);
        n += (size_t)len;
    }
    out[n++] = '"';
    out[n] = '\0';
}

static const char *write_tokenizer(const char *name, const char *pre_type) {
    size_t cap = 1 << 16, n = 0;
    char *j = malloc(cap), tok[64];
    n += (size_t)snprintf(j + n, cap - n, "{\"added_tokens\": [{\"id\": 259, \"content\": "
                                          "\"<|end|>\", \"special\": true}], \"normalizer\": null, "
                                          "\"pre_tokenizer\": {\"type\": \"%s\", "
                                          "\"add_prefix_space\": false, \"use_regex\": true}, "
                                          "\"decoder\": {\"type\": \"ByteLevel\"}, \"model\": "
                                          "{\"type\": \"BPE\", \"vocab\": {",
                          pre_type);
    for (int b = 1; b < 256; b++) { /* byte 0 is left out: a byte without a token */
        char one[2] = {(char)b, 0};
        json_token(one, tok);
        n += (size_t)snprintf(j + n, cap - n, "%s%s: %d", b > 1 ? ", " : "", tok, b);
    }
    /* merged tokens 256-258 and 260-261 (259 is the added token) */
    const char *merged[6] = {"it", " a", "'s", NULL, "a\xD0", "a\xC2"};
    for (int m = 0; m < 6; m++) {
        if (!merged[m]) continue;
        json_token(merged[m], tok);
        n += (size_t)snprintf(j + n, cap - n, ", %s: %d", tok, 256 + m);
    }
    /* the merges in both forms: "a b" and ["a", "b"] */
    char a[16], b[16], c[16], d[16], e[16], f[16];
    json_token("i", a);
    json_token("t", b);
    json_token(" ", c);
    json_token("a", d);
    json_token("\xD0", e);
    json_token("\xC2", f);
    n += (size_t)snprintf(j + n, cap - n,
                          "}, \"merges\": [[%s, %s], [%s, %s], \"' s\", [%s, %s], [%s, %s]]}}", a,
                          b, c, d, d, e, d, f);
    const char *path = write_bytes(name, j, n);
    free(j);
    return path;
}

static void check_encode(const gp_tokenizer *t, const char *text, const int32_t *want, int n) {
    int32_t *ids = NULL;
    int64_t got = -1;
    CHECK_OK(gp_tokenizer_encode(t, (const uint8_t *)text, strlen(text), &ids, &got));
    CHECK_EQ_INT(got, n);
    for (int i = 0; i < n && i < got; i++) CHECK_EQ_INT(ids[i], want[i]);
    uint8_t *back = NULL;
    size_t len = 0;
    CHECK_OK(gp_tokenizer_decode(t, ids, got, &back, &len));
    CHECK(len == strlen(text) && back && memcmp(back, text, len) == 0);
    free(back);
    free(ids);
}

static void test_tokenizer(void) {
    gp_tokenizer *t;
    REQUIRE_OK(gp_tokenizer_load(write_tokenizer("tok.json", "ByteLevel"), &t));
    CHECK_EQ_INT(gp_tokenizer_size(t), 262);
    const uint8_t *b;
    size_t len;
    CHECK_OK(gp_tokenizer_token(t, 257, &b, &len));
    CHECK(len == 2 && memcmp(b, " a", 2) == 0);
    CHECK_OK(gp_tokenizer_token(t, 0xC4, &b, &len)); /* a byte whose stand-in is itself */
    CHECK(len == 1 && b[0] == 0xC4);
    CHECK_OK(gp_tokenizer_token(t, 10, &b, &len)); /* a byte with a stand-in of U+0100 + k */
    CHECK(len == 1 && b[0] == '\n');
    CHECK_FAILS(gp_tokenizer_token(t, 0, &b, &len), GP_INVALID_ARGUMENT, "id 0 is no token");
    CHECK_FAILS(gp_tokenizer_token(t, 262, &b, &len), GP_INVALID_ARGUMENT, "id 262 is no token");
    /* pre-tokens "it" "'s" " a" | "it" " " "  a" ... by the pattern's alternatives in order */
    check_encode(t, "it's a", (const int32_t[]){256, 258, 257}, 3);
    /* white space: a run followed by a word leaves its last character to the word */
    check_encode(t, "a  a\n\nit", (const int32_t[]){'a', ' ', 257, '\n', '\n', 256}, 6);
    check_encode(t, "it   ", (const int32_t[]){256, ' ', ' ', ' '}, 4);
    /* letters and numbers of other scripts, seen through merges across their bytes: "aЖ" is one
     * run of letters (a + the first byte of Ж merge), "a½" a letter then a number (no merge) */
    check_encode(t, "a\xd0\x96", (const int32_t[]){260, 0x96}, 2);
    check_encode(t, "a\xc2\xbd", (const int32_t[]){'a', 0xC2, 0xBD}, 3);
    check_encode(t, "\xd0\x96\xd0\xb8 \xc2\xbd!",
                 (const int32_t[]){0xD0, 0x96, 0xD0, 0xB8, ' ', 0xC2, 0xBD, '!'}, 8);
    /* an added token is matched before anything else */
    check_encode(t, "it<|end|> a", (const int32_t[]){256, 259, 257}, 3);
    int32_t *ids;
    int64_t n;
    CHECK_FAILS(gp_tokenizer_encode(t, (const uint8_t *)"a\0", 2, &ids, &n), GP_FORMAT,
                "byte 0x00 has no token");
    uint8_t *out;
    CHECK_FAILS(gp_tokenizer_decode(t, (const int32_t[]){97, 0}, 2, &out, &len),
                GP_INVALID_ARGUMENT, "id 1 of 2");
    gp_tokenizer_free(t);

    /* a pre-tokenizer other than GPT-2's: decodes, does not encode */
    REQUIRE_OK(gp_tokenizer_load(write_tokenizer("meta.json", "Metaspace"), &t));
    CHECK_FAILS(gp_tokenizer_encode(t, (const uint8_t *)"a", 1, &ids, &n), GP_UNSUPPORTED,
                "its pre_tokenizer is not ByteLevel");
    gp_tokenizer_free(t);
    const char *bad[][2] = {
        {"{", "not valid JSON"},
        {"{\"model\": {\"type\": \"WordPiece\", \"vocab\": {}}}", "model.type is not \"BPE\""},
        {"{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0}}}", "decoder.type is not"},
        {"{\"decoder\": {\"type\": \"ByteLevel\"}, \"model\": {\"type\": \"BPE\", \"vocab\": "
         "{\"a\": -1}}}",
         "token \"a\": id is not an integer"},
        {"{\"decoder\": {\"type\": \"ByteLevel\"}, \"model\": {\"type\": \"BPE\", \"vocab\": "
         "{\"a\": 1e80}}}",
         "token \"a\": id is not an integer"},
        {"{\"decoder\": {\"type\": \"ByteLevel\"}, \"model\": {\"type\": \"BPE\", \"vocab\": "
         "{\"a\": 2000000}}}",
         "an id of 2000000 among 1 tokens"},
        {"{\"decoder\": {\"type\": \"ByteLevel\"}, \"model\": {\"type\": \"BPE\", \"vocab\": "
         "{\"\xe2\x82\xac\": 0}}}",
         "has a character that is not one of byte-level BPE's 256"},
        {"{\"decoder\": {\"type\": \"ByteLevel\"}, \"model\": {\"type\": \"BPE\", \"vocab\": "
         "{\"a\": 0, \"b\": 1}, \"merges\": [\"a c\"]}}",
         "model.merges[0]: \"a\" + \"c\": a part or the merged token is not in model.vocab"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        char name[32];
        snprintf(name, sizeof name, "bad%zu.json", i);
        CHECK_FAILS(gp_tokenizer_load(write_bytes(name, bad[i][0], strlen(bad[i][0])), &t),
                    GP_FORMAT, bad[i][1]);
    }
    CHECK_FAILS(gp_tokenizer_load(NULL, &t), GP_INVALID_ARGUMENT, "path is NULL");
}

int main(void) {
    gp_scratch_init("test_tokens");
    gp_device *dev;
    REQUIRE_OK(gp_device_cpu_new("cpu0", &dev));
    test_files(dev);
    test_tokenizer();
    gp_device_free(dev);
    gp_scratch_cleanup();
    return gp_test_finish("test_tokens");
}
