/* The plan search as the command line shows it (`gpipe plan --devices N`, `gpipe train --plan
 * auto`): a progress line while plans are tried, a table of the fastest, and their JSON. */
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli.h"

typedef struct search_progress {
    bool tty;
    int next_line; /* not a terminal: the next count to log at (every quarter) */
} search_progress;

static void progress(void *ctx, int done, int total) {
    search_progress *sp = ctx;
    if (sp->tty) {
        fprintf(stderr, "\rplanning: %d of %d plans tried", done, total);
        if (done == total) fputc('\n', stderr);
    } else if (done >= sp->next_line || done == total) {
        fprintf(stderr, "planning: %d of %d plans tried\n", done, total);
        sp->next_line = done + (total + 3) / 4;
    }
    fflush(stderr);
}

int gp_cli_plan_search(const char *cmd, gp_model *m, int64_t batch, const gp_optim_opts *oo,
                       const gp_pipeline_opts *base, double gflops, gp_plan_search_opts so,
                       bool quiet, gp_plan_search_result *res) {
    search_progress sp = {.tty = isatty(STDERR_FILENO) != 0};
    if (!quiet) so.progress = progress, so.progress_ctx = &sp;
    if (gp_plan_search(m, batch, oo, base, gflops, &so, res) != GP_OK) {
        fprintf(stderr, "gpipe %s: %s\n", cmd, gp_last_error());
        return GP_CLI_EXIT_RUNTIME;
    }
    return GP_CLI_EXIT_OK;
}

/* "cell", "none", or per cell "none,cell,cell" for a selective plan. */
static const char *remat_text(const gp_plan *p, char *buf, size_t n) {
    if (p->remat != GP_REMAT_SELECTIVE) return gp_remat_name(p->remat);
    size_t len = 0;
    buf[0] = '\0';
    for (int k = 0; k < p->ncells && len < n; k++)
        len += (size_t)snprintf(buf + len, n - len, "%s%s", k ? "," : "",
                                gp_remat_name(p->cells[k].remat));
    return buf;
}

void gp_cli_plan_search_print(const gp_plan_search_result *r, int devices,
                              int64_t tokens_per_example) {
    printf("%d plan%s of %d device%s tried, %d within the memory limit; the fastest %d:\n",
           r->candidates, r->candidates == 1 ? "" : "s", devices, devices == 1 ? "" : "s",
           r->fitting, r->n);
    printf("%4s %3s %3s %3s %5s %2s  %-11s %-14s %10s %7s %11s %11s\n", "rank", "K", "D", "T", "M",
           "V", "schedule", "remat", "step", "bubble", "fullest",
           tokens_per_example > 0 ? "tokens/s" : "examples/s");
    for (int i = 0; i < r->n; i++) {
        const gp_plan *p = &r->plans[i];
        char rm[128], step[32], bytes[32];
        if (p->step_s < 1.0)
            snprintf(step, sizeof step, "%.2f ms", p->step_s * 1e3);
        else
            snprintf(step, sizeof step, "%.3f s", p->step_s);
        const double ex_s = p->step_s > 0 ? (double)p->batch / p->step_s : 0;
        printf("%4d %3d %3d %3d %5d %2d  %-11s %-14s %10s %7.4f %11s %11.0f\n", i + 1, p->stages,
               p->data_parallel, p->tensor_parallel, p->micro_batches, p->chunks,
               gp_schedule_kind_name(p->schedule), remat_text(p, rm, sizeof rm), step,
               p->bubble_simulated,
               gp_cli_fmt_bytes(gp_plan_fullest_bytes(p), bytes, sizeof bytes),
               tokens_per_example > 0 ? ex_s * (double)tokens_per_example : ex_s);
    }
}

cJSON *gp_cli_plan_search_json(const gp_plan_search_result *r, int devices) {
    cJSON *s = cJSON_CreateObject();
    cJSON_AddNumberToObject(s, "devices", devices);
    cJSON_AddNumberToObject(s, "candidates", r->candidates);
    cJSON_AddNumberToObject(s, "fitting", r->fitting);
    cJSON *plans = cJSON_AddArrayToObject(s, "plans");
    for (int i = 0; i < r->n; i++) {
        const gp_plan *p = &r->plans[i];
        cJSON *x = cJSON_CreateObject();
        cJSON_AddNumberToObject(x, "stages", p->stages);
        cJSON_AddNumberToObject(x, "data_parallel", p->data_parallel);
        cJSON_AddNumberToObject(x, "tensor_parallel", p->tensor_parallel);
        cJSON_AddNumberToObject(x, "micro_batches", p->micro_batches);
        cJSON_AddStringToObject(x, "schedule", gp_schedule_kind_name(p->schedule));
        cJSON_AddNumberToObject(x, "chunks", p->chunks);
        cJSON_AddStringToObject(x, "remat", gp_remat_name(p->remat));
        cJSON *part = cJSON_AddArrayToObject(x, "partition");
        cJSON *rm = cJSON_AddArrayToObject(x, "cell_remat");
        for (int k = 0; k < p->ncells; k++) {
            cJSON_AddItemToArray(part, cJSON_CreateNumber(p->cells[k].first));
            cJSON_AddItemToArray(rm, cJSON_CreateString(gp_remat_name(p->cells[k].remat)));
        }
        cJSON_AddNumberToObject(x, "step_s", p->step_s);
        /* the plan's compute on one device, by the same layer times: M micro-batches of every
         * cell's forward and backward (the sum that a speed-up over K = 1 divides) */
        double work = 0;
        for (int k = 0; k < p->ncells; k++) work += p->cells[k].time_s;
        cJSON_AddNumberToObject(x, "work_s", work * p->micro_batches);
        cJSON_AddNumberToObject(x, "bubble_simulated", p->bubble_simulated);
        gp_cli_report_u64(x, "fullest_device_bytes", gp_plan_fullest_bytes(p));
        cJSON_AddItemToArray(plans, x);
    }
    return s;
}

/* The runtime's cost per action on this machine now (gp_pipeline_opts.action_s): a pipeline of
 * a tiny model (each layer's compute a few microseconds) on `stages` devices of `threads`
 * threads, 64 micro-batches of one example through 1F1B, whose step is its critical path of
 * 2 (M + K - 1) actions, nearly all hand-off: the median of 3 steps after one, over them. */
int gp_cli_bench_action(const char *cmd, int stages, int threads, double *action_s) {
    enum { M = 64, STEPS = 4 };
    char json[160];
    snprintf(json, sizeof json,
             "{\"family\": \"transformer\", \"vocab\": 2, \"dim\": 2, \"heads\": 1, "
             "\"d_ff\": 2, \"layers\": %d, \"seq_len\": 1}",
             stages > 2 ? stages : 2);
    gp_model *m = NULL;
    gp_pipeline *p = NULL;
    int32_t *ids = calloc(M, sizeof *ids); /* token 0 in, token 0 expected */
    double step[STEPS];
    const gp_pipeline_opts po = {.stages = stages, .micro_batches = M,
                                 .schedule = GP_SCHEDULE_1F1B, .remat = GP_REMAT_NONE,
                                 .stage_threads = threads, .batch = M};
    const gp_optim_opts oo = gp_sgd_defaults(0.05f, 0.9f);
    if (!ids) {
        fprintf(stderr, "gpipe %s: out of host memory\n", cmd);
        return GP_CLI_EXIT_RUNTIME;
    }
    gp_status s = gp_model_from_json_string(json, "action timing", &m);
    if (s == GP_OK) s = gp_pipeline_new(m, &oo, &po, 1, &p);
    const gp_tensor x = gp_tensor_view(ids, gp_shape2(M, 1), GP_I32);
    for (int i = 0; i < STEPS && s == GP_OK; i++) {
        float loss;
        const double t0 = gp_cli_now();
        s = gp_pipeline_step(p, &x, &x, &loss);
        step[i] = gp_cli_now() - t0;
    }
    gp_pipeline_free(p);
    gp_model_free(m);
    free(ids);
    if (s != GP_OK) {
        fprintf(stderr, "gpipe %s: timing the pipeline's hand-offs on %d stages: %s\n", cmd,
                stages, gp_last_error());
        return GP_CLI_EXIT_RUNTIME;
    }
    *action_s = gp_cli_median(step + 1, STEPS - 1) / (2.0 * (M + stages - 1));
    return GP_CLI_EXIT_OK;
}

/* The median seconds of a step of po's pipeline: a fresh copy of the model (loaded again from
 * model_src, so that the run to come starts from the seed's values, untouched), on stand-in
 * examples, `steps` steps timed after one untimed. The examples are spread values and classes
 * (tokens), not zeros: a model that sees one class only learns it within a few steps, and its
 * vanishing gradients would time subnormal arithmetic rather than the run's. false (why in
 * `why`) where the plan cannot run. */
static bool trial_once(const char *cmd, const gp_cli_trial_data *d, const gp_optim_opts *oo,
                       const gp_pipeline_opts *po, int steps, double *median_s, char *why,
                       size_t nwhy) {
    gp_model *m = NULL;
    if (gp_cli_load_model(cmd, d->model_src, &m) != GP_CLI_EXIT_OK) {
        snprintf(why, nwhy, "loading a copy of the model %s", d->model_src);
        return false;
    }
    const int64_t nx = gp_shape_nelem(&d->x), ny = gp_shape_nelem(&d->y);
    void *xv = calloc((size_t)nx, 4); /* float32 or int32 */
    int32_t *yv = calloc((size_t)ny, sizeof *yv);
    double *t = calloc((size_t)steps, sizeof *t);
    gp_status s = xv && yv && t ? GP_OK : GP_OUT_OF_MEMORY;
    uint32_t r = 12345; /* a fixed LCG: the same stand-ins on every trial */
    for (int64_t i = 0; s == GP_OK && i < nx; i++) {
        r = r * 1664525u + 1013904223u;
        if (d->x_dtype == GP_I32)
            ((int32_t *)xv)[i] = (int32_t)((r >> 8) % (uint32_t)d->ids);
        else
            ((float *)xv)[i] = (float)(r >> 8) / (float)(1u << 23) - 1.0f; /* [-1, 1) */
    }
    for (int64_t i = 0; s == GP_OK && i < ny; i++) {
        r = r * 1664525u + 1013904223u;
        yv[i] = (int32_t)((r >> 8) % (uint32_t)d->classes);
    }
    gp_pipeline *p = NULL;
    if (s == GP_OK) s = gp_pipeline_new(m, oo, po, 1, &p);
    const gp_tensor x = gp_tensor_view(xv, d->x, d->x_dtype), y = gp_tensor_view(yv, d->y, GP_I32);
    for (int i = -1; i < steps && s == GP_OK; i++) {
        float loss;
        const double t0 = gp_cli_now();
        s = gp_pipeline_step(p, &x, &y, &loss);
        if (i >= 0) t[i] = gp_cli_now() - t0;
    }
    if (s == GP_OK) *median_s = gp_cli_median(t, steps);
    else
        snprintf(why, nwhy, "%s", s == GP_OUT_OF_MEMORY && !p ? "out of host memory" : gp_last_error());
    gp_pipeline_free(p);
    gp_model_free(m);
    free(xv);
    free(yv);
    free(t);
    return s == GP_OK;
}

/* The next cut to try from `first` (ncells cells of L layers): move j of the 2 (ncells - 1)
 * moves, one cell boundary one layer down (even j) or up (odd j), where both cells keep a
 * layer. false where move j is not possible. */
static bool moved_cut(const int *first, int ncells, int L, int j, int *out) {
    const int b = 1 + j / 2, to = first[b] + (j % 2 ? 1 : -1);
    const int next = b + 1 < ncells ? first[b + 1] : L;
    if (to <= first[b - 1] || to >= next) return false;
    for (int k = 0; k < ncells; k++) out[k] = first[k];
    out[b] = to;
    return true;
}

int gp_cli_plan_trial(const char *cmd, const gp_cli_trial_data *d, const gp_model *m,
                      const gp_optim_opts *oo, const gp_pipeline_opts *po, int64_t batch,
                      double modelled_s, double budget_s, gp_cli_trial *out) {
    memset(out, 0, sizeof *out);
    int V = 1;
    if (gp_schedule_kind_chunks(po->schedule, po->chunks, &V) != GP_OK) V = 1;
    const int n = po->stages * V, L = gp_model_nlayers(m);
    /* enough steps for a second, 3 to 8 of them: a median over the host's noise (2 steps of
     * C1 on the 2-core Xeon were off by 25%), cheap on large steps */
    int steps = modelled_s > 0 ? (int)(1.0 / modelled_s) + 1 : 3;
    steps = steps < 3 ? 3 : steps > 8 ? 8 : steps;
    /* by default: room for the plan and each of its moves once, 4 to 60 s */
    if (budget_s < 0) {
        budget_s = (1 + 2 * (n - 1)) * (steps + 1) * modelled_s;
        budget_s = budget_s < 4 ? 4 : budget_s > 60 ? 60 : budget_s;
    }
    int *cut = malloc((size_t)n * sizeof *cut), *best = malloc((size_t)n * sizeof *best);
    if (!cut || !best) {
        free(cut);
        free(best);
        return gp_cli_fail(cmd, "--plan auto");
    }
    for (int k = 0; k < n; k++) best[k] = po->partition[k];
    gp_pipeline_opts trial = *po;
    const double t0 = gp_cli_now();
    char why[512] = "";
    trial.partition = best;
    if (!trial_once(cmd, d, oo, &trial, steps, &out->step_s, why, sizeof why)) {
        printf("plan auto: the plan could not be timed by running it (%s); its step is the "
               "modelled one\n", why);
        free(cut);
        free(best);
        return GP_CLI_EXIT_OK;
    }
    out->tried = 1;
    /* Each cut next to the best so far, until none is faster or the next trial would pass the
     * budget. A cut that ran more than 3% faster runs again, alternating with the best, and
     * replaces it only if faster again: one fast run may be the host's (its cores change
     * speed within seconds), not the cut's. */
    bool better = true;
    int undo = -1; /* the move back to a cut timed already */
    while (better) {
        better = false;
        for (int j = 0; j < 2 * (n - 1); j++) {
            if (j == undo || !moved_cut(best, n, L, j, cut)) continue;
            if (gp_cli_now() - t0 + (steps + 1) * out->step_s > budget_s) break;
            gp_plan fits;
            trial.partition = cut;
            if (gp_plan_make(m, batch, oo, &trial, 1.0, &fits) != GP_OK) continue; /* memory */
            gp_plan_free(&fits);
            double s = 0, again = 0, incumbent = 0;
            out->tried++;
            if (!trial_once(cmd, d, oo, &trial, steps, &s, why, sizeof why) ||
                s >= 0.97 * out->step_s)
                continue; /* a cut that cannot run does not fit */
            if (gp_cli_now() - t0 + 2 * (steps + 1) * out->step_s > budget_s) break;
            trial.partition = best;
            const bool inc_ok = trial_once(cmd, d, oo, &trial, steps, &incumbent, why, sizeof why);
            trial.partition = cut;
            if (!inc_ok || !trial_once(cmd, d, oo, &trial, steps, &again, why, sizeof why))
                continue;
            out->tried += 2;
            out->step_s = (out->step_s + incumbent) / 2;
            if (again >= 0.97 * incumbent) continue;
            for (int k = 0; k < n; k++) best[k] = cut[k];
            out->step_s = (s + again) / 2;
            out->moved = better = true;
            undo = j ^ 1;
            break;
        }
    }
    out->seconds = gp_cli_now() - t0;
    out->steps = steps;
    out->first = best;
    free(cut);
    return GP_CLI_EXIT_OK;
}
