/* The safetensors reader and writer: a round trip of F32 and I32 tensors with metadata and
 * CRC-32s; then hostile files, each refused with GP_FORMAT and a message naming the file and the
 * tensor or offset: every truncation, every flipped byte of the data (CRC) and of the header
 * (never a crash), a header length past the end or over the limit, malformed JSON, overlapping,
 * out-of-range and gapped offsets, wrong dtypes and shapes, duplicate names, bad metadata. A
 * file is read header first and its tensors only when asked for (a damaged tensor fails its own
 * read, a sparse file promising gigabytes costs nothing, a FIFO is refused). A failed write
 * leaves no file and never replaces a good one. */
#include <errno.h>
#include <stdint.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include "testutil.h"

static const char *ORIGIN = "mem.safetensors";

/* A file image: the 8-byte length, the header text, then `ndata` data bytes of value 0x41. */
static size_t image(unsigned char *buf, size_t cap, const char *header, size_t ndata) {
    size_t n = strlen(header);
    if (8 + n + ndata > cap) abort();
    for (int b = 0; b < 8; b++) buf[b] = (unsigned char)((uint64_t)n >> (8 * b));
    memcpy(buf + 8, header, n);
    memset(buf + 8 + n, 0x41, ndata);
    return 8 + n + ndata;
}

static void expect_bad(const char *header, size_t ndata, const char *needle) {
    unsigned char buf[1024];
    size_t n = image(buf, sizeof buf, header, ndata);
    gp_safetensors *f = NULL;
    gp_status s = gp_safetensors_parse(buf, n, ORIGIN, &f);
    CHECK(f == NULL);
    gp_test_check_fails_(s, GP_FORMAT, needle, header, __FILE__, __LINE__);
    if (s == GP_FORMAT && !strstr(gp_last_error(), ORIGIN)) {
        fprintf(stderr, "message does not name the file: %s\n", gp_last_error());
        gp_test_failures++;
    }
}

static void test_round_trip(const char *path) {
    float a[6] = {1.5f, -2.0f, 3.25f, 0.0f, -0.0f, 1e-30f};
    int32_t b[3] = {7, -1, 2147483647};
    gp_safetensors_writer *w;
    REQUIRE_OK(gp_safetensors_writer_new(&w));
    REQUIRE_OK(gp_safetensors_writer_add(w, "b.ints", GP_I32, gp_shape1(3), b));
    REQUIRE_OK(gp_safetensors_writer_add(w, "a.floats", GP_F32, gp_shape2(2, 3), a));
    REQUIRE_OK(gp_safetensors_writer_add(w, "empty", GP_F32, gp_shape2(0, 5), NULL));
    CHECK_FAILS(gp_safetensors_writer_add(w, "a.floats", GP_F32, gp_shape1(1), a),
                GP_INVALID_ARGUMENT, "added twice");
    CHECK_FAILS(gp_safetensors_writer_meta(w, "crc32:x", "0"), GP_INVALID_ARGUMENT, "reserved");
    REQUIRE_OK(gp_safetensors_writer_meta(w, "note", "x \"quoted\" \xc3\xa9"));
    REQUIRE_OK(gp_safetensors_writer_meta(w, "note", "replaced"));
    REQUIRE_OK(gp_safetensors_writer_write(w, path));
    gp_safetensors_writer_free(w);

    gp_safetensors *f;
    REQUIRE_OK(gp_safetensors_read(path, &f));
    CHECK_EQ_INT(gp_safetensors_count(f), 3);
    CHECK(strcmp(gp_safetensors_meta(f, "note"), "replaced") == 0);
    CHECK(gp_safetensors_meta(f, "crc32:a.floats") != NULL);
    CHECK(gp_safetensors_meta(f, "absent") == NULL);
    const gp_st_entry *e = gp_safetensors_find(f, "a.floats");
    CHECK(e && e->dtype == GP_F32 && e->shape.ndim == 2 && e->shape.dim[1] == 3);
    CHECK(e && e->end - e->begin == 24);
    float ga[6];
    int32_t gb[3];
    gp_shape s23 = gp_shape2(2, 3), s3 = gp_shape1(3), s6 = gp_shape1(6);
    CHECK_OK(gp_safetensors_get(f, "a.floats", GP_F32, &s23, ga));
    CHECK(memcmp(ga, a, sizeof a) == 0);
    CHECK_OK(gp_safetensors_get(f, "b.ints", GP_I32, &s3, gb));
    CHECK(memcmp(gb, b, sizeof b) == 0);
    CHECK_FAILS(gp_safetensors_get(f, "b.ints", GP_F32, NULL, ga), GP_FORMAT, "is I32, expected F32");
    CHECK_FAILS(gp_safetensors_get(f, "a.floats", GP_F32, &s6, ga), GP_SHAPE, "has shape (2, 3)");
    CHECK_FAILS(gp_safetensors_get(f, "nope", GP_F32, NULL, ga), GP_FORMAT, "no tensor \"nope\"");
    gp_safetensors_free(f);

    /* The file is little-endian with the header padded to 8 bytes. */
    FILE *fp = fopen(path, "rb");
    unsigned char head[8];
    CHECK(fp && fread(head, 1, 8, fp) == 8);
    if (fp) fclose(fp);
    CHECK(head[0] % 8 == 0 && head[7] == 0);
}

/* Every truncation and every single-byte flip of a real file: an error or (header flips that
 * keep it consistent) a success, never a crash; flips in the data always fail the CRC. */
static void test_corruptions(const char *path) {
    FILE *fp = fopen(path, "rb");
    REQUIRE_OK(fp ? GP_OK : gp_error(GP_IO, "%s: %s", path, strerror(errno)));
    unsigned char buf[4096];
    size_t n = fread(buf, 1, sizeof buf, fp);
    fclose(fp);
    CHECK(n > 100 && n < sizeof buf);
    uint64_t nheader = 0;
    for (int i = 7; i >= 0; i--) nheader = nheader << 8 | buf[i];
    int refused = 0;
    for (size_t len = 0; len < n; len++) {
        gp_safetensors *f = NULL;
        gp_status s = gp_safetensors_parse(buf, len, ORIGIN, &f);
        refused += s == GP_FORMAT;
        gp_safetensors_free(f);
    }
    CHECK_EQ_INT(refused, (long long)n); /* every truncation is refused */
    int data_caught = 0, header_caught = 0;
    for (size_t i = 0; i < n; i++) {
        unsigned char save = buf[i];
        buf[i] ^= 0x10;
        gp_safetensors *f = NULL;
        gp_status s = gp_safetensors_parse(buf, n, ORIGIN, &f);
        if (i >= 8 + nheader) {
            data_caught += s == GP_FORMAT && strstr(gp_last_error(), "CRC-32") != NULL;
        } else {
            header_caught += s != GP_OK;
            CHECK(s == GP_OK || s == GP_FORMAT);
        }
        gp_safetensors_free(f);
        buf[i] = save;
    }
    CHECK_EQ_INT(data_caught, (long long)(n - 8 - nheader));
    /* Most header flips are caught; a flip in a metadata value's text may not be. */
    CHECK(header_caught > (int)(8 + nheader) * 3 / 4);
    printf("corruptions: %zu truncations and %llu data flips refused, %d of %llu header flips\n",
           n, (unsigned long long)(n - 8 - nheader), header_caught,
           (unsigned long long)(8 + nheader));
}

static void test_hostile(void) {
    const char *T = "{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}";
    char h[512];
    /* The good one passes. */
    unsigned char buf[1024];
    snprintf(h, sizeof h, "%s}", T);
    size_t n = image(buf, sizeof buf, h, 8);
    gp_safetensors *f;
    CHECK_OK(gp_safetensors_parse(buf, n, ORIGIN, &f));
    gp_safetensors_free(f);

    expect_bad(h, 12, "but 12 follow the header"); /* trailing bytes */
    expect_bad(h, 4, "end past the 4 data bytes of the file (truncated?)");
    expect_bad("{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,12]}}", 8,
               "tensor \"a\": data_offsets [0, 12] end past the 8 data bytes");
    expect_bad("{\"a\":{\"dtype\":\"F32\",\"shape\":[3],\"data_offsets\":[0,8]}}", 8,
               "expected 3 elements x 4 = 12");
    expect_bad("{\"a\":{\"dtype\":\"F64\",\"shape\":[1],\"data_offsets\":[0,8]}}", 8,
               "dtype \"F64\" is not supported");
    expect_bad("{\"a\":{\"dtype\":\"F32\",\"shape\":[-2],\"data_offsets\":[0,8]}}", 8,
               "shape[0] is not an integer");
    expect_bad("{\"a\":{\"dtype\":\"F32\",\"shape\":[2.5],\"data_offsets\":[0,8]}}", 8,
               "shape[0] is not an integer");
    expect_bad("{\"a\":{\"dtype\":\"F32\",\"shape\":[1,1,1,1,2],\"data_offsets\":[0,8]}}", 8,
               "5 dimensions");
    expect_bad("{\"a\":{\"dtype\":\"F32\",\"shape\":[1099511627776,1099511627776],"
               "\"data_offsets\":[0,8]}}", 8, "more than 2^40 elements");
    expect_bad("{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[8,0]}}", 8,
               "data_offsets must be");
    expect_bad("{\"a\":{\"dtype\":\"F32\",\"shape\":[2]}}", 8, "expected dtype");
    expect_bad("{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8],\"x\":1}}", 8,
               "unknown key \"x\"");
    expect_bad("{\"a\":{\"dtype\":\"F32\",\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}",
               8, "duplicate key \"dtype\"");
    expect_bad("{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
               "\"a\":{\"dtype\":\"F32\",\"shape\":[0],\"data_offsets\":[8,8]}}", 8,
               "\"a\" appears twice");
    /* Overlapping and gapped offsets. */
    expect_bad("{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
               "\"b\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[4,12]}}", 12,
               "overlap tensor \"a\"");
    expect_bad("{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]},"
               "\"b\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[8,12]}}", 12,
               "start at 8, expected 4");
    expect_bad("{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
               "\"b\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}", 8,
               "overlap tensor");
    /* Not JSON, or not an object, or junk after it. */
    expect_bad("[1, 2]", 0, "must be a JSON object");
    expect_bad("{\"a\":", 0, "not a well-formed JSON object");
    expect_bad("{\"a\":{\"dtype\":\"F32\",\"shape\":[0],\"data_offsets\":[0,0]}} x", 0,
               "stray byte 0x78");
    expect_bad("{\"a\":[}", 0, "not a well-formed");
    /* Metadata: strings only, checksums of real tensors with 8 hex digits that match. */
    snprintf(h, sizeof h, "%s,\"__metadata__\":{\"k\":1}}", T);
    expect_bad(h, 8, "\"k\": expected a string value");
    snprintf(h, sizeof h, "%s,\"__metadata__\":[]}", T);
    expect_bad(h, 8, "__metadata__ must be an object");
    snprintf(h, sizeof h, "%s,\"__metadata__\":{\"crc32:zz\":\"00000000\"}}", T);
    expect_bad(h, 8, "checksum of tensor \"zz\"");
    snprintf(h, sizeof h, "%s,\"__metadata__\":{\"crc32:a\":\"xyz\"}}", T);
    expect_bad(h, 8, "expected 8 hex digits");
    snprintf(h, sizeof h, "%s,\"__metadata__\":{\"crc32:a\":\"00000000\"}}", T);
    expect_bad(h, 8, "tensor \"a\" (data bytes 0..8): CRC-32");
    snprintf(h, sizeof h, "%s,\"__metadata__\":{\"k\":\"1\",\"k\":\"2\"}}", T);
    expect_bad(h, 8, "\"k\" appears twice");
    snprintf(h, sizeof h, "%s,\"__metadata__\":{},\"__metadata__\":{}}", T);
    expect_bad(h, 8, "__metadata__ appears twice");

    /* Header lengths: past the end, over the limit, and files too short for one. */
    memset(buf, 0, sizeof buf);
    buf[0] = 0xff;
    buf[1] = 0xff;
    CHECK_FAILS(gp_safetensors_parse(buf, 64, ORIGIN, &f), GP_FORMAT,
                "header length 65535 (bytes 0..7) runs past the end of the file");
    buf[1] = 0;
    buf[6] = 1; /* 2^48 + 255 */
    CHECK_FAILS(gp_safetensors_parse(buf, 64, ORIGIN, &f), GP_FORMAT, "over the 104857600-byte limit");
    CHECK_FAILS(gp_safetensors_parse(buf, 5, ORIGIN, &f), GP_FORMAT, "5 bytes, shorter than");
    CHECK_FAILS(gp_safetensors_read("/nonexistent/x.safetensors", &f), GP_IO,
                "/nonexistent/x.safetensors: cannot open");
    CHECK_FAILS(gp_safetensors_read("/tmp", &f), GP_IO, "not a regular file");
}

/* Copies the file src to dst. */
static void copy_file(const char *src, const char *dst) {
    FILE *in = fopen(src, "rb"), *out = fopen(dst, "wb");
    unsigned char buf[4096];
    size_t n = in ? fread(buf, 1, sizeof buf, in) : 0;
    CHECK(in && out && n > 0 && n < sizeof buf && fwrite(buf, 1, n, out) == n);
    if (in) fclose(in);
    if (out) fclose(out);
    gp_scratch_remember(dst);
}

/* Flips the bit 0x01 of the byte `back` bytes before the end of path. */
static void flip_from_end(const char *path, long back) {
    FILE *f = fopen(path, "r+b");
    CHECK(f != NULL);
    if (!f) return;
    CHECK(fseek(f, -back, SEEK_END) == 0);
    int c = fgetc(f);
    CHECK(c != EOF && fseek(f, -back, SEEK_END) == 0 && fputc(c ^ 1, f) != EOF);
    fclose(f);
}

/* A file's tensors are read when asked for, each checked against its CRC-32 there: a flipped
 * data byte passes the read and fails only that tensor's get, naming the file and the bytes; a
 * file that shrinks after the read fails the get. */
static void test_lazy_tensors(const char *good) {
    char path[256];
    snprintf(path, sizeof path, "%s", gp_scratch_path("flip.safetensors"));
    copy_file(good, path);
    flip_from_end(path, 1); /* in a.floats, the last tensor with data (bytes 12..36) */
    gp_safetensors *f;
    REQUIRE_OK(gp_safetensors_read(path, &f));
    int32_t gb[3], want_b[3] = {7, -1, 2147483647};
    float ga[6];
    CHECK_OK(gp_safetensors_get(f, "b.ints", GP_I32, NULL, gb));
    CHECK(memcmp(gb, want_b, sizeof gb) == 0);
    CHECK_FAILS(gp_safetensors_get(f, "a.floats", GP_F32, NULL, ga), GP_FORMAT,
                "tensor \"a.floats\" (data bytes 12..36): CRC-32");
    CHECK(strstr(gp_last_error(), path) != NULL);
    gp_safetensors_free(f);

    snprintf(path, sizeof path, "%s", gp_scratch_path("shrink.safetensors"));
    copy_file(good, path);
    REQUIRE_OK(gp_safetensors_read(path, &f));
    struct stat st;
    CHECK(stat(path, &st) == 0 && truncate(path, st.st_size - 4) == 0);
    CHECK_OK(gp_safetensors_get(f, "b.ints", GP_I32, NULL, gb)); /* still all there */
    CHECK_FAILS(gp_safetensors_get(f, "a.floats", GP_F32, NULL, ga), GP_IO, "shrank");
    gp_safetensors_free(f);
}

/* Header first: a sparse file whose header promises 2 GiB of data opens without reading it (the
 * process stays small), one of 3 GiB with header length 0 is refused at once, and a FIFO is
 * refused instead of waited on (an alarm turns a regression into a failure, not a hang). */
static void test_header_first(void) {
    char path[256];
    snprintf(path, sizeof path, "%s", gp_scratch_path("sparse.safetensors"));
    gp_scratch_remember(path);
    const char *h = "{\"big\":{\"dtype\":\"F32\",\"shape\":[536870912],"
                    "\"data_offsets\":[0,2147483648]},"
                    "\"__metadata__\":{\"crc32:big\":\"00000000\"}}";
    unsigned char head[256];
    size_t n = image(head, sizeof head, h, 0);
    FILE *fp = fopen(path, "wb");
    CHECK(fp && fwrite(head, 1, n, fp) == n);
    if (fp) fclose(fp);
    CHECK(truncate(path, (off_t)n + ((off_t)1 << 31)) == 0);
    gp_safetensors *f = NULL;
    CHECK_OK(gp_safetensors_read(path, &f));
    CHECK_EQ_INT(gp_safetensors_count(f), 1);
    const gp_st_entry *e = gp_safetensors_find(f, "big");
    CHECK(e && e->end == (uint64_t)1 << 31);
    gp_safetensors_free(f);
    struct rusage ru;
    CHECK(getrusage(RUSAGE_SELF, &ru) == 0 && ru.ru_maxrss < 400 * 1024); /* KiB: not 2 GiB */

    CHECK(truncate(path, 0) == 0 && truncate(path, (off_t)3 << 30) == 0);
    CHECK_FAILS(gp_safetensors_read(path, &f), GP_FORMAT,
                "header length 0 (bytes 0..7) is too short for the JSON header");
    CHECK(strstr(gp_last_error(), path) != NULL);

    snprintf(path, sizeof path, "%s", gp_scratch_path("fifo.safetensors"));
    CHECK(mkfifo(path, 0600) == 0);
    gp_scratch_remember(path);
    alarm(30);
    CHECK_FAILS(gp_safetensors_read(path, &f), GP_IO, "is a FIFO (named pipe), not a regular file");
    alarm(0);
}

/* "{}" with no data is a valid (empty) file. */
static void test_empty(void) {
    unsigned char buf[16];
    size_t n = image(buf, sizeof buf, "{}", 0);
    gp_safetensors *f;
    CHECK_OK(gp_safetensors_parse(buf, n, ORIGIN, &f));
    CHECK_EQ_INT(gp_safetensors_count(f), 0);
    CHECK(gp_safetensors_find(f, "x") == NULL);
    gp_safetensors_free(f);
}

/* A write into a missing folder fails naming it and leaves nothing; a good file is never
 * replaced by a failed write. */
static void test_failed_writes(const char *good) {
    gp_safetensors_writer *w;
    float v = 1;
    REQUIRE_OK(gp_safetensors_writer_new(&w));
    REQUIRE_OK(gp_safetensors_writer_add(w, "v", GP_F32, gp_shape1(1), &v));
    CHECK_FAILS(gp_safetensors_writer_write(w, "/nonexistent/dir/x.safetensors"), GP_IO,
                "/nonexistent/dir/x.safetensors");
    gp_safetensors_writer_free(w);
    struct stat st;
    CHECK(stat(good, &st) == 0 && st.st_size > 0);
}

int main(void) {
    gp_scratch_init("test_safetensors");
    char path[256]; /* a copy: gp_scratch_path's buffers are reused */
    snprintf(path, sizeof path, "%s", gp_scratch_path("round.safetensors"));
    gp_scratch_remember(path);
    test_round_trip(path);
    test_corruptions(path);
    test_hostile();
    test_lazy_tensors(path);
    test_header_first();
    test_empty();
    test_failed_writes(path);
    gp_scratch_cleanup();
    return gp_test_finish("test_safetensors");
}
