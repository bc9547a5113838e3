/* Philox4x32-10 (Salmon et al., SC'11): a counter-based generator, so any
 * element of any stream can be computed directly from (seed, ids, index).
 * Initialization, dropout and data order therefore never depend on which
 * device computed them or in which order. */
#define _GNU_SOURCE /* sched_getaffinity, CPU_COUNT */
#include <math.h>
#include <pthread.h>
#include <sched.h>

#include "gpipe.h"

#define PHILOX_M0 0xD2511F53u
#define PHILOX_M1 0xCD9E8D57u
#define PHILOX_W0 0x9E3779B9u
#define PHILOX_W1 0xBB67AE85u

static void philox_round(uint32_t ctr[4], const uint32_t key[2]) {
    uint64_t p0 = (uint64_t)PHILOX_M0 * ctr[0];
    uint64_t p1 = (uint64_t)PHILOX_M1 * ctr[2];
    uint32_t hi0 = (uint32_t)(p0 >> 32), lo0 = (uint32_t)p0;
    uint32_t hi1 = (uint32_t)(p1 >> 32), lo1 = (uint32_t)p1;
    uint32_t c0 = hi1 ^ ctr[1] ^ key[0];
    uint32_t c2 = hi0 ^ ctr[3] ^ key[1];
    ctr[0] = c0;
    ctr[1] = lo1;
    ctr[2] = c2;
    ctr[3] = lo0;
}

void gp_rng_block(const gp_rng_stream *s, uint64_t block, uint32_t out[4]) {
    uint32_t key[2] = {(uint32_t)s->seed ^ ((uint32_t)(block >> 32) * 0x85EBCA6Bu),
                       (uint32_t)(s->seed >> 32) ^ (s->purpose * PHILOX_W0)};
    uint32_t ctr[4] = {(uint32_t)block, s->a, s->b, s->c};
    for (int r = 0; r < 10; r++) {
        philox_round(ctr, key);
        key[0] += PHILOX_W0;
        key[1] += PHILOX_W1;
    }
    for (int i = 0; i < 4; i++) out[i] = ctr[i];
}

static float u24(uint32_t x) { return (float)(x >> 8) * (1.0f / 16777216.0f); }

static void uniform_range(const gp_rng_stream *s, uint64_t first, float *out, int64_t n) {
    uint32_t w[4];
    uint64_t cached = UINT64_MAX;
    for (int64_t i = 0; i < n; i++) {
        uint64_t e = first + (uint64_t)i;
        if (e / 4 != cached) {
            cached = e / 4;
            gp_rng_block(s, cached, w);
        }
        out[i] = u24(w[e % 4]);
    }
}

/* Normal element e is one half of the Box-Muller pair e / 2, whose two
 * uniforms are words 2*(pair % 2) and 2*(pair % 2) + 1 of block pair / 2. */
static void normal_range(const gp_rng_stream *s, uint64_t first, float *out, int64_t n) {
    uint32_t w[4];
    uint64_t cached = UINT64_MAX, r_pair = UINT64_MAX;
    double r = 0, th = 0;
    for (int64_t i = 0; i < n; i++) {
        uint64_t e = first + (uint64_t)i;
        uint64_t pair = e / 2;
        if (pair / 2 != cached) {
            cached = pair / 2;
            gp_rng_block(s, cached, w);
        }
        if (pair != r_pair) { /* the pair's two halves share the radius and the angle */
            r_pair = pair;
            int k = (int)(pair % 2) * 2;
            double u1 = ((double)(w[k] >> 8) + 1.0) / 16777216.0; /* (0, 1] */
            double u2 = (double)(w[k + 1] >> 8) / 16777216.0;
            r = sqrt(-2.0 * log(u1));
            th = 6.283185307179586 * u2;
        }
        out[i] = (float)(e % 2 ? r * sin(th) : r * cos(th));
    }
}

/* A large fill (a billion-parameter model's initialization) is split over the cores this
 * process may use: every element depends on its index alone, so the bits are one thread's. */
enum { PARALLEL_MIN = 1 << 20, PARALLEL_MAX_THREADS = 32 };

typedef struct fill_part {
    void (*range)(const gp_rng_stream *, uint64_t, float *, int64_t);
    const gp_rng_stream *s;
    uint64_t first;
    float *out;
    int64_t n;
} fill_part;

static void *fill_thread(void *arg) {
    const fill_part *f = arg;
    f->range(f->s, f->first, f->out, f->n);
    return NULL;
}

static void fill(void (*range)(const gp_rng_stream *, uint64_t, float *, int64_t),
                 const gp_rng_stream *s, uint64_t first, float *out, int64_t n) {
    int threads = 1;
    cpu_set_t set;
    if (n >= PARALLEL_MIN && sched_getaffinity(0, sizeof set, &set) == 0)
        threads = CPU_COUNT(&set);
    if (threads > PARALLEL_MAX_THREADS) threads = PARALLEL_MAX_THREADS;
    if (threads > 1 && threads > n / (PARALLEL_MIN / 4)) threads = (int)(n / (PARALLEL_MIN / 4));
    fill_part parts[PARALLEL_MAX_THREADS];
    pthread_t tid[PARALLEL_MAX_THREADS];
    int started = 0;
    int64_t done = 0;
    for (int t = 0; t < threads; t++) {
        const int64_t end = n / threads * (t + 1) + (t == threads - 1 ? n % threads : 0);
        parts[t] = (fill_part){range, s, first + (uint64_t)done, out + done, end - done};
        done = end;
        /* The last part (and any a thread could not be started for) on this thread. */
        if (t < threads - 1 && pthread_create(&tid[started], NULL, fill_thread, &parts[t]) == 0)
            started++;
        else
            range(s, parts[t].first, parts[t].out, parts[t].n);
    }
    for (int t = 0; t < started; t++) pthread_join(tid[t], NULL);
}

void gp_rng_uniform(const gp_rng_stream *s, uint64_t first, float *out, int64_t n) {
    fill(uniform_range, s, first, out, n);
}

void gp_rng_normal(const gp_rng_stream *s, uint64_t first, float *out, int64_t n) {
    fill(normal_range, s, first, out, n);
}

uint64_t gp_rng_u64(const gp_rng_stream *s, uint64_t i) {
    uint32_t w[4];
    gp_rng_block(s, i / 2, w);
    int k = (int)(i % 2) * 2;
    return ((uint64_t)w[k] << 32) | w[k + 1];
}
