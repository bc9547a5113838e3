/* The CPU device's threads: a small pool that runs one job on all of them and returns when every
 * thread is done. Every CPU kernel splits its work over the pool in fixed, contiguous parts (the
 * same split for the same thread count, so the same bits run after run), and GEMMs are split the
 * same way, each part one single-threaded BLAS call: the GEMMs and everything around them run on
 * the same threads, and no second pool (OpenBLAS's own) spins against this one. Workers sleep on
 * a condition variable between jobs after a short spin, so an idle device costs nothing. */
#ifndef GP_KERNELS_CPU_POOL_H
#define GP_KERNELS_CPU_POOL_H

#include <stdbool.h>
#include <stdint.h>

#include "core/error.h"
#include "gpipe.h"

typedef struct gp_cpu_pool gp_cpu_pool;

/* The thread pool of a CPU device (its context); NULL for NULL (a host view: its kernels run on
 * the caller's thread alone) or a device of another kind. */
gp_cpu_pool *gp_cpu_pool_of(gp_device *dev);

/* A pool of nthreads threads in all: the caller's and nthreads - 1 workers. */
gp_status gp_cpu_pool_new(int nthreads, gp_cpu_pool **out);
/* Stops and joins the workers; NULL is ignored. */
void gp_cpu_pool_free(gp_cpu_pool *p);
/* Threads in the pool (1 for NULL). */
int gp_cpu_pool_threads(const gp_cpu_pool *p);
/* Eager: every split uses all the threads it can, however little work each gets (the kernels'
 * thresholds for waking threads are ignored), so that tests on small shapes run the split
 * paths. Off by default. */
void gp_cpu_pool_set_eager(gp_cpu_pool *p, bool eager);
bool gp_cpu_pool_eager(const gp_cpu_pool *p);

/* Calls fn(ctx, t, nt) for t = 0 .. nt - 1, each on its own thread (t = 0 on the caller's), and
 * returns when all have returned; nt = min(wanted, threads) (wanted < 1: all). One job at a time
 * per pool: a device is used by one thread at a time. A NULL pool runs fn(ctx, 0, 1). */
typedef void (*gp_cpu_job)(void *ctx, int t, int nt);
void gp_cpu_pool_run(gp_cpu_pool *p, int wanted, gp_cpu_job fn, void *ctx);

/* Runs fn(ctx, lo, hi) over parts of [0, n) that cover it in order (gp_cpu_split with align),
 * one part per thread, on as many threads as give each at least `grain` items (grain: the
 * smallest share worth waking a thread for); n <= 0 does nothing. The parts differ with the
 * thread count, so fn must compute each item the same way whichever part holds it. */
typedef void (*gp_cpu_range_fn)(void *ctx, int64_t lo, int64_t hi);
void gp_cpu_parallel_for(gp_cpu_pool *p, int64_t n, int64_t align, int64_t grain,
                         gp_cpu_range_fn fn, void *ctx);

/* Part t of nt of [0, n): contiguous, in order, sizes differing by at most `align` (parts start
 * at multiples of align, align >= 1). */
static inline void gp_cpu_split(int64_t n, int t, int nt, int64_t align, int64_t *lo,
                                int64_t *hi) {
    const int64_t units = (n + align - 1) / align;
    const int64_t a = units * t / nt, b = units * (t + 1) / nt;
    *lo = a * align < n ? a * align : n;
    *hi = b * align < n ? b * align : n;
}

#endif
