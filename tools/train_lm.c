/* The language-model loop of `gpipe train`: a byte corpus (the multilingual
 * fortunes by default), random training windows keyed by (seed, step), and
 * validation loss / bits per byte on fixed, evenly spaced windows that are
 * the same for every run and seed. */
#include <math.h>
#include <stdlib.h>

#include "cli.h"

/* Validation windows first..first+nb-1 of `count`, at evenly spaced starts. */
typedef struct valid_windows {
    const gp_text_corpus *c;
    int64_t count;
} valid_windows;

static gp_status fill_valid(void *ctx, int64_t first, int64_t nb, int64_t *starts, gp_tensor *x,
                            gp_tensor *y) {
    const valid_windows *v = ctx;
    const int T = (int)x->shape.dim[1];
    const int64_t span = v->c->nvalid - T - 1; /* the last valid start */
    for (int64_t i = 0; i < nb; i++) {
        int64_t w = first + i;
        starts[i] = v->count > 1 ? w * span / (v->count - 1) : 0;
    }
    return gp_text_batch(v->c->valid, v->c->nvalid, starts, nb, T, x, y);
}

int gp_cli_eval_lm(gp_cli_train *t, const gp_text_corpus *c, double *loss) {
    valid_windows v = {c, t->eval_size};
    char what[4200]; /* the data named, for a failure in the middle of it */
    snprintf(what, sizeof what, "validation on --data %s", t->data ? t->data : GP_FORTUNES_DIR);
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

static int eval_and_log(gp_cli_train *t, const gp_text_corpus *c, gp_cli_progress *p, int step) {
    double t0 = gp_cli_now(), loss;
    int rc = gp_cli_eval_lm(t, c, &loss);
    if (rc != GP_CLI_EXIT_OK) return rc;
    double secs = gp_cli_now() - t0, bpb = loss / log(2.0);
    t->have_eval = true;
    t->eval_loss = loss;
    t->eval_count = t->eval_size;
    gp_cli_progress_clear(p);
    printf("step %d: validation loss %.4f, %.4f bits/byte (%d windows, %.1fs)\n", step, loss, bpb,
           t->eval_size, secs);
    fflush(stdout);
    cJSON *e = cJSON_CreateObject();
    cJSON_AddNumberToObject(e, "step", step);
    cJSON_AddNumberToObject(e, "loss", loss);
    cJSON_AddNumberToObject(e, "bits_per_byte", bpb);
    cJSON_AddNumberToObject(e, "seconds", secs);
    cJSON_AddItemToArray(t->eval_history, e);
    return gp_cli_log_eval(t, e);
}

static int check_shapes(gp_cli_train *t, const gp_text_corpus *c, const char *path) {
    const gp_shape *in = &t->in_shape, *out = &t->out_shape;
    char buf[96];
    if (in->ndim != 2 || out->ndim != 3 || out->dim[1] != in->dim[1] || out->dim[2] < 256)
        return gp_cli_usage_error("train",
                                  "--model %s: a byte language model maps (batch, T) tokens to "
                                  "(batch, T, vocab >= 256) logits, this one outputs %s",
                                  t->model_name, gp_shape_str(out, buf, sizeof buf));
    const int64_t T = in->dim[1];
    if (c->ntrain < T + 2 || c->nvalid < T + 2)
        return gp_cli_usage_error("train",
                                  "--data %s: %lld training and %lld validation bytes, need at "
                                  "least %lld of each for windows of %lld",
                                  path, (long long)c->ntrain, (long long)c->nvalid,
                                  (long long)(T + 2), (long long)T);
    return GP_CLI_EXIT_OK;
}

int gp_cli_train_lm(gp_cli_train *t) {
    const char *path = t->data ? t->data : GP_FORTUNES_DIR;
    gp_text_corpus corpus = {0};
    gp_tensor x = {0}, y = {0};
    int64_t *starts = NULL;
    int rc = GP_CLI_EXIT_OK;
    if (gp_text_load(path, 20, &corpus) != GP_OK) {
        rc = gp_cli_data_fail("the text corpus ", path, "fortunes packages");
        goto done;
    }
    rc = check_shapes(t, &corpus, path);
    if (rc != GP_CLI_EXIT_OK) goto done;
    const int T = (int)t->in_shape.dim[1];
    rc = gp_cli_train_begin(t, t->steps, t->batch, "the window offsets", &starts, &x, &y);
    if (rc != GP_CLI_EXIT_OK) goto done;
    printf("training on %s: %d files, %lld training / %lld validation bytes; %d steps of %d "
           "windows of %d bytes\n",
           path, corpus.nfiles, (long long)corpus.ntrain, (long long)corpus.nvalid, t->steps,
           t->batch, T);
    fflush(stdout);
    gp_cli_progress prog;
    gp_cli_progress_init(&prog, t->steps, t->batch, T, t->log_every, t->quiet);
    for (int step = t->start_step; step < t->stop_step; step++) {
        double t0 = gp_cli_now();
        /* Window starts in [0, ntrain - T - 1], keyed by (seed, step). */
        gp_rng_stream s = {.seed = t->seed, .purpose = GP_RNG_DATA, .a = (uint32_t)step, .b = 0};
        for (int b = 0; b < t->batch; b++)
            starts[b] = (int64_t)(gp_rng_u64(&s, (uint64_t)b) % (uint64_t)(corpus.ntrain - T));
        if (gp_text_batch(corpus.train, corpus.ntrain, starts, t->batch, T, &x, &y) != GP_OK) {
            rc = gp_cli_fail("train", "cannot assemble a training batch");
            goto done;
        }
        rc = gp_cli_train_step(t, &prog, step, &x, &y, t0,
                               "a lower --lr, a longer --warmup, or --clip");
        if (rc != GP_CLI_EXIT_OK) goto done;
        if (step + 1 == t->steps || (t->eval_every > 0 && (step + 1) % t->eval_every == 0)) {
            rc = eval_and_log(t, &corpus, &prog, step + 1);
            if (rc != GP_CLI_EXIT_OK) goto done;
        }
    }
    gp_cli_progress_clear(&prog);
    if (t->start_step == t->steps) { /* resumed at the very end: still the final evaluation */
        rc = eval_and_log(t, &corpus, &prog, t->steps);
        if (rc != GP_CLI_EXIT_OK) goto done;
    }
    if (t->stop_step < t->steps)
        printf("stopped after step %d of %d (--stop-after); continue with --resume\n",
               t->stop_step, t->steps);
done:
    gp_tensor_release(&x);
    gp_tensor_release(&y);
    free(starts);
    gp_text_free(&corpus);
    return rc;
}
