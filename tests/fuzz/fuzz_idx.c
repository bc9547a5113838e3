/* libFuzzer target: the IDX reader (gp_idx_load, plain or gzip). The input is split at the
 * position its first two bytes give into an images file and a labels file; whatever loads is
 * batched once. Nothing may crash, leak or read out of bounds. */
#include "fuzz_common.h"
#include "gpipe.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t n) {
    if (n < 2) return 0;
    size_t cut = ((size_t)data[0] << 8 | data[1]) % (n - 1);
    const uint8_t *rest = data + 2;
    size_t nrest = n - 2;
    if (cut > nrest) cut = nrest;
    char images[512], labels[512];
    snprintf(images, sizeof images, "%s", fuzz_scratch("images"));
    snprintf(labels, sizeof labels, "%s", fuzz_scratch("labels"));
    fuzz_write(images, rest, cut);
    fuzz_write(labels, rest + cut, nrest - cut);
    gp_idx_dataset d = {0};
    if (gp_idx_load(images, labels, &d) == GP_OK) {
        if (d.n > 0) {
            float x[28 * 28 * 2];
            int32_t y[2];
            int64_t idx[2] = {0, d.n - 1};
            int64_t b = d.rows * d.cols <= 28 * 28 ? 2 : 0;
            gp_tensor xt = gp_tensor_view(x, gp_shape4(2, 1, d.rows, d.cols), GP_F32);
            gp_tensor yt = gp_tensor_view(y, gp_shape1(2), GP_I32);
            if (b) (void)gp_idx_batch(&d, idx, b, 0.5f, 0.25f, &xt, &yt);
        }
        gp_idx_free(&d);
    }
    return 0;
}
