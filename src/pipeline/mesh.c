/* The tensor axis of the pipeline's mesh (D x K x T): each stage's layers split over T shards,
 * each shard running the shard model (model/shard.h) on its own device; the layers' collective
 * group over the stage's tensor transport; the shards' values against the whole model's (cut at
 * set-up, put together for checkpoints and the parameter hash, in host memory on p->scratch);
 * and the squared gradient norms so that the shards' parts add up to each layer's. */
#include <stdlib.h>
#include <string.h>

#include "model/shard.h"
#include "optim/optim.h"
#include "pipeline/mesh.h"

gp_status gp_mesh_setup(gp_pipeline *p) {
    if (p->T == 1) return GP_OK;
    gp_model *m = p->m;
    const int T = p->T, L = m->nlayers;
    GP_TRY(gp_model_check_layouts(m, T));
    p->shard = calloc((size_t)T, sizeof *p->shard);
    p->split_mask = calloc((size_t)L, sizeof *p->split_mask);
    if (!p->shard || !p->split_mask)
        return gp_error(GP_OUT_OF_MEMORY, "pipeline: cannot allocate %d shard models", T);
    for (int t = 0; t < T; t++) GP_TRY(gp_model_shard_new(m, T, &p->shard[t]));
    for (int li = 0; li < L; li++) {
        gp_layout lo;
        gp_model_layout(m, li, &lo);
        for (int i = 0; i < lo.nsplits; i++) p->split_mask[li] |= 1u << lo.splits[i].param;
    }
    p->vocab_split = gp_model_output_split(m);
    p->vocab = m->out_example.dim[m->out_example.ndim - 1];
    return gp_device_cpu_new("whole", &p->scratch);
}

void gp_mesh_free(gp_pipeline *p) {
    for (int t = 0; p->shard && t < p->T; t++) gp_model_free(p->shard[t]);
    free(p->shard);
    free(p->split_mask);
    if (p->scratch) gp_device_free(p->scratch);
    p->shard = NULL;
    p->split_mask = NULL;
    p->scratch = NULL;
}

/* ------------------------------------------------------------ the group */

static gp_status host_only(const gp_stage *s, gp_device *dev, const char *what) {
    if (gp_device_is_host(dev)) return GP_OK;
    return gp_error(GP_UNSUPPORTED,
                    "stage %d shard %d: the %s transport's collectives take host memory, and %s "
                    "is not (a device transport, such as NCCL, would take it)",
                    s->k, s->t, s->tensor ? s->tensor->iface->name : "tensor",
                    gp_device_name(dev));
}

static gp_status tp_allreduce(void *ctx, gp_device *dev, float *x, int64_t n, gp_reduce_op op) {
    gp_stage *s = ctx;
    GP_TRY(host_only(s, dev, "all-reduce"));
    s->tp_bytes += (uint64_t)n * sizeof *x;
    return gp_transport_allreduce_f32(s->tensor, s->t, x, n, op);
}

static gp_status tp_allgather(void *ctx, gp_device *dev, const float *x, int64_t n, float *out) {
    gp_stage *s = ctx;
    GP_TRY(host_only(s, dev, "all-gather"));
    s->tp_bytes += (uint64_t)n * sizeof *x;
    return gp_transport_allgather_f32(s->tensor, s->t, x, n, out);
}

void gp_mesh_group(gp_stage *s) {
    s->tp = (gp_coll_group){.rank = s->t, .size = s->p->T, .allreduce = tp_allreduce,
                            .allgather = tp_allgather, .ctx = s};
}

/* ------------------------------------------------------------ values */

/* t's bytes as host floats: its own, or a copy in *copy (the caller frees it). */
static gp_status host_floats(const gp_tensor *t, float **out, float **copy) {
    *copy = NULL;
    if ((*out = gp_tensor_host_data(t))) return GP_OK;
    const size_t n = gp_tensor_nbytes(t);
    if (!(*copy = malloc(n ? n : 1))) return gp_error(GP_OUT_OF_MEMORY, "%zu bytes", n);
    *out = *copy;
    return gp_tensor_to_host(t, *copy, n);
}

gp_status gp_mesh_init_values(gp_pipeline *p, gp_stage *s, bool whole, uint64_t seed) {
    gp_model *m = p->m;
    if (!whole) return gp_shard_init_values(m, s->m, s->store, p->T, s->t, seed);
    gp_status st = GP_OK;
    for (int li = s->first; li < s->last && st == GP_OK; li++)
        for (int j = 0; j < m->layers[li]->nparams && st == GP_OK; j++) {
            float *v, *copy;
            st = host_floats(&m->layers[li]->params[j].value, &v, &copy);
            if (st == GP_OK)
                st = gp_shard_scatter(m, li, j, p->T, s->t, v, &s->m->layers[li]->params[j].value);
            free(copy);
        }
    return st;
}

gp_status gp_mesh_layer_sumsq(const gp_pipeline *p, const gp_stage *s, int li, double *out) {
    if (p->T == 1) return gp_store_layer_sumsq(s->m, s->store, li, out);
    const gp_kernels *k = gp_kernels_of(s->dev);
    const gp_layer *l = s->m->layers[li];
    double sum = 0;
    for (int j = 0; j < l->nparams; j++) {
        const gp_param *pa = &l->params[j];
        /* A replicated parameter's gradient is the same on every shard: counted once. */
        if (!pa->trainable || (!(p->split_mask[li] >> j & 1u) && s->t != 0) ||
            gp_model_tie_copy(s->m, li, j) >= 0) /* a tie's copy: its owner's layer counts it */
            continue;
        double v = 0;
        GP_TRY(k->sumsq(s->dev, (const float *)pa->grad.data, gp_tensor_nelem(&pa->grad), &v));
        sum += v;
    }
    *out = sum;
    return GP_OK;
}

/* ------------------------------------------------------------ whole layers */

static gp_tensor *param_tensor(gp_model *m, int li, int j, int state) {
    gp_param *pa = &m->layers[li]->params[j];
    return state < 0 ? &pa->value : &pa->state[state];
}

static int nstates_of(const gp_pipeline *p, const gp_param *pa, bool optim) {
    return optim && !p->inference && pa->trainable ? gp_optim_state_count(&p->o) : 0;
}

/* Shard parts of one tensor put together into whole (host floats). */
static gp_status gather_one(gp_pipeline *p, int li, int j, int state, float *whole) {
    gp_model *m = p->m;
    const bool split = p->split_mask[li] >> j & 1u;
    if (p->my_shard < 0) { /* threads: every shard is here */
        if (!split) {
            const gp_tensor *part = param_tensor(p->shard[0], li, j, state);
            return gp_tensor_to_host(part, whole, gp_tensor_nbytes(part));
        }
        for (int t = 0; t < p->T; t++)
            GP_TRY(gp_shard_gather(m, li, j, p->T, t, param_tensor(p->shard[t], li, j, state),
                                   whole));
        return GP_OK;
    }
    gp_stage *s = gp_worker(p, p->my_stage, p->my_shard);
    const gp_tensor *part = param_tensor(s->m, li, j, state);
    if (!split) return gp_tensor_to_host(part, whole, gp_tensor_nbytes(part));
    const int64_t n = gp_tensor_nelem(part);
    float *mine, *copy, *all = malloc((size_t)(n * p->T) * sizeof *all);
    gp_status st = all ? host_floats(part, &mine, &copy)
                       : gp_error(GP_OUT_OF_MEMORY, "gathering %lld floats", (long long)(n * p->T));
    if (all && st == GP_OK) {
        st = gp_transport_allgather_f32(s->tensor, s->t, mine, n, all);
        free(copy);
    }
    if (st == GP_OK) {
        gp_layout lo;
        gp_model_layout(m, li, &lo);
        const gp_shape *shape = &m->layers[li]->params[j].shape;
        for (int t = 0; t < p->T; t++)
            gp_layout_copy(gp_layout_split_of(&lo, j), shape, p->T, t, whole, all + n * t, false);
    }
    free(all);
    return st;
}

gp_status gp_mesh_whole_begin(gp_pipeline *p, int first, int last, bool optim, bool gather) {
    gp_model *m = p->m;
    gp_store *ws;
    GP_TRY(gp_store_place(m, first, last, p->scratch, false, &ws));
    const int nstates = optim && !p->inference ? gp_optim_state_count(&p->o) : 0;
    gp_status st = nstates ? gp_store_train_begin(m, ws, nstates) : GP_OK;
    for (int li = first; li < last && st == GP_OK && gather; li++)
        for (int j = 0; j < m->layers[li]->nparams && st == GP_OK; j++)
            for (int k = -1; k < nstates_of(p, &m->layers[li]->params[j], optim) && st == GP_OK;
                 k++)
                st = gather_one(p, li, j, k, gp_tensor_host_data(param_tensor(m, li, j, k)));
    if (st != GP_OK) {
        gp_mesh_whole_end(p, first, last);
        return gp_error_context(st, "putting layers %d..%d together from %d shards", first,
                                last - 1, p->T);
    }
    return GP_OK;
}

gp_status gp_mesh_whole_scatter(gp_pipeline *p, int first, int last, bool optim) {
    gp_model *m = p->m;
    for (int t = 0; t < p->T; t++) {
        if (p->my_shard >= 0 && t != p->my_shard) continue;
        for (int li = first; li < last; li++)
            for (int j = 0; j < m->layers[li]->nparams; j++)
                for (int k = -1; k < nstates_of(p, &m->layers[li]->params[j], optim); k++)
                    GP_TRY(gp_shard_scatter(m, li, j, p->T, t,
                                            gp_tensor_host_data(param_tensor(m, li, j, k)),
                                            param_tensor(p->shard[t], li, j, k)));
    }
    return GP_OK;
}

void gp_mesh_whole_end(gp_pipeline *p, int first, int last) {
    gp_model *m = p->m;
    if (first < last && m->store_of[first]) gp_store_train_end(m, m->store_of[first]);
    gp_store_release_layers(m, first, last);
}
