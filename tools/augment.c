/* Data augmentation of `gpipe train --augment` for image classifiers: crop: each training image
 * shifted by up to 2 pixels in each direction (a random 28x28 crop of the image padded by 2
 * background pixels, as torchvision's RandomCrop(28, padding=2)); crop1: by up to 1 pixel;
 * flip: mirrored left-right with probability 1/2; crop-flip and crop1-flip: shifted and
 * mirrored. --erase P: then, with probability P, a random rectangle of each image set to 0, the
 * training set's mean after normalization (random erasing, Zhong et al. 2020, as torchvision's
 * RandomErasing with its defaults: 2-33% of the image, aspect ratio 0.3-3.3 drawn on a log
 * scale, up to 10 tries to fit one in the image). The draws are keyed by (seed, step, position
 * in the batch), so a run and its resumption see the same images, and every K and schedule
 * trains on the same data. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"

/* Each mode's largest shift and whether it mirrors, in gp_cli_augment's order. */
static const struct {
    const char *name;
    int shift;
    bool flip;
} modes[] = {
    [GP_CLI_AUGMENT_NONE] = {"none", 0, false},
    [GP_CLI_AUGMENT_CROP] = {"crop", 2, false},
    [GP_CLI_AUGMENT_CROP_FLIP] = {"crop-flip", 2, true},
    [GP_CLI_AUGMENT_CROP1] = {"crop1", 1, false},
    [GP_CLI_AUGMENT_FLIP] = {"flip", 0, true},
    [GP_CLI_AUGMENT_CROP1_FLIP] = {"crop1-flip", 1, true},
};
#define NMODES ((int)(sizeof modes / sizeof modes[0]))

const char *gp_cli_augment_name(gp_cli_augment a) {
    return (int)a >= 0 && (int)a < NMODES ? modes[a].name : "none";
}

bool gp_cli_augment_parse(const char *s, gp_cli_augment *out) {
    for (int a = 0; a < NMODES; a++)
        if (strcmp(s, modes[a].name) == 0) {
            *out = (gp_cli_augment)a;
            return true;
        }
    return false;
}

void gp_cli_move_image(const float *in, int64_t H, int64_t W, int64_t dx, int64_t dy, bool flip,
                       float background, float *out) {
    for (int64_t i = 0; i < H; i++)
        for (int64_t j = 0; j < W; j++) {
            const int64_t si = i + dy, sj = (flip ? W - 1 - j : j) + dx;
            out[i * W + j] = si >= 0 && si < H && sj >= 0 && sj < W ? in[si * W + sj] : background;
        }
}

/* Random erasing's rectangle for one image from its 64 uniform draws u: false when none (not
 * drawn, or no try fitted). */
static bool erase_box(const float *u, double p, int64_t H, int64_t W, int64_t box[4]) {
    if (u[0] >= p) return false;
    const double area = (double)(H * W), lo = log(0.3), hi = log(1.0 / 0.3);
    for (int try = 0; try < 10; try++) {
        const float *v = u + 1 + 4 * try;
        const double target = area * (0.02 + (0.33 - 0.02) * v[0]);
        const double ratio = exp(lo + (hi - lo) * v[1]);
        const int64_t h = (int64_t)lround(sqrt(target * ratio)),
                      w = (int64_t)lround(sqrt(target / ratio));
        if (h < 1 || w < 1 || h > H || w > W) continue;
        /* the corner uniform over the H - h + 1 rows and W - w + 1 columns it can take */
        const int64_t i0 = (int64_t)(v[2] * (float)(H - h + 1)),
                      j0 = (int64_t)(v[3] * (float)(W - w + 1));
        box[0] = i0 < H - h ? i0 : H - h, box[1] = j0 < W - w ? j0 : W - w;
        box[2] = h, box[3] = w;
        return true;
    }
    return false;
}

int gp_cli_augment_batch(gp_cli_augment mode, double erase, float background, uint64_t seed,
                         int step, gp_tensor *x) {
    if (mode == GP_CLI_AUGMENT_NONE && erase <= 0) return GP_CLI_EXIT_OK;
    float *data = gp_tensor_host_data(x);
    const int64_t B = x->shape.dim[0], C = x->shape.dim[1], H = x->shape.dim[2],
                  W = x->shape.dim[3];
    float *plane = malloc((size_t)(H * W) * sizeof *plane);
    if (!data || !plane) {
        free(plane);
        return gp_cli_fail("train", "--augment: the batch is not in host memory, or out of memory");
    }
    const gp_rng_stream s = {.seed = seed, .purpose = GP_RNG_AUGMENT, .a = (uint32_t)step};
    /* erasing's own stream (b = 1): the shifts and mirrors of a run without it stay the same */
    const gp_rng_stream es = {.seed = seed, .purpose = GP_RNG_AUGMENT, .a = (uint32_t)step, .b = 1};
    const int64_t shift = modes[mode].shift;
    const uint64_t span = 2 * (uint64_t)shift + 1;
    for (int64_t b = 0; b < B; b++) {
        const uint64_t u = gp_rng_u64(&s, (uint64_t)b);
        const int64_t dx = (int64_t)(u % span) - shift;
        const int64_t dy = (int64_t)((u / span) % span) - shift;
        const bool flip = modes[mode].flip && ((u >> 32) & 1);
        for (int64_t c = 0; c < C && mode != GP_CLI_AUGMENT_NONE; c++) {
            float *img = data + (b * C + c) * H * W;
            memcpy(plane, img, (size_t)(H * W) * sizeof *plane);
            gp_cli_move_image(plane, H, W, dx, dy, flip, background, img);
        }
        if (erase <= 0) continue;
        float draws[64];
        int64_t box[4];
        gp_rng_uniform(&es, (uint64_t)b * 64, draws, 64);
        if (!erase_box(draws, erase, H, W, box)) continue;
        for (int64_t c = 0; c < C; c++)
            for (int64_t i = box[0]; i < box[0] + box[2]; i++)
                memset(data + ((b * C + c) * H + i) * W + box[1], 0, (size_t)box[3] * sizeof *data);
    }
    free(plane);
    return GP_CLI_EXIT_OK;
}
