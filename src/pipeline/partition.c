/* The memory model of a cell and the exact balanced partitioner: a dynamic program over suffixes
 * (fewest cells for the rest of the layers) that minimizes the slowest cell under a per-device
 * byte limit and breaks ties towards the lexicographically smallest boundaries. */
#include "pipeline/partition.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "layers/layer.h"

/* Here rather than in plan.c: the partitioner's messages name the mode, and plan.c calls into
 * this file. */
const char *gp_remat_name(gp_remat r) {
    return r == GP_REMAT_CELL        ? "cell"
           : r == GP_REMAT_NONE      ? "none"
           : r == GP_REMAT_SELECTIVE ? "selective"
           : r == GP_REMAT_HELD      ? "held to the weight part"
                                     : "?";
}

double gp_layer_est_time(const gp_layer_est *l) { return l->fwd_time + l->bwd_time; }

static uint64_t sat_add(uint64_t a, uint64_t b) { return a > UINT64_MAX - b ? UINT64_MAX : a + b; }
static uint64_t sat_mul(uint64_t a, uint64_t b) {
    return (a != 0 && b > UINT64_MAX / a) ? UINT64_MAX : a * b;
}

char *gp_plan_bytes_str(uint64_t nbytes, char *buf, size_t n) {
    static const char *const units[] = {"KiB", "MiB", "GiB", "TiB"};
    if (nbytes < 1024) {
        snprintf(buf, n, "%llu bytes", (unsigned long long)nbytes);
        return buf;
    }
    int u = 0;
    uint64_t div = 1024;
    while (u < 3 && nbytes >= div * 1024) div *= 1024, u++;
    if (nbytes % div == 0)
        snprintf(buf, n, "%llu %s", (unsigned long long)(nbytes / div), units[u]);
    else
        snprintf(buf, n, "%.2f %s", (double)nbytes / (double)div, units[u]);
    return buf;
}

/* ------------------------------------------------------------ memory model */

/* The model grows a cell one layer at a time in O(1) (cell_acc below, which the partitioner uses):
 * base = head(first) + sum over its layers of per_layer(l), plus the backward's transient peak
 * and the messages; gp_cell_memory spells out the same terms by category. Keep them together. */
static uint64_t mem_state(const gp_layer_est *l) { return sat_add(l->out_bytes, l->saved_bytes); }

/* HELD: in_flight micro-batches between forward and input part and as many between input and
 * weight part, each holding its input. */
static uint64_t mem_head(const gp_layer_est *first, int in_flight, gp_remat remat) {
    const uint64_t n = (uint64_t)in_flight * (remat == GP_REMAT_HELD ? 2 : 1);
    return sat_mul(n, first->in_bytes);
}

static uint64_t mem_per_layer(const gp_layer_est *l, int in_flight, gp_remat remat) {
    uint64_t s = sat_add(sat_add(l->param_bytes, l->grad_bytes), l->optim_bytes);
    if (remat == GP_REMAT_HELD)
        return sat_add(s, sat_mul((uint64_t)in_flight, sat_add(mem_state(l), l->keep_bytes)));
    /* NONE keeps every micro-batch's state; CELL rebuilds one micro-batch's during backward. */
    uint64_t w = remat == GP_REMAT_NONE ? (uint64_t)in_flight : 1;
    return sat_add(s, sat_mul(w, mem_state(l)));
}

/* The backward's transient bytes, grown one layer at a time. Backward through layer i of a
 * cell holds, beside the state of layers first..i (those above are released by then), the
 * gradients of layer i's output and input and its workspace: g_i = out + in + ws (no input
 * gradient for the model's first layer); and for the whole backward the cell's output gradient
 * D = out[last] and its input gradient X = in[first] (first > 0), which are layer last's output
 * and layer first's input gradients themselves. So with above_i the state of layers i+1..last:
 *   peak_i = g_i - above_i + (i < last ? D : 0) + (i > first ? X : 0).
 * Signed, clamped to 2^60: the differences may be negative; a model near 2^60 bytes is not
 * planned here (the other terms saturate and say so). */
#define TRANSIENT_CAP ((int64_t)1 << 60)
static int64_t clamp_bytes(uint64_t b) { return b > (uint64_t)TRANSIENT_CAP ? TRANSIENT_CAP : (int64_t)b; }

typedef struct transient_acc {
    int first, last;         /* layers so far, first..last (last < first: none) */
    bool held;               /* HELD: the state above i is not released (above_i = 0) */
    int64_t g_last;          /* g of layer last */
    int64_t m_first;         /* g_first - above_first */
    int64_t m_mid;           /* max over first < i < last of g_i - above_i */
    bool has_mid;
    int64_t d, x;            /* D and X */
} transient_acc;

static int64_t mem_g(const gp_layer_est *l, int i, int first) {
    const uint64_t dx = (i > first || first > 0) ? l->in_bytes : 0;
    return clamp_bytes(l->out_bytes) + clamp_bytes(dx) + clamp_bytes(l->ws_bytes);
}

static transient_acc transient_start(const gp_layer_est *ly, int first, gp_remat remat) {
    return (transient_acc){.first = first, .last = first - 1, .held = remat == GP_REMAT_HELD,
                           .x = first > 0 ? clamp_bytes(ly[first].in_bytes) : 0};
}

static void transient_grow(transient_acc *t, const gp_layer_est *l) {
    const int i = t->last + 1;
    const int64_t state = t->held ? 0 : clamp_bytes(mem_state(l)), g = mem_g(l, i, t->first);
    if (i == t->first) {
        t->m_first = g;
    } else {
        t->m_first -= state;
        if (t->has_mid) t->m_mid -= state;
        if (t->last > t->first) { /* the previous last joins the middle */
            const int64_t prev = t->g_last - state;
            if (!t->has_mid || prev > t->m_mid) t->m_mid = prev;
            t->has_mid = true;
        }
    }
    t->g_last = g;
    t->last = i;
    t->d = clamp_bytes(l->out_bytes);
}

static uint64_t transient_bytes(const transient_acc *t) {
    if (t->last < t->first) return 0;
    if (t->last == t->first) return (uint64_t)t->g_last;
    int64_t v = t->g_last + t->x;
    if (t->m_first + t->d > v) v = t->m_first + t->d;
    if (t->has_mid && t->m_mid + t->d + t->x > v) v = t->m_mid + t->d + t->x;
    return v > 0 ? (uint64_t)v : 0;
}

/* Sent messages a sender holds until it reclaims them (GP_MAILBOX_CAPACITY per link): outputs to
 * the next stage unless the cell ends the model, input gradients to the previous one unless it
 * starts it. */
static uint64_t mem_messages(const gp_layer_est *ly, int first, int end, int nlayers) {
    uint64_t m = 0;
    if (end < nlayers) m = sat_mul(GP_MAILBOX_CAPACITY, ly[end - 1].out_bytes);
    if (first > 0) m = sat_add(m, sat_mul(GP_MAILBOX_CAPACITY, ly[first].in_bytes));
    return m;
}

/* A cell [first, end) grown one layer at a time. Only the base never shrinks as the cell grows
 * (the transient may: a layer with a smaller output gradient on top), so a partitioner may stop
 * growing a cell once its base is over the limit; the total adds the transient and the
 * messages. */
typedef struct cell_acc {
    const gp_layer_est *ly;
    int end, in_flight;
    gp_remat remat;
    uint64_t base;
    transient_acc t;
} cell_acc;

static cell_acc acc_start(const gp_layer_est *ly, int first, int in_flight, gp_remat remat) {
    return (cell_acc){.ly = ly, .end = first, .in_flight = in_flight, .remat = remat,
                      .base = mem_head(&ly[first], in_flight, remat),
                      .t = transient_start(ly, first, remat)};
}

static void acc_grow(cell_acc *a) {
    const gp_layer_est *l = &a->ly[a->end];
    a->base = sat_add(a->base, mem_per_layer(l, a->in_flight, a->remat));
    transient_grow(&a->t, l);
    a->end++;
}

static uint64_t acc_total(const cell_acc *a, int nlayers) {
    return sat_add(sat_add(a->base, transient_bytes(&a->t)),
                   mem_messages(a->ly, a->t.first, a->end, nlayers));
}

/* A candidate cell under a request's remat mode, grown one layer at a time: its time and, for
 * SELECTIVE, both ways of keeping its activations, to take NONE (no recomputation) whenever it
 * fits and CELL otherwise. A recomputing cell's time counts its second forward, so the balance
 * sees what the recomputation costs; CELL and NONE modes balance forward + backward as before
 * (every cell pays alike). */
typedef struct cell_fit {
    gp_remat mode;
    cell_acc a;    /* the mode's memory (SELECTIVE: CELL's, the smaller) */
    cell_acc none; /* SELECTIVE only: NONE's */
    double t, f;   /* forward + backward, and forward alone, summed left to right */
} cell_fit;

static cell_fit fit_start(const gp_layer_est *ly, int first, int in_flight, gp_remat mode) {
    const bool sel = mode == GP_REMAT_SELECTIVE;
    return (cell_fit){.mode = mode, .a = acc_start(ly, first, in_flight, sel ? GP_REMAT_CELL : mode),
                      .none = acc_start(ly, first, in_flight, GP_REMAT_NONE)};
}

static void fit_grow(cell_fit *x) {
    const gp_layer_est *l = &x->a.ly[x->a.end];
    x->t += gp_layer_est_time(l);
    x->f += l->fwd_time;
    acc_grow(&x->a);
    if (x->mode == GP_REMAT_SELECTIVE) acc_grow(&x->none);
}

/* Once over the limit, every larger cell is too: the base never shrinks (and SELECTIVE's CELL
 * base is the smaller of its two: one micro-batch's state against in_flight of them). */
static bool fit_hopeless(const cell_fit *x, uint64_t limit) { return x->a.base > limit; }

/* The cell's time under the limit and the mode it takes (*how), or INFINITY when it fits no
 * way the mode allows. */
static double fit_cost(const cell_fit *x, int nlayers, uint64_t limit, gp_remat *how) {
    const bool sel = x->mode == GP_REMAT_SELECTIVE;
    if (sel && acc_total(&x->none, nlayers) <= limit) {
        *how = GP_REMAT_NONE;
        return x->t;
    }
    if (acc_total(&x->a, nlayers) <= limit) {
        *how = sel ? GP_REMAT_CELL : x->mode;
        return sel ? x->t + x->f : x->t;
    }
    return INFINITY;
}

gp_cell_mem gp_cell_memory(const gp_layer_est *layers, int first, int end, int nlayers,
                           int in_flight, gp_remat remat) {
    gp_cell_mem c = {0};
    if (!layers || first < 0 || end <= first || end > nlayers) return c;
    if (in_flight < 0) in_flight = 0;
    uint64_t state = 0, keep = 0;
    transient_acc t = transient_start(layers, first, remat);
    for (int i = first; i < end; i++) {
        c.params = sat_add(c.params, layers[i].param_bytes);
        c.grads = sat_add(c.grads, layers[i].grad_bytes);
        c.optim = sat_add(c.optim, layers[i].optim_bytes);
        state = sat_add(state, mem_state(&layers[i]));
        keep = sat_add(keep, layers[i].keep_bytes);
        transient_grow(&t, &layers[i]);
    }
    c.transient = transient_bytes(&t);
    c.stash = mem_head(&layers[first], in_flight, remat);
    if (remat == GP_REMAT_HELD)
        c.stash = sat_add(c.stash, sat_mul((uint64_t)in_flight, sat_add(state, keep)));
    else if (remat == GP_REMAT_NONE)
        c.stash = sat_add(c.stash, sat_mul((uint64_t)in_flight, state));
    else
        c.work = state;
    c.messages = mem_messages(layers, first, end, nlayers);
    c.total = sat_add(sat_add(sat_add(c.params, c.grads), sat_add(c.optim, c.stash)), c.work);
    c.total = sat_add(c.total, sat_add(c.transient, c.messages));
    return c;
}

double gp_cell_time(const gp_layer_est *layers, int first, int end) {
    double t = 0;
    for (int i = first; i < end; i++) t += gp_layer_est_time(&layers[i]);
    return t;
}

/* ------------------------------------------------------------ per-layer figures */

gp_status gp_layer_est_from_model(const gp_model *m, int64_t micro_batch_size, int optim_states,
                                  gp_device *dev, gp_layer_est *out) {
    if (!m || !out) return gp_error(GP_INVALID_ARGUMENT, "gp_layer_est_from_model: NULL argument");
    if (micro_batch_size < 1)
        return gp_error(GP_INVALID_ARGUMENT,
                        "gp_layer_est_from_model: micro-batch size %lld must be >= 1",
                        (long long)micro_batch_size);
    if (optim_states < 0 || optim_states > 2)
        return gp_error(GP_INVALID_ARGUMENT,
                        "gp_layer_est_from_model: optimizer states per parameter must be 0 (SGD), "
                        "1 (momentum) or 2 (AdamW), got %d",
                        optim_states);
    int L = gp_model_nlayers(m);
    for (int i = 0; i < L; i++) {
        gp_cost c;
        gp_shape in;
        GP_TRY(gp_model_cost(m, i, micro_batch_size, &c));
        GP_TRY(gp_model_shape(m, i - 1, micro_batch_size, &in));
        /* gp_model_layer takes a mutable model; only the declared parameter shapes are read. */
        const gp_layer *l = gp_model_layer((gp_model *)m, i);
        gp_layer_est *e = &out[i];
        memset(e, 0, sizeof *e);
        e->kind = gp_layer_kind(l);
        e->fwd_time = c.fwd_flops;
        e->bwd_time = c.bwd_flops;
        e->wgt_time = c.wgt_flops;
        for (int j = 0; j < l->nparams; j++) {
            uint64_t nb = (uint64_t)gp_shape_nelem(&l->params[j].shape) * gp_dtype_nbytes(GP_F32);
            e->param_bytes += nb;
            if (l->params[j].trainable) {
                e->grad_bytes += nb;
                e->optim_bytes += (uint64_t)optim_states * nb;
            }
        }
        gp_dtype dt = i == 0 ? gp_model_input_dtype(m) : GP_F32;
        e->in_bytes = (uint64_t)gp_shape_nelem(&in) * gp_dtype_nbytes(dt);
        e->out_bytes = c.out_bytes;
        /* a weight part reads its layer's input, saved state and output gradient */
        e->keep_bytes = gp_layer_splits_backward(l)
                            ? e->in_bytes + c.saved_bytes + c.out_bytes + c.wgt_keep_bytes
                            : 0;
        e->saved_bytes = c.saved_bytes;
        e->tp_fwd_bytes = c.tp_fwd_bytes;
        e->tp_bwd_bytes = c.tp_bwd_bytes;
        /* the model's first layer never computes an input gradient */
        if (dev && l->ops->workspace_bytes)
            e->ws_bytes = l->ops->workspace_bytes(l, dev, &in, i > 0);
    }
    return GP_OK;
}

/* ------------------------------------------------------------ partitioner */

static gp_status check_req(const gp_partition_req *r) {
    if (!r || !r->layers) return gp_error(GP_INVALID_ARGUMENT, "partition: NULL argument");
    if (r->nlayers < 1)
        return gp_error(GP_INVALID_ARGUMENT, "partition: the model has no layers");
    if (r->stages < 1)
        return gp_error(GP_INVALID_ARGUMENT, "partition: K = %d stages, expected at least 1",
                        r->stages);
    if (r->stages > r->nlayers)
        return gp_error(GP_INVALID_ARGUMENT,
                        "partition: K = %d stages but the model has %d layer%s (each stage needs "
                        "at least one)",
                        r->stages, r->nlayers, r->nlayers == 1 ? "" : "s");
    if (r->micro_batches < 1)
        return gp_error(GP_INVALID_ARGUMENT, "partition: M = %d micro-batches, expected >= 1",
                        r->micro_batches);
    if (r->remat != GP_REMAT_CELL && r->remat != GP_REMAT_NONE &&
        r->remat != GP_REMAT_SELECTIVE && r->remat != GP_REMAT_HELD)
        return gp_error(GP_INVALID_ARGUMENT,
                        "partition: unknown remat mode %d (expected %d cell, %d none or %d "
                        "selective)",
                        (int)r->remat, GP_REMAT_CELL, GP_REMAT_NONE, GP_REMAT_SELECTIVE);
    for (int i = 0; i < r->nlayers; i++) {
        double t = gp_layer_est_time(&r->layers[i]);
        if (!isfinite(t) || r->layers[i].fwd_time < 0 || r->layers[i].bwd_time < 0)
            return gp_error(GP_INVALID_ARGUMENT,
                            "partition: layer %d has time estimates fwd %g, bwd %g; expected "
                            "finite values >= 0",
                            i, r->layers[i].fwd_time, r->layers[i].bwd_time);
    }
    return GP_OK;
}

static const char *kind_of(const gp_layer_est *l) { return l->kind ? l->kind : "layer"; }

/* Micro-batches stage k stashes at most under the request. */
static int stage_in_flight(const gp_partition_req *r, int k) {
    return r->tapered && r->stages - k < r->micro_batches ? r->stages - k : r->micro_batches;
}

/* When no partition fits the limit: the error names the layer that alone cannot fit, or else the
 * partition needing the least memory in its largest cell (a min-max DP on bytes) and by how much
 * that cell is over. */
static gp_status explain_no_fit(const gp_partition_req *req) {
    /* SELECTIVE fits wherever CELL does: the explanation is CELL's. */
    gp_partition_req loosest = *req;
    if (loosest.remat == GP_REMAT_SELECTIVE) loosest.remat = GP_REMAT_CELL;
    const gp_partition_req *r = &loosest;
    const gp_layer_est *ly = r->layers;
    int L = r->nlayers, K = r->stages, M = r->micro_batches;
    char need[48], lim[48], over[48];
    gp_plan_bytes_str(r->mem_limit, lim, sizeof lim);
    /* A layer that fits in no cell at all. The smallest cell holding layer i
     * ends at i, but need not start there: a cell stashes only its first
     * input, so an earlier start can be smaller than the layer alone. (Tapered: on the latest
     * stage it can be on, the one that stashes the fewest micro-batches.) */
    for (int i = 0; i < L; i++) {
        uint64_t b = UINT64_MAX;
        int from = i;
        M = stage_in_flight(r, i < K - 1 ? i : K - 1);
        for (int j = i; j >= 0; j--) {
            uint64_t bj = gp_cell_memory(ly, j, i + 1, L, M, r->remat).total;
            if (bj < b) b = bj, from = j;
        }
        if (b <= r->mem_limit) continue;
        if (from == i)
            return gp_error(GP_MEMORY_LIMIT,
                            "partition: layer %d (%s) alone needs %s with M = %d (remat %s), over "
                            "the %s per-device limit by %s",
                            i, kind_of(&ly[i]), gp_plan_bytes_str(b, need, sizeof need), M,
                            gp_remat_name(r->remat), lim,
                            gp_plan_bytes_str(b - r->mem_limit, over, sizeof over));
        return gp_error(GP_MEMORY_LIMIT,
                        "partition: layer %d (%s) fits in no cell: the smallest cell holding it "
                        "(layers %d-%d) needs %s with M = %d (remat %s), over the %s per-device "
                        "limit by %s",
                        i, kind_of(&ly[i]), from, i, gp_plan_bytes_str(b, need, sizeof need), M,
                        gp_remat_name(r->remat), lim,
                        gp_plan_bytes_str(b - r->mem_limit, over, sizeof over));
    }
    size_t w = (size_t)L + 1;
    uint64_t *suf = malloc((size_t)(K + 1) * w * sizeof *suf);
    if (!suf) return gp_error(GP_OUT_OF_MEMORY, "partition: no memory for the DP table");
    for (size_t x = 0; x < (size_t)(K + 1) * w; x++) suf[x] = UINT64_MAX;
    suf[0 * w + (size_t)L] = 0;
    for (int c = 1; c <= K; c++)
        for (int j = 0; j <= L - c; j++) {
            cell_acc a = acc_start(ly, j, stage_in_flight(r, K - c), r->remat);
            uint64_t best = UINT64_MAX;
            for (int i = j + 1; i <= L - c + 1; i++) {
                acc_grow(&a);
                const uint64_t acc = acc_total(&a, L), rest = suf[(size_t)(c - 1) * w + (size_t)i];
                uint64_t v = acc > rest ? acc : rest;
                if (v < best) best = v;
            }
            suf[(size_t)c * w + (size_t)j] = best;
        }
    uint64_t opt = suf[(size_t)K * w];
    /* Walk the lexicographically smallest partition achieving opt; report its first worst cell. */
    int j = 0, wf = -1, we = L, wm = r->micro_batches;
    char list[256];
    size_t len = 0;
    list[0] = '\0';
    for (int c = K; c >= 1; c--) {
        int e = L;
        M = stage_in_flight(r, K - c);
        if (c > 1) {
            cell_acc a = acc_start(ly, j, M, r->remat);
            for (int i = j + 1; i <= L - c + 1; i++) {
                acc_grow(&a);
                const uint64_t acc = acc_total(&a, L), rest = suf[(size_t)(c - 1) * w + (size_t)i];
                if ((acc > rest ? acc : rest) <= opt) {
                    e = i;
                    break;
                }
            }
        }
        if (len < sizeof list)
            len += (size_t)snprintf(list + len, sizeof list - len, "%s%d", c == K ? "" : ",", j);
        if (wf < 0 && gp_cell_memory(ly, j, e, L, M, r->remat).total == opt) wf = j, we = e, wm = M;
        j = e;
    }
    free(suf);
    GP_ASSERT(wf >= 0);
    return gp_error(GP_MEMORY_LIMIT,
                    "partition: no split of the %d layers into K = %d cells fits the %s "
                    "per-device limit with M = %d (remat %s): the best split (%s) still needs %s "
                    "in its cell of layers %d-%d, over the limit by %s",
                    L, K, lim, wm, gp_remat_name(r->remat), list,
                    gp_plan_bytes_str(opt, need, sizeof need), wf, we - 1,
                    gp_plan_bytes_str(opt - r->mem_limit, over, sizeof over));
}

gp_status gp_partition_balance(const gp_partition_req *r, int *first, double *bottleneck) {
    GP_TRY(check_req(r));
    if (!first) return gp_error(GP_INVALID_ARGUMENT, "partition: NULL output");
    const gp_layer_est *ly = r->layers;
    int L = r->nlayers, K = r->stages;
    size_t w = (size_t)L + 1;
    /* suf[c][j]: the least possible slowest-cell time splitting layers [j, L) into c cells that
     * each fit the limit (INFINITY when none). Cell times are summed left to right, exactly as
     * gp_cell_time does, so comparisons below are between identical doubles. */
    double *suf = malloc((size_t)(K + 1) * w * sizeof *suf);
    if (!suf) return gp_error(GP_OUT_OF_MEMORY, "partition: no memory for the DP table");
    for (size_t x = 0; x < (size_t)(K + 1) * w; x++) suf[x] = INFINITY;
    suf[(size_t)L] = 0;
    uint64_t limit = r->mem_limit ? r->mem_limit : UINT64_MAX;
    for (int c = 1; c <= K; c++)
        for (int j = 0; j <= L - c; j++) {
            double best = INFINITY;
            cell_fit x = fit_start(ly, j, stage_in_flight(r, K - c), r->remat);
            for (int i = j + 1; i <= L - c + 1; i++) {
                fit_grow(&x);
                if (fit_hopeless(&x, limit)) break;
                gp_remat how;
                const double t = fit_cost(&x, L, limit, &how);
                if (isinf(t)) continue;
                double rest = suf[(size_t)(c - 1) * w + (size_t)i];
                double v = t > rest ? t : rest;
                if (v < best) best = v;
            }
            suf[(size_t)c * w + (size_t)j] = best;
        }
    double opt = suf[(size_t)K * w];
    if (isinf(opt)) {
        free(suf);
        return explain_no_fit(r);
    }
    /* Smallest next boundary that still allows an optimal completion, cell by cell. */
    int j = 0;
    for (int c = K; c >= 1; c--) {
        first[K - c] = j;
        cell_fit x = fit_start(ly, j, stage_in_flight(r, K - c), r->remat);
        int e = -1;
        gp_remat how = r->remat;
        for (int i = j + 1; i <= L - c + 1; i++) {
            fit_grow(&x);
            if (fit_hopeless(&x, limit)) break;
            const double t = fit_cost(&x, L, limit, &how);
            if (isinf(t)) continue;
            double rest = suf[(size_t)(c - 1) * w + (size_t)i];
            if ((t > rest ? t : rest) <= opt && (c > 1 || i == L)) {
                e = i;
                break;
            }
        }
        GP_ASSERT(e > j);
        if (r->cell_remat) r->cell_remat[K - c] = how;
        j = e;
    }
    free(suf);
    if (bottleneck) *bottleneck = opt;
    return GP_OK;
}

gp_status gp_partition_check(const gp_partition_req *r, const int *first, int nfirst) {
    GP_TRY(check_req(r));
    int L = r->nlayers, K = r->stages;
    if (!first) return gp_error(GP_INVALID_ARGUMENT, "partition: NULL list");
    if (nfirst != K)
        return gp_error(GP_INVALID_ARGUMENT,
                        "partition: %d entr%s given for K = %d stages; expected exactly K (the "
                        "first layer of each cell)",
                        nfirst, nfirst == 1 ? "y" : "ies", K);
    if (first[0] != 0)
        return gp_error(GP_INVALID_ARGUMENT,
                        "partition: the first cell starts at layer %d; expected 0", first[0]);
    for (int k = 1; k < K; k++) {
        if (first[k] <= first[k - 1])
            return gp_error(GP_INVALID_ARGUMENT,
                            "partition: entry %d (layer %d) is not after entry %d (layer %d); "
                            "first layers must strictly increase",
                            k, first[k], k - 1, first[k - 1]);
        if (first[k] >= L)
            return gp_error(GP_INVALID_ARGUMENT,
                            "partition: entry %d is layer %d but the model has %d layers (0..%d)",
                            k, first[k], L, L - 1);
    }
    const uint64_t limit = r->mem_limit ? r->mem_limit : UINT64_MAX;
    for (int k = 0; k < K; k++) {
        int e = k + 1 < K ? first[k + 1] : L;
        gp_remat how = r->remat;
        const int in_flight = stage_in_flight(r, k);
        if (how == GP_REMAT_SELECTIVE)
            how = gp_cell_memory(r->layers, first[k], e, L, in_flight, GP_REMAT_NONE).total <= limit
                      ? GP_REMAT_NONE
                      : GP_REMAT_CELL;
        if (r->cell_remat) r->cell_remat[k] = how;
        uint64_t b = gp_cell_memory(r->layers, first[k], e, L, in_flight, how).total;
        if (b > limit) {
            char need[48], lim[48], over[48];
            return gp_error(GP_MEMORY_LIMIT,
                            "partition: cell %d (layers %d-%d) needs %s with M = %d (remat %s), "
                            "over the %s per-device limit by %s",
                            k, first[k], e - 1, gp_plan_bytes_str(b, need, sizeof need),
                            in_flight, gp_remat_name(how),
                            gp_plan_bytes_str(r->mem_limit, lim, sizeof lim),
                            gp_plan_bytes_str(b - r->mem_limit, over, sizeof over));
        }
    }
    return GP_OK;
}

