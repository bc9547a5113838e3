/* The replay engine (replay.c): plays a schedule's lists, every stage running its next action
 * whenever it can proceed, for the validator's deadlock check and the simulator; and the cells'
 * figures it plays them with. Private to the library. */
#ifndef GP_PLAN_REPLAY_H
#define GP_PLAN_REPLAY_H

#include "plan/schedule.h"

/* One cell's figures for the simulator (times in any one unit, e.g. seconds or FLOPs). */
typedef struct gp_sim_cell {
    double fwd_time;      /* one micro-batch forward */
    double bwd_time;      /* one micro-batch backward, without recomputation */
    double wgt_time;      /* of bwd_time, the weight gradients (a split backward's own action) */
    double opt_time;      /* the optimizer step */
    uint64_t in_bytes;    /* the cell's input, one micro-batch */
    uint64_t state_bytes; /* the cell's full saved state of one micro-batch (out + saved) */
    uint64_t keep_bytes;  /* held from a split backward's input part to its weight part: the
                           * output gradients the weight parts read */
    /* Optional, M entries each: the durations of each micro-batch's forward, backward (both
     * parts of a split one), its weight part and (remat CELL) recomputation, replacing the
     * means above: a replay of measured actions. */
    const double *fwd_mb, *bwd_mb, *wgt_mb, *recompute_mb;
} gp_sim_cell;

typedef struct gp_sim_opts {
    int capacity;       /* mailbox capacity, messages per direction per link (0 means 1) */
    double latency;     /* from a send to its message being receivable (default 0) */
    gp_remat remat;     /* CELL (the zero value): each BACKWARD first recomputes the forward;
                         * NONE: the stash keeps every layer's state */
    const gp_remat *cell_remat; /* optional, K V entries (CELL or NONE): each cell's own mode,
                                 * replacing remat (a SELECTIVE pipeline's) */
} gp_sim_opts;

typedef struct gp_sim_stage {
    double busy;          /* forward + backward (+ recompute) + optimizer time */
    double recompute;     /* of which recomputation */
    double idle;          /* step_time - busy: waiting on neighbours, or done early */
    double end;           /* when its last action ends */
    int peak_in_flight;   /* most micro-batches forwarded but not yet backwarded */
    uint64_t peak_act_bytes; /* most activation bytes at once (stash + rebuilt state) */
    /* at that peak, each of the stage's cells' part of it (chunk v at [v]; they add up to
     * peak_act_bytes) */
    uint64_t peak_chunk_bytes[GP_SCHEDULE_MAX_CHUNKS];
} gp_sim_stage;

typedef struct gp_sim_result {
    double step_time; /* the last stage to finish */
    double bubble;    /* sum of idle / (K * step_time): (K-1)/(M+K-1) for balanced GPipe */
} gp_sim_result;

/* The engine behind the validator's deadlock check and the simulator. Assumes the per-stage and
 * per-link checks passed. cells == NULL: order only, no figures. */
gp_status gp_schedule_replay(const gp_schedule *s, int capacity, const gp_sim_cell *cells,
                             const gp_sim_opts *o, gp_sim_stage *stages, gp_sim_result *out,
                             gp_schedule_fault *where);

#endif
