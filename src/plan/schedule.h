/* Pipeline schedules as data: one list of actions per stage, the generators (GPipe fill-drain and
 * 1F1B) and a printer (schedule.c), the replay engine (replay.c), the validator that every
 * schedule passes before it runs (validate.c), and the simulator that predicts time and
 * activation memory from a schedule (simulate.c). Each of those files calls only the ones listed
 * before it. Private to the library. */
#ifndef GP_PLAN_SCHEDULE_H
#define GP_PLAN_SCHEDULE_H

#include "core/error.h"
#include "gpipe.h"
#include "plan/partition.h"

typedef enum gp_action_kind {
    GP_ACT_FORWARD = 0,    /* run the cell forward on micro-batch mb (stash its input) */
    GP_ACT_BACKWARD,       /* (recompute and) backpropagate mb, add into the gradients; the last
                              stage computes the loss here */
    GP_ACT_SEND_ACT,       /* send mb's output activation to stage k + 1 */
    GP_ACT_RECV_ACT,       /* receive mb's input activation from stage k - 1 */
    GP_ACT_SEND_GRAD,      /* send the gradient of mb's input to stage k - 1 */
    GP_ACT_RECV_GRAD,      /* receive the gradient of mb's output from stage k + 1 */
    GP_ACT_OPTIMIZER_STEP, /* one update after all M micro-batches (mb unused, -1) */
    /* A split backward (zero-bubble schedules), in place of BACKWARD: */
    GP_ACT_BACKWARD_INPUT,  /* (recompute and) the input gradient, which SEND_GRAD sends; the
                               last stage computes the loss here */
    GP_ACT_BACKWARD_WEIGHT, /* later: the weight gradients, added into the gradients */
    GP_ACT_NKINDS
} gp_action_kind;

typedef struct gp_action {
    gp_action_kind kind;
    int mb;
    int chunk; /* which of the stage's V cells (0..V-1; 0 when V = 1; unused by the step) */
} gp_action;

typedef struct gp_stage_actions {
    gp_action *a;
    int n, cap;
} gp_stage_actions;

/* Where the K V cells of the model sit on the K stages (devices) when each stage runs V cells
 * (its chunks): LOOP (interleaved 1F1B): chunk v of stage k is cell v K + k, so the cells go
 * round the stages V times; V_SHAPE (ZBV): chunk 0 of stage k is cell k and chunk 1 is cell
 * 2K - 1 - k, so the pipeline goes down the stages and back up (the last cell on stage 0). */
typedef enum gp_placement { GP_PLACE_LOOP = 0, GP_PLACE_V_SHAPE = 1 } gp_placement;

/* The most cells a stage may run (interleaved's V). */
#define GP_SCHEDULE_MAX_CHUNKS 64

/* A schedule for K stages and M micro-batches. Zero-initialize, then gp_schedule_init or a
 * generator fills it; the caller frees it with gp_schedule_free. Each stage runs V cells
 * (chunks, V = 1 but for interleaved schedules); its list holds the actions of all of them, in
 * the one order the stage's thread runs them. Links join cell c to cell c + 1, wherever the two
 * are: activations go up the cells, gradients down. */
typedef struct gp_schedule {
    int stages;        /* K */
    int micro_batches; /* M */
    int chunks;        /* V >= 1 cells per stage */
    gp_placement placement;
    char name[16];     /* "gpipe", "1f1b", "custom" */
    gp_stage_actions *stage; /* K lists */
} gp_schedule;

/* Empty lists for K stages and M micro-batches, one cell per stage, named "custom". */
gp_status gp_schedule_init(gp_schedule *s, int stages, int micro_batches);
/* The same with V cells per stage placed as given. */
gp_status gp_schedule_init_chunks(gp_schedule *s, int stages, int micro_batches, int chunks,
                                  gp_placement placement);
/* Appends one action of chunk 0 to stage k's list. */
gp_status gp_schedule_push(gp_schedule *s, int k, gp_action_kind kind, int mb);
/* Appends one action of the given chunk. */
gp_status gp_schedule_push_chunk(gp_schedule *s, int k, int chunk, gp_action_kind kind, int mb);
/* K V: the cells of the model. */
int gp_schedule_cells(const gp_schedule *s);
/* The cell of stage k's chunk v, and the reverse: the stage and chunk that run cell c. */
int gp_schedule_cell(const gp_schedule *s, int k, int chunk);
void gp_schedule_place(const gp_schedule *s, int cell, int *k, int *chunk);
/* Frees the lists and zeroes *s (safe on a zeroed struct). */
void gp_schedule_free(gp_schedule *s);

/* Generators. All accumulate gradients in micro-batch order 0..M-1 in every cell. Where two
 * linked cells share a stage, the receive follows its send at once.
 * gpipe: all forwards, then all backwards (fill-drain), M micro-batches in flight per stage.
 * 1f1b:  stage k runs min(K-k-1, M) warm-up forwards, then alternates one forward and one
 *        backward, then cools down; at most min(K-k, M) micro-batches in flight.
 * zbh1:  zero bubble H1 (Qi et al.): backwards split into input and weight parts; stage k keeps
 *        at most min(K-k, M) micro-batches between forward and input backward (1F1B's bound)
 *        and at most as many between input backward and weight part (which hold only what the
 *        weight parts read), and runs the weight parts where 1F1B idles. Built by list
 *        scheduling at unit costs: whenever a stage is free it runs, in this order of
 *        preference, the next input backward whose gradient is there (bounds allowing), the
 *        next forward whose input is there (bounds allowing), the next weight part. */
gp_status gp_schedule_gpipe(int stages, int micro_batches, gp_schedule *out);
gp_status gp_schedule_1f1b(int stages, int micro_batches, gp_schedule *out);
gp_status gp_schedule_zbh1(int stages, int micro_batches, gp_schedule *out);
/* interleaved: interleaved 1F1B (Narayanan et al., Megatron-LM): V cells per stage placed in a
 *        LOOP; stage k runs the forwards of its chunks in rounds of K micro-batches (chunk 0 of
 *        micro-batches 0..K-1, chunk 1 of the same, ..., then micro-batches K..2K-1), starting
 *        with (K - k - 1) 2 + (V - 1) K warm-up forwards, then one forward and one backward in
 *        turn (backwards in the same rounds, chunks in reverse), then the remaining backwards.
 *        M must be a multiple of K. Bubble (K - 1) / (V M + K - 1) at unit costs: a V-th of
 *        1F1B's idle time, for up to V times the messages. */
gp_status gp_schedule_interleaved(int stages, int micro_batches, int chunks, gp_schedule *out);
/* zbv:   zero bubble V (Qi et al., "Pipeline parallelism with controllable memory"): two cells
 *        per stage placed in a V_SHAPE (down the stages and back up: the first and the last cell
 *        on stage 0), backwards split as in zbh1. Built by the same list scheduling, each stage
 *        holding at most 2K micro-batches of its half-size cells between forward and input
 *        backward (1F1B's first stage's memory, on every stage), at most min(K, M) per cell
 *        waiting for their weight parts, the second leg's input backwards and the first leg's
 *        forwards preferred. At unit costs and M >= 2K its only idle time is the fill (the
 *        first forward's way down to the last stage), half of zbh1's. */
gp_status gp_schedule_zbv(int stages, int micro_batches, gp_schedule *out);
/* Whether a schedule kind splits its backwards (BACKWARD_INPUT / BACKWARD_WEIGHT). */
bool gp_schedule_kind_splits(gp_schedule_kind kind);
/* The schedule of that kind, with V cells per stage (gp_schedule_kind_chunks); a value that is
 * no kind is an error listing them. */
gp_status gp_schedule_generate(gp_schedule_kind kind, int stages, int micro_batches, int chunks,
                               gp_schedule *out);

/* "FORWARD(3)", "OPTIMIZER_STEP"; returns buf. */
char *gp_action_str(gp_action a, char *buf, size_t n);
/* One stage's list in compact form "F0 SA0 F1 SA1 RG0 B0 ... STEP" (F/B forward/backward,
 * SA/RA send/receive activation, SG/RG send/receive gradient). Truncated with "..." to fit. */
char *gp_schedule_stage_str(const gp_schedule *s, int k, char *buf, size_t n);
/* Writes "schedule NAME: K = .., M = ..", then one line per stage, to f. */
void gp_schedule_print(const gp_schedule *s, FILE *f);

/* ---------------------------------------------------------------- validator (validate.c) */

/* Where the validator found the first problem: stage, index in that stage's list (n = the end of
 * the list, for something missing there). */
typedef struct gp_schedule_fault {
    int stage, index;
} gp_schedule_fault;

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

/* For the validator and the replay (defined in schedule.c): sets the message "schedule NAME
 * (K, M): stage k, action i TEXT: why [stage k: ... [TEXT] ...]", fills *where (may be NULL) and
 * returns GP_INVALID_ARGUMENT. */
gp_status gp_schedule_fault_error(const gp_schedule *s, int k, int i, gp_schedule_fault *where,
                                  const char *fmt, ...) GP_PRINTF(5, 6);

/* ---------------------------------------------------------------- simulator (simulate.c) */

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

/* Sums a cell's figures over layers [first, end) (the memory model's terms). */
gp_sim_cell gp_sim_cell_from_layers(const gp_layer_est *layers, int first, int end);

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

/* gp_cells_memory's shares (partition.h) from a simulation already made of schedule s (of
 * `schedule`'s kind, with any times: the peaks depend on each stage's order alone), st holding
 * its s->stages stages: the planner's, so that it replays each candidate once. */
void gp_cells_memory_shares(const gp_layer_est *est, int L, const int *first,
                            const gp_remat *cell_remat, gp_schedule_kind schedule,
                            const gp_schedule *s, const gp_sim_stage *st, gp_cell_mem *out,
                            uint64_t *stage_total);
/* Each cell's profile (partition.h) under schedule s: out[c] for its K V cells (zeroed by the
 * caller), the points of its stage's order of actions at which the cell's part of the stage's
 * activations can peak, as the simulator counts them. With one cell per stage the largest point
 * is the stage's simulated peak exactly; with several, the cells' largest points add up to at
 * least it. Free the points with gp_stash_profiles_free. */
gp_status gp_stash_profiles(const gp_schedule *s, gp_stash_profile *out);
void gp_stash_profiles_free(gp_stash_profile *p, int n);
/* Validates s with o->capacity, then plays it with cells[K V] figures (cell c's at c; a stage's
 * optimizer step takes the sum of its cells' opt_time): actions of a stage run one
 * after another; a RECV ends when its message has arrived (send end + latency); a SEND waits
 * while the mailbox is full (until the receiver took the message `capacity` sends earlier).
 * stages[K] (caller-owned) get per-stage figures. */
gp_status gp_schedule_simulate(const gp_schedule *s, const gp_sim_cell *cells,
                               const gp_sim_opts *o, gp_sim_stage *stages, gp_sim_result *out);

/* ---------------------------------------------------------------- replay engine (replay.c) */

/* The engine behind the validator's deadlock check and the simulator. Assumes the per-stage and
 * per-link checks passed. cells == NULL: order only, no figures. */
gp_status gp_schedule_replay(const gp_schedule *s, int capacity, const gp_sim_cell *cells,
                             const gp_sim_opts *o, gp_sim_stage *stages, gp_sim_result *out,
                             gp_schedule_fault *where);

#endif
