/* The CPU device's thread pool. A job is published by bumping `generation` (release) after its
 * fields are written; every worker runs its share and counts itself off `pending`, so the next
 * job's fields are written only once no worker can still be reading this one's. Waiting spins a
 * little first (kernels come back to back in a training step, and a futex wake-up costs more
 * than most of them), then sleeps on a condition variable under the mutex, so that a wake-up
 * cannot be lost between the check and the wait. */
#include "kernels/cpu/pool.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "core/device.h"
#include "core/thread_name.h"

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define CPU_RELAX() _mm_pause()
#else
#define CPU_RELAX() ((void)0)
#endif

/* Spin iterations before sleeping: a few tens of microseconds of pause instructions, longer
 * than the gap between two kernels of a step, far shorter than the gap between two steps. */
enum { SPIN_ITERATIONS = 20000 };

typedef struct worker_arg {
    gp_cpu_pool *pool;
    int index; /* 1 .. nthreads - 1 */
} worker_arg;

struct gp_cpu_pool {
    int nthreads;
    bool eager;
    pthread_t *threads;
    worker_arg *args;
    pthread_mutex_t mu;
    pthread_cond_t wake, done;
    /* The job: written by the caller while no worker reads it (pending == 0). */
    gp_cpu_job fn;
    void *ctx;
    int nt;
    atomic_uint_fast64_t generation;
    atomic_int pending;
    atomic_bool stop;
};

static void *worker_main(void *arg) {
    const worker_arg *w = arg;
    gp_cpu_pool *p = w->pool;
    gp_thread_name("gp-pool-%d", w->index); /* the caller runs part 0 */
    uint_fast64_t seen = 0;
    for (;;) {
        uint_fast64_t g = atomic_load_explicit(&p->generation, memory_order_acquire);
        for (int i = 0; g == seen && i < SPIN_ITERATIONS; i++) {
            CPU_RELAX();
            g = atomic_load_explicit(&p->generation, memory_order_acquire);
        }
        if (g == seen) {
            pthread_mutex_lock(&p->mu);
            while ((g = atomic_load_explicit(&p->generation, memory_order_acquire)) == seen &&
                   !atomic_load_explicit(&p->stop, memory_order_acquire))
                pthread_cond_wait(&p->wake, &p->mu);
            pthread_mutex_unlock(&p->mu);
            if (g == seen) return NULL; /* stopped */
        }
        seen = g;
        if (w->index < p->nt) p->fn(p->ctx, w->index, p->nt);
        if (atomic_fetch_sub_explicit(&p->pending, 1, memory_order_acq_rel) == 1) {
            pthread_mutex_lock(&p->mu);
            pthread_cond_signal(&p->done);
            pthread_mutex_unlock(&p->mu);
        }
    }
}

static void stop_workers(gp_cpu_pool *p, int started) {
    pthread_mutex_lock(&p->mu);
    atomic_store_explicit(&p->stop, true, memory_order_release);
    pthread_cond_broadcast(&p->wake);
    pthread_mutex_unlock(&p->mu);
    for (int i = 0; i < started; i++) pthread_join(p->threads[i], NULL);
}

gp_status gp_cpu_pool_new(int nthreads, gp_cpu_pool **out) {
    if (!out) return gp_error(GP_INVALID_ARGUMENT, "gp_cpu_pool_new: out is NULL");
    *out = NULL;
    if (nthreads < 1 || nthreads > 4096)
        return gp_error(GP_INVALID_ARGUMENT,
                        "gp_cpu_pool_new: %d threads (expected 1 to 4096)", nthreads);
    gp_cpu_pool *p = calloc(1, sizeof *p);
    if (!p) return gp_error(GP_OUT_OF_MEMORY, "gp_cpu_pool_new: out of memory");
    p->nthreads = nthreads;
    atomic_init(&p->generation, 0);
    atomic_init(&p->pending, 0);
    atomic_init(&p->stop, false);
    if (nthreads == 1) {
        *out = p;
        return GP_OK;
    }
    p->threads = calloc((size_t)nthreads - 1, sizeof *p->threads);
    p->args = calloc((size_t)nthreads - 1, sizeof *p->args);
    if (!p->threads || !p->args) {
        free(p->threads), free(p->args), free(p);
        return gp_error(GP_OUT_OF_MEMORY, "gp_cpu_pool_new: out of memory for %d threads",
                        nthreads);
    }
    pthread_mutex_init(&p->mu, NULL);
    pthread_cond_init(&p->wake, NULL);
    pthread_cond_init(&p->done, NULL);
    for (int i = 0; i < nthreads - 1; i++) {
        p->args[i] = (worker_arg){.pool = p, .index = i + 1};
        if (pthread_create(&p->threads[i], NULL, worker_main, &p->args[i]) != 0) {
            stop_workers(p, i);
            pthread_cond_destroy(&p->done), pthread_cond_destroy(&p->wake);
            pthread_mutex_destroy(&p->mu);
            free(p->threads), free(p->args), free(p);
            return gp_error(GP_INTERNAL, "gp_cpu_pool_new: cannot start thread %d of %d", i + 2,
                            nthreads);
        }
    }
    *out = p;
    return GP_OK;
}

void gp_cpu_pool_free(gp_cpu_pool *p) {
    if (!p) return;
    if (p->nthreads > 1) {
        stop_workers(p, p->nthreads - 1);
        pthread_cond_destroy(&p->done), pthread_cond_destroy(&p->wake);
        pthread_mutex_destroy(&p->mu);
    }
    free(p->threads), free(p->args), free(p);
}

int gp_cpu_pool_threads(const gp_cpu_pool *p) { return p ? p->nthreads : 1; }

/* By kind, not by table: the kernels call this, and the table's file refers to the kernels. */
gp_cpu_pool *gp_cpu_pool_of(gp_device *dev) {
    return dev && strcmp(gp_device_kind(dev), "cpu") == 0 ? gp_device_context(dev) : NULL;
}

void gp_cpu_pool_set_eager(gp_cpu_pool *p, bool eager) {
    if (p) p->eager = eager;
}

bool gp_cpu_pool_eager(const gp_cpu_pool *p) { return p && p->eager; }

void gp_cpu_pool_run(gp_cpu_pool *p, int wanted, gp_cpu_job fn, void *ctx) {
    const int threads = gp_cpu_pool_threads(p);
    const int nt = wanted < 1 || wanted > threads ? threads : wanted;
    if (nt == 1) {
        fn(ctx, 0, 1);
        return;
    }
    p->fn = fn, p->ctx = ctx, p->nt = nt;
    atomic_store_explicit(&p->pending, p->nthreads - 1, memory_order_relaxed);
    pthread_mutex_lock(&p->mu);
    atomic_fetch_add_explicit(&p->generation, 1, memory_order_release);
    pthread_cond_broadcast(&p->wake);
    pthread_mutex_unlock(&p->mu);
    fn(ctx, 0, nt);
    for (int i = 0; i < SPIN_ITERATIONS; i++) {
        if (atomic_load_explicit(&p->pending, memory_order_acquire) == 0) return;
        CPU_RELAX();
    }
    pthread_mutex_lock(&p->mu);
    while (atomic_load_explicit(&p->pending, memory_order_acquire) != 0)
        pthread_cond_wait(&p->done, &p->mu);
    pthread_mutex_unlock(&p->mu);
}

typedef struct range_job {
    int64_t n, align;
    gp_cpu_range_fn fn;
    void *ctx;
} range_job;

static void range_part(void *ctx, int t, int nt) {
    const range_job *j = ctx;
    int64_t lo, hi;
    gp_cpu_split(j->n, t, nt, j->align, &lo, &hi);
    if (hi > lo) j->fn(j->ctx, lo, hi);
}

void gp_cpu_parallel_for(gp_cpu_pool *p, int64_t n, int64_t align, int64_t grain,
                         gp_cpu_range_fn fn, void *ctx) {
    if (n <= 0) return;
    if (align < 1) align = 1;
    if (grain < 1 || gp_cpu_pool_eager(p)) grain = 1;
    const int threads = gp_cpu_pool_threads(p);
    int64_t want = n / grain;
    const int64_t units = (n + align - 1) / align;
    if (want > units) want = units;
    if (want > threads) want = threads;
    if (want <= 1) {
        fn(ctx, 0, n);
        return;
    }
    range_job j = {.n = n, .align = align, .fn = fn, .ctx = ctx};
    gp_cpu_pool_run(p, (int)want, range_part, &j);
}
