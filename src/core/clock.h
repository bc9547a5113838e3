/* The library's clocks: monotonic wall-clock seconds (CLOCK_MONOTONIC, comparable between the
 * processes of one host) and a thread's CPU seconds. Private to the library. */
#ifndef GP_CORE_CLOCK_H
#define GP_CORE_CLOCK_H

double gp_now(void);
/* The calling thread's CPU seconds (CLOCK_THREAD_CPUTIME_ID): what a piece of work costs the
 * thread that runs it, without the time other processes held its core. Comparable only within
 * one thread. */
double gp_thread_cpu_now(void);
/* The median of n >= 1 timings (the upper middle one for even n); sorts v in place. */
double gp_median(double *v, int n);
/* The mean of n >= 1 timings. */
double gp_mean(const double *v, int n);

#endif
