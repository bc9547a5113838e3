/* Text generation from a trained byte-level language model: the context
 * starts as one newline, each next byte is drawn from softmax(logits / T) of
 * the last position with a uniform keyed by (seed, position), so a seed
 * always gives the same text. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"

/* Index drawn from softmax(logits / temperature) with the uniform u;
 * temperature 0 takes the first largest logit. */
static int draw(const float *logits, int n, double temperature, float u) {
    int best = 0;
    for (int j = 1; j < n; j++)
        if (logits[j] > logits[best]) best = j;
    if (temperature <= 0) return best;
    double total = 0;
    for (int j = 0; j < n; j++) total += exp(((double)logits[j] - logits[best]) / temperature);
    double target = (double)u * total, cum = 0;
    for (int j = 0; j < n; j++) {
        cum += exp(((double)logits[j] - logits[best]) / temperature);
        if (cum > target) return j;
    }
    return best; /* u within rounding of 1 */
}

int gp_cli_sample(gp_cli_train *t, int nbytes, FILE *f) {
    const int T = (int)t->in_shape.dim[1];
    const int V = (int)t->out_shape.dim[2];
    const int nvocab = V < 256 ? V : 256; /* only bytes can be printed */
    gp_tensor x = {0}, logits = {0};
    uint8_t *text = malloc((size_t)nbytes + 1);
    if (!text) {
        fprintf(stderr, "gpipe train: --sample %d: out of host memory\n", nbytes);
        return GP_CLI_EXIT_RUNTIME;
    }
    int rc = GP_CLI_EXIT_OK;
    if (gp_tensor_zeros(t->dev, GP_MEM_ACTIVATIONS, gp_shape2(1, T), GP_I32, &x) != GP_OK ||
        gp_tensor_alloc(t->dev, GP_MEM_ACTIVATIONS, gp_shape3(1, T, V), GP_F32, &logits) != GP_OK) {
        rc = gp_cli_fail("train", "--sample: cannot allocate the generation buffers");
        goto done;
    }
    text[0] = '\n';
    int32_t *xi = (int32_t *)x.data;
    for (int i = 0; i < nbytes; i++) {
        /* The last T bytes, left-aligned: with causal attention the unused
         * positions after the context cannot change its last logits. */
        int len = i + 1 < T ? i + 1 : T;
        const uint8_t *ctx = text + (i + 1 - len);
        for (int p = 0; p < T; p++) xi[p] = p < len ? ctx[p] : '\n';
        if (gp_model_predict(t->model, t->dev, &x, &logits) != GP_OK) {
            fflush(f);
            rc = gp_cli_fail("train", "--sample: gp_model_predict failed");
            goto done;
        }
        gp_rng_stream s = {.seed = t->seed, .purpose = GP_RNG_SAMPLE, .a = (uint32_t)i};
        float u;
        gp_rng_uniform(&s, 0, &u, 1);
        int b = draw(logits.data + (int64_t)(len - 1) * V, nvocab, t->temperature, u);
        text[i + 1] = (uint8_t)b;
        if (fputc(b, f) == EOF) {
            fprintf(stderr, "gpipe train: --sample: cannot write the generated text\n");
            rc = GP_CLI_EXIT_RUNTIME;
            goto done;
        }
    }
    fputc('\n', f);
    fflush(f);
done:
    gp_tensor_release(&x);
    gp_tensor_release(&logits);
    free(text);
    return rc;
}
