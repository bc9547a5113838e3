/* The model's private layout, shared by the model, the trainer and (later)
 * the pipeline stages. */
#ifndef GP_MODEL_INTERNAL_H
#define GP_MODEL_INTERNAL_H

#include "../layers/layer.h"

struct gp_model {
    gp_shape example_shape; /* one example's input, no batch dimension */
    gp_dtype input_dtype;
    gp_layer **layers;
    gp_device **devs; /* per layer: where its parameters live (NULL: not initialized) */
    int nlayers, cap;
    gp_shape out_example; /* output shape of the last layer at batch 1 (input if none) */
    uint64_t seed; /* the init seed */
};

/* Releases every tensor of layers [first, last) (values, gradients, optimizer
 * state) and marks them uninitialized: the undoing of gp_model_init_range. */
void gp_model_release_range(gp_model *m, int first, int last);

/* The device holding all of layers [first, last), or NULL with the message
 * set if they are not initialized on one device. */
gp_device *gp_model_range_device(const gp_model *m, int first, int last);

#endif
