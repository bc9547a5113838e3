/* Internal error reporting: set the per-thread message and return a status
 * in one expression, so every failure path says what, where and expected. */
#ifndef GP_CORE_ERROR_H
#define GP_CORE_ERROR_H

#include "gpipe.h"

#if defined(__GNUC__)
#define GP_PRINTF(a, b) __attribute__((format(printf, a, b)))
#else
#define GP_PRINTF(a, b)
#endif

/* Sets the thread's message to "<fmt...>" and returns s. */
gp_status gp_error(gp_status s, const char *fmt, ...) GP_PRINTF(2, 3);
/* Prefixes the current message with "<fmt...>: ", keeping the status. */
gp_status gp_error_context(gp_status s, const char *fmt, ...) GP_PRINTF(2, 3);

#define GP_TRY(expr)                                                       \
    do {                                                                   \
        gp_status gp_try_s_ = (expr);                                      \
        if (gp_try_s_ != GP_OK) return gp_try_s_;                          \
    } while (0)

/* Internal invariants only (programmer errors), never input validation. */
#define GP_ASSERT(cond)                                                    \
    do {                                                                   \
        if (!(cond)) gp_abort_(__FILE__, __LINE__, #cond);                 \
    } while (0)
/* C11's _Noreturn, or C++'s attribute where the CUDA kernels (C++) include this header. */
#if defined(__cplusplus)
#define GP_NORETURN [[noreturn]]
#else
#define GP_NORETURN _Noreturn
#endif
GP_NORETURN void gp_abort_(const char *file, int line, const char *what);

#endif
