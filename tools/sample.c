/* Text generation from a trained byte-level language model: the context
 * starts as the prompt (one newline by default), each next byte is drawn from softmax(logits / T) of
 * the last position with a uniform keyed by (seed, position), so a seed
 * always gives the same text. Under MPI every rank runs it (each forward passes through every
 * rank's stage, and every rank gets the logits, so all draw the same bytes); rank 0 prints. */
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

int gp_cli_sample(gp_cli_train *t, const char *cmd, const char *prompt, int nbytes, FILE *f) {
    const int T = (int)t->in_shape.dim[1];
    const int V = (int)t->out_shape.dim[2];
    const int nvocab = V < 256 ? V : 256; /* only bytes can be printed */
    if (!prompt || !*prompt) prompt = "\n";
    const size_t plen = strlen(prompt);
    gp_tensor x = {0}, logits = {0};
    uint8_t *text = malloc(plen + (size_t)nbytes + 1);
    if (!text) {
        fprintf(stderr, "gpipe %s: %d bytes to sample: out of host memory\n", cmd, nbytes);
        return GP_CLI_EXIT_RUNTIME;
    }
    int rc = GP_CLI_EXIT_OK;
    if (gp_tensor_zeros(t->dev, GP_MEM_ACTIVATIONS, gp_shape2(1, T), GP_I32, &x) != GP_OK ||
        gp_tensor_alloc(t->dev, GP_MEM_ACTIVATIONS, gp_shape3(1, T, V), GP_F32, &logits) != GP_OK) {
        rc = gp_cli_fail(cmd, "sampling: cannot allocate the generation buffers");
        goto done;
    }
    memcpy(text, prompt, plen);
    int32_t *xi = gp_tensor_host_data(&x); /* on the CPU device: host memory */
    const float *lg = gp_tensor_host_data(&logits);
    for (int i = 0; i < nbytes; i++) {
        /* The last T bytes, left-aligned: with causal attention the unused
         * positions after the context cannot change its last logits. */
        size_t have = plen + (size_t)i;
        int len = have < (size_t)T ? (int)have : T;
        const uint8_t *ctx = text + (have - (size_t)len);
        for (int p = 0; p < T; p++) xi[p] = p < len ? ctx[p] : '\n';
        if (gp_pipeline_predict(t->pipeline, &x, &logits) != GP_OK) {
            if (f) fflush(f);
            rc = gp_cli_fail(cmd, "sampling: cannot run the model");
            goto done;
        }
        gp_rng_stream s = {.seed = t->seed, .purpose = GP_RNG_SAMPLE, .a = (uint32_t)i};
        float u;
        gp_rng_uniform(&s, 0, &u, 1);
        int b = draw(lg + (int64_t)(len - 1) * V, nvocab, t->temperature, u);
        text[have] = (uint8_t)b;
        if (f && fputc(b, f) == EOF) {
            fprintf(stderr, "gpipe %s: sampling: cannot write the generated text\n", cmd);
            rc = GP_CLI_EXIT_RUNTIME;
            goto done;
        }
    }
    if (f) {
        fputc('\n', f);
        fflush(f);
    }
done:
    gp_tensor_release(&x);
    gp_tensor_release(&logits);
    free(text);
    return rc;
}
