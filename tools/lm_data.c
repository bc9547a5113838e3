/* The language model's data for train and eval: a byte corpus (fortune-style text) or
 * pre-tokenized shards (llm.c's .bin, raw uint16 / uint32 ids), each split seen as one sequence of
 * ids that the windows are cut from. Everything is read and checked here, before any training. */
#include <stdlib.h>
#include <string.h>

#include "cli.h"

void gp_cli_lm_data_options(gp_cli_opt out[GP_CLI_LM_DATA_NOPTS], gp_cli_lm_data_args *a) {
    gp_cli_opt tab[GP_CLI_LM_DATA_NOPTS] = {
        {"--data-format", GP_CLI_CHOICE, &a->format, "text|llmc|u16|u32",
         "language model: --data is text (bytes), an llm.c token shard (256 int32 of header, "
         "then uint16 ids), or raw little-endian uint16 / uint32 token ids; token files are "
         "memory-mapped and every id checked below --vocab before training",
         "llmc for a file named *.bin, else text", 0, false, "text|llmc|u16|u32", false, 0,
         false},
        {"--vocab", GP_CLI_INT, &a->vocab, "N",
         "token data: ids must be below N, at most the model's vocabulary (its logits)",
         "the model's vocabulary", 1, false, NULL, false, 0, false},
        {"--val-data", GP_CLI_STRING, &a->val_data, "FILE",
         "token data: the validation shard, in --data-format",
         "the last 1/20 of --data's tokens (the rest trains)", 0, false, NULL, false, 0, false},
    };
    memcpy(out, tab, sizeof tab);
}

static bool ends_with(const char *s, const char *suffix) {
    size_t n = strlen(s), m = strlen(suffix);
    return n >= m && strcmp(s + n - m, suffix) == 0;
}

int gp_cli_lm_data_resolve(const char *cmd, const gp_cli_lm_data_args *a, const char *data,
                           int64_t model_vocab, gp_cli_lm_source *out) {
    *out = (gp_cli_lm_source){.path = data ? data : GP_FORTUNES_DIR, .val_path = a->val_data};
    const char *f = a->format ? a->format : ends_with(out->path, ".bin") ? "llmc" : "text";
    out->tokens = strcmp(f, "text") != 0;
    out->format = strcmp(f, "u16") == 0   ? GP_TOKENS_U16
                  : strcmp(f, "u32") == 0 ? GP_TOKENS_U32
                                          : GP_TOKENS_LLMC;
    if (!out->tokens && (a->vocab || a->val_data))
        return gp_cli_usage_error(cmd, "%s: only with token data (--data-format llmc, u16 or "
                                       "u32, or a --data file named *.bin); --data %s is text",
                                  a->vocab ? "--vocab" : "--val-data", out->path);
    if (out->tokens && !data)
        return gp_cli_usage_error(cmd, "--data-format %s: give the token file with --data", f);
    if (a->vocab > model_vocab)
        return gp_cli_usage_error(cmd, "--vocab %d: more than the model's vocabulary of %lld (ids "
                                       "it has no logit for)",
                                  a->vocab, (long long)model_vocab);
    out->vocab = a->vocab ? a->vocab : model_vocab;
    return GP_CLI_EXIT_OK;
}

/* "gpipe <cmd>: <option> <path>: cannot load <what>: <library message>" */
static int load_fail(const char *cmd, const char *what, const char *option, const char *path) {
    char msg[4400];
    snprintf(msg, sizeof msg, "%s %s: cannot load %s", option, path, what);
    return gp_cli_fail(cmd, msg);
}

int gp_cli_lm_data_load(const char *cmd, const gp_cli_lm_source *src, gp_cli_lm_data *d) {
    *d = (gp_cli_lm_data){.src = *src, .unit = src->tokens ? "token" : "byte"};
    if (!src->tokens) {
        if (gp_text_load(src->path, 20, &d->text) != GP_OK)
            return load_fail(cmd, "the text corpus", "--data", src->path);
        d->train = d->text.train;
        d->ntrain = d->text.ntrain;
        d->valid = d->text.valid;
        d->nvalid = d->text.nvalid;
        d->width = 1;
        d->nfiles = d->text.nfiles;
        return GP_CLI_EXIT_OK;
    }
    const char *fmt = gp_token_format_name(src->format);
    char what[64];
    snprintf(what, sizeof what, "the %s token file", fmt);
    if (gp_tokens_open(src->path, src->format, (uint64_t)src->vocab, &d->shard) != GP_OK)
        return load_fail(cmd, what, "--data", src->path);
    d->width = d->shard.width;
    d->nfiles = 1;
    d->train = d->shard.ids;
    d->ntrain = d->shard.ntokens;
    if (src->val_path) {
        if (gp_tokens_open(src->val_path, src->format, (uint64_t)src->vocab, &d->vshard) != GP_OK)
            return load_fail(cmd, what, "--val-data", src->val_path);
        d->valid = d->vshard.ids;
        d->nvalid = d->vshard.ntokens;
        d->nfiles = 2;
    } else {
        /* The tail, as text holds out every 20th entry: the validation windows never overlap
         * the training ones. */
        d->nvalid = d->ntrain / 20;
        d->ntrain -= d->nvalid;
        d->valid = (const uint8_t *)d->train + d->ntrain * d->width;
    }
    return GP_CLI_EXIT_OK;
}

void gp_cli_lm_data_free(gp_cli_lm_data *d) {
    gp_text_free(&d->text);
    gp_tokens_close(&d->shard);
    gp_tokens_close(&d->vshard);
    *d = (gp_cli_lm_data){0};
}
