/* The language-model loop of `gpipe train`: a byte corpus (the multilingual
 * fortunes by default) or token files, random training windows keyed by (seed, step), and
 * validation loss / bits per byte (token) on fixed, evenly spaced windows that are
 * the same for every run and seed. */
#include <math.h>
#include <stdlib.h>

#include "cli.h"

/* Validation windows first..first+nb-1 of `count`, at evenly spaced starts. */
typedef struct valid_windows {
    const gp_cli_lm_data *d;
    int64_t count;
} valid_windows;

static gp_status fill_valid(void *ctx, int64_t first, int64_t nb, int64_t *starts, gp_tensor *x,
                            gp_tensor *y) {
    const valid_windows *v = ctx;
    const int T = (int)x->shape.dim[1];
    const int64_t span = v->d->nvalid - T - 1; /* the last valid start */
    for (int64_t i = 0; i < nb; i++) {
        int64_t w = first + i;
        starts[i] = v->count > 1 ? w * span / (v->count - 1) : 0;
    }
    return gp_tokens_batch(v->d->valid, v->d->width, v->d->nvalid, starts, nb, T, x, y);
}

int gp_cli_eval_lm(gp_cli_train *t, const gp_cli_lm_data *d, double *loss) {
    valid_windows v = {d, t->eval_size};
    char what[4200]; /* the data named, for a failure in the middle of it */
    snprintf(what, sizeof what, "validation on %s %s", d->src.val_path ? "--val-data" : "--data",
             d->src.val_path ? d->src.val_path : d->src.path);
    gp_cli_eval_pass pass = {.count = t->eval_size,
                             .fill = fill_valid,
                             .ctx = &v,
                             .name = "validation",
                             .units = "tokens",
                             .alloc_what = "validation: cannot allocate a batch",
                             .eval_what = what};
    gp_cli_eval_result r;
    int rc = gp_cli_evaluate(t, &pass, &r);
    if (rc == GP_CLI_EXIT_OK) *loss = r.loss;
    return rc;
}

static int eval_and_log(gp_cli_train *t, const gp_cli_lm_data *d, gp_cli_progress *p, int step) {
    double t0 = gp_cli_now(), loss;
    int rc = gp_cli_eval_lm(t, d, &loss);
    if (rc != GP_CLI_EXIT_OK) return rc;
    double secs = gp_cli_now() - t0, bpb = loss / log(2.0);
    t->have_eval = true;
    t->eval_loss = loss;
    t->eval_count = t->eval_size;
    gp_cli_progress_clear(p);
    printf("step %d: validation loss %.4f, %.4f bits/%s (%d windows, %.1fs)\n", step, loss, bpb,
           d->unit, t->eval_size, secs);
    fflush(stdout);
    cJSON *e = cJSON_CreateObject();
    char key[32];
    snprintf(key, sizeof key, "bits_per_%s", d->unit);
    cJSON_AddNumberToObject(e, "step", step);
    cJSON_AddNumberToObject(e, "loss", loss);
    cJSON_AddNumberToObject(e, key, bpb);
    cJSON_AddNumberToObject(e, "seconds", secs);
    cJSON_AddItemToArray(t->eval_history, e);
    return gp_cli_log_eval(t, e);
}

static int check_shapes(gp_cli_train *t, const gp_cli_lm_data *d) {
    const gp_shape *in = &t->in_shape, *out = &t->out_shape;
    char buf[96];
    const int64_t min_vocab = d->src.tokens ? 1 : 256; /* token data: checked against --vocab */
    if (in->ndim != 2 || out->ndim != 3 || out->dim[1] != in->dim[1] || out->dim[2] < min_vocab)
        return gp_cli_usage_error("train",
                                  "--model %s: a %s language model maps (batch, T) tokens to "
                                  "(batch, T, vocab%s) logits, this one outputs %s",
                                  t->model_name, d->src.tokens ? "token" : "byte",
                                  d->src.tokens ? "" : " >= 256",
                                  gp_shape_str(out, buf, sizeof buf));
    const int64_t T = in->dim[1];
    if (d->ntrain >= T + 2 && d->nvalid < T + 2 && d->src.val_path)
        return gp_cli_usage_error("train", "--val-data %s: %lld tokens, need at least %lld for "
                                           "windows of %lld",
                                  d->src.val_path, (long long)d->nvalid, (long long)(T + 2),
                                  (long long)T);
    if (d->ntrain < T + 2 || d->nvalid < T + 2)
        return gp_cli_usage_error("train",
                                  "--data %s: %lld training and %lld validation %ss, need at "
                                  "least %lld of each for windows of %lld",
                                  d->src.path, (long long)d->ntrain, (long long)d->nvalid, d->unit,
                                  (long long)(T + 2), (long long)T);
    return GP_CLI_EXIT_OK;
}

int gp_cli_train_lm(gp_cli_train *t) {
    gp_cli_lm_data data = {0};
    gp_tensor x = {0}, y = {0};
    int64_t *starts = NULL;
    int rc = gp_cli_lm_data_load("train", &t->lm_src, &data);
    if (rc != GP_CLI_EXIT_OK) {
        if (!t->lm_src.tokens && !t->data)
            fprintf(stderr, "gpipe train: the default --data needs the Debian fortunes packages\n");
        goto done;
    }
    rc = check_shapes(t, &data);
    if (rc != GP_CLI_EXIT_OK) goto done;
    const int T = (int)t->in_shape.dim[1];
    rc = gp_cli_train_begin(t, t->steps, t->batch, "the window offsets", &starts, &x, &y);
    if (rc != GP_CLI_EXIT_OK) goto done;
    if (data.src.tokens)
        printf("training on %s (%s, ids below %lld): %lld training / %lld validation tokens%s%s; "
               "%d steps of %d windows of %d tokens\n",
               data.src.path, gp_token_format_name(data.src.format), (long long)data.src.vocab,
               (long long)data.ntrain, (long long)data.nvalid,
               data.src.val_path ? " from " : " (its last 1/20)",
               data.src.val_path ? data.src.val_path : "", t->steps, t->batch, T);
    else
        printf("training on %s: %d files, %lld training / %lld validation bytes; %d steps of %d "
               "windows of %d bytes\n",
               data.src.path, data.nfiles, (long long)data.ntrain, (long long)data.nvalid,
               t->steps, t->batch, T);
    fflush(stdout);
    gp_cli_progress prog;
    gp_cli_progress_init(&prog, t->steps, t->batch, T, t->log_every, t->quiet);
    for (int step = t->start_step; step < t->stop_step; step++) {
        double t0 = gp_cli_now();
        /* Window starts in [0, ntrain - T - 1], keyed by (seed, step). */
        gp_rng_stream s = {.seed = t->seed, .purpose = GP_RNG_DATA, .a = (uint32_t)step, .b = 0};
        for (int b = 0; b < t->batch; b++)
            starts[b] = (int64_t)(gp_rng_u64(&s, (uint64_t)b) % (uint64_t)(data.ntrain - T));
        if (gp_tokens_batch(data.train, data.width, data.ntrain, starts, t->batch, T, &x, &y) !=
            GP_OK) {
            rc = gp_cli_fail("train", "cannot assemble a training batch");
            goto done;
        }
        rc = gp_cli_train_step(t, &prog, step, &x, &y, t0,
                               "a lower --lr, a longer --warmup, or --clip");
        if (rc != GP_CLI_EXIT_OK) goto done;
        if (step + 1 == t->steps || (t->eval_every > 0 && (step + 1) % t->eval_every == 0)) {
            rc = eval_and_log(t, &data, &prog, step + 1);
            if (rc != GP_CLI_EXIT_OK) goto done;
        }
    }
    gp_cli_progress_clear(&prog);
    if (t->start_step == t->steps) { /* resumed at the very end: still the final evaluation */
        rc = eval_and_log(t, &data, &prog, t->steps);
        if (rc != GP_CLI_EXIT_OK) goto done;
    }
    if (t->stop_step < t->steps)
        printf("stopped after step %d of %d (--stop-after); continue with --resume\n",
               t->stop_step, t->steps);
done:
    gp_tensor_release(&x);
    gp_tensor_release(&y);
    free(starts);
    gp_cli_lm_data_free(&data);
    return rc;
}
