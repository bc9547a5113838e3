/* The cores pinned stage threads take, and in which order. */
#ifndef GP_PLAN_CORES_H
#define GP_PLAN_CORES_H

/* The cores this process may run on (sched_getaffinity), at most `max` of them, ordered as
 * gp_cores_order_by_siblings orders them under /sys/devices/system/cpu; returns how many (0
 * where the affinity cannot be read). */
int gp_pinning_cores(int *cores, int max);

/* Reorders cores[0..n) so that one hardware thread of every physical core comes before any
 * core's second: a core's first listed thread, in the given order, then the second threads, and
 * so on. Two stages on the two threads of one core share its FMA units and caches, so each runs
 * far below a core of its own; with threads numbered 0,1 = one core (common on cloud machines),
 * pinning stages to 0..K-1 would put K stages on K/2 cores. `cpu_dir` holds cpuN/topology/
 * thread_siblings_list (the kernel's cpulist format, "0,8" or "0-1"); a thread whose list cannot
 * be read is taken as a core of its own, so the order is unchanged where sysfs says nothing. */
void gp_cores_order_by_siblings(const char *cpu_dir, int *cores, int n);

#endif
