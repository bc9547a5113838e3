/* What the command-line tool (and the benchmarks and tests beside it) need that a user of the
 * library does not: the clock, the sgemm ceiling every benchmark figure is divided by, the
 * --partition parser and the MPI job abort. Private to tools/, bench/ and tests/; it calls the
 * public API, CBLAS and MPI, never the library's insides. */
#ifndef GP_TOOLS_SUPPORT_H
#define GP_TOOLS_SUPPORT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* Monotonic wall-clock seconds. */
double gp_cli_now(void);
/* This process's CPU seconds, every thread's: the work a step did, which, unlike its wall time,
 * another process's load on a shared machine hardly moves. */
double gp_cli_cpu_now(void);

/* Measures row-major sgemm (m x k) by (k x n) on `threads` threads: the best GFLOP/s over
 * `reps` timed runs after one warm-up. As a gpipe CPU device runs a GEMM (the rows of C in
 * `threads` blocks, each a single-threaded sgemm on a thread of its own), or with
 * openblas_threads as OpenBLAS runs it on that many threads of its own pool (set back to one
 * thread after: gpipe runs OpenBLAS single-threaded). The first is the ceiling a training
 * figure on that many threads is divided by. False (why says why) when the arguments are not
 * positive or a thread cannot start. */
#define GP_CLI_SGEMM_MAX_THREADS 1024
bool gp_cli_bench_sgemm(int64_t m, int64_t n, int64_t k, int threads, bool openblas_threads,
                        int reps, double *gflops, char *why, size_t why_size);

/* A kernel benchmark's start (its first call: it may restart the program with OpenBLAS's
 * kernels corrected, gp_cli_blas_core_check): its CPU device of argv[1] threads (default 1) and its repetitions
 * argv[2] (default defreps, 1 to maxreps). False after printing the usage or the failure, with
 * *exit_code the status to exit with. */
typedef struct gp_device gp_device;
bool gp_cli_bench_start(const char *name, int argc, char **argv, int defreps, int maxreps,
                        int *threads, int *reps, gp_device **dev, int *exit_code);
/* n floats drawn from N(0, 1) by the test stream `stream` of seed 7 (exits when out of memory). */
float *gp_cli_bench_normal(int64_t n, uint32_t stream);

/* Parses "0,5,9" (the first layer of each cell; spaces allowed around the numbers) into
 * first[0..*n-1], at most cap entries. False with the reason in why (naming the position). */
bool gp_cli_parse_partition(const char *text, int *first, int cap, int *n, char *why,
                            size_t why_size);

/* After a failure has been printed: flushes stdout and stderr and ends every rank of an MPI job
 * (MPI_Abort); nothing when MPI is not initialized or not built. */
void gp_cli_mpi_abort(int code);

#endif
