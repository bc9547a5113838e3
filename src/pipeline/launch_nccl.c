/* NCCL between the MPI launcher's GPU ranks (launch_nccl.h). The choice is made once, by every
 * rank from the same facts (the device kind, whether the CUDA module has NCCL, the GPUs' UUIDs
 * gathered over MPI), so all take the same path. With NCCL, rank 0's ncclUniqueId reaches the
 * others over MPI and makes one communicator of every rank, split into the data-parallel groups
 * (a stage shard's D replicas) and into one communicator per direction between neighbouring
 * stages: a direction's messages then run on a stream of their own in the order both ends post
 * them (FIFO, as the transport's links are), so an activation waiting for its receiver never
 * holds up a gradient going the other way. The headers still travel over MPI and are checked
 * before the payload moves. The communicators are non-blocking: every wait for NCCL (a call in
 * progress, a message, the gradient sums, and any host wait on the GPU's stream while sums are
 * queued on it) is the grid's bounded wait, which also polls NCCL's asynchronous errors and the
 * peers' abort notes, and after a failure the communicators are aborted, not destroyed, so no
 * rank waits past --comm-timeout for a peer that failed. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "comm/gpu_comm.h"
#include "comm/mpi_grid.h"
#include "core/device.h"
#include "kernels/cuda_module.h"
#include "kernels/kernels.h"
#include "pipeline/launch_nccl.h"
#include "pipeline/launcher.h"
#include "pipeline/stage.h"

struct gp_nccl_state {
    const gp_nccl_calls *calls;
    gp_device *dev; /* this rank's stage GPU */
    gp_grid *grid;
    int K, V, stage, replica, D;
    bool tree;
    gp_nccl_comm *world, *dp;
    /* [parity][0: activations, lower stage to upper; 1: gradients, upper to lower]: the
     * communicator of the neighbours (k, k + 1) with k of that parity, rank 0 the lower */
    gp_nccl_comm *link[2][2];
    gp_tensor scratch; /* a partner's partial sum in a pairwise round (kept, grown) */
    bool hooked;       /* the grid's pipe transport holds this state's payload hook */
    bool queued;       /* gradient sums queued on the GPU's stream, not yet seen done */
    bool aborted;      /* the communicators were aborted (a wait for them failed) */
};

typedef struct comm_poll {
    const gp_nccl_calls *calls;
    gp_nccl_comm *c;
} comm_poll;

static gp_status poll_ready(void *ctx, bool *done) {
    comm_poll *cp = ctx;
    return cp->calls->ready(cp->c, done);
}

/* Until c has finished the calls made on it (a non-blocking communicator's), within the grid's
 * deadline; NULL: nothing to wait for. */
static gp_status wait_ready(gp_nccl_state *n, gp_nccl_comm *c, const char *doing) {
    if (!c) return GP_OK;
    comm_poll cp = {n->calls, c};
    return gp_grid_wait_for(n->grid, poll_ready, &cp, doing);
}

typedef struct op_poll {
    const gp_nccl_calls *calls;
    void *op;
} op_poll;

static gp_status poll_op(void *ctx, bool *done) {
    op_poll *o = ctx;
    const gp_status s = o->calls->op_done(o->op, done);
    if (s != GP_OK || *done) o->op = NULL; /* gone */
    return s;
}

/* The communicator of this rank's messages to or from its neighbour peer, and peer's rank in
 * it; NULL where NCCL does not carry them (MPI with host staging does). */
static gp_nccl_comm *link_of(const gp_nccl_state *n, int peer, gp_msg_tag tag, bool sending,
                             int *peer_rank) {
    if (n->V != 1 || tag.link != 0 || (peer != n->stage - 1 && peer != n->stage + 1)) return NULL;
    const int lower = peer < n->stage ? peer : n->stage;
    const bool up = (peer > n->stage) == sending; /* the message goes lower to upper */
    if (tag.kind == GP_MSG_ACT && !up) return NULL;
    if (tag.kind == GP_MSG_GRAD && up) return NULL;
    if (tag.kind != GP_MSG_ACT && tag.kind != GP_MSG_GRAD) return NULL;
    *peer_rank = peer == lower ? 0 : 1;
    return n->link[lower % 2][tag.kind == GP_MSG_GRAD];
}

static bool hook_carries(void *ctx, int peer, gp_msg_tag tag, bool sending) {
    int r;
    return link_of(ctx, peer, tag, sending, &r) != NULL;
}

static gp_status hook_send(void *ctx, int peer, gp_msg_tag tag, const gp_tensor *t, void **op) {
    gp_nccl_state *n = ctx;
    int r = 0;
    gp_nccl_comm *c = link_of(n, peer, tag, true, &r);
    GP_TRY(n->calls->send(c, n->dev, t->data, gp_tensor_nbytes(t), r, op));
    const gp_status s = wait_ready(n, c, "queueing an NCCL send");
    if (s != GP_OK && *op) n->calls->op_forget(*op), *op = NULL;
    return s;
}

static gp_status hook_recv(void *ctx, int peer, gp_msg_tag tag, gp_tensor *out, void **op) {
    gp_nccl_state *n = ctx;
    int r = 0;
    gp_nccl_comm *c = link_of(n, peer, tag, false, &r);
    GP_TRY(n->calls->recv(c, n->dev, out->data, gp_tensor_nbytes(out), r, op));
    const gp_status s = wait_ready(n, c, "queueing an NCCL receive");
    if (s != GP_OK && *op) n->calls->op_forget(*op), *op = NULL;
    return s;
}

static gp_status hook_done(void *ctx, void *op, bool *done) {
    return ((gp_nccl_state *)ctx)->calls->op_done(op, done);
}

static void hook_forget(void *ctx, void *op) { ((gp_nccl_state *)ctx)->calls->op_forget(op); }

/* Every communicator ended by `end` (NULL after), its messages' operations forgotten first. */
static void end_comms(gp_nccl_state *n, void (*end)(gp_nccl_comm *)) {
    if (n->hooked) gp_grid_set_payload(n->grid, NULL);
    n->hooked = false;
    for (int i = 0; i < 2; i++)
        for (int j = 0; j < 2; j++) end(n->link[i][j]), n->link[i][j] = NULL;
    end(n->dp);
    end(n->world);
    n->dp = n->world = NULL;
}

void gp_launch_nccl_free(gp_nccl_state *n) {
    if (!n) return;
    gp_device_bound_waits(n->dev, NULL, NULL);
    /* After a failure a peer may never match what is queued: abort, and wait for nothing. */
    end_comms(n, gp_grid_failed(n->grid) ? n->calls->comm_abort : n->calls->comm_free);
    gp_tensor_release(&n->scratch); /* after the communicators: nothing of NCCL's reads it */
    gp_device_hold_frees(n->dev, false);
    free(n);
}

/* Until the gradient sums queued on the GPU's stream are done, within the comm timeout, polling
 * NCCL's asynchronous errors (the data-parallel communicator's) and the peers' abort notes. On
 * a failure (the deadline, an error) the run is aborted (the grid's wait tells the peers) and so
 * are the communicators at once: NCCL then ends the collective that holds the stream, so that no
 * later wait on the GPU (a free, the device's own teardown) waits for it either. */
static gp_status sums_done(gp_nccl_state *n, const char *doing) {
    if (n->aborted)
        return gp_error(GP_IO, "%s: the NCCL communicators were aborted after an earlier failure",
                        doing);
    if (!n->queued) return GP_OK;
    op_poll o = {n->calls, NULL};
    gp_status s = n->calls->mark(n->dp, n->dev, &o.op);
    if (s != GP_OK) gp_grid_abort(n->grid, s, gp_last_error()); /* the wait's failures abort */
    else s = gp_grid_wait_for(n->grid, poll_op, &o, doing);
    if (o.op) n->calls->op_forget(o.op);
    if (s == GP_OK) {
        n->queued = false;
        return GP_OK;
    }
    end_comms(n, n->calls->comm_abort);
    n->aborted = true;
    return s;
}

/* The GPU's host waits while sums may be queued on its stream (gp_device_bound_waits): the
 * stream's own wait (cudaStreamSynchronize) has no deadline, and a replica gone mid-backward
 * would hold it forever. */
static gp_status bounded_wait(void *ctx, const char *what) {
    char doing[192];
    snprintf(doing, sizeof doing,
             "waiting for the GPU's stream (%s) behind the replicas' NCCL gradient sums", what);
    return sums_done(ctx, doing);
}

/* Every rank's 16-byte GPU UUID (world order) into ids; the first two ranks that share one. */
static gp_status gather_gpus(gp_grid *g, const unsigned char mine[16], gp_gpu_comm_facts *f,
                             char *gpu, size_t ngpu) {
    const int W = gp_grid_world_size(g);
    size_t *off = calloc((size_t)W + 1, sizeof *off);
    if (!off) return gp_error(GP_OUT_OF_MEMORY, "GPU identities of %d ranks", W);
    void *all = NULL;
    gp_status s = gp_grid_allgatherv(g, mine, 16, &all, off);
    if (s == GP_OK && off[W] != (size_t)W * 16)
        s = gp_error(GP_INTERNAL, "GPU identities: %zu bytes from %d ranks", off[W], W);
    if (s == GP_OK && gp_gpu_comm_shared(all, W, 16, &f->shared_a, &f->shared_b)) {
        const unsigned char *u = (const unsigned char *)all + (size_t)f->shared_a * 16;
        snprintf(gpu, ngpu, "GPU-%02x%02x%02x%02x-%02x%02x", u[0], u[1], u[2], u[3], u[4], u[5]);
        f->shared_gpu = gpu;
    }
    free(all);
    free(off);
    return s;
}

/* Rank 0's unique id on every rank. */
static gp_status share_id(gp_grid *g, const gp_nccl_calls *calls, unsigned char id[GP_NCCL_ID_BYTES]) {
    const int W = gp_grid_world_size(g), me = gp_grid_world_rank(g);
    if (me == 0) GP_TRY(calls->unique_id(id));
    size_t *off = calloc((size_t)W + 1, sizeof *off);
    if (!off) return gp_error(GP_OUT_OF_MEMORY, "NCCL id for %d ranks", W);
    void *all = NULL;
    gp_status s = gp_grid_allgatherv(g, id, me == 0 ? GP_NCCL_ID_BYTES : 0, &all, off);
    if (s == GP_OK && off[1] != GP_NCCL_ID_BYTES)
        s = gp_error(GP_INTERNAL, "NCCL id: rank 0 shared %zu bytes, not %d", off[1],
                     GP_NCCL_ID_BYTES);
    if (s == GP_OK) memcpy(id, all, GP_NCCL_ID_BYTES);
    free(all);
    free(off);
    return s;
}

/* A split's parent, then its part (none: this rank in no part), done. */
static gp_status split_ready(gp_nccl_state *n, gp_nccl_comm *part) {
    GP_TRY(wait_ready(n, n->world, "splitting the NCCL communicator"));
    return wait_ready(n, part, "making a part of the NCCL communicator");
}

/* The communicators: every rank, then the splits every rank takes part in, in one order; each
 * wait bounded, so a rank that fails part-way (it aborts) does not leave the others waiting. */
static gp_status make_comms(gp_nccl_state *n, gp_pipeline *p) {
    unsigned char id[GP_NCCL_ID_BYTES] = {0};
    GP_TRY(share_id(n->grid, n->calls, id));
    GP_TRY(n->calls->comm_new(n->dev, id, p->nranks, p->rank, &n->world));
    GP_TRY(wait_ready(n, n->world, "making the NCCL communicator of every rank"));
    const int T = p->T, line = n->replica * T + p->my_shard; /* this rank's pipeline */
    if (n->D > 1) {
        GP_TRY(n->calls->comm_split(n->world, n->dev, n->stage * T + p->my_shard, n->replica,
                                    &n->dp));
        GP_TRY(split_ready(n, n->dp));
    }
    for (int parity = 0; parity < 2 && n->V == 1; parity++) {
        /* this rank's pair of that parity: (k, k + 1) or (k - 1, k) */
        int lower = -1;
        if (n->stage % 2 == parity && n->stage + 1 < n->K) lower = n->stage;
        else if (n->stage > 0 && (n->stage - 1) % 2 == parity) lower = n->stage - 1;
        for (int dir = 0; dir < 2; dir++) {
            GP_TRY(n->calls->comm_split(n->world, n->dev, lower < 0 ? -1 : line * n->K + lower,
                                        n->stage - (lower < 0 ? 0 : lower),
                                        &n->link[parity][dir]));
            GP_TRY(split_ready(n, n->link[parity][dir]));
        }
    }
    return GP_OK;
}

gp_status gp_launch_nccl_setup(gp_pipeline *p, gp_grid *grid, gp_gpu_comm want,
                               gp_nccl_state **out) {
    *out = NULL;
    gp_stage *me = gp_worker(p, p->my_stage, p->my_shard);
    gp_gpu_comm_facts f = {.cuda = !gp_device_is_host(me->dev), .shared_a = -1, .shared_b = -1};
    const gp_nccl_calls *calls = NULL;
    char missing[320] = "", gpu[32] = "";
    if (f.cuda && gp_cuda_nccl(&calls) != GP_OK) {
        snprintf(missing, sizeof missing, "%s", gp_last_error());
        f.nccl_missing = missing;
    }
    if (calls) {
        unsigned char uuid[16] = {0};
        gp_status s = calls->gpu_uuid(me->dev, uuid);
        if (s != GP_OK) {
            gp_grid_abort(grid, s, gp_last_error());
            return s;
        }
        GP_TRY(gather_gpus(grid, uuid, &f, gpu, sizeof gpu));
    }
    gp_gpu_comm use;
    char why[320];
    GP_TRY(gp_gpu_comm_choose(want, &f, &use, why, sizeof why));
    gp_pipeline_set_gpu_comm(p, use, why);
    if (use != GP_GPU_COMM_NCCL) return GP_OK;
    gp_nccl_state *n = calloc(1, sizeof *n);
    if (!n) return gp_error(GP_OUT_OF_MEMORY, "NCCL: cannot allocate its state");
    *n = (gp_nccl_state){.calls = calls, .dev = me->dev, .grid = grid, .K = p->K, .V = p->V,
                         .stage = p->my_stage, .replica = p->replica, .D = p->D,
                         .tree = p->grad_sum == GP_GRAD_SUM_TREE};
    gp_status s = make_comms(n, p);
    if (s != GP_OK) {
        gp_grid_abort(grid, s, gp_last_error());
        gp_launch_nccl_free(n);
        return gp_error_context(s, "NCCL between the GPU ranks (--gpu-comm mpi avoids it)");
    }
    const gp_transport_payload hook = {.ctx = n, .carries = hook_carries, .send = hook_send,
                                       .recv = hook_recv, .done = hook_done,
                                       .forget = hook_forget};
    gp_grid_set_payload(grid, &hook);
    n->hooked = true;
    gp_device_bound_waits(n->dev, bounded_wait, n);
    /* From here the GPU's frees wait for a step's end (gp_launch_nccl_step_end): a cudaFree
     * mid-step waits for the whole GPU, NCCL's kernels too, whose peers may be waiting for this
     * rank to go on (the scratch below growing, a memory limit's trim, a size with no cache bin). */
    gp_device_hold_frees(n->dev, true);
    *out = n;
    return GP_OK;
}

gp_status gp_launch_nccl_grads(gp_nccl_state *n, const gp_tensor *slice) {
    if (n->aborted)
        return gp_error(GP_IO, "NCCL gradient sum: the communicators were aborted after an "
                               "earlier failure");
    const int64_t count = gp_tensor_nelem(slice);
    float *x = slice->data;
    const int rounds = gp_dp_pair_rounds(n->D, n->tree);
    gp_grid_count_allreduce(n->grid, (uint64_t)count * sizeof(float));
    n->queued = true; /* from the first call on: a failed one may have queued part */
    if (rounds == 0) {
        GP_TRY(n->calls->allreduce_f32(n->dp, n->dev, x, count));
        return wait_ready(n, n->dp, "queueing the replicas' NCCL all-reduce");
    }
    if (gp_tensor_nelem(&n->scratch) < count) {
        /* Released while the stream may still read it: the device holds the block until the
         * step's end (gp_device_hold_frees), and cudaFree then waits for the stream's work. */
        gp_tensor_release(&n->scratch);
        GP_TRY(gp_tensor_alloc(n->dev, GP_MEM_GRADS, gp_shape1(count), GP_F32, &n->scratch));
    }
    float *y = n->scratch.data;
    for (int r = 0; r < rounds; r++) {
        const int partner = gp_dp_partner(n->replica, r);
        GP_TRY(n->calls->exchange(n->dp, n->dev, x, partner, y, partner,
                                  (size_t)count * sizeof(float)));
        GP_TRY(wait_ready(n, n->dp, "queueing the replicas' NCCL exchange"));
        GP_TRY(gp_kernels_of(n->dev)->axpy(n->dev, count, 1.0f, y, x)); /* x + y, as the host's */
    }
    return GP_OK;
}

gp_status gp_launch_nccl_grads_wait(gp_nccl_state *n) {
    return sums_done(n, "waiting for the replicas' NCCL gradient sums");
}

void gp_launch_nccl_step_end(gp_nccl_state *n) {
    if (n && !gp_grid_failed(n->grid)) gp_device_release_held(n->dev);
}
