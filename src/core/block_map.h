/* A map from a device allocation's address to its record (size, category), kept in host memory:
 * the accounting of a device cannot keep a header in front of each block, because a block may
 * live in memory the host cannot touch (a GPU's). Open addressing with linear probing; deletion
 * shifts the following entries back, so there are no tombstones. Private to core. */
#ifndef GP_CORE_BLOCK_MAP_H
#define GP_CORE_BLOCK_MAP_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef struct gp_block_rec {
    void *ptr;
    size_t nbytes; /* as asked for: what the counters count */
    size_t padded; /* as allocated: what a cache bin is keyed by */
    int cat;
    struct gp_block_rec *next; /* in a cache bin's free list */
} gp_block_rec;

typedef struct gp_block_map {
    gp_block_rec **slot; /* (cap), NULL: empty */
    size_t cap, n;
} gp_block_map;

/* Inserts rec under rec->ptr (not present yet); false when out of host memory. */
bool gp_block_map_put(gp_block_map *m, gp_block_rec *rec);
/* The record of ptr, or NULL. */
gp_block_rec *gp_block_map_get(const gp_block_map *m, const void *ptr);
/* Removes and returns the record of ptr, or NULL when absent. */
gp_block_rec *gp_block_map_take(gp_block_map *m, const void *ptr);
/* Frees the table (not the records). */
void gp_block_map_free(gp_block_map *m);

#endif
