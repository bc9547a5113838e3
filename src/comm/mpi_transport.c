/* The MPI transport: the threads transport's interface between processes. A message is a small
 * header (kind, micro-batch, dtype, shape, sequence number) and its payload, both sent with
 * MPI_Isend and received with MPI_Irecv; the header is checked before the payload is received
 * into the caller's tensor. A tensor in device memory goes through a host copy (host staging: MPI
 * reads and writes host memory only), unless a payload hook (NCCL between GPUs) carries its link.
 * Every wait is a test loop with a deadline that also polls for peers'
 * abort notes, so no call outlives the timeout and one rank's failure stops them all. */
#ifdef GP_HAVE_MPI
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "comm/mpi_transport.h"
#include "core/clock.h"

#define HEADER_MAGIC 0x67704d31 /* "gpM1" */

/* A message this rank sent whose MPI sends may still be in flight. */
typedef struct pending {
    MPI_Request req[2]; /* header, payload (MPI_REQUEST_NULL where the payload hook carries it) */
    gp_msg_header hdr;
    gp_tensor t;  /* owned: released once both sends completed */
    void *staged; /* the host copy MPI sends of a tensor in device memory (freed with t) */
    void *sent;   /* the payload hook's operation of its send, NULL once done */
    int peer;
} pending;

/* Room for a collective's description: its kind, and up to three ranks by name. */
enum { COLL_DOING_BYTES = 320, COLL_PEERS_BYTES = 224 };

typedef struct mpi_ctx {
    gp_mpi_shared *sh;
    MPI_Comm comm;
    int rank, size, capacity;
    const char *role;
    int *world_of;        /* (size) world rank of each rank of comm */
    uint64_t *sent, *got; /* (size) messages sent to / received from each rank */
    uint32_t *hook_sent, *hook_got; /* (size) of those, the payload hook's (header hook_seq) */
    pending *pend;        /* oldest first */
    int npend, cap_pend;
    double *gather; /* (size * n) scratch of the ordered all-reduce */
    size_t gather_cap;
    float *fscratch; /* the float collectives' blocks from every rank */
    size_t fscratch_cap;
    int *counts, *displs; /* (4 * size) alltoallv / allgatherv arguments */
    gp_msg_header *hdr_in; /* where a header is received */
    void *stage_in;        /* (stage_cap) where a payload for device memory is received */
    size_t stage_cap;
    gp_transport_payload hook; /* payloads that bypass MPI (gp_transport_mpi_set_payload) */
    /* A failure left a collective or a receive unfinished: MPI may still use gather, fscratch,
     * counts or hdr_in, so they outlive the transport. */
    bool abandoned;
    char peers[COLL_PEERS_BYTES]; /* ", with rank 1 (stage 1), ..." (collective_peers) */
} mpi_ctx;

/* A rank as a message names it: its world rank, and its place in this communicator where that
 * says more (the world's own transport is "rank" r = world rank r). */
static void who_str(const mpi_ctx *c, int r, char *buf, size_t n) {
    if (strcmp(c->role, "rank") == 0 && c->world_of[r] == r)
        snprintf(buf, n, "rank %d", r);
    else
        snprintf(buf, n, "rank %d (%s %d)", c->world_of[r], c->role, r);
}

/* The ranks a collective waits with, named once (the communicator does not change): a timeout
 * cannot tell which of them is missing, so its message names them all (the first few). */
static void collective_peers(mpi_ctx *c) {
    enum { SHOWN = 3 };
    const size_t n = sizeof c->peers;
    int len = 0;
    c->peers[0] = '\0';
    for (int r = 0, shown = 0; r < c->size && len >= 0 && (size_t)len < n; r++) {
        if (r == c->rank) continue;
        if (shown == SHOWN) {
            snprintf(c->peers + len, n - (size_t)len, " and %d more", c->size - 1 - SHOWN);
            break;
        }
        char them[64];
        who_str(c, r, them, sizeof them);
        len += snprintf(c->peers + len, n - (size_t)len, "%s%s", shown++ ? ", " : ", with ", them);
    }
}

/* What a collective waits in, with the ranks it waits with. */
static void coll_doing(const mpi_ctx *c, char *buf, size_t n, const char *what) {
    snprintf(buf, n, "waiting in the %s over %d %ss%s", what, c->size, c->role, c->peers);
}

/* Whether the payload hook's operation *op is done; *op is NULL once it is gone (done or
 * failed: the hook has let it go). */
static gp_status hook_op_done(mpi_ctx *c, void **op, bool *done) {
    *done = true;
    if (!*op) return GP_OK;
    const gp_status s = c->hook.done(c->hook.ctx, *op, done);
    if (s != GP_OK || *done) *op = NULL;
    return s;
}

/* Forgets every pending message's hook send (a failed run, or the hook going away). */
static void hook_forget_all(mpi_ctx *c) {
    for (int i = 0; i < c->npend; i++)
        if (c->pend[i].sent) {
            c->hook.forget(c->hook.ctx, c->pend[i].sent);
            c->pend[i].sent = NULL;
        }
}

static void pending_release(pending *p) {
    gp_tensor_release(&p->t);
    free(p->staged);
    p->staged = NULL;
}

/* Releases the tensors of the oldest messages whose sends completed. */
static gp_status reclaim(mpi_ctx *c) {
    int done = 0;
    while (done < c->npend) {
        int flag = 0;
        if (MPI_Testall(2, c->pend[done].req, &flag, MPI_STATUSES_IGNORE) != MPI_SUCCESS || !flag)
            break;
        bool sent;
        const gp_status s = hook_op_done(c, &c->pend[done].sent, &sent);
        if (s != GP_OK) {
            gp_mpi_shared_abort(c->sh, c->sh->world_rank, s, gp_last_error());
            return s;
        }
        if (!sent) break;
        pending_release(&c->pend[done]);
        done++;
    }
    if (done) {
        memmove(c->pend, c->pend + done, (size_t)(c->npend - done) * sizeof *c->pend);
        c->npend -= done;
    }
    return GP_OK;
}

/* Messages in flight on one link: to peer, of one kind and link number. */
static int pending_on(const mpi_ctx *c, int peer, gp_msg_tag tag, int *oldest) {
    int n = 0;
    *oldest = -1;
    for (int i = 0; i < c->npend; i++)
        if (c->pend[i].peer == peer && c->pend[i].hdr.kind == (int32_t)tag.kind &&
            c->pend[i].hdr.link == tag.link && n++ == 0)
            *oldest = i;
    return n;
}

/* The MPI tags of a message's header and payload: one pair per kind and link. */
static int tag_of(gp_msg_tag tag) { return 2 * ((int)tag.kind + GP_MSG_NKINDS * tag.link); }
static int tag_hdr(gp_msg_tag tag) { return GP_MPI_TAG_HDR + tag_of(tag); }
static int tag_data(gp_msg_tag tag) { return GP_MPI_TAG_DATA + tag_of(tag); }

/* gp_mpi_wait_for's poll of a payload hook operation; a failure aborts the run. */
typedef struct hook_poll {
    mpi_ctx *c;
    void **op;
} hook_poll;

static gp_status poll_hook(void *ctx, bool *done) {
    hook_poll *h = ctx;
    const gp_status s = hook_op_done(h->c, h->op, done);
    if (s != GP_OK) gp_mpi_shared_abort(h->c->sh, h->c->sh->world_rank, s, gp_last_error());
    return s;
}

/* Waits for both sends of pending message i (the payload hook's too). */
static gp_status wait_pending(mpi_ctx *c, int i, double deadline, const char *who,
                              const char *doing) {
    for (int j = 0; j < 2; j++)
        GP_TRY(gp_mpi_wait(c->sh, &c->pend[i].req[j], deadline, who, doing));
    hook_poll h = {c, &c->pend[i].sent};
    return gp_mpi_wait_for(c->sh, poll_hook, &h, deadline, who, doing);
}

/* Whether the payload hook carries a message on this link. */
static bool hooked(const mpi_ctx *c, int peer, gp_msg_tag tag, bool sending) {
    return c->hook.carries && c->hook.carries(c->hook.ctx, peer, tag, sending);
}

static gp_status mpi_send(void *ctx, int rank, int peer, gp_msg_tag tag, gp_tensor *t) {
    mpi_ctx *c = ctx;
    char who[64], them[64], ts[32], doing[160];
    who_str(c, rank, who, sizeof who);
    who_str(c, peer, them, sizeof them);
    snprintf(doing, sizeof doing, "sending %s to %s", gp_msg_tag_str(tag, ts, sizeof ts), them);
    gp_status s = GP_OK;
    if (rank != c->rank)
        s = gp_error(GP_INTERNAL, "%s: MPI transport called as %s %d", who, c->role, rank);
    if (s == GP_OK) s = reclaim(c);
    if (s == GP_OK && gp_mpi_shared_poll(c->sh)) s = gp_mpi_aborted_error(c->sh, who, doing);
    /* At most `capacity` messages in flight per link, as with threads. */
    double deadline = gp_mpi_deadline(c->sh);
    int oldest;
    while (s == GP_OK && pending_on(c, peer, tag, &oldest) >= c->capacity) {
        s = wait_pending(c, oldest, deadline, who, doing);
        if (s == GP_OK) s = reclaim(c);
    }
    if (s == GP_OK && c->npend == c->cap_pend) {
        int cap = c->cap_pend ? 2 * c->cap_pend : 8;
        pending *p = realloc(c->pend, (size_t)cap * sizeof *p);
        if (!p) s = gp_error(GP_OUT_OF_MEMORY, "%s: cannot track %d messages in flight", who, cap);
        else c->pend = p, c->cap_pend = cap;
    }
    if (s != GP_OK) {
        gp_tensor_release(t);
        memset(t, 0, sizeof *t);
        return s;
    }
    pending *p = &c->pend[c->npend];
    memset(p, 0, sizeof *p);
    p->peer = peer;
    p->t = *t;
    memset(t, 0, sizeof *t);
    size_t nbytes = gp_tensor_nbytes(&p->t);
    p->hdr = (gp_msg_header){.magic = HEADER_MAGIC, .kind = (int32_t)tag.kind, .mb = tag.mb,
                          .dtype = (int32_t)p->t.dtype, .ndim = p->t.shape.ndim,
                          .link = tag.link, .nbytes = nbytes, .seq = (uint32_t)c->sent[peer]++,
                          .hook_seq = GP_MSG_NOT_HOOKED};
    for (int d = 0; d < GP_MAX_DIMS; d++) p->hdr.dim[d] = p->t.shape.dim[d];
    p->req[0] = p->req[1] = MPI_REQUEST_NULL;
    const bool hook = hooked(c, peer, tag, true);
    const void *payload = p->t.data;
    if (!hook && !gp_device_is_host(p->t.dev)) { /* host staging: MPI reads host memory only */
        p->staged = malloc(nbytes ? nbytes : 1);
        s = p->staged ? gp_tensor_to_host(&p->t, p->staged, nbytes)
                      : gp_error(GP_OUT_OF_MEMORY, "%s: cannot stage %zu bytes %s", who, nbytes,
                                 doing);
        if (s != GP_OK) {
            pending_release(p);
            gp_mpi_shared_abort(c->sh, c->world_of[rank], s, gp_last_error());
            return s;
        }
        gp_tensor_release(&p->t); /* copied out: the device block is free again */
        payload = p->staged;
    }
    /* The hook's send first: once the header is out, the receiver starts receiving the payload,
     * and a send that then failed would leave that receive unmatched. */
    if (hook) {
        s = c->hook.send(c->hook.ctx, peer, tag, &p->t, &p->sent);
        if (s != GP_OK) {
            pending_release(p);
            gp_mpi_shared_abort(c->sh, c->world_of[rank], s, gp_last_error());
            return s;
        }
        p->hdr.hook_seq = c->hook_sent[peer]++;
    }
    int rc = MPI_Isend(&p->hdr, (int)sizeof p->hdr, MPI_BYTE, peer, tag_hdr(tag), c->comm,
                       &p->req[0]);
    if (rc == MPI_SUCCESS && !hook)
        rc = MPI_Isend(payload, (int)nbytes, MPI_BYTE, peer, tag_data(tag), c->comm, &p->req[1]);
    if (rc != MPI_SUCCESS) {
        char es[MPI_MAX_ERROR_STRING];
        int len = 0;
        MPI_Error_string(rc, es, &len);
        pending_release(p);
        s = gp_error(GP_IO, "%s: MPI_Isend failed %s: %s", who, doing, es);
        gp_mpi_shared_abort(c->sh, c->world_of[rank], s, gp_last_error());
        return s;
    }
    c->npend++;
    c->sh->bytes_p2p += sizeof p->hdr + nbytes;
    return GP_OK;
}

static gp_status check_header(const mpi_ctx *c, const gp_msg_header *h, int rank, int peer,
                              gp_msg_tag tag, const gp_tensor *out) {
    char who[64], them[64], want[32], got[32], ws[96], gs[96];
    who_str(c, rank, who, sizeof who);
    who_str(c, peer, them, sizeof them);
    gp_msg_tag_str(tag, want, sizeof want);
    if (h->magic != HEADER_MAGIC || h->ndim < 0 || h->ndim > GP_MAX_DIMS ||
        (h->dtype != GP_F32 && h->dtype != GP_I32))
        return gp_error(GP_FORMAT, "%s: receiving %s from %s: the header is not gpipe's (magic %#x)",
                        who, want, them, (unsigned)h->magic);
    gp_shape hs = {.ndim = h->ndim};
    for (int d = 0; d < h->ndim; d++) hs.dim[d] = h->dim[d];
    gp_msg_tag htag = {(gp_msg_kind)h->kind, h->mb, h->link};
    bool tag_ok = htag.kind == tag.kind && htag.mb == tag.mb && htag.link == tag.link;
    bool shape_ok = h->dtype == (int32_t)out->dtype && gp_shape_equal(&hs, &out->shape) &&
                    h->nbytes == gp_tensor_nbytes(out);
    if (tag_ok && shape_ok) return GP_OK;
    gp_msg_tag_str(htag, got, sizeof got);
    gp_shape_str(&out->shape, ws, sizeof ws);
    gp_shape_str(&hs, gs, sizeof gs);
    return gp_error(tag_ok ? GP_SHAPE : GP_INTERNAL,
                    "%s: receiving from %s: expected %s %s %s, but %s sent %s %s %s (message %llu "
                    "on that link)",
                    who, them, want, gp_dtype_name(out->dtype), ws, them, got,
                    gp_dtype_name((gp_dtype)h->dtype), gs, (unsigned long long)h->seq);
}

/* The payload hook's messages (NCCL) pair in the order both ends post them, not by tag as the
 * headers do: a message whose header says it is another of the hook's messages than this rank
 * is about to receive (or that only one end hooks) would land in the wrong tensor. */
static gp_status check_hook_seq(const mpi_ctx *c, const gp_msg_header *h, int rank, int peer,
                                gp_msg_tag tag, bool hook) {
    const uint32_t want = hook ? c->hook_got[peer] : GP_MSG_NOT_HOOKED;
    if (h->hook_seq == want) return GP_OK;
    char who[64], them[64], ts[32], ws[48], gs[48];
    who_str(c, rank, who, sizeof who);
    who_str(c, peer, them, sizeof them);
    if (hook) snprintf(ws, sizeof ws, "payload hook message %u", (unsigned)want);
    else snprintf(ws, sizeof ws, "a payload over MPI");
    if (h->hook_seq != GP_MSG_NOT_HOOKED)
        snprintf(gs, sizeof gs, "payload hook message %u", (unsigned)h->hook_seq);
    else snprintf(gs, sizeof gs, "a payload over MPI");
    return gp_error(GP_INTERNAL,
                    "%s: receiving %s from %s: expected %s, but %s sent %s (the hook pairs "
                    "payloads in posting order, so the two ends must hook the same messages)",
                    who, gp_msg_tag_str(tag, ts, sizeof ts), them, ws, them, gs);
}

/* Seconds a cancelled receive is given to complete. */
#define CANCEL_GRACE_S 2.0

/* Waits for a posted receive. A receive that did not complete (a peer's failure, the timeout)
 * is cancelled: left posted, a late message would land in a buffer that may be gone by then,
 * written by whatever MPI call comes next. Open MPI cannot cancel a receive whose message has
 * begun to arrive, and its wait would then last until the sender calls MPI again (a stuck peer:
 * never), so the cancel gets a bounded grace; a receive still unfinished after it is let go,
 * its header buffer kept (the transport is abandoned), and the failure returned. */
static gp_status wait_recv(mpi_ctx *c, MPI_Request *req, double deadline, const char *who,
                           const char *doing) {
    gp_status s = gp_mpi_wait(c->sh, req, deadline, who, doing);
    if (s == GP_OK || *req == MPI_REQUEST_NULL) return s;
    MPI_Cancel(req);
    const double until = gp_now() + CANCEL_GRACE_S;
    int done = 0;
    while (MPI_Test(req, &done, MPI_STATUS_IGNORE) == MPI_SUCCESS && !done && gp_now() < until)
        nanosleep(&(struct timespec){0, 100000}, NULL);
    if (!done) {
        if (*req != MPI_REQUEST_NULL) MPI_Request_free(req);
        c->abandoned = true;
    }
    return s;
}

static gp_status mpi_recv(void *ctx, int rank, int peer, gp_msg_tag tag, gp_tensor *out) {
    mpi_ctx *c = ctx;
    char who[64], them[64], ts[32], doing[160];
    who_str(c, rank, who, sizeof who);
    who_str(c, peer, them, sizeof them);
    snprintf(doing, sizeof doing, "waiting to receive %s from %s",
             gp_msg_tag_str(tag, ts, sizeof ts), them);
    if (rank != c->rank)
        return gp_error(GP_INTERNAL, "%s: MPI transport called as %s %d", who, c->role, rank);
    GP_TRY(reclaim(c));
    if (gp_mpi_shared_poll(c->sh)) return gp_mpi_aborted_error(c->sh, who, doing);
    double deadline = gp_mpi_deadline(c->sh);
    MPI_Request req;
    if (MPI_Irecv(c->hdr_in, (int)sizeof *c->hdr_in, MPI_BYTE, peer, tag_hdr(tag), c->comm,
                  &req) != MPI_SUCCESS)
        return gp_error(GP_IO, "%s: MPI_Irecv failed %s", who, doing);
    GP_TRY(wait_recv(c, &req, deadline, who, doing));
    const gp_msg_header h = *c->hdr_in;
    gp_status s = check_header(c, &h, rank, peer, tag, out);
    if (s != GP_OK) {
        gp_mpi_shared_abort(c->sh, c->world_of[rank], s, gp_last_error());
        return s;
    }
    const bool hook = hooked(c, peer, tag, false);
    s = check_hook_seq(c, &h, rank, peer, tag, hook);
    if (s != GP_OK) {
        gp_mpi_shared_abort(c->sh, c->world_of[rank], s, gp_last_error());
        return s;
    }
    if (hook) {
        void *op = NULL;
        s = c->hook.recv(c->hook.ctx, peer, tag, out, &op);
        if (s != GP_OK) gp_mpi_shared_abort(c->sh, c->world_of[rank], s, gp_last_error());
        /* The stage's later work waits for the payload on the device, where no deadline holds:
         * it is waited for here, within the transport's. */
        hook_poll hp = {c, &op};
        if (s == GP_OK) s = gp_mpi_wait_for(c->sh, poll_hook, &hp, deadline, who, doing);
        if (op) c->hook.forget(c->hook.ctx, op);
        if (s == GP_OK) c->got[peer]++, c->hook_got[peer]++;
        return s;
    }
    void *into = out->data;
    const bool staged = !gp_device_is_host(out->dev); /* host staging: MPI writes host memory */
    if (staged && h.nbytes > c->stage_cap) {
        void *b = realloc(c->stage_in, h.nbytes);
        if (!b) {
            s = gp_error(GP_OUT_OF_MEMORY, "%s: cannot stage %llu bytes %s", who,
                         (unsigned long long)h.nbytes, doing);
            gp_mpi_shared_abort(c->sh, c->world_of[rank], s, gp_last_error());
            return s;
        }
        c->stage_in = b;
        c->stage_cap = h.nbytes;
    }
    if (staged) into = c->stage_in;
    if (MPI_Irecv(into, (int)h.nbytes, MPI_BYTE, peer, tag_data(tag), c->comm, &req) !=
        MPI_SUCCESS)
        return gp_error(GP_IO, "%s: MPI_Irecv failed %s", who, doing);
    GP_TRY(wait_recv(c, &req, deadline, who, doing));
    if (staged) GP_TRY(gp_tensor_from_host(out, c->stage_in, h.nbytes));
    c->got[peer]++;
    return GP_OK;
}

static gp_status mpi_flush(void *ctx, int rank) {
    mpi_ctx *c = ctx;
    char who[64], them[64], ts[32], doing[160];
    who_str(c, rank, who, sizeof who);
    double deadline = gp_mpi_deadline(c->sh);
    GP_TRY(reclaim(c));
    while (c->npend > 0) {
        pending *p = &c->pend[0];
        who_str(c, p->peer, them, sizeof them);
        snprintf(doing, sizeof doing, "waiting for %s to take %s (flush)", them,
                 gp_msg_tag_str((gp_msg_tag){(gp_msg_kind)p->hdr.kind, p->hdr.mb, p->hdr.link}, ts,
                                sizeof ts));
        GP_TRY(wait_pending(c, 0, deadline, who, doing));
        GP_TRY(reclaim(c));
    }
    return GP_OK;
}

/* Starts an MPI collective (rc), then waits for it within the timeout, naming `doing`. */
static gp_status run_coll(mpi_ctx *c, int rc, MPI_Request *req, const char *who,
                          const char *doing, const char *fn) {
    if (rc != MPI_SUCCESS) {
        gp_status s = gp_error(GP_IO, "%s: %s failed %s", who, fn, doing);
        gp_mpi_shared_abort(c->sh, c->world_of[c->rank], s, gp_last_error());
        return s;
    }
    gp_status s = gp_mpi_wait(c->sh, req, gp_mpi_deadline(c->sh), who, doing);
    if (s != GP_OK && *req != MPI_REQUEST_NULL) c->abandoned = true;
    return s;
}

/* All-gather every rank's n values, then sum them in rank order 0..size-1: the same bits on
 * every rank and every run, whatever MPI's own reduction order would be. */
static gp_status mpi_allreduce(void *ctx, int rank, double *x, int n) {
    mpi_ctx *c = ctx;
    char who[64], doing[COLL_DOING_BYTES], what[48];
    who_str(c, rank, who, sizeof who);
    snprintf(what, sizeof what, "all-reduce of %d values", n);
    coll_doing(c, doing, sizeof doing, what);
    GP_TRY(reclaim(c));
    if (gp_mpi_shared_poll(c->sh)) return gp_mpi_aborted_error(c->sh, who, doing);
    MPI_Request req;
    if (n == 0) return run_coll(c, MPI_Ibarrier(c->comm, &req), &req, who, doing, "MPI_Ibarrier");
    size_t need = (size_t)c->size * (size_t)n;
    if (need > c->gather_cap) {
        double *g = realloc(c->gather, need * sizeof *g);
        if (!g) return gp_error(GP_OUT_OF_MEMORY, "%s: cannot gather %zu values", who, need);
        c->gather = g;
        c->gather_cap = need;
    }
    GP_TRY(run_coll(c, MPI_Iallgather(x, n, MPI_DOUBLE, c->gather, n, MPI_DOUBLE, c->comm, &req),
                    &req, who, doing, "MPI_Iallgather"));
    for (int i = 0; i < n; i++) {
        double acc = c->gather[i];
        for (int r = 1; r < c->size; r++) acc += c->gather[(size_t)r * (size_t)n + (size_t)i];
        x[i] = acc;
    }
    return GP_OK;
}

/* ---------------------------------------------------------- float collectives */

static gp_status fscratch(mpi_ctx *c, const char *who, size_t need) {
    if (need <= c->fscratch_cap) return GP_OK;
    float *f = realloc(c->fscratch, need * sizeof *f);
    if (!f) return gp_error(GP_OUT_OF_MEMORY, "%s: cannot hold %zu floats", who, need);
    c->fscratch = f;
    c->fscratch_cap = need;
    return GP_OK;
}

static gp_status float_begin(mpi_ctx *c, int rank, int64_t n, char *who, size_t nwho,
                             char *doing, size_t ndoing, const char *what) {
    who_str(c, rank, who, nwho);
    char whatn[64];
    snprintf(whatn, sizeof whatn, "%s of %lld floats", what, (long long)n);
    coll_doing(c, doing, ndoing, whatn);
    if (rank != c->rank)
        return gp_error(GP_INTERNAL, "%s: MPI transport called as %s %d", who, c->role, rank);
    if (n > INT_MAX / (c->size > 0 ? c->size : 1))
        return gp_error(GP_INVALID_ARGUMENT, "%s: %s of %lld floats (at most %d)", who, what,
                        (long long)n, INT_MAX / c->size);
    GP_TRY(reclaim(c));
    if (gp_mpi_shared_poll(c->sh)) return gp_mpi_aborted_error(c->sh, who, doing);
    return GP_OK;
}

/* Reduce-scatter then all-gather: rank r reduces chunk r of every rank's x (MPI_Ialltoallv
 * brings them), in rank order, and every rank gathers every chunk (MPI_Iallgatherv): the
 * threads transport's arithmetic, so both give the same bits; 2 (size - 1) / size of the
 * buffer crosses the wire each way, as a ring all-reduce's does. */
static gp_status mpi_allreduce_f32(void *ctx, int rank, float *x, int64_t n, gp_reduce_op op) {
    mpi_ctx *c = ctx;
    char who[64], doing[COLL_DOING_BYTES];
    GP_TRY(float_begin(c, rank, n, who, sizeof who, doing, sizeof doing,
                       op == GP_REDUCE_MAX ? "float all-reduce (max)" : "float all-reduce (sum)"));
    const int P = c->size;
    int *scount = c->counts, *sdisp = scount + P, *rcount = sdisp + P, *rdisp = rcount + P;
    for (int r = 0; r < P; r++) {
        const int64_t lo = n * r / P, hi = n * (r + 1) / P;
        scount[r] = (int)(hi - lo);
        sdisp[r] = (int)lo;
    }
    const int mine = scount[c->rank];
    for (int r = 0; r < P; r++) rcount[r] = mine, rdisp[r] = r * mine;
    GP_TRY(fscratch(c, who, (size_t)P * (size_t)(mine ? mine : 1)));
    MPI_Request req;
    GP_TRY(run_coll(c, MPI_Ialltoallv(x, scount, sdisp, MPI_FLOAT, c->fscratch, rcount, rdisp,
                                      MPI_FLOAT, c->comm, &req),
                    &req, who, doing, "MPI_Ialltoallv"));
    float *dst = x + sdisp[c->rank];
    for (int i = 0; i < mine; i++) {
        float acc = c->fscratch[i];
        for (int r = 1; r < P; r++) {
            const float v = c->fscratch[(size_t)r * (size_t)mine + (size_t)i];
            acc = op == GP_REDUCE_SUM ? acc + v : (v > acc || v != v ? v : acc);
        }
        dst[i] = acc;
    }
    return run_coll(c, MPI_Iallgatherv(MPI_IN_PLACE, 0, MPI_FLOAT, x, scount, sdisp, MPI_FLOAT,
                                       c->comm, &req),
                    &req, who, doing, "MPI_Iallgatherv");
}

static gp_status mpi_allgather_f32(void *ctx, int rank, const float *x, int64_t n, float *out) {
    mpi_ctx *c = ctx;
    char who[64], doing[COLL_DOING_BYTES];
    GP_TRY(float_begin(c, rank, n, who, sizeof who, doing, sizeof doing, "all-gather"));
    MPI_Request req;
    return run_coll(c, MPI_Iallgather(x, (int)n, MPI_FLOAT, out, (int)n, MPI_FLOAT, c->comm, &req),
                    &req, who, doing, "MPI_Iallgather");
}

static gp_status mpi_reduce_scatter_f32(void *ctx, int rank, const float *x, int64_t n,
                                        float *out) {
    mpi_ctx *c = ctx;
    char who[64], doing[COLL_DOING_BYTES];
    GP_TRY(float_begin(c, rank, n, who, sizeof who, doing, sizeof doing, "reduce-scatter"));
    const int P = c->size;
    GP_TRY(fscratch(c, who, (size_t)P * (size_t)(n ? n : 1)));
    MPI_Request req;
    GP_TRY(run_coll(c, MPI_Ialltoall(x, (int)n, MPI_FLOAT, c->fscratch, (int)n, MPI_FLOAT, c->comm,
                                     &req),
                    &req, who, doing, "MPI_Ialltoall"));
    for (int64_t i = 0; i < n; i++) {
        float acc = c->fscratch[i];
        for (int r = 1; r < P; r++) acc += c->fscratch[(size_t)r * (size_t)n + (size_t)i];
        out[i] = acc;
    }
    return GP_OK;
}

static void mpi_abort(void *ctx, int rank, gp_status s, const char *why) {
    mpi_ctx *c = ctx;
    gp_mpi_shared_abort(c->sh, rank >= 0 && rank < c->size ? c->world_of[rank] : -1, s, why);
}

/* *rank: the WORLD rank that failed first (MPI has no other common numbering). */
static bool mpi_aborted(void *ctx, int *rank) {
    mpi_ctx *c = ctx;
    bool a = gp_mpi_shared_poll(c->sh);
    if (rank) *rank = a ? c->sh->abort_rank : -1;
    return a;
}

static void mpi_free(void *ctx) {
    mpi_ctx *c = ctx;
    if (!c) return;
    /* After a failure some sends may never complete: cancel them before their buffers go. */
    if (c->hook.forget) hook_forget_all(c);
    for (int i = 0; i < c->npend; i++) {
        for (int j = 0; j < 2; j++) {
            int flag = 0;
            MPI_Test(&c->pend[i].req[j], &flag, MPI_STATUS_IGNORE);
            if (!flag && c->pend[i].req[j] != MPI_REQUEST_NULL) {
                MPI_Cancel(&c->pend[i].req[j]);
                MPI_Request_free(&c->pend[i].req[j]);
            }
        }
        pending_release(&c->pend[i]);
    }
    free(c->pend);
    free(c->world_of);
    free(c->sent);
    free(c->got);
    free(c->hook_sent);
    free(c->hook_got);
    if (!c->abandoned) {
        free(c->gather);
        free(c->fscratch);
        free(c->counts);
        free(c->hdr_in);
        free(c->stage_in);
    }
    free(c);
}

static const gp_transport_iface mpi_iface = {
    .name = "mpi",
    .send = mpi_send,
    .recv = mpi_recv,
    .flush = mpi_flush,
    .allreduce_sum = mpi_allreduce,
    .barrier = NULL,
    .allreduce_f32 = mpi_allreduce_f32,
    .allgather_f32 = mpi_allgather_f32,
    .reduce_scatter_f32 = mpi_reduce_scatter_f32,
    .abort = mpi_abort,
    .aborted = mpi_aborted,
    .free = mpi_free,
};

gp_status gp_transport_mpi_new(gp_mpi_shared *sh, MPI_Comm comm, const char *role,
                               const gp_transport_opts *o, gp_transport **out) {
    *out = NULL;
    mpi_ctx *c = calloc(1, sizeof *c);
    gp_transport *tr = calloc(1, sizeof *tr);
    if (!c || !tr) {
        free(c);
        free(tr);
        return gp_error(GP_OUT_OF_MEMORY, "MPI transport: cannot allocate its state");
    }
    c->sh = sh;
    c->comm = comm;
    c->role = role;
    c->capacity = o && o->capacity > 0 ? o->capacity : 2;
    MPI_Comm_rank(comm, &c->rank);
    MPI_Comm_size(comm, &c->size);
    c->world_of = calloc((size_t)c->size, sizeof *c->world_of);
    c->sent = calloc((size_t)c->size, sizeof *c->sent);
    c->got = calloc((size_t)c->size, sizeof *c->got);
    c->hook_sent = calloc((size_t)c->size, sizeof *c->hook_sent);
    c->hook_got = calloc((size_t)c->size, sizeof *c->hook_got);
    c->counts = calloc(4 * (size_t)c->size, sizeof *c->counts);
    c->hdr_in = calloc(1, sizeof *c->hdr_in);
    tr->iface = &mpi_iface;
    tr->context = c;
    tr->nranks = c->size;
    if (!c->world_of || !c->sent || !c->got || !c->hook_sent || !c->hook_got || !c->counts ||
        !c->hdr_in) {
        gp_transport_free(tr);
        return gp_error(GP_OUT_OF_MEMORY, "MPI transport: cannot allocate %d ranks", c->size);
    }
    /* World ranks, for messages that a user can match with mpirun's numbering. */
    MPI_Group g, wg;
    MPI_Comm_group(comm, &g);
    MPI_Comm_group(sh->world, &wg);
    int *mine = malloc((size_t)c->size * sizeof *mine);
    if (!mine) {
        MPI_Group_free(&g);
        MPI_Group_free(&wg);
        gp_transport_free(tr);
        return gp_error(GP_OUT_OF_MEMORY, "MPI transport: cannot allocate %d ranks", c->size);
    }
    for (int r = 0; r < c->size; r++) mine[r] = r;
    MPI_Group_translate_ranks(g, c->size, mine, wg, c->world_of);
    free(mine);
    MPI_Group_free(&g);
    MPI_Group_free(&wg);
    collective_peers(c);
    *out = tr;
    return GP_OK;
}

void gp_transport_mpi_set_payload(gp_transport *tr, const gp_transport_payload *hook) {
    if (!tr || tr->iface != &mpi_iface) return;
    mpi_ctx *c = tr->context;
    if (c->hook.forget) hook_forget_all(c); /* the old hook's operations go with it */
    c->hook = hook ? *hook : (gp_transport_payload){0};
}

int gp_transport_mpi_rank(const gp_transport *tr) {
    return tr && tr->iface == &mpi_iface ? ((const mpi_ctx *)tr->context)->rank : -1;
}
#else
/* Built without MPI: see mpi_grid.c for the functions that say so. */
typedef int gp_mpi_transport_not_built;
#endif
