/* Partitioning a sequence of L layers into K contiguous cells, one per pipeline stage:
 * the per-layer figures it works from, the one memory model every planner uses, and an exact
 * min-max (bottleneck) partitioner under a per-device byte limit. Private to the library. */
#ifndef GP_PLAN_PARTITION_H
#define GP_PLAN_PARTITION_H

#include "gpipe.h"

/* One layer's figures, per micro-batch where they depend on the batch. Times are in any one unit
 * (FLOPs from the cost model, or measured seconds): only ratios matter to the partitioner. */
typedef struct gp_layer_est {
    const char *kind;     /* for messages; may be NULL */
    double fwd_time;      /* forward */
    double bwd_time;      /* backward (without any recomputation) */
    uint64_t param_bytes; /* parameters and buffers, a bf16 device's weight copy, and what the
                           * layers keep derived from the values through a run (derived_bytes) */
    uint64_t grad_bytes;  /* gradients (trainable parameters only) */
    uint64_t optim_bytes; /* optimizer state */
    uint64_t in_bytes;    /* the layer's input activation, one micro-batch */
    uint64_t out_bytes;   /* its output activation, one micro-batch */
    uint64_t saved_bytes; /* saved for backward beyond input and output, one micro-batch */
    uint64_t tp_fwd_bytes, tp_bwd_bytes; /* a shard layer's tensor-axis collectives, one
                                          * micro-batch (gp_cost) */
    uint64_t ws_bytes;    /* the most workspace one forward or backward holds, one micro-batch */
    double wgt_time;      /* of bwd_time, the weight part a split backward runs later */
    uint64_t keep_bytes;  /* held from a split backward's input part to its weight part: what
                           * the weight part reads (the layer's input, saved state and output
                           * gradient; 0 for kinds that do not split) */
    uint64_t skip_bytes;  /* the skips that cross the cut before this layer (model/skips.h), one
                           * micro-batch: a cell starting here receives them beside in_bytes,
                           * stashes them with its input until its backward, and sends their
                           * gradients back (0 without skips) */
} gp_layer_est;

/* What a cell starting at layer `first` receives, stashes per micro-batch and sends back as its
 * input gradient: the input and the skips crossing with it. */
static inline uint64_t gp_cut_bytes(const gp_layer_est *ly, int first) {
    return ly[first].in_bytes + ly[first].skip_bytes;
}
/* The same seen from the cell that ends at `end` (< nlayers): its output and the skips. */
static inline uint64_t gp_cut_out_bytes(const gp_layer_est *ly, int end) {
    return ly[end - 1].out_bytes + ly[end].skip_bytes;
}

/* What the partitioner balances: forward + backward time of one layer. */
double gp_layer_est_time(const gp_layer_est *l);

/* Figures for every layer of m with micro-batches of `micro_batch_size` examples.
 * optim_states: optimizer state tensors per trainable parameter (0 plain SGD, 1 SGD with
 * momentum, 2 AdamW). dev: a device like the stages' (kind and threads), whose kernels' workspace
 * sizes go into ws_bytes; NULL leaves them 0. out: gp_model_nlayers(m) entries, caller-owned. */
gp_status gp_layer_est_from_model(const gp_model *m, int64_t micro_batch_size, int optim_states,
                                  gp_device *dev, gp_layer_est *out);

/* One moment of a stage's order of actions, as one of its cells sees it: the cell's micro-batches
 * forwarded and not yet backwarded (fwd), those backwarded by a split backward's input part whose
 * weight part is still to come (wgt), whether the cell's backward is running (bwd: 1, holding the
 * state it rebuilds on top), and how many micro-batches' keep_bytes are held (keep: wgt, plus the
 * running input part's own). */
typedef struct gp_stash_point {
    int fwd, wgt, bwd, keep;
} gp_stash_point;

/* The moments of a cell that can hold its most activation bytes, whatever its layers' figures:
 * no point is at or below another in all four counts. The schedule decides them (gp_stash_profiles
 * in cells.h); its memory simulation peaks at the largest of them. */
typedef struct gp_stash_profile {
    gp_stash_point *pt;
    int n, cap;
    /* Gradient-sized buffers the cell keeps beside its gradients from step to step, which its
     * schedule and the gradient sums decide too (gp_grad_bufs, grad_bufs.h); 0: none. */
    int grad_bufs;
} gp_stash_profile;

/* Memory of one cell, bytes. */
typedef struct gp_cell_mem {
    uint64_t params, grads, optim; /* static: held for the whole run */
    uint64_t grad_bufs;            /* of grads, the buffers of their sums (profile's grad_bufs) */
    uint64_t stash;                /* activations kept between forward and backward */
    uint64_t work;                 /* one micro-batch's saved state rebuilt during backward */
    uint64_t transient;            /* the backward's gradients and workspace at its peak */
    uint64_t messages;             /* sent messages not yet reclaimed */
    uint64_t total;                /* all of the above: the cell's peak */
} gp_cell_mem;

/* The memory model, shared by the partitioner, the simulator and the plan, for the cell of
 * layers [first, end) of nlayers at the points of a profile. It is the runtime's allocations at
 * their peak, an upper bound on what a stage's device counts:
 *   cut[i] = gp_cut_bytes(layers, i): a cut's activation with the skips crossing it;
 *   static = sum of params + grads + optimizer state, grads times 1 + the profile's
 *            grad_bufs (the gradient sums' buffers kept beside them);
 *   state  = sum over the cell's layers of out_bytes + saved_bytes (one micro-batch's full
 *            saved state, the cell's input excluded); keep = sum of their keep_bytes;
 *   at a point: stash = (fwd + wgt) cut[first] + keep x keep, plus fwd x state under remat
 *            NONE; work = bwd x state under CELL (the micro-batch recomputed during its
 *            backward); the cell's activations are the stash + work of its largest point;
 *   transient = the most, over the cell's layers i, that backward through layer i holds beside
 *            the state of layers first..i (those above i are released by then; a split backward,
 *            split, keeps them to the weight part): the gradients of its output and input
 *            (out_bytes + in_bytes; no input gradient for the model's first layer) and its
 *            workspace ws_bytes, less the state of the layers above i, plus the cell's output
 *            gradient (cut[end]) and input gradient (cut[first], first > 0), alive
 *            for the whole backward;
 *   messages = GP_MAILBOX_CAPACITY sent outputs (cut[end], unless the cell ends the
 *            model) and input gradients (cut[first], unless first is 0) held until the
 *            sender reclaims them.
 * Not counted: the labels a last stage reads (a few KiB of int32 per micro-batch) and the
 * vocabulary-split loss's workspace. Sums saturate at UINT64_MAX instead of wrapping. A profile
 * of no points gives no activations (stash and work 0). remat: CELL or NONE. */
gp_cell_mem gp_cell_memory_at(const gp_layer_est *layers, int first, int end, int nlayers,
                              const gp_stash_profile *profile, gp_remat remat, bool split);

/* The same with in_flight micro-batches stashed and one backward running, unsplit: fill-drain
 * GPipe's M, fewer for 1F1B (the profile of one point {in_flight, 0, 1, 0}). */
gp_cell_mem gp_cell_memory(const gp_layer_est *layers, int first, int end, int nlayers,
                           int in_flight, gp_remat remat);

/* A partition request. */
typedef struct gp_partition_req {
    const gp_layer_est *layers;
    int nlayers;          /* L */
    int stages;           /* K, 1 <= K <= L */
    int micro_batches;    /* M >= 1: micro-batches stashed at once, without a profile */
    bool tapered;         /* without a profile, 1F1B: stage k stashes min(K - k, M), not M */
    /* Optional, K entries: cell k's points (its schedule's), replacing micro_batches and
     * tapered; with split, a schedule splitting backwards. */
    const gp_stash_profile *profile;
    bool split;
    gp_remat remat;       /* what a stage keeps per micro-batch (gpipe.h) */
    uint64_t mem_limit;   /* per-device bytes; 0: no limit */
    /* Optional output, K entries: each cell's own mode, CELL or NONE (SELECTIVE: NONE where
     * the cell fits keeping every micro-batch's state, else CELL). */
    gp_remat *cell_remat;
} gp_partition_req;

/* Exact balanced partition: first[0..K-1] (first[0] = 0, strictly increasing) minimizing the
 * slowest cell's time (sum of gp_layer_est_time, added left to right; under SELECTIVE a cell
 * that recomputes adds its forward again), every cell within the memory limit. Among optimal partitions, the lexicographically smallest first[] is returned,
 * so the answer is the same on every machine. *bottleneck (may be NULL): the slowest cell's
 * time. Errors name the numbers: K < 1, K > L, a layer that alone exceeds the limit, or the
 * least memory any K-cell partition needs when no partition fits. */
gp_status gp_partition_balance(const gp_partition_req *r, int *first, double *bottleneck);

/* Checks an explicit partition (first layer of each cell): exactly K entries, first[0] = 0,
 * strictly increasing, each < L; then that every cell fits the memory limit of r. */
gp_status gp_partition_check(const gp_partition_req *r, const int *first, int nfirst);

/* The time of the cell of layers [first, end): the partitioner's objective for one cell. */
double gp_cell_time(const gp_layer_est *layers, int first, int end);

/* Writes a byte count as "300 MiB", "1.50 GiB", "512 bytes" into buf; returns buf. */
char *gp_plan_bytes_str(uint64_t nbytes, char *buf, size_t n);

#endif
