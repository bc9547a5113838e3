/* `gpipe bench`: the WORKLOADS.md figures. G1 times OpenBLAS sgemm on the
 * 2048^3 and T1 shapes; T1, T2 (optionally on K pipeline stages) and C1 time
 * training steps and divide the achieved GFLOP/s by the 2048^3 sgemm ceiling
 * measured in the same process. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"

typedef struct bench_opts {
    const char *workload, *report, *device;
    int threads, steps, warmup, batch, micro_batches, layers, d_ff;
    bool tie_embeddings;
    uint64_t memory_limit;
    uint64_t seed;
    bool quiet;
    bool remat_given; /* --remat seen (else gp_cli_remat_default chooses) */
    gp_cli_pipeline_args pa; /* --partition is not offered: balanced cells only */
    gp_cli_mpi_args mpi;
    gp_cli_mpi_place place;
} bench_opts;

enum { NOPTS = 27 };
/* The most Transformer blocks of T2: those a JSON model config may declare (10000 layers with
 * the two embeddings, the final norm and the head). Far more would be allocated layer by layer
 * until the system ran out of memory, rather than refused. */
enum { MAX_LAYERS = 9996 };
/* The options only T2 takes; T3 takes the first two as well (its width and depth). */
static const char *const t2_only[] = {"--layers", "--d-ff", "--data-parallel", "--comm-timeout",
                                      "--tensor-parallel"};
enum { T3_TOO = 2 };
/* The pipeline's options: T2's and C1's. */
static const char *const pipeline_only[] = {"--stages", "--micro-batches", "--schedule",
                                            "--remat",  "--balance",       "--pin",
                                            "--memory-limit"};

static int make_table(gp_cli_opt t[NOPTS], bench_opts *o) {
    gp_cli_opt tab[] = {
        {"--workload", GP_CLI_CHOICE, &o->workload, "G1|T1|T2|T3|C1",
         "G1 sgemm GFLOP/s, T1/T2/T3 Transformer LM step, C1 convnet step (required)", NULL, 0,
         false, "G1|T1|T2|T3|C1", false, 0, false},
        {"--device", GP_CLI_CHOICE, &o->device, "cpu|cuda",
         "where T1, T2, T3 and C1 train: CPU devices, or CUDA GPUs (stage k on GPU k mod the "
         "GPUs); on a GPU the ceiling is its GEMM in the run's --precision (cuBLAS, 4096^3)",
         "cpu", 0, false, "cpu|cuda", false, 0, false},
        {"--threads", GP_CLI_THREADS, &o->threads, "N",
         "threads of the device (of each stage with --stages), at most the cores this process "
         "may use",
         "the cores this process may use, shared among the stages; 1 per MPI rank", 1, false,
         NULL, false, 0, false},
        {"--steps", GP_CLI_INT, &o->steps, "N", "timed steps (G1: timed calls per shape)", "10", 1,
         false, NULL, false, 0, false},
        {"--warmup", GP_CLI_INT, &o->warmup, "N", "untimed steps (or calls) first", "3", 0, false,
         NULL, false, 0, false},
        {"--batch", GP_CLI_INT, &o->batch, "N", "mini-batch of T1, T2 or C1",
         "32 for T1 and T2, 128 for C1", 1, false, NULL, false, 0, false},
        {"--seed", GP_CLI_U64, &o->seed, "S", "seed of the parameters and the random data", "1", 0,
         false, NULL, false, 0, false},
        {"--report", GP_CLI_STRING, &o->report, "FILE.json", "write a JSON report (atomically)",
         "none", 0, false, NULL, false, 0, false},
        {"--quiet", GP_CLI_FLAG, &o->quiet, NULL, "no per-step lines on stderr", NULL, 0, false,
         NULL, false, 0, false},
    };
    gp_cli_opt pipe[GP_CLI_PIPELINE_NOPTS];
    gp_cli_pipeline_options(pipe, &o->pa, "none: one device");
    pipe[2].defval = gp_cli_remat_default_text; /* --remat */
    int n = (int)(sizeof tab / sizeof tab[0]);
    memcpy(t, tab, sizeof tab);
    t[n++] = (gp_cli_opt){"--micro-batches", GP_CLI_INT, &o->micro_batches, "M",
                          "T2: micro-batches per mini-batch", "1", 1,
                          false, NULL, false, 0, false};
    t[n++] = (gp_cli_opt){"--layers", GP_CLI_INT, &o->layers, "N",
                          "T2: Transformer blocks (the memory table varies them)", "32", 1, false,
                          NULL, false, MAX_LAYERS, false};
    t[n++] = (gp_cli_opt){"--d-ff", GP_CLI_INT, &o->d_ff, "N",
                          "T2: the MLP's width (the width table grows it)", "1024", 1, false, NULL,
                          false, 0, false};
    t[n++] = (gp_cli_opt){"--tie-embeddings", GP_CLI_FLAG, &o->tie_embeddings, NULL,
                          "T1, T2: the head's weight tied to the token embedding "
                          "(\"tie_embeddings\" of a model config)",
                          NULL, 0, false, NULL, false, 0, false};
    t[n++] = (gp_cli_opt){"--memory-limit", GP_CLI_BYTES, &o->memory_limit, "BYTES",
                          "T2 with --stages: each stage device's limit (K M G, KiB MiB GiB)",
                          "none", 0, false, NULL, false, 0, false};
    /* The shared entries, so that bench words them like train and plan. */
    for (int i = 0; i < GP_CLI_PIPELINE_NOPTS && n < NOPTS; i++)
        if (strcmp(pipe[i].name, "--partition") != 0) {
            t[n] = pipe[i];
            t[n].help = strcmp(pipe[i].name, "--stages") == 0
                            ? "T2: pipeline stages, --threads threads each (gp_pipeline)"
                            : pipe[i].help;
            n++;
        }
    gp_cli_opt mpi[GP_CLI_MPI_NOPTS];
    gp_cli_mpi_options(mpi, &o->mpi);
    for (int i = 0; i < GP_CLI_MPI_NOPTS && n < NOPTS; i++) t[n++] = mpi[i];
    return n;
}

static void print_help(const gp_cli_opt *tab, int n) {
    printf("Usage: gpipe bench --workload G1|T1|T2|T3|C1 [options]\n\n"
           "Measures a workload of WORKLOADS.md on the CPU (or a GPU, --device cuda):\n"
           "  G1  sgemm GFLOP/s on --threads threads: 2048^3 and the T1 shapes 4096x512 by\n"
           "      512x1536, 512x512 and 512x2048, and 4096x2048 by 2048x512, as a CPU device\n"
           "      runs them (rows of C split over its threads, one single-threaded OpenBLAS\n"
           "      call each), then on OpenBLAS's own threads for comparison\n"
           "  T1  Transformer LM (gp_transformer_defaults), AdamW(3e-4, 0.01), random bytes:\n"
           "      tokens/s and GFLOP/s counted as 6 x matmul params x tokens\n"
           "      + 12 x layers x seq_len x d_model x tokens\n"
           "  T2  T1 with d_model 256, 4 heads, d_ff 1024, 32 layers (25,436,672 parameters),\n"
           "      batch 32; --stages K trains through the pipeline runtime (--threads\n"
           "      threads per stage), without it on one device;\n"
           "      the report's pipeline object has the measured, theoretical and simulated\n"
           "      bubble (medians over the timed steps)\n"
           "  T3  T1 with d_model 2048, 16 heads, d_ff 8192, 24 layers, 1024 positions\n"
           "      (1,211,748,352 parameters), batch 8: the GPU workload; --stages as T2\n"
           "  C1  Fashion-MNIST convnet, SGD(0.05, momentum 0.9), random images: images/s and\n"
           "      GFLOP/s from the model's cost table\n"
           "T1, T2 and C1 report the median step time over --steps after --warmup steps, its\n"
           "spread, the steps' CPU seconds (every thread's, which other processes' load on\n"
           "the machine hardly moves), and the fraction of the 2048^3 sgemm ceiling\n"
           "measured in the same process right after each step, split over as many threads\n"
           "as a device splits it (with K stages of T threads: on all K x T threads at once,\n"
           "as a step keeps them busy; then on one stage's T threads alone, for the report's\n"
           "ceiling_together_over_alone: what the cores lose by working together).\n"
           "Under mpirun, T2 runs over MPI: one stage per rank, D x K ranks with\n"
           "--data-parallel D (ceiling: ranks times the T-thread sgemm); rank 0 reports,\n"
           "with the bytes each rank sent in the last step on each mesh axis.\n"
           "T2 with --tensor-parallel T splits each stage's layers over T devices (threads or\n"
           "ranks: D x K x T), --threads threads each.\n\n"
           "Options:\n");
    gp_cli_print_options(tab, n, stdout);
    printf("\nExit status: 0 success, 1 runtime failure, 2 bad usage.\n");
}

/* GFLOP/s of `reps` separately timed sgemm calls (after `warmup` calls). */
static int time_sgemm(int64_t m, int64_t n, int64_t k, int threads, bool openblas_threads,
                      int warmup, int reps, double *out) {
    for (int i = 0; i < warmup + reps; i++) {
        double g;
        char why[256];
        if (!gp_cli_bench_sgemm(m, n, k, threads, openblas_threads, 1, &g, why, sizeof why)) {
            fprintf(stderr, "gpipe bench: %s\n", why);
            return GP_CLI_EXIT_RUNTIME;
        }
        if (i >= warmup) out[i - warmup] = g;
    }
    return GP_CLI_EXIT_OK;
}

static void add_spread(cJSON *obj, const char *key, const double *v, int n) {
    cJSON *s = cJSON_AddObjectToObject(obj, key);
    double lo = v[0], hi = v[0];
    for (int i = 1; i < n; i++) lo = fmin(lo, v[i]), hi = fmax(hi, v[i]);
    cJSON_AddNumberToObject(s, "median", gp_cli_median(v, n));
    cJSON_AddNumberToObject(s, "min", lo);
    cJSON_AddNumberToObject(s, "max", hi);
}

static int run_g1(const bench_opts *o, cJSON *r) {
    static const struct {
        const char *name;
        int64_t m, n, k;
    } shapes[] = {{"2048^3", 2048, 2048, 2048},
                  {"T1 qkv 4096x512 by 512x1536", 4096, 1536, 512},
                  {"T1 proj 4096x512 by 512x512", 4096, 512, 512},
                  {"T1 fc 4096x512 by 512x2048", 4096, 2048, 512},
                  {"T1 fc2 4096x2048 by 2048x512", 4096, 512, 2048}};
    double *g = malloc((size_t)o->steps * sizeof *g);
    if (!g) return GP_CLI_EXIT_RUNTIME;
    cJSON *arr = cJSON_AddArrayToObject(r, "sgemm");
    printf("%-30s %-22s %10s %10s %10s\n", "sgemm (m x k by k x n)", "threads", "GFLOP/s", "min",
           "max");
    /* Each shape as a CPU device splits it (rows of C over its threads, one single-threaded
     * sgemm each: the ceiling), then as OpenBLAS's own threads run it, for comparison. */
    for (int way = 0; way < (o->threads > 1 ? 2 : 1); way++)
        for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++) {
            int rc = time_sgemm(shapes[i].m, shapes[i].n, shapes[i].k, o->threads, way == 1,
                                o->warmup, o->steps, g);
            if (rc != GP_CLI_EXIT_OK) {
                free(g);
                return rc;
            }
            double lo = g[0], hi = g[0], med = gp_cli_median(g, o->steps);
            for (int j = 1; j < o->steps; j++) lo = fmin(lo, g[j]), hi = fmax(hi, g[j]);
            char how[48];
            snprintf(how, sizeof how, "%d, %s", o->threads, way ? "OpenBLAS's" : "rows split");
            printf("%-30s %-22s %10.1f %10.1f %10.1f\n", shapes[i].name, how, med, lo, hi);
            fflush(stdout);
            cJSON *e = cJSON_CreateObject();
            cJSON_AddStringToObject(e, "name", shapes[i].name);
            cJSON_AddStringToObject(e, "threads", way ? "openblas" : "rows_split");
            cJSON_AddNumberToObject(e, "m", (double)shapes[i].m);
            cJSON_AddNumberToObject(e, "n", (double)shapes[i].n);
            cJSON_AddNumberToObject(e, "k", (double)shapes[i].k);
            add_spread(e, "gflops", g, o->steps);
            cJSON_AddItemToArray(arr, e);
            if (i == 0 && way == 0) cJSON_AddNumberToObject(r, "ceiling_gflops", med);
        }
    free(g);
    return GP_CLI_EXIT_OK;
}

static void free_bench(gp_cli_bench *b) {
    free(b->step_seconds);
    free(b->step_cpu_seconds);
    free(b->step_ceiling);
    free(b->step_ceiling_alone);
    free(b->step_bubble);
    free(b->step_bubble_sim);
    free(b->step_bubble_replay);
    free(b->stage_mem);
    free(b->cell_remat);
    free(b->last_stages);
    free(b->rss_peak);
    free(b->bytes_p2p);
    free(b->bytes_allreduce);
    free(b->bytes_tensor);
}

/* "pipeline": {stages, micro_batches, schedule, remat, grad_sum, partition,
 * busy_fraction, bubble_measured, bubble_theory, bubble_simulated, ...}:
 * the bubbles are medians over the timed steps, the partition and busy
 * fractions those of the last one. */
static void report_pipeline(cJSON *r, const gp_cli_bench *b) {
    cJSON *pl = cJSON_AddObjectToObject(r, "pipeline");
    const int K = b->stages;
    const int T = b->popts.tensor_parallel > 0 ? b->popts.tensor_parallel : 1;
    cJSON_AddNumberToObject(pl, "stages", K);
    cJSON_AddNumberToObject(pl, "tensor_parallel", T);
    cJSON_AddNumberToObject(pl, "micro_batches", b->popts.micro_batches);
    cJSON_AddStringToObject(pl, "schedule", gp_schedule_kind_name(b->popts.schedule));
    cJSON_AddStringToObject(pl, "remat", gp_remat_name(b->popts.remat));
    cJSON_AddStringToObject(pl, "remat_why", b->remat_why);
    cJSON *rm = cJSON_AddArrayToObject(pl, "cell_remat"); /* every cell's, as planned */
    for (int k = 0; k < b->ncells; k++)
        cJSON_AddItemToArray(rm, cJSON_CreateString(gp_remat_name(b->cell_remat[k])));
    cJSON_AddStringToObject(pl, "grad_sum", gp_grad_sum_name(b->popts.grad_sum));
    cJSON_AddStringToObject(pl, "launcher", gp_launcher_name(b->place.launcher));
    cJSON_AddNumberToObject(pl, "data_parallel", b->place.data_parallel);
    cJSON_AddNumberToObject(pl, "ranks", b->place.nranks);
    /* Per device in mesh order: under MPI every rank's bytes on each axis; on threads the
     * tensor axis's only (the others are not counted there). */
    cJSON *bytes = cJSON_AddArrayToObject(pl, "bytes_sent_last_step");
    const int W = b->bytes_p2p ? b->place.nranks : b->bytes_tensor ? b->ndevices : 0;
    for (int r = 0; r < W; r++) {
        cJSON *e = cJSON_CreateObject();
        if (b->bytes_p2p) cJSON_AddNumberToObject(e, "rank", r);
        cJSON_AddNumberToObject(e, "stage", r / T % K);
        cJSON_AddNumberToObject(e, "shard", r % T);
        cJSON_AddNumberToObject(e, "replica", r / (K * T));
        if (b->bytes_p2p) {
            gp_cli_report_u64(e, "p2p", b->bytes_p2p[r]);
            gp_cli_report_u64(e, "allreduce", b->bytes_allreduce[r]);
        }
        gp_cli_report_u64(e, "tensor", b->bytes_tensor ? b->bytes_tensor[r] : 0);
        cJSON_AddItemToArray(bytes, e);
    }
    cJSON *part = cJSON_AddArrayToObject(pl, "partition");
    cJSON *busy = cJSON_AddArrayToObject(pl, "busy_fraction");
    cJSON *peak = cJSON_AddArrayToObject(pl, "stage_peak_bytes");
    for (int k = 0; k < K; k++) {
        cJSON_AddItemToArray(part, cJSON_CreateNumber(b->last_stages[k].first_layer));
        cJSON_AddItemToArray(busy, cJSON_CreateNumber(b->last_stages[k].busy_fraction));
    }
    for (int w = 0; w < K * T; w++) {
        cJSON *s = cJSON_CreateObject();
        cJSON_AddNumberToObject(s, "stage", w / T);
        cJSON_AddNumberToObject(s, "shard", w % T);
        for (int c = 0; c < GP_MEM_NCATEGORIES; c++)
            gp_cli_report_u64(s, gp_mem_category_name((gp_mem_category)c), b->stage_mem[w].peak[c]);
        gp_cli_report_u64(s, "total", b->stage_mem[w].peak_total);
        cJSON_AddItemToArray(peak, s);
    }
    cJSON_AddBoolToObject(pl, "pinned", b->last.pinned);
    cJSON_AddStringToObject(pl, "balance", gp_balance_name(b->popts.balance));
    gp_cli_report_u64(pl, "memory_limit_bytes", b->popts.memory_limit);
    cJSON_AddNumberToObject(pl, "bubble_measured", gp_cli_median(b->step_bubble, b->steps));
    cJSON_AddNumberToObject(pl, "bubble_theory", b->last.bubble_theory);
    cJSON_AddNumberToObject(pl, "bubble_simulated", gp_cli_median(b->step_bubble_sim, b->steps));
    add_spread(pl, "step_bubble_measured", b->step_bubble, b->steps);
    add_spread(pl, "step_bubble_simulated", b->step_bubble_sim, b->steps);
    cJSON_AddNumberToObject(pl, "bubble_replayed", gp_cli_median(b->step_bubble_replay, b->steps));
}

static int run_training(const bench_opts *o, cJSON *r) {
    /* The ceiling on the same threads, in the same process (WORKLOADS.md):
     * one 2048^3 sgemm right after each timed step; the fraction is the
     * median of the per-step ratios, so the machine's drift cancels. */
    gp_cli_bench b = {.workload = o->workload,
                      .steps = o->steps,
                      .warmup = o->warmup,
                      .batch = o->batch,
                      .seed = o->seed,
                      .quiet = o->quiet || o->place.rank != 0,
                      .stages = o->pa.stages,
                      .threads = o->threads,
                      .layers = o->layers,
                      .d_ff = o->d_ff,
                      .tie_embeddings = o->tie_embeddings};
    int *first = NULL;
    /* The batch (the workload's own when 0) is set into popts by gp_cli_bench_train. */
    int rc = gp_cli_pipeline_resolve("bench", &o->pa, o->micro_batches > 0 ? o->micro_batches : 1,
                                     0, 0, &b.popts, &first);
    free(first); /* no --partition here: always NULL */
    b.popts.partition = NULL;
    b.popts.memory_limit = o->memory_limit;
    gp_cli_mpi_apply(&o->place, &b.popts);
    if (rc == GP_CLI_EXIT_OK && o->device) { /* a kind with no device here fails now */
        int count = 0;
        if (gp_device_type_parse(o->device, &b.popts.device_type) != GP_OK ||
            gp_device_type_count(b.popts.device_type, &count) != GP_OK) {
            fprintf(stderr, "gpipe bench: --device %s: %s\n", o->device, gp_last_error());
            rc = GP_CLI_EXIT_RUNTIME;
        }
    }
    const bool gpu = b.popts.device_type != GP_DEVICE_CPU;
    if (b.stages > 0)
        gp_cli_remat_default(o->remat_given ? "--remat" : NULL, o->memory_limit > 0,
                             b.stages * b.popts.tensor_parallel, &b.popts, b.remat_why,
                             sizeof b.remat_why);
    b.place = o->place;
    if (rc == GP_CLI_EXIT_OK) rc = gp_cli_bench_train(&b);
    double *ratio = rc == GP_CLI_EXIT_OK ? calloc((size_t)b.steps, sizeof *ratio) : NULL;
    if (rc == GP_CLI_EXIT_OK && !ratio) {
        fprintf(stderr, "gpipe bench: out of host memory\n");
        rc = GP_CLI_EXIT_RUNTIME;
    }
    if (rc != GP_CLI_EXIT_OK) {
        free_bench(&b);
        return rc;
    }
    /* Under MPI, D x K x T ranks, each a device of T threads: their ceiling is that many times
     * the T-thread sgemm each measured after each step. On threads the sgemm ran on every
     * device's threads at once (gp_cli_bench_train): already the whole. */
    const double cores = b.stages > 0 && b.place.launcher == GP_LAUNCHER_MPI
                             ? (double)b.stages * b.place.data_parallel * b.popts.tensor_parallel
                             : 1;
    for (int i = 0; i < b.steps; i++) {
        b.step_ceiling[i] *= cores;
        ratio[i] = b.flops_per_step / b.step_seconds[i] / 1e9 / b.step_ceiling[i];
    }
    double ceiling = gp_cli_median(b.step_ceiling, b.steps);
    double fraction = gp_cli_median(ratio, b.steps);
    double med = gp_cli_median(b.step_seconds, b.steps), lo = b.step_seconds[0], hi = lo;
    for (int i = 1; i < b.steps; i++)
        lo = fmin(lo, b.step_seconds[i]), hi = fmax(hi, b.step_seconds[i]);
    double ex_s = (double)b.examples_per_step / med;
    double achieved = b.flops_per_step / med / 1e9;
    cJSON_AddStringToObject(r, "model", b.model_desc);
    cJSON_AddNumberToObject(r, "batch", b.batch);
    cJSON_AddNumberToObject(r, "nparams", (double)b.nparams);
    cJSON_AddStringToObject(r, "data", "random (keyed by seed and step)");
    cJSON *th = cJSON_AddObjectToObject(r, "throughput");
    cJSON_AddNumberToObject(th, "examples_per_s", ex_s);
    if (b.tokens_per_example > 0)
        cJSON_AddNumberToObject(th, "tokens_per_s", ex_s * (double)b.tokens_per_example);
    cJSON_AddNumberToObject(r, "flops_per_step", b.flops_per_step);
    cJSON_AddNumberToObject(r, "achieved_gflops", achieved);
    cJSON_AddNumberToObject(r, "ceiling_gflops", ceiling);
    cJSON_AddNumberToObject(r, "fraction_of_ceiling", fraction);
    add_spread(r, "step_ceiling_gflops", b.step_ceiling, b.steps);
    if (b.step_ceiling_alone) {
        /* One device's ceiling alone, and the share of K x it the devices keep together. */
        const double alone = gp_cli_median(b.step_ceiling_alone, b.steps);
        cJSON_AddNumberToObject(r, "ceiling_one_device_alone_gflops", alone);
        cJSON_AddNumberToObject(r, "ceiling_together_over_alone", ceiling / (alone * b.ndevices));
    }
    add_spread(r, "step_fraction_of_ceiling", ratio, b.steps);
    add_spread(r, "step_seconds", b.step_seconds, b.steps);
    add_spread(r, "step_cpu_seconds", b.step_cpu_seconds, b.steps);
    cJSON_AddNumberToObject(r, "final_loss", b.final_loss);
    gp_cli_report_memory(r, &b.mem);
    cJSON *rss = cJSON_AddArrayToObject(r, "rss_peak_bytes"); /* per rank (one on threads) */
    for (int i = 0; b.rss_peak && i < b.nranks; i++)
        cJSON_AddItemToArray(rss, cJSON_CreateNumber((double)b.rss_peak[i]));
    cJSON_AddStringToObject(r, "device", gp_device_type_name(b.popts.device_type));
    cJSON_AddStringToObject(r, "precision", gp_precision_name(b.popts.precision));
    if (strcmp(o->workload, "T1") != 0) {
        cJSON_AddNumberToObject(r, "micro_batches", b.popts.micro_batches);
        cJSON_AddStringToObject(r, "ceiling_basis",
                                gpu ? (b.popts.precision == GP_PRECISION_BF16
                                           ? "4096^3 bf16-operand GEMM through GPU 0's kernel table (cuBLAS)"
                                           : "4096^3 fp32 GEMM through GPU 0's kernel table (cuBLAS)")
                                : b.stages == 0 ? "2048^3 sgemm on the device's threads"
                                : b.place.launcher == GP_LAUNCHER_MPI
                                    ? "ranks (D x K x T) x 2048^3 sgemm on a rank's threads"
                                    : "2048^3 sgemm on all devices' threads at once");
        if (b.stages > 0)
            report_pipeline(r, &b);
        else
            cJSON_AddNullToObject(r, "pipeline");
    }

    char mem[32];
    printf("%s: %s\n", o->workload, b.model_desc);
    printf("  step %.4f s median (min %.4f, max %.4f) over %d steps after %d warm-up\n", med, lo,
           hi, b.steps, b.warmup);
    if (b.tokens_per_example > 0)
        printf("  %.0f tokens/s (%.2f sequences/s)\n", ex_s * (double)b.tokens_per_example, ex_s);
    else
        printf("  %.1f images/s\n", ex_s);
    printf("  %.1f GFLOP/step, %.1f GFLOP/s achieved; %s ceiling %.1f GFLOP/s (median)\n"
           "  fraction of the ceiling %.3f (median of per-step ratios to a %s run "
           "right after each step)\n",
           b.flops_per_step / 1e9, achieved, gpu ? (b.popts.precision == GP_PRECISION_BF16 ? "GPU bf16 GEMM" : "GPU fp32 GEMM") : "sgemm", ceiling, fraction,
           gpu ? "4096^3 GPU GEMM" : "2048^3 sgemm");
    printf("  peak memory %s%s\n", gp_cli_fmt_bytes(b.mem.peak_total, mem, sizeof mem),
           b.stages > 0 ? " (stage peaks summed)" : "");
    if (b.stages > 0)
        printf("  pipeline K=%d T=%d M=%d %s remat %s: bubble measured %.3f, theory %.3f, "
               "simulated %.3f, replayed %.3f (medians)\n",
               b.stages, b.popts.tensor_parallel, b.popts.micro_batches,
               gp_schedule_kind_name(b.popts.schedule),
               gp_remat_name(b.popts.remat), gp_cli_median(b.step_bubble, b.steps),
               b.last.bubble_theory, gp_cli_median(b.step_bubble_sim, b.steps),
               gp_cli_median(b.step_bubble_replay, b.steps));
    free_bench(&b);
    free(ratio);
    return GP_CLI_EXIT_OK;
}

int gp_cli_bench_main(int argc, char **argv) {
    bench_opts o = {.steps = 10, .warmup = 3, .seed = 1};
    gp_cli_opt tab[NOPTS];
    int n = make_table(tab, &o);
    int rc = gp_cli_parse(tab, n, argc, argv, 2, "bench");
    if (rc == GP_CLI_HELP) {
        print_help(tab, n);
        return GP_CLI_EXIT_OK;
    }
    if (rc != GP_CLI_PARSED) return rc;
    if (!o.workload)
        return gp_cli_usage_error("bench", "--workload: required (G1, T1, T2, T3 or C1)");
    const bool t2 = strcmp(o.workload, "T2") == 0, t3 = strcmp(o.workload, "T3") == 0;
    for (size_t i = 0; i < sizeof t2_only / sizeof t2_only[0]; i++)
        if (!t2 && !(t3 && i < T3_TOO) && gp_cli_seen(tab, n, t2_only[i]))
            return gp_cli_usage_error("bench", "%s: only for --workload T2%s (got %s)", t2_only[i],
                                      i < T3_TOO ? " or T3" : "", o.workload);
    if (o.tie_embeddings && o.workload[0] != 'T')
        return gp_cli_usage_error("bench",
                                  "--tie-embeddings: only for --workload T1, T2 or T3 (got %s)",
                                  o.workload);
    if (o.device && strcmp(o.device, "cpu") != 0 && strcmp(o.workload, "G1") == 0)
        return gp_cli_usage_error("bench", "--device %s: G1 times OpenBLAS on the CPU only",
                                  o.device);
    if (gp_cli_seen(tab, n, "--precision") && strcmp(o.workload, "G1") == 0)
        return gp_cli_usage_error("bench", "--precision: only for T1, T2, T3 and C1 (G1 times "
                                           "fp32 sgemm)");
    const bool piped = t2 || t3 || strcmp(o.workload, "C1") == 0;
    for (size_t i = 0; i < sizeof pipeline_only / sizeof pipeline_only[0]; i++)
        if (!piped && gp_cli_seen(tab, n, pipeline_only[i]))
            return gp_cli_usage_error("bench", "%s: only for --workload T2, T3 or C1 (got %s)",
                                      pipeline_only[i], o.workload);
    const int T = gp_cli_seen(tab, n, "--tensor-parallel") ? o.pa.tensor_parallel : 1;
    if (T > 1 && !gp_cli_seen(tab, n, "--stages")) o.pa.stages = 1; /* T devices: a pipeline */
    if (!gp_cli_seen(tab, n, "--stages") && T == 1) {
        if (gp_cli_seen(tab, n, "--schedule"))
            return gp_cli_usage_error("bench", "--schedule: only with --stages (one device runs "
                                               "its micro-batches one after another)");
        for (int i = 0; i < 4; i++) {
            const char *name = (const char *[]){"--remat", "--balance", "--pin", "--memory-limit"}[i];
            if (gp_cli_seen(tab, n, name))
                return gp_cli_usage_error("bench", "%s: only with --stages", name);
        }
    }
    o.remat_given = gp_cli_seen(tab, n, "--remat");
    rc = gp_cli_mpi_resolve("bench", tab, n, &o.mpi, o.pa.stages > 0 ? o.pa.stages : 1, T,
                            &o.place);
    if (rc != GP_CLI_EXIT_OK) return rc;
    if (o.place.launcher == GP_LAUNCHER_MPI && (!t2 || o.pa.stages < 1))
        return gp_cli_usage_error("bench", "the MPI launcher: only for --workload T2 with --stages K");
    if (gp_cli_seen(tab, n, "--batch") && strcmp(o.workload, "G1") == 0)
        return gp_cli_usage_error("bench", "--batch: only for T1 and C1 (G1 has fixed shapes)");
    o.threads = gp_cli_device_threads(o.threads, (o.pa.stages > 0 ? o.pa.stages : 1) * T,
                                      o.place.launcher == GP_LAUNCHER_MPI);
    double t0 = gp_cli_now();
    char core[GP_CLI_BLAS_CORE_TEXT_SIZE];
    const char *isa;
    (void)gp_cpu_isa(&isa); /* its error stopped main() already */
    printf("gpipe bench %s: %d thread(s)%s, BLAS core %s, CPU kernels %s, %d timed after %d "
           "warm-up\n",
           o.workload, o.threads, o.pa.stages > 0 ? " per stage" : "",
           gp_cli_blas_core_text(core, sizeof core), isa, o.steps, o.warmup);
    fflush(stdout);
    cJSON *r = cJSON_CreateObject();
    cJSON_AddStringToObject(r, "workload", o.workload);
    cJSON_AddNumberToObject(r, "threads", o.threads); /* per device (stage) */
    gp_cli_report_blas_core(r);
    cJSON_AddStringToObject(r, "cpu_isa", isa);
    cJSON_AddStringToObject(r, "gpipe_version", gp_version());
    cJSON_AddNumberToObject(r, "steps", o.steps);
    cJSON_AddNumberToObject(r, "warmup", o.warmup);
    gp_cli_report_u64(r, "seed", o.seed);
    rc = strcmp(o.workload, "G1") == 0 ? run_g1(&o, r) : run_training(&o, r);
    cJSON_AddNumberToObject(r, "elapsed_s", gp_cli_now() - t0);
    if (rc == GP_CLI_EXIT_OK && o.report && o.place.rank == 0) {
        if (!gp_cli_report_write("bench", r, o.report, "--report"))
            rc = GP_CLI_EXIT_RUNTIME;
        else
            printf("report written to %s\n", o.report);
    }
    cJSON_Delete(r);
    return rc;
}
