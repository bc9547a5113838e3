/* The parts of `gpipe train` that the classifier and language-model loops
 * share: the pipeline and batch set-up, one timed training step with its
 * bookkeeping, and a batched evaluation pass over a fixed set of examples. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"

gp_optim_opts gp_cli_train_optim(const gp_cli_train *t, int total_steps) {
    gp_optim_opts oo = strcmp(t->optimizer, "sgd") == 0
                           ? gp_sgd_defaults((float)t->lr, (float)t->momentum)
                           : gp_adamw_defaults((float)t->lr, (float)t->weight_decay);
    oo.weight_decay = (float)t->weight_decay;
    oo.warmup_steps = t->warmup;
    oo.total_steps = strcmp(t->schedule, "cosine") == 0 ? total_steps : 0;
    oo.clip_norm = (float)t->clip;
    oo.min_lr = (float)t->min_lr;
    oo.lr_cycles = t->lr_cycles;
    return oo;
}

/* Creates the pipeline, which initializes the model on its stage devices (without --stages: one
 * stage on t->dev), for `total_steps` steps (the cosine schedule needs it). */
static int pipeline_start(gp_cli_train *t, int total_steps) {
    const gp_optim_opts oo = gp_cli_train_optim(t, total_steps);
    t->optim = oo;
    if (t->lr_cycles > 1 && oo.total_steps / t->lr_cycles <= t->warmup)
        return gp_cli_usage_error("train", "--lr-cycles %d: cycles of %d steps (%d steps in all) "
                                           "must be longer than the --warmup of %d steps",
                                  t->lr_cycles, oo.total_steps / t->lr_cycles, oo.total_steps,
                                  t->warmup);
    gp_status s = gp_pipeline_new(t->model, &oo, &t->popts, t->seed, &t->pipeline);
    /* A list that does not fit the model is a bad value of --partition. */
    if (s == GP_INVALID_ARGUMENT && t->partition)
        return gp_cli_usage_error("train", "--partition: %s", gp_last_error());
    if (s != GP_OK)
        return gp_cli_fail("train",
                           t->memory_limit ? "cannot create the pipeline (see --memory-limit)"
                           : t->popts.memory_limit
                               ? "cannot create the pipeline within the host's available memory "
                                 "(see --remat and --memory-limit)"
                               : "cannot create the pipeline");
    if (t->stages > 0 && t->place.rank == 0)
        gp_cli_remat_print(t->pipeline, t->popts.remat, t->remat_why);
    if (t->place.rank == 0) gp_cli_gpu_comm_print(t->pipeline, &t->place, t->popts.device_type);
    return GP_CLI_EXIT_OK;
}

int gp_cli_data_fail(const char *what, const char *path, const char *needs) {
    char msg[512];
    snprintf(msg, sizeof msg, "cannot load %s%s (--data; the default needs the Debian %s)", what,
             path, needs);
    return gp_cli_fail("train", msg);
}

gp_status gp_cli_alloc_batch(const gp_cli_train *t, int64_t nb, gp_tensor *x, gp_tensor *y) {
    gp_shape xs = t->in_shape, ys = t->out_shape;
    xs.dim[0] = nb;
    /* One label per output row: the last (class or vocabulary) axis goes. */
    ys.dim[0] = nb;
    ys.dim[--ys.ndim] = 0;
    gp_status s =
        gp_tensor_alloc(t->dev, GP_MEM_ACTIVATIONS, xs, gp_model_input_dtype(t->model), x);
    if (s != GP_OK) return s;
    return gp_tensor_alloc(t->dev, GP_MEM_ACTIVATIONS, ys, GP_I32, y);
}

int gp_cli_train_begin(gp_cli_train *t, int total_steps, int64_t nhost, const char *host_what,
                       int64_t **host, gp_tensor *x, gp_tensor *y) {
    int rc = t->init ? gp_cli_init_params(t) : GP_CLI_EXIT_OK;
    if (rc == GP_CLI_EXIT_OK) rc = pipeline_start(t, total_steps);
    if (rc != GP_CLI_EXIT_OK) return rc;
    t->total_steps = total_steps;
    t->stop_step = t->stop_after > 0 && t->stop_after < total_steps ? t->stop_after : total_steps;
    rc = gp_cli_ckpt_resume(t);
    if (rc != GP_CLI_EXIT_OK) return rc;
    if (t->stop_after > 0 && t->stop_after <= t->start_step) {
        fprintf(stderr, "gpipe train: --stop-after %d: the run resumed at step %d, past it\n",
                t->stop_after, t->start_step);
        return GP_CLI_EXIT_RUNTIME;
    }
    t->steps_done = t->start_step;
    t->step_losses = calloc((size_t)total_steps + 1, sizeof *t->step_losses);
    t->step_seconds = calloc((size_t)total_steps + 1, sizeof *t->step_seconds);
    if (!t->step_losses || !t->step_seconds) {
        fprintf(stderr, "gpipe train: out of host memory for %d step losses\n", total_steps);
        return GP_CLI_EXIT_RUNTIME;
    }
    t->eval_history = cJSON_CreateArray();
    *host = malloc((size_t)nhost * sizeof **host);
    if (!*host || !t->eval_history) {
        fprintf(stderr, "gpipe train: out of host memory for %s\n", host_what);
        return GP_CLI_EXIT_RUNTIME;
    }
    if (gp_cli_alloc_batch(t, t->batch, x, y) != GP_OK)
        return gp_cli_fail("train", "cannot allocate the input batch");
    return gp_cli_log_open(t);
}

int gp_cli_train_step(gp_cli_train *t, gp_cli_progress *p, int step, const gp_tensor *x,
                      const gp_tensor *y, double t0, const char *diverged_hint) {
    float loss;
    const double c0 = gp_cli_cpu_now();
    if (gp_pipeline_step(t->pipeline, x, y, &loss) != GP_OK) {
        char what[64];
        gp_cli_progress_clear(p);
        snprintf(what, sizeof what, "training step %d", step + 1);
        return gp_cli_fail("train", what);
    }
    t->train_cpu_seconds += gp_cli_cpu_now() - c0;
    t->step_seconds[step] = gp_cli_now() - t0;
    t->train_seconds += t->step_seconds[step];
    t->steps_done = step + 1;
    t->examples_seen += t->batch;
    t->final_loss = loss;
    if (!isfinite(loss)) {
        gp_cli_progress_clear(p);
        fprintf(stderr, "gpipe train: the loss is %g at step %d: training diverged (try %s)\n",
                (double)loss, step + 1, diverged_hint);
        return GP_CLI_EXIT_RUNTIME;
    }
    t->step_losses[step] = loss;
    p->ckpt_wait_s = t->ckpt_wait_s;
    gp_cli_progress_step(p, step + 1, loss, t->train_seconds);
    int rc = gp_cli_log_step(t, p, step + 1, loss);
    return rc == GP_CLI_EXIT_OK ? gp_cli_ckpt_after_step(t, p, step + 1) : rc;
}

int gp_cli_evaluate(gp_cli_train *t, const gp_cli_eval_pass *e, gp_cli_eval_result *r) {
    const char *cmd = t->cmd ? t->cmd : "train"; /* gpipe eval runs it too */
    const int64_t count = e->count;
    /* Under a memory limit, planned for training's micro-batches, evaluation takes one
     * micro-batch at a time: a whole mini-batch in one forward may not fit. */
    const int64_t chunk = t->memory_limit && t->micro_batches > 1 ? t->batch / t->micro_batches
                                                                  : t->batch;
    const int64_t B = chunk < count ? chunk : count;
    /* Up to EVAL_GROUP batches at once: the pipeline's stages work on them together (one
     * after another under a memory limit, gp_pipeline_evaluate_batches sees to that). */
    enum { EVAL_GROUP = 16 };
    int64_t *rows = malloc((size_t)B * sizeof *rows);
    gp_tensor xs[EVAL_GROUP] = {{0}}, ys[EVAL_GROUP] = {{0}};
    int rc = GP_CLI_EXIT_OK;
    gp_cli_tally all = {0}, augmented = {0};
    if (!rows) {
        fprintf(stderr, "gpipe %s: %s: out of host memory\n", cmd, e->name);
        return GP_CLI_EXIT_RUNTIME;
    }
    for (int64_t first = 0; first < count && rc == GP_CLI_EXIT_OK;) {
        int n = 0;
        for (; n < EVAL_GROUP && first < count; n++, first += B) {
            const int64_t nb = count - first < B ? count - first : B;
            if (!xs[n].data || xs[n].shape.dim[0] != nb) { /* the remainder: a smaller batch */
                gp_tensor_release(&xs[n]);
                gp_tensor_release(&ys[n]);
                if (gp_cli_alloc_batch(t, nb, &xs[n], &ys[n]) != GP_OK) {
                    rc = gp_cli_fail(cmd, e->alloc_what);
                    break;
                }
            }
            if (e->fill(e->ctx, first, nb, rows, &xs[n], &ys[n]) != GP_OK) {
                rc = gp_cli_fail(cmd, e->eval_what);
                break;
            }
        }
        gp_cli_tally a = {0}, b = {0};
        if (rc == GP_CLI_EXIT_OK && e->tta)
            rc = gp_cli_eval_views(t, n, xs, ys, e->eval_what, &a, &b);
        else if (rc == GP_CLI_EXIT_OK &&
                 gp_pipeline_evaluate_batches(t->pipeline, n, xs, ys, &a.loss, &a.correct,
                                              &a.count) != GP_OK)
            rc = gp_cli_fail(cmd, e->eval_what);
        all.loss += a.loss, all.correct += a.correct, all.count += a.count;
        augmented.loss += b.loss, augmented.correct += b.correct, augmented.count += b.count;
    }
    for (int i = 0; i < EVAL_GROUP; i++) {
        gp_tensor_release(&xs[i]);
        gp_tensor_release(&ys[i]);
    }
    free(rows);
    if (rc == GP_CLI_EXIT_OK && all.count <= 0) {
        fprintf(stderr, "gpipe %s: %s counted no %s\n", cmd, e->name, e->units);
        rc = GP_CLI_EXIT_RUNTIME;
    }
    if (rc == GP_CLI_EXIT_OK) {
        *r = (gp_cli_eval_result){.loss = all.loss / (double)all.count,
                                  .accuracy = (double)all.correct / (double)all.count,
                                  .tta = e->tta};
        if (e->tta) {
            r->tta_loss = augmented.loss / (double)augmented.count;
            r->tta_accuracy = (double)augmented.correct / (double)augmented.count;
        }
    }
    return rc;
}
