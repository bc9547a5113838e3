/* The validator every schedule passes before it runs (validate.c): complete and deadlock-free
 * over mailboxes of a given capacity. Private to the library. */
#ifndef GP_PLAN_VALIDATE_H
#define GP_PLAN_VALIDATE_H

#include "plan/schedule.h"

/* Proves the schedule complete and deadlock-free with mailboxes holding `capacity` >= 1 messages
 * per direction per link (a send blocks while its mailbox is full). Checks, stage by stage and
 * action by action: micro-batch indices in range; every micro-batch forwarded and backwarded
 * exactly once; a backward after its forward; backwards in micro-batch order 0..M-1 (the
 * bitwise-reproducibility invariant); a RECV before the FORWARD/BACKWARD that needs it; a send
 * after the computation that produces it; no activation sends from the last stage, gradients
 * from the first, and so on; exactly one OPTIMIZER_STEP, last. Then that each link's receives
 * take its sends in the order they were sent (mailboxes are FIFO). Then it replays the schedule
 * (every stage runs its next action whenever it can proceed) and reports a deadlock if all
 * remaining stages are blocked. On failure, the message names the first offending action:
 * "stage 1, action 4 RECV_ACT(2): ..." and *where (may be NULL) gets its position. */
gp_status gp_schedule_validate(const gp_schedule *s, int capacity, gp_schedule_fault *where);

#endif
