/* The cells adapter (cells.c): the pipeline's cells as the ranks of a transport whose own ranks
 * are the stages, for stages that run several cells each. */
#ifndef GP_COMM_CELLS_H
#define GP_COMM_CELLS_H

#include "comm/transport_iface.h"

/* Cells over ranks: a transport whose ranks are the K V cells of a pipeline whose stages run V
 * cells each, over `inner`, whose ranks are the stages (rank_of[c]: cell c's stage, copied). A
 * message between cells c and c + 1 travels between their stages on link c (so the links of
 * several cells between two stages stay apart, each FIFO with its own capacity), or, when both
 * cells are on one stage, from that stage to itself. Point-to-point only: the collectives fail
 * (a stage's cells are not ranks of their own there). Borrows inner, which must outlive it;
 * gp_transport_free frees the adapter alone. */
gp_status gp_transport_cells_new(gp_transport *inner, int ncells, const int *rank_of,
                                 gp_transport **out);

#endif
