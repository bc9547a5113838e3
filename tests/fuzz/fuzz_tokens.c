/* libFuzzer target: the token-file reader (gp_tokens_open on an llm.c shard or a raw uint16 /
 * uint32 file); the first byte picks the format and the vocabulary. Whatever opens is cut into a
 * window at its end. Nothing may crash, leak or read out of bounds. */
#include "fuzz_common.h"
#include "gpipe.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t n) {
    if (n < 1) return 0;
    const gp_token_format fmt = (gp_token_format)(data[0] % 3);
    const uint64_t vocab = data[0] & 0x80 ? 65536 : 300; /* ids past a small vocabulary too */
    const char *path = fuzz_scratch("tokens");
    fuzz_write(path, data + 1, n - 1);
    gp_token_shard s;
    if (gp_tokens_open(path, fmt, vocab, &s) == GP_OK) {
        enum { T = 4 };
        if (s.ntokens > T + 1) {
            int32_t x[T], y[T];
            int64_t start = s.ntokens - T - 1;
            gp_tensor xt = gp_tensor_view(x, gp_shape2(1, T), GP_I32);
            gp_tensor yt = gp_tensor_view(y, gp_shape2(1, T), GP_I32);
            (void)gp_tokens_batch(s.ids, s.width, s.ntokens, &start, 1, T, &xt, &yt);
        }
        gp_tokens_close(&s);
    }
    return 0;
}
