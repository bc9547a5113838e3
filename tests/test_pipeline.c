/* The pipeline runtime against the single-device trainer: for a transformer with dropout and a
 * convnet with batch norm (and the transformer with its embedding tied to its head), N steps
 * give bit-identical losses and parameter hashes for every
 * K = 1..4, every schedule (interleaved with V = 2 where K divides M, interleaved and zbv
 * where the model has 2K layers) and both re-materialization modes (the transformer in bf16 too,
 * gpipe and 1f1b, and other than in fp32; its blocks' bf16-kept activations give the bits of
 * keeping them in fp32, at a lower peak, and so does its bf16 weight copy, counted exactly);
 * bad options are named errors;
 * activations are all released after a step and every stage byte after free; the last step's
 * timeline (stats, Chrome trace, SVG) holds each stage's actions in the schedule's order. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include <sys/stat.h>
#include <unistd.h>

#include "plan/cores.h"
#include "plan/schedule.h"
#include "testutil.h"

#define M_MICRO 4
#define BATCH 8

/* One step's batch, keyed by the step. */
static void make_batch(gp_test_net net, int step, gp_test_batch *b) {
    gp_test_net_batch(net, BATCH, 1000 + (uint64_t)step, b);
}

typedef struct result {
    float loss[8];
    uint64_t hash;
    uint64_t static_bytes; /* params + grads + optimizer state over all devices */
    uint64_t peak_act;     /* the stages' peaks of activation memory, added */
} result;

static const uint64_t SEED = 77;

static void reference(gp_test_net net, int steps, gp_precision prec, result *r) {
    gp_model *m = gp_test_net_build(net);
    gp_device *dev;
    REQUIRE_OK(gp_device_cpu_new("ref", &dev));
    REQUIRE_OK(gp_model_init(m, dev, SEED));
    gp_optim_opts o = gp_test_net_optim(net);
    gp_pipeline_opts po = {.stages = 1, .micro_batches = M_MICRO, .schedule = GP_SCHEDULE_1F1B,
                           .remat = GP_REMAT_NONE, .precision = prec};
    gp_pipeline *t = NULL;
    REQUIRE_OK(gp_pipeline_new(m, &o, &po, 0, &t));
    CHECK(gp_device_precision(dev) == prec); /* the pipeline set it on the device it was given */
    for (int s = 0; s < steps; s++) {
        gp_test_batch b;
        make_batch(net, s, &b);
        REQUIRE_OK(gp_pipeline_step(t, &b.x, &b.y_t, &r->loss[s]));
    }
    r->hash = gp_test_hash(m);
    gp_mem_stats ms;
    gp_device_mem_stats(dev, &ms);
    r->static_bytes = ms.live[GP_MEM_PARAMS] + ms.live[GP_MEM_GRADS] + ms.live[GP_MEM_OPTIM];
    gp_pipeline_free(t);
    gp_model_free(m);
    gp_device_free(dev);
}

static int run_pipeline(gp_test_net net, int steps, int K, gp_schedule_kind sk, gp_remat rm,
                        gp_precision prec, result *r) {
    gp_model *m = gp_test_net_build(net);
    gp_optim_opts o = gp_test_net_optim(net);
    gp_pipeline_opts po = {
        .stages = K, .micro_batches = M_MICRO, .schedule = sk, .remat = rm, .precision = prec};
    gp_pipeline *p;
    gp_status s = gp_pipeline_new(m, &o, &po, SEED, &p);
    if (s != GP_OK) {
        fprintf(stderr, "gp_pipeline_new K=%d: %s\n", K, gp_last_error());
        gp_model_free(m);
        return 1;
    }
    CHECK_EQ_INT(gp_pipeline_stages(p), K);
    int bad = 0;
    for (int st = 0; st < steps && !bad; st++) {
        gp_test_batch b;
        make_batch(net, st, &b);
        if (gp_pipeline_step(p, &b.x, &b.y_t, &r->loss[st]) != GP_OK) {
            fprintf(stderr, "gp_pipeline_step K=%d step %d: %s\n", K, st, gp_last_error());
            bad = 1;
        }
    }
    r->hash = gp_test_hash(m);
    r->static_bytes = 0;
    for (int k = 0; k < K; k++) {
        gp_mem_stats ms;
        CHECK_OK(gp_pipeline_mem_stats(p, k, &ms));
        /* Between steps a stage holds no activation or workspace byte: stashes, passes and
         * messages were all released. */
        CHECK_EQ_INT(ms.live[GP_MEM_ACTIVATIONS], 0);
        CHECK_EQ_INT(ms.live[GP_MEM_WORKSPACE], 0);
        CHECK(ms.live[GP_MEM_PARAMS] > 0);
        CHECK(ms.peak[GP_MEM_ACTIVATIONS] > 0);
        r->static_bytes += ms.live[GP_MEM_PARAMS] + ms.live[GP_MEM_GRADS] + ms.live[GP_MEM_OPTIM];
        r->peak_act += ms.peak[GP_MEM_ACTIVATIONS];
    }
    gp_mem_stats none;
    CHECK_FAILS(gp_pipeline_mem_stats(p, K, &none), GP_INVALID_ARGUMENT, "outside");
    gp_pipeline_free(p); /* asserts that every stage device's live bytes are back to zero */
    /* The parameters lived on the stage devices: released with them. */
    for (int i = 0; i < gp_model_nparam_tensors(m); i++) {
        gp_param_info pi;
        CHECK_OK(gp_model_param(m, i, &pi));
        CHECK(pi.value->data == NULL);
    }
    gp_model_free(m);
    return bad;
}

/* nsched: the first nsched schedule kinds (gpipe, 1f1b, zbh1, interleaved, zbv). */
static void exactness(gp_test_net net, int steps, int maxk, int nsched, gp_precision prec) {
    const char *name = net == GP_TEST_TRANSFORMER        ? "transformer"
                       : net == GP_TEST_TRANSFORMER_TIED ? "tied transformer"
                                                         : "convnet";
    result ref;
    memset(&ref, 0, sizeof ref);
    reference(net, steps, prec, &ref);
    CHECK(ref.loss[0] > 0);
    CHECK(ref.loss[steps - 1] != ref.loss[0]); /* it trains: equal hashes below mean something */
    gp_model *probe = gp_test_net_build(net);
    const int L = gp_model_nlayers(probe);
    gp_model_free(probe);
    for (int K = 1; K <= maxk; K++)
        for (int sk = 0; sk < nsched; sk++) /* gpipe, 1f1b, zbh1, interleaved (V = 2), zbv */
            for (int rm = 0; rm < 2; rm++) {
                if (sk == GP_SCHEDULE_INTERLEAVED && M_MICRO % K) continue;
                if ((sk == GP_SCHEDULE_INTERLEAVED || sk == GP_SCHEDULE_ZBV) && 2 * K > L) continue;
                result r;
                memset(&r, 0, sizeof r);
                int bad =
                    run_pipeline(net, steps, K, (gp_schedule_kind)sk, (gp_remat)rm, prec, &r);
                CHECK(!bad);
                int same = !bad && memcmp(r.loss, ref.loss, sizeof ref.loss) == 0 && r.hash == ref.hash;
                if (!same) {
                    fprintf(stderr, "%s %s K=%d %s remat %s: NOT bit-identical to the trainer\n",
                            name, gp_precision_name(prec), K,
                            gp_schedule_kind_name((gp_schedule_kind)sk),
                            gp_remat_name((gp_remat)rm));
                    for (int s = 0; s < steps; s++)
                        fprintf(stderr, "  step %d loss %.9g vs %.9g\n", s, r.loss[s], ref.loss[s]);
                    fprintf(stderr, "  hash %016llx vs %016llx\n", (unsigned long long)r.hash,
                            (unsigned long long)ref.hash);
                    gp_test_failures++;
                }
                CHECK_EQ_INT(r.static_bytes, ref.static_bytes);
            }
    printf("%s %s: %d steps, M = %d, K = 1..%d x the first %d of {gpipe, 1f1b, zbh1, interleaved, "
           "zbv (2K <= %d)} x {cell, none}: loss %.6f -> %.6f, params %016llx\n",
           name, gp_precision_name(prec), steps, M_MICRO, maxk, nsched, L, ref.loss[0],
           ref.loss[steps - 1], (unsigned long long)ref.hash);
}

/* bf16 GEMM operands (gp_precision) are bitwise across K and schedules as fp32 is, and change
 * the training: other bits from the first step's loss on, close to fp32's. */
static void bf16_exactness(int steps) {
    exactness(GP_TEST_TRANSFORMER, steps, 4, 2, GP_PRECISION_BF16);
    result f, b;
    memset(&f, 0, sizeof f);
    memset(&b, 0, sizeof b);
    reference(GP_TEST_TRANSFORMER, steps, GP_PRECISION_FP32, &f);
    reference(GP_TEST_TRANSFORMER, steps, GP_PRECISION_BF16, &b);
    CHECK(f.hash != b.hash);
    for (int s = 0; s < steps; s++) {
        CHECK(f.loss[s] != b.loss[s]);
        /* Each product's operands move by at most 2^-8 relative (bf16's unit roundoff), the
         * logits of this small net by a few times that: the loss by well under 1%. */
        CHECK(fabsf(f.loss[s] - b.loss[s]) < 1e-2f * f.loss[s]);
    }
    printf("transformer bf16 vs fp32: loss %.6f vs %.6f after %d steps\n", b.loss[steps - 1],
           f.loss[steps - 1], steps);
}

/* A bf16 device keeps the blocks' activations that are only products' operands in bf16,
 * rounded once where made: the bits of keeping them in fp32 (GP_BF16_ACTIVATIONS=fp32), each
 * product rounding them, at K = 1 and 2 in both remat modes, with less activation memory. */
static void bf16_activations(int steps) {
    result ref;
    memset(&ref, 0, sizeof ref);
    reference(GP_TEST_TRANSFORMER, steps, GP_PRECISION_BF16, &ref);
    for (int K = 1; K <= 2; K++)
        for (int rm = 0; rm < 2; rm++) {
            result r[2]; /* activations in bf16, in fp32 */
            memset(r, 0, sizeof r);
            for (int kept = 0; kept < 2; kept++) {
                if (kept) setenv("GP_BF16_ACTIVATIONS", "fp32", 1);
                CHECK(!run_pipeline(GP_TEST_TRANSFORMER, steps, K, GP_SCHEDULE_1F1B,
                                    (gp_remat)rm, GP_PRECISION_BF16, &r[kept]));
                unsetenv("GP_BF16_ACTIVATIONS");
                if (memcmp(r[kept].loss, ref.loss, sizeof ref.loss) != 0 ||
                    r[kept].hash != ref.hash) {
                    fprintf(stderr, "bf16 activations in %s, K=%d remat %s: NOT the bits of "
                            "bf16 activations on one device\n", kept ? "fp32" : "bf16", K,
                            gp_remat_name((gp_remat)rm));
                    gp_test_failures++;
                }
            }
            CHECK(r[0].peak_act < r[1].peak_act);
            printf("bf16 activations, K=%d remat %s: peak activation bytes %llu (%llu in fp32), "
                   "the same bits\n", K, gp_remat_name((gp_remat)rm),
                   (unsigned long long)r[0].peak_act, (unsigned long long)r[1].peak_act);
        }
}

/* On a bf16 device each store keeps a bf16 copy of the weights the products read, rounded once
 * per stage run (model/store.h): the bits of every product rounding them itself
 * (GP_BF16_WEIGHT_COPY=off), for the transformer and the tied one (its head's weight a copy of
 * the embedding's table on another stage at K = 2), at K = 1 and 2, with the backward whole
 * (1f1b) and split (zbh1: the weight part's own products), in every remat mode. The copy is
 * counted as PARAMS, exactly its bytes; fp32 keeps none. */
static void bf16_weight_copy(int steps) {
    /* the test transformer: 4 blocks of C = 32, F = 64 (qkv 3C x C, proj C x C, fc F x C, mlp
     * proj C x F) and the head's 64 x 32 weight, each a multiple of GP_BF16_COPY_ALIGN
     * elements; 2 bytes an element */
    const uint64_t C = 32, F = 64, vocab = 64;
    const uint64_t want = 2 * (4 * (3 * C * C + C * C + F * C + C * F) + vocab * C);
    static const gp_test_net nets[2] = {GP_TEST_TRANSFORMER, GP_TEST_TRANSFORMER_TIED};
    static const gp_schedule_kind scheds[2] = {GP_SCHEDULE_1F1B, GP_SCHEDULE_ZBH1};
    for (int ni = 0; ni < 2; ni++) {
        result f;
        memset(&f, 0, sizeof f);
        CHECK(!run_pipeline(nets[ni], steps, 1, GP_SCHEDULE_1F1B, GP_REMAT_NONE,
                            GP_PRECISION_FP32, &f));
        for (int K = 1; K <= 2; K++)
            for (int si = 0; si < 2; si++)
                for (int rm = 0; rm < 3; rm++) { /* cell, none, selective */
                    result r[2]; /* with the copy, without */
                    memset(r, 0, sizeof r);
                    for (int off = 0; off < 2; off++) {
                        if (off) setenv("GP_BF16_WEIGHT_COPY", "off", 1);
                        CHECK(!run_pipeline(nets[ni], steps, K, scheds[si], (gp_remat)rm,
                                            GP_PRECISION_BF16, &r[off]));
                        unsetenv("GP_BF16_WEIGHT_COPY");
                    }
                    if (memcmp(r[0].loss, r[1].loss, sizeof r[0].loss) != 0 ||
                        r[0].hash != r[1].hash) {
                        fprintf(stderr, "%s bf16 K=%d %s remat %s: the weight copy's run is NOT "
                                "the bits of rounding at each product\n",
                                ni ? "tied transformer" : "transformer", K,
                                gp_schedule_kind_name(scheds[si]), gp_remat_name((gp_remat)rm));
                        for (int s = 0; s < steps; s++)
                            fprintf(stderr, "  step %d loss %.9g vs %.9g\n", s, r[0].loss[s],
                                    r[1].loss[s]);
                        gp_test_failures++;
                    }
                    CHECK(r[0].loss[steps - 1] != r[0].loss[0]);
                    CHECK_EQ_INT(r[0].static_bytes - r[1].static_bytes, want);
                    CHECK_EQ_INT(r[1].static_bytes, f.static_bytes);
                }
        printf("%s bf16: the weight copy (%llu bytes of PARAMS) trains to the bits of rounding "
               "at each product, K = 1, 2 x {1f1b, zbh1} x {cell, none, selective}\n",
               ni ? "tied transformer" : "transformer", (unsigned long long)want);
    }
}

static void errors(void) {
    gp_model *m = gp_test_net_build(GP_TEST_TRANSFORMER); /* 8 layers */
    gp_optim_opts o = gp_test_net_optim(GP_TEST_TRANSFORMER);
    gp_pipeline *p = NULL;
    gp_pipeline_opts po = {.stages = 9, .micro_batches = 2};
    CHECK_FAILS(gp_pipeline_new(m, &o, &po, SEED, &p), GP_INVALID_ARGUMENT,
                "pipeline: stages 9: more than the model's 8 layers");
    CHECK(p == NULL);
    po.stages = -1;
    CHECK_FAILS(gp_pipeline_new(m, &o, &po, SEED, &p), GP_INVALID_ARGUMENT,
                "stages -1: expected at least 1");
    po.stages = 2;
    po.micro_batches = -3;
    CHECK_FAILS(gp_pipeline_new(m, &o, &po, SEED, &p), GP_INVALID_ARGUMENT,
                "micro_batches -3: expected at least 1");
    /* schedules that run several cells per stage: their constraints named */
    po = (gp_pipeline_opts){.stages = 2, .micro_batches = 3, .schedule = GP_SCHEDULE_INTERLEAVED};
    CHECK_FAILS(gp_pipeline_new(m, &o, &po, SEED, &p), GP_INVALID_ARGUMENT,
                "micro_batches 3: not a multiple of the 2 stages");
    po = (gp_pipeline_opts){.stages = 5, .micro_batches = 5, .schedule = GP_SCHEDULE_ZBV};
    CHECK_FAILS(gp_pipeline_new(m, &o, &po, SEED, &p), GP_INVALID_ARGUMENT,
                "stages 5 x 2 cells per stage: more than the model's 8 layers");
    po = (gp_pipeline_opts){.stages = 2, .micro_batches = 2, .schedule = GP_SCHEDULE_ZBV,
                            .chunks = 3};
    CHECK_FAILS(gp_pipeline_new(m, &o, &po, SEED, &p), GP_INVALID_ARGUMENT,
                "chunks 3: schedule zbv with 3 cells per stage (chunks); expected 2");
    /* the options' one check (gp_pipeline_opts_check), its message as it is */
    po = (gp_pipeline_opts){.stages = 2, .micro_batches = 2, .remat = (gp_remat)9};
    CHECK(gp_pipeline_opts_check(m, 0, &po, NULL) == GP_INVALID_ARGUMENT);
    char want[1024];
    snprintf(want, sizeof want, "pipeline: %s", gp_last_error());
    CHECK_FAILS(gp_pipeline_new(m, &o, &po, SEED, &p), GP_INVALID_ARGUMENT, want);
    /* the precision: a value that is none named, as the API's calls on it */
    po = (gp_pipeline_opts){.stages = 2, .micro_batches = 2, .precision = (gp_precision)7};
    CHECK_FAILS(gp_pipeline_new(m, &o, &po, SEED, &p), GP_INVALID_ARGUMENT,
                "precision 7: expected fp32 (0) or bf16 (1)");
    gp_precision pr = GP_PRECISION_FP32;
    CHECK_OK(gp_precision_parse("bf16", &pr));
    CHECK(pr == GP_PRECISION_BF16 && strcmp(gp_precision_name(pr), "bf16") == 0);
    CHECK_FAILS(gp_precision_parse("fp16", &pr), GP_INVALID_ARGUMENT,
                "precision 'fp16': unknown; expected fp32 or bf16");
    CHECK(pr == GP_PRECISION_BF16 && strcmp(gp_precision_name((gp_precision)9), "unknown") == 0);
    CHECK_FAILS(gp_device_set_precision(NULL, GP_PRECISION_BF16), GP_INVALID_ARGUMENT, "NULL");
    CHECK(gp_device_precision(NULL) == GP_PRECISION_FP32);
    gp_device *pd;
    REQUIRE_OK(gp_device_cpu_new("prec", &pd));
    CHECK(gp_device_precision(pd) == GP_PRECISION_FP32); /* the default */
    CHECK_FAILS(gp_device_set_precision(pd, (gp_precision)2), GP_INVALID_ARGUMENT,
                "device prec: precision 2; expected fp32 (0) or bf16 (1)");
    gp_device_free(pd);
    /* replicas are processes */
    po = (gp_pipeline_opts){.stages = 2, .micro_batches = 2, .data_parallel = 2};
    CHECK_FAILS(gp_pipeline_new(m, &o, &po, SEED, &p), GP_INVALID_ARGUMENT,
                "data_parallel 2: needs the MPI launcher");
    /* stage devices on GPUs: where there is none (or no CUDA in the build), a named refusal */
    int ngpu = 0;
    if (gp_cuda_device_count(&ngpu) != GP_OK) {
        po = (gp_pipeline_opts){.stages = 2, .micro_batches = 2, .device_type = GP_DEVICE_CUDA};
        CHECK_FAILS(gp_pipeline_new(m, &o, &po, SEED, &p), GP_UNSUPPORTED, "CUDA");
        CHECK(p == NULL);
    }
    po = (gp_pipeline_opts){.stages = 2, .device_type = (gp_device_type)7};
    CHECK_FAILS(gp_pipeline_new(m, &o, &po, SEED, &p), GP_INVALID_ARGUMENT, "device type 7");
    po = (gp_pipeline_opts){.stages = 2, .micro_batches = 3};
    int part[2] = {0, 8};
    po.micro_batches = 3;
    po.partition = part;
    CHECK_FAILS(gp_pipeline_new(m, &o, &po, SEED, &p), GP_INVALID_ARGUMENT, "8");
    part[1] = 3;
    REQUIRE_OK(gp_pipeline_new(m, &o, &po, SEED, &p));
    gp_test_batch b;
    make_batch(GP_TEST_TRANSFORMER, 0, &b);
    float loss = -1;
    CHECK_FAILS(gp_pipeline_step(p, &b.x, &b.y_t, &loss), GP_INVALID_ARGUMENT,
                "batch 8 is not divisible by 3 micro-batches");
    CHECK(loss == -1);
    /* A failing step leaves the pipeline usable: 6 of the 8 rows divide by 3. */
    gp_tensor x6 = gp_tensor_view(b.xi, gp_shape2(6, 16), GP_I32);
    gp_tensor y6 = gp_tensor_view(b.y, gp_shape2(6, 16), GP_I32);
    CHECK_OK(gp_pipeline_step(p, &x6, &y6, &loss));
    CHECK(loss > 0);
    gp_tensor wrong = gp_tensor_view(b.y, gp_shape2(6, 16), GP_F32);
    CHECK_FAILS(gp_pipeline_step(p, &wrong, &y6, &loss), GP_SHAPE, "expected");
    /* One pipeline (or trainer) per model. */
    gp_pipeline *p2 = NULL;
    po.partition = NULL;
    CHECK_FAILS(gp_pipeline_new(m, &o, &po, SEED, &p2), GP_INVALID_ARGUMENT, "already has");
    gp_pipeline_free(p);
    gp_pipeline_free(NULL);
    gp_model_free(m);
}

/* A stage that runs out of memory stops every stage; the error names the device and limit. */
static void stage_failure(void) {
    gp_model *m = gp_test_net_build(GP_TEST_CONVNET);
    gp_optim_opts o = gp_test_net_optim(GP_TEST_CONVNET);
    /* What the plan needs at one example per micro-batch (the batch is not given): too little
     * for the step's micro-batches of 2. */
    gp_pipeline_opts po = {.stages = 3, .micro_batches = 4, .schedule = GP_SCHEDULE_1F1B};
    gp_plan plan;
    REQUIRE_OK(gp_plan_make(m, po.micro_batches, &o, &po, 1, &plan));
    for (int k = 0; k < plan.stages; k++)
        if (plan.cells[k].total_bytes > po.memory_limit) po.memory_limit = plan.cells[k].total_bytes;
    gp_plan_free(&plan);
    gp_pipeline *p;
    REQUIRE_OK(gp_pipeline_new(m, &o, &po, SEED, &p));
    gp_test_batch b;
    make_batch(GP_TEST_CONVNET, 0, &b);
    float loss = -1;
    gp_status s = gp_pipeline_step(p, &b.x, &b.y_t, &loss);
    CHECK_EQ_INT(s, GP_MEMORY_LIMIT);
    CHECK(strstr(gp_last_error(), "stage") != NULL);
    CHECK(loss == -1);
    for (int k = 0; k < 3; k++) {
        gp_mem_stats ms;
        CHECK_OK(gp_pipeline_mem_stats(p, k, &ms));
        CHECK_EQ_INT(ms.live[GP_MEM_ACTIVATIONS], 0);
    }
    gp_pipeline_free(p);
    gp_model_free(m);
}

/* The micro-batches of stage k's actions of one kind, in the schedule's order. */
/* Stage k's actions of one kind, all its chunks: micro-batches and chunks in schedule order. */
static int schedule_mbs_chunks(const gp_schedule *s, int k, gp_action_kind kind, int *mbs,
                               int *chunks) {
    int n = 0;
    for (int i = 0; i < s->stage[k].n; i++)
        if (s->stage[k].a[i].kind == kind) {
            if (chunks) chunks[n] = s->stage[k].a[i].chunk;
            mbs[n++] = s->stage[k].a[i].mb;
        }
    return n;
}

static int schedule_mbs(const gp_schedule *s, int k, gp_action_kind kind, int *mbs) {
    return schedule_mbs_chunks(s, k, kind, mbs, NULL);
}

/* Checks the Chrome trace of a K-stage step against the schedule: per stage, exactly V M forward
 * and V M backward events (and V M recompute with remat cell, V M weight events with a split
 * backward) in the schedule's order of micro-batches and chunks, one send and one receive per
 * message, and K "stage k" tracks. */
static void check_chrome(const char *path, const gp_schedule *s, gp_remat rm) {
    const int K = s->stages, M = s->micro_batches * (s->chunks > 1 ? s->chunks : 1);
    char *text = gp_test_read_file(path);
    CHECK(text != NULL);
    cJSON *root = text ? cJSON_Parse(text) : NULL;
    free(text);
    CHECK(root != NULL);
    if (!root) return;
    cJSON *evs = cJSON_GetObjectItemCaseSensitive(root, "traceEvents");
    CHECK(cJSON_IsArray(evs));
    enum { NK = 8 };
    static const char *const cats[NK] = {"forward", "backward",  "recompute", "send",
                                         "recv",    "wait",      "optimizer", "weight"};
    int tracks = 0, count[8][NK] = {{0}}, seen[8][NK][16], seen_chunk[8][NK][16];
    const cJSON *e;
    cJSON_ArrayForEach(e, evs) {
        const char *ph = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(e, "ph"));
        const char *name = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(e, "name"));
        int tid = (int)cJSON_GetNumberValue(cJSON_GetObjectItemCaseSensitive(e, "tid"));
        if (ph && name && strcmp(ph, "M") == 0 && strcmp(name, "thread_name") == 0) {
            const cJSON *args = cJSON_GetObjectItemCaseSensitive(e, "args");
            const char *tn = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(args, "name"));
            char want[32];
            snprintf(want, sizeof want, "stage %d", tid);
            CHECK(tn && strcmp(tn, want) == 0);
            tracks++;
            continue;
        }
        if (!ph || strcmp(ph, "X") != 0) continue;
        CHECK(tid >= 0 && tid < K);
        if (tid < 0 || tid >= K) continue;
        const char *cat = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(e, "cat"));
        int kind = -1;
        for (int j = 0; j < NK && cat; j++)
            if (strcmp(cat, cats[j]) == 0) kind = j;
        CHECK(kind >= 0);
        if (kind < 0) continue;
        CHECK(cJSON_GetNumberValue(cJSON_GetObjectItemCaseSensitive(e, "dur")) >= 0);
        if (kind <= 2 || kind == 7) { /* computation: remember the micro-batch order */
            const cJSON *args = cJSON_GetObjectItemCaseSensitive(e, "args");
            int mb = (int)cJSON_GetNumberValue(cJSON_GetObjectItemCaseSensitive(args, "micro_batch"));
            const cJSON *ch = cJSON_GetObjectItemCaseSensitive(args, "chunk"); /* absent: 0 */
            if (count[tid][kind] < 16) {
                seen[tid][kind][count[tid][kind]] = mb;
                seen_chunk[tid][kind][count[tid][kind]] = ch ? (int)cJSON_GetNumberValue(ch) : 0;
            }
        }
        count[tid][kind]++;
    }
    CHECK_EQ_INT(tracks, K);
    for (int k = 0; k < K; k++) {
        int want[16], want_chunk[16];
        CHECK_EQ_INT(schedule_mbs_chunks(s, k, GP_ACT_FORWARD, want, want_chunk), M);
        CHECK_EQ_INT(count[k][0], M);
        for (int i = 0; i < M && i < count[k][0]; i++) {
            CHECK_EQ_INT(seen[k][0][i], want[i]);
            CHECK_EQ_INT(seen_chunk[k][0][i], want_chunk[i]);
        }
        /* a split backward's input part is the backward event, its weight part its own */
        const bool split = schedule_mbs(s, k, GP_ACT_BACKWARD_INPUT, want) > 0;
        CHECK_EQ_INT(schedule_mbs(s, k, split ? GP_ACT_BACKWARD_INPUT : GP_ACT_BACKWARD, want), M);
        CHECK_EQ_INT(count[k][1], M);
        for (int i = 0; i < M && i < count[k][1]; i++) CHECK_EQ_INT(seen[k][1][i], want[i]);
        CHECK_EQ_INT(count[k][2], rm == GP_REMAT_CELL ? M : 0);
        for (int i = 0; i < count[k][2] && i < M; i++) CHECK_EQ_INT(seen[k][2][i], want[i]);
        CHECK_EQ_INT(schedule_mbs(s, k, GP_ACT_BACKWARD_WEIGHT, want), split ? M : 0);
        CHECK_EQ_INT(count[k][7], split ? M : 0);
        for (int i = 0; i < count[k][7] && i < M; i++) CHECK_EQ_INT(seen[k][7][i], want[i]);
        CHECK_EQ_INT(count[k][3], schedule_mbs(s, k, GP_ACT_SEND_ACT, want) +
                                      schedule_mbs(s, k, GP_ACT_SEND_GRAD, want));
        CHECK_EQ_INT(count[k][4], schedule_mbs(s, k, GP_ACT_RECV_ACT, want) +
                                      schedule_mbs(s, k, GP_ACT_RECV_GRAD, want));
        /* every link of each of the stage's cells carries each micro-batch once */
        int links = 0;
        for (int c = 0; c < gp_schedule_cells(s); c++) {
            int ck, cv;
            gp_schedule_place(s, c, &ck, &cv);
            if (ck == k) links += (c > 0) + (c < gp_schedule_cells(s) - 1);
        }
        CHECK_EQ_INT(count[k][3], links * s->micro_batches);
        CHECK(count[k][6] >= 1);
    }
    cJSON_Delete(root);
}

/* Two steps (the timeline holds the last one only), then its figures and files. */
static void timeline(int K, gp_schedule_kind sk, gp_remat rm, const int *partition) {
    gp_model *m = gp_test_net_build(GP_TEST_TRANSFORMER);
    gp_optim_opts o = gp_test_net_optim(GP_TEST_TRANSFORMER);
    gp_pipeline_opts po = {.stages = K, .micro_batches = M_MICRO, .schedule = sk, .remat = rm,
                           .partition = partition};
    gp_pipeline *p;
    REQUIRE_OK(gp_pipeline_new(m, &o, &po, SEED, &p));
    gp_pipeline_stats st;
    gp_stage_stats ss[8];
    CHECK_FAILS(gp_pipeline_last_stats(p, &st, ss), GP_INVALID_ARGUMENT, "no step has run");
    CHECK_FAILS(gp_pipeline_write_trace(p, gp_scratch_path("early.json")), GP_INVALID_ARGUMENT,
                "early.json");
    for (int step = 0; step < 2; step++) {
        gp_test_batch b;
        make_batch(GP_TEST_TRANSFORMER, step, &b);
        float loss;
        REQUIRE_OK(gp_pipeline_step(p, &b.x, &b.y_t, &loss));
    }
    CHECK_OK(gp_pipeline_last_stats(p, &st, ss));
    CHECK_EQ_INT(st.stages, K);
    CHECK_EQ_INT(st.micro_batches, M_MICRO);
    int V;
    REQUIRE_OK(gp_schedule_kind_chunks(sk, 0, &V));
    CHECK(st.bubble_theory == (double)(K - 1) / (double)(V * M_MICRO + K - 1));
    CHECK(st.bubble_measured >= 0 && st.bubble_measured < 1);
    CHECK(st.bubble_simulated >= 0 && st.bubble_simulated < 1);
    CHECK(st.bubble_replayed > 0 && st.bubble_replayed < 1); /* K > 1: some fill and drain */
    CHECK(st.step_s > 0);
    for (int k = 0; k < K; k++) {
        CHECK(ss[k].busy_fraction > 0 && ss[k].busy_fraction <= 1);
        if (partition) CHECK_EQ_INT(ss[k].first_layer, partition[k]);
        if (k > 0) CHECK(ss[k].first_layer > ss[k - 1].first_layer);
    }
    printf("timeline K = %d, %s, remat %s: step %.2f ms, bubble measured %.3f, theory %.3f, "
           "simulated %.3f, stage 0 busy %.2f\n",
           K, gp_schedule_kind_name(sk), gp_remat_name(rm), st.step_s * 1e3, st.bubble_measured,
           st.bubble_theory, st.bubble_simulated, ss[0].busy_fraction);
    CHECK_EQ_INT(ss[0].first_layer, 0);
    CHECK(ss[K - 1].first_layer < gp_model_nlayers(m));
    gp_schedule s = {0};
    REQUIRE_OK(gp_schedule_generate(sk, K, M_MICRO, V, &s));
    char json[512], svg[512];
    snprintf(json, sizeof json, "%s", gp_scratch_path("trace.json"));
    snprintf(svg, sizeof svg, "%s", gp_scratch_path("timeline.svg"));
    CHECK_OK(gp_pipeline_write_trace(p, json));
    gp_scratch_remember(json);
    check_chrome(json, &s, rm);
    CHECK_OK(gp_pipeline_write_timeline(p, svg));
    gp_scratch_remember(svg);
    char *text = gp_test_read_file(svg);
    CHECK(text && strstr(text, "stage 0") && strstr(text, "<svg"));
    CHECK(text && strstr(text, gp_schedule_kind_name(sk)));
    /* split backwards: their weight parts drawn apart, in the legend */
    CHECK(text && !strstr(text, "weight gradients") == !gp_schedule_kind_splits(sk));
    free(text);
    char missing[512];
    snprintf(missing, sizeof missing, "%s/no-such-folder/t.json", gp_scratch_dir());
    CHECK_FAILS(gp_pipeline_write_trace(p, missing), GP_IO, "no-such-folder/t.json");
    snprintf(missing, sizeof missing, "%s/no-such-folder/t.svg", gp_scratch_dir());
    CHECK_FAILS(gp_pipeline_write_timeline(p, missing), GP_IO, "no-such-folder/t.svg");
    gp_schedule_free(&s);
    gp_pipeline_free(p);
    gp_model_free(m);
}

/* Writes cpuN/topology/thread_siblings_list under dir for cpus 0..n-1 (lists[i] NULL: no file,
 * as where sysfs is missing), or removes those files and folders again (lists NULL). */
static void fake_topology(const char *dir, const char *const *lists, int n) {
    char path[256];
    for (int c = 0; c < n; c++) {
        static const char *const parts[] = {"", "/topology", "/topology/thread_siblings_list"};
        if (!lists) {
            for (int i = 2; i >= 0; i--) {
                snprintf(path, sizeof path, "%s/cpu%d%s", dir, c, parts[i]);
                (i == 2 ? unlink : rmdir)(path);
            }
            continue;
        }
        for (int i = 0; i < 2; i++) {
            snprintf(path, sizeof path, "%s/cpu%d%s", dir, c, parts[i]);
            CHECK(mkdir(path, 0700) == 0);
        }
        if (!lists[c]) continue;
        snprintf(path, sizeof path, "%s/cpu%d%s", dir, c, parts[2]);
        FILE *f = fopen(path, "w");
        if (!f) {
            fprintf(stderr, "test_pipeline: cannot write %s\n", path);
            exit(1);
        }
        fprintf(f, "%s\n", lists[c]);
        fclose(f);
    }
}

/* Pinned stages take one hardware thread of each physical core before any core's second, for
 * both numberings of SMT siblings; without SMT, or without sysfs, the order stays as given. */
static void core_order(void) {
    char dir[] = "/tmp/gp_cores_XXXXXX";
    if (!mkdtemp(dir)) {
        fprintf(stderr, "test_pipeline: cannot make %s\n", dir);
        exit(1);
    }
    /* siblings adjacent (0-1, 2-3, ...): as on many cloud machines */
    static const char *const adjacent[8] = {"0-1", "0-1", "2-3", "2-3", "4-5", "4-5", "6-7", "6-7"};
    fake_topology(dir, adjacent, 8);
    int cores[8] = {0, 1, 2, 3, 4, 5, 6, 7};
    gp_cores_order_by_siblings(dir, cores, 8);
    static const int adjacent_want[8] = {0, 2, 4, 6, 1, 3, 5, 7};
    for (int i = 0; i < 8; i++) CHECK_EQ_INT(cores[i], adjacent_want[i]);
    /* a process allowed only part of the machine: 3 and 5 without their siblings 2 and 4 */
    int part[4] = {0, 1, 3, 5};
    gp_cores_order_by_siblings(dir, part, 4);
    static const int part_want[4] = {0, 3, 5, 1};
    for (int i = 0; i < 4; i++) CHECK_EQ_INT(part[i], part_want[i]);
    fake_topology(dir, NULL, 8);
    /* siblings n/2 apart (0,4 and 1,5 ...), given siblings side by side */
    static const char *const halves[8] = {"0,4", "1,5", "2,6", "3,7", "0,4", "1,5", "2,6", "3,7"};
    fake_topology(dir, halves, 8);
    static const int halves_in[8] = {0, 4, 1, 5, 2, 6, 3, 7};
    for (int i = 0; i < 8; i++) cores[i] = halves_in[i];
    gp_cores_order_by_siblings(dir, cores, 8);
    for (int i = 0; i < 8; i++) CHECK_EQ_INT(cores[i], i);
    fake_topology(dir, NULL, 8);
    /* four threads a core, listed as a range and a comma: 0-1,4-5 and 2-3,6-7 */
    static const char *const smt4[8] = {"0-1,4-5", "0-1,4-5", "2-3,6-7", "2-3,6-7",
                                        "0-1,4-5", "0-1,4-5", "2-3,6-7", "2-3,6-7"};
    fake_topology(dir, smt4, 8);
    for (int i = 0; i < 8; i++) cores[i] = i;
    gp_cores_order_by_siblings(dir, cores, 8);
    static const int smt4_want[8] = {0, 2, 1, 3, 4, 6, 5, 7};
    for (int i = 0; i < 8; i++) CHECK_EQ_INT(cores[i], smt4_want[i]);
    fake_topology(dir, NULL, 8);
    /* no SMT, and a cpu whose list is missing: unchanged */
    static const char *const single[4] = {"0", "1", NULL, "3"};
    fake_topology(dir, single, 4);
    int four[4] = {3, 0, 2, 1};
    gp_cores_order_by_siblings(dir, four, 4);
    static const int four_want[4] = {3, 0, 2, 1};
    for (int i = 0; i < 4; i++) CHECK_EQ_INT(four[i], four_want[i]);
    fake_topology(dir, NULL, 4);
    CHECK(rmdir(dir) == 0);
    /* this machine's own cores: each once, however ordered */
    int mine[1024];
    const int n = gp_pinning_cores(mine, 1024);
    CHECK(n >= 1);
    for (int i = 0; i < n; i++)
        for (int j = 0; j < i; j++) CHECK(mine[i] != mine[j]);
}

int main(void) {
    int quick = getenv("GP_TEST_QUICK") != NULL;
    core_order();
    errors();
    stage_failure();
    exactness(GP_TEST_TRANSFORMER, quick ? 2 : 3, 4, 5, GP_PRECISION_FP32);
    bf16_exactness(quick ? 2 : 3);
    bf16_activations(quick ? 2 : 3);
    bf16_weight_copy(quick ? 2 : 3);
    exactness(GP_TEST_CONVNET, quick ? 2 : 3, 4, 5, GP_PRECISION_FP32);
    exactness(GP_TEST_TRANSFORMER_TIED, quick ? 2 : 3, 4, 5, GP_PRECISION_FP32);
    gp_scratch_init("test_pipeline");
    timeline(2, GP_SCHEDULE_GPIPE, GP_REMAT_NONE, NULL);
    static const int thirds[3] = {0, 2, 4};
    timeline(3, GP_SCHEDULE_1F1B, GP_REMAT_CELL, thirds);
    timeline(3, GP_SCHEDULE_GPIPE, GP_REMAT_CELL, NULL);
    timeline(3, GP_SCHEDULE_ZBH1, GP_REMAT_CELL, NULL);
    timeline(2, GP_SCHEDULE_ZBH1, GP_REMAT_NONE, NULL);
    timeline(2, GP_SCHEDULE_INTERLEAVED, GP_REMAT_CELL, NULL);
    timeline(2, GP_SCHEDULE_INTERLEAVED, GP_REMAT_NONE, NULL);
    timeline(2, GP_SCHEDULE_ZBV, GP_REMAT_CELL, NULL);
    timeline(3, GP_SCHEDULE_ZBV, GP_REMAT_NONE, NULL);
    gp_scratch_cleanup();
    return gp_test_finish("test_pipeline");
}
