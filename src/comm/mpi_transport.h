/* The MPI transport (mpi_transport.c): the transport interface between processes, one rank a
 * process, over a communicator the process grid (mpi_grid.c) splits. Only compiled with MPI
 * (GP_HAVE_MPI); nothing outside src/comm includes it. */
#ifndef GP_COMM_MPI_TRANSPORT_H
#define GP_COMM_MPI_TRANSPORT_H

#include "comm/payload.h"
#include "comm/mpi_shared.h"
#include "comm/transport_iface.h"

/* A transport over comm (this process is one rank of it; `role` names what a rank of comm is:
 * "stage", "replica"). The transport borrows sh and comm. */
gp_status gp_transport_mpi_new(gp_mpi_shared *sh, MPI_Comm comm, const char *role,
                               const gp_transport_opts *o, gp_transport **out);
/* Sets (or with NULL clears) tr's payload hook; tr must be an MPI transport. The old hook's
 * operations still pending are forgotten first (its forget), so it can go after this. */
void gp_transport_mpi_set_payload(gp_transport *tr, const gp_transport_payload *hook);
/* This process's rank in the transport's communicator. */
int gp_transport_mpi_rank(const gp_transport *tr);

#endif
