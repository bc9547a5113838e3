/* libFuzzer target: the text-corpus reader (gp_text_load on a file of fortune entries separated
 * by "%" lines); the first byte picks how often an entry goes to validation. Whatever loads is
 * cut into one batch of windows. Nothing may crash, leak or read out of bounds. */
#include "fuzz_common.h"
#include "gpipe.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t n) {
    if (n < 1) return 0;
    int valid_every = data[0] % 32; /* 0 and 1 included: edge cases of the split */
    const char *path = fuzz_scratch("corpus");
    fuzz_write(path, data + 1, n - 1);
    gp_text_corpus c = {0};
    if (gp_text_load(path, valid_every, &c) == GP_OK) {
        enum { T = 4 };
        if (c.ntrain > T + 1) {
            int32_t x[T], y[T];
            int64_t start = c.ntrain - T - 1;
            gp_tensor xt = gp_tensor_view(x, gp_shape2(1, T), GP_I32);
            gp_tensor yt = gp_tensor_view(y, gp_shape2(1, T), GP_I32);
            (void)gp_text_batch(c.train, c.ntrain, &start, 1, T, &xt, &yt);
        }
        gp_text_free(&c);
    }
    return 0;
}
