/* Names for the threads the library starts, so that top -H, perf, gdb and /proc show which
 * stage, pool worker or writer each one is ("gp-stage-1", "gp-pool-3", ...). */
#ifndef GP_CORE_THREAD_NAME_H
#define GP_CORE_THREAD_NAME_H

#include <stdbool.h>

/* Names the calling thread by a printf format, cut to the 15 bytes the kernel keeps. Only for
 * threads the library created: a caller's own thread keeps its name. Best effort: false where
 * the system refuses (the thread runs on unnamed). */
bool gp_thread_name(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

#endif
