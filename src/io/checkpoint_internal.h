/* The pieces of the checkpoint format (checkpoint.c) that multi-part sets (checkpoint_set.c)
 * share: tensor names, the metadata every checkpoint carries, and checking then copying a
 * layer range out of one safetensors file. Private to the library. */
#ifndef GP_IO_CHECKPOINT_INTERNAL_H
#define GP_IO_CHECKPOINT_INTERNAL_H

#include "gpipe.h"

/* "layers.<li>.<param j>[.<state k>]" (k = -1: the parameter itself). */
gp_status gp_ckpt_tensor_name(const gp_model *m, const gp_optim_opts *o, int li, int j, int k,
                              char *buf, size_t n);
/* Optimizer states saved beside parameter j of layer li (0 for frozen ones or o NULL). */
int gp_ckpt_nstates(const gp_model *m, const gp_optim_opts *o, int li, int j);
/* Tensors a checkpoint stores for parameter j of layer li: the value and its states, or none for
 * a tie's copy (stored once, under its owner's name). */
int gp_ckpt_nstored(const gp_model *m, const gp_optim_opts *o, int li, int j);

/* Puts every metadata string of a checkpoint of layers [first, last) through put(ctx, ...). */
typedef gp_status (*gp_ckpt_put)(void *ctx, const char *key, const char *value);
gp_status gp_ckpt_meta(const gp_model *m, int first, int last, const gp_optim_opts *o, int step,
                       const gp_checkpoint_kv *extra, int nextra, gp_ckpt_put put, void *ctx);

/* A "step" metadata value (NULL: none) as a step count; errors name origin. */
gp_status gp_ckpt_parse_step(const char *v, const char *origin, int *step);
/* The layers a file holds, [*first, *last), from its "layers" metadata (a foreign file: all). */
gp_status gp_ckpt_part_range(const gp_safetensors *f, const gp_model *m, int *first, int *last);
/* Checks f's header against m, which need not be initialized (the layers' declared shapes):
 * format and layer kinds, [lo, hi) within the file's layers, every name within them, and the
 * dtype, shape and presence of every tensor of layers [lo, hi), optimizer states included.
 * Reads no data. */
gp_status gp_ckpt_check_header(const gp_safetensors *f, const gp_model *m, int lo, int hi);
/* Checks f against m (format, layer kinds, optimizer, every name in the file's range, and the
 * dtype, shape and presence of every tensor of layers [lo, hi)); copies nothing. */
gp_status gp_ckpt_check(const gp_safetensors *f, gp_model *m, const gp_optim_opts *o, int lo,
                        int hi);
/* Reads every tensor of f (streamed, bounded memory) and checks its CRC-32: a damaged file is
 * refused whatever part of it a load uses, before anything is copied. */
gp_status gp_ckpt_verify(const gp_safetensors *f);
/* Whether loading layers [lo, hi) reads layer li's tensors: li in the range, or the owner of a
 * tied parameter whose copy is in it. */
bool gp_ckpt_needs_layer(const gp_model *m, int li, int lo, int hi);
/* Copies the tensors of layers [lo, hi) of a checked file into m (a tied copy in the range from
 * its owner's tensor, which the file may hold outside it). */
gp_status gp_ckpt_copy(const gp_safetensors *f, gp_model *m, const gp_optim_opts *o, int lo,
                       int hi);

#endif
