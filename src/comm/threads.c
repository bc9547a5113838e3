/* The in-process transport: K ranks are K threads. One mutex guards all state (messages are a
 * few per micro-batch, so contention is negligible) and each rank sleeps on its own condition
 * variable with CLOCK_MONOTONIC deadlines, so no wait outlives the timeout. */
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "comm/threads.h"

/* A message's life on its link: FULL (queued) -> COPYING (the receiver copies it out, without
 * the lock) -> DONE (its buffer waits for the sender's thread to release it). On a link the
 * DONE messages are always the oldest ones, so the sender reclaims from the head. */
enum { MSG_FULL = 1, MSG_COPYING, MSG_DONE };

typedef struct message {
    gp_tensor t; /* owned by the sender's device */
    gp_msg_tag tag;
    int state;
    unsigned long long seq; /* 0, 1, ... on its link */
} message;

typedef struct mailbox {
    message *ring; /* capacity entries; the live ones are head, head + 1, ... (mod capacity) */
    int head, count;
    unsigned long long nsent, nreceived;
} mailbox;

typedef struct threads_ctx {
    int K, capacity;
    double timeout_s;
    pthread_mutex_t mu;
    pthread_cond_t *cv; /* (K): one per rank; a rank only ever waits on its own */
    mailbox *box;       /* (K, K): box[src * K + dst] */
    /* the collective in progress */
    unsigned long long coll_gen; /* completed collectives */
    int coll_arrived, coll_n, coll_first;
    double **coll_x; /* (K) each arrived rank's array */
    bool *coll_in;   /* (K) */
    double *sum;     /* the result of the last collective, coll_cap values */
    int sum_cap;
    /* the float collective in progress: two rendezvous (everyone's buffers known; everyone done
     * reading them), each counted by its own generation */
    unsigned long long fc_gen[2];
    int fc_arrived[2], fc_first, fc_kind;
    int64_t fc_n;
    const float **fc_x; /* (K) each rank's input */
    float **fc_out;     /* (K) each rank's output (its input for an all-reduce) */
    /* the first failure */
    bool aborted;
    int abort_rank;
    char abort_msg[640];
} threads_ctx;

static mailbox *box_of(threads_ctx *c, int src, int dst) { return &c->box[src * c->K + dst]; }

static message *box_at(threads_ctx *c, mailbox *b, int i) {
    return &b->ring[(b->head + i) % c->capacity];
}

static void abort_locked(threads_ctx *c, int rank, gp_status s, const char *why) {
    if (!c->aborted) {
        c->aborted = true;
        c->abort_rank = rank;
        snprintf(c->abort_msg, sizeof c->abort_msg, "%s: %.600s", gp_status_name(s), why);
    }
    for (int r = 0; r < c->K; r++) pthread_cond_broadcast(&c->cv[r]);
}

/* The caller's error after an abort: what it was doing, who failed and why. */
static gp_status aborted_error(threads_ctx *c, int rank, const char *doing) {
    return gp_error(GP_IO, "rank %d: stopped %s: the run was aborted by rank %d (%s)", rank, doing,
                    c->abort_rank, c->abort_msg);
}

/* Sets the message, aborts the run with it (so every other rank stops too) and returns s. */
static gp_status fail_locked(threads_ctx *c, int rank, gp_status s) {
    abort_locked(c, rank, s, gp_last_error());
    return s;
}

static struct timespec deadline_after(double seconds) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    double whole = (double)(long long)seconds;
    t.tv_sec += (time_t)whole;
    t.tv_nsec += (long)((seconds - whole) * 1e9);
    if (t.tv_nsec >= 1000000000L) {
        t.tv_sec++;
        t.tv_nsec -= 1000000000L;
    }
    return t;
}

/* Waits on rank's condition variable; true when the deadline has passed. */
static bool wait_timed_out(threads_ctx *c, int rank, const struct timespec *deadline) {
    return pthread_cond_timedwait(&c->cv[rank], &c->mu, deadline) == ETIMEDOUT;
}

/* Releases, on the sender's own thread, the buffers of rank's messages that were received. */
static void reclaim_locked(threads_ctx *c, int rank) {
    for (int p = 0; p < c->K; p++) {
        mailbox *b = box_of(c, rank, p);
        while (b->count > 0 && box_at(c, b, 0)->state == MSG_DONE) {
            message *m = box_at(c, b, 0);
            gp_tensor_release(&m->t);
            m->state = 0;
            b->head = (b->head + 1) % c->capacity;
            b->count--;
        }
    }
}

/* The oldest message on b that the receiver has not taken yet, or NULL. */
static message *first_full(threads_ctx *c, mailbox *b) {
    for (int i = 0; i < b->count; i++) {
        message *m = box_at(c, b, i);
        if (m->state == MSG_FULL) return m;
    }
    return NULL;
}

static int box_pending(threads_ctx *c, mailbox *b) {
    int n = 0;
    for (int i = 0; i < b->count; i++) n += box_at(c, b, i)->state != MSG_DONE;
    return n;
}

static gp_status th_send(void *ctx, int rank, int peer, gp_msg_tag tag, gp_tensor *t) {
    threads_ctx *c = ctx;
    char ts[32], doing[128];
    snprintf(doing, sizeof doing, "waiting to send %s to rank %d", gp_msg_tag_str(tag, ts, sizeof ts),
             peer);
    struct timespec deadline = deadline_after(c->timeout_s);
    gp_status s = GP_OK;
    pthread_mutex_lock(&c->mu);
    mailbox *b = box_of(c, rank, peer);
    for (;;) {
        reclaim_locked(c, rank);
        if (c->aborted) {
            s = aborted_error(c, rank, doing);
            break;
        }
        if (b->count < c->capacity) break;
        if (wait_timed_out(c, rank, &deadline) && !c->aborted) {
            reclaim_locked(c, rank);
            if (b->count < c->capacity) break;
            char ws[32];
            s = gp_error(GP_IO,
                         "rank %d: timed out after %.3g s %s: its mailbox stayed full (capacity "
                         "%d; rank %d has not received %s)",
                         rank, c->timeout_s, doing, c->capacity, peer,
                         gp_msg_tag_str(box_at(c, b, 0)->tag, ws, sizeof ws));
            fail_locked(c, rank, s);
            break;
        }
    }
    if (s == GP_OK) {
        message *m = box_at(c, b, b->count);
        *m = (message){.t = *t, .tag = tag, .state = MSG_FULL, .seq = b->nsent++};
        b->count++;
        pthread_cond_broadcast(&c->cv[peer]);
    }
    pthread_mutex_unlock(&c->mu);
    if (s != GP_OK) gp_tensor_release(t); /* on the sender's thread, its own device */
    memset(t, 0, sizeof *t);
    return s;
}

/* Compares the message's header with what the receiver expects; the message names both sides. */
static gp_status check_header(const message *m, int rank, int peer, gp_msg_tag tag,
                              const gp_tensor *out) {
    bool tag_ok = m->tag.kind == tag.kind && m->tag.mb == tag.mb && m->tag.link == tag.link;
    bool shape_ok = m->t.dtype == out->dtype && gp_shape_equal(&m->t.shape, &out->shape);
    if (tag_ok && shape_ok) return GP_OK;
    char want[32], got[32], wshape[96], gshape[96];
    gp_msg_tag_str(tag, want, sizeof want);
    gp_msg_tag_str(m->tag, got, sizeof got);
    gp_shape_str(&out->shape, wshape, sizeof wshape);
    gp_shape_str(&m->t.shape, gshape, sizeof gshape);
    /* A wrong tag means the two stages run different schedules: a bug, not bad data. */
    return gp_error(tag_ok ? GP_SHAPE : GP_INTERNAL,
                    "rank %d: receiving from rank %d: expected %s %s %s, but rank %d sent %s %s %s "
                    "(message %llu on link %d -> %d)",
                    rank, peer, want, gp_dtype_name(out->dtype), wshape, peer, got,
                    gp_dtype_name(m->t.dtype), gshape, m->seq, peer, rank);
}

static gp_status th_recv(void *ctx, int rank, int peer, gp_msg_tag tag, gp_tensor *out) {
    threads_ctx *c = ctx;
    char ts[32], doing[128];
    snprintf(doing, sizeof doing, "waiting to receive %s from rank %d",
             gp_msg_tag_str(tag, ts, sizeof ts), peer);
    struct timespec deadline = deadline_after(c->timeout_s);
    gp_status s = GP_OK;
    message *m = NULL;
    pthread_mutex_lock(&c->mu);
    mailbox *b = box_of(c, peer, rank);
    for (;;) {
        reclaim_locked(c, rank);
        if (c->aborted) {
            s = aborted_error(c, rank, doing);
            break;
        }
        if ((m = first_full(c, b)) != NULL) break;
        if (wait_timed_out(c, rank, &deadline) && !c->aborted) {
            if ((m = first_full(c, b)) != NULL) break;
            s = gp_error(GP_IO,
                         "rank %d: timed out after %.3g s %s (%llu messages received on link "
                         "%d -> %d so far)",
                         rank, c->timeout_s, doing, b->nreceived, peer, rank);
            fail_locked(c, rank, s);
            break;
        }
    }
    if (s == GP_OK && (s = check_header(m, rank, peer, tag, out)) != GP_OK) fail_locked(c, rank, s);
    if (s != GP_OK) {
        pthread_mutex_unlock(&c->mu);
        return s;
    }
    /* The copy runs unlocked: the message stays counted against the link's capacity, and only
     * the sender's thread ever releases it, after it is DONE. */
    m->state = MSG_COPYING;
    pthread_mutex_unlock(&c->mu);
    s = gp_tensor_copy(out, &m->t); /* from the sender's device into the receiver's */
    pthread_mutex_lock(&c->mu);
    m->state = MSG_DONE;
    b->nreceived++;
    if (s != GP_OK) fail_locked(c, rank, gp_error_context(s, "rank %d: copying a message from rank %d", rank, peer));
    pthread_cond_broadcast(&c->cv[peer]);
    pthread_mutex_unlock(&c->mu);
    return s;
}

static gp_status th_flush(void *ctx, int rank) {
    threads_ctx *c = ctx;
    struct timespec deadline = deadline_after(c->timeout_s);
    gp_status s = GP_OK;
    pthread_mutex_lock(&c->mu);
    for (int p = 0; p < c->K && s == GP_OK; p++) {
        mailbox *b = box_of(c, rank, p);
        for (;;) {
            reclaim_locked(c, rank);
            if (b->count == 0) break;
            char ts[32], doing[128];
            snprintf(doing, sizeof doing, "waiting for rank %d to receive %s (flush)", p,
                     gp_msg_tag_str(box_at(c, b, 0)->tag, ts, sizeof ts));
            if (c->aborted) {
                s = aborted_error(c, rank, doing);
                break;
            }
            if (wait_timed_out(c, rank, &deadline) && !c->aborted) {
                reclaim_locked(c, rank);
                if (b->count == 0) break;
                s = gp_error(GP_IO, "rank %d: timed out after %.3g s %s: %d message(s) pending",
                             rank, c->timeout_s, doing, box_pending(c, b));
                fail_locked(c, rank, s);
                break;
            }
        }
    }
    pthread_mutex_unlock(&c->mu);
    return s;
}

static void missing_ranks(threads_ctx *c, char *buf, size_t n) {
    size_t used = 0;
    buf[0] = '\0';
    for (int r = 0; r < c->K && used < n; r++)
        if (!c->coll_in[r])
            used += (size_t)snprintf(buf + used, n - used, "%s%d", used ? ", " : "", r);
}

/* Gathers every rank's array, sums it in rank order 0..K-1 (the last rank to arrive does it, in
 * that fixed order, so who is last does not matter), and gives every rank the result. */
static gp_status collective(threads_ctx *c, int rank, double *x, int n, const char *what) {
    struct timespec deadline = deadline_after(c->timeout_s);
    gp_status s = GP_OK;
    char doing[96];
    pthread_mutex_lock(&c->mu);
    unsigned long long gen = c->coll_gen;
    snprintf(doing, sizeof doing, "waiting in %s #%llu", what, gen);
    reclaim_locked(c, rank);
    if (c->aborted) {
        s = aborted_error(c, rank, doing);
        goto out;
    }
    GP_ASSERT(!c->coll_in[rank]); /* a rank leaves only once the collective is complete */
    if (c->coll_arrived == 0) {
        c->coll_n = n;
        c->coll_first = rank;
    } else if (n != c->coll_n) {
        s = gp_error(GP_INTERNAL,
                     "rank %d: %s #%llu of %d values, but rank %d called it with %d values", rank,
                     what, gen, n, c->coll_first, c->coll_n);
        fail_locked(c, rank, s);
        goto out;
    }
    c->coll_x[rank] = x;
    c->coll_in[rank] = true;
    if (++c->coll_arrived == c->K) {
        if (n > c->sum_cap) {
            double *p = realloc(c->sum, (size_t)n * sizeof *p);
            if (!p) {
                s = gp_error(GP_OUT_OF_MEMORY, "rank %d: %s #%llu: cannot hold %d values", rank,
                             what, gen, n);
                fail_locked(c, rank, s);
                goto out;
            }
            c->sum = p;
            c->sum_cap = n;
        }
        for (int i = 0; i < n; i++) {
            double acc = c->coll_x[0][i];
            for (int r = 1; r < c->K; r++) acc += c->coll_x[r][i];
            c->sum[i] = acc;
        }
        c->coll_arrived = 0;
        for (int r = 0; r < c->K; r++) c->coll_in[r] = false;
        c->coll_gen++;
        for (int r = 0; r < c->K; r++) pthread_cond_broadcast(&c->cv[r]);
    }
    while (c->coll_gen == gen) {
        if (c->aborted) {
            s = aborted_error(c, rank, doing);
            goto out;
        }
        if (wait_timed_out(c, rank, &deadline) && !c->aborted && c->coll_gen == gen) {
            char miss[256];
            missing_ranks(c, miss, sizeof miss);
            s = gp_error(GP_IO, "rank %d: timed out after %.3g s %s for rank(s) %s", rank,
                         c->timeout_s, doing, miss);
            fail_locked(c, rank, s);
            goto out;
        }
    }
    /* The next collective cannot overwrite the sum before this rank arrives at it. */
    if (n) memcpy(x, c->sum, (size_t)n * sizeof *x);
out:
    pthread_mutex_unlock(&c->mu);
    return s;
}

/* ------------------------------------------------------------ float collectives */

enum { FC_ALLREDUCE_SUM, FC_ALLREDUCE_MAX, FC_ALLGATHER, FC_REDUCE_SCATTER };
static const char *const fc_names[] = {"float all-reduce (sum)", "float all-reduce (max)",
                                       "all-gather", "reduce-scatter"};

/* Rendezvous `phase` of the float collective: 0 registers this rank's buffers and waits until
 * every rank has; 1 waits until every rank is done with everyone's buffers. */
static gp_status fc_meet(threads_ctx *c, int rank, int phase, int kind, int64_t n, const float *x,
                         float *out) {
    struct timespec deadline = deadline_after(c->timeout_s);
    gp_status s = GP_OK;
    char doing[96];
    pthread_mutex_lock(&c->mu);
    unsigned long long gen = c->fc_gen[phase];
    snprintf(doing, sizeof doing, "waiting in %s #%llu%s", fc_names[kind], c->fc_gen[1],
             phase ? " (done reading)" : "");
    reclaim_locked(c, rank);
    if (c->aborted) {
        s = aborted_error(c, rank, doing);
        goto out;
    }
    if (phase == 0) {
        if (c->fc_arrived[0] == 0) {
            c->fc_kind = kind;
            c->fc_n = n;
            c->fc_first = rank;
        } else if (kind != c->fc_kind || n != c->fc_n) {
            s = gp_error(GP_INTERNAL, "rank %d: %s of %lld values, but rank %d called %s of %lld "
                                      "values",
                         rank, fc_names[kind], (long long)n, c->fc_first, fc_names[c->fc_kind],
                         (long long)c->fc_n);
            fail_locked(c, rank, s);
            goto out;
        }
        c->fc_x[rank] = x;
        c->fc_out[rank] = out;
    }
    if (++c->fc_arrived[phase] == c->K) {
        c->fc_arrived[phase] = 0;
        c->fc_gen[phase]++;
        for (int r = 0; r < c->K; r++) pthread_cond_broadcast(&c->cv[r]);
    }
    while (c->fc_gen[phase] == gen) {
        if (c->aborted) {
            s = aborted_error(c, rank, doing);
            goto out;
        }
        if (wait_timed_out(c, rank, &deadline) && !c->aborted && c->fc_gen[phase] == gen) {
            s = gp_error(GP_IO, "rank %d: timed out after %.3g s %s (%d of %d ranks there)", rank,
                         c->timeout_s, doing, c->fc_arrived[phase], c->K);
            fail_locked(c, rank, s);
            goto out;
        }
    }
out:
    pthread_mutex_unlock(&c->mu);
    return s;
}

/* Elements [lo, hi) of n split into K nearly equal chunks: the ones rank r reduces. */
static void chunk_of(int64_t n, int K, int r, int64_t *lo, int64_t *hi) {
    *lo = n * r / K;
    *hi = n * (r + 1) / K;
}

/* Between the two rendezvous every rank reads the others' buffers (registered, unchanged until
 * the second) and writes only elements no other rank touches: its own chunk of every rank's
 * all-reduce buffer, or its own output. */
static gp_status float_collective(threads_ctx *c, int rank, int kind, const float *x, int64_t n,
                                  float *out) {
    GP_TRY(fc_meet(c, rank, 0, kind, n, x, out));
    const int K = c->K;
    if (kind == FC_ALLREDUCE_SUM || kind == FC_ALLREDUCE_MAX) {
        int64_t lo, hi;
        chunk_of(n, K, rank, &lo, &hi);
        for (int64_t i = lo; i < hi; i++) {
            float acc = c->fc_x[0][i];
            for (int r = 1; r < K; r++) {
                const float v = c->fc_x[r][i];
                acc = kind == FC_ALLREDUCE_SUM ? acc + v : (v > acc || v != v ? v : acc);
            }
            for (int r = 0; r < K; r++) c->fc_out[r][i] = acc;
        }
    } else if (kind == FC_ALLGATHER) {
        for (int r = 0; r < K; r++)
            if (n) memcpy(out + (int64_t)r * n, c->fc_x[r], (size_t)n * sizeof *out);
    } else {
        for (int64_t i = 0; i < n; i++) {
            float acc = c->fc_x[0][(int64_t)rank * n + i];
            for (int r = 1; r < K; r++) acc += c->fc_x[r][(int64_t)rank * n + i];
            out[i] = acc;
        }
    }
    return fc_meet(c, rank, 1, kind, n, x, out);
}

static gp_status th_allreduce_f32(void *ctx, int rank, float *x, int64_t n, gp_reduce_op op) {
    return float_collective(ctx, rank, op == GP_REDUCE_MAX ? FC_ALLREDUCE_MAX : FC_ALLREDUCE_SUM,
                            x, n, x);
}

static gp_status th_allgather_f32(void *ctx, int rank, const float *x, int64_t n, float *out) {
    return float_collective(ctx, rank, FC_ALLGATHER, x, n, out);
}

static gp_status th_reduce_scatter_f32(void *ctx, int rank, const float *x, int64_t n,
                                       float *out) {
    return float_collective(ctx, rank, FC_REDUCE_SCATTER, x, n, out);
}

static gp_status th_allreduce(void *ctx, int rank, double *x, int n) {
    return collective(ctx, rank, x, n, "all-reduce");
}

static gp_status th_barrier(void *ctx, int rank) { return collective(ctx, rank, NULL, 0, "barrier"); }

static void th_abort(void *ctx, int rank, gp_status s, const char *why) {
    threads_ctx *c = ctx;
    pthread_mutex_lock(&c->mu);
    abort_locked(c, rank, s, why);
    pthread_mutex_unlock(&c->mu);
}

static bool th_aborted(void *ctx, int *rank) {
    threads_ctx *c = ctx;
    pthread_mutex_lock(&c->mu);
    bool a = c->aborted;
    if (rank) *rank = a ? c->abort_rank : -1;
    pthread_mutex_unlock(&c->mu);
    return a;
}

static void th_free(void *ctx) {
    threads_ctx *c = ctx;
    if (!c) return;
    if (c->box) {
        for (int i = 0; i < c->K * c->K; i++) {
            mailbox *b = &c->box[i];
            for (int j = 0; b->ring && j < b->count; j++) gp_tensor_release(&box_at(c, b, j)->t);
            free(b->ring);
        }
    }
    if (c->cv)
        for (int r = 0; r < c->K; r++) pthread_cond_destroy(&c->cv[r]);
    pthread_mutex_destroy(&c->mu);
    free(c->cv);
    free(c->box);
    free(c->coll_x);
    free(c->coll_in);
    free(c->sum);
    free(c->fc_x);
    free(c->fc_out);
    free(c);
}

static const gp_transport_iface threads_iface = {
    .name = "threads",
    .send = th_send,
    .recv = th_recv,
    .flush = th_flush,
    .allreduce_sum = th_allreduce,
    .barrier = th_barrier,
    .allreduce_f32 = th_allreduce_f32,
    .allgather_f32 = th_allgather_f32,
    .reduce_scatter_f32 = th_reduce_scatter_f32,
    .abort = th_abort,
    .aborted = th_aborted,
    .free = th_free,
};

gp_status gp_transport_threads_new(const gp_transport_opts *o, gp_transport **out) {
    if (!out) return gp_error(GP_INVALID_ARGUMENT, "gp_transport_threads_new: out is NULL");
    *out = NULL;
    if (!o || o->nranks < 1 || o->capacity < 0 || !(o->timeout_s >= 0))
        return gp_error(GP_INVALID_ARGUMENT,
                        "threads transport: needs nranks >= 1, capacity >= 0 and timeout_s >= 0 "
                        "(got %d, %d, %g)",
                        o ? o->nranks : 0, o ? o->capacity : 0, o ? o->timeout_s : 0.0);
    threads_ctx *c = calloc(1, sizeof *c);
    gp_transport *tr = calloc(1, sizeof *tr);
    if (!c || !tr) {
        free(c);
        free(tr);
        return gp_error(GP_OUT_OF_MEMORY, "threads transport: cannot allocate its state");
    }
    int K = o->nranks;
    c->K = K;
    c->capacity = o->capacity ? o->capacity : 2;
    c->timeout_s = o->timeout_s > 0 ? o->timeout_s : 60.0;
    c->abort_rank = -1;
    pthread_mutex_init(&c->mu, NULL);
    tr->iface = &threads_iface;
    tr->context = c;
    tr->nranks = K;
    c->box = calloc((size_t)K * (size_t)K, sizeof *c->box);
    c->coll_x = calloc((size_t)K, sizeof *c->coll_x);
    c->coll_in = calloc((size_t)K, sizeof *c->coll_in);
    c->fc_x = calloc((size_t)K, sizeof *c->fc_x);
    c->fc_out = calloc((size_t)K, sizeof *c->fc_out);
    bool ok = c->box && c->coll_x && c->coll_in && c->fc_x && c->fc_out;
    for (int i = 0; ok && i < K * K; i++)
        ok = (c->box[i].ring = calloc((size_t)c->capacity, sizeof(message))) != NULL;
    pthread_condattr_t attr;
    if (ok && (ok = pthread_condattr_init(&attr) == 0)) {
        ok = pthread_condattr_setclock(&attr, CLOCK_MONOTONIC) == 0;
        if (ok && (c->cv = calloc((size_t)K, sizeof *c->cv)) != NULL) {
            int r = 0;
            while (r < K && pthread_cond_init(&c->cv[r], &attr) == 0) r++;
            if (r < K) { /* destroy only what was made */
                while (r-- > 0) pthread_cond_destroy(&c->cv[r]);
                free(c->cv);
                c->cv = NULL;
            }
        }
        ok = ok && c->cv;
        pthread_condattr_destroy(&attr);
    }
    if (!ok) {
        int capacity = c->capacity;
        gp_transport_free(tr);
        return gp_error(GP_OUT_OF_MEMORY,
                        "threads transport: cannot allocate mailboxes or condition variables for "
                        "%d ranks (capacity %d)",
                        K, capacity);
    }
    *out = tr;
    return GP_OK;
}
