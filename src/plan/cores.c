/* Topology-aware order of the cores pinned stages take (see cores.h). */
#define _GNU_SOURCE /* sched_getaffinity, CPU_SET */
#include "plan/cores.h"

#include <sched.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Whether `cpu` is in a cpulist such as "0-3,8,10-11". A malformed list is taken to hold only
 * what was parsed before the fault. */
static bool in_cpulist(const char *s, int cpu) {
    while (*s) {
        char *end;
        const long lo = strtol(s, &end, 10);
        if (end == s) return false;
        long hi = lo;
        s = end;
        if (*s == '-') {
            hi = strtol(s + 1, &end, 10);
            if (end == s + 1) return false;
            s = end;
        }
        if (cpu >= lo && cpu <= hi) return true;
        if (*s != ',') return false;
        s++;
    }
    return false;
}

/* cpu's sibling list, read into buf; false where there is none to read. */
static bool read_siblings(const char *cpu_dir, int cpu, char *buf, size_t size) {
    char path[512];
    snprintf(path, sizeof path, "%s/cpu%d/topology/thread_siblings_list", cpu_dir, cpu);
    FILE *f = fopen(path, "r");
    if (!f) return false;
    const bool ok = fgets(buf, (int)size, f) != NULL;
    fclose(f);
    if (ok) buf[strcspn(buf, "\n")] = '\0';
    return ok;
}

void gp_cores_order_by_siblings(const char *cpu_dir, int *cores, int n) {
    if (n < 2) return;
    /* rank[i]: how many of cores[0..i) share cores[i]'s physical core */
    int *rank = calloc((size_t)n, sizeof *rank), *sorted = malloc((size_t)n * sizeof *sorted);
    if (!rank || !sorted) { /* an unordered list still pins: leave it as it is */
        free(rank);
        free(sorted);
        return;
    }
    int max_rank = 0;
    for (int i = 0; i < n; i++) {
        char list[256];
        if (!read_siblings(cpu_dir, cores[i], list, sizeof list)) continue;
        for (int j = 0; j < i; j++) rank[i] += in_cpulist(list, cores[j]);
        if (rank[i] > max_rank) max_rank = rank[i];
    }
    int m = 0;
    for (int r = 0; r <= max_rank; r++)
        for (int i = 0; i < n; i++)
            if (rank[i] == r) sorted[m++] = cores[i];
    memcpy(cores, sorted, (size_t)n * sizeof *cores);
    free(rank);
    free(sorted);
}

int gp_pinning_cores(int *cores, int max) {
    cpu_set_t set;
    int n = 0;
    CPU_ZERO(&set);
    if (sched_getaffinity(0, sizeof set, &set) != 0) return 0;
    for (int c = 0; c < CPU_SETSIZE && n < max; c++)
        if (CPU_ISSET(c, &set)) cores[n++] = c;
    gp_cores_order_by_siblings("/sys/devices/system/cpu", cores, n);
    return n;
}
