/* What the checkpoint readers (checkpoint.c, checkpoint_set.c) need of a safetensors file
 * beyond the public API: its checksums checked without copying, and the file it was read
 * from. Private to the library. */
#ifndef GP_IO_SAFETENSORS_INTERNAL_H
#define GP_IO_SAFETENSORS_INTERNAL_H

#include "gpipe.h"

/* As gp_safetensors_read, on fd (a regular file of nbytes bytes, from gp_open_regular), which
 * it takes in every case: the header is read and checked, no tensor data. */
gp_status gp_st_read_fd(int fd, uint64_t nbytes, const char *path, gp_safetensors **out);

/* Reads e's bytes in bounded chunks and checks them against its CRC-32 from the metadata (a
 * tensor without one passes); nothing is copied. */
gp_status gp_st_verify(const gp_safetensors *f, const gp_st_entry *e);

/* CRC-32 of the whole file f was read from, streamed (only for gp_safetensors_read's files). */
gp_status gp_st_file_crc(const gp_safetensors *f, uint32_t *crc);

#endif
