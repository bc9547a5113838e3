/* The launchers' way into the runtime's state: binding their hooks and transports, this
 * process's place, and a step's inputs and counters. Kept apart from pipeline.c, which chooses
 * the launcher: the launchers call these, and nothing here calls a launcher. */
#include <stdio.h>
#include <stdlib.h>

#include "pipeline/launcher.h"
#include "pipeline/stage.h"
#include "pipeline/timeline.h"

void gp_pipeline_bind_launcher(gp_pipeline *p, const gp_launcher_iface *iface, void *state,
                               const gp_stage_sync *sync) {
    p->launcher = iface;
    p->launch = state;
    p->sync = *sync;
}

void gp_pipeline_bind_transport(gp_pipeline *p, gp_transport *tr) { p->tr = tr; }

void gp_stage_bind_transports(gp_stage *s, gp_transport *pipe, gp_transport *tensor) {
    s->pipe = pipe;
    s->tensor = tensor;
}

void gp_stage_set_cpu(gp_stage *s, int cpu) { s->cpu = cpu; }

void gp_pipeline_set_gpu_comm(gp_pipeline *p, gp_gpu_comm use, const char *why) {
    p->gpu_comm = use;
    snprintf(p->gpu_comm_why, sizeof p->gpu_comm_why, "%s", why ? why : "");
}

gp_status gp_pipeline_set_place(gp_pipeline *p, const gp_place *pl) {
    p->rank = pl->rank;
    p->local_rank = pl->local_rank;
    p->nranks = pl->nranks;
    p->my_stage = pl->stage;
    p->my_shard = pl->shard;
    p->replica = pl->replica;
    p->D = pl->replicas;
    free(p->bytes);
    free(p->tp_bytes);
    p->bytes = calloc(2 * (size_t)p->nranks, sizeof *p->bytes);
    p->tp_bytes = calloc((size_t)p->nranks, sizeof *p->tp_bytes);
    if (!p->bytes || !p->tp_bytes)
        return gp_error(GP_OUT_OF_MEMORY, "pipeline: cannot allocate the byte counters of %d ranks",
                        p->nranks);
    return GP_OK;
}

gp_status gp_pipeline_begin_step(gp_pipeline *p, const gp_tensor *x, const gp_tensor *y, int mb0) {
    p->x = x;
    p->y = y;
    p->b = x->shape.dim[0] / p->M;
    p->mb0 = mb0;
    for (int w = 0; w < p->K * p->T; w++)
        if (p->st[w].run_here) GP_TRY(gp_stage_begin_step(&p->st[w]));
    gp_timeline_reset(p);
    return GP_OK;
}

void gp_pipeline_end_step(gp_pipeline *p, double seconds) { p->step_s = seconds; }

void gp_pipeline_set_bytes(gp_pipeline *p, int r, uint64_t p2p, uint64_t allreduce,
                           uint64_t tensor) {
    if (p->bytes) {
        p->bytes[2 * r] = p2p;
        p->bytes[2 * r + 1] = allreduce;
    }
    p->tp_bytes[r] = tensor;
}

gp_status gp_pipeline_set_rank_mem(gp_pipeline *p, int r, const gp_mem_stats *m) {
    if (!p->rank_mem && !(p->rank_mem = calloc((size_t)p->nranks, sizeof *p->rank_mem)))
        return gp_error(GP_OUT_OF_MEMORY, "pipeline: the counters of %d ranks", p->nranks);
    p->rank_mem[r] = *m;
    return GP_OK;
}
