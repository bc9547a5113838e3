/* The library's functions that the CUDA module's files call (core/error.h, core/device.h,
 * gp_device_precision of gpipe.h),
 * defined inside the module as calls through the table the library binds when it loads it
 * (kernels/cuda_module.h): the files of this folder are written as any other part's, and the
 * module has no undefined gpipe symbol. Hidden, as everything in the module but its entry. */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>

#include "core/device.h"
#include "core/error.h"
#include "kernels/cuda/cuda_context.h"
#include "kernels/cuda_module.h"

static const gp_cuda_host *host;

void gp_cuda_bind_host(const gp_cuda_host *h) { host = h; }

/* The message is formatted here and passed as one string: the library's buffer is the one
 * gp_last_error reads, and a va_list does not cross a table of variadic functions. */
GP_PRINTF(3, 0)
static gp_status forward(gp_status (*to)(gp_status, const char *, ...), gp_status s,
                         const char *fmt, va_list ap) {
    char msg[1024];
    vsnprintf(msg, sizeof msg, fmt, ap);
    return to(s, "%s", msg);
}

/* gp_error and gp_error_context: through forward to the table's member of that name. */
#define GP_FORWARD_MESSAGE(name, member)                                                      \
    gp_status name(gp_status s, const char *fmt, ...) {                                      \
        va_list ap;                                                                           \
        va_start(ap, fmt);                                                                    \
        s = forward(host->member, s, fmt, ap);                                                \
        va_end(ap);                                                                           \
        return s;                                                                             \
    }
GP_FORWARD_MESSAGE(gp_error, error)
GP_FORWARD_MESSAGE(gp_error_context, error_context)

void gp_abort_(const char *file, int line, const char *what) {
    host->abort_(file, line, what);
    abort(); /* not reached: the library's does not return */
}

gp_status gp_device_new(const char *name, const gp_device_iface *iface, void *ctx,
                        const struct gp_kernels *kernels, gp_device **out) {
    return host->device_new(name, iface, ctx, kernels, out);
}

void *gp_device_context(const gp_device *dev) { return host->device_context(dev); }

void *gp_device_alloc(gp_device *dev, gp_mem_category cat, size_t nbytes, gp_status *status) {
    return host->device_alloc(dev, cat, nbytes, status);
}

void gp_device_release(gp_device *dev, void *p) { host->device_release(dev, p); }

gp_precision gp_device_precision(const gp_device *dev) { return host->device_precision(dev); }

gp_status gp_device_wait_bounded(gp_device *dev, const char *what) {
    return host->device_wait_bounded(dev, what);
}
