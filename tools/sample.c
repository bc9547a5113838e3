/* Text generation from a trained language model: the context
 * starts as the prompt (one newline by default; a token model's encoded by its tokenizer, or
 * without one a list of ids, id 0 by default), each next byte (token) is drawn from
 * softmax(logits / T) of
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

/* Token ids from text ("464 3290,318"), each below vocab; *ids malloc'd. A list that is empty or
 * holds anything else is a usage error naming option. Returns an exit status. */
static int parse_ids(const char *cmd, const char *option, const char *text, int64_t vocab,
                     int32_t **ids, int *n) {
    *ids = NULL;
    *n = 0;
    const size_t cap = strlen(text) / 2 + 1; /* at most one id per two characters, a separator */
    int32_t *v = malloc(cap * sizeof *v);
    if (!v) return gp_cli_fail(cmd, "token ids: out of host memory");
    for (const char *p = text;;) {
        while (*p == ' ' || *p == ',' || *p == '\t') p++;
        if (!*p) break;
        char *end;
        long long id = *p >= '0' && *p <= '9' ? strtoll(p, &end, 10) : -1;
        if (id < 0 || id >= vocab || (*end && *end != ' ' && *end != ',' && *end != '\t')) {
            free(v);
            return gp_cli_usage_error(cmd, "%s '%s': expected token ids from 0 to %lld separated "
                                           "by spaces or commas (the model's vocabulary)",
                                      option, text, (long long)vocab - 1);
        }
        v[(*n)++] = (int32_t)id;
        p = end;
    }
    if (*n == 0) {
        free(v);
        return gp_cli_usage_error(cmd, "%s '%s': no token id in it", option, text);
    }
    *ids = v;
    return GP_CLI_EXIT_OK;
}

int gp_cli_prompt_ids(const gp_cli_train *t, const char *cmd, const char *option,
                      const char *prompt, int32_t **ids, int *n) {
    const int64_t vocab = t->out_shape.dim[2];
    if (!t->tokenizer) return parse_ids(cmd, option, prompt, vocab, ids, n);
    int64_t m;
    if (gp_tokenizer_encode(t->tokenizer, (const uint8_t *)prompt, strlen(prompt), ids, &m) !=
        GP_OK) {
        char what[64];
        snprintf(what, sizeof what, "%s: encoding it with --tokenizer", option);
        return gp_cli_fail(cmd, what);
    }
    *n = (int)m;
    for (int i = 0; i < *n; i++)
        if ((*ids)[i] >= vocab) {
            int id = (*ids)[i];
            free(*ids);
            *ids = NULL;
            return gp_cli_usage_error(cmd, "%s '%s': --tokenizer encodes it with id %d, beyond "
                                           "the model's vocabulary of %lld",
                                      option, prompt, id, (long long)vocab);
        }
    if (*n == 0) {
        free(*ids);
        *ids = NULL;
        return gp_cli_usage_error(cmd, "%s: empty", option);
    }
    return GP_CLI_EXIT_OK;
}

/* Writes id's text: its byte (byte models), the number, or its tokenizer bytes. */
static bool put_id(const gp_cli_train *t, int32_t id, FILE *f) {
    if (!t->sample_tokens) return fputc(id, f) != EOF;
    if (t->sample_ids) return fprintf(f, " %d", (int)id) > 0;
    const uint8_t *b;
    size_t len;
    if (gp_tokenizer_token(t->tokenizer, id, &b, &len) != GP_OK) return false;
    return fwrite(b, 1, len, f) == len;
}

int gp_cli_sample(gp_cli_train *t, const char *cmd, const char *prompt, int nbytes, FILE *f) {
    const int T = (int)t->in_shape.dim[1];
    const int V = (int)t->out_shape.dim[2];
    int64_t nvocab = V < 256 ? V : 256; /* byte models: only bytes can be printed */
    if (t->sample_tokens) {
        nvocab = V;
        if (t->tokenizer && gp_tokenizer_size(t->tokenizer) < nvocab)
            nvocab = gp_tokenizer_size(t->tokenizer);
    }
    int32_t *pids = NULL;
    int plen = 0;
    if (!prompt || !*prompt) prompt = t->sample_tokens && !t->tokenizer ? "0" : "\n";
    if (t->sample_tokens) {
        int rc = gp_cli_prompt_ids(t, cmd, "--prompt", prompt, &pids, &plen);
        if (rc != GP_CLI_EXIT_OK) return rc;
    } else {
        plen = (int)strlen(prompt);
    }
    gp_tensor x = {0}, logits = {0};
    int32_t *text = malloc(((size_t)plen + (size_t)nbytes + 1) * sizeof *text);
    if (!text) {
        free(pids);
        fprintf(stderr, "gpipe %s: %d bytes to sample: out of host memory\n", cmd, nbytes);
        return GP_CLI_EXIT_RUNTIME;
    }
    int rc = GP_CLI_EXIT_OK;
    if (gp_tensor_zeros(t->dev, GP_MEM_ACTIVATIONS, gp_shape2(1, T), GP_I32, &x) != GP_OK ||
        gp_tensor_alloc(t->dev, GP_MEM_ACTIVATIONS, gp_shape3(1, T, V), GP_F32, &logits) != GP_OK) {
        rc = gp_cli_fail(cmd, "sampling: cannot allocate the generation buffers");
        goto done;
    }
    for (int i = 0; i < plen; i++) text[i] = pids ? pids[i] : (uint8_t)prompt[i];
    int32_t *xi = gp_tensor_host_data(&x); /* on the CPU device: host memory */
    const float *lg = gp_tensor_host_data(&logits);
    for (int i = 0; i < nbytes; i++) {
        /* The last T ids, left-aligned: with causal attention the unused
         * positions after the context cannot change its last logits. */
        size_t have = (size_t)plen + (size_t)i;
        int len = have < (size_t)T ? (int)have : T;
        const int32_t *ctx = text + (have - (size_t)len);
        for (int p = 0; p < T; p++) xi[p] = p < len ? ctx[p] : (nvocab > '\n' ? '\n' : 0);
        if (gp_pipeline_predict(t->pipeline, &x, &logits) != GP_OK) {
            if (f) fflush(f);
            rc = gp_cli_fail(cmd, "sampling: cannot run the model");
            goto done;
        }
        gp_rng_stream s = {.seed = t->seed, .purpose = GP_RNG_SAMPLE, .a = (uint32_t)i};
        float u;
        gp_rng_uniform(&s, 0, &u, 1);
        int b = draw(lg + (int64_t)(len - 1) * V, (int)nvocab, t->temperature, u);
        text[have] = b;
        if (f && !put_id(t, b, f)) {
            fprintf(stderr, "gpipe %s: sampling: cannot write the generated text%s\n", cmd,
                    ferror(f) ? "" : " (a token id the tokenizer has no token for)");
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
    free(pids);
    return rc;
}

int gp_cli_load_tokenizer(const char *cmd, const char *path, gp_cli_train *t) {
    if (gp_tokenizer_load(path, &t->tokenizer) != GP_OK) {
        char what[4200];
        snprintf(what, sizeof what, "--tokenizer %s", path);
        return gp_cli_fail(cmd, what);
    }
    return GP_CLI_EXIT_OK;
}

int gp_cli_print_prompt(const gp_cli_train *t, const char *cmd, const char *prompt, FILE *f) {
    if (!t->sample_tokens || !t->sample_ids) {
        fputs(prompt, f);
        return GP_CLI_EXIT_OK;
    }
    int32_t *ids;
    int n;
    int rc = gp_cli_prompt_ids(t, cmd, "--prompt", prompt, &ids, &n);
    for (int i = 0; i < n && rc == GP_CLI_EXIT_OK; i++) fprintf(f, "%s%d", i ? " " : "", ids[i]);
    if (rc == GP_CLI_EXIT_OK) free(ids);
    return rc;
}
