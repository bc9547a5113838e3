/* GP_CUDA_PROFILE (profile.h): the events of one device's stream in a ring, timed in pairs of
 * neighbours and summed per name; the table goes to stderr when the device is freed. Only the
 * device's thread touches it (a device is used by one thread at a time). */
#include "kernels/cuda/profile.h"

#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/device.h"

/* Pending events at most. When all are, the older half is timed: its last event is thousands of
 * calls back and done, so the host does not wait and the GPU is not left idle. */
#define RING 4096
#define MAX_NAMES 256

typedef struct slot {
    cudaEvent_t ev;   /* made on first use, then reused */
    const char *name; /* NULL for the anchor: counted already, kept as the next one's start */
    bool after_idle;  /* queued when the GPU had done all before it, or first after a wait */
} slot;

typedef struct entry {
    const char *name;
    long long calls, after_idle;
    double timed_ms, max_ms, idle_ms;
} entry;

struct gp_cuda_profile {
    char device[64];
    int ordinal;
    gp_device *dev; /* its bound on waits */
    bool off;    /* a CUDA call failed: nothing more is recorded */
    int head, n; /* pending: ring[(head + i) % RING] for i < n, in stream order */
    int nnames;
    double timed_ms, idle_ms;
    entry names[MAX_NAMES];
    slot ring[RING];
};

gp_cuda_profile *gp_cuda_profile_new(const char *device, int ordinal, gp_device *dev) {
    const char *v = getenv("GP_CUDA_PROFILE");
    if (!v || !*v || strcmp(v, "0") == 0) return NULL;
    gp_cuda_profile *p = calloc(1, sizeof *p);
    if (!p) {
        fprintf(stderr,
                "gpipe: GP_CUDA_PROFILE: device %s: no memory for the profile; not profiled\n",
                device);
        return NULL;
    }
    snprintf(p->device, sizeof p->device, "%s", device);
    p->ordinal = ordinal;
    p->dev = dev;
    return p;
}

static bool ok(gp_cuda_profile *p, cudaError_t e, const char *call) {
    if (e == cudaSuccess) return true;
    /* Read and so cleared: the next launch's check (cudaGetLastError) must not see it. */
    (void)cudaGetLastError();
    if (!p->off)
        fprintf(stderr,
                "gpipe: GP_CUDA_PROFILE: device %s: %s failed: %s (%s); profiling stopped, the "
                "table shows what came before\n",
                p->device, call, cudaGetErrorString(e), cudaGetErrorName(e));
    p->off = true;
    return false;
}

static slot *at(gp_cuda_profile *p, int i) { return &p->ring[(p->head + i) % RING]; }

static entry *entry_of(gp_cuda_profile *p, const char *name) {
    for (int i = 0; i < p->nnames; i++)
        if (p->names[i].name == name || strcmp(p->names[i].name, name) == 0) return &p->names[i];
    if (p->nnames == MAX_NAMES) return NULL;
    entry *e = &p->names[p->nnames++];
    e->name = name;
    return e;
}

/* Counts the pending calls 0 to last and times each against the one before it; call 0 has none
 * (a chain's first) unless it is the anchor. With keep, call `last` stays pending as the anchor
 * of those after it; without, the chain ends. A call queued after the GPU had done all before it
 * (after_idle) may have waited for the host: its time goes apart. */
static void resolve(gp_cuda_profile *p, int last, bool keep) {
    if (!ok(p, cudaEventSynchronize(at(p, last)->ev), "cudaEventSynchronize")) {
        p->n = 0;
        return;
    }
    for (int i = 0; i <= last; i++) {
        const slot *s = at(p, i);
        if (!s->name) continue;
        entry *e = entry_of(p, s->name);
        if (!e) {
            fprintf(stderr, "gpipe: GP_CUDA_PROFILE: device %s: more than %d names; profiling "
                            "stopped, the table shows what came before\n",
                    p->device, MAX_NAMES);
            p->off = true;
            p->n = 0; /* counted in part: dropped */
            return;
        }
        e->calls++;
        if (s->after_idle) e->after_idle++;
        if (i == 0) continue;
        float ms = 0;
        if (!ok(p, cudaEventElapsedTime(&ms, at(p, i - 1)->ev, s->ev), "cudaEventElapsedTime")) {
            p->n = 0;
            return;
        }
        if (s->after_idle) {
            e->idle_ms += ms;
            p->idle_ms += ms;
        } else {
            e->timed_ms += ms;
            if (ms > e->max_ms) e->max_ms = ms;
            p->timed_ms += ms;
        }
    }
    if (keep) {
        p->head = (p->head + last) % RING;
        p->n -= last;
        at(p, 0)->name = NULL;
    } else {
        p->n = 0;
    }
}

void gp_cuda_profile_mark(gp_cuda_profile *p, cudaStream_t stream, const char *name) {
    if (p->off) return;
    if (p->n == RING) {
        /* A host wait mid-run, which NCCL's sums queued on the stream may hold: bounded first
         * (a failure there has aborted the run, and the next wait of the device's says so). */
        if (gp_device_wait_bounded(p->dev, "GP_CUDA_PROFILE's event wait") != GP_OK) {
            fprintf(stderr, "gpipe: GP_CUDA_PROFILE: device %s: the wait for the GPU failed; "
                            "profiling stopped, the table shows what came before\n",
                    p->device);
            p->off = true;
            p->n = 0;
            return;
        }
        resolve(p, RING / 2, true);
    }
    if (p->off) return;
    /* Whether the call before this one was done when this one was queued, give or take the
     * moment between the queueing and here: when not, the GPU went from it to this call without
     * waiting for the host, and the time between their ends is this call's own. */
    bool after_idle = true;
    if (p->n > 0) {
        const cudaError_t q = cudaEventQuery(at(p, p->n - 1)->ev);
        if (q == cudaErrorNotReady) {
            after_idle = false;
            /* Not a failure; cleared in case the runtime kept it as the last error. */
            if (cudaPeekAtLastError() == cudaErrorNotReady) (void)cudaGetLastError();
        } else if (!ok(p, q, "cudaEventQuery")) {
            return;
        }
    }
    slot *s = at(p, p->n);
    if (!s->ev) {
        cudaEvent_t ev;
        if (!ok(p, cudaEventCreate(&ev), "cudaEventCreate")) return;
        s->ev = ev;
    }
    if (!ok(p, cudaEventRecord(s->ev, stream), "cudaEventRecord")) return;
    s->name = name;
    s->after_idle = after_idle;
    p->n++;
}

/* Also once off: what was recorded before is still timed (a failure in resolve drops it). */
void gp_cuda_profile_synced(gp_cuda_profile *p) {
    if (p->n > 0) resolve(p, p->n - 1, false);
}

static int by_time(const void *a, const void *b) {
    const entry *x = a, *y = b;
    if (x->timed_ms != y->timed_ms) return x->timed_ms < y->timed_ms ? 1 : -1;
    return strcmp(x->name, y->name);
}

static void report(gp_cuda_profile *p) {
    qsort(p->names, (size_t)p->nnames, sizeof p->names[0], by_time);
    long long calls = 0;
    for (int i = 0; i < p->nnames; i++) calls += p->names[i].calls;
    flockfile(stderr); /* one table, whatever other threads print */
    fprintf(stderr,
            "GP_CUDA_PROFILE device %s (GPU %d): %lld calls, %.3f ms timed, %.3f ms after idle%s\n",
            p->device, p->ordinal, calls, p->timed_ms, p->idle_ms,
            p->off ? " (profiling stopped early: see above)" : "");
    fprintf(stderr,
            "  timed: calls queued while the call before them was still on the GPU, each from "
            "that call's end to its own: its GPU time; mean and max over them, share of all "
            "timed ms\n"
            "  after idle: calls queued when the GPU had done all before them, or first after a "
            "wait for the GPU (a copy to the host, a sync); ms from the end of the call before "
            "(none for the first after a wait): their GPU time plus the GPU's wait for the "
            "host, between steps too\n");
    fprintf(stderr, "%-40s %9s %12s %10s %10s %7s %10s %12s\n", "name", "calls", "timed ms",
            "mean us", "max us", "share", "after idle", "idle+own ms");
    for (int i = 0; i < p->nnames; i++) {
        const entry *e = &p->names[i];
        const long long timed = e->calls - e->after_idle;
        fprintf(stderr, "%-40s %9lld %12.3f %10.2f %10.2f %6.2f%% %10lld %12.3f\n", e->name,
                e->calls, e->timed_ms, timed > 0 ? e->timed_ms * 1e3 / (double)timed : 0.0,
                e->max_ms * 1e3, p->timed_ms > 0 ? 100.0 * e->timed_ms / p->timed_ms : 0.0,
                e->after_idle, e->idle_ms);
    }
    funlockfile(stderr);
}

void gp_cuda_profile_free(gp_cuda_profile *p) {
    if (!p) return;
    gp_cuda_profile_synced(p);
    report(p);
    for (int i = 0; i < RING; i++)
        if (p->ring[i].ev) (void)cudaEventDestroy(p->ring[i].ev);
    free(p);
}
