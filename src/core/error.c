/* Status names, messages and the per-thread last-error buffer. */
#include "core/error.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static _Thread_local char last_error[1024];

static const char *const status_names[] = {
#define GP_NAME_(name, msg) "GP_" #name,
    GP_STATUS_MAP(GP_NAME_)
#undef GP_NAME_
};
static const char *const status_messages[] = {
#define GP_MSG_(name, msg) msg,
    GP_STATUS_MAP(GP_MSG_)
#undef GP_MSG_
};

const char *gp_status_name(gp_status s) {
    return (s >= 0 && s < GP_STATUS_COUNT) ? status_names[s] : "GP_UNKNOWN";
}

const char *gp_status_message(gp_status s) {
    return (s >= 0 && s < GP_STATUS_COUNT) ? status_messages[s] : "unknown status";
}

const char *gp_last_error(void) { return last_error; }

void gp_clear_error(void) { last_error[0] = '\0'; }

gp_status gp_error(gp_status s, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(last_error, sizeof last_error, fmt, ap);
    va_end(ap);
    return s;
}

gp_status gp_error_context(gp_status s, const char *fmt, ...) {
    char prefix[512], old[sizeof last_error];
    memcpy(old, last_error, sizeof old);
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(prefix, sizeof prefix, fmt, ap);
    va_end(ap);
    snprintf(last_error, sizeof last_error, "%.400s: %.600s", prefix, old);
    return s;
}

void gp_abort_(const char *file, int line, const char *what) {
    fprintf(stderr, "gpipe: internal invariant failed at %s:%d: %s\n", file, line, what);
    abort();
}

const char *gp_version(void) { return "0.1.0"; }
