/* IDX datasets (MNIST / Fashion-MNIST): an images file and a labels file,
 * gzip-compressed or plain (zlib's gzread reads both), checked against their
 * headers before anything is trusted, and turned into normalized batches. */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include "core/error.h"
#include "core/read_file.h"

#define IDX_MAGIC_IMAGES 0x00000803u /* unsigned bytes, 3 dimensions */
#define IDX_MAGIC_LABELS 0x00000801u /* unsigned bytes, 1 dimension */
/* Generous bounds that still reject headers no real dataset has: they keep a
 * corrupt count from turning into an absurd allocation or an int overflow. */
#define IDX_MAX_EXAMPLES 100000000LL
#define IDX_MAX_SIDE 4096
/* The buffer grows as bytes arrive, so a short file whose header promises
 * gigabytes fails on the missing bytes, not on the allocation. */
#define IDX_CHUNK (1 << 20)

typedef struct idx_file {
    gzFile gz;
    const char *path;
} idx_file;

static gp_status idx_open(idx_file *f, const char *path) {
    f->path = path;
    f->gz = NULL;
    struct stat st;
    if (stat(path, &st) != 0) return gp_error(GP_IO, "%s: cannot open: no such file", path);
    int fd; /* checked on the descriptor: a file swapped for a FIFO is refused, not waited on */
    uint64_t nbytes;
    GP_TRY(gp_open_regular(path, &fd, &nbytes));
    f->gz = gzdopen(fd, "rb");
    if (!f->gz) {
        close(fd);
        return gp_error(GP_IO, "%s: cannot open for reading", path);
    }
    return GP_OK;
}

static void idx_close(idx_file *f) {
    if (f->gz) gzclose(f->gz);
    f->gz = NULL;
}

/* Reads up to nbytes; *got says how many arrived before the end of the data. */
static gp_status idx_read(idx_file *f, void *buf, size_t nbytes, size_t *got) {
    size_t done = 0;
    *got = 0;
    while (done < nbytes) {
        size_t want = nbytes - done;
        unsigned req = want > (1u << 30) ? (1u << 30) : (unsigned)want;
        int r = gzread(f->gz, (unsigned char *)buf + done, req);
        if (r < 0) {
            int code;
            const char *msg = gzerror(f->gz, &code);
            return gp_error(GP_IO, "%s: read error after %zu bytes: %s", f->path, done,
                            msg ? msg : "unknown zlib error");
        }
        if (r == 0) break;
        done += (size_t)r;
    }
    *got = done;
    return GP_OK;
}

static uint32_t be32(const unsigned char *p) {
    return ((uint32_t)p[0] << 24) | ((uint32_t)p[1] << 16) | ((uint32_t)p[2] << 8) | p[3];
}

/* Reads the header words (magic, then ndim sizes). */
static gp_status idx_header(idx_file *f, uint32_t want_magic, const char *what, int ndim,
                            uint32_t *dims) {
    unsigned char hdr[16];
    size_t nbytes = 4 * (size_t)(1 + ndim), got;
    GP_TRY(idx_read(f, hdr, nbytes, &got));
    if (got == 0)
        return gp_error(GP_FORMAT, "%s: empty file, expected an IDX %s file (magic 0x%08x)",
                        f->path, what, (unsigned)want_magic);
    if (got < 4)
        return gp_error(GP_FORMAT, "%s: truncated header: %zu bytes, expected at least %zu for an "
                        "IDX %s file", f->path, got, nbytes, what);
    uint32_t magic = be32(hdr);
    if (magic != want_magic)
        return gp_error(GP_FORMAT, "%s: wrong magic 0x%08x, expected 0x%08x (IDX %s: unsigned "
                        "bytes, %d dimension%s)", f->path, (unsigned)magic, (unsigned)want_magic,
                        what, ndim, ndim == 1 ? "" : "s");
    if (got < nbytes)
        return gp_error(GP_FORMAT, "%s: truncated header: %zu bytes, expected %zu", f->path, got,
                        nbytes);
    for (int i = 0; i < ndim; i++) dims[i] = be32(hdr + 4 + 4 * i);
    return GP_OK;
}

/* Reads exactly nbytes of payload into a new buffer and checks nothing follows. */
static gp_status idx_payload(idx_file *f, size_t nbytes, uint8_t **out) {
    *out = NULL;
    size_t cap = 0, done = 0;
    uint8_t *buf = NULL;
    while (done < nbytes) {
        if (done == cap) {
            size_t grow = cap < IDX_CHUNK ? IDX_CHUNK : cap;
            cap = (nbytes - cap < grow) ? nbytes : cap + grow;
            uint8_t *nb = realloc(buf, cap);
            if (!nb) {
                free(buf);
                return gp_error(GP_OUT_OF_MEMORY, "%s: cannot allocate %zu bytes for the data",
                                f->path, cap);
            }
            buf = nb;
        }
        size_t got;
        gp_status s = idx_read(f, buf + done, cap - done, &got);
        if (s != GP_OK) {
            free(buf);
            return s;
        }
        done += got;
        if (done < cap) {
            free(buf);
            return gp_error(GP_FORMAT, "%s: truncated: %zu data bytes after the header, expected "
                            "%zu", f->path, done, nbytes);
        }
    }
    unsigned char extra;
    size_t got;
    gp_status s = idx_read(f, &extra, 1, &got);
    if (s == GP_OK && got != 0)
        s = gp_error(GP_FORMAT, "%s: trailing bytes after the %zu data bytes the header promises",
                     f->path, nbytes);
    if (s != GP_OK) {
        free(buf);
        return s;
    }
    if (!buf) buf = malloc(1); /* nbytes == 0 cannot happen (n >= 1); keep out non-NULL */
    *out = buf;
    return buf ? GP_OK : gp_error(GP_OUT_OF_MEMORY, "%s: out of memory", f->path);
}

static gp_status check_count(const char *path, const char *what, uint32_t v, long long max) {
    if (v == 0 || (long long)v > max)
        return gp_error(GP_FORMAT, "%s: %s is %u, expected 1 to %lld", path, what, (unsigned)v,
                        max);
    return GP_OK;
}

static gp_status load_images(const char *path, gp_idx_dataset *d) {
    idx_file f;
    GP_TRY(idx_open(&f, path));
    uint32_t dims[3] = {0, 0, 0};
    gp_status s = idx_header(&f, IDX_MAGIC_IMAGES, "images", 3, dims);
    if (s == GP_OK) s = check_count(path, "the image count", dims[0], IDX_MAX_EXAMPLES);
    if (s == GP_OK) s = check_count(path, "the row count", dims[1], IDX_MAX_SIDE);
    if (s == GP_OK) s = check_count(path, "the column count", dims[2], IDX_MAX_SIDE);
    if (s == GP_OK) {
        d->n = dims[0];
        d->rows = (int)dims[1];
        d->cols = (int)dims[2];
        s = idx_payload(&f, (size_t)d->n * (size_t)d->rows * (size_t)d->cols, &d->images);
    }
    idx_close(&f);
    return s;
}

static gp_status load_labels(const char *path, int64_t *n, uint8_t **labels) {
    idx_file f;
    GP_TRY(idx_open(&f, path));
    uint32_t dims[1] = {0};
    gp_status s = idx_header(&f, IDX_MAGIC_LABELS, "labels", 1, dims);
    if (s == GP_OK) s = check_count(path, "the label count", dims[0], IDX_MAX_EXAMPLES);
    if (s == GP_OK) {
        *n = dims[0];
        s = idx_payload(&f, (size_t)*n, labels);
    }
    idx_close(&f);
    return s;
}

gp_status gp_idx_load(const char *images_path, const char *labels_path, gp_idx_dataset *out) {
    if (!out) return gp_error(GP_INVALID_ARGUMENT, "gp_idx_load: out is NULL");
    memset(out, 0, sizeof *out);
    if (!images_path || !labels_path)
        return gp_error(GP_INVALID_ARGUMENT, "gp_idx_load: %s path is NULL",
                        images_path ? "labels" : "images");
    gp_idx_dataset d = {0};
    int64_t nlabels = 0;
    gp_status s = load_images(images_path, &d);
    if (s == GP_OK) s = load_labels(labels_path, &nlabels, &d.labels);
    if (s == GP_OK && nlabels != d.n)
        s = gp_error(GP_FORMAT, "%s has %lld labels but %s has %lld images: expected equal "
                     "counts", labels_path, (long long)nlabels, images_path, (long long)d.n);
    if (s != GP_OK) {
        gp_idx_free(&d);
        return s;
    }
    *out = d;
    return GP_OK;
}

static bool file_exists(const char *path) {
    struct stat st;
    return stat(path, &st) == 0;
}

/* dir/<split>-<kind>-ubyte.gz if present, else the plain name. */
static gp_status find_file(const char *dir, const char *split, const char *kind, char *buf,
                           size_t nbytes) {
    int w = snprintf(buf, nbytes, "%s/%s-%s-ubyte.gz", dir, split, kind);
    if (w < 0 || (size_t)w >= nbytes)
        return gp_error(GP_INVALID_ARGUMENT, "gp_idx_load_dir: directory name too long: %s", dir);
    if (file_exists(buf)) return GP_OK;
    buf[w - 3] = '\0';
    if (file_exists(buf)) return GP_OK;
    return gp_error(GP_IO, "%s: no %s file: neither %s.gz nor %s exists", dir, kind, buf, buf);
}

gp_status gp_idx_load_dir(const char *dir, const char *split, gp_idx_dataset *out) {
    if (!out) return gp_error(GP_INVALID_ARGUMENT, "gp_idx_load_dir: out is NULL");
    memset(out, 0, sizeof *out);
    if (!dir) return gp_error(GP_INVALID_ARGUMENT, "gp_idx_load_dir: dir is NULL");
    if (!split || (strcmp(split, "train") != 0 && strcmp(split, "t10k") != 0))
        return gp_error(GP_INVALID_ARGUMENT, "gp_idx_load_dir: split \"%s\": expected \"train\" "
                        "or \"t10k\"", split ? split : "(null)");
    char images[4096], labels[4096];
    GP_TRY(find_file(dir, split, "images-idx3", images, sizeof images));
    GP_TRY(find_file(dir, split, "labels-idx1", labels, sizeof labels));
    return gp_idx_load(images, labels, out);
}

void gp_idx_free(gp_idx_dataset *d) {
    if (!d) return;
    free(d->images);
    free(d->labels);
    memset(d, 0, sizeof *d);
}

gp_status gp_idx_batch(const gp_idx_dataset *d, const int64_t *idx, int64_t batch, float mean,
                       float std, gp_tensor *x, gp_tensor *y) {
    char got[64];
    if (!d || !d->images || !d->labels || !x || !y || (batch > 0 && !idx))
        return gp_error(GP_INVALID_ARGUMENT, "gp_idx_batch: NULL dataset, indices or tensor");
    if (batch < 1) return gp_error(GP_INVALID_ARGUMENT, "gp_idx_batch: batch %lld, expected >= 1",
                                   (long long)batch);
    if (!(std > 0.0f) || !isfinite(std) || !isfinite(mean))
        return gp_error(GP_INVALID_ARGUMENT, "gp_idx_batch: mean %g, std %g: expected finite "
                        "values and std > 0", (double)mean, (double)std);
    gp_shape xs = gp_shape4(batch, 1, d->rows, d->cols), ys = gp_shape1(batch);
    if (x->dtype != GP_F32 || !gp_shape_equal(&x->shape, &xs) || !x->data) {
        char want[64];
        return gp_error(GP_SHAPE, "gp_idx_batch: x is %s %s, expected float32 %s",
                        gp_dtype_name(x->dtype), gp_shape_str(&x->shape, got, sizeof got),
                        gp_shape_str(&xs, want, sizeof want));
    }
    if (y->dtype != GP_I32 || !gp_shape_equal(&y->shape, &ys) || !y->data) {
        char want[64];
        return gp_error(GP_SHAPE, "gp_idx_batch: y is %s %s, expected int32 %s",
                        gp_dtype_name(y->dtype), gp_shape_str(&y->shape, got, sizeof got),
                        gp_shape_str(&ys, want, sizeof want));
    }
    for (int64_t b = 0; b < batch; b++)
        if (idx[b] < 0 || idx[b] >= d->n)
            return gp_error(GP_INVALID_ARGUMENT, "gp_idx_batch: idx[%lld] = %lld, expected 0 to "
                            "%lld", (long long)b, (long long)idx[b], (long long)d->n - 1);
    float lut[256];
    for (int v = 0; v < 256; v++) lut[v] = ((float)v / 255.0f - mean) / std;
    size_t npix = (size_t)d->rows * (size_t)d->cols;
    float *xd = gp_tensor_host_data(x);
    int32_t *yl = gp_tensor_host_data(y);
    if (!xd || !yl)
        return gp_error(GP_INVALID_ARGUMENT,
                        "gp_idx_batch: x and y must be in host memory (a CPU device or a view); "
                        "x is on %s, y on %s",
                        gp_device_name(x->dev), gp_device_name(y->dev));
    for (int64_t b = 0; b < batch; b++) {
        const uint8_t *src = d->images + (size_t)idx[b] * npix;
        float *dst = xd + (size_t)b * npix; // (B, 1, rows, cols)
        for (size_t i = 0; i < npix; i++) dst[i] = lut[src[i]];
        yl[b] = d->labels[idx[b]];
    }
    return GP_OK;
}
