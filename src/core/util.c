/* Small shared utilities: FNV-1a hashing and the monotonic clock. */
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
