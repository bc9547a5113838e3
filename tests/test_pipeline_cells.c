/* How the pipeline runtime chooses its cells: the profiling pass behind --balance time (every
 * layer timed, the model left as it was), cells balanced on given times in the plan and the
 * runtime alike, the runtime's cells equal to gp_plan_make's for the same batch and memory
 * limit (per schedule and remat mode), results that do not depend on the cells, stage
 * threads pinned to cores only when there are enough of them, and the library's threads named
 * while the caller's keep theirs. */
#define _GNU_SOURCE /* sched_getaffinity: how many cores this process may use */
#include <math.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>

#include "kernels/cpu/isa.h"
#include "testutil.h"

#define BATCH 8
#define SEQ 16

static gp_model *transformer(int layers) {
    gp_transformer_config c = {.vocab = 64, .dim = 32, .heads = 4, .d_ff = 64, .layers = layers,
                               .seq_len = SEQ, .dropout = 0.1f};
    gp_model *m = NULL;
    REQUIRE_OK(gp_model_transformer(&c, &m));
    return m;
}

typedef struct tokens {
    int32_t x[BATCH * SEQ], y[BATCH * SEQ];
    gp_tensor xt, yt;
} tokens;

static void make_tokens(int step, tokens *b) {
    for (int i = 0; i < BATCH * SEQ; i++) {
        b->x[i] = (int32_t)((i * 7 + step * 13) % 64);
        b->y[i] = (int32_t)((i * 5 + step * 3 + 1) % 64);
    }
    b->xt = gp_tensor_view(b->x, gp_shape2(BATCH, SEQ), GP_I32);
    b->yt = gp_tensor_view(b->y, gp_shape2(BATCH, SEQ), GP_I32);
}

static bool uninitialized(gp_model *m) {
    for (int i = 0; i < gp_model_nparam_tensors(m); i++) {
        gp_param_info pi;
        if (gp_model_param(m, i, &pi) != GP_OK || pi.value->data || (pi.grad && pi.grad->data))
            return false;
    }
    return true;
}

static void profile(void) {
    gp_model *m = transformer(2);
    const int L = gp_model_nlayers(m);
    double *t = calloc(2 * (size_t)L, sizeof *t);
    REQUIRE_OK(gp_model_profile_layers(m, 2, 3, t));
    for (int i = 0; i < 2 * L; i++) CHECK(isfinite(t[i]) && t[i] > 0);
    /* The blocks do far more work than the positional embedding (layer 1): it shows. */
    CHECK(t[2] + t[L + 2] > t[1] + t[L + 1]);
    /* The second block is the first's kind, shapes and cost: timed once, its times taken. */
    CHECK(t[3] == t[2] && t[L + 3] == t[L + 2]);
    CHECK(uninitialized(m)); /* every layer released again */
    /* ... and initialization afterwards gives the same parameters as without the pass. */
    gp_device *d1, *d2;
    REQUIRE_OK(gp_device_cpu_new("a", &d1));
    REQUIRE_OK(gp_device_cpu_new("b", &d2));
    gp_model *fresh = transformer(2);
    REQUIRE_OK(gp_model_init(m, d1, 5));
    REQUIRE_OK(gp_model_init(fresh, d2, 5));
    CHECK(gp_test_hash(m) == gp_test_hash(fresh));
    gp_mem_stats ms;
    gp_device_mem_stats(d1, &ms);
    CHECK_EQ_INT(ms.live[GP_MEM_ACTIVATIONS], 0);
    CHECK_FAILS(gp_model_profile_layers(m, 2, 3, t), GP_INVALID_ARGUMENT, "initialized");
    gp_model_free(m);
    gp_model_free(fresh);
    gp_device_free(d1);
    gp_device_free(d2);
    m = transformer(2);
    CHECK_FAILS(gp_model_profile_layers(m, 0, 3, t), GP_INVALID_ARGUMENT, "micro-batch");
    CHECK_FAILS(gp_model_profile_layers(m, 2, -1, t), GP_INVALID_ARGUMENT, "repetitions");
    /* Split backwards timed too: a block's input and weight parts both take time; the model is
     * left as it was. */
    double *ts = calloc(4 * (size_t)L, sizeof *ts);
    REQUIRE_OK(gp_model_profile_layers_split(m, 2, 3, ts));
    for (int i = 0; i < 4 * L; i++) CHECK(isfinite(ts[i]) && ts[i] >= 0);
    CHECK(ts[2 * L + 2] > 0 && ts[3 * L + 2] > 0); /* a Transformer block: both parts */
    for (int g = 0; g < 4; g++) CHECK(ts[g * L + 3] == ts[g * L + 2]); /* the twin block */
    CHECK(uninitialized(m));
    /* a plan of a split schedule is timed by the parts: their sum is each cell's backward */
    gp_pipeline_opts po = {.stages = 1, .micro_batches = 1, .schedule = GP_SCHEDULE_ZBH1,
                           .balance = GP_BALANCE_TIME, .layer_times = ts,
                           .layer_times_split = true};
    gp_plan plan;
    gp_optim_opts o = gp_adamw_defaults(3e-3f, 0.01f);
    REQUIRE_OK(gp_plan_make(m, 2, &o, &po, 0, &plan));
    double want = 0;
    for (int i = 0; i < L; i++) want += ts[i] + ts[2 * L + i] + ts[3 * L + i];
    CHECK(fabs(plan.cells[0].time_s - want) <= 1e-12 * want);
    gp_plan_free(&plan);
    po.layer_times_split = false; /* the whole backward's times instead */
    REQUIRE_OK(gp_plan_make(m, 2, &o, &po, 0, &plan));
    want = 0;
    for (int i = 0; i < 2 * L; i++) want += ts[i];
    CHECK(fabs(plan.cells[0].time_s - want) <= 1e-12 * want);
    gp_plan_free(&plan);
    gp_model_free(m);
    free(t);
    free(ts);
}

typedef struct run_result {
    float loss[3];
    uint64_t hash;
    int first[4];
    bool pinned;
} run_result;

/* Three steps through a pipeline with options po; the cells used and the results. */
static void train(const gp_pipeline_opts *po, run_result *r) {
    gp_model *m = transformer(4);
    gp_optim_opts o = gp_adamw_defaults(3e-3f, 0.01f);
    gp_pipeline *p;
    REQUIRE_OK(gp_pipeline_new(m, &o, po, 11, &p));
    for (int s = 0; s < 3; s++) {
        tokens b;
        make_tokens(s, &b);
        CHECK_OK(gp_pipeline_step(p, &b.xt, &b.yt, &r->loss[s]));
    }
    gp_pipeline_stats st;
    gp_stage_stats ss[8];
    CHECK_OK(gp_pipeline_last_stats(p, &st, ss));
    r->pinned = st.pinned;
    for (int k = 0; k < po->stages; k++) {
        r->first[k] = gp_pipeline_cell_first(p, k);
        CHECK_EQ_INT(ss[k].first_layer, r->first[k]);
    }
    CHECK_EQ_INT(gp_pipeline_cell_first(p, po->stages), -1);
    r->hash = gp_test_hash(m);
    gp_pipeline_free(p);
    gp_model_free(m);
}

/* Times that put almost all the work in the last layer: balancing on them must give that layer
 * a cell of its own, in the plan and in the runtime, and change nothing in the results. */
static void balance_by_time(void) {
    gp_model *m = transformer(4);
    const int L = gp_model_nlayers(m);
    double *t = calloc(2 * (size_t)L, sizeof *t);
    for (int i = 0; i < L; i++) t[i] = t[L + i] = 1e-3;
    t[L - 1] = t[2 * L - 1] = 1.0;
    gp_pipeline_opts po = {.stages = 2, .micro_batches = 4, .balance = GP_BALANCE_TIME,
                           .layer_times = t, .batch = BATCH};
    gp_optim_opts o = gp_adamw_defaults(3e-3f, 0.01f);
    gp_plan plan;
    REQUIRE_OK(gp_plan_make(m, BATCH, &o, &po, 0, &plan));
    CHECK_EQ_INT(plan.cells[1].first, L - 1);
    CHECK(fabs(plan.cells[1].time_s - 2.0) < 1e-12); /* seconds as given, not FLOPs */
    CHECK(plan.cells[1].fwd_flops > 0);               /* FLOPs still from the cost model */
    CHECK(plan.balance == GP_BALANCE_TIME);
    gp_plan_free(&plan);
    /* Without times the plan cannot balance by time (it allocates nothing to measure with). */
    gp_pipeline_opts no_times = po;
    no_times.layer_times = NULL;
    CHECK_FAILS(gp_plan_make(m, BATCH, &o, &no_times, 0, &plan), GP_INVALID_ARGUMENT,
                "gp_model_profile_layers");
    t[0] = NAN;
    CHECK_FAILS(gp_plan_make(m, BATCH, &o, &po, 0, &plan), GP_INVALID_ARGUMENT, "layer 0");
    t[0] = 1e-3;
    gp_model_free(m);

    run_result by_time, by_cost, measured;
    train(&po, &by_time);
    CHECK_EQ_INT(by_time.first[1], L - 1);
    gp_pipeline_opts cost = {.stages = 2, .micro_batches = 4, .batch = BATCH};
    train(&cost, &by_cost);
    CHECK(by_cost.first[1] != L - 1);
    /* Other cells, same bits. */
    CHECK(by_time.hash == by_cost.hash);
    for (int s = 0; s < 3; s++) CHECK(by_time.loss[s] == by_cost.loss[s]);
    /* No times given: the runtime profiles the layers itself; a valid split, same bits. */
    gp_pipeline_opts self = {.stages = 2, .micro_batches = 4, .batch = BATCH,
                             .balance = GP_BALANCE_TIME};
    train(&self, &measured);
    CHECK(measured.first[1] > 0 && measured.first[1] < L);
    CHECK(measured.hash == by_cost.hash);
    free(t);
}

/* The runtime's cells are the plan's for the same batch and limit: the largest cell of the
 * unlimited plan's simulated peaks, which the partitioner checks, so that plan is made again
 * (were it not, the limit would be raised by 1% until a plan exists). */
static void runtime_matches_plan(void) {
    gp_optim_opts o = gp_adamw_defaults(3e-3f, 0.01f);
    for (int sk = 0; sk < 3; sk++)
        for (int rm = 0; rm < 2; rm++) {
            gp_model *m = transformer(4);
            gp_pipeline_opts po = {.stages = 3, .micro_batches = 4, .schedule = sk, .remat = rm,
                                   .batch = BATCH};
            gp_plan plan;
            REQUIRE_OK(gp_plan_make(m, BATCH, &o, &po, 10, &plan));
            uint64_t worst = 0;
            for (int k = 0; k < 3; k++)
                if (plan.cells[k].total_bytes > worst) worst = plan.cells[k].total_bytes;
            gp_plan_free(&plan);
            po.memory_limit = worst;
            int tries = 0;
            while (gp_plan_make(m, BATCH, &o, &po, 10, &plan) != GP_OK && tries++ < 100)
                po.memory_limit += po.memory_limit / 100;
            if (tries > 100) {
                CHECK(!"no memory limit gave a plan");
                gp_model_free(m);
                continue;
            }
            CHECK_EQ_INT(tries, 0);
            gp_pipeline *p;
            REQUIRE_OK(gp_pipeline_new(m, &o, &po, 3, &p));
            for (int k = 0; k < 3; k++)
                CHECK_EQ_INT(gp_pipeline_cell_first(p, k), plan.cells[k].first);
            gp_pipeline_free(p);
            gp_plan_free(&plan);
            /* A limit nothing fits: the runtime says so as the plan does, naming it. */
            po.memory_limit = 4096;
            CHECK_FAILS(gp_pipeline_new(m, &o, &po, 3, &p), GP_MEMORY_LIMIT, "4 KiB per-device limit");
            gp_model_free(m);
        }
    /* A batch the micro-batches do not divide is named. */
    gp_model *m = transformer(2);
    gp_pipeline_opts bad = {.stages = 2, .micro_batches = 3, .batch = BATCH};
    gp_pipeline *p;
    CHECK_FAILS(gp_pipeline_new(m, &o, &bad, 3, &p), GP_INVALID_ARGUMENT,
                "micro_batches 3: does not divide the batch of 8 examples");
    gp_model_free(m);
}

/* The memory model is an upper bound that is tight: a pipeline under a limit of exactly the
 * plan's largest cell trains (steps of the planned batch, two steps so that reused buffers and
 * the second step's messages count), every stage's device counts at most its planned bytes,
 * and the fullest stage at least 75% of the largest plan (the slack: sent messages counted at
 * the mailboxes' capacity, which the peak seldom meets). For the Transformer (dropout on, attention
 * workspace), the ConvNet (convolution workspace, int32-free input) and a residual network,
 * each schedule, remat mode and K = 1..3. Selective remat runs under a limit halfway between
 * the cell and none plans', where some cells recompute and others keep their state. Every run
 * of a network ends with the same parameters, bit for bit. */
static uint64_t worst_planned(const gp_model *m, const gp_optim_opts *o,
                              const gp_pipeline_opts *po) {
    gp_plan plan;
    uint64_t worst = 0;
    REQUIRE_OK(gp_plan_make(m, BATCH, o, po, 10, &plan));
    worst = gp_plan_fullest_bytes(&plan); /* V cells per stage: their shares together */
    gp_plan_free(&plan);
    return worst;
}

/* The one K of a network, schedule and remat mode in the shortened runs: 1 to 3 in turn, 2 for
 * the interleaved schedule where the turn gives 3 (its 4 micro-batches need K to divide 4). */
static int quick_stages(int net, int sk, int rm) {
    const int K = 1 + (net + sk + rm) % 3;
    return sk == GP_SCHEDULE_INTERLEAVED && 4 % K ? 2 : K;
}

static void plans_that_fit_run(void) {
    const int nets = 3;
    /* the sanitizer builds' shortened runs (GP_TEST_QUICK): each schedule with each remat mode
     * once per network, at a K that turns with them, rather than at every K (minutes there) */
    const bool quick = getenv("GP_TEST_QUICK") != NULL;
    double worst_fill = 1.0, worst_fill_split = 1.0, worst_fill_chunked = 1.0, worst_fill_zbv = 1.0;
    int mixed = 0;
    /* the convnet's convolutions on the direct path (this CPU has AVX2 and FMA) */
    const gp_conv_geom conv2 = {.channels = 4, .height = 14, .width = 14, .kernel = 3,
                                .stride = 1, .pad = 1, .out_h = 14, .out_w = 14};
    const bool direct_conv = gp_conv_direct_applies(&conv2, 8);
    for (int net = 0; net < nets; net++) {
        uint64_t first_hash = 0;
        for (int K = 1; K <= 3; K++)
            for (int sk = 0; sk < 5; sk++)
                for (int rm = 0; rm < 3; rm++) {
                    if (sk == GP_SCHEDULE_INTERLEAVED && 4 % K) continue; /* M = 4 */
                    if (quick && K != quick_stages(net, sk, rm)) continue;
                    const bool chunked = sk == GP_SCHEDULE_INTERLEAVED || sk == GP_SCHEDULE_ZBV;
                    gp_model *m = NULL;
                    gp_optim_opts o;
                    if (net == 0) {
                        m = transformer(4);
                        o = gp_adamw_defaults(3e-3f, 0.01f);
                    } else if (net == 1) {
                        m = gp_test_net_build(GP_TEST_CONVNET);
                        o = gp_test_net_optim(GP_TEST_CONVNET);
                    } else {
                        REQUIRE_OK(gp_model_from_json_file("examples/resnet_fashion.json", &m));
                        o = gp_sgd_defaults(0.1f, 0.9f);
                    }
                    gp_pipeline_opts po = {.stages = K, .micro_batches = 4, .schedule = sk,
                                           .remat = rm, .batch = BATCH};
                    gp_plan plan;
                    if (rm == GP_REMAT_SELECTIVE) {
                        gp_pipeline_opts pc = po, pn = po;
                        pc.remat = GP_REMAT_CELL;
                        pn.remat = GP_REMAT_NONE;
                        po.memory_limit =
                            (worst_planned(m, &o, &pc) + worst_planned(m, &o, &pn)) / 2;
                    } else {
                        po.memory_limit = worst_planned(m, &o, &po);
                    }
                    /* The plan's own largest cell is a limit it meets, except with a split
                     * backward, whose bound counts min(K, M) micro-batches waiting for their
                     * weight parts on every stage: grow the limit until it agrees */
                    /* (two cells per stage: the partitioner bounds each cell alone by its
                     * stage's peak in flight before the stages are checked exactly, which a
                     * limit at the exact figure may fail) */
                    const bool split = sk == GP_SCHEDULE_ZBH1 || chunked;
                    int tries = 0;
                    for (; gp_plan_make(m, BATCH, &o, &po, 10, &plan) != GP_OK; tries++) {
                        if (tries >= 100) {
                            CHECK(!"no memory limit gave a plan");
                            break;
                        }
                        po.memory_limit += po.memory_limit / (split ? 50 : 200);
                    }
                    if (!split && tries) printf("net %d K %d schedule %d remat %d: %d tries\n",
                                                net, K, sk, rm, tries);
                    CHECK(split || tries == 0);
                    if (rm == GP_REMAT_SELECTIVE) {
                        int none = 0;
                        for (int k = 0; k < plan.ncells; k++) none += plan.cells[k].remat == GP_REMAT_NONE;
                        mixed += none > 0 && none < plan.ncells;
                    }
                    gp_pipeline *p;
                    REQUIRE_OK(gp_pipeline_new(m, &o, &po, 5, &p));
                    for (int s = 0; s < 2; s++) {
                        float loss;
                        if (net == 0) {
                            tokens b;
                            make_tokens(s, &b);
                            CHECK_OK(gp_pipeline_step(p, &b.xt, &b.yt, &loss));
                        } else {
                            gp_test_batch b;
                            gp_test_net_batch(GP_TEST_CONVNET, BATCH, 50 + (uint64_t)s, &b);
                            CHECK_OK(gp_pipeline_step(p, &b.x, &b.y_t, &loss));
                        }
                    }
                    uint64_t fullest = 0, planned = 0;
                    for (int k = 0; k < K; k++) {
                        uint64_t stage = 0; /* its cells' (k, k + K, ...) planned bytes */
                        for (int c = 0; c < plan.ncells; c++)
                            if (plan.cells[c].stage == k) stage += plan.cells[c].total_bytes;
                        if (stage > planned) planned = stage;
                        gp_mem_stats ms;
                        CHECK_OK(gp_pipeline_mem_stats(p, k, &ms));
                        if (ms.peak_total > stage)
                            printf("net %d K %d schedule %d remat %d stage %d: peak %llu over "
                                   "the plan's %llu\n", net, K, sk, rm, k,
                                   (unsigned long long)ms.peak_total, (unsigned long long)stage);
                        CHECK(ms.peak_total <= stage);
                        CHECK(ms.peak_total <= po.memory_limit);
                        if (ms.peak_total > fullest) fullest = ms.peak_total;
                    }
                    /* (a split backward's bound is looser: its micro-batches waiting for their
                     * weight parts are counted with all their weight parts may read) */
                    const double fill = (double)fullest / (double)planned;
                    /* (two cells per stage: their shares of the stage's simulated peak; zbv's
                     * split backward's held state counted as zbh1's is. The direct convolution's
                     * workspaces are less than half im2col's, so that fixed over-count weighs
                     * more: the convnet's zbv plans fill 0.59-0.61 of their bound with it (the
                     * measured peak moves with the threads' timing), 0.74 with
                     * GP_CPU_CONV=im2col) */
                    double *worst = sk == GP_SCHEDULE_ZBV ? &worst_fill_zbv
                                    : chunked             ? &worst_fill_chunked
                                    : split               ? &worst_fill_split
                                                          : &worst_fill;
                    if (fill < *worst) *worst = fill;
                    const double least = sk == GP_SCHEDULE_ZBV ? (direct_conv ? 0.55 : 0.7)
                                         : chunked             ? 0.8
                                         : split               ? 0.5
                                                               : 0.75;
                    if (fill < least)
                        printf("net %d K %d schedule %d remat %d: fullest stage %llu of %llu\n",
                               net, K, sk, rm, (unsigned long long)fullest,
                               (unsigned long long)planned);
                    CHECK(fill >= least);
                    const uint64_t h = gp_test_hash(m);
                    if (!first_hash) first_hash = h;
                    if (h != first_hash)
                        printf("net %d K %d schedule %d remat %d: parameters differ from the "
                               "first run's\n", net, K, sk, rm);
                    CHECK(h == first_hash);
                    gp_pipeline_free(p);
                    gp_plan_free(&plan);
                    gp_model_free(m);
                }
    }
    printf("plans that fit run: the fullest stage used at least %.4f of the planned bytes (%.4f "
           "zbh1, %.4f interleaved, %.4f zbv); %d selective plans mixed cells that recompute and "
           "cells that keep their state\n",
           worst_fill, worst_fill_split, worst_fill_chunked, worst_fill_zbv, mixed);
    CHECK(mixed >= 3);
}

/* A pipeline of the Transformer m made with po, trained two steps (so that reused buffers and
 * the second step's messages count). */
static gp_pipeline *transformer_two_steps(gp_model *m, const gp_optim_opts *o,
                                          const gp_pipeline_opts *po) {
    gp_pipeline *p;
    REQUIRE_OK(gp_pipeline_new(m, o, po, 5, &p));
    for (int s = 0; s < 2; s++) {
        tokens b;
        make_tokens(s, &b);
        float loss;
        CHECK_OK(gp_pipeline_step(p, &b.xt, &b.yt, &loss));
    }
    return p;
}

/* The plans a search keeps under a memory limit all train within it: the Transformer on 1, 2
 * and 3 stage devices (D = 1, the threads launcher), under a limit halfway between the leanest
 * and the fattest plan of those devices, each kept plan two steps, every stage's peak within
 * its planned bytes and the limit. */
static void searched_plans_run(void) {
    gp_optim_opts o = gp_adamw_defaults(3e-3f, 0.01f);
    int ran = 0, selective = 0, interleaved = 0;
    for (int N = 1; N <= 3; N++) {
        gp_model *m = transformer(4);
        gp_pipeline_opts base = {.batch = BATCH};
        gp_plan_search_opts so = {.devices = N, .data_parallel = 1, .max_plans = 64};
        gp_plan_search_result all;
        REQUIRE_OK(gp_plan_search(m, BATCH, &o, &base, 10, &so, &all));
        uint64_t lean = UINT64_MAX, fat = 0;
        for (int i = 0; i < all.n; i++) {
            const uint64_t w = worst_planned(m, &o, &(gp_pipeline_opts){
                                                        .stages = all.plans[i].stages,
                                                        .micro_batches = all.plans[i].micro_batches,
                                                        .schedule = all.plans[i].schedule,
                                                        .chunks = all.plans[i].chunks,
                                                        .remat = all.plans[i].remat});
            if (w < lean) lean = w;
            if (w > fat) fat = w;
        }
        CHECK_EQ_INT(all.n, all.fitting); /* no limit: every plan fits, all kept */
        gp_plan_search_free(&all);
        base.memory_limit = lean + (fat - lean) / 2;
        so.max_plans = 4;
        gp_plan_search_result r;
        REQUIRE_OK(gp_plan_search(m, BATCH, &o, &base, 10, &so, &r));
        CHECK(r.fitting < r.candidates); /* the limit ruled some out */
        for (int i = 0; i < r.n; i++) {
            const gp_plan *pl = &r.plans[i];
            selective += pl->remat == GP_REMAT_SELECTIVE;
            gp_pipeline_opts po = base;
            po.stages = pl->stages;
            po.micro_batches = pl->micro_batches;
            po.schedule = pl->schedule;
            po.chunks = pl->chunks;
            po.remat = pl->remat;
            gp_model *mm = transformer(4);
            gp_pipeline *p = transformer_two_steps(mm, &o, &po);
            CHECK_EQ_INT(gp_pipeline_cells(p), pl->ncells);
            for (int c = 0; c < pl->ncells; c++)
                CHECK_EQ_INT(gp_pipeline_cell_first(p, c), pl->cells[c].first);
            for (int k = 0; k < pl->stages; k++) {
                gp_mem_stats ms;
                CHECK_OK(gp_pipeline_mem_stats(p, k, &ms));
                uint64_t stage = 0; /* its cells' planned bytes (interleaved: k, k + K, ...) */
                for (int c = 0; c < pl->ncells; c++)
                    if (pl->cells[c].stage == k) stage += pl->cells[c].total_bytes;
                CHECK(ms.peak_total <= stage);
                CHECK(ms.peak_total <= base.memory_limit);
            }
            ran++;
            interleaved += pl->schedule == GP_SCHEDULE_INTERLEAVED;
            gp_pipeline_free(p);
            gp_model_free(mm);
        }
        gp_plan_search_free(&r);
        gp_model_free(m);
    }
    printf("searched plans run: %d kept plans trained within their limit (%d selective, %d "
           "interleaved)\n",
           ran, selective, interleaved);
    CHECK(ran >= 9);
}

/* --grad-sum tree's partial sums in the plan: the tree keeps pool buffers of a cell's gradients
 * beside them from step to step (counted as gradients), as many as its counter holds at once
 * over the cell's backwards in its stage's order. For the Transformer, K = 2, M = 4 and 8, every
 * schedule: each stage's measured gradient peak after two steps is its planned gradient bytes,
 * to the byte, and its whole peak within its planned bytes under a limit of exactly the plan's
 * fullest stage. Against the sequential sum's plan, fill-drain and 1F1B (each cell's blocks of
 * micro-batches finishing one after another) add log2 M times the cell's gradients, the CLI's
 * "log2 of the micro-batches' even part more gradient buffers per cell". */
static void tree_sum_buffers_planned(void) {
    gp_optim_opts o = gp_adamw_defaults(3e-3f, 0.01f);
    int checked = 0;
    for (int M = 4; M <= 8; M *= 2)
        for (int sk = 0; sk < 5; sk++) {
            const int K = 2, log2M = M == 4 ? 2 : 3;
            gp_model *m = transformer(4);
            gp_pipeline_opts seq = {.stages = K, .micro_batches = M, .schedule = sk,
                                    .remat = GP_REMAT_CELL, .batch = BATCH};
            gp_pipeline_opts po = seq;
            po.grad_sum = GP_GRAD_SUM_TREE;
            po.memory_limit = worst_planned(m, &o, &po);
            gp_plan plan, plain;
            REQUIRE_OK(gp_plan_make(m, BATCH, &o, &po, 10, &plan));
            REQUIRE_OK(gp_plan_make(m, BATCH, &o, &seq, 10, &plain));
            gp_pipeline *p = transformer_two_steps(m, &o, &po);
            CHECK_EQ_INT(plan.ncells, plain.ncells);
            for (int c = 0; c < plan.ncells && c < plain.ncells; c++) {
                CHECK_EQ_INT(plan.cells[c].first, plain.cells[c].first);
                CHECK_EQ_INT(plan.cells[c].nparams, plain.cells[c].nparams);
                const uint64_t base = plain.cells[c].grad_bytes;
                CHECK_EQ_INT(base, (uint64_t)plain.cells[c].nparams * sizeof(float));
                CHECK(plan.cells[c].grad_bytes > base);
                if (sk == GP_SCHEDULE_GPIPE || sk == GP_SCHEDULE_1F1B)
                    CHECK_EQ_INT(plan.cells[c].grad_bytes, (uint64_t)(1 + log2M) * base);
            }
            for (int k = 0; k < K; k++) {
                uint64_t grads = 0, total = 0; /* the stage's cells' planned bytes */
                for (int c = 0; c < plan.ncells; c++)
                    if (plan.cells[c].stage == k) {
                        grads += plan.cells[c].grad_bytes;
                        total += plan.cells[c].total_bytes;
                    }
                gp_mem_stats ms;
                CHECK_OK(gp_pipeline_mem_stats(p, k, &ms));
                if (ms.peak[GP_MEM_GRADS] != grads)
                    printf("tree sum M %d schedule %d stage %d: gradients %llu, planned %llu\n",
                           M, sk, k, (unsigned long long)ms.peak[GP_MEM_GRADS],
                           (unsigned long long)grads);
                CHECK_EQ_INT(ms.peak[GP_MEM_GRADS], grads);
                CHECK(ms.peak_total <= total);
                CHECK(ms.peak_total <= po.memory_limit);
                checked++;
            }
            gp_pipeline_free(p);
            gp_plan_free(&plan);
            gp_plan_free(&plain);
            gp_model_free(m);
        }
    printf("tree sum: %d stages' gradient peaks as planned\n", checked);
    CHECK_EQ_INT(checked, 20);
}

static void pinning(void) {
    cpu_set_t set;
    CPU_ZERO(&set);
    if (sched_getaffinity(0, sizeof set, &set) != 0) {
        CHECK(!"sched_getaffinity failed");
        return;
    }
    const int cores = CPU_COUNT(&set);
    for (int K = 1; K <= 3; K++) {
        run_result r;
        gp_pipeline_opts po = {.stages = K, .micro_batches = 4};
        train(&po, &r);
        /* K = 1 runs inline on the caller's thread, which a library must not pin. */
        CHECK(r.pinned == (K > 1 && cores >= K));
        po.no_pinning = true;
        train(&po, &r);
        CHECK(!r.pinned);
    }
}

typedef struct stepper {
    gp_pipeline *p;
    atomic_bool stop;
    gp_status st;
    char name[16]; /* the stepping thread's name after its steps */
} stepper;

/* Steps until told to stop (or 5000 steps), on a thread of the test's own naming. */
static void *keep_stepping(void *arg) {
    stepper *sp = arg;
    pthread_setname_np(pthread_self(), "test-stepper");
    tokens b;
    make_tokens(0, &b);
    float loss;
    for (int i = 0; i < 5000 && !atomic_load(&sp->stop) && sp->st == GP_OK; i++)
        sp->st = gp_pipeline_step(sp->p, &b.xt, &b.yt, &loss);
    pthread_getname_np(pthread_self(), sp->name, sizeof sp->name);
    return NULL;
}

/* The stage threads (started for each step), the stage devices' pool workers and the
 * checkpoint writer carry names that say what they are; the caller's thread, where K = 1 runs
 * its stage inline, keeps its own. */
static void thread_names(void) {
    char mine[16] = {0}, after[16] = {0};
    pthread_getname_np(pthread_self(), mine, sizeof mine);
    gp_optim_opts o = gp_adamw_defaults(3e-3f, 0.01f);
    /* K = 1: inline, never renamed */
    run_result r;
    gp_pipeline_opts one = {.stages = 1, .micro_batches = 2};
    train(&one, &r);
    pthread_getname_np(pthread_self(), after, sizeof after);
    CHECK(strcmp(mine, after) == 0);
    /* K = 2 with two threads per stage device: polled while another thread steps */
    gp_model *m = transformer(4);
    gp_pipeline_opts po = {.stages = 2, .micro_batches = 2, .stage_threads = 2};
    stepper sp = {.st = GP_OK};
    atomic_init(&sp.stop, false);
    REQUIRE_OK(gp_pipeline_new(m, &o, &po, 11, &sp.p));
    CHECK(gp_test_thread_named("gp-pool-1", 10)); /* the workers live with their devices */
    pthread_t th;
    if (pthread_create(&th, NULL, keep_stepping, &sp) != 0) {
        CHECK(!"pthread_create failed");
        gp_pipeline_free(sp.p);
        gp_model_free(m);
        return;
    }
    const bool seen0 = gp_test_thread_named("gp-stage-0", 60);
    const bool seen1 = gp_test_thread_named("gp-stage-1", 60);
    atomic_store(&sp.stop, true);
    pthread_join(th, NULL);
    CHECK_OK(sp.st);
    CHECK(seen0 && seen1);
    CHECK(strcmp(sp.name, "test-stepper") == 0); /* the stepping thread kept its name */
    CHECK(!gp_test_thread_named("gp-stage-0", 0)); /* a step's threads end with it */
    pthread_getname_np(pthread_self(), after, sizeof after);
    CHECK(strcmp(mine, after) == 0);
    gp_pipeline_free(sp.p);
    gp_model_free(m);
    CHECK(!gp_test_thread_named("gp-pool-1", 0)); /* and the workers with their devices */
}

int main(void) {
    profile();
    balance_by_time();
    runtime_matches_plan();
    plans_that_fit_run();
    searched_plans_run();
    tree_sum_buffers_planned();
    pinning();
    thread_names();
    return gp_test_finish("test_pipeline_cells");
}
