/* The tools' support part (see support.h). */
#include "support.h"

#include "blas_core.h"

#include "gpipe.h"

#include <cblas.h>
#include <pthread.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#ifdef GP_HAVE_MPI
#include <mpi.h>
#endif

/* OpenBLAS's own thread count; weak: another CBLAS lacks it (and then runs as it runs). */
extern void openblas_set_num_threads(int) __attribute__((weak));

static double seconds_of(clockid_t clock) {
    struct timespec t;
    clock_gettime(clock, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

double gp_cli_now(void) { return seconds_of(CLOCK_MONOTONIC); }
double gp_cli_cpu_now(void) { return seconds_of(CLOCK_PROCESS_CPUTIME_ID); }

typedef struct sgemm_part {
    int64_t m, n, k;
    const float *a, *b;
    float *c;
} sgemm_part;

static void *sgemm_part_run(void *arg) {
    const sgemm_part *p = arg;
    if (p->m > 0)
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (blasint)p->m, (blasint)p->n,
                    (blasint)p->k, 1.0f, p->a, (blasint)p->k, p->b, (blasint)p->n, 0.0f, p->c,
                    (blasint)p->n);
    return NULL;
}

/* One run: C's rows in `threads` blocks, each a single-threaded sgemm on a thread of its own
 * (the caller's for block 0), as a gpipe CPU device splits a GEMM; or OpenBLAS's own threads. */
static bool sgemm_once(int64_t m, int64_t n, int64_t k, int threads, bool openblas_threads,
                       const float *a, const float *b, float *c) {
    if (openblas_threads) {
        if (openblas_set_num_threads) openblas_set_num_threads(threads);
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (blasint)m, (blasint)n,
                    (blasint)k, 1.0f, a, (blasint)k, b, (blasint)n, 0.0f, c, (blasint)n);
        if (openblas_set_num_threads) openblas_set_num_threads(1); /* the library's setting */
        return true;
    }
    sgemm_part parts[GP_CLI_SGEMM_MAX_THREADS] = {{0}};
    pthread_t tid[GP_CLI_SGEMM_MAX_THREADS];
    for (int t = 0; t < threads; t++) {
        const int64_t lo = m * t / threads, hi = m * (t + 1) / threads;
        parts[t] = (sgemm_part){hi - lo, n, k, a + lo * k, b, c + lo * n};
    }
    int started = 1;
    for (; started < threads; started++)
        if (pthread_create(&tid[started], NULL, sgemm_part_run, &parts[started]) != 0) break;
    sgemm_part_run(&parts[0]);
    for (int t = 1; t < started; t++) pthread_join(tid[t], NULL);
    for (int t = started; t < threads; t++) sgemm_part_run(&parts[t]); /* no thread: here */
    return started == threads;
}

bool gp_cli_bench_sgemm(int64_t m, int64_t n, int64_t k, int threads, bool openblas_threads,
                        int reps, double *gflops, char *why, size_t why_size) {
    if (m <= 0 || n <= 0 || k <= 0 || reps < 1 || threads < 1 ||
        threads > GP_CLI_SGEMM_MAX_THREADS || !gflops) {
        snprintf(why, why_size,
                 "sgemm ceiling: m, n, k and reps must be positive and threads 1 to %d (got "
                 "%lld, %lld, %lld, %d, %d)",
                 GP_CLI_SGEMM_MAX_THREADS, (long long)m, (long long)n, (long long)k, reps,
                 threads);
        return false;
    }
    float *a = malloc((size_t)(m * k) * sizeof *a);
    float *b = malloc((size_t)(k * n) * sizeof *b);
    float *c = malloc((size_t)(m * n) * sizeof *c);
    if (!a || !b || !c) {
        free(a), free(b), free(c);
        snprintf(why, why_size, "sgemm ceiling: cannot allocate %lldx%lldx%lld matrices",
                 (long long)m, (long long)n, (long long)k);
        return false;
    }
    for (int64_t i = 0; i < m * k; i++) a[i] = (float)(i % 13) * 0.01f;
    for (int64_t i = 0; i < k * n; i++) b[i] = (float)(i % 7) * 0.01f;
    const double ops = 2.0 * (double)m * (double)n * (double)k;
    /* Each part single-threaded, as a CPU device sets it: OpenBLAS's own default is every core,
     * which made "1 thread" time all of them where no device had been made yet (gpipe bench
     * --workload G1, gpipe plan's measured GFLOP/s). */
    if (!openblas_threads && openblas_set_num_threads) openblas_set_num_threads(1);
    double best = 1e300;
    bool all_threads = true;
    for (int r = -1; r < reps; r++) { /* r = -1: the warm-up run */
        double t0 = gp_cli_now();
        all_threads &= sgemm_once(m, n, k, threads, openblas_threads, a, b, c);
        double dt = gp_cli_now() - t0;
        if (r >= 0 && dt < best) best = dt;
    }
    *gflops = ops / best / 1e9;
    free(a), free(b), free(c);
    if (!all_threads) snprintf(why, why_size, "sgemm ceiling: cannot start %d threads", threads);
    return all_threads;
}

bool gp_cli_bench_start(const char *name, int argc, char **argv, int defreps, int maxreps,
                        int *threads, int *reps, gp_device **dev, int *exit_code) {
    gp_cli_blas_core_check(name, argv);
    *threads = argc > 1 ? atoi(argv[1]) : 1;
    *reps = argc > 2 ? atoi(argv[2]) : defreps;
    *dev = NULL;
    if (*threads < 1 || *reps < 1 || *reps > maxreps) {
        fprintf(stderr, "usage: %s [threads >= 1 (1)] [repetitions 1..%d (%d)]\n", name,
                maxreps, defreps);
        *exit_code = 2;
        return false;
    }
    if (gp_device_cpu_new_threads("bench", *threads, dev) != GP_OK) {
        fprintf(stderr, "%s: %s\n", name, gp_last_error());
        *exit_code = 1;
        return false;
    }
    return true;
}

float *gp_cli_bench_normal(int64_t n, uint32_t stream) {
    float *p = malloc((size_t)(n > 0 ? n : 1) * sizeof *p);
    if (!p) {
        fprintf(stderr, "benchmark: out of host memory for %lld floats\n", (long long)n);
        exit(1);
    }
    gp_rng_stream s = {.seed = 7, .purpose = GP_RNG_TEST, .a = stream};
    gp_rng_normal(&s, 0, p, n);
    return p;
}

bool gp_cli_parse_partition(const char *text, int *first, int cap, int *n, char *why,
                            size_t why_size) {
    *n = 0;
    const char *p = text;
    for (;;) {
        while (*p == ' ') p++;
        if (*p < '0' || *p > '9') {
            snprintf(why, why_size,
                     "partition '%s': expected a layer index at position %d, e.g. 0,5,9,12", text,
                     (int)(p - text));
            return false;
        }
        errno = 0;
        char *end;
        long v = strtol(p, &end, 10);
        if (errno || v > 1000000000L) {
            snprintf(why, why_size, "partition '%s': layer index out of range", text);
            return false;
        }
        if (*n >= cap) {
            snprintf(why, why_size, "partition '%s': more than %d entries", text, cap);
            return false;
        }
        first[(*n)++] = (int)v;
        p = end;
        while (*p == ' ') p++;
        if (*p == '\0') return true;
        if (*p != ',') {
            snprintf(why, why_size,
                     "partition '%s': unexpected '%c' at position %d; expected a comma-separated "
                     "list such as 0,5,9,12",
                     text, *p, (int)(p - text));
            return false;
        }
        p++;
    }
}

void gp_cli_mpi_abort(int code) {
    fflush(stdout);
    fflush(stderr);
#ifdef GP_HAVE_MPI
    int inited = 0, finalized = 0;
    MPI_Initialized(&inited);
    MPI_Finalized(&finalized);
    if (inited && !finalized) MPI_Abort(MPI_COMM_WORLD, code);
#else
    (void)code;
#endif
}
