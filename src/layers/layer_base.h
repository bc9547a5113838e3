/* The layer interface (private): a small vtable, parameters declared by the
 * constructor and allocated/initialized by the model, and a caller-owned
 * context holding one call's saved-for-backward state, so a pipeline can keep
 * several micro-batches in flight, drop one, and rebuild it by recomputation
 * (layer.c: what every kind builds on). */
#ifndef GP_LAYERS_LAYER_BASE_H
#define GP_LAYERS_LAYER_BASE_H

#include "core/collective.h"
#include "core/error.h"
#include "gpipe.h"
#include "kernels/kernels.h"

#define GP_LAYER_MAX_PARAMS 16
#define GP_CTX_MAX_SAVED 16

typedef enum gp_init_kind {
    GP_INIT_ZEROS = 0,
    GP_INIT_ONES,
    GP_INIT_NORMAL,  /* N(0, scale^2) */
    GP_INIT_UNIFORM  /* U(-scale, scale) */
} gp_init_kind;

typedef struct gp_param {
    const char *name;   /* static string: "weight", "attn.qkv.weight", "running_mean" */
    gp_shape shape;
    gp_init_kind init;
    float init_scale;
    bool trainable;     /* false: a buffer (batch-norm running statistics) */
    bool decay;         /* weight decay applies (matrices, not biases or norms) */
    bool product;       /* read only as a product operand (the linear ops' w): a bf16 device
                         * may read the store's bf16 copy of it, value16 */
    /* Views into the flat blocks of the store that holds the layer (model/store.h), or,
     * for a layer used on its own (tests), tensors of its own that gp_layer_free releases. */
    gp_tensor value;    /* GP_MEM_PARAMS */
    gp_tensor grad;     /* GP_MEM_GRADS, while training; zero between steps */
    gp_tensor state[2]; /* GP_MEM_OPTIM, while training: the optimizer's per-element state */
    /* GP_BF16, a view into the store's bf16 weight copy (model/store.h) while that copy holds
     * value rounded, for a product parameter on a bf16 device; empty whenever it may not. */
    gp_tensor value16;
    /* While a stage's run holds value unchanged (model/store.h), a number no other value of any
     * parameter ever had, under which a layer may keep what it derives from value (released by
     * drop_derived when the run or the update ends it); 0 whenever value may change. */
    uint64_t gen;
} gp_param;

/* How the current call runs. Randomness (dropout) is keyed by
 * (seed, layer index, step, micro_batch) so a recomputation reproduces it. */
typedef struct gp_run {
    bool training;
    bool recompute;   /* re-running a forward for backward: no side effects */
    uint64_t seed;
    uint32_t step;
    uint32_t micro_batch;
    /* The tensor-parallel group a shard layer (built by ops->shard) computes its part with, and
     * whose collectives it calls where its layout needs them; NULL for whole layers (T = 1).
     * Borrowed: it outlives the call and every backward of it. */
    const gp_coll_group *tp;
} gp_run;

typedef struct gp_ctx gp_ctx;
/* One layer call's state. Forward records x and y (the caller keeps both
 * alive and unchanged until backward) and allocates any extra saved tensors
 * in slots; composite layers use child contexts for their parts. */
struct gp_ctx {
    gp_device *dev;          /* where saved tensors are allocated (ACTIVATIONS) */
    gp_run run;              /* a copy: backward may run long after the caller's run is gone */
    const gp_tensor *x, *y;  /* set by the caller before forward */
    gp_tensor saved[GP_CTX_MAX_SAVED];
    /* A merge layer's second input, set by the caller like x: the output of the earlier layer
     * it reads (skip_from); and where its backward writes that input's gradient (allocated by
     * the caller at the skip's shape). NULL for every other kind. */
    const gp_tensor *skip;
    gp_tensor *dskip;
    gp_ctx *children;        /* lazily allocated by gp_ctx_child */
    int nchildren;
    int64_t aux[4];          /* small per-call integers (e.g. a shape) */
};

/* run may be NULL: an inference run (no training, no recompute). */
void gp_ctx_init(gp_ctx *c, gp_device *dev, const gp_run *run);
/* Allocates saved[slot] (counted as GP_MEM_ACTIVATIONS on ctx->dev). */
gp_status gp_ctx_save(gp_ctx *c, int slot, gp_shape shape, gp_dtype dtype, gp_tensor **out);
/* The i-th child context (0 <= i < n); all n are created on first call with
 * the parent's device and run. */
gp_status gp_ctx_child(gp_ctx *c, int i, int n, gp_ctx **out);
/* Frees saved tensors and children; the context can be reused after. */
void gp_ctx_release(gp_ctx *c);
/* Bytes held by the saved tensors of c and its children. */
uint64_t gp_ctx_saved_bytes(const gp_ctx *c);

/* A layer's layout over the tensor axis of the mesh, as data: the model dimensions it splits,
 * each over a named mesh axis, and for every split parameter which of its tensor dimensions
 * follows which model dimension. Parameters not listed are replicated: every shard holds all of
 * them and computes their gradients itself, the same bits on every shard (their inputs are the
 * same there). Checked before anything runs (layers/layout.c): each model dimension must divide
 * by its axis's size. */
#define GP_LAYOUT_MAX_DIMS 2
typedef struct gp_layout_dim {
    const char *name;  /* "heads", "d_ff", "vocab" */
    int64_t size;      /* the whole layer's */
    const char *axis;  /* the mesh axis it is split over: "tensor" */
} gp_layout_dim;
typedef struct gp_layout_split {
    int param;  /* index in the layer's params */
    int dim;    /* the tensor dimension split */
    int groups; /* that dimension is `groups` equal blocks, each split alike (qkv: q, k and v) */
    int of;     /* the model dimension (index in dims) it follows */
} gp_layout_split;
typedef struct gp_layout {
    int ndims, nsplits; /* 0, 0: replicated */
    gp_layout_dim dims[GP_LAYOUT_MAX_DIMS];
    gp_layout_split splits[GP_LAYER_MAX_PARAMS];
    /* The output's last dimension is split too (a vocabulary head, column-parallel, whose
     * logits the split cross-entropy takes as they are): only a model's last layer. */
    bool output_split;
} gp_layout;

/* The parts of a backward: all of it, or (zero-bubble schedules) the input gradient now and the
 * weight gradients later. */
typedef enum gp_bwd_part { GP_BWD_ALL = 0, GP_BWD_INPUT, GP_BWD_WEIGHT } gp_bwd_part;

typedef struct gp_layer_ops {
    const char *kind;
    /* in: full shape, batch first. Fails with a message naming the layer,
     * the shape it got and the shape it expected. */
    gp_status (*out_shape)(const gp_layer *, const gp_shape *in, gp_dtype in_dtype, gp_shape *out);
    gp_cost (*cost)(const gp_layer *, const gp_shape *in);
    /* Optional (none: 0): the most workspace bytes one training forward or one backward (with
     * an input gradient when input_grad) holds at once on dev (gp_ctx_workspace), for the input
     * shape in. The memory model counts it; it depends on the device (a CPU device's threads
     * each have their own). */
    uint64_t (*workspace_bytes)(const gp_layer *, gp_device *dev, const gp_shape *in,
                                bool input_grad);
    /* Optional (none: 0): the bytes of what the layer derives from its parameters' values and
     * keeps on dev while a training run holds them still (gp_param.gen, until drop_derived),
     * for the input shape in, with an input gradient when input_grad (conv2d: its kernels'
     * transformed weights, conv2d_wt, counted as workspace on the device). The memory model
     * counts it beside the parameters: it lives as long as the run. */
    uint64_t (*derived_bytes)(const gp_layer *, gp_device *dev, const gp_shape *in,
                              bool input_grad);
    /* Optional (none: the cost's saved_bytes): the bytes a training forward keeps for the
     * backward on dev, for the input shape in, where the device decides part of it (attention's
     * probabilities: kernel op attention_saved). The memory model counts it. */
    uint64_t (*saved_bytes)(const gp_layer *, gp_device *dev, const gp_shape *in);
    /* y is allocated by the caller with out_shape; ctx->x and ctx->y are set. */
    gp_status (*forward)(gp_layer *, gp_ctx *, const gp_tensor *x, gp_tensor *y);
    /* Writes dx (allocated by the caller; NULL when the input needs no
     * gradient) and ADDS parameter gradients into params[i].grad. */
    gp_status (*backward)(gp_layer *, gp_ctx *, const gp_tensor *dy, gp_tensor *dx);
    /* Optional: the backward in parts. INPUT writes dx (NULL: none wanted) and adds whatever
     * parameter gradients are cheap; WEIGHT adds the others (dx unused), reading ctx->x, the
     * saved slots and dy, which the caller keeps alive and unchanged from the INPUT part on
     * (not ctx->y). INPUT then WEIGHT adds exactly the bits of backward. Kinds without it run
     * the whole backward as their INPUT part and have no WEIGHT part. */
    gp_status (*backward_part)(gp_layer *, gp_ctx *, const gp_tensor *dy, gp_tensor *dx,
                               gp_bwd_part part);
    void (*destroy)(gp_layer *); /* optional: frees impl */
    /* Optional: the parameters' generations have ended (gp_param.gen): release whatever was
     * derived from their values, on the thread that runs the layer's device. */
    void (*drop_derived)(gp_layer *);
    /* The tensor axis. layout (optional; none: replicated): the whole layer's layout. shard: a
     * new layer of the same kind that computes one of `nshards` parts of this one (parameters
     * declared at their shard shapes, in the same order and with the same names; which part
     * comes from its call's run.tp); with nshards 1, or for a kind without a layout, a copy of the
     * whole layer (gp_layer_copy: every shard holds it, replicated). NULL with the message set
     * on failure. A kind
     * without shard cannot be placed on a mesh with T > 1 (a named error). */
    void (*layout)(const gp_layer *, gp_layout *out);
    gp_layer *(*shard)(const gp_layer *, int nshards);
} gp_layer_ops;

struct gp_layer {
    const gp_layer_ops *ops;
    int index;           /* position in its model; keys its RNG streams */
    int skip_from;       /* a merge layer: the earlier layer whose output it reads beside its
                          * input (layers/merge.c); -1 for every other kind */
    int nparams;
    gp_param params[GP_LAYER_MAX_PARAMS];
    void *impl;          /* the kind's own configuration and state */
};

/* Whether l is a merge layer (merge.h), one that reads a skip (skip_from >= 0). */
static inline bool gp_layer_merges(const gp_layer *l) { return l->skip_from >= 0; }

/* For constructors: a zeroed layer with the given ops and impl (takes impl;
 * frees it and returns NULL on failure). */
gp_layer *gp_layer_new(const gp_layer_ops *ops, void *impl);
/* The same with a heap copy of the nbytes at impl (a constructor's impl on its stack). */
gp_layer *gp_layer_new_copy(const gp_layer_ops *ops, const void *impl, size_t nbytes);
/* A new layer like l: the same ops and parameter declarations (no values), a copy of its impl
 * (impl_nbytes bytes of plain configuration; 0: none). What a replicated kind's shard op
 * returns. */
gp_layer *gp_layer_copy(const gp_layer *l, size_t impl_nbytes);
/* Declares parameter params[nparams++]. */
gp_param *gp_layer_add_param(gp_layer *l, const char *name, gp_shape shape, gp_init_kind init,
                             float scale, bool decay);
gp_param *gp_layer_add_buffer(gp_layer *l, const char *name, gp_shape shape, gp_init_kind init);

/* Fails, naming the layer, when a parameter has no value (or with need_grads a trainable one no
 * gradient), or lives on another device than the call runs on. */
gp_status gp_layer_check_params(const gp_layer *l, const gp_ctx *c, bool need_grads);
/* Bytes of all parameters and buffers. */
uint64_t gp_layer_param_bytes(const gp_layer *l);
/* bf16's switches in the environment, each turning one of its savings back to the plain path
 * for comparison (the same bits): GP_BF16_ACTIVATIONS (bf16 | fp32: the blocks' operands kept,
 * block_skeleton.c) and GP_BF16_WEIGHT_COPY (on | off). gp_bf16_env: 1 where unset or the
 * default value, 0 for the other, -1 (with the error set, naming the variable) for any other
 * value, which the bf16 runs that read it refuse. */
typedef struct gp_bf16_switch {
    const char *var, *on, *off;
} gp_bf16_switch;
extern const gp_bf16_switch gp_bf16_activations_env, gp_bf16_weight_copy_env;
int gp_bf16_env(const gp_bf16_switch *sw);
/* Whether a store on dev keeps a bf16 copy of its product parameters (gp_param.product): on a
 * bf16 device, unless GP_BF16_WEIGHT_COPY=off (each product then rounds the weight itself, to
 * the same bits). */
bool gp_bf16_weight_copy(gp_device *dev);
/* Elements of parameter p's place in that copy: a product parameter's elements rounded up to
 * GP_BF16_COPY_ALIGN (each copy starts 128 bytes aligned, as the tensor-core GEMMs want their
 * operands), 0 for any other. */
#define GP_BF16_COPY_ALIGN 64
int64_t gp_param_bf16_copy_elems(const gp_param *p);
/* Bytes of layer l's part of the copy on dev (0 where dev keeps none): the planner's figure. */
uint64_t gp_layer_bf16_copy_bytes(const gp_layer *l, gp_device *dev);
/* One part of l's backward (ops->backward_part, or ops->backward whole as the INPUT part). */
gp_status gp_layer_backward_part(gp_layer *l, gp_ctx *c, const gp_tensor *dy, gp_tensor *dx,
                                 gp_bwd_part part);
/* The saved slots [first, first + n) a split backward keeps from its INPUT part to its WEIGHT
 * part: INPUT allocates them at `shapes`; WEIGHT fails, naming the layer, unless the INPUT part
 * ran; gp_ctx_keep_end releases them after the WEIGHT part. ALL: nothing. */
gp_status gp_ctx_keep_begin(const gp_layer *l, gp_ctx *c, gp_bwd_part part, int first, int n,
                            const gp_shape *shapes);
void gp_ctx_keep_end(gp_ctx *c, int first, int n);
/* Whether l's backward has a WEIGHT part to run later (ops->backward_part). */
static inline bool gp_layer_splits_backward(const gp_layer *l) {
    return l->ops->backward_part != NULL;
}
/* nfloats floats of GP_MEM_WORKSPACE on the call's device; NULL with *st set on failure. */
float *gp_ctx_workspace(const gp_layer *l, gp_ctx *c, int64_t nfloats, gp_status *st);
void gp_ctx_workspace_release(gp_ctx *c, void *p);

/* The kernel table of the call's device: every computation of a layer goes through it. */
static inline const gp_kernels *gp_ctx_kernels(const gp_ctx *c) { return gp_kernels_of(c->dev); }
/* A tensor's data as the float pointer the kernels take (never dereferenced by a layer). */
static inline float *gp_f32(const gp_tensor *t) { return (float *)t->data; }
static inline const int32_t *gp_i32(const gp_tensor *t) { return (const int32_t *)t->data; }
/* A tensor's data as the kernels' float operand, or as their bf16 one (uint16_t: the bits of
 * core/bf16.h): NULL when the tensor holds the other dtype, so a layer passes both and the op
 * reads the one given. */
static inline float *gp_f32_or_null(const gp_tensor *t) {
    return t->dtype == GP_F32 ? (float *)t->data : NULL;
}
static inline uint16_t *gp_bf16_or_null(const gp_tensor *t) {
    return t->dtype == GP_BF16 ? (uint16_t *)t->data : NULL;
}
/* A parameter's value and gradient as kernel arguments. */
#define GP_PVAL(l, i) ((float *)(l)->params[i].value.data)
#define GP_PGRAD(l, i) ((float *)(l)->params[i].grad.data)
/* A product parameter's bf16 copy as the linear ops' w16 (kernel_ops.def): NULL where there is
 * none, and the op rounds the value itself, to the same bits. */
#define GP_PVAL16(l, i) ((const uint16_t *)(l)->params[i].value16.data)

/* Helpers for shape checks with good messages. */
gp_status gp_expect_ndim(const gp_layer *l, const gp_shape *in, int ndim, const char *layout);
gp_status gp_expect_dim(const gp_layer *l, const gp_shape *in, int axis, int64_t want,
                        const char *what);
gp_status gp_expect_dtype(const gp_layer *l, gp_dtype got, gp_dtype want);

#endif
