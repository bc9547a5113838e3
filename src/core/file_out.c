/* Output files written atomically: a temporary file beside the target,
 * every write checked, fsync, rename onto the target, fsync of the folder.
 * A crash or a failed write never leaves a half-written file under the
 * target's name, and never replaces a good one. */
#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/error.h"

/* fsync the folder holding path, so the rename survives a crash; best effort
 * (some file systems refuse to sync a folder). */
static void sync_dir(const char *path) {
    const char *slash = strrchr(path, '/');
    char dir[4096];
    if (!slash)
        snprintf(dir, sizeof dir, ".");
    else if (slash == path)
        snprintf(dir, sizeof dir, "/");
    else
        snprintf(dir, sizeof dir, "%.*s", (int)(slash - path), path);
    int fd = open(dir, O_RDONLY);
    if (fd < 0) return;
    (void)fsync(fd);
    close(fd);
}

gp_status gp_file_out_open(gp_file_out *o, const char *path) {
    memset(o, 0, sizeof *o);
    o->path = path;
    if (!path || !*path) return gp_error(GP_INVALID_ARGUMENT, "output file: empty output path");
    size_t n = strlen(path) + 32;
    o->tmp = malloc(n);
    if (!o->tmp) return gp_error(GP_OUT_OF_MEMORY, "output file '%s': out of host memory", path);
    snprintf(o->tmp, n, "%s.tmp.%ld", path, (long)getpid());
    o->f = fopen(o->tmp, "w");
    if (!o->f) {
        int err = errno;
        gp_status s = gp_error(GP_IO,
                               "cannot write '%s': cannot create the temporary file '%s' (%s)",
                               path, o->tmp, strerror(err));
        free(o->tmp);
        o->tmp = NULL;
        return s;
    }
    return GP_OK;
}

static void out_fail(gp_file_out *o, const char *what) {
    if (!o->what) {
        o->what = what;
        o->err = errno;
    }
}

void gp_file_out_printf(gp_file_out *o, const char *fmt, ...) {
    if (o->what || !o->f) return;
    va_list ap;
    va_start(ap, fmt);
    int r = vfprintf(o->f, fmt, ap);
    va_end(ap);
    if (r < 0) out_fail(o, "cannot write");
}

void gp_file_out_write(gp_file_out *o, const char *text) {
    if (o->what || !o->f) return;
    size_t n = strlen(text);
    if (fwrite(text, 1, n, o->f) != n) out_fail(o, "cannot write");
}

void gp_file_out_write_bytes(gp_file_out *o, const void *data, size_t nbytes) {
    if (o->what || !o->f || nbytes == 0) return;
    if (fwrite(data, 1, nbytes, o->f) != nbytes) out_fail(o, "cannot write");
}

gp_status gp_file_out_close(gp_file_out *o, bool ok) {
    if (!o->f) return gp_error(GP_INTERNAL, "output file '%s' is not open", o->path);
    if (ok && !o->what) {
        if (fflush(o->f) != 0) out_fail(o, "cannot write");
        else if (fsync(fileno(o->f)) != 0) out_fail(o, "cannot sync");
    }
    if (fclose(o->f) != 0) out_fail(o, "cannot close");
    o->f = NULL;
    if (ok && !o->what && rename(o->tmp, o->path) != 0)
        out_fail(o, "cannot rename");
    if (ok && !o->what) sync_dir(o->path); /* the rename itself durable, where it can be */
    gp_status s = GP_OK;
    if (!ok || o->what) remove(o->tmp);
    if (o->what)
        s = gp_error(GP_IO, "cannot write '%s': %s the temporary file '%s'%s (%s)", o->path,
                     o->what, o->tmp, strcmp(o->what, "cannot rename") ? "" : " onto it",
                     o->err ? strerror(o->err) : "unknown error");
    free(o->tmp);
    o->tmp = NULL;
    return s;
}
