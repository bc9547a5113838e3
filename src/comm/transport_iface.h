/* The transport between the devices of one mesh axis: point-to-point activations and gradients
 * with checked headers and bounded mailboxes (the pipeline axis), a fixed-order all-reduce of
 * doubles (norms and losses), the float collectives over one axis (the tensor axis: all-reduce,
 * all-gather, reduce-scatter), a barrier and an abort that wakes everyone. One interface
 * ({iface, context}) for every implementation: threads (threads.h), MPI (mpi_transport.h) and
 * cells over either (cells.h); this header is the interface and its checked wrappers
 * (transport_iface.c), which every implementation builds on. */
#ifndef GP_COMM_TRANSPORT_IFACE_H
#define GP_COMM_TRANSPORT_IFACE_H

#include "core/collective.h"
#include "core/error.h"
#include "gpipe.h"

/* What a message carries, besides its micro-batch. */
typedef enum gp_msg_kind {
    GP_MSG_ACT = 0,  /* an activation, stage k -> k + 1 */
    GP_MSG_GRAD = 1, /* the gradient of an activation, stage k + 1 -> k */
    GP_MSG_TIE = 2,  /* a tied parameter's gradient, between the stages of its uses (mb: the tie) */
    GP_MSG_NKINDS
} gp_msg_kind;

typedef struct gp_msg_tag {
    gp_msg_kind kind;
    int mb;   /* micro-batch, >= 0 */
    int link; /* which of the links between the two ranks (0 to GP_MSG_MAX_LINKS - 1): 0, but
               * where ranks run several cells (gp_transport_cells_new) */
} gp_msg_tag;
#define GP_MSG_MAX_LINKS 4096

/* What goes before each message's payload between processes (the MPI transport): the receiver
 * checks it against what it expects before a byte of the payload is taken. Here rather than in
 * the MPI transport so that the planner counts the bytes each message really costs
 * (GP_MSG_HEADER_BYTES). */
typedef struct gp_msg_header {
    int32_t magic, kind, mb, dtype, ndim, link;
    int64_t dim[GP_MAX_DIMS];
    uint64_t nbytes;
    /* seq: position on the link; hook_seq: the payload hook's messages to this peer before it
     * (GP_MSG_NOT_HOOKED: the payload travels over MPI), which the receiver checks against its
     * own count, since the hook's payloads pair in posting order, not by tag */
    uint32_t seq, hook_seq;
} gp_msg_header;
#define GP_MSG_HEADER_BYTES ((uint64_t)sizeof(gp_msg_header))
#define GP_MSG_NOT_HOOKED UINT32_MAX

/* "ACT(mb 3)", "ACT(mb 3, link 2)"; returns buf. */
char *gp_msg_tag_str(gp_msg_tag tag, char *buf, size_t n);

/* An implementation's functions. Every member is required unless marked optional. `rank` is the caller
 * (a stage); each rank's calls come from one thread at a time, different ranks' calls run
 * concurrently. The public wrappers below check the arguments before calling these. */
typedef struct gp_transport_iface {
    const char *name; /* "threads", "mpi" */
    gp_status (*send)(void *ctx, int rank, int peer, gp_msg_tag tag, gp_tensor *t);
    gp_status (*recv)(void *ctx, int rank, int peer, gp_msg_tag tag, gp_tensor *out);
    gp_status (*flush)(void *ctx, int rank);
    gp_status (*allreduce_sum)(void *ctx, int rank, double *x, int n);
    gp_status (*barrier)(void *ctx, int rank); /* optional: all-reduce of nothing */
    /* The float collectives (see the wrappers below); host memory for threads and MPI. */
    gp_status (*allreduce_f32)(void *ctx, int rank, float *x, int64_t n, gp_reduce_op op);
    gp_status (*allgather_f32)(void *ctx, int rank, const float *x, int64_t n, float *out);
    gp_status (*reduce_scatter_f32)(void *ctx, int rank, const float *x, int64_t n, float *out);
    void (*abort)(void *ctx, int rank, gp_status s, const char *why);
    bool (*aborted)(void *ctx, int *rank);
    void (*free)(void *ctx);
} gp_transport_iface;

typedef struct gp_transport {
    const gp_transport_iface *iface;
    void *context;
    int nranks; /* K */
} gp_transport;

/* Options for every implementation; zeroed fields take the defaults. */
typedef struct gp_transport_opts {
    int nranks;       /* K >= 1 */
    int capacity;     /* messages per directed link before a send blocks; default 2 */
    double timeout_s; /* longest any one blocking wait may last; default 60 s */
} gp_transport_opts;

/* Releases messages still in flight (each on the device that allocated it) and the transport.
 * NULL is ignored. */
void gp_transport_free(gp_transport *tr);

/* Ownership of a message (the rule every implementation follows, so that memory stays counted on the
 * device that holds it and each device is only touched by its own thread):
 * - send TAKES an owned tensor (from gp_tensor_alloc on the sender's device): *t is zeroed on
 *   return, whatever the status. The tensor stays counted on the sender's device until the
 *   receiver has copied it out; the SENDER's thread then releases it (in its next call into the
 *   transport, at the latest its flush, or in gp_transport_free). The sender never copies; a message costs
 *   one copy, into memory the receiver allocated on its own device, plus up to `capacity`
 *   buffers per outgoing link held on the sender until it reclaims them.
 * - recv copies the next message on the link peer -> rank into out, which the receiver has
 *   allocated (or viewed) with the EXPECTED shape and dtype. The message's header (kind,
 *   micro-batch, shape, dtype) is checked before a byte is copied.
 * Links are FIFO: the n-th recv on peer -> rank takes the n-th send on it (with the same link
 * number: each number is a link of its own). A send blocks while `capacity` messages on its link
 * are not yet received. */
gp_status gp_transport_send(gp_transport *tr, int rank, int peer, gp_msg_tag tag, gp_tensor *t);
gp_status gp_transport_recv(gp_transport *tr, int rank, int peer, gp_msg_tag tag, gp_tensor *out);
/* Waits until every message that rank sent has been received, and releases their buffers: call
 * it at the end of a step so that the sender's counters hold no message. */
gp_status gp_transport_flush(gp_transport *tr, int rank);

/* In place: x[i] = sum over ranks r = 0, 1, ..., K-1 of x_r[i], added in that order starting
 * from rank 0's value, whatever order the ranks arrive in, so the result has the same bits on
 * every run and every rank. Every rank calls it with the same n (n = 0 is a barrier). */
gp_status gp_transport_allreduce_sum(gp_transport *tr, int rank, double *x, int n);
gp_status gp_transport_barrier(gp_transport *tr, int rank);

/* The float collectives of one mesh axis, each called by every rank with the same n, in the
 * same order. Every element's result is computed by one rank in a fixed order (a sum: rank 0's
 * value, then + rank 1's, ..., whatever order the ranks arrive in) and handed to the others, so
 * every rank gets the same bits on every run, and threads and MPI give the same bits. The buffers
 * must be memory the implementation reaches: host memory for threads and MPI (a GPU transport,
 * NCCL, would take device buffers in the same calls).
 * - all-reduce: x (n floats) in place becomes the sum (or max) over the ranks;
 * - all-gather: out (nranks * n) = rank 0's x, rank 1's x, ...;
 * - reduce-scatter: x (nranks * n) on every rank; out (n) = the sum over the ranks of their
 *   block `rank` of x, x[rank * n .. rank * n + n). */
gp_status gp_transport_allreduce_f32(gp_transport *tr, int rank, float *x, int64_t n,
                                     gp_reduce_op op);
gp_status gp_transport_allgather_f32(gp_transport *tr, int rank, const float *x, int64_t n,
                                     float *out);
gp_status gp_transport_reduce_scatter_f32(gp_transport *tr, int rank, const float *x, int64_t n,
                                          float *out);

/* Marks the run failed by `rank` (callable from any thread, once or many times: the first wins).
 * Every rank blocked in the transport wakes, and every later blocking call fails at once, with
 * GP_IO and a message naming the rank that failed, what it was doing and `why`. The transport
 * also aborts itself on its own failures (a timeout, a header mismatch), so one failing stage
 * stops all. */
void gp_transport_abort(gp_transport *tr, int rank, gp_status s, const char *why);
/* Whether the run was aborted; *rank (may be NULL) gets the rank that failed first. */
bool gp_transport_aborted(gp_transport *tr, int *rank);

#endif
