/* The threads transport: K stage threads run the real GPipe and 1F1B schedules with random delays,
 * passing activations forward and gradients back (contents checked bit for bit); header
 * mismatches, timeouts and aborts give errors naming both sides; the all-reduce has the bits of
 * a sequential sum in rank order whatever the arrival order; device counters return to zero. */
#include <pthread.h>
#include <string.h>
#include <time.h>

#include "comm/transport.h"
#include "plan/schedule.h"
#include "plan/validate.h"
#include "testutil.h"

#define B 2
#define MAXK 4

/* ---------------------------------------------------------------- helpers */

/* Failures seen on a worker thread (gp_test_failures belongs to the main thread). */
typedef struct tcheck {
    int failures;
    char first[600];
} tcheck;

static void tfail(tcheck *t, const char *fmt, const char *a, int k, int m) {
    if (t->failures++ == 0) snprintf(t->first, sizeof t->first, fmt, a, k, m);
}

static void merge(tcheck *t, const char *who) {
    if (t->failures) {
        fprintf(stderr, "%s: %d failure(s), first: %s\n", who, t->failures, t->first);
        gp_test_failures += t->failures;
    }
}

static uint64_t xorshift(uint64_t *s) {
    *s ^= *s << 13;
    *s ^= *s >> 7;
    *s ^= *s << 17;
    return *s;
}

/* Sleeps 0..max_us microseconds, half of the time not at all. */
static void jitter(uint64_t *s, int max_us) {
    uint64_t r = xorshift(s);
    if (r & 1) return;
    struct timespec ts = {0, (long)((r >> 8) % (uint64_t)(max_us + 1)) * 1000L};
    nanosleep(&ts, NULL);
}

static double now_s(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + t.tv_nsec * 1e-9;
}

static int64_t width(int k) { return 3 + k; } /* boundary k (stage k's input): (B, width(k)) */

/* Stage k's forward: y (B, width(k+1)) from x (B, width(k)). */
static void stage_fwd(int k, const float *x, float *y) {
    int64_t ci = width(k), co = width(k + 1);
    for (int64_t b = 0; b < B; b++)
        for (int64_t j = 0; j < co; j++) y[b * co + j] = x[b * ci + j % ci] * 0.5f + 0.25f * (k + 1);
}

/* Stage k's backward: dx (B, width(k)) from dy (B, width(k+1)) and x. */
static void stage_bwd(int k, const float *x, const float *dy, float *dx) {
    int64_t ci = width(k), co = width(k + 1);
    for (int64_t b = 0; b < B; b++)
        for (int64_t i = 0; i < ci; i++) {
            float acc = x[b * ci + i] * 1e-3f;
            for (int64_t j = i; j < co; j += ci) acc += dy[b * co + j] * 0.5f;
            dx[b * ci + i] = acc;
        }
}

/* The last stage's gradient from its output. */
static void loss_grad(int m, const float *y, int64_t n, float *dy) {
    for (int64_t i = 0; i < n; i++) dy[i] = y[i] * 0.125f - (float)m;
}

static void input_of(int m, uint64_t step, float *x) {
    gp_test_fill(x, B * width(0), 1234 + step, (uint32_t)m, 0.1f, 2.0f);
}

/* Reference, computed sequentially: the activation entering stage k (k = K: the last output). */
static float *ref_act(int k, int m, uint64_t step) {
    float *x = malloc(sizeof(float) * B * width(0));
    input_of(m, step, x);
    for (int s = 0; s < k; s++) {
        float *y = malloc(sizeof(float) * B * width(s + 1));
        stage_fwd(s, x, y);
        free(x);
        x = y;
    }
    return x;
}

/* Reference: the gradient of stage k's input (k = K: of the last output). */
static float *ref_grad(int k, int K, int m, uint64_t step) {
    float *y = ref_act(K, m, step);
    float *dy = malloc(sizeof(float) * B * width(K));
    loss_grad(m, y, B * width(K), dy);
    free(y);
    for (int s = K - 1; s >= k; s--) {
        float *x = ref_act(s, m, step);
        float *dx = malloc(sizeof(float) * B * width(s));
        stage_bwd(s, x, dy, dx);
        free(x);
        free(dy);
        dy = dx;
    }
    return dy;
}

static bool same_bits(const float *a, const float *b, int64_t n) {
    return memcmp(a, b, (size_t)n * sizeof *a) == 0;
}

/* ------------------------------------------------- schedules on K threads */

typedef struct stage_run {
    int k, K, M, steps;
    const gp_schedule *sched;
    gp_transport *tr;
    gp_device *dev;
    uint64_t seed;
    double norm[MAXK]; /* the all-reduced per-stage partials of the last step */
    tcheck chk;
} stage_run;

static gp_status alloc_act(stage_run *r, int boundary, gp_tensor *t) {
    return gp_tensor_alloc(r->dev, GP_MEM_ACTIVATIONS, gp_shape2(B, width(boundary)), GP_F32, t);
}

#define TRY_STAGE(expr)                                                                    \
    do {                                                                                   \
        if ((s = (expr)) != GP_OK) {                                                       \
            tfail(&r->chk, "%s (stage %d, step %d)", gp_last_error(), r->k, (int)step);     \
            gp_transport_abort(r->tr, r->k, s, gp_last_error());                           \
            goto done;                                                                     \
        }                                                                                  \
    } while (0)

/* Interprets stage k's action list, as the pipeline runtime will. */
static void *stage_main(void *arg) {
    stage_run *r = arg;
    int k = r->k, K = r->K;
    gp_tensor in[16], out[16], gout[16], gin[16];
    memset(in, 0, sizeof in), memset(out, 0, sizeof out);
    memset(gout, 0, sizeof gout), memset(gin, 0, sizeof gin);
    gp_status s = GP_OK;
    uint64_t step = 0;
    for (step = 0; step < (uint64_t)r->steps; step++) {
        double sq = 0; /* this stage's "gradient norm" partial */
        const gp_stage_actions *acts = &r->sched->stage[k];
        for (int i = 0; i < acts->n; i++) {
            jitter(&r->seed, 60);
            int m = acts->a[i].mb;
            switch (acts->a[i].kind) {
            case GP_ACT_FORWARD:
                if (k == 0) {
                    TRY_STAGE(alloc_act(r, 0, &in[m]));
                    input_of(m, step, in[m].data);
                }
                TRY_STAGE(alloc_act(r, k + 1, &out[m]));
                stage_fwd(k, in[m].data, out[m].data);
                break;
            case GP_ACT_SEND_ACT:
                TRY_STAGE(gp_transport_send(r->tr, k, k + 1, (gp_msg_tag){GP_MSG_ACT, m, 0}, &out[m]));
                if (out[m].data) tfail(&r->chk, "%s: stage %d mb %d", "send left the tensor", k, m);
                break;
            case GP_ACT_RECV_ACT: {
                TRY_STAGE(alloc_act(r, k, &in[m]));
                TRY_STAGE(gp_transport_recv(r->tr, k, k - 1, (gp_msg_tag){GP_MSG_ACT, m, 0}, &in[m]));
                float *want = ref_act(k, m, step);
                if (!same_bits(in[m].data, want, B * width(k)))
                    tfail(&r->chk, "%s: stage %d mb %d", "activation bits differ", k, m);
                free(want);
                break;
            }
            case GP_ACT_RECV_GRAD: {
                TRY_STAGE(alloc_act(r, k + 1, &gout[m]));
                TRY_STAGE(gp_transport_recv(r->tr, k, k + 1, (gp_msg_tag){GP_MSG_GRAD, m, 0}, &gout[m]));
                float *want = ref_grad(k + 1, K, m, step);
                if (!same_bits(gout[m].data, want, B * width(k + 1)))
                    tfail(&r->chk, "%s: stage %d mb %d", "gradient bits differ", k, m);
                free(want);
                break;
            }
            case GP_ACT_BACKWARD:
                if (k == K - 1) { /* the loss: its gradient from the output kept since forward */
                    TRY_STAGE(alloc_act(r, K, &gout[m]));
                    loss_grad(m, out[m].data, B * width(K), gout[m].data);
                    gp_tensor_release(&out[m]);
                }
                TRY_STAGE(alloc_act(r, k, &gin[m]));
                stage_bwd(k, in[m].data, gout[m].data, gin[m].data);
                for (int64_t j = 0; j < B * width(k); j++) sq += (double)F32(gin[m])[j] * F32(gin[m])[j];
                gp_tensor_release(&in[m]);
                gp_tensor_release(&gout[m]);
                if (k == 0) {
                    float *want = ref_grad(0, K, m, step);
                    if (!same_bits(gin[m].data, want, B * width(0)))
                        tfail(&r->chk, "%s: stage %d mb %d", "input gradient bits differ", k, m);
                    free(want);
                    gp_tensor_release(&gin[m]);
                }
                break;
            case GP_ACT_SEND_GRAD:
                TRY_STAGE(gp_transport_send(r->tr, k, k - 1, (gp_msg_tag){GP_MSG_GRAD, m, 0}, &gin[m]));
                break;
            case GP_ACT_OPTIMIZER_STEP: {
                TRY_STAGE(gp_transport_flush(r->tr, k));
                double part[MAXK] = {0};
                part[k] = sq;
                TRY_STAGE(gp_transport_allreduce_sum(r->tr, k, part, K));
                memcpy(r->norm, part, sizeof part);
                TRY_STAGE(gp_transport_barrier(r->tr, k));
                break;
            }
            default:
                break;
            }
        }
    }
done:
    for (int m = 0; m < 16; m++) {
        gp_tensor_release(&in[m]);
        gp_tensor_release(&out[m]);
        gp_tensor_release(&gout[m]);
        gp_tensor_release(&gin[m]);
    }
    return NULL;
}

static void run_schedule(gp_schedule_kind kind, int K, int M, int capacity, int steps,
                         uint64_t seed) {
    const char *name = gp_schedule_kind_name(kind);
    gp_schedule sched = {0};
    REQUIRE_OK(gp_schedule_generate(kind, K, M, 0, &sched));
    REQUIRE_OK(gp_schedule_validate(&sched, capacity, NULL));
    gp_transport *tr;
    REQUIRE_OK(gp_transport_threads_new(
        &(gp_transport_opts){.nranks = K, .capacity = capacity, .timeout_s = 20}, &tr));
    stage_run runs[MAXK];
    pthread_t th[MAXK];
    for (int k = 0; k < K; k++) {
        runs[k] = (stage_run){.k = k, .K = K, .M = M, .steps = steps, .sched = &sched, .tr = tr,
                              .seed = seed * 977 + (uint64_t)k + 1};
        REQUIRE_OK(gp_device_cpu_new("stage", &runs[k].dev));
    }
    for (int k = K - 1; k >= 0; k--) CHECK(pthread_create(&th[k], NULL, stage_main, &runs[k]) == 0);
    for (int k = 0; k < K; k++) pthread_join(th[k], NULL);
    char who[96];
    snprintf(who, sizeof who, "schedule %s K=%d M=%d capacity %d", name, K, M, capacity);
    CHECK(!gp_transport_aborted(tr, NULL));
    for (int k = 0; k < K; k++) {
        merge(&runs[k].chk, who);
        /* every stage holds the same all-reduced partials */
        CHECK(memcmp(runs[k].norm, runs[0].norm, sizeof runs[0].norm) == 0);
        CHECK(runs[0].norm[k] > 0);
        gp_mem_stats ms;
        gp_device_mem_stats(runs[k].dev, &ms);
        CHECK_EQ_INT(ms.live_total, 0); /* flush released every sent buffer */
        /* at most `capacity` outgoing messages per link stay on the sender */
        if (k > 0 && k < K - 1) CHECK(ms.peak[GP_MEM_ACTIVATIONS] > 0);
    }
    gp_transport_free(tr);
    for (int k = 0; k < K; k++) gp_device_free(runs[k].dev);
    gp_schedule_free(&sched);
}

static void test_schedules(bool quick) {
    static const gp_schedule_kind kinds[] = {GP_SCHEDULE_GPIPE, GP_SCHEDULE_1F1B};
    for (int K = 2; K <= MAXK; K++)
        for (int cap = 1; cap <= 2; cap++)
            for (int n = 0; n < 2; n++)
                run_schedule(kinds[n], K, quick ? 4 : 8, cap, 2, (uint64_t)(K * 10 + cap));
}

/* ------------------------------------------------------- single-thread cases */

static gp_tensor tensor_on(gp_device *dev, gp_shape shape, float v) {
    gp_tensor t;
    REQUIRE_OK(gp_tensor_alloc(dev, GP_MEM_ACTIVATIONS, shape, GP_F32, &t));
    for (int64_t i = 0; i < gp_tensor_nelem(&t); i++) F32(t)[i] = v + (float)i;
    return t;
}

static uint64_t live(gp_device *d) {
    gp_mem_stats ms;
    gp_device_mem_stats(d, &ms);
    return ms.live_total;
}

static gp_transport *make(int K, int capacity, double timeout) {
    gp_transport *tr;
    REQUIRE_OK(gp_transport_threads_new(
        &(gp_transport_opts){.nranks = K, .capacity = capacity, .timeout_s = timeout}, &tr));
    return tr;
}

static void test_mismatch(gp_device *d0, gp_device *d1) {
    gp_msg_tag act0 = {GP_MSG_ACT, 0, 0}, act1 = {GP_MSG_ACT, 1, 0};
    /* wrong micro-batch */
    gp_transport *tr = make(2, 2, 5);
    gp_tensor t = tensor_on(d0, gp_shape2(2, 3), 1), r;
    REQUIRE_OK(gp_transport_send(tr, 0, 1, act1, &t));
    REQUIRE_OK(gp_tensor_alloc(d1, GP_MEM_ACTIVATIONS, gp_shape2(2, 3), GP_F32, &r));
    CHECK_FAILS(gp_transport_recv(tr, 1, 0, act0, &r), GP_INTERNAL,
                "rank 1: receiving from rank 0: expected ACT(mb 0) float32 (2, 3), but rank 0 "
                "sent ACT(mb 1) float32 (2, 3)");
    int who = -1;
    CHECK(gp_transport_aborted(tr, &who) && who == 1);
    /* the sender learns it too, at once */
    t = tensor_on(d0, gp_shape2(2, 3), 1);
    CHECK_FAILS(gp_transport_send(tr, 0, 1, act0, &t), GP_IO, "aborted by rank 1");
    CHECK(t.data == NULL);
    gp_transport_free(tr); /* releases the message still queued, on d0 */
    CHECK_EQ_INT(live(d0), 0);

    /* wrong shape, and a gradient where an activation was expected */
    tr = make(2, 2, 5);
    t = tensor_on(d0, gp_shape2(2, 4), 1);
    REQUIRE_OK(gp_transport_send(tr, 0, 1, act0, &t));
    CHECK_FAILS(gp_transport_recv(tr, 1, 0, act0, &r), GP_SHAPE,
                "expected ACT(mb 0) float32 (2, 3), but rank 0 sent ACT(mb 0) float32 (2, 4)");
    gp_transport_free(tr);
    tr = make(2, 2, 5);
    t = tensor_on(d1, gp_shape2(2, 3), 1);
    REQUIRE_OK(gp_transport_send(tr, 1, 0, (gp_msg_tag){GP_MSG_GRAD, 0, 0}, &t));
    gp_tensor r0;
    REQUIRE_OK(gp_tensor_alloc(d0, GP_MEM_ACTIVATIONS, gp_shape2(2, 3), GP_F32, &r0));
    CHECK_FAILS(gp_transport_recv(tr, 0, 1, act0, &r0), GP_INTERNAL,
                "rank 0: receiving from rank 1: expected ACT(mb 0)");
    CHECK(strstr(gp_last_error(), "rank 1 sent GRAD(mb 0)") != NULL);
    gp_transport_free(tr);
    gp_tensor_release(&r0);
    gp_tensor_release(&r);
    CHECK_EQ_INT(live(d0), 0);
    CHECK_EQ_INT(live(d1), 0);
}

/* Ownership: messages stay counted on the sender until received and reclaimed. */
static void test_ownership(gp_device *d0, gp_device *d1) {
    gp_transport *tr = make(2, 2, 5);
    gp_shape sh = gp_shape2(4, 8);
    uint64_t nb = 4 * 8 * sizeof(float);
    gp_tensor a = tensor_on(d0, sh, 10), b = tensor_on(d0, sh, 20), r;
    REQUIRE_OK(gp_transport_send(tr, 0, 1, (gp_msg_tag){GP_MSG_ACT, 0, 0}, &a));
    REQUIRE_OK(gp_transport_send(tr, 0, 1, (gp_msg_tag){GP_MSG_ACT, 1, 0}, &b));
    CHECK(a.data == NULL && !a.owned && b.data == NULL);
    CHECK_EQ_INT(live(d0), 2 * nb);
    REQUIRE_OK(gp_tensor_alloc(d1, GP_MEM_ACTIVATIONS, sh, GP_F32, &r));
    CHECK_OK(gp_transport_recv(tr, 1, 0, (gp_msg_tag){GP_MSG_ACT, 0, 0}, &r));
    CHECK(F32(r)[0] == 10.0f && F32(r)[31] == 41.0f);
    CHECK_EQ_INT(live(d0), 2 * nb); /* received, not yet reclaimed by the sender's thread */
    CHECK_EQ_INT(live(d1), nb);
    CHECK_OK(gp_transport_recv(tr, 1, 0, (gp_msg_tag){GP_MSG_ACT, 1, 0}, &r));
    CHECK(F32(r)[0] == 20.0f && F32(r)[31] == 51.0f);
    CHECK_OK(gp_transport_flush(tr, 0));
    CHECK_EQ_INT(live(d0), 0);
    /* a view cannot be handed over; bad ranks */
    float buf[4] = {0};
    gp_tensor v = gp_tensor_view(buf, gp_shape1(4), GP_F32);
    CHECK_FAILS(gp_transport_send(tr, 0, 1, (gp_msg_tag){GP_MSG_ACT, 2, 0}, &v), GP_INVALID_ARGUMENT,
                "must be owned");
    gp_tensor c = tensor_on(d0, sh, 0);
    CHECK_FAILS(gp_transport_send(tr, 0, 0, (gp_msg_tag){GP_MSG_ACT, 2, 0}, &c), GP_INVALID_ARGUMENT,
                "peer 0 must be another rank");
    CHECK(c.data == NULL); /* released on failure too */
    CHECK_FAILS(gp_transport_recv(tr, 2, 0, (gp_msg_tag){GP_MSG_ACT, 2, 0}, &r), GP_INVALID_ARGUMENT,
                "rank 2 out of range 0..1");
    CHECK(!gp_transport_aborted(tr, NULL));
    gp_transport_free(tr);
    gp_tensor_release(&r);
    CHECK_EQ_INT(live(d0), 0);
    CHECK_EQ_INT(live(d1), 0);
}

static void test_timeouts(gp_device *d0) {
    const double timeout = 0.2;
    gp_transport *tr = make(2, 1, timeout);
    gp_tensor r;
    REQUIRE_OK(gp_tensor_alloc(d0, GP_MEM_ACTIVATIONS, gp_shape1(3), GP_F32, &r));
    double t0 = now_s();
    CHECK_FAILS(gp_transport_recv(tr, 1, 0, (gp_msg_tag){GP_MSG_GRAD, 3, 0}, &r), GP_IO,
                "rank 1: timed out after 0.2 s waiting to receive GRAD(mb 3) from rank 0");
    double dt = now_s() - t0;
    CHECK(dt >= timeout * 0.99 && dt < timeout + 1.0);
    gp_transport_free(tr);

    /* a full mailbox */
    tr = make(2, 1, timeout);
    gp_tensor t = tensor_on(d0, gp_shape1(3), 0);
    CHECK_OK(gp_transport_send(tr, 0, 1, (gp_msg_tag){GP_MSG_ACT, 0, 0}, &t));
    t = tensor_on(d0, gp_shape1(3), 0);
    t0 = now_s();
    CHECK_FAILS(gp_transport_send(tr, 0, 1, (gp_msg_tag){GP_MSG_ACT, 1, 0}, &t), GP_IO,
                "rank 0: timed out after 0.2 s waiting to send ACT(mb 1) to rank 1: its mailbox "
                "stayed full (capacity 1; rank 1 has not received ACT(mb 0))");
    dt = now_s() - t0;
    CHECK(dt >= timeout * 0.99 && dt < timeout + 1.0);
    gp_transport_free(tr);

    /* a collective that one rank never joins */
    tr = make(3, 1, timeout);
    double x[2] = {1, 2};
    CHECK_FAILS(gp_transport_allreduce_sum(tr, 1, x, 2), GP_IO,
                "rank 1: timed out after 0.2 s waiting in all-reduce #0 for rank(s) 0, 2");
    gp_transport_free(tr);
    gp_tensor_release(&r);
    CHECK_EQ_INT(live(d0), 0);
}

/* ------------------------------------------------------------------ abort */

typedef struct blocked {
    gp_transport *tr;
    int rank, what; /* 0 recv, 1 send into a full mailbox, 2 barrier */
    gp_device *dev;
    gp_status s;
    double seconds;
    char msg[1024];
} blocked;

static void *blocked_main(void *arg) {
    blocked *b = arg;
    double t0 = now_s();
    if (b->what == 0) {
        gp_tensor r;
        b->s = gp_tensor_alloc(b->dev, GP_MEM_ACTIVATIONS, gp_shape1(2), GP_F32, &r);
        if (b->s == GP_OK) b->s = gp_transport_recv(b->tr, b->rank, 0, (gp_msg_tag){GP_MSG_ACT, 0, 0}, &r);
        gp_tensor_release(&r);
    } else if (b->what == 1) {
        for (int m = 0; m < 2 && b->s == GP_OK; m++) {
            gp_tensor t;
            b->s = gp_tensor_alloc(b->dev, GP_MEM_ACTIVATIONS, gp_shape1(2), GP_F32, &t);
            if (b->s == GP_OK) {
                F32(t)[0] = F32(t)[1] = 0;
                b->s = gp_transport_send(b->tr, b->rank, 1, (gp_msg_tag){GP_MSG_GRAD, m, 0}, &t);
            }
        }
    } else {
        b->s = gp_transport_barrier(b->tr, b->rank);
    }
    b->seconds = now_s() - t0;
    snprintf(b->msg, sizeof b->msg, "%s", gp_last_error());
    return NULL;
}

static void test_abort(void) {
    gp_transport *tr = make(4, 1, 10);
    blocked bl[3] = {{.rank = 1, .what = 0}, {.rank = 2, .what = 1}, {.rank = 3, .what = 2}};
    pthread_t th[3];
    for (int i = 0; i < 3; i++) {
        bl[i].tr = tr;
        REQUIRE_OK(gp_device_cpu_new("blocked", &bl[i].dev));
        CHECK(pthread_create(&th[i], NULL, blocked_main, &bl[i]) == 0);
    }
    struct timespec ts = {0, 100 * 1000 * 1000};
    nanosleep(&ts, NULL);
    gp_transport_abort(tr, 0, GP_NUMERIC, "stage 0: loss is NaN at micro-batch 2");
    for (int i = 0; i < 3; i++) pthread_join(th[i], NULL);
    static const char *const doing[] = {"rank 1: stopped waiting to receive ACT(mb 0) from rank 0",
                                        "rank 2: stopped waiting to send GRAD(mb 1) to rank 1",
                                        "rank 3: stopped waiting in barrier #0"};
    for (int i = 0; i < 3; i++) {
        CHECK_EQ_INT(bl[i].s, GP_IO);
        CHECK(bl[i].seconds < 5.0); /* woken, not timed out */
        if (!strstr(bl[i].msg, doing[i]) ||
            !strstr(bl[i].msg, "aborted by rank 0 (GP_NUMERIC: stage 0: loss is NaN at micro-batch 2)")) {
            fprintf(stderr, "abort message %d: \"%s\"\n", i, bl[i].msg);
            gp_test_failures++;
        }
    }
    int who = -1;
    CHECK(gp_transport_aborted(tr, &who) && who == 0);
    gp_transport_abort(tr, 3, GP_IO, "later"); /* the first failure stays the one reported */
    CHECK_FAILS(gp_transport_barrier(tr, 1), GP_IO, "aborted by rank 0 (GP_NUMERIC");
    gp_transport_free(tr);
    for (int i = 0; i < 3; i++) {
        CHECK_EQ_INT(live(bl[i].dev), 0);
        gp_device_free(bl[i].dev);
    }
}

/* -------------------------------------------------------------- all-reduce */

#define NRED 5

/* Values whose sum depends on the order of addition. */
static double red_value(int r, int i, int round) {
    static const double big[MAXK] = {1e16, 1.0, -1e16, 3.0};
    return big[r] * (1.0 + 0.125 * ((i + round) % 3)) + (double)(r + 1) / (i + 3) + round * 1e-3;
}

typedef struct red_run {
    gp_transport *tr;
    int rank, K, rounds;
    uint64_t seed;
    tcheck chk;
} red_run;

static void *red_main(void *arg) {
    red_run *r = arg;
    jitter(&r->seed, 300);
    for (int round = 0; round < r->rounds; round++) {
        double x[NRED], want[NRED];
        for (int i = 0; i < NRED; i++) {
            x[i] = red_value(r->rank, i, round);
            want[i] = red_value(0, i, round);
            for (int q = 1; q < r->K; q++) want[i] += red_value(q, i, round);
        }
        jitter(&r->seed, 100);
        gp_status s = gp_transport_allreduce_sum(r->tr, r->rank, x, NRED);
        if (s != GP_OK) {
            tfail(&r->chk, "%s (rank %d round %d)", gp_last_error(), r->rank, round);
            return NULL;
        }
        if (memcmp(x, want, sizeof x) != 0) tfail(&r->chk, "%s: rank %d round %d", "bits differ", r->rank, round);
    }
    return NULL;
}

static void test_allreduce(bool quick) {
    /* the values must be able to tell the orders apart, or the test could not fail */
    int differ = 0;
    for (int i = 0; i < NRED; i++) {
        double fwd = red_value(0, i, 0), rev = red_value(3, i, 0);
        for (int q = 1; q < 4; q++) fwd += red_value(q, i, 0);
        for (int q = 2; q >= 0; q--) rev += red_value(q, i, 0);
        differ += fwd != rev;
    }
    CHECK(differ > 0);
    uint64_t seed = 99;
    for (int K = 2; K <= MAXK; K++) {
        for (int rep = 0; rep < (quick ? 3 : 8); rep++) {
            gp_transport *tr = make(K, 1, 20);
            red_run runs[MAXK];
            pthread_t th[MAXK];
            int order[MAXK];
            for (int k = 0; k < K; k++) order[k] = k;
            for (int k = K - 1; k > 0; k--) { /* start the threads in a random order */
                int j = (int)(xorshift(&seed) % (uint64_t)(k + 1)), t = order[k];
                order[k] = order[j], order[j] = t;
            }
            for (int i = 0; i < K; i++) {
                int k = order[i];
                runs[k] = (red_run){.tr = tr, .rank = k, .K = K, .rounds = quick ? 40 : 100,
                                    .seed = xorshift(&seed) | 1};
                CHECK(pthread_create(&th[k], NULL, red_main, &runs[k]) == 0);
            }
            for (int k = 0; k < K; k++) pthread_join(th[k], NULL);
            for (int k = 0; k < K; k++) merge(&runs[k].chk, "all-reduce");
            gp_transport_free(tr);
        }
    }
}

/* ------------------------------------------------------- float collectives */

/* Values whose sums in different orders differ, and a NaN now and then for the max. */
static float fvalue(int r, int64_t i, int round) {
    const float base = (float)((i * 7 + round * 3) % 11) - 5.0f;
    return base * (r % 2 ? 1e-7f : 1.0f) + (float)(r + 1) * 0.1f * (float)(i % 3);
}

static const int64_t fsizes[] = {0, 1, 7, 1000};
#define NFSIZES ((int)(sizeof fsizes / sizeof fsizes[0]))
#define FMAX 1000

typedef struct fc_run {
    gp_transport *tr;
    int rank, K, rounds;
    uint64_t seed;
    tcheck chk;
} fc_run;

static void *fc_main(void *arg) {
    fc_run *r = arg;
    static float x[MAXK][FMAX * MAXK], out[MAXK][FMAX * MAXK];
    float *mx = x[r->rank], *mo = out[r->rank];
    jitter(&r->seed, 300);
    for (int round = 0; round < r->rounds; round++) {
        const int64_t n = fsizes[round % NFSIZES];
        const int kind = round / NFSIZES % 3;
        jitter(&r->seed, 50);
        gp_status st;
        if (kind == 0) { /* all-reduce, sum then max */
            for (int64_t i = 0; i < n; i++) mx[i] = fvalue(r->rank, i, round);
            st = gp_transport_allreduce_f32(r->tr, r->rank, mx, n, GP_REDUCE_SUM);
            for (int64_t i = 0; st == GP_OK && i < n; i++) {
                float want = fvalue(0, i, round);
                for (int q = 1; q < r->K; q++) want += fvalue(q, i, round);
                if (memcmp(&mx[i], &want, sizeof want) != 0) {
                    tfail(&r->chk, "%s: rank %d round %d", "sum bits differ", r->rank, round);
                    break;
                }
            }
            for (int64_t i = 0; st == GP_OK && i < n; i++)
                mx[i] = i == 3 && r->rank == r->K - 1 ? NAN : fvalue(r->rank, i, round);
            if (st == GP_OK) st = gp_transport_allreduce_f32(r->tr, r->rank, mx, n, GP_REDUCE_MAX);
            for (int64_t i = 0; st == GP_OK && i < n; i++) {
                float want = fvalue(0, i, round);
                for (int q = 1; q < r->K; q++) want = fmaxf(want, fvalue(q, i, round));
                if (i == 3 ? !isnan(mx[i]) : mx[i] != want) {
                    tfail(&r->chk, "%s: rank %d round %d", "max differs", r->rank, round);
                    break;
                }
            }
        } else if (kind == 1) { /* all-gather */
            for (int64_t i = 0; i < n; i++) mx[i] = fvalue(r->rank, i, round);
            st = gp_transport_allgather_f32(r->tr, r->rank, mx, n, mo);
            for (int q = 0; st == GP_OK && q < r->K; q++)
                for (int64_t i = 0; i < n; i++)
                    if (mo[q * n + i] != fvalue(q, i, round)) {
                        tfail(&r->chk, "%s: rank %d round %d", "gathered block differs", r->rank,
                              round);
                        q = r->K;
                        break;
                    }
        } else { /* reduce-scatter: block q of rank r's x is fvalue(r, q * n + i) */
            for (int64_t i = 0; i < r->K * n; i++) mx[i] = fvalue(r->rank, i, round);
            st = gp_transport_reduce_scatter_f32(r->tr, r->rank, mx, n, mo);
            for (int64_t i = 0; st == GP_OK && i < n; i++) {
                float want = fvalue(0, r->rank * n + i, round);
                for (int q = 1; q < r->K; q++) want += fvalue(q, r->rank * n + i, round);
                if (memcmp(&mo[i], &want, sizeof want) != 0) {
                    tfail(&r->chk, "%s: rank %d round %d", "scattered sum differs", r->rank, round);
                    break;
                }
            }
        }
        if (st != GP_OK) {
            tfail(&r->chk, "%s (rank %d round %d)", gp_last_error(), r->rank, round);
            return NULL;
        }
        /* Interleaved with the double all-reduce: the two kinds of collective share a transport. */
        double d = r->rank;
        if (round % 5 == 0 && gp_transport_allreduce_sum(r->tr, r->rank, &d, 1) != GP_OK) {
            tfail(&r->chk, "%s (rank %d round %d)", gp_last_error(), r->rank, round);
            return NULL;
        }
    }
    return NULL;
}

typedef struct fc_bad {
    gp_transport *tr;
    int rank;
    int64_t n;
    gp_status st;
    char msg[600];
} fc_bad;

static void *fc_bad_main(void *arg) {
    fc_bad *b = arg;
    float x[8] = {0};
    b->st = gp_transport_allreduce_f32(b->tr, b->rank, x, b->n, GP_REDUCE_SUM);
    snprintf(b->msg, sizeof b->msg, "%s", gp_last_error());
    return NULL;
}

static void test_float_collectives(bool quick) {
    /* the values must tell the summation orders apart, or the bit checks could not fail */
    int differ = 0;
    for (int64_t i = 0; i < 50; i++) {
        float fwd = fvalue(0, i, 0), rev = fvalue(3, i, 0);
        for (int q = 1; q < 4; q++) fwd += fvalue(q, i, 0);
        for (int q = 2; q >= 0; q--) rev += fvalue(q, i, 0);
        differ += fwd != rev;
    }
    CHECK(differ > 0);
    uint64_t seed = 1234;
    for (int K = 1; K <= MAXK; K++) {
        gp_transport *tr = make(K, 1, 20);
        fc_run runs[MAXK];
        pthread_t th[MAXK];
        for (int k = 0; k < K; k++) {
            runs[k] = (fc_run){.tr = tr, .rank = k, .K = K, .rounds = quick ? 24 : 60,
                               .seed = xorshift(&seed) | 1};
            CHECK(pthread_create(&th[k], NULL, fc_main, &runs[k]) == 0);
        }
        for (int k = 0; k < K; k++) pthread_join(th[k], NULL);
        for (int k = 0; k < K; k++) merge(&runs[k].chk, "float collectives");
        gp_transport_free(tr);
    }
    /* Ranks that disagree on the size: both fail, the message names both calls. */
    gp_transport *tr = make(2, 1, 20);
    fc_bad b[2] = {{.tr = tr, .rank = 0, .n = 4}, {.tr = tr, .rank = 1, .n = 5}};
    pthread_t th[2];
    for (int k = 0; k < 2; k++) CHECK(pthread_create(&th[k], NULL, fc_bad_main, &b[k]) == 0);
    for (int k = 0; k < 2; k++) pthread_join(th[k], NULL);
    for (int k = 0; k < 2; k++) CHECK(b[k].st != GP_OK);
    CHECK(strstr(b[0].msg, "float all-reduce (sum) of 5 values, but rank 0 called float all-reduce "
                           "(sum) of 4 values") ||
          strstr(b[1].msg, "float all-reduce (sum) of 4 values, but rank 1 called float all-reduce "
                           "(sum) of 5 values"));
    gp_transport_free(tr);
    /* A rank that never comes: the wait ends at the timeout, naming the collective. */
    tr = make(2, 1, 0.2);
    float x[2] = {1, 2};
    CHECK_FAILS(gp_transport_allreduce_f32(tr, 0, x, 2, GP_REDUCE_SUM), GP_IO,
                "timed out after 0.2 s waiting in float all-reduce (sum) #0 (1 of 2 ranks there)");
    CHECK_FAILS(gp_transport_allreduce_f32(tr, 0, x, 2, (gp_reduce_op)7), GP_INVALID_ARGUMENT,
                "op 7");
    gp_transport_free(tr);
}

int main(void) {
    bool quick = getenv("GP_TEST_QUICK") != NULL;
    gp_device *d0, *d1;
    REQUIRE_OK(gp_device_cpu_new("rank0", &d0));
    REQUIRE_OK(gp_device_cpu_new("rank1", &d1));
    test_ownership(d0, d1);
    test_mismatch(d0, d1);
    test_timeouts(d0);
    test_abort();
    test_allreduce(quick);
    test_float_collectives(quick);
    test_schedules(quick);
    gp_device_free(d0);
    gp_device_free(d1);
    return gp_test_finish("test_comm_threads");
}
