/* The GPU ranks' communication without a GPU: the choice of NCCL or MPI with host staging (which
 * path, which error, for each combination of device kind, NCCL in the build and GPUs shared by
 * ranks), the detection of ranks that share a GPU, the pairwise order of the data-parallel
 * gradient sum that the MPI grid and the NCCL path both run (every replica ends with the bits of
 * the replicas' balanced binary tree, not the sequential sum's), and whether the CUDA module
 * hands over NCCL's calls in a build with GP_NCCL (GP_TEST_NCCL). Then, under mpirun on 2 ranks,
 * the MPI path's host staging: a stage message and a data-parallel gradient bucket held by a
 * device whose memory the host cannot address (its pointers are not host addresses, as a GPU's)
 * arrive bit-exact, the bucket's host copy and partner sum counted as gradients on that device.
 * Then gpipe's side of NCCL under mpirun over a stand-in for the module's NCCL
 * calls (tests/nccl_fake.c, MPI underneath, ring-order all-reduce): the test Transformer trained
 * with D x K = 2 x 2 (sequential sum) and 4 x 1 (tree) gives the same bits over NCCL as over MPI
 * with host staging, with NCCL's sends, receives and pairwise exchanges made, and so does the
 * tied Transformer (its tie's gradients staged beside NCCL's messages) and the interleaved
 * schedule (two cells per stage: their messages staged, the replicas' sum NCCL's); with the ranks
 * sharing a GPU auto falls back to MPI saying why and nccl is refused. NCCL's failures, over the
 * stand-in: a send that fails, a send that never arrives, an asynchronous error and a split
 * that fails during communicator setup each end every
 * rank within the comm timeout (and a replica that never joins the gradient exchange ends the
 * survivor's host wait on its stream, behind the queued exchange, there too), naming the failure, with the communicators aborted, not destroyed
 * (a destroy waits for the unmatched operation), and a failed send's header never sent (its
 * receiver would wait for a payload that never comes); a payload hook the two ends apply to
 * different messages is named by the header's hook sequence number; over NCCL a trim between
 * steps gives the cache back at the next step's end, not at once. NCCL itself needs a GPU
 * per rank: with 2 GPUs and a GP_NCCL build, D = 2 and K = 2 on them give the same bits over NCCL
 * as over MPI with host staging (with one GPU, two ranks share it and train over host staging,
 * saying why); elsewhere that part is skipped and said, as are the MPI parts without MPI or
 * mpirun. */
#include <dlfcn.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "comm/gpu_comm.h"
#include "comm/mpi_grid.h"
#include "core/clock.h"
#include "core/device.h"
#include "kernels/cuda_module.h"
#include "kernels/kernels.h"
#include "testutil.h"

/* ----------------------------------------------------------------- choice */

static void test_choose(void) {
    char why[320];
    gp_gpu_comm use;
    const gp_gpu_comm_facts cpu = {.cuda = false, .shared_a = -1, .shared_b = -1};
    const gp_gpu_comm_facts gpus = {.cuda = true, .shared_a = -1, .shared_b = -1};
    const gp_gpu_comm_facts unbuilt = {.cuda = true,
                                       .nccl_missing = "gpipe was built without NCCL (x)",
                                       .shared_a = -1,
                                       .shared_b = -1};
    const gp_gpu_comm_facts shared = {
        .cuda = true, .shared_a = 0, .shared_b = 2, .shared_gpu = "GPU-0a1b"};

    /* CPU ranks: MPI, with nothing to say; NCCL asked is an error naming --device cuda */
    CHECK_OK(gp_gpu_comm_choose(GP_GPU_COMM_AUTO, &cpu, &use, why, sizeof why));
    CHECK_EQ_INT(use, GP_GPU_COMM_MPI);
    CHECK(why[0] == '\0');
    CHECK_OK(gp_gpu_comm_choose(GP_GPU_COMM_MPI, &cpu, &use, why, sizeof why));
    CHECK_EQ_INT(use, GP_GPU_COMM_MPI);
    CHECK_FAILS(gp_gpu_comm_choose(GP_GPU_COMM_NCCL, &cpu, &use, why, sizeof why),
                GP_INVALID_ARGUMENT, "give --device cuda");
    /* GPUs, each its own, NCCL built: auto and nccl take NCCL; mpi is taken as asked */
    CHECK_OK(gp_gpu_comm_choose(GP_GPU_COMM_AUTO, &gpus, &use, why, sizeof why));
    CHECK_EQ_INT(use, GP_GPU_COMM_NCCL);
    CHECK(why[0] == '\0');
    CHECK_OK(gp_gpu_comm_choose(GP_GPU_COMM_NCCL, &gpus, &use, why, sizeof why));
    CHECK_EQ_INT(use, GP_GPU_COMM_NCCL);
    CHECK_OK(gp_gpu_comm_choose(GP_GPU_COMM_MPI, &gpus, &use, why, sizeof why));
    CHECK_EQ_INT(use, GP_GPU_COMM_MPI);
    CHECK(strstr(why, "--gpu-comm mpi") != NULL);
    /* no NCCL in the build: auto falls back saying why; nccl asked is GP_UNSUPPORTED */
    CHECK_OK(gp_gpu_comm_choose(GP_GPU_COMM_AUTO, &unbuilt, &use, why, sizeof why));
    CHECK_EQ_INT(use, GP_GPU_COMM_MPI);
    CHECK(strcmp(why, "gpipe was built without NCCL (x)") == 0);
    CHECK_FAILS(gp_gpu_comm_choose(GP_GPU_COMM_NCCL, &unbuilt, &use, why, sizeof why),
                GP_UNSUPPORTED, "--gpu-comm nccl: gpipe was built without NCCL (x)");
    /* ranks sharing a GPU: auto falls back naming them; nccl asked is an error */
    CHECK_OK(gp_gpu_comm_choose(GP_GPU_COMM_AUTO, &shared, &use, why, sizeof why));
    CHECK_EQ_INT(use, GP_GPU_COMM_MPI);
    CHECK(strstr(why, "ranks 0 and 2 share GPU GPU-0a1b, and one GPU cannot host two NCCL ranks") !=
          NULL);
    CHECK_FAILS(gp_gpu_comm_choose(GP_GPU_COMM_NCCL, &shared, &use, why, sizeof why),
                GP_INVALID_ARGUMENT, "--gpu-comm nccl: ranks 0 and 2 share GPU GPU-0a1b");
    /* a value out of the enum */
    CHECK_FAILS(gp_gpu_comm_choose((gp_gpu_comm)7, &gpus, &use, why, sizeof why),
                GP_INVALID_ARGUMENT, "gpu_comm 7: expected auto (0), nccl (1) or mpi (2)");
    CHECK(strcmp(gp_gpu_comm_name(GP_GPU_COMM_NCCL), "nccl") == 0);
}

static void test_shared(void) {
    unsigned char ids[4][16];
    for (int r = 0; r < 4; r++) memset(ids[r], 0x10 + r, sizeof ids[r]);
    int a, b;
    CHECK(!gp_gpu_comm_shared(&ids[0][0], 4, 16, &a, &b));
    CHECK_EQ_INT(a, -1);
    ids[3][15] = 0x11; /* one byte off rank 1's: still distinct */
    CHECK(!gp_gpu_comm_shared(&ids[0][0], 4, 16, &a, &b));
    memcpy(ids[3], ids[1], 16);
    CHECK(gp_gpu_comm_shared(&ids[0][0], 4, 16, &a, &b));
    CHECK_EQ_INT(a, 1);
    CHECK_EQ_INT(b, 3);
    CHECK(!gp_gpu_comm_shared(&ids[0][0], 1, 16, &a, &b));
}

/* ----------------------------------------------------------- the sum order */

enum { N = 257, MAXD = 8 };

/* Every replica's bucket after the pairwise rounds, each round's exchange done on copies (the
 * partners' sums as they were when the round began), as the MPI grid and NCCL run it. */
static void pairwise(float x[MAXD][N], int D, bool tree) {
    static float before[MAXD][N];
    const int rounds = gp_dp_pair_rounds(D, tree);
    for (int r = 0; r < rounds; r++) {
        memcpy(before, x, sizeof before);
        for (int d = 0; d < D; d++) {
            const int p = gp_dp_partner(d, r);
            CHECK(p >= 0 && p < D && gp_dp_partner(p, r) == d);
            gp_dp_pair_add(x[d], before[p], N);
        }
    }
}

/* The balanced binary tree over replicas [lo, hi) (the top of the single replica's tree). */
static float tree_sum(float x[MAXD][N], int lo, int hi, int i) {
    if (hi - lo == 1) return x[lo][i];
    const int mid = (lo + hi) / 2;
    return tree_sum(x, lo, mid, i) + tree_sum(x, mid, hi, i);
}

static void test_order(void) {
    CHECK_EQ_INT(gp_dp_pair_rounds(1, true), 0);
    CHECK_EQ_INT(gp_dp_pair_rounds(2, false), 1);
    CHECK_EQ_INT(gp_dp_pair_rounds(2, true), 1);
    CHECK_EQ_INT(gp_dp_pair_rounds(4, true), 2);
    CHECK_EQ_INT(gp_dp_pair_rounds(8, true), 3);
    CHECK_EQ_INT(gp_dp_pair_rounds(4, false), 0); /* the library's all-reduce */
    CHECK_EQ_INT(gp_dp_pair_rounds(3, true), 0);
    CHECK_EQ_INT(gp_dp_pair_rounds(6, true), 0);
    static float x[MAXD][N], orig[MAXD][N];
    for (int D = 2; D <= MAXD; D *= 2) {
        /* magnitudes far apart, so that the order of the adds shows in the bits */
        for (int d = 0; d < D; d++)
            gp_test_fill(orig[d], N, 31 + (uint64_t)d, 2, -1.0f, 1.0f);
        for (int i = 0; i < N; i++) orig[i % D][i] *= 3e3f;
        memcpy(x, orig, sizeof x);
        pairwise(x, D, true);
        int mismatched = 0, sequential_differs = 0;
        for (int i = 0; i < N; i++) {
            const float want = tree_sum(orig, 0, D, i);
            float seq = orig[0][i];
            for (int d = 1; d < D; d++) seq += orig[d][i];
            sequential_differs += memcmp(&seq, &want, sizeof seq) != 0;
            for (int d = 0; d < D; d++) mismatched += memcmp(&x[d][i], &want, sizeof want) != 0;
        }
        CHECK_EQ_INT(mismatched, 0);
        /* the check above can tell one order from another: D = 2 has one sum only */
        if (D > 2) CHECK(sequential_differs > 0);
        printf("order: D = %d: every replica holds the tree's bits (%d of %d elements differ "
               "from the sequential sum)\n", D, sequential_differs, N);
    }
}

/* Whether the CUDA module hands over NCCL's calls: all of them in a build with GP_NCCL, a named
 * refusal otherwise. */
static void test_module(void) {
    const gp_nccl_calls *calls = NULL;
    const gp_status s = gp_cuda_nccl(&calls);
#ifdef GP_TEST_NCCL
    CHECK_OK(s);
    if (calls) {
        CHECK(calls->unique_id && calls->gpu_uuid && calls->comm_new && calls->comm_split &&
              calls->ready && calls->comm_free && calls->comm_abort && calls->exchange &&
              calls->allreduce_f32 && calls->send && calls->recv && calls->mark &&
              calls->op_done && calls->op_forget);
        printf("module: the CUDA module hands over NCCL's calls\n");
    }
#else
    CHECK(s == GP_UNSUPPORTED && calls == NULL);
    CHECK(strstr(gp_last_error(), gp_cuda_built() ? "built without NCCL" : "built without CUDA"));
    printf("module: %s\n", gp_last_error());
#endif
}

/* ------------------------------------------------ host staging under MPI */

/* Devices that say their memory is not the host's, as a GPU's is not, so that the MPI path
 * stages it and the NCCL path takes it (its context: the bits its pointers carry). "far": host
 * memory with its address's top bits set (a non-canonical address, which faults), moved only
 * through its copy: MPI given one of its pointers crashes. "near": plain host memory, so that the
 * CPU's kernels (its table) train on it and the fake NCCL module moves it. */
/* The fake NCCL module's function `name` in this process; NULL where it is not loaded. */
static void *fake_fn(const char *name) {
#ifdef GP_TEST_NCCL_FAKE
    void *fake = dlopen(GP_TEST_NCCL_FAKE, RTLD_NOW | RTLD_NOLOAD);
    return fake ? dlsym(fake, name) : NULL;
#else
    (void)name;
    return NULL;
#endif
}

/* The host's wait for the device's stream, as a GPU's: behind the fake's stuck collective it
 * does not return (cudaStreamSynchronize behind an NCCL kernel whose peer never comes). */
static void stream_wait(void) {
    static void (*fn)(void);
    if (!fn) fn = (void (*)(void))fake_fn("gp_fake_nccl_stream_wait");
    if (fn) fn();
}

#define FAR_BIT ((uintptr_t)1 << 62)
static const uintptr_t far_bits = FAR_BIT, near_bits = 0;
static void *to_host(const void *ctx, const void *p) {
    return (void *)((uintptr_t)p & ~*(const uintptr_t *)ctx);
}

static gp_status far_alloc(void *ctx, size_t nbytes, void **ptr) {
    void *p = NULL;
    if (posix_memalign(&p, 64, nbytes ? nbytes : 1))
        return gp_error(GP_OUT_OF_MEMORY, "far device: %zu bytes", nbytes);
    *ptr = (void *)((uintptr_t)p | *(const uintptr_t *)ctx);
    return GP_OK;
}
static long far_frees; /* blocks the devices gave back (gp_device_hold_frees holds them) */
static void far_free(void *ctx, void *ptr) {
    far_frees++;
    free(to_host(ctx, ptr));
}
static gp_status far_copy(void *ctx, void *dst, const void *src, size_t nbytes, gp_copy_kind k) {
    if (k != GP_COPY_DEVICE_TO_DEVICE) stream_wait();
    memmove(k == GP_COPY_DEVICE_TO_HOST ? dst : to_host(ctx, dst),
            k == GP_COPY_HOST_TO_DEVICE ? src : to_host(ctx, src), nbytes);
    return GP_OK;
}
static gp_status far_fill(void *ctx, void *dst, size_t nbytes, int byte) {
    memset(to_host(ctx, dst), byte, nbytes);
    return GP_OK;
}
static gp_status far_sync(void *ctx) {
    (void)ctx;
    stream_wait();
    return GP_OK;
}
static const gp_device_iface far_iface = {.kind = "far", .host_memory = false, .alloc = far_alloc,
                                          .free = far_free, .copy = far_copy, .fill = far_fill,
                                          .sync = far_sync};

/* 2 ranks: a stage message from rank 0 to rank 1 (K = 2), then a gradient bucket summed over
 * D = 2 replicas (a fresh grid), both in far memory. */
static int child_staged(void) {
    gp_device *cpu, *far;
    REQUIRE_OK(gp_device_cpu_new("staged-cpu", &cpu));
    REQUIRE_OK(gp_device_new("far", &far_iface, (void *)&far_bits, gp_device_kernels(cpu), &far));
    gp_grid *g = NULL;
    REQUIRE_OK(gp_grid_new(1, 2, 1, 30, &g));
    const int k = gp_grid_stage(g);
    /* The node-local rank a rank's GPU follows: as mpirun numbers the node's ranks (Open MPI's
     * OMPI_COMM_WORLD_LOCAL_RANK; every rank here is on this node). */
    const char *local = getenv("OMPI_COMM_WORLD_LOCAL_RANK");
    if (local) CHECK(gp_grid_local_rank(g) == atoi(local));
    float want[6], got[6];
    gp_test_fill(want, 6, 5, 1, -2.0f, 2.0f);
    gp_tensor t = {0};
    REQUIRE_OK(gp_tensor_alloc(far, GP_MEM_ACTIVATIONS, gp_shape2(2, 3), GP_F32, &t));
    const gp_msg_tag tag = {GP_MSG_ACT, 0, 0};
    if (k == 0) {
        CHECK_OK(gp_tensor_from_host(&t, want, sizeof want));
        CHECK_OK(gp_transport_send(gp_grid_pipe(g), 0, 1, tag, &t));
        CHECK_OK(gp_transport_flush(gp_grid_pipe(g), 0));
    } else {
        CHECK_OK(gp_transport_recv(gp_grid_pipe(g), 1, 0, tag, &t));
        CHECK_OK(gp_tensor_to_host(&t, got, sizeof got));
        CHECK(memcmp(got, want, sizeof want) == 0);
        gp_tensor_release(&t);
    }
    gp_grid_free(g);

    REQUIRE_OK(gp_grid_new(2, 1, 1, 30, &g));
    const int d = gp_grid_replica(g);
    float mine[N], other[N], sum[N], back[N];
    gp_test_fill(mine, N, 40 + (uint64_t)d, 3, -1.0f, 1.0f);
    gp_test_fill(other, N, 40 + (uint64_t)(1 - d), 3, -1.0f, 1.0f);
    for (int i = 0; i < N; i++) sum[i] = mine[i] + other[i]; /* one sum of two: either order */
    gp_tensor b = {0};
    REQUIRE_OK(gp_tensor_alloc(far, GP_MEM_GRADS, gp_shape1(N), GP_F32, &b));
    CHECK_OK(gp_tensor_from_host(&b, mine, sizeof mine));
    CHECK_OK(gp_grid_grads_start(g, &b));
    CHECK_OK(gp_grid_grads_wait(g));
    CHECK_OK(gp_tensor_to_host(&b, back, sizeof back));
    CHECK(memcmp(back, sum, sizeof sum) == 0);
    /* The bucket's host copy and its partner's sum (D = 2: one pairwise round), N floats each,
     * count as gradients on the far device beside the bucket itself, until the grid goes. */
    gp_mem_stats ms;
    gp_device_mem_stats(far, &ms);
    CHECK(ms.live[GP_MEM_GRADS] == 3 * sizeof mine && ms.peak[GP_MEM_GRADS] == 3 * sizeof mine);
    gp_grid_free(g);
    gp_device_mem_stats(far, &ms);
    CHECK(ms.live[GP_MEM_GRADS] == sizeof mine);
    gp_tensor_release(&b);
    gp_device_free(far);
    gp_device_free(cpu);
    printf("staged rank %d: %s\n", k, gp_test_failures ? "FAILED" : "checks passed");
    fflush(stdout);
    const int failed = gp_test_failures;
    gp_mpi_finalize();
    return failed ? 1 : 0;
}

/* ------------------------------------- the payload hook's message order */

/* A payload hook that moves nothing (its operations are done at once): stage 0 hooks every
 * activation it sends, stage 1 every one but mb 1's, so the two ends disagree at mb 1. */
static bool seq_carries(void *ctx, int peer, gp_msg_tag tag, bool sending) {
    (void)ctx, (void)peer;
    return sending || tag.mb != 1;
}
static gp_status seq_send(void *ctx, int peer, gp_msg_tag tag, const gp_tensor *t, void **op) {
    (void)ctx, (void)peer, (void)tag, (void)t;
    *op = NULL;
    return GP_OK;
}
static gp_status seq_recv(void *ctx, int peer, gp_msg_tag tag, gp_tensor *out, void **op) {
    (void)ctx, (void)peer, (void)tag, (void)out;
    *op = NULL;
    return GP_OK;
}
static gp_status seq_done(void *ctx, void *op, bool *done) {
    (void)ctx, (void)op;
    *done = true;
    return GP_OK;
}
static void seq_forget(void *ctx, void *op) { (void)ctx, (void)op; }

/* Stage 0 sends ACT(mb 0) and ACT(mb 1) through the hook; stage 1 takes mb 0 from the hook (its
 * message 0: as the header says) but expects mb 1 over MPI, which the header's hook sequence
 * number refutes: a SEQ line with each rank's error (3 s comm timeout). */
static int child_hook_seq(void) {
    gp_device *cpu;
    REQUIRE_OK(gp_device_cpu_new("seq-cpu", &cpu));
    gp_grid *g = NULL;
    REQUIRE_OK(gp_grid_new(1, 2, 1, 3, &g));
    const int k = gp_grid_stage(g);
    const gp_transport_payload hook = {.carries = seq_carries, .send = seq_send,
                                       .recv = seq_recv, .done = seq_done, .forget = seq_forget};
    gp_grid_set_payload(g, &hook);
    gp_status s = GP_OK;
    for (int mb = 0; mb < 2 && s == GP_OK; mb++) {
        const gp_msg_tag tag = {GP_MSG_ACT, mb, 0};
        gp_tensor t = {0};
        REQUIRE_OK(gp_tensor_alloc(cpu, GP_MEM_ACTIVATIONS, gp_shape1(4), GP_F32, &t));
        if (k == 0) {
            s = gp_transport_send(gp_grid_pipe(g), 0, 1, tag, &t);
        } else {
            s = gp_transport_recv(gp_grid_pipe(g), 1, 0, tag, &t);
            gp_tensor_release(&t);
        }
    }
    if (s == GP_OK && k == 0) s = gp_transport_flush(gp_grid_pipe(g), 0);
    printf("SEQ rank %d: %s\n", k, s == GP_OK ? "(no error)" : gp_last_error());
    fflush(stdout);
    sleep(2); /* the peer prints before this rank's MPI_Abort ends it */
    gp_grid_free(g);
    gp_device_free(cpu);
    gp_mpi_finalize();
    return 0;
}

/* ----------------------------------- gpipe's side of NCCL, over the fake */

enum { STEPS = 3, M = 2 };

/* The fake's call counts in this process; false (zeros) where it is not loaded. */
static bool fake_counts(long counts[7]) {
    memset(counts, 0, 7 * sizeof *counts);
    void *fn = fake_fn("gp_fake_nccl_counts");
    if (fn) ((void (*)(long *))fn)(counts);
    return fn != NULL;
}

/* The CPU's kernels, but the embedding's backward first waits for the device, as the CUDA
 * kernel does (it reads the ids back to the host): in a data-parallel backward that wait comes
 * after the later layers' gradient sums are queued on the stream. */
static gp_kernels waiting_kernels;
static const gp_kernels *cpu_kernels;
static gp_status embedding_backward_waits(gp_device *dev, int64_t n, int64_t row_len,
                                          int64_t dim, int64_t vocab, const int32_t *ids,
                                          const float *dy, float *dw) {
    const gp_status s = gp_device_sync(dev);
    if (s != GP_OK) return s;
    return cpu_kernels->embedding_backward(dev, n, row_len, dim, vocab, ids, dy, dw);
}

/* A test net trained STEPS steps by D x K ranks on near devices (gpu: on the GPUs, rank r on GPU
 * r), with gpu_comm want: rank 0 prints the parameters' hash, the last loss and what the ranks
 * used, for the parent to compare; with GP_FAKE_NCCL_SHARED, nccl asked must fail naming the
 * ranks that share. */
static int child_train(gp_test_net net, int D, int K, gp_schedule_kind sched, gp_grad_sum gs,
                       gp_gpu_comm want, bool gpu) {
    gp_device *cpu, *near;
    REQUIRE_OK(gp_device_cpu_new("train-cpu", &cpu));
    REQUIRE_OK(gp_device_new("near", &far_iface, (void *)&near_bits, gp_device_kernels(cpu), &near));
    gp_device *devs[8] = {near, near, near, near, near, near, near, near};
    const gp_pipeline_opts po = {.stages = K, .micro_batches = M, .schedule = sched,
                                 .launcher = GP_LAUNCHER_MPI, .data_parallel = D,
                                 .comm_timeout_s = 60, .grad_sum = gs, .devices = gpu ? NULL : devs,
                                 .device_type = gpu ? GP_DEVICE_CUDA : GP_DEVICE_CPU,
                                 .gpu_comm = want};
    gp_model *m = gp_test_net_build(net);
    gp_optim_opts o = gp_test_net_optim(net);
    gp_pipeline *p = NULL;
    const gp_status s = gp_pipeline_new(m, &o, &po, 77, &p);
    int rank = 0, nranks, stage, replica;
    gp_mpi_init(&rank, NULL);
    if (s != GP_OK) { /* the shared-GPU refusal: every rank fails alike */
        printf("train rank %d: gp_pipeline_new: %s\n", rank, gp_last_error());
        CHECK(getenv("GP_FAKE_NCCL_SHARED") && want == GP_GPU_COMM_NCCL &&
              strstr(gp_last_error(), "--gpu-comm nccl: ranks 0 and 1 share GPU"));
    } else {
        float loss = 0;
        long frees_before = 0;
        for (int st = 0; st < STEPS; st++) {
            gp_test_batch b;
            gp_test_net_batch(net, GP_TEST_NET_MAX_BATCH, 500 + (uint64_t)st, &b);
            REQUIRE_OK(gp_pipeline_step(p, &b.x, &b.y_t, &loss));
            if (st == 0 && !gpu) { /* the cache given back between steps */
                gp_mem_stats ms;
                gp_device_mem_stats(near, &ms);
                frees_before = far_frees;
                gp_device_trim(near);
                if (gp_pipeline_gpu_comm(p, NULL) == GP_GPU_COMM_NCCL)
                    CHECK(far_frees == frees_before); /* held until a step's end */
                else
                    CHECK(far_frees > frees_before || ms.cached == 0); /* freed at once */
            }
            if (st == 1 && !gpu) CHECK(far_frees > frees_before); /* NCCL: at its end */
        }
        uint64_t h = 0;
        REQUIRE_OK(gp_pipeline_params_fnv1a64(p, &h));
        gp_pipeline_place(p, &rank, &nranks, &stage, &replica);
        const char *why = "";
        const gp_gpu_comm used = gp_pipeline_gpu_comm(p, &why);
        long counts[7];
        const bool fn = fake_counts(counts);
        /* Every rank's calls over the fake: the neighbours' messages both ways, the rounds. */
        if (!fn) {
            CHECK(gpu); /* real NCCL: nothing to count */
        } else if (used == GP_GPU_COMM_NCCL) { /* two cells per stage: no neighbour links */
            CHECK((K == 1 || sched == GP_SCHEDULE_INTERLEAVED) == (counts[0] + counts[1] == 0));
            CHECK(counts[2] > 0 && counts[3] == 0); /* D = 2, the D = 4 tree: pairwise */
        } else {
            CHECK(counts[0] + counts[1] + counts[2] + counts[3] == 0);
        }
        if (rank == 0)
            printf("RESULT %016llx %.9g %s sends %ld recvs %ld exchanges %ld all-reduces %ld "
                   "splits %ld (%s)\n",
                   (unsigned long long)h, loss, gp_gpu_comm_name(used), counts[0], counts[1],
                   counts[2], counts[3], counts[4], why);
        gp_pipeline_free(p);
    }
    gp_model_free(m);
    gp_device_free(near);
    gp_device_free(cpu);
    fflush(stdout);
    const int failed = gp_test_failures;
    gp_mpi_finalize();
    return failed ? 1 : 0;
}

/* A D x K run over the fake that GP_FAKE_NCCL_FAIL makes fail: every rank prints a FAIL line
 * (its error, the fake's receives, communicators aborted and destroyed, the seconds its step
 * took) for the parent to check. timeout_s: the comm timeout; waits: the device's kernels wait
 * for it where CUDA's do (waiting_kernels). */
static int child_fail(int D, int K, double timeout_s, bool waits) {
    gp_device *cpu, *near;
    REQUIRE_OK(gp_device_cpu_new("fail-cpu", &cpu));
    cpu_kernels = gp_device_kernels(cpu);
    waiting_kernels = *cpu_kernels;
    waiting_kernels.embedding_backward = embedding_backward_waits;
    REQUIRE_OK(gp_device_new("near", &far_iface, (void *)&near_bits,
                             waits ? &waiting_kernels : cpu_kernels, &near));
    gp_device *devs[8] = {near, near, near, near, near, near, near, near};
    const gp_pipeline_opts po = {.stages = K, .micro_batches = M, .launcher = GP_LAUNCHER_MPI,
                                 .data_parallel = D, .comm_timeout_s = timeout_s, .devices = devs,
                                 .device_type = GP_DEVICE_CPU, .gpu_comm = GP_GPU_COMM_NCCL};
    const gp_test_net net = GP_TEST_TRANSFORMER;
    gp_model *m = gp_test_net_build(net);
    gp_optim_opts o = gp_test_net_optim(net);
    gp_pipeline *p = NULL;
    double t0 = gp_now();
    gp_status s = gp_pipeline_new(m, &o, &po, 77, &p); /* fails where setup is made to */
    int rank = 0;
    gp_mpi_init(&rank, NULL);
    gp_test_batch b;
    gp_test_net_batch(net, GP_TEST_NET_MAX_BATCH, 500, &b);
    float loss = 0;
    if (s == GP_OK) {
        t0 = gp_now();
        s = gp_pipeline_step(p, &b.x, &b.y_t, &loss);
    }
    const double took = gp_now() - t0;
    char err[768];
    snprintf(err, sizeof err, "%s", s == GP_OK ? "(no error)" : gp_last_error());
    gp_pipeline_free(p); /* the communicators go here: aborted or destroyed */
    long counts[7];
    fake_counts(counts);
    printf("FAIL rank %d: %s | recvs %ld aborts %ld frees %ld seconds %.1f\n", rank, err,
           counts[1], counts[5], counts[6], took);
    fflush(stdout);
    sleep(2); /* the peers print before this rank's MPI_Abort (gp_mpi_finalize) ends them */
    gp_model_free(m);
    gp_device_free(near);
    gp_device_free(cpu);
    gp_mpi_finalize();
    return 0;
}

/* mpirun -np np of this program's child `name` (extra: environment assignments before it); the
 * RESULT line of rank 0 into result (may be NULL). Returns mpirun's exit status. */
static int run_child(const char *name, int np, const char *extra, char *result, size_t n);

/* Every line the last run_child printed (FAIL lines: child_fail), and its limit in seconds. */
static char child_log[16384];
static int child_limit_s = 240;

#ifdef GP_TEST_NCCL_FAKE /* for run_fail, which needs the stand-in */
/* The FAIL line of world rank r in child_log, or "" (copied into line). */
static const char *fail_line(int r, char *line, size_t n) {
    char key[32];
    snprintf(key, sizeof key, "FAIL rank %d:", r);
    const char *at = strstr(child_log, key);
    const size_t k = at ? strcspn(at, "\n") : 0;
    snprintf(line, n, "%.*s", (int)k, at ? at : "");
    return line;
}
#endif

/* NCCL's failures over the fake: each case's ranks end within the comm timeout (the mpirun limit
 * is 60 s; a hang is killed there), every rank names the failure or the rank that failed, and
 * its communicators were aborted (none destroyed: a destroy would wait for the unmatched
 * operation). */
static int run_fail(void) {
#ifndef GP_TEST_NCCL_FAKE
    printf("fake NCCL failures: skipped (no MPI in this build)\n");
    return 0;
#else
    static const struct {
        const char *child, *env, *failed, *other; /* the failing rank's words, its peer's */
        int bad;
    } cases[] = {
        /* the first activation's send fails: its header never goes (the peer posts no receive) */
        {"nccl-fail-send", "GP_FAKE_NCCL_FAIL=send:0", "ncclSend failed (injected)",
         "aborted by rank 0", 0},
        /* stage 0's payloads never arrive: stage 1 times out receiving the first one, or stage
         * 0, waiting as long for the gradient that cannot come, times out first (the 3 s began
         * about together: either may end first, the other then stops on its note) */
        {"nccl-fail-lose", "GP_FAKE_NCCL_FAIL=lose:0", "timed out after 3 s waiting to receive",
         "aborted by rank", 0},
        /* replica 1's communicators report an asynchronous error once it has exchanged */
        {"nccl-fail-async", "GP_FAKE_NCCL_FAIL=async:1", "ncclCommGetAsyncError",
         "aborted by rank 1", 1},
        /* stage 0's sends fail asynchronously: the send's operation, gone with its error, is
         * not forgotten again when the transport goes (ASan: a double free) */
        {"nccl-fail-async-k2", "GP_FAKE_NCCL_FAIL=async:0", "ncclCommGetAsyncError",
         "aborted by rank 0", 0},
        /* stage 1's first split fails while stage 0 has begun its own: communicator setup */
        {"nccl-fail-split", "GP_FAKE_NCCL_FAIL=split:1", "ncclCommSplit failed (injected)",
         "aborted by rank 1", 1},
    };
    int failed = 0;
    child_limit_s = 60;
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        child_log[0] = '\0';
        run_child(cases[i].child, 2, cases[i].env, NULL, 0); /* exits non-zero: MPI_Abort */
        char a[1024], b[1024];
        fail_line(cases[i].bad, a, sizeof a);
        fail_line(1 - cases[i].bad, b, sizeof b);
        printf("fake NCCL failure %s:\n  %s\n  %s\n", cases[i].child, a, b);
        long ra = -1, aa = -1, fa = -1, rb = -1, ab = -1, fb = -1;
        double ta = 1e9, tb = 1e9;
        const char *ca = strstr(a, " | "), *cb = strstr(b, " | ");
        const bool parsed =
            ca && cb &&
            sscanf(ca, " | recvs %ld aborts %ld frees %ld seconds %lf", &ra, &aa, &fa, &ta) == 4 &&
            sscanf(cb, " | recvs %ld aborts %ld frees %ld seconds %lf", &rb, &ab, &fb, &tb) == 4;
        CHECK(parsed);
        if (i == 1) { /* either end's timeout */
            const bool first_a = strstr(a, cases[i].failed) && strstr(b, cases[i].other);
            const bool first_b = strstr(b, cases[i].failed) && strstr(a, cases[i].other);
            CHECK(first_a || first_b);
        } else {
            CHECK(strstr(a, cases[i].failed) != NULL);
            CHECK(strstr(b, cases[i].other) != NULL);
        }
        CHECK(aa > 0 && ab > 0 && fa == 0 && fb == 0); /* aborted, never destroyed */
        CHECK(ta < 30 && tb < 30);                     /* the timeout (3 s) bounded every wait */
        if (i == 0) CHECK(rb == 0); /* no header reached stage 1, so it posted no receive */
        if (i == 1) CHECK(rb == 1); /* the header came, its payload never did */
        failed += !parsed;
    }
    /* Replica 1 freezes mid-backward, never joining the gradient exchange: replica 0's stays
     * queued on its stream, and its embedding's backward then waits for that stream. The wait
     * ends at the comm timeout, naming itself, with the communicators aborted; rank 1 prints
     * nothing (rank 0's MPI_Abort ends it). Unbounded, rank 0 would wait for good, and the
     * mpirun limit (60 s) would kill both without a FAIL line. */
    child_log[0] = '\0';
    const int rc = run_child("nccl-fail-join", 2, "GP_FAKE_NCCL_FAIL=join:1", NULL, 0);
    char j0[1024], j1[1024];
    fail_line(0, j0, sizeof j0);
    fail_line(1, j1, sizeof j1);
    printf("fake NCCL failure nccl-fail-join (mpirun exit %d):\n  %s\n", rc, j0);
    long rj = -1, aj = -1, fj = -1;
    double tj = 1e9;
    const char *cj = strstr(j0, " | ");
    const bool joined =
        cj && sscanf(cj, " | recvs %ld aborts %ld frees %ld seconds %lf", &rj, &aj, &fj, &tj) == 4;
    CHECK(joined);
    CHECK(rc != 124 && rc != 137); /* ended by the bound, not killed at mpirun's limit */
    CHECK(strstr(j0, "rank 0 (stage 0 of replica 0): timed out after 3 s waiting for the GPU's "
                     "stream (a device synchronize) behind the replicas' NCCL gradient sums "
                     "(--comm-timeout)") != NULL);
    CHECK(aj > 0 && fj == 0); /* aborted, never destroyed */
    CHECK(tj >= 3 && tj < 30); /* it waited out the 3 s timeout, and no longer */
    CHECK(j1[0] == '\0');
    failed += !joined;
    child_log[0] = '\0';
    run_child("hook-seq", 2, "", NULL, 0);
    const char *seq = strstr(child_log, "SEQ rank 1:");
    printf("hook order: %.*s\n", seq ? (int)strcspn(seq, "\n") : 0, seq ? seq : "");
    CHECK(seq && strstr(seq, "receiving ACT(mb 1) from rank 0 (stage 0): expected a payload over "
                             "MPI, but rank 0 (stage 0) sent payload hook message 1"));
    failed += !seq;
    child_limit_s = 240;
    return failed;
#endif
}

typedef struct child_pair {
    const char *nccl, *mpi; /* the children trained over NCCL and over MPI with host staging */
    int np;
} child_pair;

#if defined(GP_TEST_NCCL) || defined(GP_TEST_NCCL_FAKE) /* else no pair is run */
/* Each pair's two children under mpirun: both must give the same parameter bits, the first over
 * NCCL, the second over MPI. Returns the children that failed. */
static int compare_pairs(const char *what, const child_pair *pairs, size_t n) {
    int failed = 0;
    for (size_t i = 0; i < n; i++) {
        char a[512] = "", b[512] = "";
        failed += run_child(pairs[i].nccl, pairs[i].np, "", a, sizeof a) != 0;
        failed += run_child(pairs[i].mpi, pairs[i].np, "", b, sizeof b) != 0;
        unsigned long long ha = 0, hb = 1;
        char ua[16] = "", ub[16] = "";
        const bool parsed = sscanf(a, "RESULT %llx %*g %15s", &ha, ua) == 2 &&
                            sscanf(b, "RESULT %llx %*g %15s", &hb, ub) == 2;
        printf("%s: %s %s | %s %s: %s\n", what, pairs[i].nccl, a, pairs[i].mpi, b,
               parsed && ha == hb ? "the same bits" : "DIFFERENT");
        CHECK(parsed && ha == hb);
        CHECK(strcmp(ua, "nccl") == 0 && strcmp(ub, "mpi") == 0);
    }
    return failed;
}
#endif

/* On a machine with a GPU per rank (2) and a build with GP_NCCL: NCCL itself, D = 2 (the
 * replicas' exchange) and K = 2 (the neighbours' messages), against MPI with host staging. With
 * one GPU, two ranks on it train over host staging, auto saying why. */
static int run_gpu(void) {
#ifndef GP_TEST_NCCL
    printf("GPU NCCL: skipped (built without GP_NCCL)\n");
    return 0;
#else
    int count = 0;
    if (gp_cuda_device_count(&count) != GP_OK) count = 0;
    if (count == 1) { /* two ranks on one GPU: auto falls back to host staging, saying why */
        int failed = 0;
        static const char *const shared[] = {"gpu-auto-d2", "gpu-auto-k2"};
        for (int i = 0; i < 2; i++) {
            char r[512] = "";
            failed += run_child(shared[i], 2, "", r, sizeof r) != 0;
            printf("GPU, 2 ranks on 1 GPU: %s %s\n", shared[i], r);
            CHECK(strstr(r, " mpi ") && strstr(r, "ranks 0 and 1 share GPU"));
        }
        return failed;
    }
    if (count < 2) {
        printf("GPU NCCL: skipped (needs 2 GPUs, one per rank; %d here)\n", count);
        return 0;
    }
    static const child_pair pairs[] = {{"gpu-nccl-d2", "gpu-mpi-d2", 2},
                                       {"gpu-nccl-k2", "gpu-mpi-k2", 2}};
    return compare_pairs("GPU NCCL", pairs, sizeof pairs / sizeof *pairs);
#endif
}

/* The same training over NCCL (the fake) and over MPI with host staging: the same bits where the
 * replicas' sum is pairwise (D = 2; the tree with D = 4), NCCL's calls made; with ranks sharing a
 * GPU auto falls back to MPI saying why, and nccl asked is refused. */
static int run_fake(void) {
#ifndef GP_TEST_NCCL_FAKE
    printf("fake NCCL: skipped (no MPI in this build)\n");
    return 0;
#else
    setenv("GP_CUDA_MODULE", GP_TEST_NCCL_FAKE, 1);
    static const child_pair pairs[] = {{"nccl-d2k2", "mpi-d2k2", 4},
                                       {"nccl-tree-d4", "mpi-tree-d4", 4},
                                       {"nccl-tied-d2k2", "mpi-tied-d2k2", 4},
                                       {"nccl-interleaved-d2k2", "mpi-interleaved-d2k2", 4}};
    int failed = compare_pairs("fake NCCL", pairs, sizeof pairs / sizeof *pairs);
    char c[512] = "";
    failed += run_child("nccl-auto-d2", 2, "GP_FAKE_NCCL_SHARED=1", c, sizeof c) != 0;
    printf("fake NCCL: ranks sharing a GPU, auto: %s\n", c);
    CHECK(strstr(c, " mpi ") && strstr(c, "ranks 0 and 1 share GPU") &&
          strstr(c, "one GPU cannot host two NCCL ranks"));
    failed += run_child("nccl-d2", 2, "GP_FAKE_NCCL_SHARED=1", NULL, 0) != 0;
    return failed;
#endif
}

static int run_staged(void) {
    return run_child("staged", 2, "", NULL, 0);
}

static int run_child(const char *name, int np, const char *extra, char *result, size_t n) {
    if (!gp_mpi_built() || system("command -v mpirun >/dev/null 2>&1") != 0) {
        printf("%s: skipped (no MPI in this build, or no mpirun on PATH)\n", name);
        return 0;
    }
    char self[4096], cmd[4400], line[1024];
    const ssize_t len = readlink("/proc/self/exe", self, sizeof self - 1);
    if (len <= 0) return 1;
    self[len] = '\0';
    setenv("OMPI_ALLOW_RUN_AS_ROOT", "1", 1);
    setenv("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1", 1);
    /* Under ASan the ranks run without leak detection: Open MPI's plugins leave their own
     * allocations behind at exit (this process, which makes no MPI call, is still checked). */
    const char *asan = getenv("ASAN_OPTIONS");
    char opts[512];
    snprintf(opts, sizeof opts, "%s%sdetect_leaks=0", asan ? asan : "", asan && *asan ? ":" : "");
    setenv("ASAN_OPTIONS", opts, 1);
    snprintf(cmd, sizeof cmd,
             "%s timeout -k 10 %d mpirun --oversubscribe --bind-to none -np %d %s --child %s 2>&1",
             extra, child_limit_s, np, self, name);
    FILE *f = popen(cmd, "r");
    if (!f) return 1;
    while (fgets(line, sizeof line, f)) {
        if (result && !strncmp(line, "RESULT ", 7)) {
            line[strcspn(line, "\n")] = '\0';
            const size_t k = strlen(line) < n ? strlen(line) : n - 1;
            memcpy(result, line, k);
            result[k] = '\0';
        } else {
            fputs(line, stdout);
            const size_t have = strlen(child_log);
            snprintf(child_log + have, sizeof child_log - have, "%s", line);
        }
    }
    const int st = pclose(f);
    const int rc = st == -1 ? -1 : WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
    printf("%s (%d ranks): mpirun exit %d\n", name, np, rc);
    return rc;
}

int main(int argc, char **argv) {
    if (argc == 3 && !strcmp(argv[1], "--child")) {
        const char *c = argv[2];
        if (!strcmp(c, "staged")) return child_staged();
        if (!strcmp(c, "hook-seq")) return child_hook_seq();
        if (!strcmp(c, "nccl-fail-send") || !strcmp(c, "nccl-fail-lose"))
            return child_fail(1, 2, 3, false);
        if (!strcmp(c, "nccl-fail-async")) return child_fail(2, 1, 3, false);
        if (!strcmp(c, "nccl-fail-split")) return child_fail(1, 2, 3, false);
        if (!strcmp(c, "nccl-fail-async-k2")) return child_fail(1, 2, 3, false);
        if (!strcmp(c, "nccl-fail-join")) return child_fail(2, 1, 3, true);
        const gp_test_net tf = GP_TEST_TRANSFORMER, tied = GP_TEST_TRANSFORMER_TIED;
        const gp_schedule_kind f1b = GP_SCHEDULE_1F1B, il = GP_SCHEDULE_INTERLEAVED;
        const gp_grad_sum seq = GP_GRAD_SUM_SEQUENTIAL, tree = GP_GRAD_SUM_TREE;
        const gp_gpu_comm nccl = GP_GPU_COMM_NCCL, mpi = GP_GPU_COMM_MPI;
        if (!strcmp(c, "nccl-d2k2")) return child_train(tf, 2, 2, f1b, seq, nccl, false);
        if (!strcmp(c, "mpi-d2k2")) return child_train(tf, 2, 2, f1b, seq, mpi, false);
        if (!strcmp(c, "nccl-tree-d4")) return child_train(tf, 4, 1, f1b, tree, nccl, false);
        if (!strcmp(c, "mpi-tree-d4")) return child_train(tf, 4, 1, f1b, tree, mpi, false);
        if (!strcmp(c, "nccl-tied-d2k2")) return child_train(tied, 2, 2, f1b, seq, nccl, false);
        if (!strcmp(c, "mpi-tied-d2k2")) return child_train(tied, 2, 2, f1b, seq, mpi, false);
        if (!strcmp(c, "nccl-interleaved-d2k2")) return child_train(tf, 2, 2, il, seq, nccl, false);
        if (!strcmp(c, "mpi-interleaved-d2k2")) return child_train(tf, 2, 2, il, seq, mpi, false);
        if (!strcmp(c, "nccl-auto-d2")) return child_train(tf, 2, 1, f1b, seq, GP_GPU_COMM_AUTO, false);
        if (!strcmp(c, "nccl-d2")) return child_train(tf, 2, 1, f1b, seq, nccl, false);
        if (!strcmp(c, "gpu-nccl-d2")) return child_train(tf, 2, 1, f1b, seq, nccl, true);
        if (!strcmp(c, "gpu-mpi-d2")) return child_train(tf, 2, 1, f1b, seq, mpi, true);
        if (!strcmp(c, "gpu-nccl-k2")) return child_train(tf, 1, 2, f1b, seq, nccl, true);
        if (!strcmp(c, "gpu-mpi-k2")) return child_train(tf, 1, 2, f1b, seq, mpi, true);
        if (!strcmp(c, "gpu-auto-d2")) return child_train(tf, 2, 1, f1b, seq, GP_GPU_COMM_AUTO, true);
        if (!strcmp(c, "gpu-auto-k2")) return child_train(tf, 1, 2, f1b, seq, GP_GPU_COMM_AUTO, true);
        fprintf(stderr, "unknown case %s\n", c);
        return 2;
    }
    test_choose();
    test_shared();
    test_order();
    test_module();
    if (run_staged() != 0) gp_test_failures++;
    gp_test_failures += run_gpu(); /* before run_fake points GP_CUDA_MODULE at the fake */
    gp_test_failures += run_fake();
    gp_test_failures += run_fail();
    if (gp_test_failures) {
        printf("%d check(s) failed\n", gp_test_failures);
        return 1;
    }
    printf("all checks passed\n");
    return 0;
}
