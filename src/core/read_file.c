/* Opening and reading input files with the checks every reader of a file wants: a regular file
 * (checked on the open descriptor, so nothing can be swapped in between), a size limit, reads
 * that got every byte, and checksums streamed in bounded memory. */
#include <cjson/cJSON.h>
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include "core/error.h"
#include "core/read_file.h"

#define CRC_CHUNK ((size_t)1 << 20)

static const char *kind_of(mode_t mode) {
    if (S_ISFIFO(mode)) return "a FIFO (named pipe)";
    if (S_ISDIR(mode)) return "a directory";
    if (S_ISCHR(mode) || S_ISBLK(mode)) return "a device";
    if (S_ISSOCK(mode)) return "a socket";
    return "a special file";
}

gp_status gp_open_regular(const char *path, int *fd, uint64_t *nbytes) {
    *fd = -1;
    *nbytes = 0;
    /* O_NONBLOCK: a FIFO opens at once instead of waiting for a writer, and is then refused. */
    int d = open(path, O_RDONLY | O_NONBLOCK | O_NOCTTY | O_CLOEXEC);
    if (d < 0) return gp_error(GP_IO, "%s: cannot open: %s", path, strerror(errno));
    struct stat st;
    if (fstat(d, &st) != 0) {
        int err = errno;
        close(d);
        return gp_error(GP_IO, "%s: cannot stat: %s", path, strerror(err));
    }
    if (!S_ISREG(st.st_mode)) {
        close(d);
        return gp_error(GP_IO, "%s: is %s, not a regular file: expected a file to read", path,
                        kind_of(st.st_mode));
    }
    int flags = fcntl(d, F_GETFL);
    if (flags >= 0) (void)fcntl(d, F_SETFL, flags & ~O_NONBLOCK);
    *fd = d;
    *nbytes = (uint64_t)st.st_size;
    return GP_OK;
}

gp_status gp_pread_all(int fd, const char *path, uint64_t off, void *buf, size_t n) {
    size_t done = 0;
    while (done < n) {
        size_t want = n - done > ((size_t)1 << 30) ? (size_t)1 << 30 : n - done;
        ssize_t r = pread(fd, (unsigned char *)buf + done, want, (off_t)(off + done));
        if (r < 0 && errno == EINTR) continue;
        if (r < 0)
            return gp_error(GP_IO, "%s: read error at byte %llu: %s", path,
                            (unsigned long long)(off + done), strerror(errno));
        if (r == 0)
            return gp_error(GP_IO, "%s: the file ends at byte %llu, expected %zu bytes from byte "
                                   "%llu (it shrank while being read)",
                            path, (unsigned long long)(off + done), n, (unsigned long long)off);
        done += (size_t)r;
    }
    return GP_OK;
}

uint32_t gp_crc32_bytes(uint32_t crc, const unsigned char *p, uint64_t n) {
    uLong c = crc;
    while (n > 0) {
        uInt chunk = n > (1u << 30) ? (1u << 30) : (uInt)n;
        c = crc32(c, p, chunk);
        p += chunk;
        n -= chunk;
    }
    return (uint32_t)c;
}

gp_status gp_crc32_file_range(int fd, const char *path, uint64_t off, uint64_t n, uint32_t *crc) {
    size_t cap = n < CRC_CHUNK ? (size_t)n : CRC_CHUNK;
    unsigned char *buf = malloc(cap ? cap : 1);
    if (!buf) return gp_error(GP_OUT_OF_MEMORY, "%s: a %zu-byte read buffer", path, cap);
    uint32_t c = (uint32_t)crc32(0L, Z_NULL, 0);
    gp_status s = GP_OK;
    for (uint64_t at = 0; at < n && s == GP_OK;) {
        size_t len = n - at < cap ? (size_t)(n - at) : cap;
        s = gp_pread_all(fd, path, off + at, buf, len);
        if (s == GP_OK) c = gp_crc32_bytes(c, buf, len);
        at += len;
    }
    free(buf);
    *crc = c;
    return s;
}

gp_status gp_read_file(const char *path, uint64_t max, unsigned char **buf, size_t *n) {
    *buf = NULL;
    *n = 0;
    int fd;
    uint64_t len;
    GP_TRY(gp_open_regular(path, &fd, &len));
    if (len > max || len > (uint64_t)SIZE_MAX - 1) {
        close(fd);
        return gp_error(GP_FORMAT, "%s: %llu bytes, more than the %llu expected", path,
                        (unsigned long long)len, (unsigned long long)max);
    }
    *buf = malloc((size_t)len + 1);
    if (!*buf) {
        close(fd);
        return gp_error(GP_OUT_OF_MEMORY, "%s: cannot hold its %llu bytes", path,
                        (unsigned long long)len);
    }
    gp_status s = gp_pread_all(fd, path, 0, *buf, (size_t)len);
    close(fd);
    if (s != GP_OK) {
        free(*buf);
        *buf = NULL;
        return s;
    }
    (*buf)[len] = '\0';
    *n = (size_t)len;
    return GP_OK;
}

gp_status gp_read_json(const char *path, uint64_t max, cJSON **root) {
    unsigned char *buf;
    size_t n;
    *root = NULL;
    GP_TRY(gp_read_file(path, max, &buf, &n));
    *root = cJSON_ParseWithLength((const char *)buf, n);
    free(buf);
    return GP_OK;
}
