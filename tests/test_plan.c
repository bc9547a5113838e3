/* gp_plan_make: its cells against the partitioner on the same figures, times from FLOPs at the
 * given rate, the bubble of equal cells against (K-1)/(M+K-1), the memory columns against the
 * memory model, optimizer state per optimizer, the optimizer step's time, the contention figure,
 * memory limits per schedule, explicit partitions, and the errors that name the numbers. */
#include <limits.h>
#include <math.h>
#include <string.h>

#include "plan/partition.h"
#include "plan/profile.h"
#include "testutil.h"

/* 0 linear(16,64) 1 relu 2 linear(64,64) 3 relu 4 linear(64,256) 5 linear(256,8): uneven costs */
static gp_model *mlp(void) {
    gp_model *m;
    REQUIRE_OK(gp_model_new(gp_shape1(16), GP_F32, &m));
    REQUIRE_OK(gp_model_add(m, gp_linear(16, 64, true)));
    REQUIRE_OK(gp_model_add(m, gp_relu()));
    REQUIRE_OK(gp_model_add(m, gp_linear(64, 64, true)));
    REQUIRE_OK(gp_model_add(m, gp_relu()));
    REQUIRE_OK(gp_model_add(m, gp_linear(64, 256, true)));
    REQUIRE_OK(gp_model_add(m, gp_linear(256, 8, false)));
    return m;
}

/* L identical layers: every balanced cell costs the same. */
static gp_model *equal_layers(int L) {
    gp_model *m;
    REQUIRE_OK(gp_model_new(gp_shape1(32), GP_F32, &m));
    for (int i = 0; i < L; i++) REQUIRE_OK(gp_model_add(m, gp_linear(32, 32, true)));
    return m;
}

static void test_cells_match_partitioner(void) {
    gp_model *m = mlp();
    const int L = 6;
    gp_optim_opts adam = gp_adamw_defaults(1e-3f, 0.01f);
    for (int K = 1; K <= L; K++)
        for (int M = 1; M <= 8; M *= 2) {
            const int64_t batch = 64;
            const double gflops = 50;
            gp_pipeline_opts po = {.stages = K, .micro_batches = M};
            gp_plan p;
            REQUIRE_OK(gp_plan_make(m, batch, &adam, &po, gflops, &p));
            CHECK_EQ_INT(p.stages, K);
            CHECK_EQ_INT(p.micro_batches, M);
            CHECK_EQ_INT(p.micro_batch_size, batch / M);
            gp_layer_est est[6];
            REQUIRE_OK(gp_layer_est_from_model(m, batch / M, 2, NULL, est));
            gp_partition_req r = {.layers = est, .nlayers = L, .stages = K, .micro_batches = M,
                                  .remat = GP_REMAT_CELL};
            int first[6];
            REQUIRE_OK(gp_partition_balance(&r, first, NULL));
            int64_t nparams = 0;
            for (int k = 0; k < K; k++) {
                const gp_plan_cell *c = &p.cells[k];
                int end = k + 1 < K ? first[k + 1] : L;
                CHECK_EQ_INT(c->first, first[k]);
                CHECK_EQ_INT(c->last, end - 1);
                /* FLOPs from the public cost table, one micro-batch */
                double fwd = 0, bwd = 0;
                for (int i = first[k]; i < end; i++) {
                    gp_cost cost;
                    REQUIRE_OK(gp_model_cost(m, i, batch / M, &cost));
                    fwd += cost.fwd_flops, bwd += cost.bwd_flops;
                }
                CHECK_NEAR(c->fwd_flops, fwd, 1e-9 * fwd);
                CHECK_NEAR(c->bwd_flops, bwd, 1e-9 * bwd);
                CHECK_NEAR(c->time_s, (fwd + bwd) / (gflops * 1e9), 1e-12 * c->time_s + 1e-18);
                /* remat cell: M forwards, M recomputes and M backwards per step */
                CHECK_NEAR(c->busy_s, M * (2 * fwd + bwd) / (gflops * 1e9), 1e-9 * c->busy_s);
                CHECK_NEAR(c->busy_s + c->idle_s, p.step_s, 1e-9 * p.step_s);
                nparams += c->nparams;
            }
            CHECK_EQ_INT(nparams, gp_model_nparams(m));
            CHECK(p.gflops_assumed == gflops);
            gp_plan_free(&p);
            CHECK(p.cells == NULL);
        }
    gp_model_free(m);
}

static void test_bubble_equal_cells(void) {
    gp_model *m = equal_layers(8);
    gp_cost cost;
    for (int K = 1; K <= 8; K *= 2)
        for (int M = 1; M <= 16; M *= 2)
            for (int v = 0; v < 4; v++) {
                gp_pipeline_opts po = {.stages = K, .micro_batches = M,
                                       .schedule = v / 2 ? GP_SCHEDULE_1F1B : GP_SCHEDULE_GPIPE,
                                       .remat = v % 2 ? GP_REMAT_NONE : GP_REMAT_CELL};
                gp_plan p;
                REQUIRE_OK(gp_plan_make(m, 32, NULL, &po, 10, &p));
                REQUIRE_OK(gp_model_cost(m, 0, 32 / M, &cost));
                double theory = (double)(K - 1) / (double)(M + K - 1);
                CHECK(p.bubble_theory == theory);
                CHECK_NEAR(p.bubble_simulated, theory, 1e-12);
                /* (M + K - 1) slots of one cell's forward + backward (+ recompute) */
                double per_cell = (8 / K) * (cost.fwd_flops + cost.bwd_flops +
                                             (po.remat == GP_REMAT_CELL ? cost.fwd_flops : 0));
                double step = (M + K - 1) * per_cell / 10e9;
                CHECK_NEAR(p.step_s, step, 1e-12 * step);
                for (int k = 0; k < K; k++)
                    CHECK_EQ_INT(p.cells[k].last - p.cells[k].first, 8 / K - 1);
                gp_plan_free(&p);
            }
    gp_model_free(m);
}

/* A measured optimizer rate: each cell's step on its own parameters, after the stage's last
 * backward. With equal cells stage 0 finishes last (its last backward waits for every other
 * stage's), so the step grows by stage 0's optimizer step exactly. */
static void test_optimizer_step(void) {
    gp_model *m = equal_layers(8);
    gp_optim_opts adam = gp_adamw_defaults(1e-3f, 0.01f);
    const double rate = 3e-9; /* seconds per parameter */
    for (int K = 1; K <= 4; K *= 2)
        for (int sched = 0; sched < 3; sched++) {
            const gp_schedule_kind kinds[] = {GP_SCHEDULE_GPIPE, GP_SCHEDULE_1F1B,
                                              GP_SCHEDULE_ZBH1};
            gp_pipeline_opts po = {.stages = K, .micro_batches = 4, .schedule = kinds[sched]};
            gp_plan without, with;
            REQUIRE_OK(gp_plan_make(m, 32, &adam, &po, 10, &without));
            po.optim_s_per_param = rate;
            REQUIRE_OK(gp_plan_make(m, 32, &adam, &po, 10, &with));
            for (int k = 0; k < K; k++) {
                CHECK(without.cells[k].opt_s == 0);
                CHECK_NEAR(with.cells[k].opt_s, rate * (double)with.cells[k].nparams, 1e-18);
                CHECK_EQ_INT(with.cells[k].nparams, (8 / K) * (32 * 32 + 32));
                CHECK_NEAR(with.cells[k].busy_s,
                           without.cells[k].busy_s + with.cells[k].opt_s, 1e-12);
            }
            CHECK_NEAR(with.step_s - without.step_s, with.cells[0].opt_s, 1e-12);
            gp_plan_free(&without);
            gp_plan_free(&with);
        }
    gp_pipeline_opts po = {.stages = 2, .micro_batches = 2, .optim_s_per_param = -1e-9};
    gp_plan p;
    CHECK_FAILS(gp_plan_make(m, 32, &adam, &po, 10, &p), GP_INVALID_ARGUMENT,
                "optim_s_per_param -1e-09: expected a finite time >= 0");
    po.optim_s_per_param = NAN;
    CHECK_FAILS(gp_plan_make(m, 32, &adam, &po, 10, &p), GP_INVALID_ARGUMENT,
                "optim_s_per_param nan: expected");
    gp_model_free(m);
}

/* The runtime's cost per action: one stage of equal layers runs M forwards and M backwards (a
 * split backward: two parts each) back to back, so the step grows by exactly that many actions'
 * time; bad values are refused naming them. */
static void test_action_cost(void) {
    gp_model *m = equal_layers(8);
    const double a = 2e-4;
    const gp_schedule_kind kinds[] = {GP_SCHEDULE_GPIPE, GP_SCHEDULE_1F1B, GP_SCHEDULE_ZBH1};
    for (int sched = 0; sched < 3; sched++) {
        gp_pipeline_opts po = {.stages = 1, .micro_batches = 4, .schedule = kinds[sched],
                               .remat = GP_REMAT_NONE};
        gp_plan without, with;
        REQUIRE_OK(gp_plan_make(m, 32, NULL, &po, 10, &without));
        po.action_s = a;
        REQUIRE_OK(gp_plan_make(m, 32, NULL, &po, 10, &with));
        const int per_mb = kinds[sched] == GP_SCHEDULE_ZBH1 ? 3 : 2;
        CHECK_NEAR(with.step_s - without.step_s, 4 * per_mb * a, 1e-12);
        gp_plan_free(&without);
        gp_plan_free(&with);
    }
    gp_pipeline_opts po = {.stages = 2, .micro_batches = 2, .action_s = -1e-6};
    gp_plan p;
    CHECK_FAILS(gp_plan_make(m, 32, NULL, &po, 10, &p), GP_INVALID_ARGUMENT,
                "action_s -1e-06: expected a finite time >= 0");
    po.action_s = INFINITY;
    CHECK_FAILS(gp_plan_make(m, 32, NULL, &po, 10, &p), GP_INVALID_ARGUMENT, "action_s inf");
    gp_model_free(m);
}

/* Which layers are alike (the copies of the slowest layer a contention profile gives each
 * stage): the same kind, shapes and cost; the first layer is like no other (it computes no input
 * gradient), so 5 identical linears count 4 alike, and the MLP's two ReLUs on 64 features are
 * alike while its linears, of different shapes, are not. */
static void test_alike(void) {
    gp_model *m = equal_layers(5);
    CHECK(gp_profile_alike(m, 0, 8) == 1);
    for (int li = 1; li < 5; li++) CHECK(gp_profile_alike(m, li, 8) == 4);
    gp_model_free(m);
    m = mlp();
    const int want[6] = {1, 2, 1, 2, 1, 1};
    for (int li = 0; li < 6; li++) CHECK(gp_profile_alike(m, li, 8) == want[li]);
    gp_model_free(m);
}

/* The contention figure: exactly 1 for one device; for several, a finite ratio (its size is the
 * machine's: asserted in no test); the arguments checked; the model left uninitialized. */
static void test_contention(void) {
    gp_model *m = mlp();
    double f = 0;
    CHECK_OK(gp_model_profile_contention(m, 4, 8, 1, 1, 4, &f));
    CHECK(f == 1.0);
    CHECK_OK(gp_model_profile_contention(m, 4, 8, 2, 2, 4, &f));
    CHECK(isfinite(f) && f > 0);
    CHECK_OK(gp_model_profile_contention(m, 0, 3, 3, 1, 1, &f));
    CHECK(isfinite(f) && f > 0);
    CHECK_FAILS(gp_model_profile_contention(m, 6, 8, 2, 1, 4, &f), GP_INVALID_ARGUMENT,
                "layer 6 of 6");
    CHECK_FAILS(gp_model_profile_contention(m, 1, 0, 2, 1, 4, &f), GP_INVALID_ARGUMENT,
                "micro-batch 0");
    CHECK_FAILS(gp_model_profile_contention(m, 1, 8, 2, 1, 65, &f), GP_INVALID_ARGUMENT,
                "65 in flight");
    CHECK_FAILS(gp_model_profile_contention(m, 1, 8, 2, 0, 4, &f), GP_INVALID_ARGUMENT,
                "0 copies");
    CHECK_FAILS(gp_model_profile_contention(m, 1, 8, 2, 1, 4, NULL), GP_INVALID_ARGUMENT, "NULL");
    /* layer times scaled by the factor of their slowest layer, whole; one device: unchanged */
    double t[24], want[24];
    for (int i = 0; i < 24; i++) t[i] = want[i] = 1e-3 * (i % 6 + 1);
    CHECK_OK(gp_layer_times_contend(m, 8, 1, 4, t, &f));
    CHECK(f == 1.0 && memcmp(t, want, sizeof t) == 0);
    CHECK_OK(gp_layer_times_contend(m, 8, 2, 4, t, &f));
    CHECK(isfinite(f) && f > 0);
    for (int i = 0; i < 24; i++) CHECK(t[i] == want[i] * f);
    CHECK_FAILS(gp_layer_times_contend(m, 8, 2, 1, t, &f), GP_INVALID_ARGUMENT, "2 groups");
    CHECK_FAILS(gp_layer_times_contend(m, 0, 2, 4, t, &f), GP_INVALID_ARGUMENT, "micro-batch 0");
    /* a mesh larger than this machine: measured on its cores */
    CHECK_OK(gp_layer_times_contend(m, 8, 4096, 4, t, &f));
    CHECK(isfinite(f) && f > 0);
    for (int k = 0; k < gp_model_nparam_tensors(m); k++) {
        gp_param_info pi;
        CHECK_OK(gp_model_param(m, k, &pi));
        CHECK(pi.value->data == NULL);
    }
    gp_model_free(m);
}

static void test_memory_columns(void) {
    gp_model *m = mlp();
    gp_optim_opts sgd = gp_sgd_defaults(0.1f, 0.9f);
    for (int s = 0; s < 2; s++)
        for (int rm = 0; rm < 2; rm++)
            for (int K = 1; K <= 4; K++) {
                const int M = 4;
                gp_pipeline_opts po = {.stages = K, .micro_batches = M,
                                       .schedule = (gp_schedule_kind)s, .remat = (gp_remat)rm};
                gp_plan p;
                REQUIRE_OK(gp_plan_make(m, 128, &sgd, &po, 1, &p));
                gp_layer_est est[6];
                REQUIRE_OK(gp_layer_est_from_model(m, 128 / M, 1, NULL, est));
                for (int k = 0; k < K; k++) {
                    const gp_plan_cell *c = &p.cells[k];
                    /* gpipe holds all M; 1f1b's stage k holds min(K - k, M) */
                    int want = s == 0 ? M : (K - k < M ? K - k : M);
                    CHECK_EQ_INT(c->peak_in_flight, want);
                    gp_cell_mem cm =
                        gp_cell_memory(est, c->first, c->last + 1, 6, want, (gp_remat)rm);
                    CHECK_EQ_INT(c->param_bytes, cm.params);
                    CHECK_EQ_INT(c->grad_bytes, cm.grads);
                    CHECK_EQ_INT(c->optim_bytes, cm.optim);
                    CHECK_EQ_INT(c->peak_act_bytes, cm.stash + cm.work);
                    CHECK_EQ_INT(c->total_bytes, cm.total);
                    CHECK_EQ_INT(c->transient_bytes, cm.transient + cm.messages);
                    CHECK_EQ_INT(c->total_bytes, c->param_bytes + c->grad_bytes + c->optim_bytes +
                                                     c->peak_act_bytes + c->transient_bytes);
                    CHECK(c->peak_act_bytes > 0);
                }
                gp_plan_free(&p);
            }
    gp_model_free(m);
}

static void test_optimizer_state(void) {
    gp_model *m = mlp();
    gp_optim_opts adam = gp_adamw_defaults(1e-3f, 0.01f), mom = gp_sgd_defaults(0.1f, 0.9f),
                  plain = gp_sgd_defaults(0.1f, 0.0f);
    const gp_optim_opts *opts[4] = {&adam, &mom, &plain, NULL};
    const int states[4] = {2, 1, 0, 0};
    for (int i = 0; i < 4; i++) {
        gp_pipeline_opts po = {.stages = 2, .micro_batches = 2};
        gp_plan p;
        REQUIRE_OK(gp_plan_make(m, 8, opts[i], &po, 1, &p));
        uint64_t grads = 0;
        for (int k = 0; k < 2; k++) {
            CHECK_EQ_INT(p.cells[k].optim_bytes, (uint64_t)states[i] * p.cells[k].grad_bytes);
            CHECK_EQ_INT(p.cells[k].grad_bytes, (uint64_t)p.cells[k].nparams * 4);
            grads += p.cells[k].grad_bytes;
        }
        CHECK_EQ_INT(grads, gp_model_nparams(m) * 4);
        gp_plan_free(&p);
    }
    gp_model_free(m);
}

/* The largest cell total over the cells of a plan. */
/* The fullest stage's bytes: its cells' (k, k + K, ... with V cells per stage) together. */
static uint64_t worst_total(const gp_plan *p) {
    uint64_t w = 0;
    for (int k = 0; k < p->stages; k++) {
        uint64_t stage = 0;
        for (int c = 0; c < p->ncells; c++)
            if (p->cells[c].stage == k) stage += p->cells[c].total_bytes;
        if (stage > w) w = stage;
    }
    return w;
}

static void test_memory_limits(void) {
    gp_model *m = mlp();
    gp_optim_opts sgd = gp_sgd_defaults(0.1f, 0.9f);
    const int64_t batch = 1024;
    const int M = 8;
    gp_layer_est est[6];
    REQUIRE_OK(gp_layer_est_from_model(m, batch / M, 1, NULL, est));

    /* A layer that alone cannot fit: named with its overshoot. */
    /* (the last linear: its 256-wide input, stashed M times) */
    uint64_t big = gp_cell_memory(est, 5, 6, 6, M, GP_REMAT_CELL).total;
    for (int i = 0; i < 6; i++)
        CHECK(gp_cell_memory(est, i, i + 1, 6, M, GP_REMAT_CELL).total <= big);
    /* (with K = L every layer is a cell alone; fewer cells could pair it with layer 4) */
    gp_pipeline_opts po = {.stages = 6, .micro_batches = M, .memory_limit = big - 100};
    gp_plan p;
    CHECK_FAILS(gp_plan_make(m, batch, &sgd, &po, 1, &p), GP_MEMORY_LIMIT,
                "layer 5 (linear) alone needs 1.41 MiB with 8 micro-batches held at its peak");
    CHECK(strstr(gp_last_error(), "over the") && strstr(gp_last_error(), "by 100 bytes"));
    CHECK(p.cells == NULL && p.stages == 0);
    gp_plan_free(&p); /* safe after a failure */

    /* Equal layers, a limit just under what the halves need: no split fits (a middle layer alone
     * also holds the messages to both neighbours), and the error names the overshoot; at the
     * halves' need, the halves. */
    gp_model *eq = equal_layers(4);
    gp_layer_est eqe[4];
    REQUIRE_OK(gp_layer_est_from_model(eq, batch / M, 1, NULL, eqe));
    uint64_t c01 = gp_cell_memory(eqe, 0, 2, 4, M, GP_REMAT_CELL).total;
    uint64_t c23 = gp_cell_memory(eqe, 2, 4, 4, M, GP_REMAT_CELL).total;
    uint64_t two = c01 > c23 ? c01 : c23;
    CHECK(gp_cell_memory(eqe, 0, 1, 4, M, GP_REMAT_CELL).total < two - 1000);
    po = (gp_pipeline_opts){.stages = 2, .micro_batches = M, .memory_limit = two - 1000};
    CHECK_FAILS(gp_plan_make(eq, batch, &sgd, &po, 1, &p), GP_MEMORY_LIMIT,
                "the best split (0,2) still needs 264.75 KiB in its cell of layers 2-3, over the "
                "limit by 1000 bytes");
    po.memory_limit = two;
    REQUIRE_OK(gp_plan_make(eq, batch, &sgd, &po, 1, &p));
    CHECK_EQ_INT(p.cells[0].total_bytes, c01);
    CHECK_EQ_INT(p.cells[1].total_bytes, c23);
    CHECK_EQ_INT(p.cells[1].first, 2);
    gp_plan_free(&p);
    gp_model_free(eq);

    /* The limit moves the boundaries: every cell within it, never faster than unlimited. */
    po = (gp_pipeline_opts){.stages = 2, .micro_batches = M};
    REQUIRE_OK(gp_plan_make(m, batch, &sgd, &po, 1, &p));
    uint64_t free_worst = worst_total(&p);
    double free_step = p.step_s;
    gp_plan_free(&p);
    po.memory_limit = free_worst - 1;
    gp_status s = gp_plan_make(m, batch, &sgd, &po, 1, &p);
    if (s == GP_OK) {
        CHECK(worst_total(&p) <= po.memory_limit);
        CHECK(p.step_s >= free_step);
        gp_plan_free(&p);
    } else {
        CHECK_EQ_INT(s, GP_MEMORY_LIMIT);
    }

    /* 1F1B's stage k keeps at most min(K - k, M) micro-batches: a limit that GPipe's M cannot
     * meet. The plan's own largest cell is a limit it meets (each stage counted with its own). */
    po = (gp_pipeline_opts){.stages = 2, .micro_batches = M, .schedule = GP_SCHEDULE_1F1B,
                            .remat = GP_REMAT_NONE};
    REQUIRE_OK(gp_plan_make(m, batch, &sgd, &po, 1, &p));
    uint64_t lim = 0;
    for (int k = 0; k < 2; k++) {
        CHECK_EQ_INT(p.cells[k].peak_in_flight, 2 - k);
        uint64_t b = gp_cell_memory(est, p.cells[k].first, p.cells[k].last + 1, 6, 2 - k,
                                    GP_REMAT_NONE).total;
        CHECK(b == p.cells[k].total_bytes);
        if (b > lim) lim = b;
    }
    gp_plan_free(&p);
    po.memory_limit = lim;
    REQUIRE_OK(gp_plan_make(m, batch, &sgd, &po, 1, &p));
    CHECK(worst_total(&p) <= lim);
    gp_plan_free(&p);
    po.schedule = GP_SCHEDULE_GPIPE;
    CHECK_FAILS(gp_plan_make(m, batch, &sgd, &po, 1, &p), GP_MEMORY_LIMIT, "over the");
    po.schedule = GP_SCHEDULE_1F1B;
    po.memory_limit = lim / 4;
    CHECK_FAILS(gp_plan_make(m, batch, &sgd, &po, 1, &p), GP_MEMORY_LIMIT,
                "stage k keeps at most min(K - k, M) of the M = 8 micro-batches");
    gp_model_free(m);
}

static void test_explicit_partition(void) {
    gp_model *m = mlp();
    const int first[3] = {0, 3, 5};
    gp_pipeline_opts po = {.stages = 3, .micro_batches = 2, .partition = first};
    gp_plan p;
    REQUIRE_OK(gp_plan_make(m, 16, NULL, &po, 1, &p));
    CHECK_EQ_INT(p.cells[0].first, 0);
    CHECK_EQ_INT(p.cells[0].last, 2);
    CHECK_EQ_INT(p.cells[1].first, 3);
    CHECK_EQ_INT(p.cells[1].last, 4);
    CHECK_EQ_INT(p.cells[2].first, 5);
    CHECK_EQ_INT(p.cells[2].last, 5);
    uint64_t c0 = p.cells[0].total_bytes;
    gp_plan_free(&p);
    po.memory_limit = c0 - 7;
    CHECK_FAILS(gp_plan_make(m, 16, NULL, &po, 1, &p), GP_MEMORY_LIMIT,
                "cell 0 (layers 0-2) needs");
    CHECK(strstr(gp_last_error(), "by 7 bytes") != NULL);
    const int unordered[3] = {0, 4, 4}, late[3] = {0, 2, 6};
    po = (gp_pipeline_opts){.stages = 3, .micro_batches = 2, .partition = unordered};
    CHECK_FAILS(gp_plan_make(m, 16, NULL, &po, 1, &p), GP_INVALID_ARGUMENT, "strictly increase");
    po.partition = late;
    CHECK_FAILS(gp_plan_make(m, 16, NULL, &po, 1, &p), GP_INVALID_ARGUMENT, "layer 6");

    int f[8], n = 0;
    char why[256];
    CHECK(gp_cli_parse_partition("0, 5,9", f, 8, &n, why, sizeof why));
    CHECK(n == 3 && f[0] == 0 && f[1] == 5 && f[2] == 9);
    CHECK_PARSE_FAILS("0,x", 8, "position 2");
    CHECK_PARSE_FAILS("0,1,2", 2, "more than 2");
    gp_model_free(m);
}

/* The one check of the options: each bad field named (its gp_pipeline_opts name leading the
 * message, for a front end to replace), what needs the model or the batch checked only when
 * given, and gp_plan_make refusing with the same message. */
static void test_options_check(void) {
    gp_model *m = mlp(); /* 6 layers */
    const struct {
        gp_pipeline_opts po;
        int64_t batch;
        const char *field, *needle;
    } bad[] = {
        {{.stages = -1}, 8, "stages", "stages -1: expected at least 1"},
        {{.stages = 7}, 8, "stages", "stages 7: more than the model's 6 layers"},
        {{.stages = 4, .micro_batches = 4, .schedule = GP_SCHEDULE_ZBV}, 8, "stages",
         "stages 4 x 2 cells per stage: more than the model's 6 layers"},
        {{.micro_batches = -2}, 8, "micro_batches", "micro_batches -2: expected at least 1"},
        {{.micro_batches = 3}, 8, "micro_batches",
         "micro_batches 3: does not divide the batch of 8 examples"},
        {{.stages = 2, .micro_batches = 3, .schedule = GP_SCHEDULE_INTERLEAVED}, 6,
         "micro_batches", "micro_batches 3: not a multiple of the 2 stages"},
        {{.micro_batches = 2, .data_parallel = 3}, 8, "batch",
         "batch 8: does not divide into 3 replicas x 2 micro-batches"},
        {{.tensor_parallel = 4097}, 8, "tensor_parallel",
         "tensor_parallel 4097: expected 1 to 4096"},
        {{.data_parallel = -1}, 8, "data_parallel", "data_parallel -1: expected 1 to 4096"},
        {{.schedule = (gp_schedule_kind)9}, 8, "schedule", "schedule 9: expected gpipe (0)"},
        {{.chunks = -1}, 8, "chunks", "chunks -1: expected 0"},
        {{.stages = 2, .chunks = 2}, 8, "chunks",
         "chunks 2: schedule gpipe with 2 cells per stage (chunks); expected 1"},
        {{.remat = (gp_remat)3}, 8, "remat", "remat 3: expected cell (0)"},
        {{.balance = (gp_balance)2}, 8, "balance", "balance 2: expected cost (0) or time (1)"},
        {{.grad_sum = (gp_grad_sum)2}, 8, "grad_sum", "grad_sum 2: expected sequential (0)"},
        {{.launcher = (gp_launcher)2}, 8, "launcher", "launcher 2: expected threads (0)"},
        {{.stage_threads = 1025}, 8, "stage_threads", "stage_threads 1025: expected 0 (one)"},
        {{.device_type = (gp_device_type)9}, 8, "device_type", "device_type: device type 9"},
        {{.comm_timeout_s = -1}, 8, "comm_timeout_s", "comm_timeout_s -1: expected >= 0"},
        {{.label_smoothing = 1}, 8, "label_smoothing", "label_smoothing 1: expected in [0, 1)"},
        {{.link_gbytes_per_s = INFINITY}, 8, "link_gbytes_per_s",
         "link_gbytes_per_s inf: expected"},
        {{.optim_s_per_param = -1}, 8, "optim_s_per_param", "optim_s_per_param -1: expected"},
        {{0}, -1, "batch", "batch -1: expected >= 0 (0: not known)"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        const char *field = "unset";
        CHECK_FAILS(gp_pipeline_opts_check(m, bad[i].batch, &bad[i].po, &field),
                    GP_INVALID_ARGUMENT, bad[i].needle);
        CHECK(field && strcmp(field, bad[i].field) == 0);
        /* the message leads with the field, as a front end expects to find it */
        CHECK(strncmp(gp_last_error(), bad[i].field, strlen(bad[i].field)) == 0);
        if (bad[i].batch < 1) continue;
        char want[1024];
        snprintf(want, sizeof want, "%s", gp_last_error());
        gp_plan p;
        CHECK_FAILS(gp_plan_make(m, bad[i].batch, NULL, &bad[i].po, 1, &p), GP_INVALID_ARGUMENT,
                    want);
    }
    /* Balance by time needs each layer alone: not with shards. */
    const char *field = NULL;
    gp_pipeline_opts po = {.tensor_parallel = 2, .balance = GP_BALANCE_TIME};
    CHECK_FAILS(gp_pipeline_opts_check(m, 8, &po, &field), GP_UNSUPPORTED,
                "balance time with 2 tensor-parallel shards");
    CHECK(field && strcmp(field, "balance") == 0);
    /* Without the model or the batch what needs them is left to later. */
    po = (gp_pipeline_opts){.stages = 7, .micro_batches = 3};
    CHECK_OK(gp_pipeline_opts_check(NULL, 0, &po, &field));
    CHECK(field == NULL);
    CHECK_FAILS(gp_pipeline_opts_check(NULL, 8, &po, &field), GP_INVALID_ARGUMENT,
                "micro_batches 3: does not divide");
    CHECK_FAILS(gp_pipeline_opts_check(m, 0, &po, NULL), GP_INVALID_ARGUMENT, "stages 7: more");
    CHECK_FAILS(gp_pipeline_opts_check(m, 0, NULL, &field), GP_INVALID_ARGUMENT, "NULL");
    CHECK(field == NULL);
    po = (gp_pipeline_opts){.stages = 2, .micro_batches = 4, .schedule = GP_SCHEDULE_INTERLEAVED,
                            .data_parallel = 2};
    CHECK_OK(gp_pipeline_opts_check(m, 8, &po, NULL));
    gp_model_free(m);
}

static void test_errors(void) {
    gp_model *m = mlp();
    gp_plan p;
    gp_pipeline_opts po = {.stages = 7, .micro_batches = 1};
    CHECK_FAILS(gp_plan_make(m, 8, NULL, &po, 1, &p), GP_INVALID_ARGUMENT,
                "stages 7: more than the model's 6 layers");
    po = (gp_pipeline_opts){.stages = -1};
    CHECK_FAILS(gp_plan_make(m, 8, NULL, &po, 1, &p), GP_INVALID_ARGUMENT,
                "stages -1: expected at least 1");
    po = (gp_pipeline_opts){.micro_batches = -2};
    CHECK_FAILS(gp_plan_make(m, 8, NULL, &po, 1, &p), GP_INVALID_ARGUMENT,
                "micro_batches -2: expected at least 1");
    po = (gp_pipeline_opts){.stages = 2, .micro_batches = 8};
    CHECK_FAILS(gp_plan_make(m, 30, NULL, &po, 1, &p), GP_INVALID_ARGUMENT,
                "micro_batches 8: does not divide the batch of 30 examples");
    CHECK_FAILS(gp_plan_make(m, 0, NULL, &po, 1, &p), GP_INVALID_ARGUMENT, "batch 0");
    CHECK_FAILS(gp_plan_make(m, 32, NULL, &po, 0, &p), GP_INVALID_ARGUMENT, "GFLOP/s");
    CHECK_FAILS(gp_plan_make(m, 32, NULL, &po, NAN, &p), GP_INVALID_ARGUMENT, "GFLOP/s");
    po.schedule = (gp_schedule_kind)7;
    CHECK_FAILS(gp_plan_make(m, 32, NULL, &po, 1, &p), GP_INVALID_ARGUMENT,
                "schedule 7: expected gpipe (0)");
    po = (gp_pipeline_opts){.remat = (gp_remat)5};
    CHECK_FAILS(gp_plan_make(m, 32, NULL, &po, 1, &p), GP_INVALID_ARGUMENT,
                "remat 5: expected cell (0), none (1) or selective (2)");
    po = (gp_pipeline_opts){.stage_threads = 1025};
    CHECK_FAILS(gp_plan_make(m, 32, NULL, &po, 1, &p), GP_INVALID_ARGUMENT,
                "stage_threads 1025: expected 0 (one) to 1024");
    CHECK_FAILS(gp_plan_make(NULL, 32, NULL, &po, 1, &p), GP_INVALID_ARGUMENT, "NULL");
    CHECK_FAILS(gp_plan_make(m, 32, NULL, &po, 1, NULL), GP_INVALID_ARGUMENT, "NULL");
    /* zeroed options: one stage, one micro-batch */
    po = (gp_pipeline_opts){0};
    REQUIRE_OK(gp_plan_make(m, 5, NULL, &po, 1, &p));
    CHECK(p.stages == 1 && p.micro_batches == 1 && p.cells[0].first == 0 && p.cells[0].last == 5);
    CHECK(p.bubble_simulated == 0 && p.bubble_theory == 0);
    CHECK(strcmp(gp_schedule_kind_name(p.schedule), "gpipe") == 0);
    CHECK(strcmp(gp_remat_name(p.remat), "cell") == 0);
    CHECK(strcmp(gp_remat_name(GP_REMAT_NONE), "none") == 0);
    CHECK(strcmp(gp_schedule_kind_name(GP_SCHEDULE_1F1B), "1f1b") == 0);
    gp_plan_free(&p);
    gp_model_free(m);
}

/* Every plan the search may consider, by gp_plan_make one at a time: the fastest that fits. */
static double brute_fastest(gp_model *m, int64_t batch, const gp_optim_opts *o, int N,
                            uint64_t limit, int *nfit, int *ntried) {
    double best = INFINITY;
    *nfit = *ntried = 0;
    for (int K = 1; K <= N; K++) {
        if (N % K || K > gp_model_nlayers(m)) continue;
        const int D = N / K;
        if (batch % D) continue;
        for (int M = 1; M <= batch / D; M++) {
            if ((batch / D) % M) continue;
            for (int s = 0; s <= GP_SCHEDULE_ZBV; s++)
                for (int V = 1; V <= 4; V++)
                for (int r = 0; r < 3; r++) {
                    if (r == GP_REMAT_SELECTIVE && !limit) continue;
                    /* interleaved (V = 2..4, K dividing M) and zbv (V = 2): K > 1, K V cells */
                    const bool chunked = s == GP_SCHEDULE_INTERLEAVED || s == GP_SCHEDULE_ZBV;
                    if (V != (!chunked ? 1 : s == GP_SCHEDULE_ZBV ? 2 : V) || (chunked && V == 1))
                        continue;
                    if (chunked && (K == 1 || K * V > gp_model_nlayers(m))) continue;
                    if (s == GP_SCHEDULE_INTERLEAVED && M % K) continue;
                    gp_pipeline_opts po = {.stages = K, .micro_batches = M, .data_parallel = D,
                                           .schedule = s, .chunks = V, .remat = r,
                                           .memory_limit = limit};
                    gp_plan p;
                    ++*ntried;
                    if (gp_plan_make(m, batch, o, &po, 1, &p) != GP_OK) continue;
                    ++*nfit;
                    if (p.step_s < best) best = p.step_s;
                    gp_plan_free(&p);
                }
        }
    }
    return best;
}

static bool same_cells(const gp_plan *a, const gp_plan *b) {
    if (a->ncells != b->ncells) return false;
    for (int k = 0; k < a->ncells; k++)
        if (a->cells[k].first != b->cells[k].first || a->cells[k].remat != b->cells[k].remat)
            return false;
    return true;
}

static bool same_plan(const gp_plan *a, const gp_plan *b) {
    return a->stages == b->stages && a->micro_batches == b->micro_batches &&
           a->data_parallel == b->data_parallel && a->schedule == b->schedule &&
           a->remat == b->remat && a->step_s == b->step_s && same_cells(a, b);
}

/* The search against trying every plan by hand: the same fastest step, every plan it keeps
 * fits and is sorted, the same answer twice; constraints hold; selective plans whose cells
 * all took one mode are not listed twice. */
static void test_search(void) {
    gp_model *m = mlp();
    gp_optim_opts sgd = gp_sgd_defaults(0.1f, 0.9f);
    const int64_t batch = 24;
    gp_pipeline_opts base = {0};
    gp_plan_search_opts so = {.devices = 1, .max_plans = 4};
    gp_plan_search_result r, again;
    /* the limit: halfway between the leanest and the fattest plan of 2 devices */
    uint64_t lean = UINT64_MAX, fat = 0;
    for (int M = 1; M <= 12; M++) {
        if (12 % M) continue;
        for (int rm = 0; rm < 2; rm++) {
            gp_pipeline_opts po = {.stages = 2, .micro_batches = 2 * M, .remat = rm};
            gp_plan p;
            REQUIRE_OK(gp_plan_make(m, batch, &sgd, &po, 1, &p));
            if (worst_total(&p) < lean) lean = worst_total(&p);
            if (worst_total(&p) > fat) fat = worst_total(&p);
            gp_plan_free(&p);
        }
    }
    const uint64_t limits[2] = {0, (lean + fat) / 2};
    int partial = 0; /* searches where the limit ruled some plans out and others in */
    for (int li = 0; li < 2; li++)
        for (int N = 1; N <= 6; N++) {
            base.memory_limit = limits[li];
            so.devices = N;
            int nfit, ntried;
            const double best = brute_fastest(m, batch, &sgd, N, limits[li], &nfit, &ntried);
            const gp_status st = gp_plan_search(m, batch, &sgd, &base, 1, &so, &r);
            if (nfit == 0) {
                CHECK_EQ_INT(st, GP_MEMORY_LIMIT);
                CHECK(r.n == 0 && r.plans == NULL);
                continue;
            }
            REQUIRE_OK(st);
            partial += nfit < ntried;
            CHECK_EQ_INT(r.candidates, ntried);
            CHECK_EQ_INT(r.fitting, nfit);
            CHECK(r.n >= 1 && r.n <= 4);
            CHECK(fabs(r.plans[0].step_s - best) <= 1e-9 * best);
            for (int i = 0; i < r.n; i++) {
                const gp_plan *p = &r.plans[i];
                CHECK_EQ_INT(p->stages * p->data_parallel, N);
                CHECK(gp_plan_fullest_bytes(p) == worst_total(p));
                CHECK(!limits[li] || worst_total(p) <= limits[li]);
                if (i) CHECK(p->step_s >= r.plans[i - 1].step_s * (1 - 1e-9));
                bool uniform = true;
                for (int k = 1; k < p->stages; k++) uniform &= p->cells[k].remat == p->cells[0].remat;
                CHECK(p->remat != GP_REMAT_SELECTIVE || !uniform);
            }
            REQUIRE_OK(gp_plan_search(m, batch, &sgd, &base, 1, &so, &again));
            CHECK_EQ_INT(again.n, r.n);
            for (int i = 0; i < r.n && i < again.n; i++) CHECK(same_plan(&r.plans[i], &again.plans[i]));
            gp_plan_search_free(&again);
            gp_plan_search_free(&r);
        }
    CHECK(partial >= 3);
    /* constraints: K = 2, 1F1B, remat cell, M = 4 of 6 devices: D = 3 */
    so = (gp_plan_search_opts){.devices = 6, .stages = 2, .micro_batches = 4,
                               .schedules = 1u << GP_SCHEDULE_1F1B, .remats = 1u << GP_REMAT_CELL};
    base.memory_limit = 0;
    REQUIRE_OK(gp_plan_search(m, batch, &sgd, &base, 1, &so, &r));
    CHECK_EQ_INT(r.candidates, 1);
    CHECK(r.n == 1 && r.plans[0].stages == 2 && r.plans[0].data_parallel == 3 &&
          r.plans[0].micro_batches == 4 && r.plans[0].schedule == GP_SCHEDULE_1F1B &&
          r.plans[0].remat == GP_REMAT_CELL);
    gp_plan_search_free(&r);
    /* as many of the fastest as asked for, at most every plan tried (INT_MAX once failed to
     * allocate that many) */
    so = (gp_plan_search_opts){.devices = 2, .max_plans = INT_MAX};
    REQUIRE_OK(gp_plan_search(m, batch, &sgd, &base, 1, &so, &r));
    CHECK(r.n >= 1 && r.n <= r.fitting && r.fitting <= r.candidates);
    for (int i = 1; i < r.n; i++) CHECK(r.plans[i].step_s >= r.plans[i - 1].step_s * (1 - 1e-9));
    gp_plan_search_free(&r);
    /* errors */
    so = (gp_plan_search_opts){.devices = 0};
    CHECK_FAILS(gp_plan_search(m, batch, &sgd, &base, 1, &so, &r), GP_INVALID_ARGUMENT,
                "0 devices");
    CHECK(r.n == 0 && r.plans == NULL);
    so.devices = 3;
    base.tensor_parallel = 2;
    CHECK_FAILS(gp_plan_search(m, batch, &sgd, &base, 1, &so, &r), GP_INVALID_ARGUMENT,
                "3 devices do not divide into T = 2");
    base.tensor_parallel = 0;
    so.stages = 4;
    CHECK_FAILS(gp_plan_search(m, batch, &sgd, &base, 1, &so, &r), GP_INVALID_ARGUMENT,
                "no plan of 3 devices meets the constraints");
    so.stages = 0;
    const int first[1] = {0};
    base.partition = first;
    CHECK_FAILS(gp_plan_search(m, batch, &sgd, &base, 1, &so, &r), GP_INVALID_ARGUMENT,
                "partition");
    base.partition = NULL;
    base.memory_limit = lean / 2;
    CHECK_FAILS(gp_plan_search(m, batch, &sgd, &base, 1, &so, &r), GP_MEMORY_LIMIT,
                "the leanest balanced one");
    gp_model_free(m);
}

/* Interleaved plans: K V cells in order over the layers, each stage's cells (k, k + K) sharing
 * its busy time, the bubble (K-1)/(VM+K-1) in theory and below 1F1B's simulated; under a limit
 * every stage's cells together within it; M not a multiple of K, or too few layers, named. */
static void test_interleaved(void) {
    gp_model *m = mlp();
    const int L = gp_model_nlayers(m);
    gp_pipeline_opts po = {.stages = 2, .micro_batches = 4, .schedule = GP_SCHEDULE_INTERLEAVED};
    gp_plan p, f;
    REQUIRE_OK(gp_plan_make(m, 8, NULL, &po, 1, &p));
    CHECK(p.stages == 2 && p.chunks == 2 && p.ncells == 4);
    CHECK_EQ_INT(p.cells[0].first, 0);
    CHECK_EQ_INT(p.cells[3].last, L - 1);
    for (int c = 1; c < 4; c++) CHECK_EQ_INT(p.cells[c].first, p.cells[c - 1].last + 1);
    CHECK(p.cells[0].busy_s == p.cells[2].busy_s && p.cells[1].busy_s == p.cells[3].busy_s);
    CHECK(fabs(p.bubble_theory - 1.0 / 9.0) < 1e-15);
    gp_pipeline_opts pf = po;
    pf.schedule = GP_SCHEDULE_1F1B;
    REQUIRE_OK(gp_plan_make(m, 8, NULL, &pf, 1, &f));
    CHECK(p.bubble_simulated < f.bubble_simulated);
    /* a limit of the fullest stage's bytes, doubled: met by every stage's cells together */
    po.memory_limit = 2 * worst_total(&p);
    gp_plan_free(&p);
    REQUIRE_OK(gp_plan_make(m, 8, NULL, &po, 1, &p));
    CHECK(worst_total(&p) <= po.memory_limit);
    CHECK(gp_plan_fullest_bytes(&p) == worst_total(&p));
    gp_plan_free(&p);
    gp_plan_free(&f);
    po.memory_limit = 0;
    /* with T = 2 shards a stage's cells are planned as the shard model's: the same cut, the
     * split layers (the output head) holding half their parameters; the search over 4 devices
     * offers such plans */
    REQUIRE_OK(gp_plan_make(m, 8, NULL, &po, 1, &f));
    po.tensor_parallel = 2;
    REQUIRE_OK(gp_plan_make(m, 8, NULL, &po, 1, &p));
    CHECK(p.tensor_parallel == 2 && p.chunks == 2 && p.ncells == 4);
    int64_t shard_params = 0, whole_params = 0;
    for (int c = 0; c < 4; c++) {
        CHECK_EQ_INT(p.cells[c].first, f.cells[c].first);
        CHECK(p.cells[c].nparams <= f.cells[c].nparams);
        shard_params += p.cells[c].nparams;
        whole_params += f.cells[c].nparams;
    }
    CHECK(shard_params < whole_params);
    gp_plan_free(&p);
    gp_plan_free(&f);
    gp_plan_search_opts so = {.devices = 4, .stages = 2,
                              .schedules = 1u << GP_SCHEDULE_ZBV | 1u << GP_SCHEDULE_INTERLEAVED};
    gp_plan_search_result r;
    REQUIRE_OK(gp_plan_search(m, 8, NULL, &po, 1, &so, &r));
    CHECK(r.n >= 1);
    for (int i = 0; i < r.n; i++)
        CHECK(r.plans[i].tensor_parallel == 2 && r.plans[i].chunks >= 2);
    gp_plan_search_free(&r);
    po.tensor_parallel = 0;
    po.micro_batches = 3;
    CHECK_FAILS(gp_plan_make(m, 6, NULL, &po, 1, &p), GP_INVALID_ARGUMENT,
                "micro_batches 3: not a multiple of the 2 stages");
    po.micro_batches = 4;
    po.stages = 4;
    CHECK_FAILS(gp_plan_make(m, 8, NULL, &po, 1, &p), GP_INVALID_ARGUMENT,
                "stages 4 x 2 cells per stage: more than the model's");
    gp_model_free(m);
}

/* The partitioner and the plan report agree, for every schedule and remat mode: the fullest
 * device of the plan made without a limit is a limit that plan meets, so planning under it
 * gives the same cells (a split backward's plan was once refused, its partitioner counting
 * every micro-batch as held to the weight part); a byte less gives other cells within it, or a
 * memory error. Below a byte per cell of a stage (1 byte, V = 2) the limit is still one, not
 * "none", and the plan a memory error (it once aborted), in the search too. */
static void test_limit_agrees_with_report(void) {
    gp_model *m = mlp();
    gp_optim_opts sgd = gp_sgd_defaults(0.1f, 0.9f);
    int met = 0, moved = 0;
    for (int s = 0; s <= GP_SCHEDULE_ZBV; s++)
        for (int r = 0; r <= GP_REMAT_SELECTIVE; r++)
            for (int K = 2; K <= 3; K++)
                for (int M = 3; M <= 6; M += 3) {
                    if (s == GP_SCHEDULE_INTERLEAVED && M % K) continue;
                    gp_pipeline_opts po = {.stages = K, .micro_batches = M,
                                           .schedule = (gp_schedule_kind)s, .remat = (gp_remat)r};
                    gp_plan free_plan, p;
                    REQUIRE_OK(gp_plan_make(m, 48, &sgd, &po, 1, &free_plan));
                    const uint64_t need = gp_plan_fullest_bytes(&free_plan);
                    po.memory_limit = need;
                    gp_status st = gp_plan_make(m, 48, &sgd, &po, 1, &p);
                    CHECK_OK(st);
                    if (st == GP_OK) {
                        met++;
                        CHECK(same_cells(&p, &free_plan));
                        CHECK_EQ_INT(gp_plan_fullest_bytes(&p), need);
                        gp_plan_free(&p);
                    } else {
                        fprintf(stderr, "%s remat %s K %d M %d: %s\n",
                                gp_schedule_kind_name((gp_schedule_kind)s),
                                gp_remat_name((gp_remat)r), K, M, gp_last_error());
                    }
                    po.memory_limit = need - 1;
                    st = gp_plan_make(m, 48, &sgd, &po, 1, &p);
                    if (st == GP_OK) {
                        moved++;
                        CHECK(gp_plan_fullest_bytes(&p) <= need - 1);
                        gp_plan_free(&p);
                    } else {
                        CHECK_EQ_INT(st, GP_MEMORY_LIMIT);
                    }
                    po.memory_limit = 1;
                    CHECK_FAILS(gp_plan_make(m, 48, &sgd, &po, 1, &p), GP_MEMORY_LIMIT,
                                "over the");
                    gp_plan_free(&free_plan);
                }
    CHECK_EQ_INT(met, 5 * 3 * 2 * 2 - 3); /* interleaved takes no M = 3 with K = 2 */
    CHECK(moved > 0);
    gp_plan_search_opts so = {.devices = 4};
    gp_pipeline_opts base = {.memory_limit = 1};
    gp_plan_search_result res;
    CHECK_FAILS(gp_plan_search(m, 48, &sgd, &base, 1, &so, &res), GP_MEMORY_LIMIT,
                "per-device limit");
    gp_model_free(m);
}

/* Selective re-materialization never fits less than cell: for every schedule, at limits from
 * below what the cell plan needs to above what the none plan does, wherever remat cell plans,
 * selective plans too, within the limit (interleaved once refused it where its cells that kept
 * their state fitted alone but not beside their stage's others). */
static void test_selective_fits_where_cell_does(void) {
    gp_model *m = mlp();
    gp_optim_opts sgd = gp_sgd_defaults(0.1f, 0.9f);
    int both = 0;
    for (int s = 0; s <= GP_SCHEDULE_ZBV; s++)
        for (int K = 2; K <= 3; K++) {
            const int M = 6;
            gp_pipeline_opts po = {.stages = K, .micro_batches = M,
                                   .schedule = (gp_schedule_kind)s, .remat = GP_REMAT_CELL};
            gp_plan p;
            REQUIRE_OK(gp_plan_make(m, 48, &sgd, &po, 1, &p));
            const uint64_t cell = gp_plan_fullest_bytes(&p);
            gp_plan_free(&p);
            po.remat = GP_REMAT_NONE;
            REQUIRE_OK(gp_plan_make(m, 48, &sgd, &po, 1, &p));
            const uint64_t none = gp_plan_fullest_bytes(&p);
            gp_plan_free(&p);
            for (int i = 0; i <= 40; i++) {
                po.memory_limit = cell - cell / 10 + (none + none / 10 - cell + cell / 10) / 40 * i;
                po.remat = GP_REMAT_CELL;
                if (gp_plan_make(m, 48, &sgd, &po, 1, &p) != GP_OK) continue;
                gp_plan_free(&p);
                po.remat = GP_REMAT_SELECTIVE;
                gp_status st = gp_plan_make(m, 48, &sgd, &po, 1, &p);
                CHECK_OK(st);
                if (st != GP_OK) {
                    fprintf(stderr, "%s K %d limit %llu: %s\n",
                            gp_schedule_kind_name((gp_schedule_kind)s), K,
                            (unsigned long long)po.memory_limit, gp_last_error());
                    continue;
                }
                both++;
                CHECK(gp_plan_fullest_bytes(&p) <= po.memory_limit);
                gp_plan_free(&p);
            }
        }
    CHECK(both > 20);
    gp_model_free(m);
}

/* The planner's rate (gpipe plan, --plan auto) and G1 time one-thread parts, as a device runs
 * them, even before any device has set OpenBLAS to one thread: OpenBLAS's default is every core,
 * which doubled the "one-thread" rate on two cores. Run first, before any device exists. */
extern int openblas_get_num_threads(void) __attribute__((weak));
static void test_sgemm_rate_single_threaded(void) {
    double gflops = 0;
    char why[256];
    CHECK(gp_cli_bench_sgemm(64, 64, 64, 1, false, 1, &gflops, why, sizeof why));
    CHECK(gflops > 0);
    if (openblas_get_num_threads) CHECK_EQ_INT(openblas_get_num_threads(), 1);
}

int main(void) {
    test_sgemm_rate_single_threaded();
    test_interleaved();
    test_limit_agrees_with_report();
    test_selective_fits_where_cell_does();
    test_search();
    test_cells_match_partitioner();
    test_bubble_equal_cells();
    test_optimizer_step();
    test_action_cost();
    test_alike();
    test_contention();
    test_memory_columns();
    test_optimizer_state();
    test_memory_limits();
    test_explicit_partition();
    test_options_check();
    test_errors();
    return gp_test_finish("test_plan");
}
