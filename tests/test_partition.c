/* The partitioner against brute force over every set of boundaries on random small instances
 * (optimal bottleneck, the same tie-break, the memory limit), its error messages, explicit
 * partitions, and the memory model's figures. */
#include <stdlib.h>
#include <string.h>

#include "plan/partition.h"
#include "testutil.h"

#define MIB (1024ull * 1024ull)

static uint64_t rnd(uint64_t seed, uint64_t *i, uint64_t n) {
    gp_rng_stream s = {.seed = seed, .purpose = GP_RNG_TEST, .a = 77};
    return gp_rng_u64(&s, (*i)++) % n;
}

/* Brute force: every first[] with first[0] = 0, in lexicographic order; the first optimum kept. */
typedef struct brute {
    const gp_partition_req *r;
    int cur[16], best[16];
    gp_remat cur_remat[16], best_remat[16];
    double best_t;
    bool found;
} brute;

/* Cell k of r as layers [first, end): on its profile, or with fl micro-batches stashed. */
static gp_cell_mem cell_mem(const gp_partition_req *r, int k, int first, int end, int fl,
                            gp_remat how) {
    if (r->profile)
        return gp_cell_memory_at(r->layers, first, end, r->nlayers, &r->profile[k], how, r->split);
    return gp_cell_memory(r->layers, first, end, r->nlayers, fl, how);
}

static void brute_rec(brute *b, int c, int start) {
    const gp_partition_req *r = b->r;
    int K = r->stages, L = r->nlayers;
    b->cur[c] = start;
    if (c == K - 1) {
        double worst = 0;
        for (int k = 0; k < K; k++) {
            int e = k + 1 < K ? b->cur[k + 1] : L;
            double t = gp_cell_time(r->layers, b->cur[k], e);
            const uint64_t lim = r->mem_limit ? r->mem_limit : UINT64_MAX;
            /* 1F1B (tapered): stage k stashes min(K - k, M); or cell k's own profile */
            const int fl = r->tapered && K - k < r->micro_batches ? K - k : r->micro_batches;
            gp_remat how = r->remat;
            if (how == GP_REMAT_SELECTIVE) {
                /* keep the state where it fits; recomputing costs the cell's forward again */
                how = cell_mem(r, k, b->cur[k], e, fl, GP_REMAT_NONE).total <= lim
                          ? GP_REMAT_NONE
                          : GP_REMAT_CELL;
                double f = 0; /* summed apart, then added: the partitioner's rounding */
                for (int i = b->cur[k]; i < e; i++) f += r->layers[i].fwd_time;
                if (how == GP_REMAT_CELL) t += f;
            }
            b->cur_remat[k] = how;
            gp_cell_mem m = cell_mem(r, k, b->cur[k], e, fl, how);
            if (m.total > lim) return;
            if (t > worst) worst = t;
        }
        if (!b->found || worst < b->best_t) {
            b->found = true;
            b->best_t = worst;
            memcpy(b->best, b->cur, sizeof b->best);
            memcpy(b->best_remat, b->cur_remat, sizeof b->best_remat);
        }
        return;
    }
    for (int next = start + 1; next <= L - (K - 1 - c); next++) brute_rec(b, c + 1, next);
}

static void test_random_against_brute_force(void) {
    int ncases = getenv("GP_TEST_QUICK") ? 400 : 3000;
    int infeasible = 0, limited = 0, selective_mixed = 0, profiled = 0;
    for (int seed = 0; seed < ncases; seed++) {
        uint64_t i = 0, sd = (uint64_t)seed;
        gp_layer_est ly[10];
        int L = 1 + (int)rnd(sd, &i, 10);
        int K = 1 + (int)rnd(sd, &i, (uint64_t)L);
        bool small_ints = seed % 3 == 0; /* many ties */
        for (int l = 0; l < L; l++) {
            memset(&ly[l], 0, sizeof ly[l]);
            if (small_ints) {
                ly[l].fwd_time = (double)rnd(sd, &i, 3);
                ly[l].bwd_time = (double)rnd(sd, &i, 3);
            } else {
                ly[l].fwd_time = (double)rnd(sd, &i, 1000000) * 1e-6 * 3.7;
                ly[l].bwd_time = (double)rnd(sd, &i, 1000000) * 1e-6 * 7.1;
            }
            ly[l].param_bytes = rnd(sd, &i, 100);
            ly[l].grad_bytes = ly[l].param_bytes;
            ly[l].optim_bytes = 2 * ly[l].param_bytes * rnd(sd, &i, 2);
            ly[l].in_bytes = rnd(sd, &i, 40);
            ly[l].out_bytes = rnd(sd, &i, 40);
            ly[l].saved_bytes = rnd(sd, &i, 60);
        }
        gp_partition_req r = {.layers = ly, .nlayers = L, .stages = K,
                              .micro_batches = 1 + (int)rnd(sd, &i, 8),
                              .remat = (gp_remat)rnd(sd, &i, 3),
                              .tapered = seed % 4 == 1,
                              .mem_limit = rnd(sd, &i, 2) ? 200 + rnd(sd, &i, 1500) : 0};
        /* a schedule's profiles: up to 3 points per cell, a split backward's keep_bytes */
        gp_stash_point pts[16][3];
        gp_stash_profile prof[16];
        if (seed % 4 == 3) {
            for (int l = 0; l < L; l++) ly[l].keep_bytes = rnd(sd, &i, 30);
            for (int k = 0; k < K; k++) {
                prof[k] = (gp_stash_profile){.pt = pts[k], .n = 1 + (int)rnd(sd, &i, 3)};
                for (int q = 0; q < prof[k].n; q++) {
                    const int f = (int)rnd(sd, &i, 5), w = (int)rnd(sd, &i, 3);
                    const int bwd = f > 0 ? (int)rnd(sd, &i, 2) : 0;
                    pts[k][q] = (gp_stash_point){f, w, bwd, w + (bwd ? (int)rnd(sd, &i, 2) : 0)};
                }
            }
            r.profile = prof;
            r.split = rnd(sd, &i, 2);
            profiled++;
        }
        brute b = {.r = &r};
        brute_rec(&b, 0, 0);
        gp_remat cell_remat[16];
        r.cell_remat = cell_remat;
        int first[16];
        double bott = -1;
        gp_status st = gp_partition_balance(&r, first, &bott);
        limited += r.mem_limit != 0;
        if (!b.found) {
            infeasible++;
            CHECK_EQ_INT(st, GP_MEMORY_LIMIT);
            CHECK(strstr(gp_last_error(), "over the") != NULL);
            continue;
        }
        if (st != GP_OK) {
            fprintf(stderr, "seed %d: %s\n", seed, gp_last_error());
            gp_test_failures++;
            continue;
        }
        CHECK(bott == b.best_t);
        bool same = true;
        for (int k = 0; k < K; k++)
            same = same && first[k] == b.best[k] && cell_remat[k] == b.best_remat[k];
        if (r.remat == GP_REMAT_SELECTIVE) {
            bool some_none = false, some_cell = false;
            for (int k = 0; k < K; k++)
                some_none |= cell_remat[k] == GP_REMAT_NONE,
                    some_cell |= cell_remat[k] == GP_REMAT_CELL;
            selective_mixed += some_none && some_cell;
        }
        if (!same) {
            fprintf(stderr, "seed %d: L %d K %d: partition differs from brute force\n", seed, L,
                    K);
            gp_test_failures++;
        }
        gp_remat checked[16];
        r.cell_remat = checked;
        CHECK_OK(gp_partition_check(&r, first, K));
        CHECK(memcmp(checked, cell_remat, (size_t)K * sizeof *checked) == 0);
    }
    CHECK(selective_mixed > ncases / 300); /* selective partitions with both kinds of cells */
    /* the random instances must exercise both outcomes of the limit */
    CHECK(infeasible > 10);
    CHECK(limited > ncases / 3);
    CHECK(profiled > ncases / 5);
}

static gp_layer_est timed(double t) {
    return (gp_layer_est){.fwd_time = t / 3, .bwd_time = t - t / 3};
}

static void test_ties_and_determinism(void) {
    gp_layer_est ly[6];
    for (int l = 0; l < 6; l++) ly[l] = (gp_layer_est){.fwd_time = 1, .bwd_time = 1};
    gp_partition_req r = {.layers = ly, .nlayers = 4, .stages = 3, .micro_batches = 4};
    int first[3], again[3];
    double bott;
    /* times 2,2,2,2 into 3 cells: bottleneck 4 by (0,1,2), (0,1,3), (0,2,3): the smallest */
    REQUIRE_OK(gp_partition_balance(&r, first, &bott));
    CHECK(bott == 4);
    CHECK_EQ_INT(first[0], 0);
    CHECK_EQ_INT(first[1], 1);
    CHECK_EQ_INT(first[2], 2);
    REQUIRE_OK(gp_partition_balance(&r, again, &bott));
    CHECK(memcmp(first, again, sizeof first) == 0);
    /* a clear optimum: 1 1 1 1 | 4 | 2 2 */
    double t[7] = {1, 1, 1, 1, 4, 2, 2};
    gp_layer_est ly7[7];
    for (int l = 0; l < 7; l++) ly7[l] = timed(t[l]);
    r = (gp_partition_req){.layers = ly7, .nlayers = 7, .stages = 3, .micro_batches = 1};
    REQUIRE_OK(gp_partition_balance(&r, first, &bott));
    CHECK_EQ_INT(first[1], 4);
    CHECK_EQ_INT(first[2], 5);
    CHECK_NEAR(bott, 4, 1e-12);
    /* K = 1 and K = L */
    r.stages = 1;
    REQUIRE_OK(gp_partition_balance(&r, first, &bott));
    CHECK_EQ_INT(first[0], 0);
    CHECK_NEAR(bott, 12, 1e-12);
    int all[7];
    r.stages = 7;
    REQUIRE_OK(gp_partition_balance(&r, all, &bott));
    for (int k = 0; k < 7; k++) CHECK_EQ_INT(all[k], k);
}

static void test_memory_model(void) {
    gp_layer_est ly[3] = {
        {.param_bytes = 10, .grad_bytes = 10, .optim_bytes = 20, .in_bytes = 7, .out_bytes = 3,
         .saved_bytes = 5},
        {.param_bytes = 1, .grad_bytes = 0, .optim_bytes = 0, .in_bytes = 3, .out_bytes = 2,
         .saved_bytes = 4},
        {.in_bytes = 2, .out_bytes = 100},
    };
    gp_cell_mem c = gp_cell_memory(ly, 0, 2, 3, 8, GP_REMAT_CELL);
    CHECK_EQ_INT(c.params, 11);
    CHECK_EQ_INT(c.grads, 10);
    CHECK_EQ_INT(c.optim, 20);
    CHECK_EQ_INT(c.stash, 8 * 7);        /* only the cell's input, per micro-batch */
    CHECK_EQ_INT(c.work, 3 + 5 + 2 + 4); /* one micro-batch rebuilt */
    /* layer 1's backward: its output and input gradients (2 + 3) beside the whole state; layer
     * 0's (3, no input gradient of the model's input) comes after layer 1's 6 are released */
    CHECK_EQ_INT(c.transient, 5);
    CHECK_EQ_INT(c.messages, 2 * 2); /* two sent outputs of layer 1; no gradients from stage 0 */
    CHECK_EQ_INT(c.total, 41 + 56 + 14 + 5 + 4);
    c = gp_cell_memory(ly, 0, 2, 3, 8, GP_REMAT_NONE);
    CHECK_EQ_INT(c.stash, 8 * (7 + 14));
    CHECK_EQ_INT(c.work, 0);
    CHECK_EQ_INT(c.total, 41 + 8 * 21 + 5 + 4);
    c = gp_cell_memory(ly, 1, 3, 3, 2, GP_REMAT_CELL);
    CHECK_EQ_INT(c.stash, 2 * 3);
    /* the last layer's gradients, and the cell's input gradient, allocated before its backward */
    CHECK_EQ_INT(c.transient, 100 + 2 + 3);
    CHECK_EQ_INT(c.messages, 2 * 3); /* two input gradients; the last cell sends no output */
    CHECK_EQ_INT(c.total, 1 + 6 + 106 + 105 + 6);
    /* a workspace counts where its layer's backward runs: layer 0's 50 beside its output
     * gradient 3 and the cell's output gradient 2, after layer 1's state of 6 is released */
    ly[0].ws_bytes = 50;
    CHECK_EQ_INT(gp_cell_memory(ly, 0, 2, 3, 8, GP_REMAT_CELL).transient, 53 - 6 + 2);
    ly[0].ws_bytes = 0;
    /* saturates instead of wrapping */
    gp_layer_est huge = {.in_bytes = UINT64_MAX / 2, .param_bytes = UINT64_MAX / 2};
    CHECK(gp_cell_memory(&huge, 0, 1, 1, 4, GP_REMAT_NONE).total == UINT64_MAX);
    char buf[32];
    CHECK(strcmp(gp_plan_bytes_str(300 * MIB, buf, sizeof buf), "300 MiB") == 0);
    CHECK(strcmp(gp_plan_bytes_str(512, buf, sizeof buf), "512 bytes") == 0);
    CHECK(strcmp(gp_plan_bytes_str(1536 * MIB, buf, sizeof buf), "1.50 GiB") == 0);
}

static void test_memory_limit(void) {
    gp_layer_est ly[10];
    for (int l = 0; l < 10; l++)
        ly[l] = (gp_layer_est){.kind = "linear", .fwd_time = 1, .bwd_time = 2,
                               .param_bytes = 10 * MIB, .grad_bytes = 10 * MIB,
                               .in_bytes = 1 * MIB, .out_bytes = 1 * MIB};
    /* layer 7: 100 + 100 MiB static, 8 x 4 MiB inputs, 20 + 48 MiB state = 300 MiB */
    ly[7] = (gp_layer_est){.kind = "big", .fwd_time = 1, .bwd_time = 2, .param_bytes = 100 * MIB,
                           .grad_bytes = 100 * MIB, .in_bytes = 4 * MIB, .out_bytes = 20 * MIB,
                           .saved_bytes = 48 * MIB};
    gp_partition_req r = {.layers = ly, .nlayers = 10, .stages = 4, .micro_batches = 8,
                          .remat = GP_REMAT_CELL, .mem_limit = 256 * MIB};
    int first[10];
    /* Alone it needs 372 MiB, but behind layer 6 only its 1 MiB input is stashed: 20 + 8 + 1 +
     * 200 + 68 = 297 MiB, its backward's 20 + 4 MiB gradients beside the cell's 1 MiB input
     * gradient, two 20 MiB outputs and two 1 MiB input gradients sent: 364 MiB, the least any
     * cell holding it needs. */
    CHECK_FAILS(gp_partition_balance(&r, first, NULL), GP_MEMORY_LIMIT,
                "layer 7 (big) fits in no cell: the smallest cell holding it (layers 6-7) needs "
                "364 MiB with 8 micro-batches held at its peak (remat cell), over the 256 MiB "
                "per-device limit by 108 MiB");
    /* As the first layer it has nothing to start behind (and no input gradient to send). */
    gp_layer_est swap = ly[0];
    ly[0] = ly[7], ly[7] = swap;
    CHECK_FAILS(gp_partition_balance(&r, first, NULL), GP_MEMORY_LIMIT,
                "layer 0 (big) alone needs 360 MiB with 8 micro-batches held at its peak (remat "
                "cell), over the 256 MiB per-device limit by 104 MiB");
    ly[7] = ly[0], ly[0] = swap;
    /* Every layer fits alone, but two cells cannot hold four 100 MiB layers under 150 MiB. */
    gp_layer_est fat[4];
    for (int l = 0; l < 4; l++)
        fat[l] = (gp_layer_est){.fwd_time = 1, .param_bytes = 100 * MIB};
    r = (gp_partition_req){.layers = fat, .nlayers = 4, .stages = 2, .micro_batches = 2,
                           .mem_limit = 150 * MIB};
    CHECK_FAILS(gp_partition_balance(&r, first, NULL), GP_MEMORY_LIMIT,
                "the best split (0,2) still needs 200 MiB in its cell of layers 0-1, over the "
                "limit by 50 MiB");
    r.stages = 4;
    REQUIRE_OK(gp_partition_balance(&r, first, NULL));
    /* The limit moves the optimum: times 1 1 1 1 1 1 would split 3/3, but layer 0's input is
     * large, so stage 0's cell must stay short. */
    gp_layer_est six[6];
    for (int l = 0; l < 6; l++)
        six[l] = (gp_layer_est){.fwd_time = 1, .param_bytes = 10, .out_bytes = 10};
    six[0].in_bytes = 50;
    r = (gp_partition_req){.layers = six, .nlayers = 6, .stages = 2, .micro_batches = 2,
                           .remat = GP_REMAT_CELL, .mem_limit = 0};
    double bott;
    REQUIRE_OK(gp_partition_balance(&r, first, &bott));
    CHECK_EQ_INT(first[1], 3);
    /* stage 0 with 3 layers: 30 static + 2 x 50 stash + 30 state + 10 output gradient + 2 x 10
     * sent outputs = 190 */
    CHECK_EQ_INT(gp_cell_memory(six, 0, 3, 6, 2, GP_REMAT_CELL).total, 190);
    r.mem_limit = 170;
    REQUIRE_OK(gp_partition_balance(&r, first, &bott));
    CHECK_EQ_INT(first[1], 2);
    CHECK(bott == 4);
    CHECK(gp_cell_memory(six, 0, 2, 6, 2, GP_REMAT_CELL).total <= 170);
    CHECK(gp_cell_memory(six, 2, 6, 6, 2, GP_REMAT_CELL).total <= 170);
    /* remat none keeps every micro-batch's state: 20 + 2 x (50 + 20) + 10 + 20 = 190 for 2
     * layers */
    r.remat = GP_REMAT_NONE;
    REQUIRE_OK(gp_partition_balance(&r, first, &bott));
    CHECK_EQ_INT(first[1], 1);
}

static void test_errors_and_explicit(void) {
    gp_layer_est ly[14];
    for (int l = 0; l < 14; l++) ly[l] = timed(1 + l % 3);
    gp_partition_req r = {.layers = ly, .nlayers = 4, .stages = 5, .micro_batches = 1};
    int first[16], n = 0;
    CHECK_FAILS(gp_partition_balance(&r, first, NULL), GP_INVALID_ARGUMENT,
                "K = 5 stages but the model has 4 layers");
    r.stages = 0;
    CHECK_FAILS(gp_partition_balance(&r, first, NULL), GP_INVALID_ARGUMENT, "K = 0 stages");
    r.stages = 2;
    r.micro_batches = 0;
    CHECK_FAILS(gp_partition_balance(&r, first, NULL), GP_INVALID_ARGUMENT, "M = 0");
    r.micro_batches = 1;
    r.remat = (gp_remat)4;
    CHECK_FAILS(gp_partition_balance(&r, first, NULL), GP_INVALID_ARGUMENT,
                "unknown remat mode 4 (expected 0 cell, 1 none or 2 selective)");
    r.remat = GP_REMAT_CELL;
    ly[2].bwd_time = -1;
    CHECK_FAILS(gp_partition_balance(&r, first, NULL), GP_INVALID_ARGUMENT, "layer 2");
    ly[2] = timed(1);

    r = (gp_partition_req){.layers = ly, .nlayers = 14, .stages = 4, .micro_batches = 2,
                           .remat = GP_REMAT_NONE};
    char why[256];
    CHECK(gp_cli_parse_partition("0,5,9,12", first, 16, &n, why, sizeof why));
    CHECK_EQ_INT(n, 4);
    CHECK_EQ_INT(first[3], 12);
    CHECK_OK(gp_partition_check(&r, first, n));
    CHECK_FAILS(gp_partition_check(&r, first, 3), GP_INVALID_ARGUMENT,
                "3 entries given for K = 4");
    int bad0[4] = {1, 5, 9, 12}, bad1[4] = {0, 5, 5, 12}, bad2[4] = {0, 5, 9, 14};
    CHECK_FAILS(gp_partition_check(&r, bad0, 4), GP_INVALID_ARGUMENT, "starts at layer 1");
    CHECK_FAILS(gp_partition_check(&r, bad1, 4), GP_INVALID_ARGUMENT,
                "entry 2 (layer 5) is not after entry 1 (layer 5)");
    CHECK_FAILS(gp_partition_check(&r, bad2, 4), GP_INVALID_ARGUMENT,
                "entry 3 is layer 14 but the model has 14 layers");
    for (int l = 0; l < 14; l++) ly[l].param_bytes = MIB;
    r.mem_limit = 4 * MIB;
    CHECK_FAILS(gp_partition_check(&r, first, 4), GP_MEMORY_LIMIT,
                "cell 0 (layers 0-4) needs 5 MiB with 2 micro-batches held at its peak (remat "
                "none), over the 4 MiB per-device limit by 1 MiB");
    CHECK_PARSE_FAILS("0,,5", 16, "position 2");
    CHECK_PARSE_FAILS("0;5", 16, "unexpected ';'");
    CHECK_PARSE_FAILS("", 16, "layer index");
    CHECK_PARSE_FAILS("0,1,2", 2, "more than 2");
    CHECK(gp_cli_parse_partition(" 0, 3 ", first, 16, &n, why, sizeof why));
    CHECK_EQ_INT(n, 2);
}

static void test_from_model(void) {
    gp_transformer_config c = {.vocab = 32, .dim = 16, .heads = 2, .d_ff = 32, .layers = 2,
                               .seq_len = 8};
    gp_model *m;
    REQUIRE_OK(gp_model_transformer(&c, &m));
    int L = gp_model_nlayers(m);
    gp_layer_est *e = calloc((size_t)L, sizeof *e);
    REQUIRE_OK(gp_layer_est_from_model(m, 4, 2, NULL, e));
    uint64_t grads = 0;
    for (int i = 0; i < L; i++) {
        gp_cost cost;
        REQUIRE_OK(gp_model_cost(m, i, 4, &cost));
        CHECK(e[i].fwd_time == cost.fwd_flops);
        CHECK(e[i].bwd_time == cost.bwd_flops);
        CHECK(e[i].out_bytes == cost.out_bytes);
        CHECK(e[i].optim_bytes == 2 * e[i].grad_bytes);
        CHECK(e[i].grad_bytes <= e[i].param_bytes);
        CHECK(strcmp(e[i].kind, gp_layer_kind(gp_model_layer(m, i))) == 0);
        if (i > 0) CHECK_EQ_INT(e[i].in_bytes, e[i - 1].out_bytes);
        grads += e[i].grad_bytes;
    }
    CHECK_EQ_INT(e[0].in_bytes, 4 * 8 * 4); /* (4, 8) int32 tokens */
    CHECK_EQ_INT(grads, (uint64_t)gp_model_nparams(m) * 4);
    CHECK_FAILS(gp_layer_est_from_model(m, 4, 3, NULL, e), GP_INVALID_ARGUMENT, "got 3");
    CHECK_FAILS(gp_layer_est_from_model(m, 0, 0, NULL, e), GP_INVALID_ARGUMENT, "micro-batch size 0");
    /* balanced over the real cost model: every stage gets at least one layer */
    gp_partition_req r = {.layers = e, .nlayers = L, .stages = 3, .micro_batches = 4,
                          .remat = GP_REMAT_CELL};
    int first[3];
    REQUIRE_OK(gp_partition_balance(&r, first, NULL));
    CHECK_OK(gp_partition_check(&r, first, 3));
    free(e);
    gp_model_free(m);
}

int main(void) {
    test_random_against_brute_force();
    test_ties_and_determinism();
    test_memory_model();
    test_memory_limit();
    test_errors_and_explicit();
    test_from_model();
    return gp_test_finish("test_partition");
}
