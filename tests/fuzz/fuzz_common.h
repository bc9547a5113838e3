/* Shared by the libFuzzer targets: a private scratch folder (created once) for the readers that
 * take paths, and a helper that writes bytes to a file in it. Built only with -DGP_FUZZ=ON
 * (make test-fuzz), with clang's -fsanitize=fuzzer,address,undefined. */
#ifndef GP_FUZZ_COMMON_H
#define GP_FUZZ_COMMON_H

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static char fuzz_dir[256];

static inline const char *fuzz_scratch(const char *name) {
    static char path[512];
    if (!fuzz_dir[0]) {
        const char *t = getenv("TMPDIR");
        snprintf(fuzz_dir, sizeof fuzz_dir, "%s/gp_fuzz_XXXXXX", t && *t ? t : "/tmp");
        if (!mkdtemp(fuzz_dir)) abort();
    }
    snprintf(path, sizeof path, "%s/%s", fuzz_dir, name);
    return path;
}

static inline void fuzz_write(const char *path, const uint8_t *data, size_t n) {
    FILE *f = fopen(path, "wb");
    if (!f) abort();
    if (n && fwrite(data, 1, n, f) != n) abort();
    if (fclose(f) != 0) abort();
}

#endif
