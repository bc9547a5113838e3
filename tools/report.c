/* JSON reports of the CLI: memory figures from the device counters, exact
 * 64-bit integers, and an atomic write (temporary file, then rename) so that
 * a crash never leaves a half report that looks whole. */
#include <errno.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli.h"

void gp_cli_hex64(uint64_t v, char out[17]) {
    snprintf(out, 17, "%016" PRIx64, v);
}

void gp_cli_report_u64(cJSON *obj, const char *key, uint64_t v) {
    char buf[32];
    snprintf(buf, sizeof buf, "%" PRIu64, v);
    cJSON_AddRawToObject(obj, key, buf);
}

void gp_cli_report_memory(cJSON *root, const gp_mem_stats *st) {
    cJSON *mem = cJSON_AddObjectToObject(root, "memory");
    cJSON *peak = cJSON_AddObjectToObject(mem, "peak_bytes");
    for (int c = 0; c < GP_MEM_NCATEGORIES; c++)
        gp_cli_report_u64(peak, gp_mem_category_name((gp_mem_category)c), st->peak[c]);
    gp_cli_report_u64(peak, "total", st->peak_total);
    gp_cli_report_u64(mem, "limit_bytes", st->limit);
    gp_cli_report_u64(mem, "allocations", st->nallocs);
}

bool gp_cli_report_write(const cJSON *root, const char *path, const char *option) {
    char *text = cJSON_Print(root);
    if (!text) {
        fprintf(stderr, "gpipe: %s %s: cannot render the JSON report (out of memory)\n", option,
                path);
        return false;
    }
    size_t tmplen = strlen(path) + 32;
    char *tmp = malloc(tmplen);
    if (!tmp) {
        cJSON_free(text);
        fprintf(stderr, "gpipe: %s %s: out of memory\n", option, path);
        return false;
    }
    snprintf(tmp, tmplen, "%s.tmp.%ld", path, (long)getpid());
    const char *what = NULL, *subject = tmp;
    int err = 0;
    FILE *f = fopen(tmp, "w");
    if (!f) {
        what = "cannot create", err = errno;
    } else {
        size_t n = strlen(text);
        if (fwrite(text, 1, n, f) != n || fputc('\n', f) == EOF || fflush(f) != 0)
            what = "cannot write", err = errno;
        else if (fsync(fileno(f)) != 0)
            what = "cannot sync", err = errno;
        if (fclose(f) != 0 && !what) what = "cannot close", err = errno;
        if (!what && rename(tmp, path) != 0)
            what = "cannot rename the temporary file onto", subject = path, err = errno;
        if (what) remove(tmp);
    }
    if (what)
        fprintf(stderr, "gpipe: %s: %s '%s' (%s)\n", option, what, subject,
                err ? strerror(err) : "unknown error");
    free(tmp);
    cJSON_free(text);
    return what == NULL;
}
