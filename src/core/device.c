/* What every device shares, around its iface: live and peak byte counters per category, an
 * optional limit, a cache of freed blocks by exact padded size, and the host-side records that
 * let a block be released by its address. Every memory figure gpipe reports comes from here. */
#include "core/device.h"

#include <stdlib.h>
#include <string.h>

#include "core/block_map.h"
#include "core/error.h"

#define GP_ALIGN 64

/* Freed blocks of one padded size. */
typedef struct size_bin {
    size_t padded;
    gp_block_rec *head;
} size_bin;
#define MAX_BINS 256

/* Under AddressSanitizer reuse would hide use-after-free: no cache there. */
#if defined(__SANITIZE_ADDRESS__)
#define GP_USE_CACHE 0
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define GP_USE_CACHE 0
#endif
#endif
#ifndef GP_USE_CACHE
#define GP_USE_CACHE 1
#endif

struct gp_device {
    char name[64];
    const gp_device_iface *iface;
    void *ctx;
    const struct gp_kernels *kernels;
    gp_mem_stats stats;
    gp_block_map live; /* the blocks handed out */
    size_bin bins[MAX_BINS];
    int nbins;
    gp_precision precision;
    /* gp_device_hold_frees: blocks the backend would get back, held instead (a list) */
    bool holding;
    gp_block_rec *held;
    /* gp_device_bound_waits: what the host's waits go through first (NULL: nothing) */
    gp_device_wait_fn wait;
    void *wait_ctx;
};

void gp_device_bound_waits(gp_device *dev, gp_device_wait_fn wait, void *ctx) {
    if (!dev) return;
    dev->wait = wait;
    dev->wait_ctx = ctx;
}

gp_status gp_device_wait_bounded(gp_device *dev, const char *what) {
    return dev && dev->wait ? dev->wait(dev->wait_ctx, what) : GP_OK;
}

/* Gives block r back to the backend, or holds it while frees are held. */
static void give_back(gp_device *dev, gp_block_rec *r) {
    if (dev->holding) {
        r->next = dev->held;
        dev->held = r;
        return;
    }
    dev->iface->free(dev->ctx, r->ptr);
    free(r);
}

void gp_device_release_held(gp_device *dev) {
    if (!dev) return;
    while (dev->held) {
        gp_block_rec *r = dev->held;
        dev->held = r->next;
        dev->iface->free(dev->ctx, r->ptr);
        free(r);
    }
}

void gp_device_hold_frees(gp_device *dev, bool on) {
    if (!dev) return;
    dev->holding = on;
    if (!on) gp_device_release_held(dev);
}

static const char *const category_names[] = {
#define GP_CAT_NAME_(name, str) str,
    GP_MEM_CATEGORY_MAP(GP_CAT_NAME_)
#undef GP_CAT_NAME_
};

const char *gp_mem_category_name(gp_mem_category c) {
    return (c >= 0 && c < GP_MEM_NCATEGORIES) ? category_names[c] : "unknown";
}

gp_status gp_device_new(const char *name, const gp_device_iface *iface, void *ctx,
                        const struct gp_kernels *kernels, gp_device **out) {
    if (!out || !iface || !kernels)
        return gp_error(GP_INVALID_ARGUMENT, "gp_device_new: NULL argument");
    *out = NULL;
    gp_device *d = calloc(1, sizeof *d);
    if (!d) return gp_error(GP_OUT_OF_MEMORY, "gp_device_new: cannot allocate the device");
    snprintf(d->name, sizeof d->name, "%s", name ? name : iface->kind);
    d->iface = iface;
    d->ctx = ctx;
    d->kernels = kernels;
    *out = d;
    return GP_OK;
}

void *gp_device_context(const gp_device *dev) { return dev ? dev->ctx : NULL; }
const struct gp_kernels *gp_device_kernels(const gp_device *dev) {
    return dev ? dev->kernels : NULL;
}
const char *gp_device_name(const gp_device *dev) { return dev ? dev->name : "(no device)"; }
const char *gp_device_kind(const gp_device *dev) { return dev ? dev->iface->kind : "host"; }
bool gp_device_is_host(const gp_device *dev) { return !dev || dev->iface->host_memory; }

const char *gp_precision_name(gp_precision p) {
    return p == GP_PRECISION_FP32 ? "fp32" : p == GP_PRECISION_BF16 ? "bf16" : "unknown";
}

gp_status gp_precision_parse(const char *name, gp_precision *p) {
    if (!name || !p) return gp_error(GP_INVALID_ARGUMENT, "gp_precision_parse: name or p is NULL");
    for (int k = GP_PRECISION_FP32; k <= GP_PRECISION_BF16; k++)
        if (strcmp(name, gp_precision_name((gp_precision)k)) == 0) {
            *p = (gp_precision)k;
            return GP_OK;
        }
    return gp_error(GP_INVALID_ARGUMENT, "precision '%s': unknown; expected fp32 or bf16", name);
}

gp_status gp_device_set_precision(gp_device *dev, gp_precision p) {
    if (!dev) return gp_error(GP_INVALID_ARGUMENT, "gp_device_set_precision: device is NULL");
    if (p != GP_PRECISION_FP32 && p != GP_PRECISION_BF16)
        return gp_error(GP_INVALID_ARGUMENT,
                        "gp_device_set_precision: device %s: precision %d; expected fp32 (%d) "
                        "or bf16 (%d)",
                        dev->name, (int)p, GP_PRECISION_FP32, GP_PRECISION_BF16);
    dev->precision = p;
    return GP_OK;
}

gp_precision gp_device_precision(const gp_device *dev) {
    return dev ? dev->precision : GP_PRECISION_FP32;
}

void gp_device_trim(gp_device *dev) {
    if (!dev) return;
    for (int i = 0; i < dev->nbins; i++) {
        gp_block_rec *r = dev->bins[i].head;
        while (r) {
            gp_block_rec *next = r->next;
            give_back(dev, r);
            r = next;
        }
        dev->bins[i].head = NULL;
    }
    dev->nbins = 0;
    dev->stats.cached = 0;
}

void gp_device_free(gp_device *dev) {
    if (!dev) return;
    gp_device_hold_frees(dev, false);
    gp_device_trim(dev);
    /* Blocks still live belong to tensors the caller has not released (a programmer error the
     * header rules out): they stay allocated, where a leak checker finds them. */
    gp_block_map_free(&dev->live);
    if (dev->iface->destroy) dev->iface->destroy(dev->ctx);
    free(dev);
}

gp_status gp_device_set_limit(gp_device *dev, uint64_t nbytes) {
    if (!dev) return gp_error(GP_INVALID_ARGUMENT, "gp_device_set_limit: device is NULL");
    dev->stats.limit = nbytes;
    return GP_OK;
}

void gp_device_mem_stats(const gp_device *dev, gp_mem_stats *out) {
    if (!out) return;
    if (!dev) {
        memset(out, 0, sizeof *out);
        return;
    }
    *out = dev->stats;
}

void gp_device_reset_peaks(gp_device *dev) {
    if (!dev) return;
    for (int c = 0; c < GP_MEM_NCATEGORIES; c++) dev->stats.peak[c] = dev->stats.live[c];
    dev->stats.peak_total = dev->stats.live_total;
}

gp_status gp_device_sync(gp_device *dev) {
    if (!dev) return gp_error(GP_INVALID_ARGUMENT, "gp_device_sync: device is NULL");
    gp_status s = gp_device_wait_bounded(dev, "a device synchronize");
    if (s == GP_OK) s = dev->iface->sync(dev->ctx);
    return s == GP_OK ? GP_OK : gp_error_context(s, "device %s", dev->name);
}

static void fmt_bytes(char *buf, size_t n, uint64_t b) {
    if (b >= (1ull << 30))
        snprintf(buf, n, "%llu bytes (%.2f GiB)", (unsigned long long)b, b / 1073741824.0);
    else if (b >= (1ull << 20))
        snprintf(buf, n, "%llu bytes (%.2f MiB)", (unsigned long long)b, b / 1048576.0);
    else
        snprintf(buf, n, "%llu bytes", (unsigned long long)b);
}

static size_bin *find_bin(gp_device *dev, size_t padded) {
    for (int i = 0; i < dev->nbins; i++)
        if (dev->bins[i].padded == padded) return &dev->bins[i];
    return NULL;
}

static gp_status check_limit(gp_device *dev, gp_mem_category cat, size_t nbytes) {
    const gp_mem_stats *st = &dev->stats;
    if (!st->limit || (nbytes <= st->limit && st->live_total <= st->limit - nbytes)) return GP_OK;
    char req[64], live[64], lim[64];
    fmt_bytes(req, sizeof req, nbytes);
    fmt_bytes(live, sizeof live, st->live_total);
    fmt_bytes(lim, sizeof lim, st->limit);
    return gp_error(GP_MEMORY_LIMIT,
                    "device %s: allocating %s of %s would exceed its limit of %s (%s already "
                    "live)",
                    dev->name, req, gp_mem_category_name(cat), lim, live);
}

/* nbytes more live under cat, and the peaks they make. */
static void count_live(gp_mem_stats *st, gp_mem_category cat, size_t nbytes) {
    st->live[cat] += nbytes;
    st->live_total += nbytes;
    if (st->live[cat] > st->peak[cat]) st->peak[cat] = st->live[cat];
    if (st->live_total > st->peak_total) st->peak_total = st->live_total;
}

static void uncount_live(gp_mem_stats *st, gp_mem_category cat, size_t nbytes) {
    GP_ASSERT(st->live[cat] >= nbytes); /* no more given back than was counted */
    st->live[cat] -= nbytes;
    st->live_total -= nbytes;
}

/* A block of `padded` bytes: from the cache, or new from the device. */
static gp_status take_block(gp_device *dev, size_t padded, gp_block_rec **out) {
    size_bin *bin = find_bin(dev, padded);
    if (bin && bin->head) {
        *out = bin->head;
        bin->head = bin->head->next;
        dev->stats.cached -= padded;
        dev->stats.cache_hits++;
        return GP_OK;
    }
    gp_block_rec *r = calloc(1, sizeof *r);
    if (!r) return gp_error(GP_OUT_OF_MEMORY, "device %s: cannot record a block", dev->name);
    gp_status s = dev->iface->alloc(dev->ctx, padded, &r->ptr);
    if (s != GP_OK && dev->stats.cached) { /* the cache may be what is in the way */
        gp_device_trim(dev);
        s = dev->iface->alloc(dev->ctx, padded, &r->ptr);
    }
    if (s != GP_OK) {
        free(r);
        return s;
    }
    r->padded = padded;
    *out = r;
    return GP_OK;
}

void *gp_device_alloc(gp_device *dev, gp_mem_category cat, size_t nbytes, gp_status *status) {
    gp_status dummy;
    if (!status) status = &dummy;
    *status = GP_OK;
    if (!dev) {
        *status = gp_error(GP_INVALID_ARGUMENT, "allocation of %zu bytes: device is NULL", nbytes);
        return NULL;
    }
    if (cat < 0 || cat >= GP_MEM_NCATEGORIES) {
        *status = gp_error(GP_INVALID_ARGUMENT, "device %s: unknown memory category %d", dev->name,
                           (int)cat);
        return NULL;
    }
    if ((*status = check_limit(dev, cat, nbytes)) != GP_OK) return NULL;
    if (nbytes > SIZE_MAX - GP_ALIGN) {
        *status = gp_error(GP_OUT_OF_MEMORY, "device %s: request of %zu bytes is too large",
                           dev->name, nbytes);
        return NULL;
    }
    const size_t padded = nbytes ? (nbytes + GP_ALIGN - 1) / GP_ALIGN * GP_ALIGN : GP_ALIGN;
    gp_mem_stats *st = &dev->stats;
    if (st->limit && st->cached > st->limit - st->live_total - nbytes) gp_device_trim(dev);
    gp_block_rec *r = NULL;
    *status = take_block(dev, padded, &r);
    if (*status != GP_OK) {
        gp_error_context(*status, "device %s: allocating %zu bytes of %s", dev->name, nbytes,
                         gp_mem_category_name(cat));
        return NULL;
    }
    r->nbytes = nbytes;
    r->cat = cat;
    r->next = NULL;
    if (!gp_block_map_put(&dev->live, r)) {
        give_back(dev, r);
        *status = gp_error(GP_OUT_OF_MEMORY, "device %s: cannot record a block", dev->name);
        return NULL;
    }
    count_live(st, cat, nbytes);
    st->nallocs++;
    return r->ptr;
}

gp_status gp_device_count_host(gp_device *dev, gp_mem_category cat, size_t nbytes,
                               const char *what) {
    if (!dev || cat < 0 || cat >= GP_MEM_NCATEGORIES)
        return gp_error(GP_INVALID_ARGUMENT, "counting %zu bytes of host memory (%s): device %s, "
                                             "category %d", nbytes, what, gp_device_name(dev),
                        (int)cat);
    const gp_status s = check_limit(dev, cat, nbytes);
    if (s != GP_OK) return gp_error_context(s, "host memory for %s", what);
    count_live(&dev->stats, cat, nbytes);
    return GP_OK;
}

void gp_device_uncount_host(gp_device *dev, gp_mem_category cat, size_t nbytes) {
    if (!dev || !nbytes) return;
    GP_ASSERT(cat >= 0 && cat < GP_MEM_NCATEGORIES);
    uncount_live(&dev->stats, cat, nbytes);
}

void gp_device_release(gp_device *dev, void *p) {
    if (!p) return;
    /* Released on the device that allocated it: anything else would corrupt two devices'
     * counters (and race, once stages run on threads). */
    GP_ASSERT(dev);
    gp_block_rec *r = gp_block_map_take(&dev->live, p);
    GP_ASSERT(r); /* a block of this device, live */
    uncount_live(&dev->stats, r->cat, r->nbytes);
    size_bin *bin = find_bin(dev, r->padded);
    if (!bin && dev->nbins < MAX_BINS) {
        bin = &dev->bins[dev->nbins++];
        bin->padded = r->padded;
        bin->head = NULL;
    }
    if (!bin || !GP_USE_CACHE) { /* too many distinct sizes, or no cache: give it back */
        give_back(dev, r);
        return;
    }
    r->next = bin->head;
    bin->head = r;
    dev->stats.cached += r->padded;
}

gp_status gp_device_copy(gp_device *dev, void *dst, const void *src, size_t nbytes,
                         gp_copy_kind kind) {
    if (!nbytes) return GP_OK;
    gp_status s = kind == GP_COPY_DEVICE_TO_DEVICE ? GP_OK
                  : gp_device_wait_bounded(dev, kind == GP_COPY_DEVICE_TO_HOST
                                                    ? "a copy from the device to the host"
                                                    : "a copy from the host to the device");
    if (s == GP_OK) s = dev->iface->copy(dev->ctx, dst, src, nbytes, kind);
    return s == GP_OK ? GP_OK : gp_error_context(s, "device %s: copy of %zu bytes", dev->name, nbytes);
}

gp_status gp_device_copy_peer(gp_device *dev, void *dst, gp_device *from, const void *src,
                              size_t nbytes, bool *done) {
    *done = false;
    if (!nbytes || dev->iface != from->iface || !dev->iface->copy_peer) return GP_OK;
    gp_status s = dev->iface->copy_peer(dev->ctx, dst, from->ctx, src, nbytes);
    *done = s == GP_OK;
    return s == GP_OK ? GP_OK
                      : gp_error_context(s, "copy of %zu bytes from device %s to device %s", nbytes,
                                         from->name, dev->name);
}

gp_status gp_device_fill(gp_device *dev, void *dst, size_t nbytes, int byte) {
    if (!nbytes) return GP_OK;
    gp_status s = dev->iface->fill(dev->ctx, dst, nbytes, byte);
    return s == GP_OK ? GP_OK : gp_error_context(s, "device %s: fill of %zu bytes", dev->name, nbytes);
}
