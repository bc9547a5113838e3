/* Opening and reading input files (checkpoints, datasets, configs). Private to the library. */
#ifndef GP_CORE_READ_FILE_H
#define GP_CORE_READ_FILE_H

#include "gpipe.h"

/* Opens path read-only if it is a regular file, *fd the descriptor (the caller closes it) and
 * *nbytes its size. Anything else is refused without blocking: a FIFO, a device, a directory
 * (opening a FIFO for reading would wait forever for a writer). Errors name the path. */
gp_status gp_open_regular(const char *path, int *fd, uint64_t *nbytes);

/* Reads exactly n bytes at offset off of fd (path names it in errors): a short read is an
 * error saying the file shrank. */
gp_status gp_pread_all(int fd, const char *path, uint64_t off, void *buf, size_t n);

/* CRC-32 (zlib's) of n bytes at offset off of fd, read in bounded chunks, never all at once. */
gp_status gp_crc32_file_range(int fd, const char *path, uint64_t off, uint64_t n, uint32_t *crc);

/* CRC-32 of n bytes in memory (any n: zlib takes 32-bit lengths, so it goes in pieces). */
uint32_t gp_crc32_bytes(uint32_t crc, const unsigned char *p, uint64_t n);

/* Reads the regular file path, of at most max bytes, into *buf (malloc'd, n bytes plus a NUL
 * after them, which the caller frees); errors name the path. */
gp_status gp_read_file(const char *path, uint64_t max, unsigned char **buf, size_t *n);

/* Reads the regular file path (at most max bytes, as gp_read_file) and parses it as JSON: *root
 * the tree (the caller deletes it), NULL where the text is not JSON, which the caller names
 * with what it expected. */
struct cJSON;
gp_status gp_read_json(const char *path, uint64_t max, struct cJSON **root);

#endif
