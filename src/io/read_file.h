/* Whole-file reads of the io readers. Private to the library. */
#ifndef GP_IO_READ_FILE_H
#define GP_IO_READ_FILE_H

#include "gpipe.h"

/* Reads the regular file path, of at most max bytes, into *buf (malloc'd, n bytes plus a NUL
 * after them, which the caller frees); errors name the path. */
gp_status gp_read_file(const char *path, uint64_t max, unsigned char **buf, size_t *n);

#endif
