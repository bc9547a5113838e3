/* The image-classifier loop of `gpipe train`: IDX data (Fashion-MNIST by
 * default) shuffled each epoch by gp_shuffle(seed, epoch), full batches only,
 * test accuracy and loss on the t10k split after each epoch. */
#include <stdlib.h>

#include "cli.h"

/* Test images first..first+nb-1, standardized like the training images. */
static gp_status fill_test(void *ctx, int64_t first, int64_t nb, int64_t *idx, gp_tensor *x,
                           gp_tensor *y) {
    for (int64_t i = 0; i < nb; i++) idx[i] = first + i;
    return gp_idx_batch(ctx, idx, nb, GP_CLI_IMAGE_MEAN, GP_CLI_IMAGE_STD, x, y);
}

/* Evaluates, prints the line and appends it to the history. */
int gp_cli_eval_classifier(gp_cli_train *t, const gp_idx_dataset *test, int64_t count,
                           gp_cli_eval_result *r) {
    char what[4200]; /* the data named, for a failure in the middle of it */
    snprintf(what, sizeof what, "evaluation on the t10k split of --data %s",
             t->data ? t->data : GP_CLI_FASHION_DIR);
    gp_cli_eval_pass pass = {.count = count,
                             .fill = fill_test,
                             .ctx = (void *)test,
                             .name = "evaluation",
                             .units = "test examples",
                             .alloc_what = "evaluation: cannot allocate a test batch",
                             .eval_what = what,
                             .tta = t->tta != GP_CLI_TTA_NONE || t->nmembers > 0};
    return gp_cli_evaluate(t, &pass, r);
}

static int eval_and_log(gp_cli_train *t, const gp_idx_dataset *test, gp_cli_progress *p, int step,
                        bool epoch_end) {
    int64_t count = t->eval_size > 0 && t->eval_size < test->n ? t->eval_size : test->n;
    double t0 = gp_cli_now();
    gp_cli_eval_result r;
    int rc = gp_cli_eval_classifier(t, test, count, &r);
    if (rc != GP_CLI_EXIT_OK) return rc;
    double secs = gp_cli_now() - t0;
    t->have_eval = true;
    t->eval_loss = r.loss;
    t->eval_accuracy = r.accuracy;
    t->eval_tta = r.tta;
    t->eval_tta_loss = r.tta_loss;
    t->eval_tta_accuracy = r.tta_accuracy;
    t->eval_count = count;
    gp_cli_progress_clear(p);
    if (epoch_end)
        printf("epoch %d (step %d): ", t->epochs_done, step);
    else
        printf("step %d: ", step);
    printf("test accuracy %.4f, loss %.4f", r.accuracy, r.loss);
    if (r.tta)
        printf("; --tta %s (%d views) %.4f, loss %.4f", gp_cli_tta_name(t->tta),
               gp_cli_tta_views(t->tta), r.tta_accuracy, r.tta_loss);
    printf(" (%lld images, %.1fs)\n", (long long)count, secs);
    fflush(stdout);
    cJSON *e = cJSON_CreateObject();
    cJSON_AddNumberToObject(e, "step", step);
    cJSON_AddNumberToObject(e, "epoch", t->epochs_done);
    cJSON_AddNumberToObject(e, "loss", r.loss);
    cJSON_AddNumberToObject(e, "accuracy", r.accuracy);
    if (r.tta) {
        cJSON_AddNumberToObject(e, "tta_loss", r.tta_loss);
        cJSON_AddNumberToObject(e, "tta_accuracy", r.tta_accuracy);
    }
    cJSON_AddNumberToObject(e, "seconds", secs);
    cJSON_AddItemToArray(t->eval_history, e);
    return gp_cli_log_eval(t, e);
}

/* The data and the model must agree on image size and label range. */
static int check_shapes(gp_cli_train *t, const gp_idx_dataset *train, const gp_idx_dataset *test,
                        const char *dir) {
    const gp_shape *in = &t->in_shape, *out = &t->out_shape;
    char buf[96];
    if (in->ndim != 4 || in->dim[1] != 1 || in->dim[2] != train->rows || in->dim[3] != train->cols)
        return gp_cli_usage_error("train",
                                  "--model %s takes input %s, but the IDX images in %s are "
                                  "(%lld, 1, %d, %d)",
                                  t->model_name, gp_shape_str(in, buf, sizeof buf), dir,
                                  (long long)t->batch, train->rows, train->cols);
    if (test->rows != train->rows || test->cols != train->cols)
        return gp_cli_usage_error("train", "--data %s: t10k images are %dx%d, train images %dx%d",
                                  dir, test->rows, test->cols, train->rows, train->cols);
    int maxlabel = 0;
    for (int64_t i = 0; i < train->n; i++)
        if (train->labels[i] > maxlabel) maxlabel = train->labels[i];
    for (int64_t i = 0; i < test->n; i++)
        if (test->labels[i] > maxlabel) maxlabel = test->labels[i];
    if (out->ndim != 2 || out->dim[1] <= maxlabel)
        return gp_cli_usage_error("train",
                                  "--model %s outputs %s, expected (batch, classes) with at least "
                                  "%d classes for the labels in %s",
                                  t->model_name, gp_shape_str(out, buf, sizeof buf), maxlabel + 1,
                                  dir);
    if (train->n < t->batch)
        return gp_cli_usage_error("train", "--batch %d: larger than the %lld training images in %s",
                                  t->batch, (long long)train->n, dir);
    return GP_CLI_EXIT_OK;
}

int gp_cli_train_classifier(gp_cli_train *t) {
    const char *dir = t->data ? t->data : GP_CLI_FASHION_DIR;
    gp_idx_dataset train = {0}, test = {0};
    gp_tensor x = {0}, y = {0};
    int64_t *perm = NULL;
    int rc = GP_CLI_EXIT_OK;
    if (gp_idx_load_dir(dir, "train", &train) != GP_OK ||
        gp_idx_load_dir(dir, "t10k", &test) != GP_OK) {
        rc = gp_cli_data_fail("the IDX data from ", dir, "package dataset-fashion-mnist");
        goto done;
    }
    rc = check_shapes(t, &train, &test, dir);
    if (rc != GP_CLI_EXIT_OK) goto done;
    const int64_t per_epoch = train.n / t->batch;
    int64_t total = t->steps > 0 ? t->steps : per_epoch * t->epochs;
    if (total > 0x7fffffff) {
        rc = gp_cli_usage_error("train", "--epochs %d: %lld steps, more than a step counter holds",
                                t->epochs, (long long)total);
        goto done;
    }
    t->per_epoch = per_epoch;
    rc = gp_cli_train_begin(t, (int)total, train.n, "the data order", &perm, &x, &y);
    if (rc != GP_CLI_EXIT_OK) goto done;
    t->epochs_done = (int)(t->start_step / per_epoch);
    printf("training on %lld images from %s: %lld steps of %d (%lld per epoch)\n",
           (long long)train.n, dir, (long long)total, t->batch, (long long)per_epoch);
    fflush(stdout);
    gp_cli_progress prog;
    gp_cli_progress_init(&prog, (int)total, t->batch, 0, t->log_every, t->quiet);
    for (int step = t->start_step; step < t->stop_step; step++) {
        const uint32_t epoch = (uint32_t)(step / per_epoch);
        const int64_t pos = step % per_epoch;
        double t0 = gp_cli_now();
        /* A resumed run may start mid-epoch: that epoch's order first. */
        if ((pos == 0 || step == t->start_step) && gp_shuffle(t->seed, epoch, train.n, perm) != GP_OK) {
            rc = gp_cli_fail("train", "cannot shuffle the training set");
            goto done;
        }
        if (gp_idx_batch(&train, perm + pos * t->batch, t->batch, GP_CLI_IMAGE_MEAN,
                         GP_CLI_IMAGE_STD, &x, &y) != GP_OK) {
            rc = gp_cli_fail("train", "cannot assemble a training batch");
            goto done;
        }
        rc = gp_cli_augment_batch(t->augment, t->erase, -GP_CLI_IMAGE_MEAN / GP_CLI_IMAGE_STD,
                                  t->seed, step, &x);
        if (rc != GP_CLI_EXIT_OK) goto done;
        rc = gp_cli_train_step(t, &prog, step, &x, &y, t0, "a lower --lr, or --clip");
        if (rc != GP_CLI_EXIT_OK) goto done;
        const bool epoch_end = pos == per_epoch - 1;
        if (epoch_end) t->epochs_done++;
        if (epoch_end || step + 1 == total ||
            (t->eval_every > 0 && (step + 1) % t->eval_every == 0)) {
            rc = eval_and_log(t, &test, &prog, step + 1, epoch_end);
            if (rc != GP_CLI_EXIT_OK) goto done;
        }
    }
    gp_cli_progress_clear(&prog);
    if (t->start_step == total) { /* resumed at the very end: still the final evaluation */
        rc = eval_and_log(t, &test, &prog, (int)total, false);
        if (rc != GP_CLI_EXIT_OK) goto done;
    }
    if (t->stop_step < total)
        printf("stopped after step %d of %lld (--stop-after); continue with --resume\n",
               t->stop_step, (long long)total);
done:
    gp_tensor_release(&x);
    gp_tensor_release(&y);
    free(perm);
    gp_idx_free(&train);
    gp_idx_free(&test);
    return rc;
}
