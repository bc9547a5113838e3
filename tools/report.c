/* JSON reports of the CLI: the OpenBLAS core, memory figures from the device counters, exact
 * 64-bit integers, and an atomic write (gp_file_out) so that a crash never
 * leaves a half report that looks whole. */
#include <inttypes.h>

#include "cli.h"

void gp_cli_hex64(uint64_t v, char out[17]) {
    snprintf(out, 17, "%016" PRIx64, v);
}

void gp_cli_report_u64(cJSON *obj, const char *key, uint64_t v) {
    char buf[32];
    snprintf(buf, sizeof buf, "%" PRIu64, v);
    cJSON_AddRawToObject(obj, key, buf);
}

void gp_cli_report_blas_core(cJSON *root) {
    cJSON_AddStringToObject(root, "blas_core", gp_blas_corename());
    const char *replaced;
    const char *by = gp_cli_blas_core_chosen_by(&replaced);
    if (by) cJSON_AddStringToObject(root, "blas_core_chosen_by", by);
    if (replaced) cJSON_AddStringToObject(root, "blas_core_openblas_chose", replaced);
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

bool gp_cli_report_write(const char *cmd, const cJSON *root, const char *path,
                         const char *option) {
    char *text = cJSON_Print(root);
    if (!text) {
        fprintf(stderr, "gpipe %s: %s %s: cannot render the JSON report (out of memory)\n", cmd,
                option, path);
        return false;
    }
    gp_file_out o;
    gp_status s = gp_file_out_open(&o, path);
    if (s == GP_OK) {
        gp_file_out_write(&o, text);
        gp_file_out_write(&o, "\n");
        s = gp_file_out_close(&o, true);
    }
    cJSON_free(text);
    if (s != GP_OK) fprintf(stderr, "gpipe %s: %s: %s\n", cmd, option, gp_last_error());
    return s == GP_OK;
}
