/* The CUDA device's public calls, on its module (kernels/cuda_module.h) loaded with dlopen the
 * first time one of them is made: a process that never asks for a GPU maps neither the module
 * nor the CUDA runtime and cuBLAS it links, and a missing or broken CUDA installation is an
 * error of the call that asked, not a failure to start. Where the module is: $GP_CUDA_MODULE
 * (that file alone, in any build), else beside the library's own file, found with dladdr
 * (libgpipe.so, or the program linked with libgpipe.a): <dir>/gpipe/ (libgpipe.so installed in
 * LIBDIR), <dir>/<BINDIR to LIBDIR>/gpipe/ (a program installed in BINDIR), <dir>/ (the build
 * tree), then the configured LIBDIR/gpipe/. */
#define _GNU_SOURCE /* dladdr1, realpath */
#include <dlfcn.h>
#include <limits.h>
#include <link.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/device.h"
#include "core/error.h"
#include "kernels/cuda_module.h"

/* Set by the build (CMakeLists.txt): the module's ABI (GP_CUDA_MODULE_ABI), and where a build
 * with CUDA installs it: GP_CUDA_MODULE_FILE, GP_CUDA_MODULE_FROM_BINDIR (LIBDIR/gpipe relative
 * to BINDIR), GP_CUDA_MODULE_INSTALLED (the configured LIBDIR/gpipe/FILE). */
#ifndef GP_CUDA_MODULE_ABI
#error "GP_CUDA_MODULE_ABI is set by the build"
#endif

#define GP_NO_CUDA "gpipe was built without CUDA (GP_CUDA=OFF or no nvcc)"

static const gp_cuda_host host_calls = {
    .error = gp_error,
    .error_context = gp_error_context,
    .abort_ = gp_abort_,
    .device_new = gp_device_new,
    .device_context = gp_device_context,
    .device_alloc = gp_device_alloc,
    .device_release = gp_device_release,
    .device_precision = gp_device_precision,
    .device_wait_bounded = gp_device_wait_bounded,
};

static pthread_mutex_t load_lock = PTHREAD_MUTEX_INITIALIZER;
static const gp_cuda_module *loaded; /* once bound, for the life of the process */

/* Loads the module at path, or says why not: the file cannot be loaded (dlerror names the file
 * or the library it needs that is missing), it is not a gpipe CUDA module, or it is one of
 * another build. */
static gp_status load_file(const char *path, const gp_cuda_module **out) {
    void *h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (!h)
        return gp_error(GP_UNSUPPORTED, "cannot load the CUDA device's module %s: %s", path,
                        dlerror());
    void *sym = dlsym(h, GP_CUDA_MODULE_ENTRY);
    if (!sym) {
        const gp_status s = gp_error(GP_UNSUPPORTED,
                                     "%s is not a gpipe CUDA module (no %s): %s", path,
                                     GP_CUDA_MODULE_ENTRY, dlerror());
        dlclose(h);
        return s;
    }
    gp_cuda_module_entry_fn entry;
    memcpy(&entry, &sym, sizeof entry); /* dlsym's object pointer to the function it names */
    const gp_cuda_module *m = entry();
    if (!m || !m->abi || strcmp(m->abi, GP_CUDA_MODULE_ABI) != 0) {
        const gp_status s =
            gp_error(GP_UNSUPPORTED,
                     "the CUDA device's module %s is of another gpipe build (%s), this library "
                     "is %s: install the module built with this library, or name it in "
                     "GP_CUDA_MODULE",
                     path, m && m->abi ? m->abi : "none given", GP_CUDA_MODULE_ABI);
        dlclose(h);
        return s;
    }
    m->bind(&host_calls);
    *out = m;
    return GP_OK;
}

#ifdef GP_CUDA_MODULE_FILE
static const char self_marker; /* an address inside the library's own file */

/* The folder of the file this code was loaded from into dir: libgpipe.so's, or the program's
 * where libgpipe.a was linked into it (the main program's link map has no name). */
static bool self_folder(char *dir, size_t cap) {
    Dl_info info;
    struct link_map *map = NULL;
    char file[PATH_MAX];
    if (dladdr1(&self_marker, &info, (void **)&map, RTLD_DL_LINKMAP) && map && map->l_name &&
        map->l_name[0]) {
        if (!realpath(map->l_name, file)) snprintf(file, sizeof file, "%s", map->l_name);
    } else {
        const ssize_t n = readlink("/proc/self/exe", file, sizeof file - 1);
        if (n <= 0) return false;
        file[n] = '\0';
    }
    char *slash = strrchr(file, '/');
    if (!slash) return false;
    *slash = '\0';
    return snprintf(dir, cap, "%s", file) < (int)cap;
}

/* The first of the places the module is installed or built that holds it, else an error
 * naming them all. */
static gp_status load_installed(const gp_cuda_module **out) {
    char dir[PATH_MAX], paths[4][PATH_MAX + 64];
    int n = 0;
    if (self_folder(dir, sizeof dir)) {
        snprintf(paths[n++], sizeof paths[0], "%s/gpipe/%s", dir, GP_CUDA_MODULE_FILE);
        snprintf(paths[n++], sizeof paths[0], "%s/%s/%s", dir, GP_CUDA_MODULE_FROM_BINDIR,
                 GP_CUDA_MODULE_FILE);
        snprintf(paths[n++], sizeof paths[0], "%s/%s", dir, GP_CUDA_MODULE_FILE);
    }
    snprintf(paths[n++], sizeof paths[0], "%s", GP_CUDA_MODULE_INSTALLED);
    for (int i = 0; i < n; i++)
        if (access(paths[i], F_OK) == 0) return load_file(paths[i], out);
    char tried[900] = "";
    for (int i = 0, used = 0; i < n && used < (int)sizeof tried; i++)
        used += snprintf(tried + used, sizeof tried - (size_t)used, "%s%s", i ? ", " : "",
                         paths[i]);
    return gp_error(GP_UNSUPPORTED,
                    "the CUDA device's module is not installed: none of %s exists (GP_CUDA_MODULE "
                    "may name it)",
                    tried);
}
#else
static gp_status load_installed(const gp_cuda_module **out) {
    (void)out;
    return gp_error(GP_UNSUPPORTED, "%s", GP_NO_CUDA);
}
#endif

/* The module, loaded and bound on the first call that succeeds; a failure is said again (and
 * the module looked for again) on every call. */
static gp_status module(const gp_cuda_module **out) {
    pthread_mutex_lock(&load_lock);
    gp_status s = GP_OK;
    if (!loaded) {
        const char *path = getenv("GP_CUDA_MODULE");
        s = path && path[0] ? load_file(path, &loaded) : load_installed(&loaded);
    }
    *out = loaded;
    pthread_mutex_unlock(&load_lock);
    return s;
}

bool gp_cuda_built(void) {
#ifdef GP_CUDA_MODULE_FILE
    return true;
#else
    return false;
#endif
}

gp_status gp_cuda_device_count(int *count) {
    if (!count) return gp_error(GP_INVALID_ARGUMENT, "gp_cuda_device_count: count is NULL");
    *count = 0;
    const gp_cuda_module *m;
    GP_TRY(module(&m));
    return m->device_count(count);
}

gp_status gp_device_cuda_new(const char *name, int ordinal, gp_device **out) {
    if (!out) return gp_error(GP_INVALID_ARGUMENT, "gp_device_cuda_new: out is NULL");
    *out = NULL;
    if (!name) name = "cuda";
    const gp_cuda_module *m;
    const gp_status s = module(&m);
    if (s != GP_OK) return gp_error_context(s, "CUDA device %s (GPU %d)", name, ordinal);
    return m->device_new(name, ordinal, out);
}

gp_status gp_cuda_kernels(const struct gp_kernels **table) {
    *table = NULL;
    const gp_cuda_module *m;
    GP_TRY(module(&m));
    *table = m->kernels;
    return GP_OK;
}

gp_status gp_cuda_memory(int ordinal, uint64_t *available) {
    *available = 0;
    int count = 0;
    GP_TRY(gp_cuda_device_count(&count));
    if (ordinal < 0 || ordinal >= count)
        return gp_error(GP_INVALID_ARGUMENT, "CUDA memory of GPU %d: expected 0 to %d", ordinal,
                        count - 1);
    const gp_cuda_module *m;
    GP_TRY(module(&m));
    size_t free_bytes = 0;
    GP_TRY(m->device_memory(ordinal, &free_bytes));
    *available = (uint64_t)free_bytes;
    return GP_OK;
}

gp_status gp_cuda_nccl(const gp_nccl_calls **table) {
    *table = NULL;
    const gp_cuda_module *m;
    GP_TRY(module(&m));
    if (!m->nccl)
        return gp_error(GP_UNSUPPORTED, "gpipe was built without NCCL (configure with "
                                        "-DGP_NCCL=ON, which needs GP_CUDA and NCCL)");
    *table = m->nccl;
    return GP_OK;
}
