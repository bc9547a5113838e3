/* The transport's public wrappers: argument checks shared by every implementation, so that one
 * only sees valid ranks, tags and tensors, and the one ownership rule (send takes the tensor). */
#include "comm/transport_iface.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

char *gp_msg_tag_str(gp_msg_tag tag, char *buf, size_t n) {
    const char *kind = tag.kind == GP_MSG_ACT    ? "ACT"
                       : tag.kind == GP_MSG_GRAD ? "GRAD"
                       : tag.kind == GP_MSG_TIE  ? "TIE"
                                                 : "?";
    if (tag.link)
        snprintf(buf, n, "%s(mb %d, link %d)", kind, tag.mb, tag.link);
    else
        snprintf(buf, n, "%s(mb %d)", kind, tag.mb);
    return buf;
}

void gp_transport_free(gp_transport *tr) {
    if (!tr) return;
    if (tr->iface && tr->iface->free) tr->iface->free(tr->context);
    free(tr);
}

static gp_status check_ranks(const gp_transport *tr, const char *what, int rank, int peer) {
    if (!tr || !tr->iface) return gp_error(GP_INVALID_ARGUMENT, "%s: transport is NULL", what);
    if (rank < 0 || rank >= tr->nranks)
        return gp_error(GP_INVALID_ARGUMENT, "%s: rank %d out of range 0..%d", what, rank,
                        tr->nranks - 1);
    if (peer == rank || peer < -1 || peer >= tr->nranks)
        return gp_error(GP_INVALID_ARGUMENT, "%s by rank %d: peer %d must be another rank in 0..%d",
                        what, rank, peer, tr->nranks - 1);
    return GP_OK;
}

static gp_status check_tag(const char *what, int rank, gp_msg_tag tag) {
    if ((int)tag.kind < 0 || tag.kind >= GP_MSG_NKINDS || tag.mb < 0 || tag.link < 0 ||
        tag.link >= GP_MSG_MAX_LINKS)
        return gp_error(GP_INVALID_ARGUMENT,
                        "%s by rank %d: bad tag (kind %d, micro-batch %d, link %d)", what, rank,
                        (int)tag.kind, tag.mb, tag.link);
    return GP_OK;
}

gp_status gp_transport_send(gp_transport *tr, int rank, int peer, gp_msg_tag tag, gp_tensor *t) {
    if (!t) return gp_error(GP_INVALID_ARGUMENT, "send by rank %d: tensor is NULL", rank);
    gp_status s = check_ranks(tr, "send", rank, peer);
    if (s == GP_OK && peer < 0) s = gp_error(GP_INVALID_ARGUMENT, "send by rank %d: no peer", rank);
    if (s == GP_OK) s = check_tag("send", rank, tag);
    if (s == GP_OK && (!t->owned || !t->data || !t->dev))
        s = gp_error(GP_INVALID_ARGUMENT,
                     "send by rank %d to rank %d: the tensor must be owned (from gp_tensor_alloc): "
                     "send takes it over",
                     rank, peer);
    if (s != GP_OK) {
        gp_tensor_release(t); /* the rule holds on every path: send takes the tensor */
        memset(t, 0, sizeof *t);
        return s;
    }
    return tr->iface->send(tr->context, rank, peer, tag, t);
}

gp_status gp_transport_recv(gp_transport *tr, int rank, int peer, gp_msg_tag tag, gp_tensor *out) {
    GP_TRY(check_ranks(tr, "recv", rank, peer));
    if (peer < 0) return gp_error(GP_INVALID_ARGUMENT, "recv by rank %d: no peer", rank);
    GP_TRY(check_tag("recv", rank, tag));
    if (!out || (!out->data && gp_tensor_nbytes(out) > 0))
        return gp_error(GP_INVALID_ARGUMENT,
                        "recv by rank %d from rank %d: the output tensor must be allocated with "
                        "the expected shape and dtype",
                        rank, peer);
    return tr->iface->recv(tr->context, rank, peer, tag, out);
}

gp_status gp_transport_flush(gp_transport *tr, int rank) {
    GP_TRY(check_ranks(tr, "flush", rank, -1));
    return tr->iface->flush(tr->context, rank);
}

gp_status gp_transport_allreduce_sum(gp_transport *tr, int rank, double *x, int n) {
    GP_TRY(check_ranks(tr, "all-reduce", rank, -1));
    if (n < 0 || (n > 0 && !x))
        return gp_error(GP_INVALID_ARGUMENT, "all-reduce by rank %d: %d values at %p", rank, n,
                        (void *)x);
    return tr->iface->allreduce_sum(tr->context, rank, x, n);
}

gp_status gp_transport_barrier(gp_transport *tr, int rank) {
    GP_TRY(check_ranks(tr, "barrier", rank, -1));
    if (tr->iface->barrier) return tr->iface->barrier(tr->context, rank);
    return tr->iface->allreduce_sum(tr->context, rank, NULL, 0);
}

static gp_status check_floats(const gp_transport *tr, const char *what, int rank, const void *x,
                              int64_t n, const void *out, bool need_out) {
    GP_TRY(check_ranks(tr, what, rank, -1));
    if (n < 0 || (n > 0 && (!x || (need_out && !out))))
        return gp_error(GP_INVALID_ARGUMENT, "%s by rank %d: %lld floats at %p (output %p)", what,
                        rank, (long long)n, x, out);
    return GP_OK;
}

gp_status gp_transport_allreduce_f32(gp_transport *tr, int rank, float *x, int64_t n,
                                     gp_reduce_op op) {
    GP_TRY(check_floats(tr, "float all-reduce", rank, x, n, NULL, false));
    if (op != GP_REDUCE_SUM && op != GP_REDUCE_MAX)
        return gp_error(GP_INVALID_ARGUMENT, "float all-reduce by rank %d: op %d is neither sum "
                                             "(%d) nor max (%d)",
                        rank, (int)op, GP_REDUCE_SUM, GP_REDUCE_MAX);
    return tr->iface->allreduce_f32(tr->context, rank, x, n, op);
}

gp_status gp_transport_allgather_f32(gp_transport *tr, int rank, const float *x, int64_t n,
                                     float *out) {
    GP_TRY(check_floats(tr, "all-gather", rank, x, n, out, true));
    return tr->iface->allgather_f32(tr->context, rank, x, n, out);
}

gp_status gp_transport_reduce_scatter_f32(gp_transport *tr, int rank, const float *x, int64_t n,
                                          float *out) {
    GP_TRY(check_floats(tr, "reduce-scatter", rank, x, n, out, true));
    return tr->iface->reduce_scatter_f32(tr->context, rank, x, n, out);
}

void gp_transport_abort(gp_transport *tr, int rank, gp_status s, const char *why) {
    if (!tr || !tr->iface) return;
    tr->iface->abort(tr->context, rank, s, why ? why : "");
}

bool gp_transport_aborted(gp_transport *tr, int *rank) {
    if (!tr || !tr->iface) return false;
    return tr->iface->aborted(tr->context, rank);
}
