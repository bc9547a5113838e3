/* Data order: a permutation keyed by (seed, epoch) through the counter-based
 * RNG, so every machine, every stage count and every resume sees the same
 * order without carrying generator state. */
#include "core/error.h"

/* A uniform integer in [0, bound) by rejection: draws below 2^64 mod bound
 * are refused so every residue has the same number of accepted draws.
 * *k is the stream position, advanced once per draw. */
static uint64_t uniform_below(const gp_rng_stream *s, uint64_t *k, uint64_t bound) {
    uint64_t threshold = (0 - bound) % bound; /* 2^64 mod bound */
    for (;;) {
        uint64_t v = gp_rng_u64(s, (*k)++);
        if (v >= threshold) return v % bound;
    }
}

gp_status gp_shuffle(uint64_t seed, uint32_t epoch, int64_t n, int64_t *perm) {
    if (n < 0) return gp_error(GP_INVALID_ARGUMENT, "gp_shuffle: n = %lld, expected >= 0",
                               (long long)n);
    if (n > 0 && !perm) return gp_error(GP_INVALID_ARGUMENT, "gp_shuffle: perm is NULL");
    gp_rng_stream s = {.seed = seed, .purpose = GP_RNG_DATA, .a = epoch, .b = 0, .c = 0};
    for (int64_t i = 0; i < n; i++) perm[i] = i;
    uint64_t k = 0;
    /* Fisher-Yates from the top: position i takes a uniform pick of 0..i. */
    for (int64_t i = n - 1; i > 0; i--) {
        int64_t j = (int64_t)uniform_below(&s, &k, (uint64_t)i + 1);
        int64_t t = perm[i];
        perm[i] = perm[j];
        perm[j] = t;
    }
    return GP_OK;
}
