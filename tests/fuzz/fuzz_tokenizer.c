/* libFuzzer target: the tokenizer.json reader (gp_tokenizer_load); whatever loads decodes every
 * id and encodes a multilingual text and the input itself. Nothing may crash, leak or read out
 * of bounds. */
#include "fuzz_common.h"
#include "gpipe.h"

static void encode(const gp_tokenizer *t, const uint8_t *text, size_t n) {
    int32_t *ids;
    int64_t nids;
    if (gp_tokenizer_encode(t, text, n, &ids, &nids) != GP_OK) return;
    uint8_t *back;
    size_t len;
    if (gp_tokenizer_decode(t, ids, nids, &back, &len) == GP_OK) free(back);
    free(ids);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t n) {
    const char *path = fuzz_scratch("tokenizer.json");
    fuzz_write(path, data, n);
    gp_tokenizer *t;
    if (gp_tokenizer_load(path, &t) != GP_OK) return 0;
    for (int64_t id = 0; id < gp_tokenizer_size(t) && id < 4096; id++) {
        const uint8_t *b;
        size_t len;
        (void)gp_tokenizer_token(t, id, &b, &len);
    }
    static const char text[] = "Don't panic, it's 42!  Der Hund\t\n\nЖизнь ½ \xff\xfe end ";
    encode(t, (const uint8_t *)text, sizeof text - 1);
    encode(t, data, n);
    gp_tokenizer_free(t);
    return 0;
}
