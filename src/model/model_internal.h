/* The model's private layout, shared by the model, its parameter stores, the pipeline and the
 * checkpoint code. */
#ifndef GP_MODEL_INTERNAL_H
#define GP_MODEL_INTERNAL_H

#include "layers/layer.h"

typedef struct gp_store gp_store; /* model/param_store.h */

/* A parameter shared by two layers (GPT-2's token embedding reused as its output head): use 0
 * (the earlier layer's parameter, which owns it: its values are initialized, counted in the
 * gradient norm and saved) and use 1 (a copy of the same shape, which every step keeps equal:
 * both uses' gradients are summed and both copies take the same update). */
#define GP_MODEL_MAX_TIES 4
typedef struct gp_tie {
    int layer[2], param[2];
} gp_tie;

struct gp_model {
    gp_shape example_shape; /* one example's input, no batch dimension */
    gp_dtype input_dtype;
    gp_layer **layers;
    gp_store **store_of; /* per layer: the store holding its parameters (NULL: not initialized) */
    int nlayers, cap;
    gp_shape out_example; /* output shape of the last layer at batch 1 (input if none) */
    uint64_t seed;        /* the init seed */
    bool held;            /* a pipeline holds it (with tensor-parallel shards, its values too) */
    gp_tie ties[GP_MODEL_MAX_TIES];
    int nties;
};

/* Ties parameter pa of layer la (the owner) and parameter pb of layer lb > la (the copy): both
 * trainable, of one shape, neither tied already; else a named error. */
gp_status gp_model_tie(gp_model *m, int la, int pa, int lb, int pb);
/* The tie whose copy (use 1) is parameter j of layer li, or -1. */
int gp_model_tie_copy(const gp_model *m, int li, int j);
/* Where parameter j of layer li takes its initial values from: itself, or a copy's owner. */
void gp_model_init_source(const gp_model *m, int li, int j, int *sl, int *sj);

/* The device holding layer li's parameters (NULL: not initialized). */
gp_device *gp_model_layer_device(const gp_model *m, int li);
/* The device holding all of layers [first, last), or NULL with the message set if they are not
 * initialized on one device. */
gp_device *gp_model_range_device(const gp_model *m, int first, int last);

/* Eval-mode forward of layers [first, last) on x (anywhere): each layer runs on its parameters'
 * device, the activation moving between devices; out (the caller releases it) lives on the last
 * layer's device. Every layer of the range must be initialized. */
gp_status gp_model_forward_eval(gp_model *m, int first, int last, const gp_tensor *x,
                                gp_tensor *out);
/* The loss sum (normalizer 1) and correct argmax predictions of logits against labels y (either
 * anywhere; labels -1 are not counted). */
gp_status gp_model_score(const gp_tensor *logits, const gp_tensor *y, double *loss_sum,
                         int64_t *ncorrect, int64_t *ncount);

/* Continues the FNV-1a hash *h over the bytes of every parameter and buffer of layers
 * [first, last) that hold values, in layer and parameter order (device memory through a host
 * copy): the parameter hash, chainable across stages. */
gp_status gp_model_params_fnv1a64_range(const gp_model *m, int first, int last, uint64_t *h);

#endif
