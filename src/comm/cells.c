/* Cells over ranks: the pipeline's cells as the ranks of a transport whose own ranks are the
 * stages (a stage running V cells, an MPI process each). Each message goes between the stages of
 * its two cells, numbered by its link (the lower cell), so that the links of several cells
 * between the same two stages keep their own order and capacity; two cells of one stage talk
 * through that stage's link to itself. The collectives are the stages' business, not the
 * cells': they fail here. */
#include <stdlib.h>
#include <string.h>

#include "comm/cells.h"

typedef struct cells_ctx {
    gp_transport *inner;
    int ncells;
    int *rank_of; /* (ncells) the inner rank of each cell */
} cells_ctx;

/* The inner transport's own entry points, past the wrapper's checks: a cell may talk to a cell
 * of its own stage, which the wrapper (peer != rank) would refuse. */
static const gp_transport_iface *in(const cells_ctx *c) { return c->inner->iface; }

static gp_msg_tag on_link(gp_msg_tag tag, int rank, int peer) {
    tag.link = rank < peer ? rank : peer;
    return tag;
}

static gp_status cells_send(void *ctx, int rank, int peer, gp_msg_tag tag, gp_tensor *t) {
    cells_ctx *c = ctx;
    return in(c)->send(c->inner->context, c->rank_of[rank], c->rank_of[peer],
                       on_link(tag, rank, peer), t);
}

static gp_status cells_recv(void *ctx, int rank, int peer, gp_msg_tag tag, gp_tensor *out) {
    cells_ctx *c = ctx;
    return in(c)->recv(c->inner->context, c->rank_of[rank], c->rank_of[peer],
                       on_link(tag, rank, peer), out);
}

static gp_status cells_flush(void *ctx, int rank) {
    cells_ctx *c = ctx;
    return in(c)->flush(c->inner->context, c->rank_of[rank]);
}

static gp_status no_collective(int rank) {
    return gp_error(GP_UNSUPPORTED,
                    "transport of cells: cell %d called a collective; the cells' transport "
                    "carries point-to-point messages only (collectives go over the stages')",
                    rank);
}

static gp_status cells_allreduce_sum(void *ctx, int rank, double *x, int n) {
    (void)ctx, (void)x, (void)n;
    return no_collective(rank);
}

static gp_status cells_allreduce_f32(void *ctx, int rank, float *x, int64_t n, gp_reduce_op op) {
    (void)ctx, (void)x, (void)n, (void)op;
    return no_collective(rank);
}

static gp_status cells_allgather_f32(void *ctx, int rank, const float *x, int64_t n, float *out) {
    (void)ctx, (void)x, (void)n, (void)out;
    return no_collective(rank);
}

static gp_status cells_reduce_scatter_f32(void *ctx, int rank, const float *x, int64_t n,
                                          float *out) {
    (void)ctx, (void)x, (void)n, (void)out;
    return no_collective(rank);
}

static void cells_abort(void *ctx, int rank, gp_status s, const char *why) {
    cells_ctx *c = ctx;
    in(c)->abort(c->inner->context, c->rank_of[rank], s, why);
}

/* *rank gets the first cell of the stage that failed first. */
static bool cells_aborted(void *ctx, int *rank) {
    cells_ctx *c = ctx;
    int r = -1;
    const bool a = in(c)->aborted(c->inner->context, &r);
    if (rank) {
        *rank = -1;
        for (int i = 0; a && i < c->ncells && *rank < 0; i++)
            if (c->rank_of[i] == r) *rank = i;
    }
    return a;
}

static void cells_free(void *ctx) {
    cells_ctx *c = ctx;
    if (!c) return;
    free(c->rank_of);
    free(c);
}

static const gp_transport_iface cells_iface = {
    .name = "cells",
    .send = cells_send,
    .recv = cells_recv,
    .flush = cells_flush,
    .allreduce_sum = cells_allreduce_sum,
    .allreduce_f32 = cells_allreduce_f32,
    .allgather_f32 = cells_allgather_f32,
    .reduce_scatter_f32 = cells_reduce_scatter_f32,
    .abort = cells_abort,
    .aborted = cells_aborted,
    .free = cells_free,
};

gp_status gp_transport_cells_new(gp_transport *inner, int ncells, const int *rank_of,
                                 gp_transport **out) {
    if (!out) return gp_error(GP_INVALID_ARGUMENT, "transport of cells: NULL output");
    *out = NULL;
    if (!inner || !inner->iface || !rank_of || ncells < 1 || ncells > GP_MSG_MAX_LINKS)
        return gp_error(GP_INVALID_ARGUMENT,
                        "transport of cells: needs a transport, 1 to %d cells (got %d) and "
                        "each cell's rank",
                        GP_MSG_MAX_LINKS, ncells);
    for (int i = 0; i < ncells; i++)
        if (rank_of[i] < 0 || rank_of[i] >= inner->nranks)
            return gp_error(GP_INVALID_ARGUMENT,
                            "transport of cells: cell %d on rank %d, outside the %s "
                            "transport's 0..%d",
                            i, rank_of[i], inner->iface->name, inner->nranks - 1);
    cells_ctx *c = calloc(1, sizeof *c);
    gp_transport *tr = calloc(1, sizeof *tr);
    if (c) c->rank_of = malloc((size_t)ncells * sizeof *c->rank_of);
    if (!c || !tr || !c->rank_of) {
        cells_free(c);
        free(tr);
        return gp_error(GP_OUT_OF_MEMORY, "transport of cells: %d cells", ncells);
    }
    memcpy(c->rank_of, rank_of, (size_t)ncells * sizeof *rank_of);
    c->inner = inner;
    c->ncells = ncells;
    tr->iface = &cells_iface;
    tr->context = c;
    tr->nranks = ncells;
    *out = tr;
    return GP_OK;
}
