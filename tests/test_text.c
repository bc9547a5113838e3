/* Text corpora and data order: entry splitting, the train/validation deal,
 * the directory walk (sorted, each real file once, "off" and .dat skipped)
 * on a small tree written here and on Debian's multilingual fortunes,
 * batches of byte windows, and the keyed shuffle. */
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "testutil.h"

static void write_file(const char *name, const char *text) {
    const char *path = gp_scratch_path(name);
    FILE *f = fopen(path, "wb");
    if (!f || fwrite(text, 1, strlen(text), f) != strlen(text)) {
        fprintf(stderr, "cannot write %s\n", path);
        exit(1);
    }
    fclose(f);
    gp_scratch_remember(path);
}

static void make_dir(const char *name) {
    if (mkdir(gp_scratch_path(name), 0700) != 0) {
        perror(name);
        exit(1);
    }
    gp_scratch_remember(gp_scratch_path(name));
}

static void make_link(const char *target, const char *name) {
    if (symlink(target, gp_scratch_path(name)) != 0) {
        perror(name);
        exit(1);
    }
    gp_scratch_remember(gp_scratch_path(name));
}

static bool bytes_equal(const uint8_t *p, int64_t n, const char *want) {
    size_t m = strlen(want);
    if ((size_t)n != m) {
        fprintf(stderr, "  got %lld bytes \"%.*s\", expected %zu \"%s\"\n", (long long)n,
                (int)(n > 200 ? 200 : n), p ? (const char *)p : "", m, want);
        return false;
    }
    return m == 0 || memcmp(p, want, m) == 0;
}

static int64_t count_occurrences(const uint8_t *p, int64_t n, const char *needle) {
    size_t m = strlen(needle);
    int64_t c = 0;
    for (int64_t i = 0; i + (int64_t)m <= n; i++) {
        const uint8_t *q = memchr(p + i, needle[0], (size_t)(n - i));
        if (!q || q - p + (int64_t)m > n) break;
        i = q - p;
        if (memcmp(q, needle, m) == 0) c++;
    }
    return c;
}

static void test_small_corpus(void) {
    /* entries: "one", "two lines", a blank one (not counted), "three" without
     * a final newline; then in b/: a leading separator, CRLF lines */
    write_file("a.txt", "one\n%\ntwo\nlines\n%\n%\n  \n%\nthree");
    write_file("a.txt.dat", "%\nDAT FILE\n");
    make_dir("b");
    write_file("b/c.txt", "%\nfour\n%\r\nfive\r\n%\n");
    make_link("../a.txt", "b/link.u8"); /* the same file again: read once */
    make_dir("off");
    write_file("off/x", "OFFENSIVE\n");
    write_file(".hidden", "HIDDEN\n");
    make_link("nowhere", "dangling");
    write_file("z_pct", "100%\n%%\n50% off\n"); /* "%%" and "100%" are not separators */

    gp_text_corpus c;
    CHECK_OK(gp_text_load(gp_scratch_dir(), 3, &c));
    CHECK_EQ_INT(c.nfiles, 3);
    /* entries 0..5 in name order; every 3rd (2 and 5) is validation */
    CHECK(bytes_equal(c.train, c.ntrain, "one\n\ntwo\nlines\n\nfour\n\nfive\r\n\n"));
    CHECK(bytes_equal(c.valid, c.nvalid, "three\n\n100%\n%%\n50% off\n\n"));
    gp_text_corpus c2;
    CHECK_OK(gp_text_load(gp_scratch_dir(), 3, &c2));
    CHECK(c2.ntrain == c.ntrain && c2.train && c.train &&
          memcmp(c2.train, c.train, (size_t)c.ntrain) == 0);
    gp_text_free(&c2);
    gp_text_free(&c);
    CHECK(c.train == NULL && c.ntrain == 0 && c.nfiles == 0);
    gp_text_free(&c);

    CHECK_OK(gp_text_load(gp_scratch_dir(), 0, &c)); /* no validation split */
    CHECK(bytes_equal(c.train, c.ntrain,
                      "one\n\ntwo\nlines\n\nthree\n\nfour\n\nfive\r\n\n100%\n%%\n50% off\n\n"));
    CHECK_EQ_INT(c.nvalid, 0);
    gp_text_free(&c);

    CHECK_OK(gp_text_load(gp_scratch_path("a.txt"), 2, &c)); /* a single file */
    CHECK_EQ_INT(c.nfiles, 1);
    CHECK(bytes_equal(c.train, c.ntrain, "one\n\nthree\n\n"));
    CHECK(bytes_equal(c.valid, c.nvalid, "two\nlines\n\n"));
    gp_text_free(&c);

    /* name order, whatever order the file system lists them in: twelve
     * files made in a scrambled order, one entry each */
    make_dir("many");
    for (int i = 0; i < 12; i++) {
        char name[32], text[16];
        int k = (i * 5 + 7) % 12;
        snprintf(name, sizeof name, "many/f%02d", k);
        snprintf(text, sizeof text, "e%02d\n", k);
        write_file(name, text);
    }
    CHECK_OK(gp_text_load(gp_scratch_path("many"), 0, &c));
    CHECK_EQ_INT(c.nfiles, 12);
    CHECK(bytes_equal(c.train, c.ntrain,
                      "e00\n\ne01\n\ne02\n\ne03\n\ne04\n\ne05\n\ne06\n\ne07\n\ne08\n\ne09\n\n"
                      "e10\n\ne11\n\n"));
    gp_text_free(&c);

    /* bad inputs, each naming the path */
    gp_text_corpus bad;
    memset(&bad, 0x5a, sizeof bad);
    CHECK_FAILS(gp_text_load(gp_scratch_path("missing"), 20, &bad), GP_IO, "missing");
    CHECK(bad.train == NULL && bad.ntrain == 0);
    make_dir("empty");
    CHECK_FAILS(gp_text_load(gp_scratch_path("empty"), 20, &bad), GP_FORMAT, "empty: no text entries");
    write_file("seps", "%\n%\n\n%\n");
    CHECK_FAILS(gp_text_load(gp_scratch_path("seps"), 20, &bad), GP_FORMAT, "seps: no text entries");
    CHECK_FAILS(gp_text_load(gp_scratch_path("off"), 1, &bad), GP_INVALID_ARGUMENT, "valid_every = 1");
    CHECK_FAILS(gp_text_load(gp_scratch_path("off"), -3, &bad), GP_INVALID_ARGUMENT, "valid_every");
    CHECK_FAILS(gp_text_load("/dev/null", 20, &bad), GP_IO, "/dev/null");
    CHECK(bad.train == NULL && bad.valid == NULL);
    /* the root itself may be named off: only sub-directories are skipped */
    CHECK_OK(gp_text_load(gp_scratch_path("off"), 0, &c));
    CHECK(bytes_equal(c.train, c.ntrain, "OFFENSIVE\n\n"));
    gp_text_free(&c);
}

static void test_batch(gp_device *dev) {
    const uint8_t text[] = "abcdefghij"; /* n = 10 */
    gp_tensor x, y, xf, x3;
    REQUIRE_OK(gp_tensor_alloc(dev, GP_MEM_WORKSPACE, gp_shape2(2, 4), GP_I32, &x));
    REQUIRE_OK(gp_tensor_alloc(dev, GP_MEM_WORKSPACE, gp_shape2(2, 4), GP_I32, &y));
    REQUIRE_OK(gp_tensor_alloc(dev, GP_MEM_WORKSPACE, gp_shape2(2, 4), GP_F32, &xf));
    REQUIRE_OK(gp_tensor_alloc(dev, GP_MEM_WORKSPACE, gp_shape2(3, 4), GP_I32, &x3));
    int64_t starts[2] = {5, 0};
    CHECK_OK(gp_text_batch(text, 10, starts, 2, 4, &x, &y));
    const int32_t *xd = (const int32_t *)(const void *)x.data;
    const int32_t *yd = (const int32_t *)(const void *)y.data;
    const char *wx = "fghiabcd", *wy = "ghijbcde";
    for (int i = 0; i < 8; i++) {
        CHECK_EQ_INT(xd[i], wx[i]);
        CHECK_EQ_INT(yd[i], wy[i]);
    }
    int64_t late[2] = {0, 6}, neg[2] = {-1, 0};
    CHECK_FAILS(gp_text_batch(text, 10, late, 2, 4, &x, &y), GP_INVALID_ARGUMENT,
                "starts[1] = 6, expected 0 to n - seq_len - 1 = 5");
    CHECK_FAILS(gp_text_batch(text, 10, neg, 2, 4, &x, &y), GP_INVALID_ARGUMENT, "starts[0]");
    CHECK_FAILS(gp_text_batch(text, 10, starts, 2, 4, &xf, &y), GP_SHAPE, "x is float32");
    CHECK_FAILS(gp_text_batch(text, 10, starts, 2, 4, &x, &x3), GP_SHAPE, "y is int32 (3, 4)");
    CHECK_FAILS(gp_text_batch(text, 10, starts, 2, 5, &x, &y), GP_SHAPE, "expected int32 (2, 5)");
    CHECK_FAILS(gp_text_batch(text, 4, starts, 2, 4, &x, &y), GP_INVALID_ARGUMENT,
                "at least seq_len + 1");
    gp_tensor_release(&x);
    gp_tensor_release(&y);
    gp_tensor_release(&xf);
    gp_tensor_release(&x3);
}

static void test_fortunes(void) {
    struct stat st;
    if (stat(GP_FORTUNES_DIR, &st) != 0) {
        printf("test_text: %s not installed: real-corpus checks skipped\n", GP_FORTUNES_DIR);
        return;
    }
    gp_text_corpus c;
    REQUIRE_OK(gp_text_load(GP_FORTUNES_DIR, 20, &c));
    int64_t total = c.ntrain + c.nvalid;
    printf("test_text: %s: %d files, %lld train + %lld validation bytes\n", GP_FORTUNES_DIR,
           c.nfiles, (long long)c.ntrain, (long long)c.nvalid);
    CHECK(total > 10 * 1000 * 1000 && total < 40 * 1000 * 1000);
    CHECK(c.nfiles > 300 && c.nfiles < 1000);
    double frac = (double)c.nvalid / (double)total;
    CHECK(frac > 0.03 && frac < 0.07);
    /* one entry from each language (file checked with grep), found exactly once:
     * symlinked copies (adams -> it/adams, *.u8, cz/ -> cs/) are not read again */
    static const char *const marks[] = {
        "A day for firm decisions!!!!!  Or is it?",          /* en: fortunes */
        "Gespr\xc3\xa4" "chstherapeut",                       /* de: bahnhof */
        "herej\xc3\xad" "a cient\xc3\xad" "fica es ignorada", /* es: asimov */
        "NON LASCIATEVI PRENDERE DAL PANICO",                 /* it: adams */
        "Konsultant: poprosz\xc4\x99 Pana nazwisko",          /* pl: bok */
        "Nen\xc3\xad v\xc4\x9bt\xc5\xa1\xc3\xad \xc5\xa1kody", /* cs: citace */
        "\xd0\x91\xd0\xb5\xd0\xb7\xd0\xb7\xd1\x83\xd0\xb1\xd1\x8b\xd0\xbc", /* ru: 2001.03 */
    };
    for (size_t i = 0; i < sizeof marks / sizeof marks[0]; i++) {
        int64_t n = count_occurrences(c.train, c.ntrain, marks[i]) +
                    count_occurrences(c.valid, c.nvalid, marks[i]);
        if (n != 1) {
            fprintf(stderr, "test_text: \"%s\" found %lld times, expected once\n", marks[i],
                    (long long)n);
            gp_test_failures++;
        }
    }
    /* Cyrillic and Czech letters are common, not just present once */
    CHECK(count_occurrences(c.train, c.ntrain, "\xd0\xbe") > 10000); /* Cyrillic o */
    CHECK(count_occurrences(c.train, c.ntrain, "\xc5\x99") > 1000);  /* Czech r-caron */
    /* es/off/ (rot13 offensive fortunes) is skipped */
    CHECK_EQ_INT(count_occurrences(c.train, c.ntrain, "Cnen dhr fr zhrena enovbfbf"), 0);
    CHECK_EQ_INT(count_occurrences(c.valid, c.nvalid, "Cnen dhr fr zhrena enovbfbf"), 0);
    gp_text_free(&c);
}

/* The documented recipe, written out again: Fisher-Yates from the top, the
 * k-th draw is gp_rng_u64(stream, k), rejection below 2^64 mod (i + 1). */
static void reference_shuffle(uint64_t seed, uint32_t epoch, int64_t n, int64_t *perm) {
    gp_rng_stream s = {.seed = seed, .purpose = GP_RNG_DATA, .a = epoch};
    uint64_t k = 0;
    for (int64_t i = 0; i < n; i++) perm[i] = i;
    for (int64_t i = n - 1; i >= 1; i--) {
        uint64_t bound = (uint64_t)i + 1, v;
        do v = gp_rng_u64(&s, k++);
        while (v < (UINT64_MAX - bound + 1) % bound);
        int64_t j = (int64_t)(v % bound), t = perm[i];
        perm[i] = perm[j];
        perm[j] = t;
    }
}

static void test_shuffle(void) {
    const int64_t n = 1000;
    int64_t *p = malloc(sizeof *p * (size_t)n), *q = malloc(sizeof *q * (size_t)n);
    char *hit = calloc((size_t)n, 1);
    CHECK_OK(gp_shuffle(42, 0, n, p));
    for (int64_t i = 0; i < n; i++)
        if (p[i] >= 0 && p[i] < n) hit[p[i]]++;
    int64_t once = 0, fixed = 0;
    for (int64_t i = 0; i < n; i++) once += hit[i] == 1;
    for (int64_t i = 0; i < n; i++) fixed += p[i] == i;
    CHECK_EQ_INT(once, n);
    CHECK(fixed < 10); /* about 1 expected for a random permutation */
    reference_shuffle(42, 0, n, q);
    CHECK(memcmp(p, q, sizeof *p * (size_t)n) == 0);
    CHECK_OK(gp_shuffle(42, 0, n, q));
    CHECK(memcmp(p, q, sizeof *p * (size_t)n) == 0); /* deterministic */
    CHECK_OK(gp_shuffle(42, 1, n, q));
    int64_t same = 0;
    for (int64_t i = 0; i < n; i++) same += p[i] == q[i];
    CHECK(same < 10); /* another epoch, another order */
    CHECK_OK(gp_shuffle(43, 0, n, q));
    same = 0;
    for (int64_t i = 0; i < n; i++) same += p[i] == q[i];
    CHECK(same < 10); /* another seed, another order */

    /* all 6 orders of 3 items about equally often: chi-square, 5 d.o.f. */
    const bool quick = getenv("GP_TEST_QUICK") != NULL;
    const int epochs = quick ? 1200 : 6000;
    int counts[6] = {0};
    for (int e = 0; e < epochs; e++) {
        int64_t r[3];
        CHECK_OK(gp_shuffle(7, (uint32_t)e, 3, r));
        counts[r[0] * 2 + (r[1] > r[2] ? 1 : 0)]++;
    }
    double chi2 = 0, expect = epochs / 6.0;
    for (int i = 0; i < 6; i++) chi2 += (counts[i] - expect) * (counts[i] - expect) / expect;
    CHECK(chi2 < 20.5); /* p = 0.001 */

    CHECK_OK(gp_shuffle(1, 0, 0, NULL));
    int64_t one = 99;
    CHECK_OK(gp_shuffle(1, 0, 1, &one));
    CHECK_EQ_INT(one, 0);
    CHECK_FAILS(gp_shuffle(1, 0, -1, p), GP_INVALID_ARGUMENT, "n = -1");
    CHECK_FAILS(gp_shuffle(1, 0, 5, NULL), GP_INVALID_ARGUMENT, "perm");
    free(p);
    free(q);
    free(hit);
}

int main(void) {
    gp_scratch_init("test_text");
    gp_device *dev;
    REQUIRE_OK(gp_device_cpu_new("cpu0", &dev));
    test_small_corpus();
    test_batch(dev);
    test_fortunes();
    test_shuffle();
    gp_device_free(dev);
    gp_scratch_cleanup();
    return gp_test_finish("test_text");
}
