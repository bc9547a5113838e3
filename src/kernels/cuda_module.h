/* The boundary between the library and the CUDA device's module (libgpipe_cuda.so, built from
 * kernels/cuda/): the one symbol the module exports, and the tables passed each way through it.
 * The library loads the module (kernels/cuda_module.c) the first time a CUDA device is asked
 * for, so that a process that never asks maps neither it nor the CUDA libraries it needs. C and
 * CUDA C++ both include it. */
#ifndef GP_KERNELS_CUDA_MODULE_H
#define GP_KERNELS_CUDA_MODULE_H

#include <stddef.h>

#include "core/device.h"
#include "gpipe.h"

#ifdef __cplusplus
extern "C" {
#endif

struct gp_kernels;

/* The module's one exported function, resolved by name. */
#define GP_CUDA_MODULE_ENTRY "gp_cuda_module_entry"

/* The library's calls the module makes, passed to it rather than linked: a program linked with
 * libgpipe.a exports none of its symbols to a module it loads, and a module with no undefined
 * gpipe symbol links with --no-undefined and cannot bind to another copy of the library. Each
 * is the function of the same name in core/ (error.h, device.h) or gpipe.h. */
typedef struct gp_cuda_host {
    gp_status (*error)(gp_status s, const char *fmt, ...);
    gp_status (*error_context)(gp_status s, const char *fmt, ...);
    void (*abort_)(const char *file, int line, const char *what);
    gp_status (*device_new)(const char *name, const gp_device_iface *iface, void *ctx,
                            const struct gp_kernels *kernels, gp_device **out);
    void *(*device_context)(const gp_device *dev);
    void *(*device_alloc)(gp_device *dev, gp_mem_category cat, size_t nbytes, gp_status *status);
    void (*device_release)(gp_device *dev, void *p);
    gp_precision (*device_precision)(const gp_device *dev);
} gp_cuda_host;

/* What the module gives. `abi` comes first and stays first in every version, so that the
 * library can read it from any module before it relies on anything else: the version and a
 * hash of the headers both sides share (GP_CUDA_MODULE_ABI, set by the build), and a module
 * whose abi differs from the library's is refused. bind is called once, before anything else,
 * with tables that live as long as the process. */
typedef struct gp_cuda_module {
    const char *abi;
    void (*bind)(const gp_cuda_host *host);
    gp_status (*device_count)(int *count);
    gp_status (*device_new)(const char *name, int ordinal, gp_device **out);
    /* GPU ordinal's free bytes now (cudaMemGetInfo); ordinal in range, checked by the library */
    gp_status (*device_memory)(int ordinal, size_t *free_bytes);
    const struct gp_kernels *kernels;
} gp_cuda_module;

/* The entry, defined by the module (kernels/cuda/cuda_device.c) and found with dlsym. */
const gp_cuda_module *gp_cuda_module_entry(void);
typedef const gp_cuda_module *(*gp_cuda_module_entry_fn)(void);

/* The library's side (kernels/cuda_module.c): the CUDA kernel table, from the module, which is
 * loaded the first time anything asks for it. */
gp_status gp_cuda_kernels(const struct gp_kernels **table);
/* GPU ordinal's free bytes, from the module (GP_INVALID_ARGUMENT for an ordinal out of range). */
gp_status gp_cuda_memory(int ordinal, uint64_t *available);

#ifdef __cplusplus
}
#endif

#endif
