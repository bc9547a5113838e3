/* Pipeline schedules as data: one list of actions per stage, the generators (GPipe fill-drain,
 * 1F1B, interleaved 1F1B, ZB-H1, ZBV) and a printer (schedule.c). The replay engine (replay.h),
 * the validator (validate.h) and the simulator (simulate.h) work on these lists, each calling
 * only the ones before it. Private to the library. */
#ifndef GP_PLAN_SCHEDULE_H
#define GP_PLAN_SCHEDULE_H

#include "core/error.h"
#include "gpipe.h"

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

/* Messages a sender keeps per link until the receiver has taken them (the transports'
 * capacity, which every pipeline uses): what schedules are validated and simulated against, and
 * what the memory model counts as held. */
#define GP_MAILBOX_CAPACITY 2

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

/* Where the validator (or the replay) found the first problem: stage, index in that stage's
 * list (n = the end of the list, for something missing there). */
typedef struct gp_schedule_fault {
    int stage, index;
} gp_schedule_fault;

/* For the validator and the replay (defined in schedule.c): sets the message "schedule NAME
 * (K, M): stage k, action i TEXT: why [stage k: ... [TEXT] ...]", fills *where (may be NULL) and
 * returns GP_INVALID_ARGUMENT. */
gp_status gp_schedule_fault_error(const gp_schedule *s, int k, int i, gp_schedule_fault *where,
                                  const char *fmt, ...) GP_PRINTF(5, 6);

#endif
