/* The memory model of a cell at the points of its schedule's profile, and the exact balanced
 * partitioner: a dynamic program over suffixes (fewest cells for the rest of the layers) that
 * minimizes the slowest cell under a per-device byte limit and breaks ties towards the
 * lexicographically smallest boundaries. */
#include "plan/partition.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "layers/layer.h"
#include "model/skips.h"
#include "plan/schedule.h"

/* Here rather than in plan.c: the partitioner's messages name the mode, and plan.c calls into
 * this file. */
const char *gp_remat_name(gp_remat r) {
    return r == GP_REMAT_CELL        ? "cell"
           : r == GP_REMAT_NONE      ? "none"
           : r == GP_REMAT_SELECTIVE ? "selective"
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

/* A cell's bytes grow one layer at a time in O(points) (cell_acc below, which the partitioner
 * uses): the static bytes, state and keep_bytes summed, the largest point of the profile over
 * them, the backward's transient peak and the messages; gp_cell_memory_at spells out the same
 * terms by category. Keep them together. */
static uint64_t mem_state(const gp_layer_est *l) { return sat_add(l->out_bytes, l->saved_bytes); }

/* The activations at one point (partition.h): *stash, and *work, the state rebuilt for the
 * running backward (CELL); returns their sum. */
static uint64_t act_at(const gp_stash_point *p, uint64_t in, uint64_t state, uint64_t keep,
                       gp_remat remat, uint64_t *stash, uint64_t *work) {
    const uint64_t held = (uint64_t)p->fwd + (uint64_t)p->wgt;
    *stash = sat_add(sat_mul(held, in), sat_mul((uint64_t)p->keep, keep));
    if (remat == GP_REMAT_NONE) *stash = sat_add(*stash, sat_mul((uint64_t)p->fwd, state));
    *work = remat == GP_REMAT_CELL ? sat_mul((uint64_t)p->bwd, state) : 0;
    return sat_add(*stash, *work);
}

/* The profile's largest activations: their sum, split into *stash and *work; *at: the point
 * (-1 for a profile of none). The first of equal points. */
static uint64_t act_max(const gp_stash_profile *pr, uint64_t in, uint64_t state, uint64_t keep,
                        gp_remat remat, uint64_t *stash, uint64_t *work, int *at) {
    uint64_t best = 0, s, w;
    *stash = *work = 0;
    *at = -1;
    for (int i = 0; i < pr->n; i++) {
        const uint64_t v = act_at(&pr->pt[i], in, state, keep, remat, &s, &w);
        if (*at < 0 || v > best) best = v, *stash = s, *work = w, *at = i;
    }
    return best;
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
    bool held;               /* split: the state above i is not released (above_i = 0) */
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

static transient_acc transient_start(const gp_layer_est *ly, int first, bool split) {
    return (transient_acc){.first = first, .last = first - 1, .held = split,
                           .x = first > 0 ? clamp_bytes(gp_cut_bytes(ly, first)) : 0};
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

/* d_skips: the skip gradients that arrive with the cell's output gradient (its end cut's). */
static uint64_t transient_bytes(const transient_acc *t, uint64_t d_skips) {
    if (t->last < t->first) return 0;
    const int64_t d = t->d + clamp_bytes(d_skips); /* both at most 2^60 */
    if (t->last == t->first) return (uint64_t)t->g_last;
    int64_t v = t->g_last + t->x;
    if (t->m_first + d > v) v = t->m_first + d;
    if (t->has_mid && t->m_mid + d + t->x > v) v = t->m_mid + d + t->x;
    return v > 0 ? (uint64_t)v : 0;
}

/* Sent messages a sender holds until it reclaims them (GP_MAILBOX_CAPACITY per link): outputs to
 * the next stage unless the cell ends the model, input gradients to the previous one unless it
 * starts it. */
static uint64_t mem_messages(const gp_layer_est *ly, int first, int end, int nlayers) {
    uint64_t m = 0;
    if (end < nlayers) m = sat_mul(GP_MAILBOX_CAPACITY, gp_cut_out_bytes(ly, end));
    if (first > 0) m = sat_add(m, sat_mul(GP_MAILBOX_CAPACITY, gp_cut_bytes(ly, first)));
    return m;
}

/* A cell [first, end) grown one layer at a time at the points of its profile. Only its base (the
 * static bytes and the activations) never shrinks as the cell grows (the transient may: a layer
 * with a smaller output gradient on top), so a partitioner may stop growing a cell once its base
 * is over the limit; the total adds the transient and the messages. */
typedef struct cell_acc {
    const gp_layer_est *ly;
    const gp_stash_profile *prof;
    int end;
    uint64_t stat, state, keep; /* static bytes, state and keep_bytes of the layers so far */
    transient_acc t;
} cell_acc;

static cell_acc acc_start(const gp_layer_est *ly, int first, const gp_stash_profile *prof,
                          bool split) {
    return (cell_acc){.ly = ly, .prof = prof, .end = first,
                      .t = transient_start(ly, first, split)};
}

static void acc_grow(cell_acc *a) {
    const gp_layer_est *l = &a->ly[a->end];
    const uint64_t grads =
        sat_add(l->grad_bytes, sat_mul((uint64_t)a->prof->grad_bufs, l->grad_bytes));
    a->stat = sat_add(a->stat, sat_add(sat_add(l->param_bytes, grads), l->optim_bytes));
    a->state = sat_add(a->state, mem_state(l));
    a->keep = sat_add(a->keep, l->keep_bytes);
    transient_grow(&a->t, l);
    a->end++;
}

/* The activations at the profile's largest point; *at: which point. */
static uint64_t acc_act(const cell_acc *a, gp_remat remat, int *at) {
    uint64_t stash, work;
    return act_max(a->prof, gp_cut_bytes(a->ly, a->t.first), a->state, a->keep, remat, &stash, &work,
                   at);
}

static uint64_t acc_base(const cell_acc *a, gp_remat remat) {
    int at;
    return sat_add(a->stat, acc_act(a, remat, &at));
}

static uint64_t acc_total(const cell_acc *a, int nlayers, gp_remat remat) {
    const uint64_t d_skips = a->end < nlayers ? a->ly[a->end].skip_bytes : 0;
    return sat_add(sat_add(acc_base(a, remat), transient_bytes(&a->t, d_skips)),
                   mem_messages(a->ly, a->t.first, a->end, nlayers));
}

/* A candidate cell under a request's remat mode, grown one layer at a time: its time and memory,
 * and for SELECTIVE both ways of keeping its activations, to take NONE (no recomputation)
 * whenever it fits and CELL otherwise. A recomputing cell's time counts its second forward, so
 * the balance sees what the recomputation costs; CELL and NONE modes balance forward + backward
 * as before (every cell pays alike). */
typedef struct cell_fit {
    gp_remat mode;
    cell_acc a;
    double t, f; /* forward + backward, and forward alone, summed left to right */
} cell_fit;

static cell_fit fit_start(const gp_layer_est *ly, int first, const gp_stash_profile *prof,
                          bool split, gp_remat mode) {
    return (cell_fit){.mode = mode, .a = acc_start(ly, first, prof, split)};
}

static void fit_grow(cell_fit *x) {
    const gp_layer_est *l = &x->a.ly[x->a.end];
    x->t += gp_layer_est_time(l);
    x->f += l->fwd_time;
    acc_grow(&x->a);
}

/* The mode whose memory decides whether a cell can fit: SELECTIVE's CELL, the smaller of its
 * two (a point's running backward is among its stashed micro-batches: bwd <= fwd). */
static gp_remat leanest(gp_remat mode) {
    return mode == GP_REMAT_SELECTIVE ? GP_REMAT_CELL : mode;
}

/* Once over the limit, every larger cell is too: the base never shrinks. */
static bool fit_hopeless(const cell_fit *x, uint64_t limit) {
    return acc_base(&x->a, leanest(x->mode)) > limit;
}

/* The cell's time under the limit and the mode it takes (*how), or INFINITY when it fits no
 * way the mode allows. */
static double fit_cost(const cell_fit *x, int nlayers, uint64_t limit, gp_remat *how) {
    const bool sel = x->mode == GP_REMAT_SELECTIVE;
    if (sel && acc_total(&x->a, nlayers, GP_REMAT_NONE) <= limit) {
        *how = GP_REMAT_NONE;
        return x->t;
    }
    if (acc_total(&x->a, nlayers, leanest(x->mode)) <= limit) {
        *how = leanest(x->mode);
        return sel ? x->t + x->f : x->t;
    }
    return INFINITY;
}

gp_cell_mem gp_cell_memory_at(const gp_layer_est *layers, int first, int end, int nlayers,
                              const gp_stash_profile *profile, gp_remat remat, bool split) {
    gp_cell_mem c = {0};
    if (!layers || !profile || first < 0 || end <= first || end > nlayers) return c;
    uint64_t state = 0, keep = 0;
    transient_acc t = transient_start(layers, first, split);
    for (int i = first; i < end; i++) {
        c.params = sat_add(c.params, layers[i].param_bytes);
        c.grads = sat_add(c.grads, layers[i].grad_bytes);
        c.optim = sat_add(c.optim, layers[i].optim_bytes);
        state = sat_add(state, mem_state(&layers[i]));
        keep = sat_add(keep, layers[i].keep_bytes);
        transient_grow(&t, &layers[i]);
    }
    c.grad_bufs = sat_mul((uint64_t)profile->grad_bufs, c.grads);
    c.grads = sat_add(c.grads, c.grad_bufs);
    int at;
    act_max(profile, gp_cut_bytes(layers, first), state, keep, remat, &c.stash, &c.work, &at);
    c.transient = transient_bytes(&t, end < nlayers ? layers[end].skip_bytes : 0);
    c.messages = mem_messages(layers, first, end, nlayers);
    c.total = sat_add(sat_add(sat_add(c.params, c.grads), sat_add(c.optim, c.stash)), c.work);
    c.total = sat_add(c.total, sat_add(c.transient, c.messages));
    return c;
}

gp_cell_mem gp_cell_memory(const gp_layer_est *layers, int first, int end, int nlayers,
                           int in_flight, gp_remat remat) {
    gp_stash_point p = {.fwd = in_flight > 0 ? in_flight : 0, .bwd = 1};
    const gp_stash_profile one = {.pt = &p, .n = 1, .cap = 1};
    return gp_cell_memory_at(layers, first, end, nlayers, &one, remat, false);
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
        e->param_bytes += gp_layer_bf16_copy_bytes(l, dev); /* a bf16 device's weight copy */
        /* what the layer keeps derived from its values through a training run */
        if (dev && l->ops->derived_bytes) e->param_bytes += l->ops->derived_bytes(l, dev, &in, i > 0);
        gp_dtype dt = i == 0 ? gp_model_input_dtype(m) : GP_F32;
        e->in_bytes = (uint64_t)gp_shape_nelem(&in) * gp_dtype_nbytes(dt);
        gp_shape cut;
        GP_TRY(gp_model_cut_shape(m, i, micro_batch_size, &cut));
        e->skip_bytes = gp_skips_across(m, i, NULL)
                            ? (uint64_t)gp_shape_nelem(&cut) * sizeof(float) - e->in_bytes
                            : 0;
        e->out_bytes = c.out_bytes;
        /* what the layer saves on the stage's device, where the device decides part of it */
        e->saved_bytes = dev && l->ops->saved_bytes ? l->ops->saved_bytes(l, dev, &in)
                                                    : c.saved_bytes;
        /* a weight part reads its layer's input, saved state and output gradient */
        e->keep_bytes = gp_layer_splits_backward(l)
                            ? e->in_bytes + e->saved_bytes + c.out_bytes + c.wgt_keep_bytes
                            : 0;
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
    if (r->remat != GP_REMAT_CELL && r->remat != GP_REMAT_NONE && r->remat != GP_REMAT_SELECTIVE)
        return gp_error(GP_INVALID_ARGUMENT,
                        "partition: unknown remat mode %d (expected %d cell, %d none or %d "
                        "selective)",
                        (int)r->remat, GP_REMAT_CELL, GP_REMAT_NONE, GP_REMAT_SELECTIVE);
    for (int k = 0; r->profile && k < r->stages; k++)
        for (int i = 0; i < r->profile[k].n; i++) {
            const gp_stash_point *p = &r->profile[k].pt[i];
            if (p->fwd < 0 || p->wgt < 0 || p->bwd < 0 || p->keep < 0)
                return gp_error(GP_INVALID_ARGUMENT,
                                "partition: cell %d's point %d holds %d, %d, %d and %d "
                                "micro-batches; expected counts >= 0",
                                k, i, p->fwd, p->wgt, p->bwd, p->keep);
        }
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

/* Micro-batches stage k stashes at most under a request without a profile. */
static int stage_in_flight(const gp_partition_req *r, int k) {
    return r->tapered && r->stages - k < r->micro_batches ? r->stages - k : r->micro_batches;
}

/* The request's profiles: its own, or one point per cell from micro_batches and tapered, in
 * *owned (the caller frees it). */
static gp_status req_profiles(const gp_partition_req *r, const gp_stash_profile **out,
                              gp_stash_profile **owned) {
    *owned = NULL;
    *out = r->profile;
    if (r->profile) return GP_OK;
    const int K = r->stages;
    gp_stash_profile *p = malloc((size_t)K * (sizeof *p + sizeof(gp_stash_point)));
    if (!p) return gp_error(GP_OUT_OF_MEMORY, "partition: no memory for %d cells", K);
    gp_stash_point *pt = (gp_stash_point *)(p + K);
    for (int k = 0; k < K; k++) {
        pt[k] = (gp_stash_point){.fwd = stage_in_flight(r, k), .bwd = 1};
        p[k] = (gp_stash_profile){.pt = &pt[k], .n = 1, .cap = 1};
    }
    *out = *owned = p;
    return GP_OK;
}

/* " with N micro-batches held at its peak (remat R)": the largest point of the cell
 * [first, end) on its profile. */
static const char *held_str(const gp_partition_req *r, const gp_stash_profile *prof, int first,
                            int end, gp_remat remat, char *buf, size_t n) {
    cell_acc a = acc_start(r->layers, first, prof, r->split);
    while (a.end < end) acc_grow(&a);
    int at;
    acc_act(&a, remat, &at);
    const long long held = at < 0 ? 0 : (long long)prof->pt[at].fwd + prof->pt[at].wgt;
    snprintf(buf, n, "with %lld micro-batch%s held at its peak (remat %s)", held,
             held == 1 ? "" : "es", gp_remat_name(remat));
    return buf;
}

/* When no partition fits the limit: the error names the layer that alone cannot fit, or else the
 * partition needing the least memory in its largest cell (a min-max DP on bytes) and by how much
 * that cell is over. SELECTIVE fits wherever CELL does: the explanation is CELL's. */
static gp_status explain_no_fit(const gp_partition_req *r, const gp_stash_profile *prof) {
    const gp_remat mode = leanest(r->remat);
    const gp_layer_est *ly = r->layers;
    const int L = r->nlayers, K = r->stages;
    char need[48], lim[48], over[48], held[96];
    gp_plan_bytes_str(r->mem_limit, lim, sizeof lim);
    /* A layer that fits in no cell at all. The smallest cell holding layer i ends at i, but need
     * not start there: a cell stashes only its first input, so an earlier start can be smaller
     * than the layer alone; and it may be any cell c that can hold layer i, c <= i <= L - K + c
     * (each cell at least one layer), on its profile. Among equals, the latest start. */
    uint64_t *least = malloc((size_t)L * sizeof *least);
    int *from = malloc(2 * (size_t)L * sizeof *from);
    if (!least || !from) {
        free(least);
        free(from);
        return gp_error(GP_OUT_OF_MEMORY, "partition: no memory to explain %d layers", L);
    }
    int *cell = from + L;
    for (int i = 0; i < L; i++) least[i] = UINT64_MAX, from[i] = i, cell[i] = 0;
    for (int c = 0; c < K; c++)
        for (int j = c; j <= L - K + c; j++) {
            cell_acc a = acc_start(ly, j, &prof[c], r->split);
            for (int i = j; i <= L - K + c; i++) {
                acc_grow(&a);
                const uint64_t b = acc_total(&a, L, mode);
                if (b <= least[i]) least[i] = b, from[i] = j, cell[i] = c;
            }
        }
    for (int i = 0; i < L; i++) {
        const uint64_t b = least[i];
        const int j = from[i], c = cell[i];
        if (b <= r->mem_limit) continue;
        free(least);
        free(from);
        held_str(r, &prof[c], j, i + 1, mode, held, sizeof held);
        if (j == i)
            return gp_error(GP_MEMORY_LIMIT,
                            "partition: layer %d (%s) alone needs %s %s, over the %s per-device "
                            "limit by %s",
                            i, kind_of(&ly[i]), gp_plan_bytes_str(b, need, sizeof need), held,
                            lim, gp_plan_bytes_str(b - r->mem_limit, over, sizeof over));
        return gp_error(GP_MEMORY_LIMIT,
                        "partition: layer %d (%s) fits in no cell: the smallest cell holding it "
                        "(layers %d-%d) needs %s %s, over the %s per-device limit by %s",
                        i, kind_of(&ly[i]), j, i, gp_plan_bytes_str(b, need, sizeof need), held,
                        lim, gp_plan_bytes_str(b - r->mem_limit, over, sizeof over));
    }
    free(least);
    free(from);
    size_t w = (size_t)L + 1;
    uint64_t *suf = malloc((size_t)(K + 1) * w * sizeof *suf);
    if (!suf) return gp_error(GP_OUT_OF_MEMORY, "partition: no memory for the DP table");
    for (size_t x = 0; x < (size_t)(K + 1) * w; x++) suf[x] = UINT64_MAX;
    suf[0 * w + (size_t)L] = 0;
    for (int c = 1; c <= K; c++)
        for (int j = 0; j <= L - c; j++) {
            cell_acc a = acc_start(ly, j, &prof[K - c], r->split);
            uint64_t best = UINT64_MAX;
            for (int i = j + 1; i <= L - c + 1; i++) {
                acc_grow(&a);
                const uint64_t acc = acc_total(&a, L, mode);
                const uint64_t rest = suf[(size_t)(c - 1) * w + (size_t)i];
                uint64_t v = acc > rest ? acc : rest;
                if (v < best) best = v;
            }
            suf[(size_t)c * w + (size_t)j] = best;
        }
    uint64_t opt = suf[(size_t)K * w];
    /* Walk the lexicographically smallest partition achieving opt; report its first worst cell
     * (one there is: the walk's cells are within opt, and no split does better). */
    int j = 0, wf = 0, we = L, wc = 0;
    bool found = false;
    char list[256];
    size_t len = 0;
    list[0] = '\0';
    for (int c = K; c >= 1; c--) {
        cell_acc a = acc_start(ly, j, &prof[K - c], r->split);
        int e = L;
        uint64_t bytes = 0;
        for (int i = j + 1; i <= L - c + 1; i++) {
            acc_grow(&a);
            bytes = acc_total(&a, L, mode);
            const uint64_t rest = suf[(size_t)(c - 1) * w + (size_t)i];
            if ((bytes > rest ? bytes : rest) <= opt && (c > 1 || i == L)) {
                e = i;
                break;
            }
        }
        if (len < sizeof list)
            len += (size_t)snprintf(list + len, sizeof list - len, "%s%d", c == K ? "" : ",", j);
        if (!found && bytes == opt) found = true, wf = j, we = e, wc = K - c;
        j = e;
    }
    free(suf);
    held_str(r, &prof[wc], wf, we, mode, held, sizeof held);
    return gp_error(GP_MEMORY_LIMIT,
                    "partition: no split of the %d layers into K = %d cells fits the %s "
                    "per-device limit: the best split (%s) still needs %s in its cell of layers "
                    "%d-%d, over the limit by %s, %s",
                    L, K, lim, list,
                    gp_plan_bytes_str(opt, need, sizeof need), wf, we - 1,
                    gp_plan_bytes_str(opt - r->mem_limit, over, sizeof over), held);
}

gp_status gp_partition_balance(const gp_partition_req *r, int *first, double *bottleneck) {
    GP_TRY(check_req(r));
    if (!first) return gp_error(GP_INVALID_ARGUMENT, "partition: NULL output");
    const gp_layer_est *ly = r->layers;
    int L = r->nlayers, K = r->stages;
    const gp_stash_profile *prof;
    gp_stash_profile *owned;
    GP_TRY(req_profiles(r, &prof, &owned));
    size_t w = (size_t)L + 1;
    /* suf[c][j]: the least possible slowest-cell time splitting layers [j, L) into c cells that
     * each fit the limit (INFINITY when none). Cell times are summed left to right, exactly as
     * gp_cell_time does, so comparisons below are between identical doubles. */
    double *suf = malloc((size_t)(K + 1) * w * sizeof *suf);
    if (!suf) {
        free(owned);
        return gp_error(GP_OUT_OF_MEMORY, "partition: no memory for the DP table");
    }
    for (size_t x = 0; x < (size_t)(K + 1) * w; x++) suf[x] = INFINITY;
    suf[(size_t)L] = 0;
    uint64_t limit = r->mem_limit ? r->mem_limit : UINT64_MAX;
    for (int c = 1; c <= K; c++)
        for (int j = 0; j <= L - c; j++) {
            double best = INFINITY;
            cell_fit x = fit_start(ly, j, &prof[K - c], r->split, r->remat);
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
        gp_status s = explain_no_fit(r, prof);
        free(owned);
        return s;
    }
    /* Smallest next boundary that still allows an optimal completion, cell by cell. */
    int j = 0;
    for (int c = K; c >= 1; c--) {
        first[K - c] = j;
        cell_fit x = fit_start(ly, j, &prof[K - c], r->split, r->remat);
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
    free(owned);
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
    const gp_stash_profile *prof;
    gp_stash_profile *owned;
    GP_TRY(req_profiles(r, &prof, &owned));
    const uint64_t limit = r->mem_limit ? r->mem_limit : UINT64_MAX;
    gp_status s = GP_OK;
    for (int k = 0; s == GP_OK && k < K; k++) {
        const int e = k + 1 < K ? first[k + 1] : L;
        cell_fit x = fit_start(r->layers, first[k], &prof[k], r->split, r->remat);
        while (x.a.end < e) fit_grow(&x);
        gp_remat how;
        if (!isinf(fit_cost(&x, L, limit, &how))) {
            if (r->cell_remat) r->cell_remat[k] = how;
            continue;
        }
        const uint64_t b = acc_total(&x.a, L, leanest(r->remat));
        char need[48], lim[48], over[48], held[96];
        s = gp_error(GP_MEMORY_LIMIT,
                     "partition: cell %d (layers %d-%d) needs %s %s, over the %s per-device "
                     "limit by %s",
                     k, first[k], e - 1, gp_plan_bytes_str(b, need, sizeof need),
                     held_str(r, &prof[k], first[k], e, leanest(r->remat), held, sizeof held),
                     gp_plan_bytes_str(r->mem_limit, lim, sizeof lim),
                     gp_plan_bytes_str(b - r->mem_limit, over, sizeof over));
    }
    free(owned);
    return s;
}
