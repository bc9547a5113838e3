/* The tensor axis (mesh.c): the shard models, their values against the whole model's, the
 * stages' tensor-parallel groups, and whole layers put together from the shards. */
#ifndef GP_PIPELINE_MESH_H
#define GP_PIPELINE_MESH_H

#include "pipeline/state.h"

/* With T > 1: the layouts checked (named errors), the T shard models, the split masks and the
 * vocabulary head; nothing with T = 1. */
gp_status gp_mesh_setup(struct gp_pipeline *p);
void gp_mesh_free(struct gp_pipeline *p);
/* s->tp: the layers' collective group over s->tensor (counting s->tp_bytes). */
void gp_mesh_group(gp_stage *s);
/* Stage worker s's shard values: cut from the whole model's (whole: every layer of the range
 * holds values) or initialized from seed as the whole model would be, then cut. */
gp_status gp_mesh_init_values(struct gp_pipeline *p, gp_stage *s, bool whole, uint64_t seed);
/* Layer li's squared gradient norm as stage worker s holds it: the split parameters' parts and
 * (shard 0 only) the replicated ones, so that the shards' values add up to the layer's. T = 1:
 * gp_store_layer_sumsq. */
gp_status gp_mesh_layer_sumsq(const struct gp_pipeline *p, const gp_stage *s, int li,
                              double *out);
/* The whole model's layers [first, last) put together on p->scratch (with the optimizer state
 * when optim): collective over the T shards of the stage holding them (MPI: over its tensor
 * transport; threads: from the shard models). gp_mesh_whole_scatter cuts them back into the
 * shards this process holds; gp_mesh_whole_end releases them. */
gp_status gp_mesh_whole_begin(struct gp_pipeline *p, int first, int last, bool optim,
                              bool gather);
gp_status gp_mesh_whole_scatter(struct gp_pipeline *p, int first, int last, bool optim);
void gp_mesh_whole_end(struct gp_pipeline *p, int first, int last);

#endif
