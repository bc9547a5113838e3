/* FNV-1a 64-bit, chainable: h = gp_fnv1a64(h, data, nbytes) from GP_FNV1A64_INIT. The
 * parameter hash (params_fnv1a64) that reports and tests compare runs by, and a host's name
 * hash in gathered timelines. Private to the library. */
#ifndef GP_CORE_HASH_H
#define GP_CORE_HASH_H

#include <stddef.h>
#include <stdint.h>

#define GP_FNV1A64_INIT 0xcbf29ce484222325ULL
uint64_t gp_fnv1a64(uint64_t h, const void *data, size_t nbytes);

#endif
