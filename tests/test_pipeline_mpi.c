/* The pipeline over MPI against the in-process references. The test starts itself under
 * mpirun (oversubscribed, so it runs on 2 cores) once per case; in each child every rank trains
 * its stage (shard), the ranks sync the parameters, and rank 0 compares with a reference it
 * computes itself: D = 1 must give bit-identical losses and params_fnv1a64 to the threads
 * pipeline with the same K, M, T and seed (T = 1 and T = 2); D = 2 must match the single-device
 * trainer on the same global batch (M = D x M' micro-batches) within 1e-5 relative error, as
 * must the mesh D x K x T = 2 x 2 x 2 (8 ranks), read back from the set of whole tensors its
 * shards saved; a launch of the wrong size must fail in gp_pipeline_new with a message
 * naming both sizes; the MPI transport hands a message over bit-exact, refuses one of the wrong
 * shape naming both ranks, and the other rank stops with that rank's message. The two-cell
 * schedules (interleaved, zbv: a rank runs two cells) give the threads pipeline's bits with
 * D = 1 and the single device's within 1e-5 with D = 2, and their set of 2K parts (one per cell,
 * a rank writing two) reads back to the parameters trained. The same holds for the Transformer
 * with its embedding tied to its head across the stages (K = 3, T = 2, two cells, D = 2), whose
 * sets store the tied matrix once. With the tree sum of the gradients (GP_GRAD_SUM_TREE) D = 1,
 * 2 and 4 replicas give the threads pipeline's bits on the same mini-batch of 8 micro-batches;
 * with the sequential sum D = 2 and 4 do not. Skipped (exit 77) without MPI or mpirun. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "comm/mpi_grid.h"
#include "testutil.h"

/* A case takes seconds (tens under ASan); a hung one is stopped after this. */
enum { STEPS = 5, SKIP = 77, CASE_TIMEOUT_S = 240 };
static const uint64_t SEED = 77;

typedef struct outcome {
    float loss[STEPS];
    uint64_t hash;
} outcome;

/* Threads pipeline (K stages) or, with K = 0, the single-device trainer, M micro-batches. */
/* The D = 2 cases train with SGD: under AdamW the key part of attn.qkv.bias, whose true
 * gradient is zero (softmax ignores a shift shared by every key), gets a gradient of pure
 * rounding noise, whose order-dependent sum AdamW scales to steps of size lr: 5e-5 relative
 * after 3 steps. With SGD rounding noise stays noise-sized. */
static gp_optim_opts optim(gp_test_net net, int D) {
    if (D == 1) return gp_test_net_optim(net);
    gp_optim_opts o = gp_sgd_defaults(0.05f, 0.9f);
    o.clip_norm = 0.5f;
    return o;
}

static int reference(gp_test_net net, bool use_sgd, int K, int M, int T, gp_schedule_kind sk,
                     outcome *r, gp_model **keep) {
    gp_model *m = gp_test_net_build(net);
    gp_optim_opts o = optim(net, use_sgd ? 2 : 1);
    gp_device *dev = NULL;
    gp_pipeline *p = NULL;
    if (K == 0) {
        REQUIRE_OK(gp_device_cpu_new("ref", &dev));
        REQUIRE_OK(gp_model_init(m, dev, SEED));
        p = gp_test_single(m, &o, M);
    } else {
        gp_pipeline_opts po = {.stages = K, .micro_batches = M, .schedule = sk,
                               .tensor_parallel = T};
        REQUIRE_OK(gp_pipeline_new(m, &o, &po, SEED, &p));
    }
    for (int s = 0; s < STEPS; s++) {
        gp_test_batch b;
        gp_test_net_batch(net, GP_TEST_NET_MAX_BATCH, 1000 + (uint64_t)s, &b);
        REQUIRE_OK(gp_pipeline_step(p, &b.x, &b.y_t, &r->loss[s]));
    }
    REQUIRE_OK(gp_pipeline_params_fnv1a64(p, &r->hash)); /* with shards: the whole tensors' */
    if (keep) { /* the caller compares the values, then frees model and device */
        gp_pipeline_free(p); /* on the caller's device: the parameters stay */
        *keep = m;
        return 0;
    }
    gp_pipeline_free(p);
    gp_model_free(m);
    if (dev) gp_device_free(dev);
    return 0;
}

/* Largest per-tensor relative L2 error of the trainable parameters of a against b, over the
 * layers a holds (a rank holds its own stage's). */
static double max_rel_error(gp_model *a, gp_model *b) {
    double worst = 0;
    for (int i = 0; i < gp_model_nparam_tensors(a); i++) {
        gp_param_info pa, pb;
        REQUIRE_OK(gp_model_param(a, i, &pa));
        REQUIRE_OK(gp_model_param(b, i, &pb));
        if (!pa.trainable || !pa.value->data) continue; /* batch-norm statistics: per replica */
        double num = 0, den = 0;
        for (int64_t j = 0; j < gp_tensor_nelem(pa.value); j++) {
            double d = (double)F32(*pa.value)[j] - (double)F32(*pb.value)[j];
            num += d * d;
            den += (double)F32(*pb.value)[j] * F32(*pb.value)[j];
        }
        double rel = den > 0 ? sqrt(num / den) : sqrt(num);
        if (rel > worst) worst = rel;
        if (rel > 1e-6) fprintf(stderr, "  layer %d %s: relative error %.3g\n", pa.layer, pa.name, rel);
    }
    return worst;
}

/* A fresh whole model holding the values of checkpoint set `index`, on its own device. */
static gp_model *whole_from(gp_test_net net, const char *index, int nparts) {
    gp_model *m = gp_test_net_build(net);
    gp_device *dev;
    REQUIRE_OK(gp_device_cpu_new("whole", &dev));
    REQUIRE_OK(gp_model_init(m, dev, 1));
    gp_checkpoint *c;
    REQUIRE_OK(gp_checkpoint_open(index, &c));
    CHECK_EQ_INT(gp_checkpoint_nparts(c), nparts);
    REQUIRE_OK(gp_checkpoint_load_layers(c, m, 0, gp_model_nlayers(m), NULL));
    gp_checkpoint_close(c);
    return m;
}

static void free_with_device(gp_model *m) {
    gp_param_info pi;
    REQUIRE_OK(gp_model_param(m, 0, &pi));
    gp_device *dev = pi.value->dev;
    gp_model_free(m);
    gp_device_free(dev);
}

/* One case in an MPI child: D x K x T ranks train STEPS steps; rank 0 checks. */
static int child(const char *name, gp_test_net net, int D, int K, int M, int T,
                 gp_schedule_kind sk) {
    gp_model *m = gp_test_net_build(net);
    gp_optim_opts o = optim(net, D > 1 || T > 1 ? 2 : 1);
    gp_pipeline_opts po = {.stages = K, .micro_batches = M, .schedule = sk,
                           .launcher = GP_LAUNCHER_MPI, .data_parallel = D, .comm_timeout_s = 60,
                           .tensor_parallel = T};
    gp_pipeline *p = NULL;
    REQUIRE_OK(gp_pipeline_new(m, &o, &po, SEED, &p));
    int rank, nranks, stage, replica;
    gp_pipeline_place(p, &rank, &nranks, &stage, &replica);
    CHECK_EQ_INT(nranks, D * K * T);
    CHECK_EQ_INT(stage, rank / T % K);
    CHECK_EQ_INT(replica, rank / (K * T));
    CHECK_EQ_INT(gp_pipeline_shard(p), T > 1 ? rank % T : 0);
    outcome got;
    for (int s = 0; s < STEPS; s++) {
        gp_test_batch b;
        gp_test_net_batch(net, GP_TEST_NET_MAX_BATCH, 1000 + (uint64_t)s, &b);
        REQUIRE_OK(gp_pipeline_step(p, &b.x, &b.y_t, &got.loss[s]));
    }
    uint64_t p2p[16], ar[16], tb[16];
    REQUIRE_OK(gp_pipeline_bytes_sent(p, p2p, ar, 16));
    REQUIRE_OK(gp_pipeline_bytes_tensor(p, tb, 16));
    REQUIRE_OK(gp_pipeline_params_fnv1a64(p, &got.hash)); /* through every rank's stage */
    char index[512] = "";
    const int C = gp_pipeline_cells(p); /* K, or 2K with two cells per stage */
    if (T > 1 || C > K) {
        /* A set of whole tensors from the shards (or a part per cell), in a folder every rank
         * shares. */
        char base[512];
        snprintf(base, sizeof base, "%s/tp-%s", getenv("GP_TEST_MPI_DIR"), name);
        REQUIRE_OK(gp_pipeline_checkpoint_save(p, base, STEPS, NULL, 0, index, sizeof index));
    }
    if (C > K && rank == 0) {
        gp_model *whole = whole_from(net, index, C);
        CHECK(gp_test_hash(whole) == got.hash);
        free_with_device(whole);
    }
    /* A rank holds its own stage's cells and nothing more (with shards: its own part, in
     * them). Interleaved: cells k and k + K; zbv: k and 2K - 1 - k. */
    for (int li = 0; li < gp_model_nlayers(m) && T == 1; li++) {
        bool mine = false;
        for (int c = 0; c < C; c++) {
            const int on = c < K ? c : sk == GP_SCHEDULE_ZBV ? 2 * K - 1 - c : c - K;
            const int first = gp_pipeline_cell_first(p, c);
            const int last = c + 1 < C ? gp_pipeline_cell_first(p, c + 1) : gp_model_nlayers(m);
            mine = mine || (on == stage && li >= first && li < last);
        }
        gp_param_info pi;
        for (int i = 0; i < gp_model_nparam_tensors(m); i++)
            if (gp_model_param(m, i, &pi) == GP_OK && pi.layer == li)
                CHECK((pi.value->data != NULL) == mine);
    }
    if (T > 1 && rank == 0) {
        /* Against the single-device run (D x M micro-batches), through the saved set. */
        outcome want;
        gp_model *ref = NULL;
        reference(net, true, 0, D * M, 1, sk, &want, &ref);
        gp_model *whole = whole_from(net, index, C);
        double err = max_rel_error(whole, ref), lerr = 0;
        for (int s = 0; s < STEPS; s++)
            lerr = fmax(lerr, fabs((double)got.loss[s] - want.loss[s]) / fabs((double)want.loss[s]));
        printf("%s: D=%d K=%d T=%d M=%d vs one device M=%d: max relative error params %.3g, "
               "loss %.3g (limit 1e-5); tensor-axis bytes of rank 0 %llu\n",
               name, D, K, T, M, D * M, err, lerr, (unsigned long long)tb[0]);
        CHECK(err <= 1e-5);
        CHECK(lerr <= 1e-5);
        CHECK(err > 0); /* the row-split sums reorder: not bitwise */
        for (int r = 0; r < nranks; r++) CHECK(tb[r] > 0);
        free_with_device(whole);
        free_with_device(ref);
    }
    if (D > 1 && T == 1) {
        /* Each rank against the single-device run, on the layers it holds. The replicas' sums
         * add the micro-batches' gradients in another order, so float rounding, grown over the
         * steps, is all that may differ: 2-4e-7 on most tensors, 1.03e-6 on the ConvNet's second
         * batch-norm bias on an AVX-512 machine (a small vector, so its relative error is the
         * largest). The limit is the tensor-parallel check's above; a wrong gradient is off by
         * orders of magnitude more. */
        outcome want;
        gp_model *ref = NULL;
        reference(net, true, 0, D * M, 1, sk, &want, &ref);
        double err = max_rel_error(m, ref), lerr = 0;
        for (int s = 0; s < STEPS; s++) {
            double e = fabs((double)got.loss[s] - want.loss[s]) / fabs((double)want.loss[s]);
            if (e > lerr) lerr = e;
        }
        printf("%s: rank %d: D=%d K=%d M=%d vs one device M=%d: max relative error params %.3g, "
               "loss %.3g (limit 1e-5)\n",
               name, rank, D, K, M, D * M, err, lerr);
        CHECK(err <= 1e-5);
        CHECK(lerr <= 1e-5);
        gp_param_info pi;
        REQUIRE_OK(gp_model_param(ref, 0, &pi));
        gp_device *dev = pi.value->dev;
        gp_model_free(ref);
        gp_device_free(dev);
    }
    if (T == 1 && C == K && C <= 8 && net != GP_TEST_TRANSFORMER_TIED) {
        /* The planner counts the gradients with the buffers of their sum over the replicas,
         * as each rank's device counts them, to the byte: with D = 2 the replicas sum pairwise
         * and each gradient bucket keeps a host buffer of the partner's partial sum (counted as
         * gradients on the stage's device), the buckets covering the stage's gradients once, so
         * twice the gradients of the same cells' D = 1 plan. */
        int first[8];
        for (int c = 0; c < C; c++) first[c] = gp_pipeline_cell_first(p, c);
        gp_pipeline_opts pp = po, one = po;
        pp.partition = one.partition = first;
        one.data_parallel = 1;
        gp_plan plan, plain;
        REQUIRE_OK(gp_plan_make(m, GP_TEST_NET_MAX_BATCH, &o, &pp, 1.0, &plan));
        REQUIRE_OK(gp_plan_make(m, GP_TEST_NET_MAX_BATCH, &o, &one, 1.0, &plain));
        gp_mem_stats ms;
        REQUIRE_OK(gp_pipeline_mem_stats(p, stage, &ms));
        const uint64_t base = plain.cells[stage].grad_bytes;
        printf("%s: rank %d: stage %d's gradients peaked at %llu bytes, the plan counts %llu "
               "(%llu at D = 1)\n",
               name, rank, stage, (unsigned long long)ms.peak[GP_MEM_GRADS],
               (unsigned long long)plan.cells[stage].grad_bytes, (unsigned long long)base);
        CHECK_EQ_INT(ms.peak[GP_MEM_GRADS], plan.cells[stage].grad_bytes);
        CHECK_EQ_INT(plan.cells[stage].grad_bytes, (D == 2 ? 2 : 1) * base);
        CHECK(D != 2 || base > 0);
        gp_plan_free(&plan);
        gp_plan_free(&plain);
    }
    if (rank == 0) {
        /* Bytes: every stage but the last sends M activations, every stage but the first M
         * gradients (each with a header); with D > 1 each stage gives its gradients to the
         * all-reduce once. */
        for (int r = 0; r < nranks; r++) {
            CHECK((r % K < K - 1 || r % K > 0) ? p2p[r] > 0 : p2p[r] == 0);
            CHECK(D > 1 ? ar[r] > 0 : ar[r] == 0);
        }
        if (T == 1 && C == K && C <= 8 && net != GP_TEST_TRANSFORMER_TIED) {
            /* The planner counts what the transport sends on the pipeline axis, each payload
             * with its header, to the byte: the plan of the same cells at the same batch. (Tied
             * parameters' gradients also travel point to point; the plan leaves them out.) */
            int first[8];
            for (int c = 0; c < C; c++) first[c] = gp_pipeline_cell_first(p, c);
            gp_pipeline_opts pp = po;
            pp.partition = first;
            gp_plan plan;
            REQUIRE_OK(gp_plan_make(m, GP_TEST_NET_MAX_BATCH, &o, &pp, 1.0, &plan));
            for (int r = 0; r < nranks; r++)
                CHECK(p2p[r] == plan.cells[r % K].pipe_bytes);
            printf("%s: rank 0 sent %llu bytes point to point in the last step, the plan counts "
                   "%llu\n",
                   name, (unsigned long long)p2p[0], (unsigned long long)plan.cells[0].pipe_bytes);
            gp_plan_free(&plan);
        }
        outcome want;
        if (D == 1) {
            reference(net, T > 1, K, M, T, sk, &want, NULL);
            bool same = memcmp(got.loss, want.loss, sizeof want.loss) == 0 && got.hash == want.hash;
            if (!same) gp_test_failures++;
            printf("%s: D=1 K=%d T=%d M=%d over MPI vs threads: loss %.9g/%.9g, params %016llx "
                   "vs %016llx: %s\n",
                   name, K, T, M, got.loss[STEPS - 1], want.loss[STEPS - 1],
                   (unsigned long long)got.hash, (unsigned long long)want.hash,
                   same ? "bit-identical" : "DIFFERENT");
        }
    }
    gp_pipeline_free(p);
    gp_model_free(m);
    int failed = gp_test_failures;
    gp_mpi_finalize();
    return failed ? 1 : 0;
}

/* The tree sum (GP_GRAD_SUM_TREE) over D replicas x K stages, D M = 8 micro-batches of one
 * example, AdamW: rank 0 compares with the threads pipeline, K = 2 and M = 8, same sum. The
 * parameters are the same bits for D = 1, 2 and 4; the loss is each replica's added in replica
 * order in double, so only its float rounding may differ (1e-6 relative). With the sequential
 * sum D = 2 and 4 give other bits (the replicas' partial sums are a different association). */
/* The Transformer trained STEPS steps by a pipeline made with po (AdamW); *rank: the process's
 * world rank (0 on threads). */
static void train_transformer(const gp_pipeline_opts *po, outcome *r, int *rank) {
    const gp_test_net net = GP_TEST_TRANSFORMER;
    gp_model *m = gp_test_net_build(net);
    gp_optim_opts o = gp_test_net_optim(net);
    gp_pipeline *p = NULL;
    REQUIRE_OK(gp_pipeline_new(m, &o, po, SEED, &p));
    for (int s = 0; s < STEPS; s++) {
        gp_test_batch b;
        gp_test_net_batch(net, GP_TEST_NET_MAX_BATCH, 1000 + (uint64_t)s, &b);
        REQUIRE_OK(gp_pipeline_step(p, &b.x, &b.y_t, &r->loss[s]));
    }
    REQUIRE_OK(gp_pipeline_params_fnv1a64(p, &r->hash));
    int nranks, stage, replica;
    gp_pipeline_place(p, rank, &nranks, &stage, &replica);
    if (po->launcher == GP_LAUNCHER_MPI) {
        /* The planner counts each stage's gradients with the buffers of their sums, to the byte
         * of what its device counts: the tree's partial sums over the micro-batches and, where
         * the replicas sum pairwise (D = 2, or the tree with D a power of two), each bucket's
         * buffer of the partner's sum; MPI_Iallreduce (the sequential sum's D = 4) none. */
        int first[8];
        for (int c = 0; c < gp_pipeline_cells(p) && c < 8; c++)
            first[c] = gp_pipeline_cell_first(p, c);
        gp_pipeline_opts pp = *po;
        pp.partition = first;
        gp_plan plan;
        REQUIRE_OK(gp_plan_make(m, GP_TEST_NET_MAX_BATCH, &o, &pp, 1.0, &plan));
        gp_mem_stats ms;
        REQUIRE_OK(gp_pipeline_mem_stats(p, stage, &ms));
        printf("%s sum, D = %d: rank %d: stage %d's gradients peaked at %llu bytes, the plan "
               "counts %llu\n", gp_grad_sum_name(po->grad_sum), po->data_parallel, *rank, stage,
               (unsigned long long)ms.peak[GP_MEM_GRADS],
               (unsigned long long)plan.cells[stage].grad_bytes);
        CHECK_EQ_INT(ms.peak[GP_MEM_GRADS], plan.cells[stage].grad_bytes);
        gp_plan_free(&plan);
    }
    gp_pipeline_free(p);
    gp_model_free(m);
}

static int child_tree(const char *name, int D, int K, int M, gp_grad_sum gs) {
    gp_pipeline_opts po = {.stages = K, .micro_batches = M, .schedule = GP_SCHEDULE_ZBH1,
                           .launcher = GP_LAUNCHER_MPI, .data_parallel = D,
                           .comm_timeout_s = 60, .grad_sum = gs};
    outcome got;
    int rank = 0, r0;
    train_transformer(&po, &got, &rank);
    if (rank == 0) {
        gp_pipeline_opts ro = {.stages = 2, .micro_batches = D * M,
                               .schedule = GP_SCHEDULE_GPIPE, .grad_sum = gs};
        outcome want;
        train_transformer(&ro, &want, &r0);
        double lerr = 0;
        for (int s = 0; s < STEPS; s++)
            lerr = fmax(lerr, fabs((double)got.loss[s] - want.loss[s]) / fabs((double)want.loss[s]));
        printf("%s: %s sum, D=%d K=%d M=%d over MPI vs threads K=2 M=%d: params %016llx "
               "vs %016llx: %s; loss %.9g vs %.9g (relative %.3g, limit 1e-6)\n",
               name, gp_grad_sum_name(gs), D, K, M, D * M, (unsigned long long)got.hash,
               (unsigned long long)want.hash, got.hash == want.hash ? "bit-identical" : "DIFFERENT",
               got.loss[STEPS - 1], want.loss[STEPS - 1], lerr);
        CHECK(lerr <= 1e-6);
        if (gs == GP_GRAD_SUM_TREE || D == 1)
            CHECK(got.hash == want.hash);
        else
            CHECK(got.hash != want.hash); /* what the tree is for */
    }
    int failed = gp_test_failures;
    gp_mpi_finalize();
    return failed ? 1 : 0;
}

/* The MPI transport alone, on 2 ranks: a message arrives bit-exact with its header checked; a
 * message whose shape is not the one expected is an error naming both ranks, and the rank
 * still waiting on the other learns who failed and why. A failed run ends with MPI_Abort (a
 * peer could be dead), so each rank prints its verdict after a barrier on a fresh grid, and
 * the parent reads them. */
static int child_header(void) {
    gp_grid *g = NULL;
    REQUIRE_OK(gp_grid_new(1, 2, 1, 20, &g));
    gp_transport *tr = gp_grid_pipe(g);
    int k = gp_grid_stage(g);
    gp_device *dev;
    REQUIRE_OK(gp_device_cpu_new("header", &dev));
    gp_tensor t = {0}, u = {0};
    float want[6];
    gp_test_fill(want, 6, 9, 1, 0.1f, 2.0f);
    if (k == 0) {
        REQUIRE_OK(gp_tensor_alloc(dev, GP_MEM_ACTIVATIONS, gp_shape2(2, 3), GP_F32, &t));
        memcpy(t.data, want, sizeof want);
        CHECK_OK(gp_transport_send(tr, 0, 1, (gp_msg_tag){GP_MSG_ACT, 0, 0}, &t));
        REQUIRE_OK(gp_tensor_alloc(dev, GP_MEM_ACTIVATIONS, gp_shape2(2, 3), GP_F32, &u));
        CHECK_OK(gp_transport_send(tr, 0, 1, (gp_msg_tag){GP_MSG_ACT, 1, 0}, &u));
        CHECK_FAILS(gp_transport_barrier(tr, 0), GP_IO,
                    "rank 0 (stage 0): stopped waiting in the all-reduce of 0 values over 2 stages, "
                    "with rank 1 (stage 1): "
                    "the run was aborted by rank 1 (GP_SHAPE: rank 1 (stage 1): receiving from "
                    "rank 0 (stage 0): expected ACT(mb 1) float32 (2, 4)");
    } else {
        REQUIRE_OK(gp_tensor_alloc(dev, GP_MEM_ACTIVATIONS, gp_shape2(2, 3), GP_F32, &t));
        CHECK_OK(gp_transport_recv(tr, 1, 0, (gp_msg_tag){GP_MSG_ACT, 0, 0}, &t));
        CHECK(memcmp(t.data, want, sizeof want) == 0);
        REQUIRE_OK(gp_tensor_alloc(dev, GP_MEM_ACTIVATIONS, gp_shape2(2, 4), GP_F32, &u));
        CHECK_FAILS(gp_transport_recv(tr, 1, 0, (gp_msg_tag){GP_MSG_ACT, 1, 0}, &u), GP_SHAPE,
                    "rank 1 (stage 1): receiving from rank 0 (stage 0): expected ACT(mb 1) float32 "
                    "(2, 4), but rank 0 (stage 0) sent ACT(mb 1) float32 (2, 3)");
        gp_tensor_release(&t);
        gp_tensor_release(&u);
    }
    /* Where each rank got to, so that a hang says where. */
    printf("header rank %d: the failed grid's checks are done\n", k);
    fflush(stdout);
    gp_grid_free(g); /* releases rank 0's messages (sent, so owned by the transport) */
    gp_mem_stats ms;
    gp_device_mem_stats(dev, &ms);
    CHECK_EQ_INT(ms.live_total, 0);
    gp_device_free(dev);
    /* A fresh grid has a clean failure state: everyone reports, then the run ends. */
    REQUIRE_OK(gp_grid_new(1, 2, 1, 20, &g));
    printf("header rank %d: a fresh grid is made\n", k);
    fflush(stdout);
    CHECK_OK(gp_transport_barrier(gp_grid_world(g), k));
    printf("header rank %d: %s\n", k, gp_test_failures ? "FAILED" : "checks passed");
    fflush(stdout);
    CHECK_OK(gp_transport_barrier(gp_grid_world(g), k));
    gp_grid_free(g);
    gp_cli_mpi_abort(0);
    return 1; /* not reached: MPI_Abort ends every rank */
}

/* A peer stuck outside MPI mid-message: rank 0 starts sending 64 MiB (more than Open MPI sends
 * unasked, so the rest waits for rank 0 to call MPI again), then sleeps. Rank 1's receive must
 * time out within --comm-timeout and the cancel's grace, not wait for rank 0: Open MPI cannot
 * cancel a receive already under way. Run over TCP (the parent sets the BTL), where the transfer
 * needs the sender; rank 1 reports, then ends the run. */
static int child_stuck(void) {
    gp_grid *g = NULL;
    REQUIRE_OK(gp_grid_new(1, 2, 1, 2.0, &g));
    gp_transport *tr = gp_grid_pipe(g);
    const int k = gp_grid_stage(g);
    gp_device *dev;
    REQUIRE_OK(gp_device_cpu_new("stuck", &dev));
    gp_tensor t = {0};
    REQUIRE_OK(gp_tensor_alloc(dev, GP_MEM_ACTIVATIONS, gp_shape1(16 << 20), GP_F32, &t));
    const gp_msg_tag tag = {GP_MSG_ACT, 0, 0};
    if (k == 0) {
        CHECK_OK(gp_transport_send(tr, 0, 1, tag, &t));
        sleep(60); /* ended by rank 1's MPI_Abort long before */
        return 1;
    }
    const double t0 = gp_cli_now();
    CHECK_FAILS(gp_transport_recv(tr, 1, 0, tag, &t), GP_IO, "timed out after 2 s");
    const double took = gp_cli_now() - t0;
    CHECK(took < 20);
    printf("stuck rank 1: the receive gave up after %.1f s: %s\n", took,
           gp_test_failures ? "FAILED" : "checks passed");
    fflush(stdout);
    gp_cli_mpi_abort(0);
    return 1; /* not reached */
}

/* A launch of the wrong size: every rank gets the error, before anything is allocated. */
static int child_mismatch(void) {
    gp_model *m = gp_test_net_build(GP_TEST_TRANSFORMER);
    gp_optim_opts o = gp_test_net_optim(GP_TEST_TRANSFORMER);
    gp_pipeline_opts po = {.stages = 2, .micro_batches = 2, .launcher = GP_LAUNCHER_MPI,
                           .data_parallel = 2};
    gp_pipeline *p = NULL;
    CHECK_FAILS(gp_pipeline_new(m, &o, &po, SEED, &p), GP_INVALID_ARGUMENT,
                "launched with 3 MPI ranks, but --data-parallel 2 x --stages 2 needs D x K = 4");
    CHECK(p == NULL);
    for (int i = 0; i < gp_model_nparam_tensors(m); i++) {
        gp_param_info pi;
        CHECK_OK(gp_model_param(m, i, &pi));
        CHECK(pi.value->data == NULL);
    }
    gp_model_free(m);
    int failed = gp_test_failures;
    gp_mpi_finalize();
    return failed ? 1 : 0;
}

/* Runs one case under mpirun, its output echoed, and returns its exit status (124: timed
 * out). `passed`, when given, counts the ranks that printed "header rank R: checks passed"
 * (the header case, which ends with MPI_Abort: only its Open MPI noise is left out). A CI run
 * once saw the header case print nothing until its timeout, without a trace of where it hung:
 * now every rank says when it got through MPI_Init. A launch that timed out before that
 * (Open MPI's start-up, not gpipe) is said so and tried once more; a hang after it fails. */
static int run_case(const char *self, const char *name, int np, int *passed) {
    for (int attempt = 1;; attempt++) {
        char cmd[8192], line[1024];
        snprintf(cmd, sizeof cmd,
                 "timeout -k 10 %d mpirun --oversubscribe --bind-to none -np %d %s --child %s 2>&1",
                 CASE_TIMEOUT_S, np, self, name);
        double t0 = gp_cli_now();
        FILE *f = popen(cmd, "r");
        if (!f) {
            printf("case %s: cannot start mpirun\n", name);
            return -1;
        }
        int launched = 0;
        if (passed) *passed = 0;
        while (fgets(line, sizeof line, f)) {
            if (strstr(line, ": rank ") && strstr(line, " launched")) launched++;
            bool header_line = strstr(line, "header rank") || strstr(line, "stuck rank") ||
                               strstr(line, "CHECK") || strstr(line, "FAILED");
            if (passed && header_line && strstr(line, "checks passed")) (*passed)++;
            if (!passed || header_line) fputs(line, stdout);
        }
        int st = pclose(f);
        int rc = st == -1 ? -1 : WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
        printf("case %s (%d ranks): exit %d in %.1fs, %d of %d ranks launched\n", name, np, rc,
               gp_cli_now() - t0, launched, np);
        fflush(stdout);
        bool timed_out = rc == 124 || rc == 137;
        if (!timed_out || launched == np || attempt == 2) return rc;
        printf("case %s: mpirun timed out before every rank got through MPI_Init (Open MPI's "
               "launch, not gpipe): trying once more\n", name);
    }
}

static int run_child(const char *c) {
    /* Every rank says it got through MPI's start-up: a launch that never got there is Open
     * MPI's hang, not gpipe's (see run_case). */
    int r = 0;
    if (gp_mpi_init(&r, NULL) == GP_OK) {
        printf("%s: rank %d launched\n", c, r);
        fflush(stdout);
    }
    if (!strcmp(c, "transformer-d1")) return child(c, GP_TEST_TRANSFORMER, 1, 2, 4, 1, GP_SCHEDULE_1F1B);
    if (!strcmp(c, "convnet-d1")) return child(c, GP_TEST_CONVNET, 1, 2, 4, 1, GP_SCHEDULE_GPIPE);
    if (!strcmp(c, "transformer-d2")) return child(c, GP_TEST_TRANSFORMER, 2, 2, 2, 1, GP_SCHEDULE_GPIPE);
    if (!strcmp(c, "convnet-d2")) return child(c, GP_TEST_CONVNET, 2, 2, 2, 1, GP_SCHEDULE_ZBH1);
    if (!strcmp(c, "transformer-k2t2")) return child(c, GP_TEST_TRANSFORMER, 1, 2, 4, 2, GP_SCHEDULE_1F1B);
    if (!strcmp(c, "transformer-interleaved")) return child(c, GP_TEST_TRANSFORMER, 1, 2, 4, 1, GP_SCHEDULE_INTERLEAVED);
    if (!strcmp(c, "convnet-zbv")) return child(c, GP_TEST_CONVNET, 1, 2, 4, 1, GP_SCHEDULE_ZBV);
    if (!strcmp(c, "transformer-d2-zbv")) return child(c, GP_TEST_TRANSFORMER, 2, 2, 2, 1, GP_SCHEDULE_ZBV);
    if (!strcmp(c, "transformer-d2k2t2")) return child(c, GP_TEST_TRANSFORMER, 2, 2, 2, 2, GP_SCHEDULE_GPIPE);
    if (!strcmp(c, "transformer-k2t2-zbv")) return child(c, GP_TEST_TRANSFORMER, 1, 2, 4, 2, GP_SCHEDULE_ZBV);
    if (!strcmp(c, "tree-d1")) return child_tree(c, 1, 2, 8, GP_GRAD_SUM_TREE);
    if (!strcmp(c, "tree-d2")) return child_tree(c, 2, 2, 4, GP_GRAD_SUM_TREE);
    if (!strcmp(c, "tree-d4")) return child_tree(c, 4, 1, 2, GP_GRAD_SUM_TREE);
    if (!strcmp(c, "sequential-d2")) return child_tree(c, 2, 2, 4, GP_GRAD_SUM_SEQUENTIAL);
    if (!strcmp(c, "sequential-d4")) return child_tree(c, 4, 1, 2, GP_GRAD_SUM_SEQUENTIAL);
    if (!strcmp(c, "tied-d1")) return child(c, GP_TEST_TRANSFORMER_TIED, 1, 3, 4, 1, GP_SCHEDULE_1F1B);
    if (!strcmp(c, "tied-k2t2")) return child(c, GP_TEST_TRANSFORMER_TIED, 1, 2, 4, 2, GP_SCHEDULE_GPIPE);
    if (!strcmp(c, "tied-interleaved")) return child(c, GP_TEST_TRANSFORMER_TIED, 1, 2, 4, 1, GP_SCHEDULE_INTERLEAVED);
    if (!strcmp(c, "tied-d2")) return child(c, GP_TEST_TRANSFORMER_TIED, 2, 2, 2, 1, GP_SCHEDULE_ZBH1);
    if (!strcmp(c, "mismatch")) return child_mismatch();
    if (!strcmp(c, "header")) return child_header();
    if (!strcmp(c, "stuck")) return child_stuck();
    fprintf(stderr, "unknown case %s\n", c);
    return 2;
}

int main(int argc, char **argv) {
    if (argc == 3 && !strcmp(argv[1], "--child")) return run_child(argv[2]);
    if (!gp_mpi_built()) {
        printf("SKIP: MPI support was not built (no MPI library found at configure time, or "
               "-DGP_MPI=OFF)\n");
        return SKIP;
    }
    if (system("command -v mpirun >/dev/null 2>&1") != 0) {
        printf("SKIP: MPI support is built but mpirun is not on PATH (install openmpi-bin)\n");
        return SKIP;
    }
    char self[4096];
    ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
    if (n <= 0) {
        fprintf(stderr, "cannot find this program's path\n");
        return 1;
    }
    self[n] = '\0';
    /* Open MPI refuses root unless told; tests in containers run as root. */
    setenv("OMPI_ALLOW_RUN_AS_ROOT", "1", 1);
    setenv("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1", 1);
    /* The tensor-parallel cases save a set of whole tensors here (the ranks share the folder). */
    gp_scratch_init("test_pipeline_mpi");
    setenv("GP_TEST_MPI_DIR", gp_scratch_dir(), 1);
    static const struct {
        const char *name;
        int parts;
    } saving[] = {{"transformer-k2t2", 2}, {"transformer-d2k2t2", 2},
                  {"transformer-interleaved", 4}, {"convnet-zbv", 4},
                  {"transformer-d2-zbv", 4}, {"transformer-k2t2-zbv", 4},
                  {"tied-k2t2", 2},          {"tied-interleaved", 4}};
    for (size_t i = 0; i < sizeof saving / sizeof *saving; i++) {
        char f[256];
        snprintf(f, sizeof f, "tp-%s.safetensors.index.json", saving[i].name);
        gp_scratch_remember(gp_scratch_path(f));
        for (int k = 1; k <= saving[i].parts; k++) {
            snprintf(f, sizeof f, "tp-%s-%05d-of-%05d.safetensors", saving[i].name, k,
                     saving[i].parts);
            gp_scratch_remember(gp_scratch_path(f));
        }
    }
    static const struct {
        const char *name;
        int np;
    } cases[] = {{"transformer-d1", 2}, {"convnet-d1", 2},        {"transformer-d2", 4},
                 {"convnet-d2", 4},     {"transformer-k2t2", 4}, {"transformer-d2k2t2", 8},
                 {"transformer-interleaved", 2}, {"convnet-zbv", 2}, {"transformer-d2-zbv", 4},
                 {"transformer-k2t2-zbv", 4}, {"tied-d1", 3}, {"tied-k2t2", 4},
                 {"tied-interleaved", 2}, {"tied-d2", 4}, {"tree-d1", 2}, {"tree-d2", 4},
                 {"tree-d4", 4}, {"sequential-d2", 4}, {"sequential-d4", 4}, {"mismatch", 3}};
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++)
        if (run_case(self, cases[i].name, cases[i].np, NULL) != 0) gp_test_failures++;
    /* The header case ends with MPI_Abort: its verdicts come from its output. */
    int passed = 0;
    run_case(self, "header", 2, &passed);
    printf("case header (2 ranks): %d of 2 ranks passed\n", passed);
    CHECK_EQ_INT(passed, 2);
    /* The stuck peer, over TCP; its one verdict (rank 1's) is also read from the output. */
    setenv("OMPI_MCA_btl", "tcp,self", 1);
    run_case(self, "stuck", 2, &passed);
    unsetenv("OMPI_MCA_btl");
    printf("case stuck (2 ranks): %d of 1 rank passed\n", passed);
    CHECK_EQ_INT(passed, 1);
    gp_scratch_cleanup();
    return gp_test_finish("test_pipeline_mpi");
}
