/* The language-model loop of `gpipe train`: a byte corpus (the multilingual
 * fortunes by default), random training windows keyed by (seed, step), and
 * validation loss / bits per byte on fixed, evenly spaced windows that are
 * the same for every run and seed. */
#include <math.h>
#include <stdlib.h>

#include "cli.h"

/* Mean per-byte loss over `count` validation windows starting at evenly
 * spaced offsets, in batches of at most t->batch windows. */
static int evaluate(gp_cli_train *t, const gp_text_corpus *c, int64_t count, double *loss) {
    const int T = (int)t->in_shape.dim[1];
    const int64_t B = t->batch < count ? t->batch : count;
    const int64_t span = c->nvalid - T - 1; /* the last valid start */
    int64_t *starts = malloc((size_t)B * sizeof *starts);
    gp_tensor x = {0}, y = {0};
    int rc = GP_CLI_EXIT_OK;
    double loss_sum = 0;
    int64_t seen = 0;
    if (!starts) {
        fprintf(stderr, "gpipe train: validation: out of host memory\n");
        return GP_CLI_EXIT_RUNTIME;
    }
    for (int64_t first = 0; first < count; first += B) {
        int64_t nb = count - first < B ? count - first : B;
        if (!x.data || x.shape.dim[0] != nb) {
            gp_tensor_release(&x);
            gp_tensor_release(&y);
            if (gp_tensor_alloc(t->dev, GP_MEM_ACTIVATIONS, gp_shape2(nb, T), GP_I32, &x) !=
                    GP_OK ||
                gp_tensor_alloc(t->dev, GP_MEM_ACTIVATIONS, gp_shape2(nb, T), GP_I32, &y) !=
                    GP_OK) {
                rc = gp_cli_fail("train", "validation: cannot allocate a batch");
                break;
            }
        }
        for (int64_t i = 0; i < nb; i++) {
            int64_t w = first + i;
            starts[i] = count > 1 ? w * span / (count - 1) : 0;
        }
        double ls = 0;
        int64_t nc = 0, nn = 0;
        if (gp_text_batch(c->valid, c->nvalid, starts, nb, T, &x, &y) != GP_OK ||
            gp_model_evaluate(t->model, t->dev, &x, &y, &ls, &nc, &nn) != GP_OK) {
            rc = gp_cli_fail("train", "validation");
            break;
        }
        loss_sum += ls;
        seen += nn;
    }
    gp_tensor_release(&x);
    gp_tensor_release(&y);
    free(starts);
    if (rc == GP_CLI_EXIT_OK && seen <= 0) {
        fprintf(stderr, "gpipe train: validation counted no tokens\n");
        rc = GP_CLI_EXIT_RUNTIME;
    }
    if (rc == GP_CLI_EXIT_OK) *loss = loss_sum / (double)seen;
    return rc;
}

static int eval_and_log(gp_cli_train *t, const gp_text_corpus *c, gp_cli_progress *p, int step) {
    double t0 = gp_now(), loss;
    int rc = evaluate(t, c, t->eval_size, &loss);
    if (rc != GP_CLI_EXIT_OK) return rc;
    double secs = gp_now() - t0, bpb = loss / log(2.0);
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
    return GP_CLI_EXIT_OK;
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
    char what[512];
    if (gp_text_load(path, 20, &corpus) != GP_OK) {
        snprintf(what, sizeof what,
                 "cannot load the text corpus %s (--data; the default needs the Debian fortunes "
                 "packages)",
                 path);
        rc = gp_cli_fail("train", what);
        goto done;
    }
    rc = check_shapes(t, &corpus, path);
    if (rc != GP_CLI_EXIT_OK) goto done;
    const int T = (int)t->in_shape.dim[1];
    rc = gp_cli_trainer_start(t, t->steps);
    if (rc != GP_CLI_EXIT_OK) goto done;
    t->eval_history = cJSON_CreateArray();
    starts = malloc((size_t)t->batch * sizeof *starts);
    if (!starts || !t->eval_history) {
        fprintf(stderr, "gpipe train: out of host memory for the window offsets\n");
        rc = GP_CLI_EXIT_RUNTIME;
        goto done;
    }
    if (gp_tensor_alloc(t->dev, GP_MEM_ACTIVATIONS, t->in_shape, GP_I32, &x) != GP_OK ||
        gp_tensor_alloc(t->dev, GP_MEM_ACTIVATIONS, t->in_shape, GP_I32, &y) != GP_OK) {
        rc = gp_cli_fail("train", "cannot allocate the input batch");
        goto done;
    }
    printf("training on %s: %d files, %lld training / %lld validation bytes; %d steps of %d "
           "windows of %d bytes\n",
           path, corpus.nfiles, (long long)corpus.ntrain, (long long)corpus.nvalid, t->steps,
           t->batch, T);
    fflush(stdout);
    gp_cli_progress prog;
    gp_cli_progress_init(&prog, t->steps, t->batch, T, t->log_every, t->quiet);
    for (int step = 0; step < t->steps; step++) {
        double t0 = gp_now();
        /* Window starts in [0, ntrain - T - 1], keyed by (seed, step). */
        gp_rng_stream s = {.seed = t->seed, .purpose = GP_RNG_DATA, .a = (uint32_t)step, .b = 0};
        for (int b = 0; b < t->batch; b++)
            starts[b] = (int64_t)(gp_rng_u64(&s, (uint64_t)b) % (uint64_t)(corpus.ntrain - T));
        float loss;
        if (gp_text_batch(corpus.train, corpus.ntrain, starts, t->batch, T, &x, &y) != GP_OK) {
            rc = gp_cli_fail("train", "cannot assemble a training batch");
            goto done;
        }
        if (gp_trainer_step(t->trainer, &x, &y, &loss) != GP_OK) {
            gp_cli_progress_clear(&prog);
            snprintf(what, sizeof what, "training step %d", step + 1);
            rc = gp_cli_fail("train", what);
            goto done;
        }
        t->train_seconds += gp_now() - t0;
        t->steps_done = step + 1;
        t->examples_seen += t->batch;
        t->final_loss = loss;
        if (!isfinite(loss)) {
            gp_cli_progress_clear(&prog);
            fprintf(stderr,
                    "gpipe train: the loss is %g at step %d: training diverged (try a "
                    "lower --lr, a longer --warmup, or --clip)\n",
                    (double)loss, step + 1);
            rc = GP_CLI_EXIT_RUNTIME;
            goto done;
        }
        gp_cli_progress_step(&prog, step + 1, loss, t->train_seconds);
        if (step + 1 == t->steps || (t->eval_every > 0 && (step + 1) % t->eval_every == 0)) {
            rc = eval_and_log(t, &corpus, &prog, step + 1);
            if (rc != GP_CLI_EXIT_OK) goto done;
        }
    }
    gp_cli_progress_clear(&prog);
done:
    gp_tensor_release(&x);
    gp_tensor_release(&y);
    free(starts);
    gp_text_free(&corpus);
    return rc;
}
