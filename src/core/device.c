/* The CPU device: host memory with live and peak byte counters per category
 * and an optional limit. Every memory figure gpipe reports comes from here. */
#include "device.h"

#include <stdlib.h>
#include <string.h>

#include "error.h"

#define GP_ALIGN 64

/* Freed blocks of one padded size, linked through their headers. */
typedef struct size_bin {
    size_t padded;
    struct block_header *head;
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
    gp_mem_stats stats;
    size_bin bins[MAX_BINS];
    int nbins;
};

/* Each block starts with a header (one alignment unit) holding its size and
 * category, so release needs only the pointer. */
typedef struct block_header {
    size_t nbytes;
    size_t padded;
    struct block_header *next; /* in a cache bin */
    const struct gp_device *owner;
    int cat;
    uint32_t magic;
} block_header;
_Static_assert(sizeof(block_header) <= GP_ALIGN, "the block header must fit in one alignment unit");
#define BLOCK_MAGIC 0x67706d6du
#define CACHED_MAGIC 0x67706366u

static const char *const category_names[] = {
#define GP_CAT_NAME_(name, str) str,
    GP_MEM_CATEGORY_MAP(GP_CAT_NAME_)
#undef GP_CAT_NAME_
};

const char *gp_mem_category_name(gp_mem_category c) {
    return (c >= 0 && c < GP_MEM_NCATEGORIES) ? category_names[c] : "unknown";
}

gp_status gp_device_cpu_new(const char *name, gp_device **out) {
    if (!out) return gp_error(GP_INVALID_ARGUMENT, "gp_device_cpu_new: out is NULL");
    *out = NULL;
    gp_device *d = calloc(1, sizeof *d);
    if (!d) return gp_error(GP_OUT_OF_MEMORY, "gp_device_cpu_new: cannot allocate the device");
    snprintf(d->name, sizeof d->name, "%s", name ? name : "cpu");
    *out = d;
    return GP_OK;
}

void gp_device_trim(gp_device *dev) {
    if (!dev) return;
    for (int i = 0; i < dev->nbins; i++) {
        block_header *h = dev->bins[i].head;
        while (h) {
            block_header *next = h->next;
            GP_ASSERT(h->magic == CACHED_MAGIC);
            h->magic = 0;
            free(h);
            h = next;
        }
        dev->bins[i].head = NULL;
    }
    dev->nbins = 0;
    dev->stats.cached = 0;
}

void gp_device_free(gp_device *dev) {
    gp_device_trim(dev);
    free(dev);
}

static size_bin *find_bin(gp_device *dev, size_t padded) {
    for (int i = 0; i < dev->nbins; i++)
        if (dev->bins[i].padded == padded) return &dev->bins[i];
    return NULL;
}

const char *gp_device_name(const gp_device *dev) { return dev ? dev->name : "(no device)"; }

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

static void fmt_bytes(char *buf, size_t n, uint64_t b) {
    if (b >= (1ull << 30))
        snprintf(buf, n, "%llu bytes (%.2f GiB)", (unsigned long long)b, b / 1073741824.0);
    else if (b >= (1ull << 20))
        snprintf(buf, n, "%llu bytes (%.2f MiB)", (unsigned long long)b, b / 1048576.0);
    else
        snprintf(buf, n, "%llu bytes", (unsigned long long)b);
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
    gp_mem_stats *st = &dev->stats;
    if (st->limit && (nbytes > st->limit || st->live_total > st->limit - nbytes)) {
        char req[64], live[64], lim[64];
        fmt_bytes(req, sizeof req, nbytes);
        fmt_bytes(live, sizeof live, st->live_total);
        fmt_bytes(lim, sizeof lim, st->limit);
        *status = gp_error(GP_MEMORY_LIMIT,
                           "device %s: allocating %s of %s would exceed its limit of %s "
                           "(%s already live)",
                           dev->name, req, gp_mem_category_name(cat), lim, live);
        return NULL;
    }
    size_t padded = (nbytes + GP_ALIGN - 1) / GP_ALIGN * GP_ALIGN;
    if (padded < nbytes || padded > SIZE_MAX - GP_ALIGN) {
        *status = gp_error(GP_OUT_OF_MEMORY, "device %s: request of %zu bytes is too large",
                           dev->name, nbytes);
        return NULL;
    }
    if (st->limit && st->cached > st->limit - st->live_total - nbytes) gp_device_trim(dev);
    unsigned char *raw = NULL;
    size_bin *bin = find_bin(dev, padded);
    if (bin && bin->head) {
        block_header *h = bin->head;
        GP_ASSERT(h->magic == CACHED_MAGIC);
        bin->head = h->next;
        st->cached -= padded;
        st->cache_hits++;
        raw = (unsigned char *)h;
    } else {
        raw = aligned_alloc(GP_ALIGN, padded + GP_ALIGN);
        if (!raw && st->cached) { /* the cache may be what is in the way */
            gp_device_trim(dev);
            raw = aligned_alloc(GP_ALIGN, padded + GP_ALIGN);
        }
    }
    if (!raw) {
        *status = gp_error(GP_OUT_OF_MEMORY, "device %s: host allocation of %zu bytes of %s failed",
                           dev->name, nbytes, gp_mem_category_name(cat));
        return NULL;
    }
    block_header *h = (block_header *)raw;
    h->nbytes = nbytes;
    h->padded = padded;
    h->next = NULL;
    h->owner = dev;
    h->cat = cat;
    h->magic = BLOCK_MAGIC;
    st->live[cat] += nbytes;
    st->live_total += nbytes;
    if (st->live[cat] > st->peak[cat]) st->peak[cat] = st->live[cat];
    if (st->live_total > st->peak_total) st->peak_total = st->live_total;
    st->nallocs++;
    return raw + GP_ALIGN;
}

void gp_device_release(gp_device *dev, void *p) {
    if (!p) return;
    block_header *h = (block_header *)((unsigned char *)p - GP_ALIGN);
    GP_ASSERT(h->magic == BLOCK_MAGIC);
    /* Released on the device that allocated it: anything else would corrupt
     * two devices' counters (and race, once stages run on threads). */
    GP_ASSERT(dev && h->owner == dev);
    GP_ASSERT(h->cat >= 0 && h->cat < GP_MEM_NCATEGORIES);
    GP_ASSERT(dev->stats.live[h->cat] >= h->nbytes);
    dev->stats.live[h->cat] -= h->nbytes;
    dev->stats.live_total -= h->nbytes;
    size_bin *bin = find_bin(dev, h->padded);
    if (!bin && dev->nbins < MAX_BINS) {
        bin = &dev->bins[dev->nbins++];
        bin->padded = h->padded;
        bin->head = NULL;
    }
    if (!bin || !GP_USE_CACHE) { /* too many distinct sizes, or no cache: give it back */
        h->magic = 0;
        free(h);
        return;
    }
    h->magic = CACHED_MAGIC;
    h->next = bin->head;
    bin->head = h;
    dev->stats.cached += h->padded;
}
