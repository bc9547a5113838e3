/* The tree sum of the weight gradients (GP_GRAD_SUM_TREE) in process: for the Transformer
 * (dropout, layer norms whose gradients a split backward writes in its input part) it gives
 * bit-identical losses and parameter hashes for every K = 1, 2, 4, every schedule (the
 * zero-bubble ones with their weight parts deferred, interleaved and zbv with two cells per
 * stage) and both re-materialization modes, at M = 8 (a tree of 8 leaves) and M = 6 (two leaves
 * of 3 micro-batches); it is the sequential sum itself for an odd M; it differs from the
 * sequential sum in bits and agrees with it to float32 rounding; with T = 2 shards per stage, and
 * with the embedding tied to the head, it is bitwise over K too; a bad value is a named error;
 * its buffers are counted as gradients and released with the pipeline. The sum across
 * data-parallel replicas is tests/test_pipeline_mpi.c's and tests/cli/mesh.sh's. */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "testutil.h"

enum { STEPS = 4, BATCH = 8 };
static const uint64_t SEED = 77;

typedef struct result {
    float loss[STEPS];
    uint64_t hash;
    gp_model *m; /* kept (values on the caller's side) when asked */
} result;

static gp_test_net net = GP_TEST_TRANSFORMER;

static void run_t(int batch, int K, int T, int M, gp_schedule_kind sk, gp_remat rm,
                  gp_grad_sum gs, result *r) {
    gp_model *m = gp_test_net_build(net);
    gp_optim_opts o = gp_test_net_optim(net);
    gp_pipeline_opts po = {.stages = K, .micro_batches = M, .schedule = sk, .remat = rm,
                           .grad_sum = gs, .tensor_parallel = T};
    gp_pipeline *p = NULL;
    REQUIRE_OK(gp_pipeline_new(m, &o, &po, SEED, &p));
    for (int s = 0; s < STEPS; s++) {
        gp_test_batch b;
        gp_test_net_batch(net, batch, 1000 + (uint64_t)s, &b);
        REQUIRE_OK(gp_pipeline_step(p, &b.x, &b.y_t, &r->loss[s]));
    }
    REQUIRE_OK(gp_pipeline_params_fnv1a64(p, &r->hash));
    gp_pipeline_free(p); /* every stage device asserts all its bytes (the tree's too) released */
    gp_model_free(m);
}

static void run(int batch, int K, int M, gp_schedule_kind sk, gp_remat rm, gp_grad_sum gs,
                result *r) {
    run_t(batch, K, 1, M, sk, rm, gs, r);
}

static bool same(const result *a, const result *b) {
    return a->hash == b->hash && memcmp(a->loss, b->loss, sizeof a->loss) == 0;
}

/* Every K, schedule and remat mode against K = 1 at one M. */
static void across_pipelines(int M) {
    result ref;
    run(BATCH, 1, M, GP_SCHEDULE_1F1B, GP_REMAT_NONE, GP_GRAD_SUM_TREE, &ref);
    static const struct {
        int K;
        gp_schedule_kind sk;
    } cases[] = {{2, GP_SCHEDULE_GPIPE}, {2, GP_SCHEDULE_1F1B},       {2, GP_SCHEDULE_ZBH1},
                 {4, GP_SCHEDULE_ZBH1},  {2, GP_SCHEDULE_INTERLEAVED}, {2, GP_SCHEDULE_ZBV},
                 {4, GP_SCHEDULE_GPIPE}};
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++)
        for (int rm = 0; rm < 2; rm++) {
            const gp_remat remat = rm ? GP_REMAT_NONE : GP_REMAT_CELL;
            if (cases[i].sk == GP_SCHEDULE_INTERLEAVED && M % cases[i].K) continue;
            result got;
            run(BATCH, cases[i].K, M, cases[i].sk, remat, GP_GRAD_SUM_TREE, &got);
            const bool ok = same(&got, &ref);
            printf("tree M=%d K=%d %s remat %s: params %016llx vs K=1 %016llx: %s\n", M,
                   cases[i].K, gp_schedule_kind_name(cases[i].sk), gp_remat_name(remat),
                   (unsigned long long)got.hash, (unsigned long long)ref.hash,
                   ok ? "bit-identical" : "DIFFERENT");
            CHECK(ok);
        }
}

int main(void) {
    across_pipelines(8);
    /* M = 6: leaves of 3 micro-batches added in order, then the two leaves (batch 6) */
    {
        result a, b;
        run(6, 1, 6, GP_SCHEDULE_1F1B, GP_REMAT_NONE, GP_GRAD_SUM_TREE, &a);
        run(6, 2, 6, GP_SCHEDULE_ZBH1, GP_REMAT_CELL, GP_GRAD_SUM_TREE, &b);
        printf("tree M=6: K=2 zbh1 vs K=1: %s\n", same(&a, &b) ? "bit-identical" : "DIFFERENT");
        CHECK(same(&a, &b));
    }
    /* T = 2 shards per stage: each shard's cell sums its part as a tree, over K as well. */
    {
        result a, b;
        run_t(BATCH, 1, 2, 8, GP_SCHEDULE_1F1B, GP_REMAT_NONE, GP_GRAD_SUM_TREE, &a);
        run_t(BATCH, 2, 2, 8, GP_SCHEDULE_ZBH1, GP_REMAT_CELL, GP_GRAD_SUM_TREE, &b);
        printf("tree M=8 T=2: K=2 zbh1 vs K=1: %s\n", same(&a, &b) ? "bit-identical" : "DIFFERENT");
        CHECK(same(&a, &b));
    }
    /* Tied embedding and head: each use's cell sums its own gradient as a tree, the two sums
     * then meet at the step's end; over K = 1 and 3 stages, zbh1 too. */
    {
        net = GP_TEST_TRANSFORMER_TIED;
        result a, b;
        run(BATCH, 1, 8, GP_SCHEDULE_1F1B, GP_REMAT_NONE, GP_GRAD_SUM_TREE, &a);
        run(BATCH, 3, 8, GP_SCHEDULE_ZBH1, GP_REMAT_CELL, GP_GRAD_SUM_TREE, &b);
        printf("tree M=8, tied: K=3 zbh1 vs K=1: %s\n", same(&a, &b) ? "bit-identical" : "DIFFERENT");
        CHECK(same(&a, &b));
        net = GP_TEST_TRANSFORMER;
    }
    /* An odd M is one leaf: the sequential sum, bit for bit. */
    {
        result a, b;
        run(3 * 2, 2, 3, GP_SCHEDULE_1F1B, GP_REMAT_CELL, GP_GRAD_SUM_TREE, &a);
        run(3 * 2, 2, 3, GP_SCHEDULE_1F1B, GP_REMAT_CELL, GP_GRAD_SUM_SEQUENTIAL, &b);
        CHECK(same(&a, &b));
    }
    /* At M = 8 the tree is another order than micro-batch order: other bits, the same sums to
     * float32 rounding. AdamW divides by sqrt(v): a gradient of pure rounding noise (attn.qkv's
     * key bias, see test_pipeline_mpi.c) moves by lr either way, so the losses, not the
     * parameters, are compared: 1e-5 relative after 4 steps (measured: a few 1e-7). */
    {
        result t, s;
        run(BATCH, 1, 8, GP_SCHEDULE_1F1B, GP_REMAT_NONE, GP_GRAD_SUM_TREE, &t);
        run(BATCH, 1, 8, GP_SCHEDULE_1F1B, GP_REMAT_NONE, GP_GRAD_SUM_SEQUENTIAL, &s);
        CHECK(t.hash != s.hash);
        double worst = 0;
        for (int i = 0; i < STEPS; i++)
            worst = fmax(worst, fabs((double)t.loss[i] - s.loss[i]) / fabs((double)s.loss[i]));
        printf("tree vs sequential, M=8: params %016llx vs %016llx, losses within %.3g relative\n",
               (unsigned long long)t.hash, (unsigned long long)s.hash, worst);
        CHECK(worst <= 1e-5);
    }
    /* A bad value is refused by name. */
    {
        gp_model *m = gp_test_net_build(GP_TEST_TRANSFORMER);
        gp_optim_opts o = gp_test_net_optim(GP_TEST_TRANSFORMER);
        gp_pipeline_opts po = {.stages = 1, .micro_batches = 2, .grad_sum = (gp_grad_sum)7};
        gp_pipeline *p = NULL;
        CHECK_FAILS(gp_pipeline_new(m, &o, &po, SEED, &p), GP_INVALID_ARGUMENT, "grad_sum 7");
        gp_model_free(m);
        CHECK(!strcmp(gp_grad_sum_name(GP_GRAD_SUM_TREE), "tree"));
        CHECK(!strcmp(gp_grad_sum_name(GP_GRAD_SUM_SEQUENTIAL), "sequential"));
    }
    return gp_test_finish("test_grad_tree");
}
