/* The training workloads of `gpipe bench` (WORKLOADS.md): T1 and T2 (deep,
 * optionally on K pipeline stages), byte-level Transformer LMs with AdamW, and
 * C1, the Fashion-MNIST convnet with SGD, each timed step by step (forward +
 * backward + update only) on random data keyed by (seed, step). */
#include <stdlib.h>
#include <string.h>

#include <sys/resource.h>

#include "cli.h"

double gp_cli_median(const double *v, int n) {
    double *s = malloc((size_t)n * sizeof *s);
    if (!s) return v[0];
    memcpy(s, v, (size_t)n * sizeof *s);
    /* Insertion sort: n is a handful of steps. */
    for (int i = 1; i < n; i++) {
        double x = s[i];
        int j = i - 1;
        for (; j >= 0 && s[j] > x; j--) s[j + 1] = s[j];
        s[j + 1] = x;
    }
    double m = n % 2 ? s[n / 2] : 0.5 * (s[n / 2 - 1] + s[n / 2]);
    free(s);
    return m;
}

/* T1's count from WORKLOADS.md: 6 x matmul parameters x tokens for the
 * linear layers (forward 2, backward 4) plus 12 x layers x T x d x tokens
 * for the attention products QK^T and AV. */
static double transformer_flops(const gp_transformer_config *c, int64_t batch) {
    double d = c->dim, ff = c->d_ff, tokens = (double)batch * c->seq_len;
    double matmul_params = c->layers * (4.0 * d * d + 2.0 * d * ff) + d * c->vocab;
    return 6.0 * matmul_params * tokens + 12.0 * c->layers * c->seq_len * d * tokens;
}

/* The model's own cost table, forward and backward of every layer. */
static int model_flops(gp_model *m, int64_t batch, double *out) {
    double f = 0;
    for (int i = 0; i < gp_model_nlayers(m); i++) {
        gp_cost c;
        if (gp_model_cost(m, i, batch, &c) != GP_OK) return gp_cli_fail("bench", "the model's cost estimate");
        f += c.fwd_flops + c.bwd_flops;
    }
    *out = f;
    return GP_CLI_EXIT_OK;
}

/* Random inputs for step `step`: bytes for T1 (labels: the next byte),
 * standard normal pixels and uniform labels for C1. */
static void fill_batch(gp_cli_bench *b, int step, int classes, gp_tensor *x, gp_tensor *y) {
    gp_rng_stream s = {.seed = b->seed, .purpose = GP_RNG_DATA, .a = (uint32_t)step, .b = 7};
    int32_t *yi = (int32_t *)y->data;
    int64_t ny = gp_tensor_nelem(y);
    if (x->dtype == GP_I32) {
        int32_t *xi = (int32_t *)x->data;
        int64_t T = x->shape.dim[1];
        for (int64_t r = 0; r < x->shape.dim[0]; r++) {
            /* One random stream of T+1 bytes per row: y is x shifted by one. */
            int32_t prev = (int32_t)(gp_rng_u64(&s, (uint64_t)(r * (T + 1))) & 0xff);
            for (int64_t t = 0; t < T; t++) {
                int32_t next = (int32_t)(gp_rng_u64(&s, (uint64_t)(r * (T + 1) + t + 1)) & 0xff);
                xi[r * T + t] = prev;
                yi[r * T + t] = next;
                prev = next;
            }
        }
    } else {
        gp_rng_normal(&s, 0, x->data, gp_tensor_nelem(x));
        s.b = 8;
        for (int64_t i = 0; i < ny; i++)
            yi[i] = (int32_t)(gp_rng_u64(&s, (uint64_t)i) % (uint64_t)classes);
    }
}

/* T2 of WORKLOADS.md: T1 made deep and narrow, for pipeline scaling; T3: T1 made GPU-sized. */
static gp_transformer_config workload_config(const char *workload) {
    gp_transformer_config c = gp_transformer_defaults();
    if (strcmp(workload, "T2") == 0) c.dim = 256, c.heads = 4, c.d_ff = 1024, c.layers = 32;
    if (strcmp(workload, "T3") == 0)
        c.dim = 2048, c.heads = 16, c.d_ff = 8192, c.layers = 24, c.seq_len = 1024;
    return c;
}

/* Builds the workload's model and fills the figures that do not need a run. */
static int build(gp_cli_bench *b, gp_model **m, gp_optim_opts *oo, int *classes) {
    *classes = 0;
    if (strcmp(b->workload, "C1") != 0) {
        gp_transformer_config c = workload_config(b->workload);
        if (b->layers > 0) c.layers = b->layers;
        if (b->d_ff > 0) c.d_ff = b->d_ff;
        c.tie_embeddings = b->tie_embeddings;
        if (b->batch == 0) b->batch = strcmp(b->workload, "T3") == 0 ? 8 : 32;
        char what[16];
        snprintf(what, sizeof what, "%s model", b->workload);
        if (gp_model_transformer(&c, m) != GP_OK) return gp_cli_fail("bench", what);
        b->flops_per_step = transformer_flops(&c, b->batch);
        b->tokens_per_example = c.seq_len;
        snprintf(b->model_desc, sizeof b->model_desc,
                 "transformer d%d h%d ff%d L%d T%d V%d%s, batch %d, AdamW(3e-4, 0.01)", c.dim,
                 c.heads, c.d_ff, c.layers, c.seq_len, c.vocab,
                 c.tie_embeddings ? " tied embeddings" : "", b->batch);
        *oo = gp_adamw_defaults(3e-4f, 0.01f);
    } else {
        gp_convnet_config c = gp_convnet_defaults();
        if (b->batch == 0) b->batch = 128;
        if (gp_model_convnet(&c, m) != GP_OK) return gp_cli_fail("bench", "C1 model");
        *classes = c.classes;
        int rc = model_flops(*m, b->batch, &b->flops_per_step);
        if (rc != GP_CLI_EXIT_OK) return rc;
        b->tokens_per_example = 0;
        snprintf(b->model_desc, sizeof b->model_desc,
                 "convnet %dx%dx%d -> %d classes, batch %d, SGD(0.05, momentum 0.9)", c.in_ch,
                 c.height, c.width, c.classes, b->batch);
        *oo = gp_sgd_defaults(0.05f, 0.9f);
    }
    b->examples_per_step = b->batch;
    b->nparams = gp_model_nparams(*m);
    return GP_CLI_EXIT_OK;
}

/* Peak bytes of every stage, and per category summed over the stages (an
 * upper bound of what the K devices held at once together). */
static int pipeline_memory(gp_cli_bench *b, const gp_pipeline *p) {
    memset(&b->mem, 0, sizeof b->mem);
    const int T = gp_pipeline_tensor_parallel(p);
    for (int w = 0; w < b->stages * T; w++) {
        gp_mem_stats st;
        if (gp_pipeline_mem_stats_shard(p, w / T, w % T, &st) != GP_OK)
            return gp_cli_fail("bench", "stage memory counters");
        for (int c = 0; c < GP_MEM_NCATEGORIES; c++) b->mem.peak[c] += st.peak[c];
        b->mem.peak_total += st.peak_total;
        b->mem.nallocs += st.nallocs;
        b->mem.limit = st.limit;
        b->stage_mem[w] = st;
    }
    return GP_CLI_EXIT_OK;
}

int gp_cli_bench_train(gp_cli_bench *b) {
    gp_model *m = NULL;
    gp_device *dev = NULL, *ceiling_dev = NULL;
    gp_pipeline *pl = NULL;
    gp_tensor x = {0}, y = {0};
    int classes;
    gp_optim_opts oo;
    int rc = build(b, &m, &oo, &classes);
    if (rc != GP_CLI_EXIT_OK) goto done;
    const bool t1 = b->tokens_per_example > 0;
    const int M = b->popts.micro_batches > 0 ? b->popts.micro_batches : 1;
    rc = gp_cli_pipeline_check("bench", m, b->batch, &b->popts);
    if (rc != GP_CLI_EXIT_OK) goto done;
    gp_shape in;
    if (gp_device_cpu_new_threads("cpu0", b->stages > 0 ? 1 : b->threads, &dev) != GP_OK ||
        gp_model_shape(m, -1, b->batch, &in) != GP_OK) {
        rc = gp_cli_fail("bench", "setting up the model");
        goto done;
    }
    /* The pipeline initializes the parameters on its stage devices, in cells balanced and fitted
     * (memory limit) for this batch; without --stages one stage on dev, each micro-batch's
     * forward then its backward, nothing recomputed: single-device training. */
    const bool pipelined = b->stages > 0;
    b->popts.batch = b->batch;
    b->popts.stage_threads = b->threads;
    /* A GPU run's one stage is a device the pipeline makes of that kind (dev, on the CPU,
     * holds the batches); its ceiling is the same GPU's GEMM rate through its own table. */
    const bool on_cpu = b->popts.device_type == GP_DEVICE_CPU;
    if (!pipelined)
        b->popts = (gp_pipeline_opts){.stages = 1, .micro_batches = M,
                                      .schedule = GP_SCHEDULE_1F1B, .remat = GP_REMAT_NONE,
                                      .devices = on_cpu ? &dev : NULL,
                                      .device_type = b->popts.device_type,
                                      .precision = b->popts.precision, .stage_threads = 1};
    /* The ceiling in the run's precision: bf16 products are held to a bf16 GEMM. */
    if (!on_cpu &&
        (gp_device_type_new(b->popts.device_type, "ceiling", 0, 1, &ceiling_dev) != GP_OK ||
         gp_device_set_precision(ceiling_dev, b->popts.precision) != GP_OK)) {
        rc = gp_cli_fail("bench", "the GPU for the GEMM ceiling");
        goto done;
    }
    if (gp_pipeline_new(m, &oo, &b->popts, b->seed, &pl) != GP_OK) {
        rc = gp_cli_fail("bench", pipelined ? "setting up the pipeline" : "setting up the model");
        goto done;
    }
    if (pipelined && b->place.rank == 0) gp_cli_remat_print(pl, b->popts.remat, b->remat_why);
    const int ncells = gp_pipeline_cells(pl);
    if (pipelined && (b->cell_remat = calloc((size_t)ncells, sizeof *b->cell_remat)))
        for (b->ncells = 0; b->ncells < ncells; b->ncells++)
            b->cell_remat[b->ncells] = gp_pipeline_cell_remat(pl, b->ncells);
    gp_shape yshape = t1 ? in : gp_shape1(b->batch);
    if (gp_tensor_alloc(dev, GP_MEM_ACTIVATIONS, in, gp_model_input_dtype(m), &x) != GP_OK ||
        gp_tensor_alloc(dev, GP_MEM_ACTIVATIONS, yshape, GP_I32, &y) != GP_OK) {
        rc = gp_cli_fail("bench", "allocating the input batch");
        goto done;
    }
    b->step_seconds = calloc((size_t)b->steps, sizeof *b->step_seconds);
    b->step_cpu_seconds = calloc((size_t)b->steps, sizeof *b->step_cpu_seconds);
    b->step_ceiling = calloc((size_t)b->steps, sizeof *b->step_ceiling);
    if (pipelined) {
        b->step_bubble = calloc((size_t)b->steps, sizeof *b->step_bubble);
        b->step_bubble_sim = calloc((size_t)b->steps, sizeof *b->step_bubble_sim);
        b->step_bubble_replay = calloc((size_t)b->steps, sizeof *b->step_bubble_replay);
        b->ndevices = b->stages * (b->popts.tensor_parallel > 0 ? b->popts.tensor_parallel : 1);
        b->stage_mem = calloc((size_t)b->ndevices, sizeof *b->stage_mem);
        b->last_stages = calloc((size_t)b->stages, sizeof *b->last_stages);
    }
    const bool ceiling_alone =
        on_cpu && pipelined && b->place.launcher != GP_LAUNCHER_MPI && b->ndevices > 1;
    if (ceiling_alone)
        b->step_ceiling_alone = calloc((size_t)b->steps, sizeof *b->step_ceiling_alone);
    if (!b->step_seconds || !b->step_cpu_seconds || !b->step_ceiling ||
        (ceiling_alone && !b->step_ceiling_alone) ||
        (pipelined && (!b->step_bubble || !b->step_bubble_sim || !b->step_bubble_replay ||
                       !b->stage_mem || !b->last_stages))) {
        fprintf(stderr, "gpipe bench: out of host memory\n");
        rc = GP_CLI_EXIT_RUNTIME;
        goto done;
    }
    for (int step = 0; step < b->warmup + b->steps; step++) {
        fill_batch(b, step, classes, &x, &y);
        float loss;
        double t0 = gp_cli_now(), c0 = gp_cli_cpu_now();
        if (gp_pipeline_step(pl, &x, &y, &loss) != GP_OK) {
            rc = gp_cli_fail("bench", "training step");
            goto done;
        }
        double dt = gp_cli_now() - t0, dcpu = gp_cli_cpu_now() - c0;
        b->final_loss = loss;
        bool warm = step < b->warmup;
        if (!warm) {
            int i = step - b->warmup;
            b->step_seconds[i] = dt;
            b->step_cpu_seconds[i] = dcpu;
            if (pipelined) {
                /* MPI: every rank's timeline and counters, for the stats (a collective). */
                if (gp_pipeline_gather(pl) != GP_OK ||
                    gp_pipeline_last_stats(pl, &b->last, b->last_stages) != GP_OK) {
                    rc = gp_cli_fail("bench", "pipeline statistics");
                    goto done;
                }
                b->step_bubble[i] = b->last.bubble_measured;
                b->step_bubble_sim[i] = b->last.bubble_simulated;
                b->step_bubble_replay[i] = b->last.bubble_replayed;
            }
            /* The ceiling next to each step: a shared machine's speed drifts
             * over a run, and a ratio of neighbours cancels most of it. On the threads
             * launcher every device's threads at once, as a step keeps them busy: cores that
             * clock lower when more of them work, or share caches and memory, lower the
             * ceiling as they lower the step (K times one device's sgemm would not show it).
             * Under MPI each rank measures its own device, all at about the same moment. */
            const int ceiling_threads = b->threads * (ceiling_alone ? b->ndevices : 1);
            char why[256];
            if (ceiling_dev) { /* the stages share GPU 0 here: its rate is the whole */
                if (gp_device_gemm_rate(ceiling_dev, GP_CLI_GPU_CEILING_N, 3,
                                        &b->step_ceiling[i]) != GP_OK) {
                    rc = gp_cli_fail("bench", "the GPU's GEMM ceiling");
                    goto done;
                }
            /* and one device's alone: how much the devices lose by working together */
            } else if (!gp_cli_bench_sgemm(2048, 2048, 2048, ceiling_threads, false, 1,
                                           &b->step_ceiling[i], why, sizeof why) ||
                       (ceiling_alone &&
                        !gp_cli_bench_sgemm(2048, 2048, 2048, b->threads, false, 1,
                                            &b->step_ceiling_alone[i], why, sizeof why))) {
                fprintf(stderr, "gpipe bench: %s\n", why);
                rc = GP_CLI_EXIT_RUNTIME;
                goto done;
            }
        }
        if (!b->quiet)
            fprintf(stderr, "  %s step %d/%d: %.3f s, loss %.4f\n", warm ? "warm-up" : "timed",
                    warm ? step + 1 : step - b->warmup + 1, warm ? b->warmup : b->steps, dt,
                    (double)loss);
    }
    if (b->place.launcher == GP_LAUNCHER_MPI) {
        int W = b->place.nranks;
        b->bytes_p2p = calloc((size_t)W, sizeof *b->bytes_p2p);
        b->bytes_allreduce = calloc((size_t)W, sizeof *b->bytes_allreduce);
        if (!b->bytes_p2p || !b->bytes_allreduce ||
            gp_pipeline_bytes_sent(pl, b->bytes_p2p, b->bytes_allreduce, W) != GP_OK) {
            rc = gp_cli_fail("bench", "bytes sent");
            goto done;
        }
    }
    if (pipelined && (b->place.launcher == GP_LAUNCHER_MPI || b->popts.tensor_parallel > 1)) {
        const int W = b->place.launcher == GP_LAUNCHER_MPI ? b->place.nranks : b->ndevices;
        b->bytes_tensor = calloc((size_t)W, sizeof *b->bytes_tensor);
        if (!b->bytes_tensor || gp_pipeline_bytes_tensor(pl, b->bytes_tensor, W) != GP_OK) {
            rc = gp_cli_fail("bench", "bytes given to the tensor axis");
            goto done;
        }
    }
    if (pipelined)
        rc = pipeline_memory(b, pl);
    else if (on_cpu)
        gp_device_mem_stats(dev, &b->mem); /* the stage device itself */
    else if (gp_pipeline_mem_stats_shard(pl, 0, 0, &b->mem) != GP_OK) /* the GPU the pipeline made */
        rc = gp_cli_fail("bench", "the GPU's memory counters");
    /* Every process's peak resident set (the whole process: library, BLAS buffers, MPI), to set
     * beside what its stage device counts. */
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    const uint64_t mine = (uint64_t)ru.ru_maxrss * 1024; /* Linux: kilobytes */
    b->nranks = b->place.nranks;
    b->rss_peak = calloc((size_t)b->nranks, sizeof *b->rss_peak);
    if (rc == GP_CLI_EXIT_OK &&
        (!b->rss_peak || gp_pipeline_allgather(pl, &mine, sizeof mine, b->rss_peak) != GP_OK))
        rc = gp_cli_fail("bench", "gathering each rank's peak RSS");
done:
    gp_tensor_release(&x);
    gp_tensor_release(&y);
    gp_pipeline_free(pl); /* before the model it borrows */
    gp_model_free(m);
    if (dev) gp_device_free(dev);
    if (ceiling_dev) gp_device_free(ceiling_dev);
    return rc;
}
