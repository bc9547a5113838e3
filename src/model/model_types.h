/* The model's private layout, shared by the model, its parameter stores, the pipeline and the
 * checkpoint code: types only, so that including it ties no file to another. */
#ifndef GP_MODEL_TYPES_H
#define GP_MODEL_TYPES_H

#include "layers/layer.h"

typedef struct gp_store gp_store; /* model/store.h */

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

#endif
