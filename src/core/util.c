/* Small shared utilities: FNV-1a hashing, the monotonic and thread CPU clocks and the median of
 * timings. */
#include <stdlib.h>
#include <time.h>

#include "core/clock.h"
#include "core/hash.h"

uint64_t gp_fnv1a64(uint64_t h, const void *data, size_t nbytes) {
    const unsigned char *p = data;
    for (size_t i = 0; i < nbytes; i++) {
        h ^= p[i];
        h *= 0x100000001b3ULL;
    }
    return h;
}

static double seconds_of(clockid_t clock) {
    struct timespec t;
    clock_gettime(clock, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

double gp_now(void) { return seconds_of(CLOCK_MONOTONIC); }

double gp_thread_cpu_now(void) { return seconds_of(CLOCK_THREAD_CPUTIME_ID); }

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

double gp_median(double *v, int n) {
    qsort(v, (size_t)n, sizeof *v, cmp_double);
    return v[n / 2];
}

double gp_mean(const double *v, int n) {
    double sum = 0;
    for (int i = 0; i < n; i++) sum += v[i];
    return sum / n;
}
