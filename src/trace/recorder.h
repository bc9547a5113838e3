/* Timeline recorder of the pipeline runtime (recorder.c): per-stage event buffers (forward,
 * backward, recompute, send, recv, wait, optimizer), busy time and the measured bubble computed
 * from them. The writers build on it: chrome_trace.h and svg_timeline.h. */
#ifndef GP_TRACE_RECORDER_H
#define GP_TRACE_RECORDER_H

#include <stdio.h>

#include "core/clock.h"
#include "core/error.h"
#include "gpipe.h"

typedef enum gp_trace_kind {
    GP_TRACE_FORWARD = 0, /* the cell's forward on one micro-batch */
    GP_TRACE_BACKWARD,    /* the cell's backward (without the recomputation) */
    GP_TRACE_RECOMPUTE,   /* --remat cell: rebuilding the cell's saved state before backward */
    GP_TRACE_SEND,        /* handing a message over: the copy, or the pointer hand-over */
    GP_TRACE_RECV,        /* taking a message that is there: the copy only, not the waiting */
    GP_TRACE_WAIT,        /* blocked on a neighbour (empty or full mailbox) */
    GP_TRACE_OPTIMIZER,   /* the step after all M micro-batches (micro_batch -1) */
    GP_TRACE_WEIGHT,      /* a split backward's weight gradients, run apart from its input part
                           * (BACKWARD) by zero-bubble schedules */
    GP_TRACE_NKINDS
} gp_trace_kind;

/* Busy rule of gp_trace_measure: every kind but WAIT counts as busy (SEND/RECV are copies the
 * stage does itself); WAIT and uncovered time are idle. A runtime records the time a receive
 * spends blocked as WAIT and only the hand-over itself as RECV. */
#define GP_TRACE_IS_BUSY(kind) ((kind) != GP_TRACE_WAIT)

#define GP_TRACE_LABEL_NBYTES 32
#define GP_TRACE_SKIP_MARK " + skips "

typedef struct gp_trace_event {
    gp_trace_kind kind;
    int stage;
    int micro_batch; /* -1 for none */
    int chunk;       /* which of its stage's cells (0 unless stages run several) */
    double t_begin;  /* seconds since the trace's origin; t_end < t_begin while still open */
    double t_end;
    char label[GP_TRACE_LABEL_NBYTES]; /* optional free text, e.g. "RECV_ACT"; "" for none */
    /* A transfer's message carries skip connections' values (or their gradients) beside the
     * activation: the label then ends with GP_TRACE_SKIP_MARK and their count. */
} gp_trace_event;

#define GP_TRACE_MAX_OPEN 4

/* One stage's buffer. Written by that stage's thread only, so recording takes no lock and
 * shares nothing; padded so that two stages' counters never share a cache line. */
typedef struct gp_trace_stage {
    gp_trace_event *ev; /* (n) host bookkeeping from malloc, not device memory: it is not part
                           of any cell's measured footprint */
    int n, cap;
    int open[GP_TRACE_MAX_OPEN]; /* indices of events begun but not yet ended, innermost last */
    int nopen;
    int chunk; /* given to the events recorded from now on (gp_trace_set_chunk) */
    char pad_[128];
} gp_trace_stage;

/* A recorder for K stages. Zero-initialize, then gp_trace_init; gp_trace_free releases it.
 * Threads: stage k's thread may call begin/end/add for stage k concurrently with the other
 * stages' threads; everything else (init, reset, set_info, measure, the writers, free) runs
 * while no stage thread records (before the threads start or after they join). */
typedef struct gp_trace {
    int stages;        /* K */
    int micro_batches; /* M, for titles and the theoretical bubble */
    int chunks;        /* V cells per stage (0 or 1: one), for titles and the theoretical bubble */
    double origin;     /* gp_now() at init or reset: every time is relative to it */
    char schedule[16]; /* "gpipe", "1f1b", "" if unknown */
    char remat[16];    /* "cell", "none", "" if unknown */
    double bubble_simulated; /* the simulator's prediction, shown beside the measure; < 0: none */
    int stages_per_replica;  /* > 0: track k is stage k % this of replica k / this (MPI ranks) */
    int shards_per_stage;    /* > 1: T tracks per stage, track k shard k % T of stage k / T */
    gp_trace_stage *stage;   /* (K) */
} gp_trace;

/* Allocates K empty buffers and sets the origin to now. */
gp_status gp_trace_init(gp_trace *t, int stages, int micro_batches);
/* Frees the buffers and zeroes *t (safe on a zeroed struct). */
void gp_trace_free(gp_trace *t);
/* Drops every event (keeps the buffers) and sets the origin to now, e.g. before each step. */
void gp_trace_reset(gp_trace *t);
/* Copies the schedule and remat names shown in titles (NULL leaves one unchanged). */
void gp_trace_set_info(gp_trace *t, const char *schedule, const char *remat);

/* The cell (chunk) of stage k that the events recorded next on track k belong to. */
void gp_trace_set_chunk(gp_trace *t, int k, int chunk);

/* Seconds since the trace's origin. */
double gp_trace_time(const gp_trace *t);

/* Opens an event on stage k at the current time (up to GP_TRACE_MAX_OPEN nested). label may be
 * NULL. The buffer grows before the clock is read, so growth is not charged to the event. */
gp_status gp_trace_begin(gp_trace *t, int k, gp_trace_kind kind, int micro_batch,
                         const char *label);
/* Closes stage k's innermost open event at the current time. */
gp_status gp_trace_end(gp_trace *t, int k);
/* Records a complete event with times in seconds since the origin (t_begin <= t_end, finite).
 * Events may arrive in any order and may overlap. */
gp_status gp_trace_add(gp_trace *t, int k, gp_trace_kind kind, int micro_batch, double t_begin,
                       double t_end, const char *label);

/* Stage k's events in recording order (open ones have t_end < t_begin); *n gets their count. */
const gp_trace_event *gp_trace_events(const gp_trace *t, int k, int *n);

/* The name of track k: "stage 1", with several replicas "d1 stage 0" (replica 1), with T
 * tensor-parallel shards "stage 1 t0". */
void gp_trace_track_name(const gp_trace *t, int k, char *buf, size_t n);
/* "forward", "backward", "recompute", "send", "recv", "wait", "optimizer". */
const char *gp_trace_kind_name(gp_trace_kind kind);

typedef struct gp_trace_stage_stats {
    double busy;  /* length of the union of busy intervals within the window */
    double idle;  /* span - busy */
    double by_kind[GP_TRACE_NKINDS]; /* summed durations per kind (overlaps count twice) */
    int nevents;  /* closed events overlapping the window */
} gp_trace_stage_stats;

typedef struct gp_trace_stats {
    double t0, t1;  /* the window */
    double span;    /* t1 - t0 */
    double bubble;  /* sum of idle / (K * span): the measured bubble; 0 when span is 0 */
    double bubble_theory; /* (K-1)/(M+K-1); with V cells per stage (K-1)/(V M+K-1) */
} gp_trace_stats;

/* Busy and idle time per stage over the window spanning all closed events (first begin to last
 * end on any stage), by the busy rule above; open events are ignored. stages (K entries,
 * caller-owned) may be NULL. */
gp_status gp_trace_measure(const gp_trace *t, gp_trace_stage_stats *stages, gp_trace_stats *out);
/* The same over [t0, t1] (seconds since the origin), events clipped to it. */
gp_status gp_trace_measure_window(const gp_trace *t, double t0, double t1,
                                  gp_trace_stage_stats *stages, gp_trace_stats *out);

#endif
