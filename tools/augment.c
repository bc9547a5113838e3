/* Data augmentation of `gpipe train --augment` for image classifiers: each training image shifted
 * by up to 2 pixels in each direction (a random 28x28 crop of the image padded by 2 background
 * pixels, as torchvision's RandomCrop(28, padding=2)) and, with crop-flip, mirrored left-right with
 * probability 1/2. The draws are keyed by (seed, step, position in the batch), so a run and its
 * resumption see the same images, and every K and schedule trains on the same data. */
#include <stdlib.h>
#include <string.h>

#include "cli.h"

#define AUG_SHIFT 2

const char *gp_cli_augment_name(gp_cli_augment a) {
    return a == GP_CLI_AUGMENT_CROP ? "crop" : a == GP_CLI_AUGMENT_CROP_FLIP ? "crop-flip" : "none";
}

bool gp_cli_augment_parse(const char *s, gp_cli_augment *out) {
    for (int a = GP_CLI_AUGMENT_NONE; a <= GP_CLI_AUGMENT_CROP_FLIP; a++)
        if (strcmp(s, gp_cli_augment_name((gp_cli_augment)a)) == 0) {
            *out = (gp_cli_augment)a;
            return true;
        }
    return false;
}

int gp_cli_augment_batch(gp_cli_augment mode, float background, uint64_t seed, int step,
                         gp_tensor *x) {
    if (mode == GP_CLI_AUGMENT_NONE) return GP_CLI_EXIT_OK;
    float *data = gp_tensor_host_data(x);
    const int64_t B = x->shape.dim[0], C = x->shape.dim[1], H = x->shape.dim[2],
                  W = x->shape.dim[3];
    float *plane = malloc((size_t)(H * W) * sizeof *plane);
    if (!data || !plane) {
        free(plane);
        return gp_cli_fail("train", "--augment: the batch is not in host memory, or out of memory");
    }
    const gp_rng_stream s = {.seed = seed, .purpose = GP_RNG_AUGMENT, .a = (uint32_t)step};
    const uint64_t span = 2 * AUG_SHIFT + 1;
    for (int64_t b = 0; b < B; b++) {
        const uint64_t u = gp_rng_u64(&s, (uint64_t)b);
        const int64_t dx = (int64_t)(u % span) - AUG_SHIFT;
        const int64_t dy = (int64_t)((u / span) % span) - AUG_SHIFT;
        const bool flip = mode == GP_CLI_AUGMENT_CROP_FLIP && ((u >> 32) & 1);
        for (int64_t c = 0; c < C; c++) {
            float *img = data + (b * C + c) * H * W;
            memcpy(plane, img, (size_t)(H * W) * sizeof *plane);
            for (int64_t i = 0; i < H; i++)
                for (int64_t j = 0; j < W; j++) {
                    const int64_t si = i + dy, sj = (flip ? W - 1 - j : j) + dx;
                    img[i * W + j] = si >= 0 && si < H && sj >= 0 && sj < W ? plane[si * W + sj]
                                                                             : background;
                }
        }
    }
    free(plane);
    return GP_CLI_EXIT_OK;
}
