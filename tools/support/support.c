/* The tools' support part (see support.h). */
#include "support.h"

#include <cblas.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#ifdef GP_HAVE_MPI
#include <mpi.h>
#endif

double gp_cli_now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

bool gp_cli_bench_sgemm(int64_t m, int64_t n, int64_t k, int reps, double *gflops, char *why,
                        size_t why_size) {
    if (m <= 0 || n <= 0 || k <= 0 || reps < 1 || !gflops) {
        snprintf(why, why_size, "sgemm ceiling: m, n, k and reps must be positive (got %lld, %lld, %lld, %d)",
                 (long long)m, (long long)n, (long long)k, reps);
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
    double best = 1e300;
    for (int r = -1; r < reps; r++) { /* r = -1: the warm-up run */
        double t0 = gp_cli_now();
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (blasint)m, (blasint)n,
                    (blasint)k, 1.0f, a, (blasint)k, b, (blasint)n, 0.0f, c, (blasint)n);
        double dt = gp_cli_now() - t0;
        if (r >= 0 && dt < best) best = dt;
    }
    *gflops = ops / best / 1e9;
    free(a), free(b), free(c);
    return true;
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
