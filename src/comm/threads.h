/* The in-process transport (threads.c): the ranks of a mesh axis are threads of one process,
 * talking through bounded mailboxes under one lock. */
#ifndef GP_COMM_THREADS_H
#define GP_COMM_THREADS_H

#include "comm/transport_iface.h"

/* The in-process implementation: K ranks are K threads of this process. The caller frees it with
 * gp_transport_free, after every rank's thread has stopped and before the devices that
 * allocated the tensors still in flight are freed. */
gp_status gp_transport_threads_new(const gp_transport_opts *o, gp_transport **out);

#endif
