/* Output paths checked against the inputs before any work: `gpipe eval --checkpoint X --report
 * X` would replace the checkpoint with its report, `--report ck/ckpt-00000008.safetensors` the
 * run's last checkpoint. Paths are compared as files (device and inode, so links and other
 * spellings of one file count) and as resolved paths (for outputs that do not exist yet). */
#define _XOPEN_SOURCE 700 /* realpath */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "cli.h"

#define PATH_CAP 4096

/* The absolute path with symbolic links resolved, for a path that need not exist yet: its
 * longest existing prefix resolved, the rest appended. Returns false (out: path as given) if
 * it cannot be resolved. */
static bool resolve(const char *path, char *out, size_t n) {
    char *r = realpath(path, NULL);
    int err = errno;
    if (r) {
        snprintf(out, n, "%s", r);
        free(r);
        return true;
    }
    snprintf(out, n, "%s", path);
    const char *slash = strrchr(path, '/');
    const char *base = slash ? slash + 1 : path;
    if (err != ENOENT || !*base || strcmp(base, ".") == 0 || strcmp(base, "..") == 0)
        return false;
    char parent[PATH_CAP], rp[PATH_CAP];
    if (!slash)
        snprintf(parent, sizeof parent, ".");
    else if (slash == path)
        snprintf(parent, sizeof parent, "/");
    else
        snprintf(parent, sizeof parent, "%.*s", (int)(slash - path), path);
    if (!resolve(parent, rp, sizeof rp)) return false;
    int w = snprintf(out, n, "%s/%s", strcmp(rp, "/") == 0 ? "" : rp, base);
    return w > 0 && (size_t)w < n;
}

/* One path as the checks see it. */
typedef struct seen_path {
    char real[PATH_CAP];
    bool exists, dir;
    dev_t dev;
    ino_t ino;
} seen_path;

static void look(const char *path, seen_path *p) {
    struct stat st;
    resolve(path, p->real, sizeof p->real);
    p->exists = stat(path, &st) == 0;
    p->dir = p->exists && S_ISDIR(st.st_mode);
    p->dev = p->exists ? st.st_dev : 0;
    p->ino = p->exists ? st.st_ino : 0;
}

static bool same_file(const seen_path *a, const seen_path *b) {
    if (a->exists && b->exists) return a->dev == b->dev && a->ino == b->ino;
    return strcmp(a->real, b->real) == 0;
}

/* True when p is directly or deeply inside the folder dir (both resolved). */
static bool inside(const seen_path *p, const seen_path *dir) {
    size_t n = strlen(dir->real);
    return n > 0 && strncmp(p->real, dir->real, n) == 0 &&
           (p->real[n] == '/' || dir->real[n - 1] == '/');
}

static const char *base_name(const char *real) {
    const char *s = strrchr(real, '/');
    return s ? s + 1 : real;
}

/* The usage error for output o against input in (seen as op and ip), or OK. */
static int check_one(const char *cmd, const gp_cli_path *o, const seen_path *op,
                     const gp_cli_path *in, const seen_path *ip) {
    if (in->kind == GP_CLI_PATH_CKPT_DIR) {
        bool in_dir = inside(op, ip) && !strchr(op->real + strlen(ip->real) + 1, '/');
        if (in_dir && gp_cli_ckpt_is_name(base_name(op->real)))
            return gp_cli_usage_error(cmd, "%s %s is a checkpoint's name in %s %s: the run's "
                                           "checkpoints and this file would replace each other; "
                                           "give another path",
                                      o->option, o->path, in->option, in->path);
        return GP_CLI_EXIT_OK;
    }
    if (ip->dir && inside(op, ip))
        return gp_cli_usage_error(cmd, "%s %s is inside %s %s, a folder gpipe reads: give a path "
                                       "outside it",
                                  o->option, o->path, in->option, in->path);
    if (same_file(op, ip))
        return gp_cli_usage_error(cmd, "%s %s is the file that %s %s reads: writing it would "
                                       "replace that input; give another path",
                                  o->option, o->path, in->option, in->path);
    return GP_CLI_EXIT_OK;
}

int gp_cli_check_outputs(const char *cmd, const gp_cli_path *outs, int nout,
                         const gp_cli_path *ins, int nin) {
    seen_path *op = malloc(sizeof *op), *other = malloc(sizeof *other);
    int rc = GP_CLI_EXIT_OK;
    if (!op || !other) {
        fprintf(stderr, "gpipe %s: checking the output paths: out of host memory\n", cmd);
        rc = GP_CLI_EXIT_RUNTIME;
    }
    for (int i = 0; i < nout && rc == GP_CLI_EXIT_OK; i++) {
        if (!outs[i].path) continue;
        look(outs[i].path, op);
        for (int j = 0; j < i && rc == GP_CLI_EXIT_OK; j++) {
            if (!outs[j].path) continue;
            look(outs[j].path, other);
            if (same_file(op, other))
                rc = gp_cli_usage_error(cmd, "%s %s and %s %s are the same file: give each output "
                                             "its own path",
                                        outs[j].option, outs[j].path, outs[i].option,
                                        outs[i].path);
        }
        for (int j = 0; j < nin && rc == GP_CLI_EXIT_OK; j++) {
            if (!ins[j].path) continue;
            look(ins[j].path, other);
            rc = check_one(cmd, &outs[i], op, &ins[j], other);
        }
    }
    free(op);
    free(other);
    return rc;
}
