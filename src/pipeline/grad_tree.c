/* The tree sum of a cell's weight gradients over its micro-batches (GP_GRAD_SUM_TREE): each
 * block of q consecutive micro-batches adds into a leaf buffer of its own, and the finished
 * leaves meet in a binary counter, so that the cell's sum over its replica's M micro-batches is
 * the same subtree the single-replica run builds over that block of the mini-batch. */
#include <stdlib.h>
#include <string.h>

#include "kernels/kernels.h"
#include "pipeline/grad_tree.h"

const char *gp_grad_sum_name(gp_grad_sum g) {
    return g == GP_GRAD_SUM_TREE ? "tree" : g == GP_GRAD_SUM_SEQUENTIAL ? "sequential" : "?";
}

/* The cell's slice of its store's gradient block: where the layers' views point between
 * actions and where the sum ends. */
static float *cell_grads(const gp_stage *s, int64_t *n) {
    gp_tensor g = gp_store_grad_slice(s->store, s->first, s->last);
    *n = gp_tensor_nelem(&g);
    return g.data;
}

gp_status gp_grad_tree_setup(gp_stage *s, int M) {
    gp_grad_tree *t = &s->gt;
    memset(t, 0, sizeof *t);
    int q = M;
    while (q % 2 == 0) q /= 2;
    t->q = q;
    t->nblocks = M / q;
    if (t->nblocks < 2 || !s->store) return GP_OK; /* one block: the sequential sum itself */
    cell_grads(s, &t->n);
    if (t->n == 0) return GP_OK;
    while ((1 << t->nlevels) < t->nblocks) t->nlevels++;
    t->leaf = malloc((size_t)t->nblocks * sizeof *t->leaf);
    t->left = malloc((size_t)t->nblocks * sizeof *t->left);
    t->level = malloc((size_t)t->nlevels * sizeof *t->level);
    t->pool = calloc((size_t)(t->nlevels + t->nblocks), sizeof *t->pool);
    t->is_free = calloc((size_t)(t->nlevels + t->nblocks), sizeof *t->is_free);
    if (!t->leaf || !t->left || !t->level || !t->pool || !t->is_free)
        return gp_error(GP_OUT_OF_MEMORY, "cell %d: cannot allocate its gradient tree", s->k);
    t->on = true;
    return GP_OK;
}

void gp_grad_tree_free(gp_stage *s) {
    gp_grad_tree *t = &s->gt;
    for (int i = 0; t->pool && i < t->npool; i++) gp_tensor_release(&t->pool[i]);
    free(t->leaf);
    free(t->left);
    free(t->level);
    free(t->pool);
    free(t->is_free);
    memset(t, 0, sizeof *t);
}

/* Buffer ids: 0 is the cell's slice of the gradient block itself, which takes leaf 0 (zero at
 * the step's start, or what gp_pipeline_accumulate left there); leaves are merged into the older
 * buffer, so the sum of leaves 0..2^l - 1 stays in it and the tree ends where the optimizer
 * reads. Ids 1..npool are the pool's. */
void gp_grad_tree_begin_step(gp_stage *s) {
    gp_grad_tree *t = &s->gt;
    if (!t->on) return;
    for (int j = 0; j < t->nblocks; j++) t->leaf[j] = -1, t->left[j] = t->q;
    t->leaf[0] = 0;
    for (int l = 0; l < t->nlevels; l++) t->level[l] = -1;
    for (int i = 0; i < t->npool; i++) t->is_free[i] = true;
}

/* A zeroed buffer of the pool (made the first time more are needed than ever before; kept
 * for the next steps, counted as gradients). */
static gp_status acquire(gp_stage *s, int *out) {
    gp_grad_tree *t = &s->gt;
    int i = 0;
    while (i < t->npool && !t->is_free[i]) i++;
    if (i == t->npool) {
        if (t->npool == t->nlevels + t->nblocks)
            return gp_error(GP_INTERNAL, "cell %d: gradient tree needs more than %d buffers",
                            s->k, t->npool);
        GP_TRY(gp_tensor_alloc(s->dev, GP_MEM_GRADS, gp_shape1(t->n), GP_F32, &t->pool[i]));
        t->npool++;
    }
    GP_TRY(gp_tensor_fill_zero(&t->pool[i]));
    t->is_free[i] = false;
    *out = i + 1;
    return GP_OK;
}

static float *buf(const gp_stage *s, int id) {
    int64_t n;
    return id == 0 ? cell_grads(s, &n) : s->gt.pool[id - 1].data;
}

static void release(gp_grad_tree *t, int id) {
    if (id > 0) t->is_free[id - 1] = true;
}

/* Every trainable view of the cell's layers moves from base `from` to base `to`. */
static void repoint(gp_stage *s, float *from, float *to) {
    for (int li = s->first; li < s->last; li++) {
        gp_layer *l = s->m->layers[li];
        for (int j = 0; j < l->nparams; j++) {
            gp_param *p = &l->params[j];
            if (p->trainable && p->grad.data) p->grad.data = to + ((float *)p->grad.data - from);
        }
    }
}

gp_status gp_grad_tree_enter(gp_stage *s, int mb) {
    gp_grad_tree *t = &s->gt;
    if (!t->on) return GP_OK;
    const int j = mb / t->q;
    if (t->leaf[j] < 0) GP_TRY(acquire(s, &t->leaf[j]));
    repoint(s, buf(s, 0), buf(s, t->leaf[j]));
    return GP_OK;
}

/* y += x over n floats on the cell's device (addition commutes: the bits do not depend on
 * which operand is which, only on the tree's shape). */
static gp_status add(gp_stage *s, const float *x, float *y, int64_t n) {
    return gp_kernels_of(s->dev)->axpy(s->dev, n, 1.0f, x, y);
}

/* Leaf j is complete (not the last: that one is folded layer by layer, gp_grad_tree_layer_final):
 * carried up the counter, added into each level's older subtree. */
static gp_status push(gp_stage *s, int j) {
    gp_grad_tree *t = &s->gt;
    int carry = t->leaf[j], l = 0;
    t->leaf[j] = -1;
    for (; l < t->nlevels && t->level[l] >= 0; l++) {
        GP_TRY(add(s, buf(s, carry), buf(s, t->level[l]), t->n));
        release(t, carry);
        carry = t->level[l];
        t->level[l] = -1;
    }
    if (l == t->nlevels)
        return gp_error(GP_INTERNAL, "cell %d: gradient tree full before its last block", s->k);
    t->level[l] = carry;
    return GP_OK;
}

gp_status gp_grad_tree_leave(gp_stage *s, int mb, bool last_part) {
    gp_grad_tree *t = &s->gt;
    if (!t->on) return GP_OK;
    const int j = mb / t->q;
    repoint(s, buf(s, t->leaf[j]), buf(s, 0));
    if (!last_part || --t->left[j] > 0 || j == t->nblocks - 1) return GP_OK;
    return push(s, j);
}

bool gp_grad_tree_folds(const gp_stage *s, int mb) {
    return s->gt.on && mb / s->gt.q == s->gt.nblocks - 1 && s->gt.left[s->gt.nblocks - 1] == 1;
}

gp_status gp_grad_tree_layer_final(gp_stage *s, int li) {
    gp_grad_tree *t = &s->gt;
    const int j = t->nblocks - 1;
    for (int l = 0; l < t->nlevels; l++)
        if (t->level[l] < 0)
            return gp_error(GP_INTERNAL, "cell %d: the last block of micro-batches finished "
                                         "before block %d", s->k, j - (1 << l));
    gp_tensor g = gp_store_grad_slice(s->store, li, li + 1);
    const int64_t off = (float *)g.data - buf(s, 0), len = gp_tensor_nelem(&g);
    /* up the counter into the top level, leaf 0's buffer: the gradient block */
    for (int l = 0, carry = t->leaf[j]; l < t->nlevels && len > 0; l++) {
        GP_TRY(add(s, buf(s, carry) + off, buf(s, t->level[l]) + off, len));
        carry = t->level[l];
    }
    return GP_OK;
}
