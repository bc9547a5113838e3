/* Core: shapes, tensors, the counting allocator and its limit, the
 * counter-based RNG, status tables, hashing and the median of timings. */
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "core/clock.h"
#include "core/device.h"
#include "core/hash.h"
#include "testutil.h"

static void test_shapes(void) {
    gp_shape s = gp_shape3(2, 3, 4);
    char buf[64];
    CHECK_EQ_INT(gp_shape_nelem(&s), 24);
    CHECK(strcmp(gp_shape_str(&s, buf, sizeof buf), "(2, 3, 4)") == 0);
    gp_shape t = gp_shape3(2, 3, 4);
    CHECK(gp_shape_equal(&s, &t));
    t.dim[2] = 5;
    CHECK(!gp_shape_equal(&s, &t));
    CHECK_EQ_INT(gp_shape_nelem(&(gp_shape){0, {0}}), 1);
}

static void test_device_accounting(void) {
    gp_device *d;
    REQUIRE_OK(gp_device_cpu_new("acct", &d));
    gp_tensor a, b, c;
    REQUIRE_OK(gp_tensor_alloc(d, GP_MEM_PARAMS, gp_shape2(10, 10), GP_F32, &a));
    REQUIRE_OK(gp_tensor_zeros(d, GP_MEM_ACTIVATIONS, gp_shape1(1000), GP_F32, &b));
    CHECK(((uintptr_t)a.data % 64) == 0);
    CHECK(F32(b)[999] == 0.0f);
    gp_mem_stats st;
    gp_device_mem_stats(d, &st);
    CHECK_EQ_INT(st.live[GP_MEM_PARAMS], 400);
    CHECK_EQ_INT(st.live[GP_MEM_ACTIVATIONS], 4000);
    CHECK_EQ_INT(st.live_total, 4400);
    gp_tensor_release(&b);
    REQUIRE_OK(gp_tensor_alloc(d, GP_MEM_ACTIVATIONS, gp_shape1(500), GP_I32, &c));
    gp_device_mem_stats(d, &st);
    CHECK_EQ_INT(st.live[GP_MEM_ACTIVATIONS], 2000);
    CHECK_EQ_INT(st.peak[GP_MEM_ACTIVATIONS], 4000);
    CHECK_EQ_INT(st.peak_total, 4400);
    gp_tensor_release(&c);
    gp_tensor_release(&c); /* twice is harmless */
    gp_device_reset_peaks(d);
    gp_device_mem_stats(d, &st);
    CHECK_EQ_INT(st.peak_total, 400);

    /* The limit: a clean error naming device, category, request and limit. */
    REQUIRE_OK(gp_device_set_limit(d, 1000));
    gp_tensor big;
    CHECK_FAILS(gp_tensor_alloc(d, GP_MEM_WORKSPACE, gp_shape1(200), GP_F32, &big), GP_MEMORY_LIMIT,
                "device acct: allocating 800 bytes of workspace would exceed its limit of 1000 bytes");
    CHECK(big.data == NULL);
    gp_tensor ok;
    CHECK_OK(gp_tensor_alloc(d, GP_MEM_WORKSPACE, gp_shape1(150), GP_F32, &ok));
    gp_tensor_release(&ok);
    gp_status s;
    CHECK(gp_device_alloc(d, GP_MEM_WORKSPACE, SIZE_MAX - 10, &s) == NULL);
    CHECK_EQ_INT(s, GP_MEMORY_LIMIT);
    /* Host memory counted for the device's work: live and under the limit as an allocation. */
    CHECK_FAILS(gp_device_count_host(d, GP_MEM_GRADS, 700, "a bucket's host copy"),
                GP_MEMORY_LIMIT, "allocating 700 bytes of gradients would exceed its limit of "
                                 "1000 bytes");
    CHECK(strstr(gp_last_error(), "host memory for a bucket's host copy") != NULL);
    CHECK_OK(gp_device_count_host(d, GP_MEM_GRADS, 300, "a bucket's host copy"));
    gp_device_mem_stats(d, &st);
    CHECK_EQ_INT(st.live[GP_MEM_GRADS], 300);
    CHECK_EQ_INT(st.live_total, 700);
    gp_device_uncount_host(d, GP_MEM_GRADS, 300);
    CHECK_FAILS(gp_device_count_host(d, GP_MEM_NCATEGORIES, 1, "x"), GP_INVALID_ARGUMENT,
                "category 5");
    gp_tensor_release(&a);
    gp_device_mem_stats(d, &st);
    CHECK_EQ_INT(st.live_total, 0);
    CHECK_FAILS(gp_tensor_alloc(d, GP_MEM_PARAMS, gp_shape2(-1, 3), GP_F32, &a), GP_SHAPE, "(-1, 3)");
    gp_device_free(d);
}

/* A device kind whose memory the host cannot reach (host_memory false, as a GPU's), backed by
 * malloc, counting its copies; with copy_peer or without. */
typedef struct far_ctx {
    int to_host, from_host, peer;
    bool fail_peer;
} far_ctx;
static gp_status far_alloc(void *ctx, size_t n, void **p) {
    (void)ctx;
    *p = aligned_alloc(64, (n + 63) / 64 * 64);
    return *p ? GP_OK : GP_OUT_OF_MEMORY;
}
static void far_free(void *ctx, void *p) { (void)ctx, free(p); }
static gp_status far_copy(void *ctx, void *dst, const void *src, size_t n, gp_copy_kind kind) {
    far_ctx *c = ctx;
    c->to_host += kind == GP_COPY_DEVICE_TO_HOST;
    c->from_host += kind == GP_COPY_HOST_TO_DEVICE;
    memcpy(dst, src, n);
    return GP_OK;
}
static gp_status far_fill(void *ctx, void *dst, size_t n, int byte) {
    (void)ctx, memset(dst, byte, n);
    return GP_OK;
}
static gp_status far_sync(void *ctx) { return (void)ctx, GP_OK; }
static gp_status far_peer(void *ctx, void *dst, void *from, const void *src, size_t n) {
    far_ctx *c = ctx;
    if (c->fail_peer) return gp_error(GP_INTERNAL, "the link is down");
    ((far_ctx *)from)->peer++;
    c->peer++;
    memcpy(dst, src, n);
    return GP_OK;
}

/* Between two devices of a kind with copy_peer, gp_tensor_copy copies directly (no host copy);
 * without it, through host memory; a failing direct copy names both devices. */
static void test_device_peer_copy(void) {
    const gp_device_iface with = {.kind = "far", .alloc = far_alloc, .free = far_free,
                                  .copy = far_copy, .fill = far_fill, .sync = far_sync,
                                  .copy_peer = far_peer};
    gp_device_iface without = with;
    without.copy_peer = NULL;
    gp_device *cpu = NULL; /* its op table stands in for the far kind's (no op runs here) */
    REQUIRE_OK(gp_device_cpu_new("table", &cpu));
    const struct gp_kernels *table = gp_device_kernels(cpu);
    for (int peer = 1; peer >= 0; peer--) {
        far_ctx ca = {0}, cb = {0};
        gp_device *a = NULL, *b = NULL;
        REQUIRE_OK(gp_device_new("far0", peer ? &with : &without, &ca, table, &a));
        REQUIRE_OK(gp_device_new("far1", peer ? &with : &without, &cb, table, &b));
        gp_tensor x, y;
        REQUIRE_OK(gp_tensor_alloc(a, GP_MEM_ACTIVATIONS, gp_shape1(100), GP_F32, &x));
        REQUIRE_OK(gp_tensor_alloc(b, GP_MEM_ACTIVATIONS, gp_shape1(100), GP_F32, &y));
        float v[100], back[100];
        for (int i = 0; i < 100; i++) v[i] = (float)i * 0.5f;
        CHECK_OK(gp_tensor_from_host(&x, v, sizeof v));
        ca = (far_ctx){0};
        CHECK_OK(gp_tensor_copy(&y, &x));
        CHECK_OK(gp_tensor_to_host(&y, back, sizeof back));
        CHECK(memcmp(v, back, sizeof v) == 0);
        CHECK_EQ_INT(ca.to_host, peer ? 0 : 1); /* staged: out of a, into b */
        CHECK_EQ_INT(cb.from_host, peer ? 0 : 1);
        CHECK_EQ_INT(cb.peer, peer);
        CHECK_EQ_INT(ca.peer, peer);
        if (peer) {
            cb.fail_peer = true;
            CHECK_FAILS(gp_tensor_copy(&y, &x), GP_INTERNAL,
                        "copy of 400 bytes from device far0 to device far1: the link is down");
        }
        gp_tensor_release(&x);
        gp_tensor_release(&y);
        gp_device_free(a);
        gp_device_free(b);
    }
    gp_device_free(cpu);
}

/* Freed blocks are reused by exact size; they never count as live, and a
 * limit drops the cache rather than failing. */
static void test_device_cache(void) {
    gp_device *d;
    REQUIRE_OK(gp_device_cpu_new("cache", &d));
    gp_tensor a, b;
    REQUIRE_OK(gp_tensor_alloc(d, GP_MEM_ACTIVATIONS, gp_shape1(1000), GP_F32, &a));
    void *first = a.data;
    gp_tensor_release(&a);
    gp_mem_stats st;
    gp_device_mem_stats(d, &st);
    CHECK_EQ_INT(st.live_total, 0);
    bool cache_on = st.cached > 0; /* off under AddressSanitizer */
    if (cache_on) CHECK_EQ_INT(st.cached, 4032); /* padded to 64 bytes */
    REQUIRE_OK(gp_tensor_alloc(d, GP_MEM_PARAMS, gp_shape1(1000), GP_F32, &a));
    gp_device_mem_stats(d, &st);
    CHECK_EQ_INT(st.live[GP_MEM_PARAMS], 4000);
    CHECK_EQ_INT(st.live[GP_MEM_ACTIVATIONS], 0);
    if (cache_on) {
        CHECK(a.data == first);
        CHECK_EQ_INT(st.cache_hits, 1);
        CHECK_EQ_INT(st.cached, 0);
    }
    REQUIRE_OK(gp_tensor_alloc(d, GP_MEM_PARAMS, gp_shape1(2000), GP_F32, &b));
    gp_tensor_release(&b);
    /* A limit counts live bytes; the cached 8000 give way. */
    REQUIRE_OK(gp_device_set_limit(d, 4000 + 6000));
    REQUIRE_OK(gp_tensor_alloc(d, GP_MEM_WORKSPACE, gp_shape1(1500), GP_F32, &b));
    gp_device_mem_stats(d, &st);
    CHECK_EQ_INT(st.live_total, 10000);
    CHECK_EQ_INT(st.cached, 0);
    gp_tensor_release(&b);
    gp_tensor_release(&a);
    gp_device_trim(d);
    gp_device_mem_stats(d, &st);
    CHECK_EQ_INT(st.cached, 0);
    CHECK_EQ_INT(st.live_total, 0);
    gp_device_free(d);
}

static void test_rng(void) {
    gp_rng_stream s = {.seed = 42, .purpose = GP_RNG_INIT, .a = 3, .b = 1};
    float u[1000], v[1000], w[10];
    gp_rng_uniform(&s, 0, u, 1000);
    gp_rng_uniform(&s, 0, v, 1000);
    CHECK(memcmp(u, v, sizeof u) == 0);
    /* Any window of the stream equals the same slice of the whole. */
    gp_rng_uniform(&s, 537, w, 10);
    CHECK(memcmp(w, u + 537, sizeof w) == 0);
    double mean = 0;
    for (int i = 0; i < 1000; i++) {
        CHECK(u[i] >= 0.0f && u[i] < 1.0f);
        mean += u[i];
    }
    mean /= 1000;
    CHECK_NEAR(mean, 0.5, 0.05);
    /* Different ids, different streams. */
    gp_rng_stream s2 = s;
    s2.b = 2;
    gp_rng_uniform(&s2, 0, v, 1000);
    CHECK(memcmp(u, v, sizeof u) != 0);
    gp_rng_stream s3 = s;
    s3.seed = 43;
    gp_rng_uniform(&s3, 0, v, 1000);
    CHECK(memcmp(u, v, sizeof u) != 0);
    /* Normal: moments, and windows agree with the whole. */
    static float n[20000];
    gp_rng_normal(&s, 0, n, 20000);
    double m1 = 0, m2 = 0;
    for (int i = 0; i < 20000; i++) m1 += n[i], m2 += (double)n[i] * n[i];
    m1 /= 20000;
    m2 /= 20000;
    CHECK_NEAR(m1, 0.0, 0.03);
    CHECK_NEAR(m2, 1.0, 0.05);
    float nw[7];
    gp_rng_normal(&s, 1001, nw, 7);
    CHECK(memcmp(nw, n + 1001, sizeof nw) == 0);
    /* A fill large enough to be split over threads equals the same elements made in windows
     * too small to be split (one thread each), from an odd start so that the parts' seams fall
     * inside Box-Muller pairs. */
    enum { BIG = 3 * (1 << 20) + 5, WINDOW = 100003 };
    float *big = malloc(BIG * sizeof *big), *one = malloc(BIG * sizeof *one);
    if (!big || !one) {
        CHECK(!"out of memory");
        free(big);
        free(one);
        return;
    }
    for (int normal = 0; normal < 2; normal++) {
        (normal ? gp_rng_normal : gp_rng_uniform)(&s, 7, big, BIG);
        for (int64_t i = 0; i < BIG; i += WINDOW)
            (normal ? gp_rng_normal : gp_rng_uniform)(&s, 7 + (uint64_t)i, one + i,
                                                      BIG - i < WINDOW ? BIG - i : WINDOW);
        CHECK(memcmp(big, one, BIG * sizeof *big) == 0);
    }
    free(big);
    free(one);
    /* Philox4x32-10 known-answer test (Random123 kat_vectors: ctr 0, key 0). */
    uint32_t out[4];
    gp_rng_stream z = {0};
    gp_rng_block(&z, 0, out);
    CHECK_EQ_INT(out[0], 0x6627e8d5u);
    CHECK_EQ_INT(out[1], 0xe169c58du);
    CHECK_EQ_INT(out[2], 0xbc57ac4cu);
    CHECK_EQ_INT(out[3], 0x9b00dbd8u);
}

static void test_tables(void) {
    CHECK(strcmp(gp_status_name(GP_MEMORY_LIMIT), "GP_MEMORY_LIMIT") == 0);
    CHECK(strcmp(gp_status_message(GP_SHAPE), "shape mismatch") == 0);
    CHECK(strcmp(gp_mem_category_name(GP_MEM_OPTIM), "optimizer_state") == 0);
    CHECK(strcmp(gp_status_name((gp_status)99), "GP_UNKNOWN") == 0);
    /* FNV-1a 64 test vectors. */
    CHECK(gp_fnv1a64(GP_FNV1A64_INIT, "", 0) == 0xcbf29ce484222325ULL);
    CHECK(gp_fnv1a64(GP_FNV1A64_INIT, "a", 1) == 0xaf63dc4c8601ec8cULL);
    CHECK(gp_fnv1a64(GP_FNV1A64_INIT, "foobar", 6) == 0x85944171f73967e8ULL);
}

/* The median of timings: the middle one, the upper middle for an even count, any order in. */
static void test_median(void) {
    double odd[] = {3.0, 1.0, 2.0}, even[] = {4.0, 1.0, 3.0, 2.0}, one[] = {7.5};
    CHECK(gp_median(odd, 3) == 2.0);
    CHECK(gp_median(even, 4) == 3.0);
    CHECK(gp_median(one, 1) == 7.5);
    CHECK(even[0] == 1.0 && even[3] == 4.0); /* sorted in place */
}

/* The mean of timings; the thread's CPU clock stands still while the thread sleeps (a sleep of
 * 50 ms: it may wake late, never early; 20 ms of CPU would be a whole sleep's worth, far past
 * what taking a timestamp and going to sleep cost) and moves while it works. */
static void test_clocks(void) {
    const double v[] = {1.0, 2.0, 6.0};
    CHECK(gp_mean(v, 3) == 3.0);
    const double w0 = gp_now(), c0 = gp_thread_cpu_now();
    const struct timespec nap = {.tv_sec = 0, .tv_nsec = 50 * 1000 * 1000};
    nanosleep(&nap, NULL);
    const double w1 = gp_now(), c1 = gp_thread_cpu_now();
    CHECK(w1 - w0 >= 0.05);
    CHECK(c1 - c0 >= 0 && c1 - c0 < 0.02);
    volatile double x = 0;
    while (gp_thread_cpu_now() - c1 < 0.005) x += 1.0; /* ends only once the clock has moved */
    CHECK(x > 0);
}

/* The bound on a device's waits: the sync and copies to or from the host take it first (a
 * copy within the device does not wait), and its error is theirs; unset, nothing is called. */
typedef struct bound_log {
    int calls;
    gp_status answer;
    char last[64];
} bound_log;
static gp_status bound_wait(void *ctx, const char *what) {
    bound_log *l = ctx;
    l->calls++;
    snprintf(l->last, sizeof l->last, "%s", what);
    return l->answer == GP_OK ? GP_OK : gp_error(l->answer, "bound: gave up on %s", what);
}

static void test_device_bound_waits(void) {
    gp_device *d;
    REQUIRE_OK(gp_device_cpu_new("bound", &d));
    gp_tensor a, b;
    REQUIRE_OK(gp_tensor_alloc(d, GP_MEM_ACTIVATIONS, gp_shape1(4), GP_F32, &a));
    REQUIRE_OK(gp_tensor_alloc(d, GP_MEM_ACTIVATIONS, gp_shape1(4), GP_F32, &b));
    float h[4] = {1, 2, 3, 4};
    bound_log l = {0, GP_OK, ""};
    gp_device_bound_waits(d, bound_wait, &l);
    CHECK_OK(gp_device_sync(d));
    CHECK(l.calls == 1 && strcmp(l.last, "a device synchronize") == 0);
    CHECK_OK(gp_tensor_from_host(&a, h, sizeof h));
    CHECK(l.calls == 2 && strcmp(l.last, "a copy from the host to the device") == 0);
    CHECK_OK(gp_tensor_copy(&b, &a));
    CHECK_EQ_INT(l.calls, 2);
    CHECK_OK(gp_tensor_to_host(&b, h, sizeof h));
    CHECK(l.calls == 3 && strcmp(l.last, "a copy from the device to the host") == 0);
    l.answer = GP_IO;
    CHECK_FAILS(gp_device_sync(d), GP_IO, "bound: gave up on a device synchronize");
    CHECK_FAILS(gp_tensor_to_host(&b, h, sizeof h), GP_IO,
                "bound: gave up on a copy from the device to the host");
    gp_device_bound_waits(d, NULL, NULL);
    CHECK_OK(gp_device_sync(d));
    CHECK_EQ_INT(l.calls, 5);
    CHECK_OK(gp_device_wait_bounded(NULL, "nothing"));
    gp_tensor_release(&a);
    gp_tensor_release(&b);
    gp_device_free(d);
}

int main(void) {
    test_median();
    test_clocks();
    test_shapes();
    test_device_accounting();
    test_device_cache();
    test_device_peer_copy();
    test_device_bound_waits();
    test_rng();
    test_tables();
    return gp_test_finish("test_core");
}
