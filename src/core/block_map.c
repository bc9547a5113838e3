/* The address -> block record map of the device accounting (see block_map.h). */
#include "core/block_map.h"

#include <stdlib.h>

static size_t home(const gp_block_map *m, const void *ptr) {
    uint64_t h = (uint64_t)(uintptr_t)ptr;
    h ^= h >> 33;
    h *= 0xff51afd7ed558ccdULL; /* a 64-bit finalizer: aligned addresses spread over the table */
    h ^= h >> 33;
    return (size_t)(h & (m->cap - 1));
}

static bool grow(gp_block_map *m) {
    size_t cap = m->cap ? 2 * m->cap : 64;
    gp_block_rec **slot = calloc(cap, sizeof *slot);
    if (!slot) return false;
    gp_block_map old = *m;
    m->slot = slot;
    m->cap = cap;
    m->n = 0;
    for (size_t i = 0; i < old.cap; i++)
        if (old.slot[i]) gp_block_map_put(m, old.slot[i]);
    free(old.slot);
    return true;
}

bool gp_block_map_put(gp_block_map *m, gp_block_rec *rec) {
    if ((m->n + 1) * 4 > m->cap * 3 && !grow(m)) return false; /* load at most 3/4 */
    size_t i = home(m, rec->ptr);
    while (m->slot[i]) i = (i + 1) & (m->cap - 1);
    m->slot[i] = rec;
    m->n++;
    return true;
}

static size_t find(const gp_block_map *m, const void *ptr) {
    if (!m->cap) return SIZE_MAX;
    for (size_t i = home(m, ptr); m->slot[i]; i = (i + 1) & (m->cap - 1))
        if (m->slot[i]->ptr == ptr) return i;
    return SIZE_MAX;
}

gp_block_rec *gp_block_map_get(const gp_block_map *m, const void *ptr) {
    size_t i = find(m, ptr);
    return i == SIZE_MAX ? NULL : m->slot[i];
}

gp_block_rec *gp_block_map_take(gp_block_map *m, const void *ptr) {
    size_t i = find(m, ptr);
    if (i == SIZE_MAX) return NULL;
    gp_block_rec *rec = m->slot[i];
    m->slot[i] = NULL;
    m->n--;
    /* Backward shift: move later entries of the probe run into the hole when their home allows. */
    for (size_t j = (i + 1) & (m->cap - 1); m->slot[j]; j = (j + 1) & (m->cap - 1)) {
        size_t h = home(m, m->slot[j]->ptr);
        bool movable = i <= j ? (h <= i || h > j) : (h <= i && h > j);
        if (movable) {
            m->slot[i] = m->slot[j];
            m->slot[j] = NULL;
            i = j;
        }
    }
    return rec;
}

void gp_block_map_free(gp_block_map *m) {
    free(m->slot);
    m->slot = NULL;
    m->cap = m->n = 0;
}
