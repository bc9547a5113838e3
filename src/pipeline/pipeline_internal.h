/* The pipeline's private state, shared by its files:
 *   pipeline.c     set-up (cells, schedule, stage stores and devices), the public accessors, and
 *                  the step's checks before it goes to the launcher;
 *   mesh.c         the tensor axis: shard models, their values against the whole model's, the
 *                  stages' tensor-parallel groups over a transport;
 *   stage.c        the stage interpreter: one stage's action list for one step, talking only to
 *                  a transport and the launcher's gradient-sync hooks (gp_stage_sync);
 *   grad_tree.c    the tree sum of a cell's weight gradients over its micro-batches;
 *   launch_local.c the launcher of this process's stages: K = 1 inline on the caller's thread
 *                  (no stage thread, no transport), K > 1 on K threads over the threads
 *                  transport;
 *   launch_mpi.c   the launcher of one stage per MPI process (D replicas x K stages);
 *   timeline.c     the step's timeline, stats, bubbles and pictures;
 *   checkpoint.c   checkpoints of a pipeline (one file, or one part per stage);
 *   tie_grads.c    the gradients of parameters tied across cells, summed at the step's end. */
#ifndef GP_PIPELINE_PIPELINE_INTERNAL_H
#define GP_PIPELINE_PIPELINE_INTERNAL_H

#include <pthread.h>

#include "comm/transport.h"
#include "gpipe.h"
#include "model/param_store.h"
#include "model/sequence.h"
#include "plan/schedule.h"
#include "trace/trace.h"

#define MAILBOX_CAPACITY GP_MAILBOX_CAPACITY

/* When a stage's transport call began and returned, per micro-batch and message kind. The
 * transport does not say how much of a call was spent blocked, so the split into WAIT and the
 * hand-over is made after the step from the peers' times (timeline.c). */
typedef struct comm_times {
    double send_b[GP_MSG_NKINDS], send_e[GP_MSG_NKINDS];
    double recv_b[GP_MSG_NKINDS], recv_e[GP_MSG_NKINDS];
    int send_seq[GP_MSG_NKINDS]; /* position of the message on its link, in sending order */
} comm_times;

typedef struct gp_stage gp_stage;

/* grad_tree.c: a cell's weight gradients summed as a tree over its micro-batches
 * (GP_GRAD_SUM_TREE): leaf j holds micro-batches [j q, (j + 1) q) added in order, finished
 * leaves meet in a binary counter (level l: the sum of 2^l leaves), and the last leaf is folded
 * up it layer by layer as its layers finish. Buffer id 0 is the cell's slice of the gradient
 * block (leaf 0, where the sum ends), id i > 0 is pool[i - 1]. */
typedef struct gp_grad_tree {
    bool on;            /* TREE with more than one leaf, on a cell with gradients */
    int q, nblocks, nlevels;
    int64_t n;          /* floats of the cell's gradients */
    int *leaf;          /* (nblocks) block j's buffer id, -1: none yet or pushed */
    int *left;          /* (nblocks) micro-batches of block j whose weight gradients are due */
    int *level;         /* (nlevels) the counter's buffer id at each level, -1: empty */
    gp_tensor *pool;    /* (nlevels + nblocks at most; npool made) */
    bool *is_free;      /* (pool's) */
    int npool;
} gp_grad_tree;

/* What a launcher does for the interpreter around the gradients (all on the stage's thread). */
typedef struct gp_stage_sync {
    /* Optional: layer li's gradients are final (the backward of the last micro-batch runs the
     * cell's layers last to first), e.g. to start a data-parallel all-reduce of them. */
    gp_status (*layer_grads_final)(void *ctx, gp_stage *s, int li);
    /* Optional: before the norms, every gradient sum started must be complete. */
    gp_status (*grads_wait)(void *ctx, gp_stage *s);
    /* v[0..L-1]: each layer's squared gradient norm (this stage's layers filled, zero
     * elsewhere; with T shards each shard's part); v[L]: this stage's loss (the last stage's
     * shard 0's, zero elsewhere). In place: the sums over every stage, shard (and replica), in
     * mesh order, with the same bits on every stage. */
    gp_status (*reduce_norms)(void *ctx, gp_stage *s, double *v, int L);
    /* Optional: a stage failed; stop every other (default: abort its pipeline transport). */
    void (*abort)(void *ctx, gp_stage *s, gp_status st, const char *why);
    void *ctx;
} gp_stage_sync;

/* A gp_stage is one cell's shard: the layers it runs and their state. With V cells per stage
 * (interleaved schedules) a stage's V cells share its device, thread and trace track; the cell
 * of its chunk 0 (cell k for stage k, in every placement) leads: its thread runs the stage's
 * action list, handing each action to the cell of its chunk. */
struct gp_stage {
    struct gp_pipeline *p;
    int k, first, last;  /* cell k: layers [first, last) */
    int dk, chunk;       /* the stage (device along the pipeline) running it, and which of its
                          * cells it is (dk = k and chunk 0 when V = 1) */
    int t, w;            /* its tensor-parallel shard t of T; w = dk T + t, its worker: the
                          * place of its stage's lead in p->st, its trace track, its rank in the
                          * norms' all-reduce */
    gp_model *m;         /* the layers it runs: the model (T = 1) or shard t's model */
    gp_transport *pipe;  /* to the neighbouring stages (same shard): rank k */
    gp_transport *tensor; /* to its stage's T shards: rank t (T > 1) */
    gp_coll_group tp;    /* the layers' view of `tensor` (T > 1) */
    uint64_t tp_bytes;   /* given to the tensor axis's collectives this step */
    gp_device *dev;      /* where its layers, activations and messages live */
    bool own_dev;        /* the pipeline made the device (and frees it) */
    gp_store *store;     /* its parameters, gradients and optimizer state */
    bool run_here;       /* this process runs the stage (MPI: one stage per process) */
    /* Per micro-batch, between actions of one step (M entries each). */
    gp_tensor *in;      /* the cell's input: stage 0's rows of x (a view or a copy), else received */
    gp_seq_pass *pass;  /* the kept forward (remat NONE), or the rebuilt one during backward */
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
    gp_grad_tree gt; /* GP_GRAD_SUM_TREE's state (off otherwise) */
};

/* How the stages of a pipeline are run: in this process (inline or threads) or one per MPI
 * process. Every member is required. */
typedef struct gp_launcher_iface {
    const char *name; /* "local", "mpi" */
    /* One step on the stages this process runs (x, y checked; p->normalizer set): sets p->x,
     * p->y, p->b, p->mb0 for the stages, runs them, and on success the last step's timeline. */
    gp_status (*step)(struct gp_pipeline *p, const gp_tensor *x, const gp_tensor *y,
                      float *loss);
    /* Collective: an eval-mode forward through every stage; logits on every process. */
    gp_status (*predict)(struct gp_pipeline *p, const gp_tensor *x, gp_tensor *logits);
    /* Collective: the parameter hash over every stage in layer order, on every process. */
    gp_status (*params_hash)(struct gp_pipeline *p, uint64_t *h);
    /* Collective: every process's nbytes at mine into all (world order). */
    gp_status (*allgather)(struct gp_pipeline *p, const void *mine, size_t nbytes, void *all);
    /* Collective: the last step's timeline and memory counters of every process, gathered. */
    gp_status (*gather)(struct gp_pipeline *p);
    void (*free)(struct gp_pipeline *p);
} gp_launcher_iface;

struct gp_pipeline {
    gp_model *m;
    gp_optim_opts o;
    bool inference; /* made without optimizer options: no gradients, no steps */
    int K, M, T; /* K: cells (the pipeline's stages times V) */
    int V;       /* cells per stage (chunks; 1 but for interleaved schedules) */
    int nstages; /* stages along the pipeline (devices per shard index): K / V */
    gp_remat remat;
    gp_grad_sum grad_sum;
    gp_schedule sched;
    uint64_t seed; /* dropout keys */
    int step;
    gp_stage *st;  /* (K x T) cell k's shard t at k T + t */
    int *first;    /* (K) first layer of each cell */
    gp_remat *cell_remat; /* (K) each cell's own mode, CELL or NONE (remat: the one asked for) */
    /* The tensor axis (T > 1; mesh.c): the models of the T shards (no values where another
     * process runs them), each layer's split parameters (bit j: parameter j), the vocabulary
     * head's whole width when the last layer splits its output, and a device of host memory
     * where whole layers are put together for checkpoints and the parameter hash. */
    gp_model **shard;
    uint32_t *split_mask; /* (L) */
    bool vocab_split;
    int64_t vocab;
    gp_device *scratch;
    /* The launcher and what it gives the stages. */
    const gp_launcher_iface *launcher;
    void *launch;             /* the launcher's own state */
    gp_transport *tr;         /* between the stages (NULL: K = 1 inline) */
    gp_stage_sync sync;
    bool no_update;           /* this step accumulates gradients only (gp_pipeline_accumulate) */
    /* This step's inputs, as the stages see them (a replica's rows under MPI). */
    const gp_tensor *x, *y;
    int64_t b;                /* micro-batch size */
    int mb0;                  /* global index of the first micro-batch (RNG keys) */
    double normalizer;
    double label_smoothing;   /* the loss's (gp_pipeline_opts.label_smoothing) */
    /* Where this process stands: world rank and size, the stage and shard it runs (-1: all),
     * replica. */
    int rank, nranks, my_stage, my_shard, replica, D;
    /* The timeline of the last step; see gp_pipeline_last_stats. */
    gp_trace trace;
    bool have_trace;        /* the last step succeeded and its timeline is complete */
    double bubble_replayed; /* the simulator replaying the last step's measured actions */
    double step_s;
    uint64_t *bytes;        /* (2 x nranks) p2p and all-reduce bytes of each rank, last step */
    uint64_t *tp_bytes;     /* (devices: nranks under MPI, workers on threads) tensor-axis bytes */
    gp_mem_stats *rank_mem; /* (nranks) each rank's stage counters, at the last gather */
    /* The checkpoint writer and the save in flight (checkpoint.c); made at the first save. */
    struct gp_ckpt_writer *ckpt;
};

/* stage.c: runs the action list of lead s's stage (all its cells) for one step on the calling
 * thread; the outcome in s->status and s->msg (an abort of the transport tells the other
 * stages). */
void gp_stage_run(gp_stage *s);
/* The stage's per-step state arrays for M micro-batches (freed by gp_stage_free_state). */
gp_status gp_stage_alloc_state(gp_stage *s, int M);
void gp_stage_free_state(gp_stage *s);
/* Rows [first, first + n) of the step's input or labels, on the stage's device: a view when the
 * device can read host memory, else a copy (released by the caller with gp_tensor_release). */
gp_status gp_stage_input_rows(gp_stage *s, const gp_tensor *t, int64_t first, int64_t n,
                              gp_tensor *out);
/* Before a step: the stage's micro-batch shapes at p->b, its status cleared. */
gp_status gp_stage_begin_step(gp_stage *s);
/* The trace label of cell s's transfers of kind j (send or receive): "SEND_ACT", "RECV_GRAD",
 * with GP_TRACE_SKIP_MARK and their count where the cut it crosses carries skips. */
void gp_stage_msg_label(const gp_stage *s, bool send, gp_msg_kind j, char *buf, size_t n);
/* grad_tree.c. Setup for M micro-batches once the cell's store exists (off for SEQUENTIAL:
 * not called); free releases the buffers (before the cell's device goes). */
gp_status gp_grad_tree_setup(gp_stage *s, int M);
void gp_grad_tree_free(gp_stage *s);
void gp_grad_tree_begin_step(gp_stage *s);
/* Around a backward (or either part of a split one) of micro-batch mb: the cell's gradient
 * views point at its block's leaf; last_part: mb's weight gradients are complete. */
gp_status gp_grad_tree_enter(gp_stage *s, int mb);
gp_status gp_grad_tree_leave(gp_stage *s, int mb, bool last_part);
/* Whether the weight gradients of mb complete the last leaf: its layers are then folded into
 * the gradient block one by one, gp_grad_tree_layer_final(s, li) as layer li finishes. */
bool gp_grad_tree_folds(const gp_stage *s, int mb);
gp_status gp_grad_tree_layer_final(gp_stage *s, int li);

/* Pins the calling thread to s->cpu (none: -1); s->pinned says whether it took. */
void gp_stage_pin_thread(gp_stage *s);

/* Evaluation of many batches with the stages at work at once (eval_overlap.c): for in-process
 * pipelines of one cell per stage, without shards, each stage on a host device of its own.
 * logits NULL: each batch scored against ys; else its logits copied into logits[i]. */
bool gp_eval_overlap_applies(const struct gp_pipeline *p);
gp_status gp_eval_overlap(struct gp_pipeline *p, int n, const gp_tensor *xs, const gp_tensor *ys,
                          gp_tensor *logits, double *loss_sum, int64_t *ncorrect,
                          int64_t *ncount);

/* Cell k's shard t. */
static inline gp_stage *gp_worker(struct gp_pipeline *p, int k, int t) { return &p->st[k * p->T + t]; }
/* The threads (ranks) that run the pipeline's stages: one per stage shard, each leading its
 * stage's V cells (the lead of worker w is p->st[w]). */
static inline int gp_workers(const struct gp_pipeline *p) { return p->nstages * p->T; }
/* The cell of stage s's chunk v, same shard. */
static inline gp_stage *gp_chunk_of(struct gp_pipeline *p, const gp_stage *s, int v) {
    return gp_worker(p, gp_schedule_cell(&p->sched, s->dk, v), s->t);
}
/* Bytes the worker led by s gave to the tensor axis this step: each of its cells counts its
 * own collectives. */
static inline uint64_t gp_worker_tp_bytes(struct gp_pipeline *p, const gp_stage *s) {
    uint64_t n = 0;
    for (int v = 0; v < p->V; v++) n += gp_chunk_of(p, s, v)->tp_bytes;
    return n;
}

/* mesh.c: the tensor axis. */
/* With T > 1: the layouts checked (named errors), the T shard models, the split masks and the
 * vocabulary head; nothing with T = 1. */
gp_status gp_mesh_setup(struct gp_pipeline *p);
void gp_mesh_free(struct gp_pipeline *p);
/* s->tp: the layers' collective group over s->tensor (counting s->tp_bytes). */
void gp_mesh_group(gp_stage *s);
/* Stage worker s's shard values: cut from the whole model's (whole: every layer of the range
 * holds values) or initialized from seed as the whole model would be, then cut. */
gp_status gp_mesh_init_values(struct gp_pipeline *p, gp_stage *s, bool whole, uint64_t seed);
/* Layer li's squared gradient norm as stage worker s holds it: the split parameters' parts and
 * (shard 0 only) the replicated ones, so that the shards' values add up to the layer's. T = 1:
 * gp_store_layer_sumsq. */
gp_status gp_mesh_layer_sumsq(const struct gp_pipeline *p, const gp_stage *s, int li,
                              double *out);
/* The whole model's layers [first, last) put together on p->scratch (with the optimizer state
 * when optim): collective over the T shards of the stage holding them (MPI: over its tensor
 * transport; threads: from the shard models). gp_mesh_whole_scatter cuts them back into the
 * shards this process holds; gp_mesh_whole_end releases them. */
gp_status gp_mesh_whole_begin(struct gp_pipeline *p, int first, int last, bool optim,
                              bool gather);
gp_status gp_mesh_whole_scatter(struct gp_pipeline *p, int first, int last, bool optim);
void gp_mesh_whole_end(struct gp_pipeline *p, int first, int last);

/* tie_grads.c: parameters tied across cells. At the step's end, before the norms: each tie's two
 * gradients (as the data-parallel sums left them) become their sum at both uses. gp_ties_sum:
 * the uses on lead s's stage (both: in place; one: an exchange with the other's stage over the
 * pipeline transport); gp_ties_sum_local: every worker of an in-process pipeline. */
gp_status gp_ties_sum(struct gp_pipeline *p, gp_stage *lead);
gp_status gp_ties_sum_local(struct gp_pipeline *p);

/* timeline.c: after a successful step, the WAIT/hand-over split of every threads-transport call
 * and the simulator's bubbles (mean times and replay). */
gp_status gp_timeline_trace_comm(struct gp_pipeline *p);
gp_status gp_timeline_simulate(struct gp_pipeline *p);

/* launch_local.c / launch_mpi.c: the launchers; each sets p->launcher, p->launch, p->tr and
 * p->sync (and under MPI the place fields). */
gp_status gp_launch_local_init(struct gp_pipeline *p, const gp_pipeline_opts *po);
gp_status gp_launch_mpi_init(struct gp_pipeline *p, const gp_pipeline_opts *po);
/* MPI: every rank uses rank 0's cells (a balance by measured times may differ by rank). */
gp_status gp_launch_mpi_agree_cells(struct gp_pipeline *p, int *first);

/* What the pipeline's checkpoint code (checkpoint.c) needs of the pipeline. */
gp_model *gp_pipeline_model(const gp_pipeline *p);
const gp_optim_opts *gp_pipeline_optim(const gp_pipeline *p);

/* Test hooks (the library's tests only): a step's forward and backward over every micro-batch
 * without the update, leaving the summed gradients in place; then the update on its own (clip,
 * optimizer, gradients cleared, step + 1; a non-finite norm: GP_NUMERIC, gradients cleared, no
 * update). In-process launchers only. */
gp_status gp_pipeline_accumulate(gp_pipeline *p, const gp_tensor *x, const gp_tensor *y,
                                 float *loss);
gp_status gp_pipeline_apply(gp_pipeline *p);

#endif
