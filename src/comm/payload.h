/* The payload hook of the MPI transport (gp_transport_payload): what the process grid
 * (mpi_grid.h) takes from the launcher and the MPI transport (mpi_transport.h) calls, in a header
 * of its own so that neither includes the other for it. No MPI type appears here. */
#ifndef GP_COMM_PAYLOAD_H
#define GP_COMM_PAYLOAD_H

#include "comm/transport_iface.h"

/* A way around MPI for the payloads of some links (NCCL between GPUs: device memory, no host
 * copy); the headers still travel over MPI and are checked first. Ranks are the transport's. */
typedef struct gp_transport_payload {
    void *ctx;
    /* whether the payload of a message on this link (to peer when sending, from it when not)
     * takes the hook; the two ends of a link must agree */
    bool (*carries)(void *ctx, int peer, gp_msg_tag tag, bool sending);
    /* starts sending t's payload; *op (NULL: done already) until done() says it is done; t
     * stays owned by the transport until then */
    gp_status (*send)(void *ctx, int peer, gp_msg_tag tag, const gp_tensor *t, void **op);
    /* starts receiving the payload into out, whose header was checked; the transport waits for
     * *op within its deadline */
    gp_status (*recv)(void *ctx, int peer, gp_msg_tag tag, gp_tensor *out, void **op);
    /* whether op is done; op is gone once this says done or fails, or after forget (a failed
     * run: nothing waits for it) */
    gp_status (*done)(void *ctx, void *op, bool *done);
    void (*forget)(void *ctx, void *op);
} gp_transport_payload;

#endif
