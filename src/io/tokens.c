/* Pre-tokenized training data: llm.c's token shards (a header of 256 int32, then uint16 ids) and
 * raw files of uint16 or uint32 ids, memory-mapped and checked whole before they are used (a bad
 * id is found at open, not in the middle of a run), and the language model's windows over any
 * such sequence of ids, bytes included. Ids are little-endian, as the files are written. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "core/error.h"
#include "core/read_file.h"

enum {
    LLMC_MAGIC = 20240520,
    LLMC_VERSION = 1,
    LLMC_HEADER_INTS = 256,
    LLMC_HEADER_BYTES = LLMC_HEADER_INTS * 4
};

const char *gp_token_format_name(gp_token_format f) {
    switch (f) {
    case GP_TOKENS_LLMC: return "llmc";
    case GP_TOKENS_U16: return "u16";
    case GP_TOKENS_U32: return "u32";
    }
    return "?";
}

static uint32_t token_at(const uint8_t *p, int width, int64_t i) {
    if (width == 1) return p[i];
    if (width == 2) {
        uint16_t v;
        memcpy(&v, p + 2 * i, 2);
        return v;
    }
    uint32_t v;
    memcpy(&v, p + 4 * i, 4);
    return v;
}

/* The first id not below vocab, as its index, or -1: one pass over the mapping. */
static int64_t first_bad(const uint8_t *p, int width, int64_t n, uint64_t vocab) {
    if (width == 2) {
        for (int64_t i = 0; i < n; i++)
            if (token_at(p, 2, i) >= vocab) return i;
    } else {
        for (int64_t i = 0; i < n; i++)
            if (token_at(p, 4, i) >= vocab) return i;
    }
    return -1;
}

/* Where the ids start and how many: the llm.c header checked against the file's size. */
static gp_status locate(const char *path, gp_token_format fmt, const uint8_t *map, uint64_t size,
                        int *width, uint64_t *offset, int64_t *n) {
    if (fmt == GP_TOKENS_U16 || fmt == GP_TOKENS_U32) {
        *width = fmt == GP_TOKENS_U16 ? 2 : 4;
        *offset = 0;
        if (size % (uint64_t)*width)
            return gp_error(GP_FORMAT, "%s: %llu bytes, not a whole number of uint%d token ids "
                            "(a partial id at byte offset %llu: truncated?)", path,
                            (unsigned long long)size, 8 * *width,
                            (unsigned long long)(size - size % (uint64_t)*width));
        *n = (int64_t)(size / (uint64_t)*width);
        return GP_OK;
    }
    if (size < LLMC_HEADER_BYTES)
        return gp_error(GP_FORMAT, "%s: %llu bytes, shorter than llm.c's header of %d bytes (256 "
                        "int32; truncated at byte offset %llu)", path, (unsigned long long)size,
                        LLMC_HEADER_BYTES, (unsigned long long)size);
    int32_t h[3];
    memcpy(h, map, sizeof h);
    if (h[0] != LLMC_MAGIC)
        return gp_error(GP_FORMAT, "%s: byte offset 0: magic %d, expected %d (an llm.c token "
                        "shard: 256 int32 of header, then uint16 token ids)", path, h[0],
                        LLMC_MAGIC);
    if (h[1] != LLMC_VERSION)
        return gp_error(GP_FORMAT, "%s: byte offset 4: version %d, expected %d (uint16 token ids)",
                        path, h[1], LLMC_VERSION);
    if (h[2] < 0)
        return gp_error(GP_FORMAT, "%s: byte offset 8: the header's token count is %d, expected "
                        ">= 0", path, h[2]);
    const uint64_t want = LLMC_HEADER_BYTES + 2 * (uint64_t)h[2];
    if (want > size)
        return gp_error(GP_FORMAT, "%s: byte offset 8: the header says %d tokens, %llu bytes in "
                        "all, but the file ends at byte offset %llu (truncated?)", path, h[2],
                        (unsigned long long)want, (unsigned long long)size);
    if (want < size)
        return gp_error(GP_FORMAT, "%s: byte offset 8: the header says %d tokens, %llu bytes in "
                        "all, but the file has %llu more bytes from byte offset %llu", path, h[2],
                        (unsigned long long)want, (unsigned long long)(size - want),
                        (unsigned long long)want);
    *width = 2;
    *offset = LLMC_HEADER_BYTES;
    *n = h[2];
    return GP_OK;
}

gp_status gp_tokens_open(const char *path, gp_token_format fmt, uint64_t vocab,
                         gp_token_shard *out) {
    if (!out) return gp_error(GP_INVALID_ARGUMENT, "gp_tokens_open: out is NULL");
    memset(out, 0, sizeof *out);
    if (!path) return gp_error(GP_INVALID_ARGUMENT, "gp_tokens_open: path is NULL");
    if (fmt != GP_TOKENS_LLMC && fmt != GP_TOKENS_U16 && fmt != GP_TOKENS_U32)
        return gp_error(GP_INVALID_ARGUMENT, "gp_tokens_open: %s: format %d, expected "
                        "GP_TOKENS_LLMC, GP_TOKENS_U16 or GP_TOKENS_U32", path, (int)fmt);
    if (vocab < 1 || vocab > (uint64_t)INT32_MAX + 1) /* ids become int32 inputs and labels */
        return gp_error(GP_INVALID_ARGUMENT, "gp_tokens_open: %s: vocabulary %llu, expected 1 to "
                        "2^31", path, (unsigned long long)vocab);
    int fd;
    uint64_t size;
    GP_TRY(gp_open_regular(path, &fd, &size));
    if (size == 0) {
        close(fd);
        return gp_error(GP_FORMAT, "%s: empty (expected %s token ids)", path,
                        gp_token_format_name(fmt));
    }
    /* Read-only and shared: the pages are the file's, read as the windows touch them. */
    void *map = mmap(NULL, (size_t)size, PROT_READ, MAP_SHARED, fd, 0);
    int err = errno;
    close(fd);
    if (map == MAP_FAILED)
        return gp_error(GP_IO, "%s: cannot map %llu bytes: %s", path, (unsigned long long)size,
                        strerror(err));
    int width = 0;
    uint64_t offset = 0;
    int64_t n = 0;
    gp_status s = locate(path, fmt, map, size, &width, &offset, &n);
    if (s == GP_OK && n == 0)
        s = gp_error(GP_FORMAT, "%s: no token ids after the %llu-byte header", path,
                     (unsigned long long)offset);
    const uint8_t *ids = (const uint8_t *)map + offset;
    int64_t bad = s == GP_OK ? first_bad(ids, width, n, vocab) : -1;
    if (bad >= 0)
        s = gp_error(GP_FORMAT, "%s: byte offset %llu: token id %u (token %lld of the file) is "
                     "not below the vocabulary of %llu", path,
                     (unsigned long long)(offset + (uint64_t)bad * (uint64_t)width),
                     token_at(ids, width, bad), (long long)bad, (unsigned long long)vocab);
    if (s != GP_OK) {
        munmap(map, (size_t)size);
        return s;
    }
    out->ids = ids;
    out->ntokens = n;
    out->width = width;
    out->offset = offset;
    out->map = map;
    out->map_size = (size_t)size;
    return GP_OK;
}

void gp_tokens_close(gp_token_shard *s) {
    if (!s) return;
    if (s->map) munmap(s->map, s->map_size);
    memset(s, 0, sizeof *s);
}

gp_status gp_tokens_batch(const void *ids, int width, int64_t n, const int64_t *starts,
                          int64_t batch, int seq_len, gp_tensor *x, gp_tensor *y) {
    if (!ids || !starts || !x || !y || !x->data || !y->data)
        return gp_error(GP_INVALID_ARGUMENT, "gp_tokens_batch: NULL ids, starts or tensor");
    if (width != 1 && width != 2 && width != 4)
        return gp_error(GP_INVALID_ARGUMENT, "gp_tokens_batch: ids of %d bytes, expected 1, 2 "
                        "or 4", width);
    if (batch < 1 || seq_len < 1)
        return gp_error(GP_INVALID_ARGUMENT, "gp_tokens_batch: batch %lld, seq_len %d: expected "
                        ">= 1", (long long)batch, seq_len);
    if (n < (int64_t)seq_len + 1)
        return gp_error(GP_INVALID_ARGUMENT, "gp_tokens_batch: %lld tokens, expected at least "
                        "seq_len + 1 = %d", (long long)n, seq_len + 1);
    gp_shape want = gp_shape2(batch, seq_len);
    const gp_tensor *t[2] = {x, y};
    for (int i = 0; i < 2; i++)
        if (t[i]->dtype != GP_I32 || !gp_shape_equal(&t[i]->shape, &want)) {
            char g[64], w[64];
            return gp_error(GP_SHAPE, "gp_tokens_batch: %s is %s %s, expected int32 %s",
                            i ? "y" : "x", gp_dtype_name(t[i]->dtype),
                            gp_shape_str(&t[i]->shape, g, sizeof g),
                            gp_shape_str(&want, w, sizeof w));
        }
    int64_t last = n - seq_len - 1;
    for (int64_t b = 0; b < batch; b++)
        if (starts[b] < 0 || starts[b] > last)
            return gp_error(GP_INVALID_ARGUMENT, "gp_tokens_batch: starts[%lld] = %lld, expected "
                            "0 to n - seq_len - 1 = %lld", (long long)b, (long long)starts[b],
                            (long long)last);
    int32_t *xd = gp_tensor_host_data(x), *yd = gp_tensor_host_data(y);
    if (!xd || !yd)
        return gp_error(GP_INVALID_ARGUMENT,
                        "gp_tokens_batch: x and y must be in host memory (a CPU device or a "
                        "view); x is on %s, y on %s",
                        gp_device_name(x->dev), gp_device_name(y->dev));
    const uint8_t *p = ids;
    for (int64_t b = 0; b < batch; b++) {
        int32_t *xr = xd + b * seq_len, *yr = yd + b * seq_len; // (B, T)
        for (int i = 0; i < seq_len; i++) {
            /* an id of 2^31 or more would be a negative label: callers check ids at open */
            xr[i] = (int32_t)token_at(p, width, starts[b] + i);
            yr[i] = (int32_t)token_at(p, width, starts[b] + i + 1);
        }
    }
    return GP_OK;
}
