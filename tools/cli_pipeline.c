/* Pipeline options shared by `gpipe plan` and `gpipe train` (--stages,
 * --schedule, --remat, --partition, --tensor-parallel, --grad-sum, --precision): one set of table entries and one
 * translation into gp_pipeline_opts, so the two commands agree; and, for
 * train, the report's `pipeline` object, the summary lines and the last step's
 * --trace / --timeline files. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli.h"

enum { MAX_CELLS = 4096 };

void gp_cli_pipeline_options(gp_cli_opt out[GP_CLI_PIPELINE_NOPTS], gp_cli_pipeline_args *a,
                             const char *stages_default) {
    gp_cli_opt tab[GP_CLI_PIPELINE_NOPTS] = {
        {"--stages", GP_CLI_INT, &a->stages, "K", "pipeline stages (cells of contiguous layers)",
         stages_default, 1, false, NULL, false, GP_MAX_DEVICES, false},
        {"--schedule", GP_CLI_CHOICE, &a->schedule, "gpipe|1f1b|zbh1|interleaved|zbv",
         "fill-drain (all forwards, then backwards), 1F1B, zero bubble H1 (1F1B with each "
         "backward split: weight gradients run where 1F1B idles), interleaved 1F1B (--chunks "
         "cells per stage; M a multiple of K), or zero bubble V (2 cells per stage, down the "
         "stages and back up, backwards split)",
         "gpipe", 0, false, "gpipe|1f1b|zbh1|interleaved|zbv", false, 0, false},
        {"--remat", GP_CLI_CHOICE, &a->remat, "cell|none|selective",
         "cell: stash inputs, recompute; none: keep all state; selective: none in the cells "
         "that fit the memory limit so, cell in the others",
         "cell", 0, false, "cell|none|selective", false, 0, false},
        {"--partition", GP_CLI_STRING, &a->partition, "LIST",
         "first layer of each cell, e.g. 0,5,9 (no balancing)", "balanced (see --balance)", 0,
         false, NULL, false, 0, false},
        {"--balance", GP_CLI_CHOICE, &a->balance, "cost|time",
         "balance cells by FLOP estimates, or by per-layer times measured first", "cost", 0,
         false, "cost|time", false, 0, false},
        {"--pin", GP_CLI_CHOICE, &a->pin, "auto|off",
         "auto: each stage's (shard's) thread on a core of its own, worker w on the w-th core "
         "(one hardware thread of each physical core first), when there are >= K x T x --threads "
         "cores",
         "auto", 0, false,
         "auto|off", false, 0, false},
        {"--tensor-parallel", GP_CLI_INT, &a->tensor_parallel, "T",
         "split each stage's layers over T devices (heads, d_ff, vocabulary)", "1", 1, false,
         NULL, false, GP_MAX_DEVICES, false},
        {"--chunks", GP_CLI_INT, &a->chunks, "V",
         "interleaved: cells per stage (the model is cut into K x V cells, cell v K + k on "
         "stage k)",
         "2 interleaved and zbv, 1 otherwise", 1, false, NULL, false, 0, false},
        {"--grad-sum", GP_CLI_CHOICE, &a->grad_sum, "sequential|tree",
         "how the weight gradients add over the micro-batches and the --data-parallel "
         "replicas: in micro-batch order (bitwise for every --stages, --schedule and --remat at "
         "one --data-parallel), or as a fixed binary tree over the mini-batch's micro-batches "
         "(bitwise for every power-of-two --data-parallel too; log2 of the micro-batches' even "
         "part more gradient buffers per cell); checkpoints keep it",
         "sequential", 0, false, "sequential|tree", false, 0, false},
        {"--precision", GP_CLI_CHOICE, &a->precision, "fp32|bf16",
         "the matrix products of the linear layers and attention: fp32, or bf16 operands (each "
         "rounded to bfloat16, to nearest even) with fp32 sums into fp32 results, as PyTorch's "
         "bf16 autocast and TPUs multiply (on a GPU, its tensor cores); parameters, gradients, "
         "optimizer state and activations stay fp32, as does every other op, but for the "
         "Transformer blocks' activations that are only products' operands, kept in bf16 (half "
         "the bytes, the same bits); checkpoints keep it",
         "fp32", 0, false, "fp32|bf16", false, 0, false},
    };
    memcpy(out, tab, sizeof tab);
}

gp_schedule_kind gp_cli_schedule_kind(const char *name) {
    gp_schedule_kind kind = GP_SCHEDULE_GPIPE;
    if (name) (void)gp_schedule_kind_parse(name, &kind);
    return kind;
}

int gp_cli_pipeline_check(const char *cmd, const gp_model *m, int64_t batch,
                          const gp_pipeline_opts *po) {
    const char *field = NULL;
    if (gp_pipeline_opts_check(m, batch, po, &field) == GP_OK) return GP_CLI_EXIT_OK;
    char msg[1024];
    snprintf(msg, sizeof msg, "%s", gp_last_error());
    const size_t n = field ? strlen(field) : 0;
    if (n && strncmp(msg, field, n) == 0) /* the library's field, in the option's name */
        return gp_cli_usage_error(cmd, "%s%s", gp_cli_option_of(field), msg + n);
    return gp_cli_usage_error(cmd, "%s", msg);
}

int gp_cli_pipeline_resolve(const char *cmd, const gp_cli_pipeline_args *a, int micro_batches,
                            int64_t batch, uint64_t memory_limit, gp_pipeline_opts *po,
                            int **first) {
    const int K = a->stages > 0 ? a->stages : 1;
    *first = NULL;
    const bool by_time = a->balance && strcmp(a->balance, "time") == 0;
    if (a->partition && a->balance)
        return gp_cli_usage_error(cmd, "--partition %s with --balance %s: a given partition is "
                                       "not balanced; use one or the other",
                                  a->partition, a->balance);
    *po = (gp_pipeline_opts){
        .stages = K,
        .micro_batches = micro_batches,
        .schedule = gp_cli_schedule_kind(a->schedule),
        .chunks = a->chunks,
        .remat = !a->remat                          ? GP_REMAT_CELL
                 : strcmp(a->remat, "none") == 0      ? GP_REMAT_NONE
                 : strcmp(a->remat, "selective") == 0 ? GP_REMAT_SELECTIVE
                                                      : GP_REMAT_CELL,
        .grad_sum = a->grad_sum && strcmp(a->grad_sum, "tree") == 0 ? GP_GRAD_SUM_TREE
                                                                     : GP_GRAD_SUM_SEQUENTIAL,
        .precision = a->precision && strcmp(a->precision, "bf16") == 0 ? GP_PRECISION_BF16
                                                                        : GP_PRECISION_FP32,
        .memory_limit = memory_limit,
        .batch = batch,
        .balance = by_time ? GP_BALANCE_TIME : GP_BALANCE_COST,
        .no_pinning = a->pin && strcmp(a->pin, "off") == 0,
        .tensor_parallel = a->tensor_parallel > 0 ? a->tensor_parallel : 1,
    };
    /* what the options say alone; the model and the batch are checked where they are known */
    int rc = gp_cli_pipeline_check(cmd, NULL, 0, po);
    if (rc != GP_CLI_EXIT_OK) return rc;
    int V = 1; /* cells per stage: the schedule's, or --chunks where it takes several (checked) */
    (void)gp_schedule_kind_chunks(po->schedule, po->chunks, &V);
    if (a->partition) {
        int n = 0;
        *first = malloc(MAX_CELLS * sizeof **first);
        if (!*first) {
            fprintf(stderr, "gpipe %s: out of host memory\n", cmd);
            return GP_CLI_EXIT_RUNTIME;
        }
        char why[512];
        if (!gp_cli_parse_partition(a->partition, *first, MAX_CELLS, &n, why, sizeof why))
            return gp_cli_usage_error(cmd, "--partition: %s", why);
        const int cells = K * V;
        if (n != cells)
            return gp_cli_usage_error(cmd,
                                      "--partition %s: %d entr%s for --stages %d; expected the "
                                      "first layer of each of the %d cells",
                                      a->partition, n, n == 1 ? "y" : "ies", K, cells);
        po->partition = *first;
    }
    return GP_CLI_EXIT_OK;
}

const char gp_cli_remat_default_text[] =
    "selective against each stage device's memory (--memory-limit, else what the device can "
    "still give shared by the stage devices on it: the host's available memory, a GPU's free "
    "memory; cell under MPI without --memory-limit)";

/* The least that any of the `devices` stage devices can count on: stage device w is device w
 * mod count of the kind (every CPU device the host), so each unit's bytes are shared by the
 * stage devices on it. 0, with the reason in why, where the kind cannot say. */
uint64_t gp_cli_stage_device_bytes(gp_device_type type, int devices, uint64_t *unit_bytes,
                                   char *why, size_t whysize) {
    int count = 0;
    if (gp_device_type_count(type, &count) != GP_OK) {
        snprintf(why, whysize, "%s", gp_last_error());
        return 0;
    }
    uint64_t least = UINT64_MAX;
    for (int unit = 0; unit < count && unit < devices; unit++) {
        uint64_t bytes = 0;
        if (gp_device_type_memory(type, unit, &bytes) != GP_OK) {
            snprintf(why, whysize, "%s", gp_last_error());
            return 0;
        }
        if (bytes == 0) {
            snprintf(why, whysize, "device %d of the kind has no memory free", unit);
            return 0;
        }
        const int sharing = devices / count + (unit < devices % count);
        if (bytes / (uint64_t)sharing < least) {
            least = bytes / (uint64_t)sharing;
            *unit_bytes = bytes;
        }
    }
    return least == UINT64_MAX ? 0 : least;
}

void gp_cli_remat_default(const char *given_by, bool limit_given, int devices,
                          gp_pipeline_opts *po, char *why, size_t whysize) {
    char a[32], b[256];
    uint64_t unit = 0;
    if (given_by) {
        snprintf(why, whysize, "%s (%s)", gp_remat_name(po->remat), given_by);
        return;
    }
    if (limit_given) {
        po->remat = GP_REMAT_SELECTIVE;
        snprintf(why, whysize, "selective (the default) against the --memory-limit of %s per "
                 "stage device", gp_cli_fmt_bytes(po->memory_limit, a, sizeof a));
        return;
    }
    po->remat = GP_REMAT_CELL;
    if (po->launcher == GP_LAUNCHER_MPI) {
        snprintf(why, whysize, "cell (the default under MPI, whose ranks see only their own "
                               "host's memory and must plan alike: --memory-limit plans "
                               "selective)");
        return;
    }
    if (devices < 1) devices = 1;
    const char *kind = gp_device_type_name(po->device_type);
    const uint64_t each = gp_cli_stage_device_bytes(po->device_type, devices, &unit, b, sizeof b);
    if (each == 0) {
        snprintf(why, whysize, "cell (the default: the memory of the %s devices is not known: "
                 "%s; --memory-limit plans selective)", kind, b);
        return;
    }
    po->remat = GP_REMAT_SELECTIVE;
    po->memory_limit = each;
    if (po->device_type == GP_DEVICE_CPU)
        snprintf(why, whysize, "selective (the default) against %s per stage device (%s "
                 "available on the host / %d)", gp_cli_fmt_bytes(each, a, sizeof a),
                 gp_cli_fmt_bytes(unit, b, sizeof b), devices);
    else
        snprintf(why, whysize, "selective (the default) against %s per stage device (%s free "
                 "on the %s device with the least per stage device)",
                 gp_cli_fmt_bytes(each, a, sizeof a), gp_cli_fmt_bytes(unit, b, sizeof b), kind);
}

void gp_cli_remat_print(const gp_pipeline *p, gp_remat mode, const char *why) {
    const int K = gp_pipeline_cells(p);
    printf("remat: %s:", why);
    for (int k = 0; k < K;) {
        const gp_remat r = gp_pipeline_cell_remat(p, k);
        int e = k;
        while (e + 1 < K && gp_pipeline_cell_remat(p, e + 1) == r) e++;
        if (e > k)
            printf("%s cells %d-%d %s", k ? "," : "", k, e, gp_remat_name(r));
        else
            printf("%s cell %d %s", k ? "," : "", k, gp_remat_name(r));
        /* selective's reason for each cell: whether keeping its state fits beside the rest */
        if (mode == GP_REMAT_SELECTIVE)
            printf(" (%s state %s)", e > k ? "their" : "its",
                   r == GP_REMAT_NONE ? "fits" : "would not fit");
        k = e + 1;
    }
    printf("\n");
    fflush(stdout);
}

void gp_cli_pipeline_report(cJSON *root, const gp_cli_train *t) {
    cJSON *pl = cJSON_AddObjectToObject(root, "pipeline");
    const gp_pipeline_opts *po = &t->popts;
    cJSON_AddNumberToObject(pl, "stages", po->stages);
    cJSON_AddNumberToObject(pl, "tensor_parallel", po->tensor_parallel > 0 ? po->tensor_parallel : 1);
    cJSON_AddNumberToObject(pl, "micro_batches", po->micro_batches);
    cJSON_AddStringToObject(pl, "schedule", gp_schedule_kind_name(po->schedule));
    int chunks = 1;
    if (gp_schedule_kind_chunks(po->schedule, po->chunks, &chunks) != GP_OK) chunks = po->chunks;
    cJSON_AddNumberToObject(pl, "chunks", chunks);
    cJSON_AddStringToObject(pl, "remat", gp_remat_name(po->remat));
    gp_cli_report_u64(pl, "memory_limit_bytes", po->memory_limit);
    cJSON_AddStringToObject(pl, "launcher", gp_launcher_name(po->launcher));
    cJSON_AddNumberToObject(pl, "data_parallel", t->place.data_parallel);
    cJSON_AddNumberToObject(pl, "ranks", t->place.nranks);
    /* The cells actually used (balanced or given) come from the last step's stats. */
    gp_pipeline_stats ps;
    gp_stage_stats *ss = calloc((size_t)po->stages, sizeof *ss);
    const bool have = ss && t->pipeline && gp_pipeline_last_stats(t->pipeline, &ps, ss) == GP_OK;
    const int nk = have ? ps.stages : 0;
    if (have) {
        cJSON *part = cJSON_AddArrayToObject(pl, "partition"); /* every cell's first layer */
        for (int k = 0; k < gp_pipeline_cells(t->pipeline); k++)
            cJSON_AddItemToArray(part, cJSON_CreateNumber(gp_pipeline_cell_first(t->pipeline, k)));
        cJSON *rm = cJSON_AddArrayToObject(pl, "cell_remat"); /* every cell's, as the plan's */
        for (int k = 0; k < gp_pipeline_cells(t->pipeline); k++)
            cJSON_AddItemToArray(
                rm, cJSON_CreateString(gp_remat_name(gp_pipeline_cell_remat(t->pipeline, k))));
    } else if (po->partition) {
        cJSON *part = cJSON_AddArrayToObject(pl, "partition");
        for (int k = 0; k < po->stages; k++)
            cJSON_AddItemToArray(part, cJSON_CreateNumber(po->partition[k]));
    } else {
        cJSON_AddNullToObject(pl, "partition");
    }
    cJSON_AddStringToObject(pl, "partition_source", po->partition ? "--partition" : "balanced");
    cJSON_AddStringToObject(pl, "balance", gp_balance_name(po->balance));
    if (have) cJSON_AddBoolToObject(pl, "pinned", ps.pinned);
    else cJSON_AddNullToObject(pl, "pinned");
    cJSON *stages = cJSON_AddArrayToObject(pl, "stage_peak_bytes");
    const int T = t->pipeline ? gp_pipeline_tensor_parallel(t->pipeline) : 1;
    for (int k = 0; t->pipeline && k < gp_pipeline_stages(t->pipeline); k++)
        for (int sh = 0; sh < T; sh++) {
            gp_mem_stats st;
            cJSON *s = cJSON_CreateObject();
            cJSON_AddNumberToObject(s, "stage", k);
            cJSON_AddNumberToObject(s, "shard", sh);
            if (gp_pipeline_mem_stats_shard(t->pipeline, k, sh, &st) == GP_OK) {
                for (int c = 0; c < GP_MEM_NCATEGORIES; c++)
                    gp_cli_report_u64(s, gp_mem_category_name((gp_mem_category)c), st.peak[c]);
                gp_cli_report_u64(s, "total", st.peak_total);
            }
            cJSON_AddItemToArray(stages, s);
        }
    if (!have) {
        const char *keys[] = {"busy_fraction", "bubble_measured", "bubble_theory",
                              "bubble_simulated", "step_s", "bubble_replayed"};
        for (int i = 0; i < 6; i++) cJSON_AddNullToObject(pl, keys[i]);
        free(ss);
        return;
    }
    cJSON *busy = cJSON_AddArrayToObject(pl, "busy_fraction");
    for (int k = 0; k < nk; k++)
        cJSON_AddItemToArray(busy, cJSON_CreateNumber(ss[k].busy_fraction));
    free(ss);
    cJSON_AddNumberToObject(pl, "bubble_measured", ps.bubble_measured);
    cJSON_AddNumberToObject(pl, "bubble_theory", ps.bubble_theory);
    cJSON_AddNumberToObject(pl, "bubble_simulated", ps.bubble_simulated);
    cJSON_AddNumberToObject(pl, "bubble_replayed", ps.bubble_replayed);
    cJSON_AddNumberToObject(pl, "step_s", ps.step_s);
    gp_cli_comm_report(pl, t->pipeline, &t->place);
}

void gp_cli_pipeline_summary(const gp_cli_train *t) {
    char mem[32];
    if (t->stages == 0) return; /* one device: its memory is the summary's */
    const int T = t->pipeline ? gp_pipeline_tensor_parallel(t->pipeline) : 1;
    for (int k = 0; t->pipeline && k < gp_pipeline_stages(t->pipeline); k++)
        for (int sh = 0; sh < T; sh++) {
            gp_mem_stats st;
            if (gp_pipeline_mem_stats_shard(t->pipeline, k, sh, &st) != GP_OK) continue;
            if (T > 1)
                printf("stage %d shard %d peak %s (", k, sh,
                       gp_cli_fmt_bytes(st.peak_total, mem, sizeof mem));
            else
                printf("stage %d peak %s (", k, gp_cli_fmt_bytes(st.peak_total, mem, sizeof mem));
            for (int c = 0; c < GP_MEM_NCATEGORIES; c++)
                printf("%s%s %s", c ? ", " : "", gp_mem_category_name((gp_mem_category)c),
                       gp_cli_fmt_bytes(st.peak[c], mem, sizeof mem));
            printf(")\n");
        }
    gp_pipeline_stats ps;
    if (t->pipeline && gp_pipeline_last_stats(t->pipeline, &ps, NULL) == GP_OK)
        printf("bubble of the last step (%.3fs): measured %.1f%%, theory %s %.1f%%, "
               "simulated %.1f%% (replaying its actions %.1f%%)\n",
               ps.step_s, 100 * ps.bubble_measured,
               gp_pipeline_cells(t->pipeline) > ps.stages ? "(K-1)/(VM+K-1)" : "(K-1)/(M+K-1)",
               100 * ps.bubble_theory, 100 * ps.bubble_simulated, 100 * ps.bubble_replayed);
}

int gp_cli_pipeline_write_files(const gp_cli_train *t) {
    if (!t->pipeline || t->stages == 0 || t->place.rank != 0)
        return GP_CLI_EXIT_OK; /* gathered on every rank */
    if (t->trace) {
        if (gp_pipeline_write_trace(t->pipeline, t->trace) != GP_OK)
            return gp_cli_fail("train", "--trace");
        printf("trace of the last step written to %s (Chrome trace JSON: Perfetto, "
               "chrome://tracing)\n",
               t->trace);
    }
    if (t->timeline) {
        if (gp_pipeline_write_timeline(t->pipeline, t->timeline) != GP_OK)
            return gp_cli_fail("train", "--timeline");
        printf("timeline of the last step written to %s (SVG)\n", t->timeline);
    }
    fflush(stdout);
    return GP_CLI_EXIT_OK;
}
