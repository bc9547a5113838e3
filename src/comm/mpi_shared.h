/* The MPI failure state and its waits (mpi_shared.c), which the transport (mpi_transport.c) and
 * the process grid (mpi_grid.c) both build on: the per-process failure state that every wait
 * polls, so that one rank's failure stops every other rank within the timeout, and the
 * deadline-bounded wait on an MPI request. Only compiled with MPI (GP_HAVE_MPI); nothing outside
 * src/comm includes it. */
#ifndef GP_COMM_MPI_SHARED_H
#define GP_COMM_MPI_SHARED_H

#include <mpi.h>
#include <stdbool.h>
#include <stdint.h>

#include "core/error.h"

/* Tags on the shared world communicator (abort notes) and on each transport's own. */
enum {
    GP_MPI_TAG_ABORT = 1,
    GP_MPI_TAG_HDR = 10, /* + 2 (kind + GP_MSG_NKINDS link): a message's header */
    GP_MPI_TAG_DATA = 11 /* + 2 (kind + GP_MSG_NKINDS link): its payload */
};

/* One per process, shared by every transport and collective of its grid. */
typedef struct gp_mpi_shared {
    MPI_Comm world; /* a duplicate of MPI_COMM_WORLD: abort notes travel here */
    int world_rank, world_size;
    double timeout_s;
    /* the first failure seen by this process, its own or a peer's note */
    bool aborted;
    int abort_rank;
    char abort_msg[640];
    /* abort notes this process sent (world_size - 1 of them at most) */
    MPI_Request *note_req;
    char *note_buf;
    bool notes_sent;
    /* bytes this process handed to MPI in the current step */
    uint64_t bytes_p2p;       /* headers and payloads of point-to-point messages */
    uint64_t bytes_allreduce; /* gradient buckets given to the data-parallel all-reduce */
} gp_mpi_shared;

/* An abort note: who failed and why. */
typedef struct gp_mpi_note {
    int rank;
    int status;
    char msg[600];
} gp_mpi_note;

/* Marks the run failed by world rank `rank` and sends a note to every other world rank (once;
 * non-blocking). */
void gp_mpi_shared_abort(gp_mpi_shared *sh, int rank, gp_status s, const char *why);
/* True when this process has failed or a peer's note has arrived (which it then records). */
bool gp_mpi_shared_poll(gp_mpi_shared *sh);
/* "rank 3 (stage 1): stopped <doing>: the run was aborted by rank 2 (why)", GP_IO. */
gp_status gp_mpi_aborted_error(gp_mpi_shared *sh, const char *who, const char *doing);

/* Monotonic deadline helpers (seconds). */
double gp_mpi_deadline(const gp_mpi_shared *sh);

/* Waits for *req until done, the deadline, a peer's abort note, or an MPI error. `who` names
 * this side ("rank 0 (stage 0)") and `doing` the action ("receiving ACT(mb 3) from rank 1
 * (stage 1)"): both go into the message. A timeout or an MPI error aborts the run (notes to
 * every rank) and returns GP_IO; a peer's note returns GP_IO naming that peer. */
gp_status gp_mpi_wait(gp_mpi_shared *sh, MPI_Request *req, double deadline, const char *who,
                      const char *doing);
/* The same wait for anything else that can be polled (an NCCL send's event): poll sets *done,
 * or fails (its error is returned as it is). */
typedef gp_status (*gp_mpi_poll_fn)(void *ctx, bool *done);
gp_status gp_mpi_wait_for(gp_mpi_shared *sh, gp_mpi_poll_fn poll, void *ctx, double deadline,
                          const char *who, const char *doing);

/* Whether any run of this process failed (its own failure or a peer's note): MPI_Finalize would
 * then wait for dead peers. */
bool gp_mpi_shared_failed(void);

#endif
