/* What `gpipe train` records of its learning: --metrics FILE.jsonl, one JSON object per line per
 * logged step ({"type":"train",...}) and per evaluation ({"type":"eval",...}), flushed as written
 * so a killed run keeps every line it logged (appended to on --resume); and --curve FILE.svg, the
 * training loss and the evaluation figures against steps, rewritten after every evaluation and at
 * the end. Rank 0 alone writes them. */
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "cli.h"
#include "curve_svg.h"

enum { CURVE_MAX_POINTS = 1500 };

static bool writer(const gp_cli_train *t) { return t->place.rank == 0; }

int gp_cli_log_open(gp_cli_train *t) {
    t->run_t0 = gp_cli_now();
    if (!t->metrics || !writer(t)) return GP_CLI_EXIT_OK;
    struct stat st;
    if (stat(t->metrics, &st) == 0 && !S_ISREG(st.st_mode) && !S_ISCHR(st.st_mode))
        return gp_cli_usage_error("train", "--metrics %s: not a regular file (expected a .jsonl "
                                           "file to write, or a terminal)", t->metrics);
    /* A resumed run continues the file of the run it resumes; a fresh run starts it anew. */
    t->metrics_f = fopen(t->metrics, t->start_step > 0 ? "a" : "w");
    if (!t->metrics_f) {
        fprintf(stderr, "gpipe train: --metrics %s: cannot open for writing: %s\n", t->metrics,
                strerror(errno));
        return GP_CLI_EXIT_RUNTIME;
    }
    return GP_CLI_EXIT_OK;
}

/* One object as one line, flushed. */
static int put_line(gp_cli_train *t, cJSON *o) {
    char *text = cJSON_PrintUnformatted(o);
    int rc = GP_CLI_EXIT_OK;
    if (!text || fprintf(t->metrics_f, "%s\n", text) < 0 || fflush(t->metrics_f) != 0) {
        fprintf(stderr, "gpipe train: --metrics %s: cannot write: %s\n", t->metrics,
                text ? strerror(errno) : "out of memory");
        rc = GP_CLI_EXIT_RUNTIME;
    }
    cJSON_free(text);
    return rc;
}

int gp_cli_log_step(gp_cli_train *t, const gp_cli_progress *p, int done, double loss) {
    t->log_loss_sum += loss;
    t->log_loss_n++;
    if (!t->metrics_f || (done % p->log_every != 0 && done != p->total)) return GP_CLI_EXIT_OK;
    cJSON *o = cJSON_CreateObject();
    if (!o) return gp_cli_fail("train", "--metrics: out of host memory");
    const double rate = t->train_seconds > 0 ? (double)t->examples_seen / t->train_seconds : 0;
    cJSON_AddStringToObject(o, "type", "train");
    cJSON_AddNumberToObject(o, "step", done);
    if (!t->is_lm && t->per_epoch > 0)
        cJSON_AddNumberToObject(o, "epoch", (double)done / (double)t->per_epoch);
    cJSON_AddNumberToObject(o, "loss", loss);
    cJSON_AddNumberToObject(o, "loss_mean", t->log_loss_sum / t->log_loss_n);
    cJSON_AddNumberToObject(o, "lr", gp_optim_lr_at(&t->optim, done - 1));
    if (t->is_lm) {
        cJSON_AddNumberToObject(o, "sequences_per_s", rate);
        cJSON_AddNumberToObject(o, "tokens_per_s", rate * (double)t->in_shape.dim[1]);
    } else {
        cJSON_AddNumberToObject(o, "images_per_s", rate);
    }
    cJSON_AddNumberToObject(o, "train_s", t->train_seconds);
    if (t->ckpt_dir) cJSON_AddNumberToObject(o, "checkpoint_wait_s", t->ckpt_wait_s);
    cJSON_AddNumberToObject(o, "elapsed_s", gp_cli_now() - t->run_t0);
    t->log_loss_sum = 0;
    t->log_loss_n = 0;
    int rc = put_line(t, o);
    cJSON_Delete(o);
    return rc;
}

/* The training loss of every step this process ran, in at most CURVE_MAX_POINTS points (the
 * mean of each group of consecutive steps, at the group's last step). */
static int loss_points(const gp_cli_train *t, double **xs, double **ys) {
    const int first = t->start_step, n = t->steps_done - first;
    const int per = n > CURVE_MAX_POINTS ? (n + CURVE_MAX_POINTS - 1) / CURVE_MAX_POINTS : 1;
    const int np = n > 0 ? (n + per - 1) / per : 0;
    *xs = malloc(((size_t)np + 1) * sizeof **xs);
    *ys = malloc(((size_t)np + 1) * sizeof **ys);
    if (!*xs || !*ys) return -1;
    for (int i = 0; i < np; i++) {
        int lo = first + i * per, hi = lo + per < t->steps_done ? lo + per : t->steps_done;
        double sum = 0;
        for (int s = lo; s < hi; s++) sum += t->step_losses[s];
        (*xs)[i] = hi;
        (*ys)[i] = sum / (hi - lo);
    }
    return np;
}

static int write_curve(gp_cli_train *t) {
    if (!t->curve || !writer(t) || !t->step_losses) return GP_CLI_EXIT_OK;
    double *lx = NULL, *ly = NULL, *ex = NULL, *el = NULL, *er = NULL, *em = NULL;
    int nm = 0; /* evaluations with --tta figures */
    char tta_name[64];
    snprintf(tta_name, sizeof tta_name, "test accuracy, --tta %s", gp_cli_tta_name(t->tta));
    int rc = GP_CLI_EXIT_OK;
    const int nl = loss_points(t, &lx, &ly);
    const int ne = t->eval_history ? cJSON_GetArraySize(t->eval_history) : 0;
    ex = malloc(((size_t)ne + 1) * sizeof *ex);
    el = malloc(((size_t)ne + 1) * sizeof *el);
    er = malloc(((size_t)ne + 1) * sizeof *er);
    em = malloc(((size_t)ne + 1) * sizeof *em);
    if (nl < 0 || !ex || !el || !er || !em) {
        rc = gp_cli_fail("train", "--curve: out of host memory");
        goto done;
    }
    char right[32] = "accuracy";
    if (t->is_lm) snprintf(right, sizeof right, "bits_per_%s", t->lm_unit);
    for (int i = 0; i < ne; i++) {
        const cJSON *e = cJSON_GetArrayItem(t->eval_history, i);
        ex[i] = cJSON_GetNumberValue(cJSON_GetObjectItem(e, "step"));
        el[i] = cJSON_GetNumberValue(cJSON_GetObjectItem(e, "loss"));
        er[i] = cJSON_GetNumberValue(cJSON_GetObjectItem(e, right));
        const cJSON *m = cJSON_GetObjectItem(e, "tta_accuracy"); /* --tta */
        if (m) em[nm++] = cJSON_GetNumberValue(m);
    }
    const gp_cli_series series[] = {
        {.name = nl < t->steps_done - t->start_step ? "training loss (mean per point)" : "training loss",
         .color = "#1f77b4", .x = lx, .y = ly, .n = nl},
        {.name = t->is_lm ? "validation loss" : "test loss", .color = "#ff7f0e", .x = ex, .y = el,
         .n = ne, .markers = true},
        {.name = !t->is_lm                         ? "test accuracy"
                 : strcmp(t->lm_unit, "token") == 0 ? "validation bits per token"
                                                    : "validation bits per byte",
         .color = "#2ca02c",
         .x = ex, .y = er, .n = ne, .right = true, .markers = true},
        {.name = tta_name, .color = "#9467bd", .x = ex, .y = em, .n = nm, .right = true,
         .markers = true}};
    char title[256];
    snprintf(title, sizeof title, "gpipe train --model %s: %d of %d steps", t->model_name,
             t->steps_done, t->total_steps);
    const gp_cli_curve c = {.title = title,
                            .x_label = "step",
                            .left_label = "loss (nats)",
                            .right_label = !t->is_lm ? "accuracy"
                                           : strcmp(t->lm_unit, "token") == 0 ? "bits per token"
                                                                              : "bits per byte",
                            .series = series,
                            .nseries = nm == ne && ne > 0 ? 4 : 3};
    if (gp_cli_curve_write(t->curve, &c) != GP_OK) rc = gp_cli_fail("train", "--curve");
done:
    free(lx);
    free(ly);
    free(ex);
    free(el);
    free(er);
    free(em);
    return rc;
}

int gp_cli_log_eval(gp_cli_train *t, const cJSON *e) {
    int rc = GP_CLI_EXIT_OK;
    if (t->metrics_f) {
        cJSON *o = cJSON_Duplicate(e, true);
        if (!o) return gp_cli_fail("train", "--metrics: out of host memory");
        cJSON_AddStringToObject(o, "type", "eval");
        cJSON_AddNumberToObject(o, "elapsed_s", gp_cli_now() - t->run_t0);
        rc = put_line(t, o);
        cJSON_Delete(o);
    }
    return rc == GP_CLI_EXIT_OK ? write_curve(t) : rc;
}

int gp_cli_log_finish(gp_cli_train *t) {
    int rc = write_curve(t);
    if (rc == GP_CLI_EXIT_OK && t->curve && writer(t))
        printf("learning curve written to %s (SVG)\n", t->curve);
    if (t->metrics_f) {
        if (fclose(t->metrics_f) != 0 && rc == GP_CLI_EXIT_OK) {
            fprintf(stderr, "gpipe train: --metrics %s: cannot close: %s\n", t->metrics,
                    strerror(errno));
            rc = GP_CLI_EXIT_RUNTIME;
        }
        t->metrics_f = NULL;
        if (rc == GP_CLI_EXIT_OK) printf("metrics written to %s (JSON lines)\n", t->metrics);
    }
    fflush(stdout);
    return rc;
}

void gp_cli_log_close(gp_cli_train *t) {
    if (t->metrics_f) fclose(t->metrics_f);
    t->metrics_f = NULL;
}
