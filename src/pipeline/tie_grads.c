/* Parameters tied across cells (model/model_types.h, gp_tie): each use's cell holds a copy and
 * accumulates its own gradient over the micro-batches, as if untied; at the step's end both
 * gradients become their sum, then each copy takes the same update (same values, state, norm,
 * clip), so the copies stay equal. Two terms add to the same bits in either order, so the sum is
 * the same whether the uses share a cell, a stage, or talk over the pipeline's transport: the
 * same for every K, schedule and launcher, K = 1 included. */
#include "pipeline/tie_grads.h"

/* The cell holding layer li, shard t. */
static gp_stage *cell_of_layer(gp_pipeline *p, int li, int t) {
    int k = p->K - 1;
    while (k > 0 && p->first[k] > li) k--;
    return gp_worker(p, k, t);
}

static gp_tensor *use_grad(const gp_stage *s, const gp_tie *tie, int u) {
    return &s->m->layers[tie->layer[u]]->params[tie->param[u]].grad;
}

/* *y += x (on y's device; x anywhere): through a copy on y's device, workspace while it lives. */
static gp_status add_into(gp_tensor *y, const gp_tensor *x) {
    gp_tensor tmp;
    GP_TRY(gp_tensor_alloc(y->dev, GP_MEM_WORKSPACE, x->shape, GP_F32, &tmp));
    gp_status st = gp_tensor_copy(&tmp, x);
    if (st == GP_OK)
        st = gp_kernels_of(y->dev)->axpy(y->dev, gp_tensor_nelem(y), 1.0f, gp_f32(&tmp),
                                         gp_f32(y));
    gp_tensor_release(&tmp);
    return st;
}

/* Both uses here: the owner's gradient becomes the sum, the copy's a copy of it. */
static gp_status sum_here(gp_tensor *ga, gp_tensor *gb) {
    GP_TRY(add_into(ga, gb));
    return gp_tensor_copy(gb, ga);
}

/* One use here (cell me), the other on cell peer of another stage: each sends its gradient and
 * adds the other's. The sends go first on both sides (a mailbox holds them), so neither waits. */
static gp_status sum_across(gp_stage *me, const gp_stage *peer, int i, gp_tensor *g) {
    const gp_msg_tag tag = {GP_MSG_TIE, i, 0};
    gp_tensor out, in;
    GP_TRY(gp_tensor_alloc(me->dev, GP_MEM_WORKSPACE, g->shape, GP_F32, &out));
    gp_status st = gp_tensor_copy(&out, g);
    if (st != GP_OK) {
        gp_tensor_release(&out);
        return st;
    }
    GP_TRY(gp_transport_send(me->pipe, me->k, peer->k, tag, &out)); /* takes out */
    GP_TRY(gp_tensor_alloc(me->dev, GP_MEM_WORKSPACE, g->shape, GP_F32, &in));
    st = gp_transport_recv(me->pipe, me->k, peer->k, tag, &in);
    if (st == GP_OK)
        st = gp_kernels_of(me->dev)->axpy(me->dev, gp_tensor_nelem(g), 1.0f, gp_f32(&in),
                                          gp_f32(g));
    gp_tensor_release(&in);
    return st;
}

gp_status gp_ties_sum(gp_pipeline *p, gp_stage *lead) {
    const gp_model *m = lead->m;
    for (int i = 0; i < m->nties; i++) {
        const gp_tie *tie = &m->ties[i];
        gp_stage *a = cell_of_layer(p, tie->layer[0], lead->t);
        gp_stage *b = cell_of_layer(p, tie->layer[1], lead->t);
        const bool ha = a->dk == lead->dk, hb = b->dk == lead->dk;
        gp_status st = GP_OK;
        if (ha && hb)
            st = sum_here(use_grad(a, tie, 0), use_grad(b, tie, 1));
        else if (ha)
            st = sum_across(a, b, i, use_grad(a, tie, 0));
        else if (hb)
            st = sum_across(b, a, i, use_grad(b, tie, 1));
        if (st != GP_OK)
            return gp_error_context(st, "the tied parameter of layers %d and %d", tie->layer[0],
                                    tie->layer[1]);
    }
    return GP_OK;
}

gp_status gp_ties_sum_local(gp_pipeline *p) {
    for (int t = 0; t < p->T; t++) {
        const gp_model *m = gp_worker(p, 0, t)->m;
        for (int i = 0; i < m->nties; i++) {
            const gp_tie *tie = &m->ties[i];
            GP_TRY(sum_here(use_grad(cell_of_layer(p, tie->layer[0], t), tie, 0),
                            use_grad(cell_of_layer(p, tie->layer[1], t), tie, 1)));
        }
    }
    return GP_OK;
}
