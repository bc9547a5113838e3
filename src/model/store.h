/* Flat parameter memory (store.c), llm.c style: a store holds the parameters of a contiguous
 * range of a model's layers on one device. Sizes first, then one block per category: PARAMS (every
 * trainable element in layer and parameter order, then the buffers such as batch-norm running
 * statistics), and while training GRADS (laid out like the trainable part of PARAMS) and OPTIM
 * (one array of that size per optimizer state). Every gp_param's value, grad and state tensors
 * are views into these blocks, so zeroing the gradients is one fill, the optimizer and a
 * gradient all-reduce run over flat ranges, and a layer's gradients are one contiguous slice.
 *
 * While training on a bf16 device (gp_bf16_weight_copy) the store also keeps a bf16 copy of its
 * product parameters (gp_param.product: the matrices the linear ops read), counted as PARAMS:
 * each rounded once per stage run where every product would round it at each use, to the same
 * bits. The copy is valid, and the parameters' value16 views into it set, only from
 * gp_store_bf16_refresh at the start of a stage's run (gp_stage_run) until the optimizer
 * changes the parameters (gp_store_apply) or the run ends (gp_store_values_release): outside a
 * run anything may write the parameters (initialization, a checkpoint, the public
 * gp_model_param), and every product then rounds the value as it reads it.
 *
 * A model keeps, for each layer, the store that holds it (model_types.h). A store is freed
 * when none of its layers use it any more: placing layers in a new store (initializing them
 * again, or a pipeline moving them to its stage devices) copies what they hold and lets the
 * old store go once its last layer has moved. */
#ifndef GP_MODEL_STORE_H
#define GP_MODEL_STORE_H

#include "model/model_types.h"

struct gp_store {
    gp_device *dev;
    int first, last;    /* layers [first, last) */
    int nlive;          /* of them, those the model still has here */
    int64_t ntrain;     /* trainable elements: the GRADS block and each optimizer state array */
    int64_t nbuf;       /* buffer elements, after the trainable ones in PARAMS */
    int64_t *layer_off; /* (last - first + 1) where each layer's trainable elements start */
    gp_tensor params;   /* (ntrain + nbuf) PARAMS */
    gp_tensor grads;    /* (ntrain) GRADS, while training */
    gp_tensor optim;    /* (nstates, ntrain) OPTIM, while training */
    int nstates;
    int64_t n16;        /* the bf16 copy's elements (gp_param_bf16_copy_elems), once allocated */
    gp_tensor w16;      /* (n16) GP_BF16 PARAMS, while training on a bf16 device */
    bool w16_valid;     /* w16 holds the product parameters' values rounded; value16 views set */
};

/* Places layers [first, last) of m in a new store on dev (the PARAMS block allocated, every
 * parameter a view into it). copy: each layer's current values are copied in (every layer of
 * the range must hold values); else the values are left for gp_store_init_values. The stores
 * the layers came from are freed once none of their layers is left in them. A layer whose
 * store is training (has gradients) cannot move: an error naming it. */
gp_status gp_store_place(gp_model *m, int first, int last, gp_device *dev, bool copy,
                         gp_store **out);
/* Fills v (host, the parameter's elements) per p's init rule, keyed by (seed, layer, parameter
 * index): the values every device gets, whatever holds them. */
void gp_param_init_host(const gp_param *p, uint64_t seed, int layer, int index, float *v);
/* Initializes every parameter of the store from (seed, layer index, parameter index). */
gp_status gp_store_init_values(gp_model *m, gp_store *s, uint64_t seed);
/* Takes layers [first, last) out of their stores (their views are cleared, the layers are
 * uninitialized); a store none of whose layers is left is freed. */
void gp_store_release_layers(gp_model *m, int first, int last);

/* Training state: the GRADS block (zeroed) and nstates OPTIM arrays (zeroed), views set on
 * every trainable parameter. Fails if the store's layers are not all in it. */
gp_status gp_store_train_begin(gp_model *m, gp_store *s, int nstates);
/* Releases GRADS, OPTIM and the bf16 copy, and clears the views. */
void gp_store_train_end(gp_model *m, gp_store *s);
/* The bf16 copy of the product parameters made from their values, when the store keeps one and
 * it is not valid, and their value16 views set: on the store's device, by the thread that runs
 * it, before the first product that reads them. */
gp_status gp_store_bf16_refresh(gp_model *m, gp_store *s);
/* The values held still from here to gp_store_values_release (a stage's run, up to its
 * optimizer step): every parameter of the store gets a generation no value of any parameter
 * had before (gp_param.gen), under which a layer may keep what it derives from the values
 * (conv2d: the kernels' transformed weights, conv2d_wt) instead of deriving it at each call. */
void gp_store_values_hold(gp_model *m, gp_store *s);
/* The values may change from here: the bf16 copy marked stale and the value16 views cleared
 * (the products round the values again), each parameter's generation ended (0), and what the
 * layers derived from the values released (gp_layer_ops.drop_derived), on the thread that
 * runs the store's device. */
void gp_store_values_release(gp_model *m, gp_store *s);
/* Every gradient of the store to zero: one fill. */
gp_status gp_store_zero_grads(gp_store *s);
/* Layer li's squared gradient norm: each trainable parameter's sum of squares (in the device
 * kernel's order), added in parameter order; a tie's copy is left to its owner's layer. The pipeline combines these in layer order, which
 * makes the global norm, and so the update, independent of how layers are split into stages. */
gp_status gp_store_layer_sumsq(const gp_model *m, const gp_store *s, int li, double *out);
/* Clip by the global norm (one scale of the GRADS block) and update every trainable parameter
 * with the learning rate of 0-based `step`, over maximal runs of parameters that share their
 * weight-decay rule; the values are released first (gp_store_values_release). */
gp_status gp_store_apply(const gp_model *m, gp_store *s, const gp_optim_opts *o,
                         double global_norm, int step);
/* The gradients of layers [first, last) of the store: one contiguous slice of GRADS. */
gp_tensor gp_store_grad_slice(const gp_store *s, int first, int last);

#endif
