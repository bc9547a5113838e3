/* `gpipe plan`: partitions a model into K pipeline cells and simulates the schedule without
 * training: one table row per cell (layers, parameters, time, bytes by category) and the
 * predicted step time and bubble, optionally as a JSON report. */
#include <errno.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli.h"

typedef struct plan_opts {
    const char *model, *optimizer, *report, *device;
    gp_cli_pipeline_args pipe; /* --stages --schedule --remat --partition --tensor-parallel
                                  --precision */
    int micro_batches, batch, data_parallel, threads, devices, top;
    uint64_t memory_limit;
    double gflops, bandwidth;
} plan_opts;

enum { NOPTS = 22 };

static int make_table(gp_cli_opt t[NOPTS], plan_opts *o) {
    gp_cli_opt pipe[GP_CLI_PIPELINE_NOPTS];
    gp_cli_pipeline_options(pipe, &o->pipe, "1");
    gp_cli_opt tab[NOPTS] = {
        {"--model", GP_CLI_STRING, &o->model, "NAME|FILE",
         "convnet, transformer, gpt2, or a JSON model file (required)", NULL, 0, false, NULL, false, 0,
         false},
        pipe[0], /* --stages */
        {"--micro-batches", GP_CLI_INT, &o->micro_batches, "M",
         "micro-batches per mini-batch (must divide --batch)", "1", 1, false, NULL,
         false, 0, false},
        {"--batch", GP_CLI_INT, &o->batch, "N",
         "examples per mini-batch (images or sequences)",
         "128 classifier, 32 language model", 1, false, NULL, false, 0, false},
        pipe[1], /* --schedule */
        pipe[2], /* --remat */
        pipe[3], /* --partition */
        pipe[4], /* --balance */
        pipe[6], /* --tensor-parallel */
        pipe[7], /* --chunks */
        pipe[8], /* --grad-sum: the tree's partial sums are in the gradients column */
        pipe[9], /* --precision: what the activations take (a bf16 GPU's attention, a bf16
                    device's Transformer blocks) */
        {"--data-parallel", GP_CLI_INT, &o->data_parallel, "D",
         "replicas, each on its slice of the batch (a gradient all-reduce)", "1", 1, false, NULL,
         false, GP_MAX_DEVICES, false},
        {"--bandwidth", GP_CLI_FLOAT, &o->bandwidth, "GB/S",
         "links the collectives cross, to time them (0: count bytes only)", "10", 0, false, NULL,
         false, 0, false},
        {"--memory-limit", GP_CLI_BYTES, &o->memory_limit, "BYTES",
         "per-device bytes no cell may exceed (512M, 2GiB...)", "none", 0, false,
         NULL, false, 0, false},
        {"--threads", GP_CLI_INT, &o->threads, "N",
         "threads of each stage's device, which size its kernels' workspace (as train's "
         "--threads per stage)",
         "1", 1, false, NULL, false, GP_MAX_STAGE_THREADS, false},
        {"--optimizer", GP_CLI_CHOICE, &o->optimizer, "sgd|adamw",
         "state counted: sgd momentum 1, adamw 2 per param",
         "sgd classifier, adamw language model", 0, false, "sgd|adamw", false, 0, false},
        {"--gflops", GP_CLI_FLOAT, &o->gflops, "X",
         "rate turning FLOP estimates into seconds",
         "measure a 2048^3 sgemm on 1 thread", 0, true, NULL, false, 0, false},
        {"--report", GP_CLI_STRING, &o->report, "FILE.json", "write a JSON report (atomically)",
         "none", 0, false, NULL, false, 0, false},
        {"--devices", GP_CLI_INT, &o->devices, "N",
         "search plans of D x K x T = N devices: every K, D, M (dividing --batch), schedule and "
         "remat mode not given; list the fastest that fit, then show the fastest in full",
         "no search: the plan of the options given", 1, false, NULL, false, GP_MAX_DEVICES, false},
        {"--top", GP_CLI_INT, &o->top, "N", "with --devices: how many of the fastest to list", "5",
         1, false, NULL, false, 0, false},
        {"--device", GP_CLI_CHOICE, &o->device, "cpu|cuda",
         "the stage devices' kind, which sizes their kernels' workspace; cuda: planned against "
         "the free memory of the GPUs here (shared by the stages on each) unless --memory-limit, "
         "times at GPU 0's fp32 GEMM rate unless --gflops (needs a GPU)",
         "cpu", 0, false, "cpu|cuda", false, 0, false},
    };
    memcpy(t, tab, sizeof tab);
    return NOPTS;
}

static void print_help(const gp_cli_opt *tab, int n) {
    printf("Usage: gpipe plan --model convnet|transformer|FILE.json --stages K\n"
           "                  --micro-batches M [options]\n\n"
           "Plans a GPipe pipeline without training: partitions the layers into K contiguous\n"
           "cells that minimize the slowest cell's FLOPs (or, with --balance time, its\n"
           "forward+backward time measured layer by layer first) within the per-device memory\n"
           "limit (or checks --partition), then simulates the schedule: the same cells\n"
           "`gpipe train` picks for the same options. Prints one row per cell:\n"
           "its layers, trainable parameters, the forward+backward time of one micro-batch,\n"
           "busy time per step (with recomputation), and bytes of parameters, gradients,\n"
           "optimizer state, peak activations, transient buffers (the backward's gradients\n"
           "and kernel workspace at its peak, and messages sent but not yet taken) and their\n"
           "total, an upper bound on what the stage's device will count; then the predicted\n"
           "step time and the bubble beside (K-1)/(M+K-1). Times assume the --gflops rate and\n"
           "leave the optimizer step out; with --balance time the optimizer step is timed too\n"
           "(one step of the optimizer over 2^22 elements, per parameter: column opt/step) and\n"
           "each stage runs its own after its last backward, and the layer times are scaled by\n"
           "how much slower the slowest layer runs inside a stage, on every device of the plan\n"
           "at once, than timed alone (a stage's share of the copies of it, with the\n"
           "micro-batches in flight that make 16 examples, forwards then backwards; 5 rounds).\n"
           "Times are CPU time: other processes' use of the cores is not the plan's.\n"
           "With --device cuda, stages on fewer GPUs (stage k on GPU k mod count) share them:\n"
           "the step is at least the busy times of one GPU's stages together.\n\n"
           "On a mesh of D x K x T devices (--data-parallel D, --tensor-parallel T) every row is\n"
           "one device's: its shard of the stage's layers (split Transformer blocks, embedding\n"
           "and vocabulary head; the rest replicated) on its replica's slice of the batch, with\n"
           "the bytes it gives per step to each mesh axis: the tensor axis's all-reduces (two\n"
           "per block forward, two backward, two more per recomputed forward), the activations\n"
           "and gradients to the neighbouring stages, and its gradients to the replicas'\n"
           "all-reduce; at --bandwidth their ring all-reduce time, 2 (n - 1) / n of the bytes\n"
           "each way, joins the step time.\n\n"
           "With --devices N it searches instead: every number of stages K dividing N / T,\n"
           "D = N / (K T) replicas, every M dividing the replica's batch, every schedule\n"
           "(interleaved with 2, 3 and 4 cells per stage) and the remat modes (cell, none, and\n"
           "selective under --memory-limit), each planned as above; options given among\n"
           "--stages, --micro-batches, --data-parallel, --schedule, --chunks and --remat are\n"
           "kept fixed. It lists the --top fastest predicted steps that fit\n"
           "(ties: fewer micro-batches, then fewer bytes on the fullest device and stages) and\n"
           "shows the fastest in full; `gpipe train --plan auto` trains with that choice.\n\n"
           "Options:\n");
    gp_cli_print_options(tab, n, stdout);
    printf("\nExit status: 0 success, 1 impossible plan or runtime failure, 2 bad usage.\n");
}

/* "12.3 us", "4.56 ms", "1.234 s" */
static const char *fmt_time(double s, char *buf, size_t n) {
    if (s < 1e-3)
        snprintf(buf, n, "%.1f us", s * 1e6);
    else if (s < 1.0)
        snprintf(buf, n, "%.2f ms", s * 1e3);
    else
        snprintf(buf, n, "%.3f s", s);
    return buf;
}

static void print_plan(const gp_plan *p, double bandwidth, int64_t tokens_per_example) {
    char a[32], b[32], c[32], d[32], e[32], f[32], g[32], h[32], o[32];
    printf("%5s  %-9s %5s %11s %10s %10s %10s %10s %10s %10s %10s %10s %10s\n", "stage", "layers",
           "remat", "parameters", "time/mb", "opt/step", "busy/step", "params", "grads",
           "optimizer", "peak act", "transient", "total");
    /* V cells per stage: one row per cell in pipeline order, cell c on stage c mod K */
    for (int k = 0; k < p->ncells; k++) {
        const gp_plan_cell *x = &p->cells[k];
        char layers[24];
        snprintf(layers, sizeof layers, "%d-%d", x->first, x->last);
        printf("%5d  %-9s %5s %11lld %10s %10s %10s %10s %10s %10s %10s %10s %10s\n", x->stage,
               layers, gp_remat_name(x->remat), (long long)x->nparams,
               fmt_time(x->time_s, a, sizeof a),
               x->opt_s > 0 ? fmt_time(x->opt_s, o, sizeof o) : "-",
               fmt_time(x->busy_s, b, sizeof b), gp_cli_fmt_bytes(x->param_bytes, c, sizeof c),
               gp_cli_fmt_bytes(x->grad_bytes, d, sizeof d),
               gp_cli_fmt_bytes(x->optim_bytes, e, sizeof e),
               gp_cli_fmt_bytes(x->peak_act_bytes, f, sizeof f),
               gp_cli_fmt_bytes(x->transient_bytes, h, sizeof h),
               gp_cli_fmt_bytes(x->total_bytes, g, sizeof g));
    }
    if (p->chunks > 1)
        printf("(V = %d cells per stage: rows are cells in pipeline order, each on its stage; "
               "busy is the stage's, a stage's device holds its cells' bytes together)\n",
               p->chunks);
    const uint64_t worst = gp_plan_fullest_bytes(p);
    if (p->tensor_parallel > 1 || p->data_parallel > 1 || p->stages > 1) {
        printf("bytes per step per device on each mesh axis:\n%5s  %14s %14s %14s\n", "stage",
               "tensor", "pipeline", "data");
        for (int k = 0; k < p->ncells; k++)
            printf("%5d  %14llu %14llu %14llu\n", p->cells[k].stage,
                   (unsigned long long)p->cells[k].tensor_bytes,
                   (unsigned long long)p->cells[k].pipe_bytes,
                   (unsigned long long)p->cells[k].data_bytes);
    }
    printf("predicted step %s; bubble %.4f simulated, %s = %.4f\n",
           fmt_time(p->step_s, a, sizeof a), p->bubble_simulated,
           p->chunks > 1 ? "(K-1)/(VM+K-1)" : "(K-1)/(M+K-1)", p->bubble_theory);
    const double ex_s = p->step_s > 0 ? (double)p->batch / p->step_s : 0.0;
    if (p->tensor_parallel > 1 || p->data_parallel > 1)
        printf("of it collectives %s at %g GB/s\n", fmt_time(p->comm_s, b, sizeof b), bandwidth);
    if (tokens_per_example > 0)
        printf("predicted %.0f tokens/s (%.2f sequences/s)\n", ex_s * (double)tokens_per_example,
               ex_s);
    else
        printf("predicted %.1f examples/s\n", ex_s);
    printf("%s %s", p->chunks > 1 ? "fullest stage" : "largest cell",
           gp_cli_fmt_bytes(worst, b, sizeof b));
    if (p->memory_limit)
        printf(" of the %s per-device limit\n", gp_cli_fmt_bytes(p->memory_limit, c, sizeof c));
    else
        printf(" (no memory limit)\n");
}

static cJSON *build_report(const plan_opts *o, const gp_model *m, const gp_plan *p,
                           bool measured) {
    cJSON *r = cJSON_CreateObject();
    cJSON_AddStringToObject(r, "command", "plan");
    cJSON_AddStringToObject(r, "model", o->model);
    cJSON_AddStringToObject(r, "gpipe_version", gp_version());
    cJSON_AddNumberToObject(r, "nlayers", gp_model_nlayers(m));
    cJSON_AddNumberToObject(r, "nparams", (double)gp_model_nparams(m));
    cJSON_AddNumberToObject(r, "batch", (double)p->batch);
    cJSON_AddNumberToObject(r, "micro_batch_size", (double)p->micro_batch_size);
    cJSON_AddStringToObject(r, "optimizer", o->optimizer);
    cJSON_AddNumberToObject(r, "gflops_assumed", p->gflops_assumed);
    cJSON_AddBoolToObject(r, "gflops_measured", measured);
    if (measured) gp_cli_report_blas_core(r);
    cJSON *pl = cJSON_AddObjectToObject(r, "pipeline");
    cJSON_AddNumberToObject(pl, "stages", p->stages);
    cJSON_AddNumberToObject(pl, "tensor_parallel", p->tensor_parallel);
    cJSON_AddNumberToObject(pl, "data_parallel", p->data_parallel);
    cJSON_AddNumberToObject(pl, "link_gbytes_per_s", o->bandwidth);
    cJSON_AddNumberToObject(pl, "micro_batches", p->micro_batches);
    cJSON_AddStringToObject(pl, "schedule", gp_schedule_kind_name(p->schedule));
    cJSON_AddNumberToObject(pl, "chunks", p->chunks);
    cJSON_AddStringToObject(pl, "remat", gp_remat_name(p->remat));
    cJSON_AddStringToObject(pl, "grad_sum", o->pipe.grad_sum ? o->pipe.grad_sum : "sequential");
    cJSON_AddStringToObject(pl, "balance", gp_balance_name(p->balance));
    gp_cli_report_u64(pl, "memory_limit_bytes", p->memory_limit);
    cJSON *part = cJSON_AddArrayToObject(pl, "partition");
    for (int k = 0; k < p->ncells; k++)
        cJSON_AddItemToArray(part, cJSON_CreateNumber(p->cells[k].first));
    cJSON *cells = cJSON_AddArrayToObject(pl, "cells");
    for (int k = 0; k < p->ncells; k++) {
        const gp_plan_cell *x = &p->cells[k];
        cJSON *c = cJSON_CreateObject();
        cJSON_AddNumberToObject(c, "stage", x->stage);
        cJSON_AddNumberToObject(c, "chunk", x->chunk);
        cJSON_AddNumberToObject(c, "first", x->first);
        cJSON_AddNumberToObject(c, "last", x->last);
        cJSON_AddStringToObject(c, "remat", gp_remat_name(x->remat));
        cJSON_AddNumberToObject(c, "nparams", (double)x->nparams);
        cJSON_AddNumberToObject(c, "fwd_flops", x->fwd_flops);
        cJSON_AddNumberToObject(c, "bwd_flops", x->bwd_flops);
        cJSON_AddNumberToObject(c, "time_s", x->time_s);
        cJSON_AddNumberToObject(c, "opt_s", x->opt_s);
        cJSON_AddNumberToObject(c, "busy_s", x->busy_s);
        cJSON_AddNumberToObject(c, "idle_s", x->idle_s);
        cJSON_AddNumberToObject(c, "busy_fraction", p->step_s > 0 ? x->busy_s / p->step_s : 0);
        cJSON_AddNumberToObject(c, "peak_in_flight", x->peak_in_flight);
        cJSON *bytes = cJSON_AddObjectToObject(c, "peak_bytes");
        gp_cli_report_u64(bytes, "parameters", x->param_bytes);
        gp_cli_report_u64(bytes, "gradients", x->grad_bytes);
        gp_cli_report_u64(bytes, "optimizer_state", x->optim_bytes);
        gp_cli_report_u64(bytes, "activations", x->peak_act_bytes);
        gp_cli_report_u64(bytes, "transient", x->transient_bytes);
        gp_cli_report_u64(bytes, "total", x->total_bytes);
        cJSON *axis = cJSON_AddObjectToObject(c, "bytes_per_step");
        gp_cli_report_u64(axis, "tensor", x->tensor_bytes);
        gp_cli_report_u64(axis, "pipeline", x->pipe_bytes);
        gp_cli_report_u64(axis, "data", x->data_bytes);
        cJSON_AddItemToArray(cells, c);
    }
    cJSON_AddNumberToObject(pl, "step_s", p->step_s);
    cJSON_AddNumberToObject(pl, "comm_s", p->comm_s);
    cJSON_AddNumberToObject(pl, "bubble_simulated", p->bubble_simulated);
    cJSON_AddNumberToObject(pl, "bubble_theory", p->bubble_theory);
    return r;
}

int gp_cli_plan_main(int argc, char **argv) {
    plan_opts o = {.pipe.stages = 1, .micro_batches = 1, .data_parallel = 1, .threads = 1,
                   .bandwidth = 10};
    gp_cli_opt tab[NOPTS];
    int n = make_table(tab, &o);
    int rc = gp_cli_parse(tab, n, argc, argv, 2, "plan");
    if (rc == GP_CLI_HELP) {
        print_help(tab, n);
        return GP_CLI_EXIT_OK;
    }
    if (rc != GP_CLI_PARSED) return rc;
    if (!o.model)
        return gp_cli_usage_error("plan", "--model: required (convnet, transformer, gpt2 or FILE.json)");
    const bool search = gp_cli_seen(tab, n, "--devices");
    if (!search && gp_cli_seen(tab, n, "--top"))
        return gp_cli_usage_error("plan", "--top: only with --devices N (a search)");
    if (search && gp_cli_seen(tab, n, "--partition"))
        return gp_cli_usage_error("plan", "--partition: fits one plan only, not a search over "
                                          "--devices (leave it out, or give --stages K alone)");
    const gp_cli_path report = {"--report", o.report, GP_CLI_PATH_READ};
    const gp_cli_path model = {"--model", gp_cli_model_path(o.model), GP_CLI_PATH_READ};
    rc = gp_cli_check_outputs("plan", &report, 1, &model, 1);
    if (rc != GP_CLI_EXIT_OK) return rc;
    int *first = NULL;
    gp_pipeline_opts po;
    /* The batch is model-dependent: the options with it are checked below. */
    rc = gp_cli_pipeline_resolve("plan", &o.pipe, o.micro_batches, 0, o.memory_limit, &po,
                                 &first);
    if (rc != GP_CLI_EXIT_OK) {
        free(first);
        return rc;
    }

    gp_model *m = NULL;
    gp_plan p = {0};
    gp_plan_search_result found = {0};
    cJSON *search_json = NULL;
    cJSON *r = NULL;
    rc = gp_cli_load_model("plan", o.model, &m);
    if (rc != GP_CLI_EXIT_OK) goto done;
    const bool lm = gp_model_input_dtype(m) == GP_I32;
    if (!gp_cli_seen(tab, n, "--batch")) o.batch = lm ? 32 : 128;
    if (!o.optimizer) o.optimizer = lm ? "adamw" : "sgd";
    po.data_parallel = o.data_parallel;
    po.link_gbytes_per_s = o.bandwidth;
    po.stage_threads = o.threads;
    char gpu_limit[256] = "";
    if (o.device) (void)gp_device_type_parse(o.device, &po.device_type); /* a --device choice */
    const bool gpu = po.device_type != GP_DEVICE_CPU;
    if (gpu && po.balance == GP_BALANCE_TIME) {
        rc = gp_cli_usage_error("plan", "--balance time with --device %s: layers are timed on "
                                        "the CPU only (leave --balance out)", o.device);
        goto done;
    }
    int count = 0;
    if (gp_device_type_count(po.device_type, &count) != GP_OK) {
        fprintf(stderr, "gpipe plan: --device %s: %s\n", o.device ? o.device : "cpu",
                gp_last_error());
        rc = GP_CLI_EXIT_RUNTIME;
        goto done;
    }
    if (gpu && !gp_cli_seen(tab, n, "--memory-limit")) {
        /* What a stage device of the kind can count on, as the training's default plans. */
        const int64_t mesh = (int64_t)(po.stages > 0 ? po.stages : 1) * o.data_parallel *
                             (po.tensor_parallel > 0 ? po.tensor_parallel : 1);
        uint64_t unit = 0;
        char why[256], a[32], b[32];
        po.memory_limit = gp_cli_stage_device_bytes(po.device_type, mesh < INT_MAX ? (int)mesh
                                                                                   : INT_MAX,
                                                    &unit, why, sizeof why);
        if (po.memory_limit == 0) {
            fprintf(stderr, "gpipe plan: --device %s: %s (give --memory-limit)\n", o.device, why);
            rc = GP_CLI_EXIT_RUNTIME;
            goto done;
        }
        snprintf(gpu_limit, sizeof gpu_limit, "memory limit %s per stage device: %s free on the "
                 "GPU with the least per stage device, shared by %lld",
                 gp_cli_fmt_bytes(po.memory_limit, a, sizeof a),
                 gp_cli_fmt_bytes(unit, b, sizeof b), (long long)mesh);
    }
    rc = gp_cli_pipeline_check("plan", m, o.batch, &po);
    if (rc != GP_CLI_EXIT_OK) goto done;
    gp_optim_opts oo = strcmp(o.optimizer, "adamw") == 0 ? gp_adamw_defaults(3e-4f, 0.01f)
                                                          : gp_sgd_defaults(0.05f, 0.9f);
    const bool by_time = po.balance == GP_BALANCE_TIME;
    if (by_time && gp_cli_seen(tab, n, "--gflops")) {
        rc = gp_cli_usage_error("plan", "--gflops with --balance time: times are measured, not "
                                        "derived from FLOPs");
        goto done;
    }
    double *times = NULL, contention = 1.0;
    if (by_time && !search) { /* a search times the layers at each micro-batch size itself */
        const int L = gp_model_nlayers(m);
        printf("profiling each of the %d layers' forward and backward (micro-batch %d, one "
               "thread)...\n", L, o.batch / (o.micro_batches * o.data_parallel));
        fflush(stdout);
        /* a split backward (zbh1, zbv) is timed as it runs, in its two parts */
        const bool split = po.schedule == GP_SCHEDULE_ZBH1 || po.schedule == GP_SCHEDULE_ZBV;
        const int64_t mb = o.batch / (o.micro_batches * o.data_parallel);
        times = calloc(4 * (size_t)L, sizeof *times);
        if (!times || (split ? gp_model_profile_layers_split(m, mb, 0, times)
                             : gp_model_profile_layers(m, mb, 0, times)) != GP_OK) {
            rc = times ? gp_cli_fail("plan", "--balance time") : gp_cli_fail("plan", "out of memory");
            free(times);
            goto done;
        }
        po.layer_times = times;
        po.layer_times_split = split;
        /* every stage device at work at once runs each layer slower than the profile alone */
        const int64_t mesh = (int64_t)po.stages * o.data_parallel *
                             (po.tensor_parallel > 0 ? po.tensor_parallel : 1);
        const int devices = mesh < INT_MAX ? (int)mesh : INT_MAX;
        if (gp_layer_times_contend(m, mb, devices, split ? 4 : 2, times, &contention) != GP_OK) {
            rc = gp_cli_fail("plan", "timing the layers on every device at once");
            free(times);
            goto done;
        }
        if (gp_optim_profile(&oo, 0, 0, &po.optim_s_per_param) != GP_OK) {
            rc = gp_cli_fail("plan", "timing the optimizer step");
            free(times);
            goto done;
        }
    }
    const bool measure = !by_time && !gp_cli_seen(tab, n, "--gflops");
    if (measure && gpu) { /* GPU 0's own fp32 GEMM, as gpipe bench's ceiling */
        gp_device *g = NULL;
        gp_status gs = gp_device_type_new(po.device_type, "plan-gemm", 0, 1, &g);
        if (gs == GP_OK) gs = gp_device_gemm_rate(g, GP_CLI_GPU_CEILING_N, 3, &o.gflops);
        if (g) gp_device_free(g);
        if (gs != GP_OK) {
            fprintf(stderr, "gpipe plan: timing the GPU's GEMM: %s (give --gflops)\n",
                    gp_last_error());
            rc = GP_CLI_EXIT_RUNTIME;
            goto done;
        }
    } else if (measure) {
        char why[256]; /* a stage device's default: one thread */
        if (!gp_cli_bench_sgemm(2048, 2048, 2048, 1, false, 2, &o.gflops, why, sizeof why)) {
            fprintf(stderr, "gpipe plan: %s (give --gflops)\n", why);
            rc = GP_CLI_EXIT_RUNTIME;
            goto done;
        }
    }
    if (search) {
        const gp_plan_search_opts so = {
            .devices = o.devices,
            .stages = gp_cli_seen(tab, n, "--stages") ? po.stages : 0,
            .micro_batches = gp_cli_seen(tab, n, "--micro-batches") ? o.micro_batches : 0,
            .data_parallel = gp_cli_seen(tab, n, "--data-parallel") ? o.data_parallel : 0,
            .schedules = gp_cli_seen(tab, n, "--schedule") ? 1u << po.schedule : 0,
            .chunks = gp_cli_seen(tab, n, "--chunks") ? po.chunks : 0,
            .remats = gp_cli_seen(tab, n, "--remat") ? 1u << po.remat : 0,
            .max_plans = o.top ? o.top : 5};
        rc = gp_cli_plan_search("plan", m, o.batch, &oo, &po, o.gflops, so, false, &found);
        if (rc != GP_CLI_EXIT_OK) goto done;
        gp_cli_plan_search_print(&found, o.devices, lm ? gp_model_example_shape(m).dim[0] : 0);
        search_json = gp_cli_plan_search_json(&found, o.devices);
        printf("\nthe fastest in full:\n");
        p = found.plans[0]; /* moved out: freed below as p */
        memset(&found.plans[0], 0, sizeof found.plans[0]);
    }
    gp_status s = search ? GP_OK : gp_plan_make(m, o.batch, &oo, &po, o.gflops, &p);
    free(times);
    po.layer_times = NULL;
    if (s != GP_OK) {
        /* A list that does not fit the model (out of order, past the last layer) is a bad value
         * of --partition; anything else (K > L, a memory limit no split meets) is impossible. */
        if (first && s == GP_INVALID_ARGUMENT && po.stages <= gp_model_nlayers(m))
            rc = gp_cli_usage_error("plan", "--partition %s: %s", o.pipe.partition, gp_last_error());
        else
            fprintf(stderr, "gpipe plan: %s\n", gp_last_error()), rc = GP_CLI_EXIT_RUNTIME;
        goto done;
    }
    printf("gpipe plan: model %s (%d layers, %lld parameters), batch %d in %d micro-batch%s of "
           "%lld\n",
           o.model, gp_model_nlayers(m), (long long)gp_model_nparams(m), o.batch,
           p.micro_batches, p.micro_batches == 1 ? "" : "es", (long long)p.micro_batch_size);
    if (p.tensor_parallel > 1 || p.data_parallel > 1)
        printf("mesh D x K x T = %d x %d x %d devices: every row is one device's (a shard's "
               "layers on its replica's slice)\n",
               p.data_parallel, p.stages, p.tensor_parallel);
    printf("K = %d stages, schedule %s, remat %s, optimizer %s%s; %s\n", p.stages,
           gp_schedule_kind_name(p.schedule), gp_remat_name(p.remat), o.optimizer,
           po.grad_sum == GP_GRAD_SUM_TREE ? ", gradient sum tree" : "",
           first ? "partition given" : by_time ? "cells balanced by measured time" : "cells balanced by FLOPs");
    if (by_time) {
        printf("times measured layer by layer now (mean CPU time of 6 runs, one thread%s), scaled "
               "by how much slower a layer runs in a stage of the devices at work at once",
               search ? ", at each micro-batch size" : "");
        if (search)
            printf("\n");
        else
            printf(" (x%.3f)\n", contention);
    } else {
        printf("times at %.1f GFLOP/s (%s)\n", p.gflops_assumed,
               !measure ? "--gflops"
               : gpu    ? "a 4096^3 fp32 GEMM on GPU 0, measured now"
                        : "a 2048^3 sgemm on 1 thread, measured now");
    }
    if (gpu) {
        printf("stage devices: %s%s%s\n", gp_device_type_name(po.device_type),
               gpu_limit[0] ? "; " : "", gpu_limit);
    }
    print_plan(&p, o.bandwidth, lm ? gp_model_example_shape(m).dim[0] : 0);
    fflush(stdout);
    if (o.report) {
        r = build_report(&o, m, &p, measure);
        if (search_json) cJSON_AddItemToObject(r, "search", search_json), search_json = NULL;
        if (!gp_cli_report_write("plan", r, o.report, "--report"))
            rc = GP_CLI_EXIT_RUNTIME;
        else
            printf("report written to %s\n", o.report);
    }
done:
    cJSON_Delete(search_json);
    cJSON_Delete(r);
    gp_plan_search_free(&found);
    gp_plan_free(&p);
    gp_model_free(m);
    free(first);
    return rc;
}
