/* Running a contiguous range of a model's layers forward and backward: the
 * mechanism a single-device trainer uses for the whole model and a pipeline
 * stage uses for its cell. */
#ifndef GP_MODEL_SEQUENCE_H
#define GP_MODEL_SEQUENCE_H

#include "model/model_types.h"

/* One micro-batch's pass through layers [first, last): every layer's output
 * and context, kept for backward. */
typedef struct gp_seq_pass {
    int first, last;
    gp_device *dev;  /* where activations and saved state are counted */
    gp_tensor *acts; /* last - first + 1: acts[0] = the input (a view), acts[k + 1] = output of layer first + k */
    gp_ctx *ctxs;    /* last - first */
    gp_tensor *dys;  /* last - first, after gp_seq_backward_input: the output gradients that the
                      * layers' WEIGHT parts still need */
    /* A model with skips (model/skips.h), one entry per layer of the model, indexed by source:
     * the skips the input's cut carries in (views of it), and during backward each source's
     * skip gradient summed so far (views of dy's cut, or owned). NULL without skips. */
    gp_tensor *skip_in, *skip_grad;
} gp_seq_pass;

/* Inputs and outputs are cuts (model/skips.h): x is what crosses cut `first` (the activation,
 * with the skips that cross there packed beside it), a range's output and dy what crosses cut
 * `last`, dx cut `first` again. Without skips crossing they are the plain activations.
 *
 * A skip's gradient reaches its source in one fixed order wherever its merges run: each merge's
 * gradient of the skip, from the last merge to the first, summed into one (the first as is, the
 * others added), then added to the gradient from the source's successor right before the
 * source's own backward. The cut carries the sum so far from cell to cell, so every
 * partition adds the same numbers in the same order.
 *
 * Forward, keeping everything for backward. On failure everything allocated
 * is released. */
gp_status gp_seq_forward(gp_model *m, int first, int last, gp_device *dev, const gp_run *run,
                         const gp_tensor *x, gp_seq_pass *p);
/* The output of a forward pass (owned by p): the activation, without skips. */
const gp_tensor *gp_seq_output(const gp_seq_pass *p);
/* A copy of what the pass sends on: its output's cut (the activation, and the skips crossing
 * cut `last`), allocated on the pass's device. */
gp_status gp_seq_cut_output(gp_model *m, const gp_seq_pass *p, gp_tensor *out);
/* Backward from dy (the gradient of the output's cut; the skip gradients it carries are added
 * into its activation part in place). Writes the gradient of the input's cut into dx when dx is
 * not NULL (allocated by the caller, the input's cut shape), adds into parameter gradients, and
 * releases the pass as it goes. */
gp_status gp_seq_backward(gp_model *m, gp_seq_pass *p, const gp_tensor *dy, gp_tensor *dx);
/* The same, calling done(ctx, li) right after layer li's backward has added into its parameter
 * gradients (layers last-1 down to first), e.g. to send gradients that are final while the
 * earlier layers still run. A failure of done stops the backward with its status. */
typedef gp_status (*gp_seq_layer_done)(void *ctx, int li);
gp_status gp_seq_backward_each(gp_model *m, gp_seq_pass *p, const gp_tensor *dy, gp_tensor *dx,
                               gp_seq_layer_done done, void *ctx);
/* The backward in two parts (zero-bubble schedules). backward_input: every layer's INPUT part,
 * last to first, dx as gp_seq_backward's; what the WEIGHT parts still need (each splitting
 * layer's context, input and output gradient) stays in p, the rest is released. Then
 * backward_weight_each: every splitting layer's WEIGHT part, last to first, done(ctx, li) after
 * each layer (its gradients are then final for this micro-batch), and p released. The two give
 * the bits of gp_seq_backward. */
gp_status gp_seq_backward_input(gp_model *m, gp_seq_pass *p, const gp_tensor *dy, gp_tensor *dx);
gp_status gp_seq_backward_weight_each(gp_model *m, gp_seq_pass *p, gp_seq_layer_done done,
                                      void *ctx);
/* After gp_seq_backward_input: whether the weight parts still read the dy it was given. */
bool gp_seq_holds_output_grad(const gp_seq_pass *p);
/* Releases whatever the pass still holds; safe on a released pass. */
void gp_seq_release(gp_seq_pass *p);

/* Forward in the mode `run` says (training or eval) that keeps nothing for backward, each
 * layer's state and input released as soon as the next layer has run: y receives the output
 * (allocated here on dev as ACTIVATIONS; the caller releases it). What a re-materialized cell
 * runs in its first forward, and what inference runs. */
gp_status gp_seq_forward_output(gp_model *m, int first, int last, gp_device *dev,
                                const gp_run *run, const gp_tensor *x, gp_tensor *y);

#endif
