/* The pipeline runtime's private state, shared by its files: runtime.c (set-up, the threads
 * step, stage interpretation), runtime_timeline.c (the step's timeline, stats and pictures),
 * runtime_mpi.c (one stage per process over MPI, data-parallel replicas) and checkpoint.c. */
#ifndef GP_PIPELINE_RUNTIME_INTERNAL_H
#define GP_PIPELINE_RUNTIME_INTERNAL_H

#include <pthread.h>

#include "gpipe.h"
#include "../comm/mpi_grid.h"
#include "../comm/transport.h"
#include "../model/sequence.h"
#include "../trace/trace.h"
#include "schedule.h"

#define MAILBOX_CAPACITY 2

/* When a stage's transport call began and returned, per micro-batch and message kind. The
 * transport does not say how much of a call was spent blocked, so the split into WAIT and the
 * hand-over is made after the step from the peers' times (see trace_comm). */
typedef struct comm_times {
    double send_b[GP_MSG_NKINDS], send_e[GP_MSG_NKINDS];
    double recv_b[GP_MSG_NKINDS], recv_e[GP_MSG_NKINDS];
    int send_seq[GP_MSG_NKINDS]; /* position of the message on its link, in sending order */
} comm_times;

typedef struct stage {
    struct gp_pipeline *p;
    int k, first, last; /* layers [first, last) */
    gp_device *dev;
    /* Per micro-batch, between actions of one step (M entries each). */
    gp_tensor *in;      /* the cell's input: a view of x on stage 0, received otherwise */
    gp_seq_pass *pass;  /* remat NONE: the kept forward */
    gp_tensor *out;     /* the output waiting for SEND_ACT */
    gp_tensor *dy;      /* the received gradient of the output */
    gp_tensor *dx;      /* the gradient of the input waiting for SEND_GRAD */
    gp_shape in_shape, out_shape; /* this step's micro-batch shapes */
    double loss;        /* last stage: sum of micro-batch losses, micro-batch order */
    comm_times *ct;     /* (M) */
    int nsent[GP_MSG_NKINDS];
    int *sent_mb[GP_MSG_NKINDS]; /* (M): micro-batch of the n-th message sent of each kind */
    gp_status status;
    char msg[1024];
    pthread_t thread;
    int cpu;     /* the core this stage's thread runs on, -1: not pinned */
    bool pinned; /* the last step's thread did get that core */
} stage;

struct gp_pipeline {
    gp_model *m;
    gp_optim_opts o;
    int K, M;
    gp_remat remat;
    gp_schedule sched;
    uint64_t seed;
    int step;
    stage *st;
    /* This step's inputs (read by stage 0 and the last stage only). */
    gp_transport *tr;
    const gp_tensor *x, *y;
    int64_t b; /* micro-batch size */
    double normalizer;
    /* The timeline of the last step; see gp_pipeline_last_stats. */
    gp_trace trace;
    int *first;       /* (K) first layer of each cell */
    bool have_trace;  /* the last step succeeded and its timeline is complete */
    double bubble_replayed; /* the simulator replaying the last step's measured actions */
    double step_s;
    /* Processes (MPI, runtime_mpi.c): this process runs stage gp_grid_stage(grid) of
     * replica gp_grid_replica(grid) only; NULL grid: every stage, as threads. */
    gp_grid *grid;
    int D;              /* data-parallel replicas */
    int mb0;            /* global index of this replica's first micro-batch (RNG keys) */
    gp_tensor xv, yv;   /* this replica's rows of the step's mini-batch (views) */
    gp_device *mirror;  /* copies of the other stages' layers (gp_pipeline_sync_params) */
    gp_tensor dp_buf;   /* (stage's trainable elements) the data-parallel gradient buckets */
    int64_t *dp_off;    /* (L + 1) where each of the stage's layers starts in dp_buf */
    int dp_mark;        /* layers [dp_mark, last) are in buckets already started */
    int64_t dp_bucket;  /* floats that make a bucket */
    uint64_t *bytes;    /* (2 x world size) p2p and all-reduce bytes of each rank, last step */
    gp_mem_stats *rank_mem; /* (world size) each rank's stage counters, at the last gather */
};

/* Whether this process runs stage k (threads: every stage). */
static inline bool gp_rt_owns(const gp_pipeline *p, int k) {
    return !p->grid || gp_grid_stage(p->grid) == k;
}

#define FOR_EACH_OWN_TRAINABLE(s, li, q)                                               \
    for (int li = (s)->first; li < (s)->last; li++)                                   \
        for (int pj_ = 0; pj_ < (s)->p->m->layers[li]->nparams; pj_++)                 \
            if (((q) = &(s)->p->m->layers[li]->params[pj_])->trainable)

/* runtime.c */
gp_tensor gp_rt_batch_slice(const gp_tensor *t, int64_t first, int64_t n); /* rows, as a view */
void *gp_rt_stage_main(void *arg); /* interprets stage arg's action list for one step */
void gp_rt_zero_grads(stage *s);

/* runtime_timeline.c: after a successful step, the WAIT/hand-over split of every transport call
 * and the simulator's bubbles (mean times and replay). */
gp_status gp_rt_trace_comm(gp_pipeline *p);
gp_status gp_rt_simulate_trace(gp_pipeline *p);

/* runtime_mpi.c: the process backend (NULL grid: nothing to do). */
gp_status gp_rt_init_processes(gp_pipeline *p, const gp_pipeline_opts *po);
void gp_rt_free_processes(gp_pipeline *p);
gp_status gp_rt_agree_partition(gp_pipeline *p, int *first);
gp_status gp_rt_backward_cell(stage *s, int mb, const gp_tensor *dy, gp_tensor *dx);
gp_status gp_rt_finish_grad_reduce(stage *s);
gp_status gp_rt_reduce_over_ranks(stage *s, double *v, int L);
gp_status gp_rt_step_processes(gp_pipeline *p, const gp_tensor *x, const gp_tensor *y,
                               float *loss);

/* What the pipeline's checkpoint code (checkpoint.c) needs of the runtime. */
gp_model *gp_pipeline_model(const gp_pipeline *p);
const gp_optim_opts *gp_pipeline_optim(const gp_pipeline *p);
/* Every rank's nbytes at mine into all (world size x nbytes, world order), on every rank,
 * bounded by the comm timeout; on threads all gets mine. */
gp_status gp_pipeline_allgather(gp_pipeline *p, const void *mine, size_t nbytes, void *all);

#endif
