/* A byte-level text corpus from fortune files: a file or a directory tree
 * read in a fixed (name-sorted) order, each real file once, entries split at
 * "%" lines and dealt to train/validation by a global entry counter. */
#include <dirent.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/error.h"
#include "core/read_file.h"

#define TEXT_MAX_DEPTH 64

typedef struct text_buf {
    uint8_t *p;
    size_t n, cap;
} text_buf;

typedef struct file_id {
    dev_t dev;
    ino_t ino;
} file_id;

typedef struct text_loader {
    text_buf train, valid;
    int valid_every;
    int64_t entries; /* global counter: decides the split */
    int nfiles;
    file_id *seen; /* files and directories already read: symlinks and hard links repeat them */
    size_t nseen, capseen;
} text_loader;

static gp_status buf_put(text_buf *b, const uint8_t *src, size_t n) {
    if (b->n + n > b->cap) {
        size_t cap = b->cap ? b->cap : 1 << 16;
        while (cap < b->n + n) cap *= 2;
        uint8_t *p = realloc(b->p, cap);
        if (!p) return gp_error(GP_OUT_OF_MEMORY, "gp_text_load: cannot grow a buffer to %zu "
                                "bytes", cap);
        b->p = p;
        b->cap = cap;
    }
    memcpy(b->p + b->n, src, n);
    b->n += n;
    return GP_OK;
}

/* true if (dev, ino) was seen before; otherwise records it. */
static gp_status seen_before(text_loader *L, const struct stat *st, bool *seen) {
    for (size_t i = 0; i < L->nseen; i++)
        if (L->seen[i].dev == st->st_dev && L->seen[i].ino == st->st_ino) {
            *seen = true;
            return GP_OK;
        }
    *seen = false;
    if (L->nseen == L->capseen) {
        size_t cap = L->capseen ? 2 * L->capseen : 256;
        file_id *p = realloc(L->seen, cap * sizeof *p);
        if (!p) return gp_error(GP_OUT_OF_MEMORY, "gp_text_load: out of memory");
        L->seen = p;
        L->capseen = cap;
    }
    L->seen[L->nseen++] = (file_id){st->st_dev, st->st_ino};
    return GP_OK;
}

static bool all_space(const uint8_t *p, size_t n) {
    for (size_t i = 0; i < n; i++)
        if (p[i] != ' ' && p[i] != '\t' && p[i] != '\n' && p[i] != '\r' && p[i] != '\f' &&
            p[i] != '\v')
            return false;
    return true;
}

/* One entry: its lines (each ending in a newline), then a newline that marks
 * the end of the entry. Blank entries are not counted. */
static gp_status add_entry(text_loader *L, const uint8_t *p, size_t n) {
    if (all_space(p, n)) return GP_OK;
    int64_t k = L->entries++;
    bool valid = L->valid_every > 0 && k % L->valid_every == L->valid_every - 1;
    text_buf *b = valid ? &L->valid : &L->train;
    static const uint8_t nl[2] = {'\n', '\n'};
    GP_TRY(buf_put(b, p, n));
    return buf_put(b, nl, p[n - 1] == '\n' ? 1 : 2);
}

static bool is_separator(const uint8_t *line, size_t n) {
    return (n == 1 && line[0] == '%') || (n == 2 && line[0] == '%' && line[1] == '\r');
}

static gp_status parse_entries(text_loader *L, const uint8_t *p, size_t n) {
    size_t start = 0, ls = 0;
    while (ls < n) {
        const uint8_t *nl = memchr(p + ls, '\n', n - ls);
        size_t le = nl ? (size_t)(nl - p) : n;
        if (is_separator(p + ls, le - ls)) {
            GP_TRY(add_entry(L, p + start, ls - start));
            start = le + 1 < n ? le + 1 : n;
        }
        ls = le + 1;
    }
    if (start < n) GP_TRY(add_entry(L, p + start, n - start));
    return GP_OK;
}

static gp_status read_file(text_loader *L, const char *path) {
    int fd; /* checked on the descriptor: a file swapped for a FIFO is refused, not waited on */
    uint64_t nbytes;
    GP_TRY(gp_open_regular(path, &fd, &nbytes));
    FILE *f = fdopen(fd, "rb");
    if (!f) {
        close(fd);
        return gp_error(GP_IO, "%s: cannot open: %s", path, strerror(errno));
    }
    text_buf b = {0};
    gp_status s = GP_OK;
    uint8_t chunk[1 << 15];
    for (;;) {
        size_t r = fread(chunk, 1, sizeof chunk, f);
        if (r) s = buf_put(&b, chunk, r);
        if (s != GP_OK || r < sizeof chunk) break;
    }
    if (s == GP_OK && ferror(f)) s = gp_error(GP_IO, "%s: read error", path);
    fclose(f);
    if (s == GP_OK) {
        L->nfiles++;
        s = parse_entries(L, b.p, b.n);
    }
    free(b.p);
    if (s != GP_OK && s != GP_IO) return gp_error_context(s, "%s", path);
    return s;
}

static int cmp_names(const void *a, const void *b) {
    return strcmp(*(const char *const *)a, *(const char *const *)b);
}

static bool ends_with(const char *s, const char *suffix) {
    size_t n = strlen(s), m = strlen(suffix);
    return n >= m && strcmp(s + n - m, suffix) == 0;
}

static gp_status walk_dir(text_loader *L, const char *dir, int depth);

/* One directory entry: a directory (not "off", the offensive fortunes) is
 * walked, a regular file read; links to what was read already, dangling links
 * and other kinds of files are passed over. */
static gp_status visit(text_loader *L, const char *dir, const char *name, int depth) {
    if (name[0] == '.' || ends_with(name, ".dat")) return GP_OK;
    size_t len = strlen(dir) + strlen(name) + 2;
    char *path = malloc(len);
    if (!path) return gp_error(GP_OUT_OF_MEMORY, "gp_text_load: out of memory");
    snprintf(path, len, "%s/%s", dir, name);
    struct stat st;
    gp_status s = GP_OK;
    bool seen = false;
    if (stat(path, &st) != 0) {
        /* dangling symlink or vanished entry: nothing to read */
    } else if (S_ISDIR(st.st_mode)) {
        if (strcmp(name, "off") != 0) {
            s = seen_before(L, &st, &seen);
            if (s == GP_OK && !seen) s = walk_dir(L, path, depth + 1);
        }
    } else if (S_ISREG(st.st_mode)) {
        s = seen_before(L, &st, &seen);
        if (s == GP_OK && !seen) s = read_file(L, path);
    }
    free(path);
    return s;
}

static gp_status walk_dir(text_loader *L, const char *dir, int depth) {
    if (depth > TEXT_MAX_DEPTH)
        return gp_error(GP_IO, "%s: directories nested more than %d deep", dir, TEXT_MAX_DEPTH);
    DIR *d = opendir(dir);
    if (!d) return gp_error(GP_IO, "%s: cannot open directory: %s", dir, strerror(errno));
    char **names = NULL;
    size_t n = 0, cap = 0;
    gp_status s = GP_OK;
    struct dirent *e;
    while (s == GP_OK && (errno = 0, e = readdir(d)) != NULL) {
        if (n == cap) {
            cap = cap ? 2 * cap : 64;
            char **p = realloc(names, cap * sizeof *p);
            if (!p) {
                s = gp_error(GP_OUT_OF_MEMORY, "%s: out of memory listing the directory", dir);
                break;
            }
            names = p;
        }
        names[n] = malloc(strlen(e->d_name) + 1);
        if (!names[n]) {
            s = gp_error(GP_OUT_OF_MEMORY, "%s: out of memory listing the directory", dir);
            break;
        }
        strcpy(names[n++], e->d_name);
    }
    if (s == GP_OK && errno != 0)
        s = gp_error(GP_IO, "%s: cannot list the directory: %s", dir, strerror(errno));
    closedir(d);
    /* readdir's order depends on the file system; names sorted bytewise do not */
    if (s == GP_OK && n > 1) qsort(names, n, sizeof *names, cmp_names);
    for (size_t i = 0; i < n && s == GP_OK; i++) s = visit(L, dir, names[i], depth);
    for (size_t i = 0; i < n; i++) free(names[i]);
    free(names);
    return s;
}

gp_status gp_text_load(const char *path, int valid_every, gp_text_corpus *out) {
    if (!out) return gp_error(GP_INVALID_ARGUMENT, "gp_text_load: out is NULL");
    memset(out, 0, sizeof *out);
    if (!path) return gp_error(GP_INVALID_ARGUMENT, "gp_text_load: path is NULL");
    if (valid_every < 0 || valid_every == 1)
        return gp_error(GP_INVALID_ARGUMENT, "gp_text_load: %s: valid_every = %d, expected 0 (no "
                        "validation split) or >= 2", path, valid_every);
    struct stat st;
    if (stat(path, &st) != 0)
        return gp_error(GP_IO, "%s: cannot open: %s", path, strerror(errno));
    if (!S_ISDIR(st.st_mode) && !S_ISREG(st.st_mode))
        return gp_error(GP_IO, "%s: not a regular file or a directory", path);
    text_loader L = {.valid_every = valid_every};
    bool seen;
    gp_status s = seen_before(&L, &st, &seen);
    if (s == GP_OK) s = S_ISDIR(st.st_mode) ? walk_dir(&L, path, 0) : read_file(&L, path);
    if (s == GP_OK && L.entries == 0)
        s = gp_error(GP_FORMAT, "%s: no text entries found in %d file%s read (expected text with "
                     "entries separated by \"%%\" lines)", path, L.nfiles,
                     L.nfiles == 1 ? "" : "s");
    free(L.seen);
    if (s != GP_OK) {
        free(L.train.p);
        free(L.valid.p);
        return s;
    }
    out->train = L.train.p;
    out->ntrain = (int64_t)L.train.n;
    out->valid = L.valid.p;
    out->nvalid = (int64_t)L.valid.n;
    out->nfiles = L.nfiles;
    return GP_OK;
}

void gp_text_free(gp_text_corpus *c) {
    if (!c) return;
    free(c->train);
    free(c->valid);
    memset(c, 0, sizeof *c);
}

/* The windows of a sequence of 1-byte ids (tokens.c). */
gp_status gp_text_batch(const uint8_t *bytes, int64_t n, const int64_t *starts, int64_t batch,
                        int seq_len, gp_tensor *x, gp_tensor *y) {
    return gp_tokens_batch(bytes, 1, n, starts, batch, seq_len, x, y);
}
