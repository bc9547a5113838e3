/* The runtime's state: the pipeline and its stages (cells), the launcher's hooks and the
 * gradient tree's buffers, as types only. The functions that work on them are declared each in
 * the header of the file that defines them (stage.h, grad_tree.h, mesh.h, tie_grads.h,
 * timeline.h, eval_overlap.h, launcher.h, launch_local.h, launch_mpi.h, pipeline_hooks.h), and a
 * file includes only the headers of the files below it, so no two runtime files depend on each
 * other (tests/src_cycles.sh). A launcher reads this state but sets it up only through
 * launcher.h. */
#ifndef GP_PIPELINE_STATE_H
#define GP_PIPELINE_STATE_H

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
    int local_rank; /* among the ranks of this node: the GPU this rank takes there */
    /* Between GPU ranks under MPI: NCCL or MPI with host staging, and why MPI (launch_nccl.c). */
    gp_gpu_comm gpu_comm;
    char gpu_comm_why[320];
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

#endif
