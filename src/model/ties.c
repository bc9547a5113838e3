/* Parameters tied across layers (model_types.h, gp_tie): declaring a tie, checked, and the
 * questions the stores, shards and checkpoints ask of it; tie_embeddings, GPT-2's shared token
 * embedding and output head. */
#include <string.h>

#include "model/ties.h"

gp_status gp_model_tie(gp_model *m, int la, int pa, int lb, int pb) {
    if (!m || la < 0 || lb <= la || lb >= m->nlayers || pa < 0 ||
        pa >= m->layers[la]->nparams || pb < 0 || pb >= m->layers[lb]->nparams)
        return gp_error(GP_INVALID_ARGUMENT, "tie: layers %d and %d (parameters %d and %d) of a "
                                             "model of %d layers: expected two parameters of "
                                             "two layers, the earlier first",
                        la, lb, pa, pb, m ? m->nlayers : 0);
    const gp_param *a = &m->layers[la]->params[pa], *b = &m->layers[lb]->params[pb];
    char sa[96], sb[96];
    if (!gp_shape_equal(&a->shape, &b->shape))
        return gp_error(GP_SHAPE, "tie: layer %d (%s) %s has shape %s, layer %d (%s) %s has "
                                  "shape %s: a tied parameter needs one shape at both uses",
                        la, m->layers[la]->ops->kind, a->name, gp_shape_str(&a->shape, sa, sizeof sa),
                        lb, m->layers[lb]->ops->kind, b->name, gp_shape_str(&b->shape, sb, sizeof sb));
    if (!a->trainable || !b->trainable)
        return gp_error(GP_INVALID_ARGUMENT, "tie: layer %d %s and layer %d %s must both be "
                                             "trainable parameters, not buffers",
                        la, a->name, lb, b->name);
    for (int i = 0; i < m->nties; i++)
        for (int u = 0; u < 2; u++)
            if ((m->ties[i].layer[u] == la && m->ties[i].param[u] == pa) ||
                (m->ties[i].layer[u] == lb && m->ties[i].param[u] == pb))
                return gp_error(GP_INVALID_ARGUMENT, "tie: layer %d %s or layer %d %s is tied "
                                                     "already",
                                la, a->name, lb, b->name);
    if (m->nties == GP_MODEL_MAX_TIES)
        return gp_error(GP_INVALID_ARGUMENT, "tie: at most %d tied parameters per model",
                        GP_MODEL_MAX_TIES);
    if (m->store_of[la] || m->store_of[lb])
        return gp_error(GP_INVALID_ARGUMENT, "tie: layers %d and %d must be tied before the "
                                             "model is initialized",
                        la, lb);
    m->ties[m->nties++] = (gp_tie){{la, lb}, {pa, pb}};
    return GP_OK;
}

int gp_model_tie_copy(const gp_model *m, int li, int j) {
    for (int i = 0; i < m->nties; i++)
        if (m->ties[i].layer[1] == li && m->ties[i].param[1] == j) return i;
    return -1;
}

void gp_model_init_source(const gp_model *m, int li, int j, int *sl, int *sj) {
    const int t = gp_model_tie_copy(m, li, j);
    *sl = t < 0 ? li : m->ties[t].layer[0];
    *sj = t < 0 ? j : m->ties[t].param[0];
}

/* The first layer of kind `kind` from `from` in direction `step`, or -1. */
static int find_kind(const gp_model *m, const char *kind, int from, int step) {
    for (int i = from; i >= 0 && i < m->nlayers; i += step)
        if (strcmp(m->layers[i]->ops->kind, kind) == 0) return i;
    return -1;
}

gp_status gp_model_tie_embeddings(gp_model *m) {
    if (!m) return gp_error(GP_INVALID_ARGUMENT, "gp_model_tie_embeddings: model is NULL");
    const int e = find_kind(m, "embedding", 0, 1), h = find_kind(m, "linear", m->nlayers - 1, -1);
    if (e < 0 || h < 0 || h < e)
        return gp_error(GP_CONFIG, "tie_embeddings: the model needs an embedding layer and a "
                                   "linear layer after it (found embedding at %d, last linear at "
                                   "%d)",
                        e, h);
    gp_status s = gp_model_tie(m, e, 0, h, 0);
    return s == GP_OK ? GP_OK
                      : gp_error_context(s, "tie_embeddings: the embedding's table (layer %d) "
                                            "and the last linear layer's weight (layer %d, "
                                            "(out_features, in_features))",
                                         e, h);
}
