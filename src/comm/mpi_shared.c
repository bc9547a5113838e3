/* The MPI failure state and its waits, shared by the transport (mpi_transport.c) and
 * the process grid (mpi_grid.c), which both call in here and never the other way: one rank's
 * failure reaches every other rank as a note that every wait polls, so all stop within the
 * timeout. Whether a run failed is process-wide, as MPI is (gp_mpi_finalize asks). */
#ifdef GP_HAVE_MPI
#include <stdio.h>
#include <time.h>

#include "core/clock.h"
#include "comm/mpi_shared.h"

static bool g_failed; /* a run failed, by this process or a peer */

bool gp_mpi_shared_failed(void) { return g_failed; }

double gp_mpi_deadline(const gp_mpi_shared *sh) { return gp_now() + sh->timeout_s; }

void gp_mpi_shared_abort(gp_mpi_shared *sh, int rank, gp_status s, const char *why) {
    g_failed = true;
    if (!sh->aborted) {
        sh->aborted = true;
        sh->abort_rank = rank;
        snprintf(sh->abort_msg, sizeof sh->abort_msg, "%s: %.600s", gp_status_name(s), why);
    }
    if (sh->notes_sent || rank != sh->world_rank) return;
    /* Only the process that failed tells the others; its note carries its message. */
    sh->notes_sent = true;
    gp_mpi_note *note = (gp_mpi_note *)sh->note_buf;
    note->rank = rank;
    note->status = (int)s;
    snprintf(note->msg, sizeof note->msg, "%.599s", sh->abort_msg);
    int j = 0;
    for (int r = 0; r < sh->world_size; r++)
        if (r != sh->world_rank)
            MPI_Isend(note, (int)sizeof *note, MPI_BYTE, r, GP_MPI_TAG_ABORT, sh->world,
                      &sh->note_req[j++]);
}

bool gp_mpi_shared_poll(gp_mpi_shared *sh) {
    if (sh->aborted) return true;
    int flag = 0;
    MPI_Status st;
    if (MPI_Iprobe(MPI_ANY_SOURCE, GP_MPI_TAG_ABORT, sh->world, &flag, &st) != MPI_SUCCESS || !flag)
        return false;
    gp_mpi_note note;
    MPI_Recv(&note, (int)sizeof note, MPI_BYTE, st.MPI_SOURCE, GP_MPI_TAG_ABORT, sh->world,
             MPI_STATUS_IGNORE);
    note.msg[sizeof note.msg - 1] = '\0';
    g_failed = true;
    sh->aborted = true;
    sh->abort_rank = note.rank;
    snprintf(sh->abort_msg, sizeof sh->abort_msg, "%s", note.msg);
    return true;
}

gp_status gp_mpi_aborted_error(gp_mpi_shared *sh, const char *who, const char *doing) {
    return gp_error(GP_IO, "%s: stopped %s: the run was aborted by rank %d (%s)", who, doing,
                    sh->abort_rank, sh->abort_msg);
}

/* gp_mpi_wait's poll: MPI_Test of one request; an MPI error aborts the run. */
typedef struct request_poll {
    gp_mpi_shared *sh;
    MPI_Request *req;
    const char *who, *doing;
} request_poll;

static gp_status test_request(void *ctx, bool *done) {
    request_poll *r = ctx;
    int flag = 0;
    int rc = MPI_Test(r->req, &flag, MPI_STATUS_IGNORE);
    if (rc != MPI_SUCCESS) {
        char es[MPI_MAX_ERROR_STRING];
        int len = 0;
        MPI_Error_string(rc, es, &len);
        gp_status s = gp_error(GP_IO, "%s: MPI failed %s: %s", r->who, r->doing, es);
        gp_mpi_shared_abort(r->sh, r->sh->world_rank, s, gp_last_error());
        return s;
    }
    *done = flag != 0;
    return GP_OK;
}

gp_status gp_mpi_wait(gp_mpi_shared *sh, MPI_Request *req, double deadline, const char *who,
                      const char *doing) {
    request_poll r = {sh, req, who, doing};
    return gp_mpi_wait_for(sh, test_request, &r, deadline, who, doing);
}

gp_status gp_mpi_wait_for(gp_mpi_shared *sh, gp_mpi_poll_fn poll, void *ctx, double deadline,
                          const char *who, const char *doing) {
    for (long spin = 0;; spin++) {
        bool done = false;
        GP_TRY(poll(ctx, &done));
        if (done) return GP_OK;
        if (gp_mpi_shared_poll(sh)) return gp_mpi_aborted_error(sh, who, doing);
        if ((spin & 63) == 0 && gp_now() > deadline) {
            gp_status s = gp_error(GP_IO, "%s: timed out after %.3g s %s (--comm-timeout)", who,
                                   sh->timeout_s, doing);
            gp_mpi_shared_abort(sh, sh->world_rank, s, gp_last_error());
            return s;
        }
        /* Spin briefly for latency, then yield the core: ranks are often oversubscribed. */
        if (spin > 256) nanosleep(&(struct timespec){0, 20000}, NULL);
    }
}
#else
/* Built without MPI: see mpi_grid.c for the functions that say so. */
typedef int gp_mpi_shared_not_built;
#endif
