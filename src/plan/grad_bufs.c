/* The gradient-sized buffers a cell keeps beside its gradients from step to step, counted the
 * way the runtime allocates them: the tree sum's pool, replayed over the cell's backwards in its
 * stage's order, and the data-parallel sum's per-bucket host buffers. */
#include <stdlib.h>

#include "comm/gpu_comm.h"
#include "plan/grad_bufs.h"
#include "plan/options.h"

/* The most pool buffers GP_GRAD_SUM_TREE's counter (pipeline/grad_tree.c) holds at once for
 * stage k's chunk v: leaf j (micro-batches [j q, (j + 1) q)) takes a buffer at its first
 * backward (leaf 0 is the gradient block itself), and once its last weight part is done it is
 * carried up the counter, each level's buffer taking it in and the carried one given back; the
 * last leaf is folded layer by layer and takes none more. The pool never shrinks, so the run
 * keeps this many. */
static gp_status tree_pool(const gp_schedule *s, int k, int v, int *out) {
    const int M = s->micro_batches;
    int q = M;
    while (q % 2 == 0) q /= 2;
    const int nblocks = M / q;
    int nlevels = 0;
    *out = 0;
    if (nblocks < 2) return GP_OK;
    while ((1 << nlevels) < nblocks) nlevels++;
    /* per leaf and level: -1 none, 0 the gradient block, 1 a pool buffer */
    int *leaf = malloc((size_t)nblocks * sizeof *leaf), *left = malloc((size_t)nblocks * sizeof *left);
    int *level = malloc((size_t)nlevels * sizeof *level);
    gp_status st = leaf && left && level
                       ? GP_OK
                       : gp_error(GP_OUT_OF_MEMORY, "gradient tree of %d leaves", nblocks);
    for (int j = 0; st == GP_OK && j < nblocks; j++) leaf[j] = j ? -1 : 0, left[j] = q;
    for (int l = 0; st == GP_OK && l < nlevels; l++) level[l] = -1;
    int taken = 0;
    for (int i = 0; st == GP_OK && i < s->stage[k].n; i++) {
        const gp_action *a = &s->stage[k].a[i];
        if (a->chunk != v || (a->kind != GP_ACT_BACKWARD && a->kind != GP_ACT_BACKWARD_INPUT &&
                              a->kind != GP_ACT_BACKWARD_WEIGHT))
            continue;
        const int j = a->mb / q;
        if (leaf[j] < 0) leaf[j] = 1, *out = ++taken > *out ? taken : *out;
        if (a->kind == GP_ACT_BACKWARD_INPUT || --left[j] > 0 || j == nblocks - 1) continue;
        int carry = leaf[j], l = 0;
        leaf[j] = -1;
        for (; l < nlevels && level[l] >= 0; l++) {
            taken -= carry; /* added into the level's older buffer and given back */
            carry = level[l];
            level[l] = -1;
        }
        if (l == nlevels)
            st = gp_error(GP_INTERNAL, "stage %d chunk %d: gradient tree full before its last "
                                       "block", k, v);
        else
            level[l] = carry;
    }
    free(leaf);
    free(left);
    free(level);
    return st;
}

gp_status gp_grad_bufs(const gp_schedule *s, const gp_pipeline_opts *po, gp_stash_profile *prof) {
    const gp_pipeline_sizes z = gp_pipeline_opts_sizes(po);
    const bool tree = po->grad_sum == GP_GRAD_SUM_TREE;
    int dp = 0; /* per bucket: the partner's sum, the host copy of a GPU's bucket */
    if (z.data_parallel > 1 && !(po->device_type != GP_DEVICE_CPU &&
                                 po->gpu_comm == GP_GPU_COMM_NCCL))
        dp = (gp_dp_pair_rounds(z.data_parallel, tree) > 0) + (po->device_type != GP_DEVICE_CPU);
    const int V = s->chunks > 1 ? s->chunks : 1;
    for (int k = 0; k < s->stages; k++)
        for (int v = 0; v < V; v++) {
            int pool = 0;
            if (tree) GP_TRY(tree_pool(s, k, v, &pool));
            prof[gp_schedule_cell(s, k, v)].grad_bufs = pool + dp;
        }
    return GP_OK;
}
