/* The planner's search: every mesh of N devices (K stages x D replicas x the given T shards),
 * every number of micro-batches dividing a replica's batch, every schedule and remat mode,
 * each planned by gp_plan_make (the exact partitioner under the memory limit, then the schedule
 * simulator); the fastest that fit are kept in a deterministic order. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "plan/partition.h"

typedef struct candidate {
    int K, D, M, V;
    gp_schedule_kind schedule;
    gp_remat remat;
} candidate;

void gp_plan_search_free(gp_plan_search_result *r) {
    if (!r) return;
    for (int i = 0; i < r->n; i++) gp_plan_free(&r->plans[i]);
    free(r->plans);
    memset(r, 0, sizeof *r);
}

/* Whether a goes before b: the faster step; then the fewer micro-batches (FLOP estimates
 * cost a batch split finer the same, but larger micro-batches run nearer the GEMM ceiling);
 * then the fewer bytes on the fullest device, the fewer stages, and enum order. */
static bool before(const gp_plan *a, const gp_plan *b) {
    /* steps equal but for the rounding of sums in another order are equal */
    if (fabs(a->step_s - b->step_s) > 1e-9 * fmax(a->step_s, b->step_s))
        return a->step_s < b->step_s;
    if (a->micro_batches != b->micro_batches) return a->micro_batches < b->micro_batches;
    const uint64_t fa = gp_plan_fullest_bytes(a), fb = gp_plan_fullest_bytes(b);
    if (fa != fb) return fa < fb;
    if (a->stages != b->stages) return a->stages < b->stages;
    if (a->schedule != b->schedule) return a->schedule < b->schedule;
    return a->remat < b->remat;
}

/* Keeps p among the best `cap` (sorted), taking ownership; frees what falls off. */
static void keep(gp_plan_search_result *r, int cap, gp_plan *p) {
    int at = r->n;
    while (at > 0 && before(p, &r->plans[at - 1])) at--;
    if (at >= cap) {
        gp_plan_free(p);
        return;
    }
    if (r->n == cap) gp_plan_free(&r->plans[--r->n]);
    memmove(&r->plans[at + 1], &r->plans[at], (size_t)(r->n - at) * sizeof *r->plans);
    r->plans[at] = *p;
    r->n++;
    memset(p, 0, sizeof *p);
}

static bool allowed(unsigned mask, int v) { return !mask || (mask >> v & 1u); }

/* A selective plan whose cells all took one mode that the search also tries: that mode's own
 * plan, listed once. */
static bool uniform_duplicate(const gp_plan *p, unsigned remats) {
    if (p->remat != GP_REMAT_SELECTIVE) return false;
    for (int k = 1; k < p->ncells; k++)
        if (p->cells[k].remat != p->cells[0].remat) return false;
    return allowed(remats, p->cells[0].remat);
}

/* Every candidate of the search (n of them into *out, caller frees), or an error saying why
 * none exists. */
static gp_status enumerate(int L, int64_t batch, int T, uint64_t limit,
                           const gp_plan_search_opts *so, candidate **out, int *n) {
    const int N = so->devices;
    *out = NULL;
    *n = 0;
    if (N % T != 0)
        return gp_error(GP_INVALID_ARGUMENT,
                        "plan search: %d devices do not divide into T = %d tensor-parallel "
                        "shards each",
                        N, T);
    int cap = 0;
    candidate *c = NULL;
    for (int pass = 0; pass < 2; pass++) {
        int cnt = 0;
        for (int K = 1; K <= N / T; K++) {
            if ((N / T) % K || K > L || (so->stages && K != so->stages)) continue;
            const int D = N / (T * K);
            if ((so->data_parallel && D != so->data_parallel) || batch % D) continue;
            const int64_t per = batch / D;
            for (int64_t M = 1; M <= per; M++) {
                if (per % M || (so->micro_batches && M != so->micro_batches)) continue;
                for (int s = 0; s <= GP_SCHEDULE_ZBV; s++) {
                    if (!allowed(so->schedules, s)) continue;
                    /* several cells per stage (interleaved: V = 2 to 4, or as given; zbv: 2):
                     * K > 1 stages, K V layers */
                    const bool chunked = s == GP_SCHEDULE_INTERLEAVED || s == GP_SCHEDULE_ZBV;
                    if (chunked && K == 1) continue;
                    if (s == GP_SCHEDULE_INTERLEAVED && M % K) continue;
                    const int v0 = !chunked ? 1 : s == GP_SCHEDULE_ZBV ? 2 : so->chunks ? so->chunks : 2;
                    const int v1 = s == GP_SCHEDULE_INTERLEAVED && !so->chunks ? 4 : v0;
                    for (int V = v0; V <= v1 && (int64_t)K * V <= L; V++)
                        for (int r = 0; r <= GP_REMAT_SELECTIVE; r++) {
                            if (!allowed(so->remats, r)) continue;
                            /* without a limit every selective cell keeps its state: none's */
                            if (r == GP_REMAT_SELECTIVE && !limit &&
                                allowed(so->remats, GP_REMAT_NONE))
                                continue;
                            if (pass == 1)
                                c[cnt] = (candidate){.K = K, .D = D, .M = (int)M, .V = V,
                                                     .schedule = (gp_schedule_kind)s,
                                                     .remat = (gp_remat)r};
                            cnt++;
                        }
                }
            }
        }
        if (pass == 0) {
            if (!cnt)
                return gp_error(GP_INVALID_ARGUMENT,
                                "plan search: no plan of %d devices meets the constraints "
                                "(K = %d, M = %d, D = %d given, 0: any; T = %d; %d layers; batch "
                                "%lld must divide by D x M)",
                                N, so->stages, so->micro_batches, so->data_parallel, T, L,
                                (long long)batch);
            cap = cnt;
            if (!(c = calloc((size_t)cap, sizeof *c)))
                return gp_error(GP_OUT_OF_MEMORY, "plan search: no memory for %d candidates", cap);
        }
    }
    *out = c;
    *n = cap;
    return GP_OK;
}

/* Measured layer times at each micro-batch size (balance TIME), profiled once per size, and
 * scaled by the contention of each number of devices computing at once (measured once per size
 * and number): entry (mb, 1) holds the profile itself. */
typedef struct time_cache {
    int64_t *mb;
    int *devices;
    double **times;
    int n;
} time_cache;

static const double *cached(const time_cache *tc, int64_t mb, int devices) {
    for (int i = 0; i < tc->n; i++)
        if (tc->mb[i] == mb && tc->devices[i] == devices) return tc->times[i];
    return NULL;
}

static void cache_put(time_cache *tc, int64_t mb, int devices, double *t) {
    tc->mb[tc->n] = mb;
    tc->devices[tc->n] = devices;
    tc->times[tc->n++] = t;
}

static gp_status times_for(gp_model *m, int64_t mb, int devices, time_cache *tc,
                           const double **out) {
    if ((*out = cached(tc, mb, devices))) return GP_OK;
    const int L = gp_model_nlayers(m);
    const double *raw = cached(tc, mb, 1);
    if (!raw) {
        double *t = calloc(4 * (size_t)L, sizeof *t);
        if (!t) return gp_error(GP_OUT_OF_MEMORY, "plan search: no memory for %d layer times", L);
        /* split backwards too: the zero-bubble schedules are timed as they run */
        gp_status s = gp_model_profile_layers_split(m, mb, 0, t);
        if (s != GP_OK) {
            free(t);
            return gp_error_context(s, "plan search: timing the layers at micro-batches of %lld",
                                    (long long)mb);
        }
        cache_put(tc, mb, 1, t);
        raw = t;
    }
    if (devices == 1) {
        *out = raw;
        return GP_OK;
    }
    double *t = malloc(4 * (size_t)L * sizeof *t);
    if (!t) return gp_error(GP_OUT_OF_MEMORY, "plan search: no memory for %d layer times", L);
    memcpy(t, raw, 4 * (size_t)L * sizeof *t);
    gp_status s = gp_layer_times_contend(m, mb, devices, 4, t, NULL);
    if (s != GP_OK) {
        free(t);
        return s;
    }
    cache_put(tc, mb, devices, t);
    *out = t;
    return GP_OK;
}

gp_status gp_plan_search(gp_model *m, int64_t batch, const gp_optim_opts *o,
                         const gp_pipeline_opts *base, double gflops,
                         const gp_plan_search_opts *so, gp_plan_search_result *out) {
    if (!out) return gp_error(GP_INVALID_ARGUMENT, "gp_plan_search: NULL output");
    memset(out, 0, sizeof *out);
    if (!m || !base || !so) return gp_error(GP_INVALID_ARGUMENT, "gp_plan_search: NULL argument");
    if (so->devices < 1 || so->devices > GP_MAX_DEVICES)
        return gp_error(GP_INVALID_ARGUMENT, "plan search: %d devices; expected 1 to %d",
                        so->devices, GP_MAX_DEVICES);
    if (so->stages < 0 || so->micro_batches < 0 || so->data_parallel < 0 || so->max_plans < 0)
        return gp_error(GP_INVALID_ARGUMENT,
                        "plan search: K = %d, M = %d, D = %d, %d plans kept; expected >= 0 (0: "
                        "searched, or the default)",
                        so->stages, so->micro_batches, so->data_parallel, so->max_plans);
    if (base->partition || base->layer_times)
        return gp_error(GP_INVALID_ARGUMENT,
                        "plan search: a given %s fits one plan only; leave it NULL",
                        base->partition ? "partition" : "set of layer times");
    if (batch < 1)
        return gp_error(GP_INVALID_ARGUMENT, "plan search: batch %lld; expected >= 1",
                        (long long)batch);
    const int T = base->tensor_parallel > 0 ? base->tensor_parallel : 1;
    const int L = gp_model_nlayers(m);
    candidate *c = NULL;
    int nc = 0;
    GP_TRY(enumerate(L, batch, T, base->memory_limit, so, &c, &nc));
    /* no more kept than tried: a large max_plans lists them all */
    const int want = so->max_plans ? so->max_plans : 5, cap = want < nc ? want : nc;
    gp_pipeline_opts timed = *base;
    /* measured layer times, measured optimizer steps */
    if (timed.balance == GP_BALANCE_TIME && o && timed.optim_s_per_param == 0) {
        gp_status s = gp_optim_profile(o, 0, 0, &timed.optim_s_per_param);
        if (s != GP_OK) {
            free(c);
            return gp_error_context(s, "plan search: timing the optimizer step");
        }
    }
    base = &timed;
    /* at most one profile and one contention figure per candidate */
    time_cache tc = {.mb = calloc(2 * (size_t)nc, sizeof(int64_t)),
                     .devices = calloc(2 * (size_t)nc, sizeof(int)),
                     .times = calloc(2 * (size_t)nc, sizeof(double *))};
    out->plans = calloc((size_t)cap, sizeof *out->plans);
    gp_status status = GP_OK;
    if (!out->plans || !tc.mb || !tc.devices || !tc.times)
        status = gp_error(GP_OUT_OF_MEMORY, "plan search: no memory for %d plans", cap);
    uint64_t least = UINT64_MAX; /* the leanest plan over the limit, for the error */
    int least_at = -1;
    for (int i = 0; status == GP_OK && i < nc; i++) {
        gp_pipeline_opts po = *base;
        po.stages = c[i].K;
        po.data_parallel = c[i].D;
        po.micro_batches = c[i].M;
        po.schedule = c[i].schedule;
        po.chunks = c[i].V;
        po.remat = c[i].remat;
        if (po.balance == GP_BALANCE_TIME) {
            const double *t = NULL;
            status = times_for(m, batch / ((int64_t)c[i].D * c[i].M), c[i].K * T * c[i].D, &tc,
                               &t);
            if (status != GP_OK) break;
            po.layer_times = t;
            po.layer_times_split = true;
        }
        gp_plan p;
        gp_status s = gp_plan_make(m, batch, o, &po, gflops, &p);
        out->candidates++;
        if (s == GP_OK && uniform_duplicate(&p, so->remats)) {
            out->fitting++;
            gp_plan_free(&p);
        } else if (s == GP_OK) {
            out->fitting++;
            keep(out, cap, &p);
        } else if (s == GP_MEMORY_LIMIT) {
            po.memory_limit = 0;
            if (po.remat == GP_REMAT_SELECTIVE) po.remat = GP_REMAT_CELL;
            if (gp_plan_make(m, batch, o, &po, gflops, &p) == GP_OK) {
                const uint64_t need = gp_plan_fullest_bytes(&p);
                if (need < least) least = need, least_at = i;
                gp_plan_free(&p);
            }
        } else {
            status = gp_error_context(s, "plan search: K = %d, D = %d, M = %d, %s, remat %s",
                                      c[i].K, c[i].D, c[i].M,
                                      gp_schedule_kind_name(c[i].schedule),
                                      gp_remat_name(c[i].remat));
        }
        if (so->progress) so->progress(so->progress_ctx, i + 1, nc);
    }
    if (status == GP_OK && out->n == 0) {
        char lim[48], need[48];
        if (least_at >= 0) {
            const candidate *w = &c[least_at];
            status = gp_error(GP_MEMORY_LIMIT,
                              "plan search: none of the %d plans of %d devices fits the %s "
                              "per-device limit; the leanest balanced one (K = %d, D = %d, M = "
                              "%d, %s, remat %s) needs %s on its fullest device",
                              out->candidates, so->devices,
                              gp_plan_bytes_str(base->memory_limit, lim, sizeof lim), w->K, w->D,
                              w->M, gp_schedule_kind_name(w->schedule), gp_remat_name(w->remat),
                              gp_plan_bytes_str(least, need, sizeof need));
        } else {
            status = gp_error(GP_MEMORY_LIMIT,
                              "plan search: none of the %d plans of %d devices fits the %s "
                              "per-device limit",
                              out->candidates, so->devices,
                              gp_plan_bytes_str(base->memory_limit, lim, sizeof lim));
        }
    }
    for (int i = 0; i < tc.n; i++) free(tc.times[i]);
    free(tc.mb);
    free(tc.devices);
    free(tc.times);
    free(c);
    if (status != GP_OK) gp_plan_search_free(out);
    return status;
}
