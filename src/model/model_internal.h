/* The model's private layout, shared by the model, its parameter stores, the pipeline and the
 * checkpoint code. */
#ifndef GP_MODEL_INTERNAL_H
#define GP_MODEL_INTERNAL_H

#include "layers/layer.h"

typedef struct gp_store gp_store; /* model/param_store.h */

struct gp_model {
    gp_shape example_shape; /* one example's input, no batch dimension */
    gp_dtype input_dtype;
    gp_layer **layers;
    gp_store **store_of; /* per layer: the store holding its parameters (NULL: not initialized) */
    int nlayers, cap;
    gp_shape out_example; /* output shape of the last layer at batch 1 (input if none) */
    uint64_t seed;        /* the init seed */
    bool held;            /* a pipeline holds it (with tensor-parallel shards, its values too) */
};

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
