/* A process's memory as it ends, for bench/run_cpu_memory.sh: preloaded (LD_PRELOAD) into any
 * program, it writes one line to $GP_RSS_PROBE_OUT.<pid> when the program exits: the peak and
 * final resident sets (VmHWM, VmRSS), the final one split into anonymous and file-backed pages
 * (RssAnon, RssFile), and the resident bytes of the CUDA libraries' mappings (libcudart,
 * libcublas, libcublasLt, libgpipe_cuda) from /proc/self/smaps, all in kB. Registered with
 * atexit from a constructor, so it runs after the program's own exit handlers and before the
 * libraries unload: what the program held at its end. */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static long status_kb(const char *text, const char *key) {
    const char *p = strstr(text, key);
    return p ? strtol(p + strlen(key), NULL, 10) : -1;
}

static long cuda_kb(void) {
    FILE *f = fopen("/proc/self/smaps", "r");
    if (!f) return -1;
    char line[4096];
    long kb = 0;
    int in_cuda = 0;
    while (fgets(line, sizeof line, f)) {
        unsigned long lo, hi;
        if (sscanf(line, "%lx-%lx ", &lo, &hi) == 2) { /* a mapping's first line */
            in_cuda = strstr(line, "libcudart") || strstr(line, "libcublas") ||
                      strstr(line, "libgpipe_cuda");
        } else if (in_cuda && strncmp(line, "Rss:", 4) == 0) {
            kb += strtol(line + 4, NULL, 10);
        }
    }
    fclose(f);
    return kb;
}

static void report(void) {
    const char *out = getenv("GP_RSS_PROBE_OUT");
    if (!out) return;
    char text[8192] = "";
    FILE *f = fopen("/proc/self/status", "r");
    if (f) {
        text[fread(text, 1, sizeof text - 1, f)] = '\0';
        fclose(f);
    }
    char path[4096];
    snprintf(path, sizeof path, "%s.%ld", out, (long)getpid());
    FILE *o = fopen(path, "w");
    if (!o) return;
    fprintf(o, "hwm_kb %ld rss_kb %ld anon_kb %ld file_kb %ld cuda_kb %ld\n",
            status_kb(text, "VmHWM:"), status_kb(text, "VmRSS:"), status_kb(text, "RssAnon:"),
            status_kb(text, "RssFile:"), cuda_kb());
    fclose(o);
}

__attribute__((constructor)) static void arm(void) { atexit(report); }
