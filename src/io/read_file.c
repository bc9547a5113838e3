/* Reading a whole file into memory, with the checks every reader of a file wants: a regular
 * file, a size limit, and a read that got every byte. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "core/error.h"
#include "io/read_file.h"

gp_status gp_read_file(const char *path, uint64_t max, unsigned char **buf, size_t *n) {
    *buf = NULL;
    *n = 0;
    FILE *fp = fopen(path, "rb");
    if (!fp) return gp_error(GP_IO, "%s: cannot open: %s", path, strerror(errno));
    struct stat st;
    if (fstat(fileno(fp), &st) != 0 || !S_ISREG(st.st_mode)) {
        fclose(fp);
        return gp_error(GP_IO, "%s: not a regular file", path);
    }
    if ((uint64_t)st.st_size > max) {
        fclose(fp);
        return gp_error(GP_FORMAT, "%s: %lld bytes, more than the %llu expected", path,
                        (long long)st.st_size, (unsigned long long)max);
    }
    size_t len = (size_t)st.st_size;
    *buf = malloc(len + 1);
    if (!*buf) {
        fclose(fp);
        return gp_error(GP_OUT_OF_MEMORY, "%s: cannot hold its %zu bytes", path, len);
    }
    size_t got = fread(*buf, 1, len, fp);
    int err = ferror(fp);
    fclose(fp);
    if (err || got != len) {
        free(*buf);
        *buf = NULL;
        return gp_error(GP_IO, "%s: read %zu of %zu bytes%s", path, got, len,
                        err ? " (read error)" : " (the file shrank while being read)");
    }
    (*buf)[len] = '\0';
    *n = len;
    return GP_OK;
}

