/* Parameters tied across layers (ties.c): declaring a tie, and the questions the stores, shards
 * and checkpoints ask of it. */
#ifndef GP_MODEL_TIES_H
#define GP_MODEL_TIES_H

#include "model/model_types.h"

/* Ties parameter pa of layer la (the owner) and parameter pb of layer lb > la (the copy): both
 * trainable, of one shape, neither tied already; else a named error. */
gp_status gp_model_tie(gp_model *m, int la, int pa, int lb, int pb);
/* The tie whose copy (use 1) is parameter j of layer li, or -1. */
int gp_model_tie_copy(const gp_model *m, int li, int j);
/* Where parameter j of layer li takes its initial values from: itself, or a copy's owner. */
void gp_model_init_source(const gp_model *m, int li, int j, int *sl, int *sj);

#endif
