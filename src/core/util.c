/* Small shared utilities: FNV-1a hashing, the monotonic clock and the median of timings. */
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

double gp_now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

double gp_median(double *v, int n) {
    qsort(v, (size_t)n, sizeof *v, cmp_double);
    return v[n / 2];
}
