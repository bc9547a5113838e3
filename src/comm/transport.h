/* The transports, as the parts above comm use them: the interface and its checked wrappers
 * (transport_iface.h), the in-process implementation (threads.h) and the cells adapter
 * (cells.h). The files of src/comm include those headers themselves, each only what it builds
 * on, never this one. The MPI implementation is reached through the process grid (mpi_grid.h). */
#ifndef GP_COMM_TRANSPORT_H
#define GP_COMM_TRANSPORT_H

#include "comm/cells.h"
#include "comm/threads.h"
#include "comm/transport_iface.h"

#endif
