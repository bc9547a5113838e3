/* Naming the library's own threads (thread_name.h). */
#define _GNU_SOURCE /* pthread_setname_np */
#include "core/thread_name.h"

#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>

bool gp_thread_name(const char *fmt, ...) {
    char name[16]; /* the kernel's limit (TASK_COMM_LEN) with its terminating zero */
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(name, sizeof name, fmt, ap);
    va_end(ap);
    return pthread_setname_np(pthread_self(), name) == 0;
}
