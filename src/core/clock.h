/* The library's clock: monotonic wall-clock seconds (CLOCK_MONOTONIC, comparable between the
 * processes of one host). Private to the library. */
#ifndef GP_CORE_CLOCK_H
#define GP_CORE_CLOCK_H

double gp_now(void);
/* The median of n >= 1 timings (the upper middle one for even n); sorts v in place. */
double gp_median(double *v, int n);

#endif
