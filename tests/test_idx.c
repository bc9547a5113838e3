/* IDX loading: the real Fashion-MNIST files Debian installs (counts, a few
 * known values), batches, and small malformed files written to a temp dir. */
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include "testutil.h"

#define FASHION_DIR "/usr/share/datasets/fashion-mnist"

static void write_raw(const char *name, const void *p, size_t n) {
    const char *path = gp_scratch_path(name);
    FILE *f = fopen(path, "wb");
    if (!f || fwrite(p, 1, n, f) != n) {
        fprintf(stderr, "cannot write %s\n", path);
        exit(1);
    }
    fclose(f);
    gp_scratch_remember(path);
}

static void write_gz(const char *name, const void *p, size_t n) {
    const char *path = gp_scratch_path(name);
    gzFile g = gzopen(path, "wb");
    if (!g || (n && gzwrite(g, p, (unsigned)n) != (int)n)) {
        fprintf(stderr, "cannot write %s\n", path);
        exit(1);
    }
    gzclose(g);
    gp_scratch_remember(path);
}

static void put32(unsigned char *p, uint32_t v) {
    p[0] = (unsigned char)(v >> 24);
    p[1] = (unsigned char)(v >> 16);
    p[2] = (unsigned char)(v >> 8);
    p[3] = (unsigned char)v;
}

/* An images file: header (magic, n, rows, cols) then npix_written bytes i*7. */
static size_t make_images(unsigned char *buf, uint32_t magic, uint32_t n, uint32_t rows,
                          uint32_t cols, size_t npix_written) {
    put32(buf, magic);
    put32(buf + 4, n);
    put32(buf + 8, rows);
    put32(buf + 12, cols);
    for (size_t i = 0; i < npix_written; i++) buf[16 + i] = (unsigned char)(i * 7);
    return 16 + npix_written;
}

static size_t make_labels(unsigned char *buf, uint32_t magic, uint32_t n, size_t written) {
    put32(buf, magic);
    put32(buf + 4, n);
    for (size_t i = 0; i < written; i++) buf[8 + i] = (unsigned char)(i % 10);
    return 8 + written;
}

static bool zeroed(const gp_idx_dataset *d) {
    return d->n == 0 && d->images == NULL && d->labels == NULL && d->rows == 0;
}

static void expect_load_fails(const char *images, const char *labels, gp_status want,
                              const char *needle, const char *needle2, int line) {
    gp_idx_dataset d;
    memset(&d, 0x5a, sizeof d);
    gp_status s = gp_idx_load(gp_scratch_path(images), gp_scratch_path(labels), &d);
    gp_test_check_fails_(s, want, needle, "gp_idx_load", __FILE__, line);
    if (needle2 && !strstr(gp_last_error(), needle2)) {
        fprintf(stderr, "%s:%d: message \"%s\" does not contain \"%s\"\n", __FILE__, line,
                gp_last_error(), needle2);
        gp_test_failures++;
    }
    if (!zeroed(&d)) {
        fprintf(stderr, "%s:%d: dataset not zeroed after a failed load\n", __FILE__, line);
        gp_test_failures++;
    }
    gp_idx_free(&d);
}
#define LOAD_FAILS(im, lb, want, needle, needle2) \
    expect_load_fails(im, lb, want, needle, needle2, __LINE__)

static void test_small_files(void) {
    unsigned char img[16 + 3 * 2 * 3 + 8], lab[8 + 4];
    size_t ni = make_images(img, 0x803, 3, 2, 3, 18);
    size_t nl = make_labels(lab, 0x801, 3, 3);

    /* well-formed, both plain and gzip, through gp_idx_load_dir */
    write_raw("train-images-idx3-ubyte", img, ni);
    write_raw("train-labels-idx1-ubyte", lab, nl);
    write_gz("t10k-images-idx3-ubyte.gz", img, ni);
    write_gz("t10k-labels-idx1-ubyte.gz", lab, nl);
    const char *splits[2] = {"train", "t10k"};
    for (int k = 0; k < 2; k++) {
        gp_idx_dataset d;
        CHECK_OK(gp_idx_load_dir(gp_scratch_dir(), splits[k], &d));
        CHECK_EQ_INT(d.n, 3);
        CHECK_EQ_INT(d.rows, 2);
        CHECK_EQ_INT(d.cols, 3);
        if (d.images && d.labels) {
            CHECK_EQ_INT(d.images[0], 0);
            CHECK_EQ_INT(d.images[5], 35);
            CHECK_EQ_INT(d.images[17], (17 * 7) & 255);
            CHECK_EQ_INT(d.labels[2], 2);
        }
        gp_idx_free(&d);
        CHECK(zeroed(&d));
        gp_idx_free(&d); /* twice is harmless */
    }

    /* missing, empty, a directory */
    LOAD_FAILS("nonexistent-images", "train-labels-idx1-ubyte", GP_IO, "nonexistent-images",
               "no such file");
    LOAD_FAILS("train-images-idx3-ubyte", "nonexistent-labels", GP_IO, "nonexistent-labels",
               NULL);
    write_raw("empty", "", 0);
    LOAD_FAILS("empty", "train-labels-idx1-ubyte", GP_FORMAT, "empty", "empty file");
    LOAD_FAILS(".", "train-labels-idx1-ubyte", GP_IO, "not a regular file", NULL);

    /* truncated payload, plain and gzip; truncated header */
    write_raw("trunc-images", img, ni - 5);
    LOAD_FAILS("trunc-images", "train-labels-idx1-ubyte", GP_FORMAT, "trunc-images",
               "truncated: 13 data bytes after the header, expected 18");
    write_gz("trunc-images.gz", img, ni - 5);
    LOAD_FAILS("trunc-images.gz", "train-labels-idx1-ubyte", GP_FORMAT, "trunc-images.gz",
               "expected 18");
    write_raw("trunc-labels", lab, nl - 1);
    LOAD_FAILS("train-images-idx3-ubyte", "trunc-labels", GP_FORMAT, "trunc-labels",
               "expected 3");
    write_raw("short-header", img, 10);
    LOAD_FAILS("short-header", "train-labels-idx1-ubyte", GP_FORMAT, "short-header",
               "truncated header: 10 bytes, expected 16");

    /* a header promising 99,999,999 images in a tiny file: refused on the
     * missing bytes, without a gigabyte allocation */
    unsigned char big[16 + 8];
    write_raw("huge-claim", big, make_images(big, 0x803, 99999999, 28, 28, 8));
    LOAD_FAILS("huge-claim", "train-labels-idx1-ubyte", GP_FORMAT, "huge-claim", "truncated");

    /* wrong magics: labels given as images and the reverse */
    LOAD_FAILS("train-labels-idx1-ubyte", "train-labels-idx1-ubyte", GP_FORMAT,
               "wrong magic 0x00000801, expected 0x00000803", "train-labels-idx1-ubyte");
    LOAD_FAILS("train-images-idx3-ubyte", "train-images-idx3-ubyte", GP_FORMAT,
               "wrong magic 0x00000803, expected 0x00000801", NULL);
    unsigned char bad[16 + 18];
    write_raw("int-images", bad, make_images(bad, 0x00000c03, 3, 2, 3, 18));
    LOAD_FAILS("int-images", "train-labels-idx1-ubyte", GP_FORMAT, "0x00000c03", "int-images");

    /* zero and absurd dimensions */
    write_raw("zero-images", bad, make_images(bad, 0x803, 0, 2, 3, 0));
    LOAD_FAILS("zero-images", "train-labels-idx1-ubyte", GP_FORMAT, "image count is 0",
               "zero-images");
    write_raw("zero-rows", bad, make_images(bad, 0x803, 3, 0, 3, 0));
    LOAD_FAILS("zero-rows", "train-labels-idx1-ubyte", GP_FORMAT, "row count is 0", NULL);
    write_raw("wide", bad, make_images(bad, 0x803, 3, 2, 100000, 18));
    LOAD_FAILS("wide", "train-labels-idx1-ubyte", GP_FORMAT, "column count is 100000", NULL);
    unsigned char lab0[8];
    write_raw("zero-labels", lab0, make_labels(lab0, 0x801, 0, 0));
    LOAD_FAILS("train-images-idx3-ubyte", "zero-labels", GP_FORMAT, "label count is 0", NULL);

    /* image/label count mismatch; trailing bytes */
    unsigned char lab2[8 + 2];
    write_raw("two-labels", lab2, make_labels(lab2, 0x801, 2, 2));
    LOAD_FAILS("train-images-idx3-ubyte", "two-labels", GP_FORMAT, "2 labels",
               "3 images: expected equal counts");
    unsigned char lab4[8 + 4];
    write_raw("extra-labels", lab4, make_labels(lab4, 0x801, 3, 4));
    LOAD_FAILS("train-images-idx3-ubyte", "extra-labels", GP_FORMAT, "trailing bytes",
               "extra-labels");

    /* a gzip stream cut short, and bytes that are gzip-looking garbage */
    write_gz("full.gz", img, ni);
    FILE *f = fopen(gp_scratch_path("full.gz"), "rb");
    unsigned char gzb[256];
    size_t ng = f ? fread(gzb, 1, sizeof gzb, f) : 0;
    if (f) fclose(f);
    CHECK(ng > 20);
    write_raw("cut.gz", gzb, ng - 12);
    gp_idx_dataset d;
    gp_status s = gp_idx_load(gp_scratch_path("cut.gz"), gp_scratch_path("train-labels-idx1-ubyte"), &d);
    CHECK(s == GP_IO || s == GP_FORMAT);
    CHECK(strstr(gp_last_error(), "cut.gz") != NULL);
    CHECK(zeroed(&d));
    for (size_t i = 12; i < ng; i++) gzb[i] ^= 0xa5;
    write_raw("garbled.gz", gzb, ng);
    s = gp_idx_load(gp_scratch_path("garbled.gz"), gp_scratch_path("train-labels-idx1-ubyte"), &d);
    CHECK(s == GP_IO || s == GP_FORMAT);
    CHECK(strstr(gp_last_error(), "garbled.gz") != NULL);
    CHECK(zeroed(&d));

    /* gp_idx_load_dir: bad split, nothing there */
    CHECK_FAILS(gp_idx_load_dir(gp_scratch_dir(), "test", &d), GP_INVALID_ARGUMENT, "\"test\"");
    CHECK_FAILS(gp_idx_load_dir("/nonexistent-dir-h3", "train", &d), GP_IO,
                "/nonexistent-dir-h3/train-images-idx3-ubyte");
    CHECK_FAILS(gp_idx_load(NULL, "x", &d), GP_INVALID_ARGUMENT, "NULL");
}

static void test_batch_errors(const gp_idx_dataset *d, gp_device *dev) {
    gp_tensor x, y, xbad;
    REQUIRE_OK(gp_tensor_alloc(dev, GP_MEM_WORKSPACE, gp_shape4(2, 1, d->rows, d->cols), GP_F32,
                               &x));
    REQUIRE_OK(gp_tensor_alloc(dev, GP_MEM_WORKSPACE, gp_shape1(2), GP_I32, &y));
    REQUIRE_OK(gp_tensor_alloc(dev, GP_MEM_WORKSPACE, gp_shape4(2, 1, d->rows + 1, d->cols),
                               GP_F32, &xbad));
    int64_t ok[2] = {0, 1}, out_of_range[2] = {0, d->n}, neg[2] = {-1, 0};
    CHECK_FAILS(gp_idx_batch(d, out_of_range, 2, 0.f, 1.f, &x, &y), GP_INVALID_ARGUMENT,
                "idx[1]");
    CHECK_FAILS(gp_idx_batch(d, neg, 2, 0.f, 1.f, &x, &y), GP_INVALID_ARGUMENT, "idx[0] = -1");
    CHECK_FAILS(gp_idx_batch(d, ok, 2, 0.f, 0.f, &x, &y), GP_INVALID_ARGUMENT, "std");
    CHECK_FAILS(gp_idx_batch(d, ok, 2, 0.f, 1.f, &xbad, &y), GP_SHAPE, "expected float32");
    CHECK_FAILS(gp_idx_batch(d, ok, 2, 0.f, 1.f, &x, &x), GP_SHAPE, "y is float32");
    CHECK_FAILS(gp_idx_batch(d, ok, 3, 0.f, 1.f, &x, &y), GP_SHAPE, "x is");
    gp_tensor_release(&x);
    gp_tensor_release(&y);
    gp_tensor_release(&xbad);
}

static void test_fashion(gp_device *dev) {
    struct stat st;
    if (stat(FASHION_DIR, &st) != 0) {
        printf("test_idx: %s not installed: real-data checks skipped\n", FASHION_DIR);
        return;
    }
    gp_idx_dataset tr, te;
    REQUIRE_OK(gp_idx_load_dir(FASHION_DIR, "train", &tr));
    REQUIRE_OK(gp_idx_load_dir(FASHION_DIR, "t10k", &te));
    CHECK_EQ_INT(tr.n, 60000);
    CHECK_EQ_INT(te.n, 10000);
    CHECK_EQ_INT(tr.rows, 28);
    CHECK_EQ_INT(tr.cols, 28);
    CHECK_EQ_INT(te.rows, 28);
    CHECK_EQ_INT(te.cols, 28);
    /* values read once with an independent reader (Python's gzip module) */
    static const int train_labels[10] = {9, 0, 0, 3, 0, 2, 7, 2, 5, 5};
    static const int test_labels[10] = {9, 2, 1, 1, 6, 1, 4, 6, 5, 7};
    for (int i = 0; i < 10; i++) {
        CHECK_EQ_INT(tr.labels[i], train_labels[i]);
        CHECK_EQ_INT(te.labels[i], test_labels[i]);
    }
    CHECK_EQ_INT(tr.labels[59999], 5);
    CHECK_EQ_INT(tr.images[96], 1);
    CHECK_EQ_INT(tr.images[100], 73);
    CHECK_EQ_INT(tr.images[14 * 28 + 14], 217);
    CHECK_EQ_INT(tr.images[784 + 10 * 28 + 10], 252);
    CHECK_EQ_INT(te.images[14 * 28 + 14], 110);
    uint64_t sum0 = 0, sum_all = 0, lsum = 0, count[10] = {0}, bad_labels = 0;
    for (int i = 0; i < 784; i++) sum0 += tr.images[i];
    for (int64_t i = 0; i < tr.n * 784; i++) sum_all += tr.images[i];
    for (int64_t i = 0; i < tr.n; i++) {
        lsum += tr.labels[i];
        if (tr.labels[i] < 10) count[tr.labels[i]]++;
        else bad_labels++;
    }
    CHECK_EQ_INT(sum0, 76247);
    CHECK_EQ_INT(sum_all, 3431114169ULL);
    CHECK_EQ_INT(lsum, 270000);
    CHECK_EQ_INT(bad_labels, 0);
    for (int c = 0; c < 10; c++) CHECK_EQ_INT(count[c], 6000);

    /* a batch: examples 1 and 0 in that order, standardized as in WORKLOADS C1 */
    gp_tensor x, y;
    REQUIRE_OK(gp_tensor_alloc(dev, GP_MEM_WORKSPACE, gp_shape4(2, 1, 28, 28), GP_F32, &x));
    REQUIRE_OK(gp_tensor_alloc(dev, GP_MEM_WORKSPACE, gp_shape1(2), GP_I32, &y));
    int64_t idx[2] = {1, 0};
    const float mean = 0.2860f, std = 0.3530f;
    CHECK_OK(gp_idx_batch(&tr, idx, 2, mean, std, &x, &y));
    const int32_t *yl = (const int32_t *)(const void *)y.data;
    CHECK_EQ_INT(yl[0], 0);
    CHECK_EQ_INT(yl[1], 9);
    CHECK_NEAR(F32(x)[784 + 14 * 28 + 14], (217.0 / 255.0 - 0.2860) / 0.3530, 1e-5);
    CHECK_NEAR(F32(x)[10 * 28 + 10], (252.0 / 255.0 - 0.2860) / 0.3530, 1e-5);
    CHECK_NEAR(F32(x)[784], -0.2860 / 0.3530, 1e-6); /* a background pixel of image 0 */
    double mean_x = 0;
    for (int i = 0; i < 784; i++) mean_x += F32(x)[784 + i] * std + mean;
    CHECK_NEAR(mean_x * 255.0, 76247.0, 0.5);
    test_batch_errors(&tr, dev);
    gp_tensor_release(&x);
    gp_tensor_release(&y);
    gp_idx_free(&tr);
    gp_idx_free(&te);
}

int main(void) {
    gp_scratch_init("test_idx");
    gp_device *dev;
    REQUIRE_OK(gp_device_cpu_new("cpu0", &dev));
    test_small_files();
    test_fashion(dev);
    gp_device_free(dev);
    gp_scratch_cleanup();
    return gp_test_finish("test_idx");
}
