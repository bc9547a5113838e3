/* The registry of device kinds (devices.h) and the public calls that ask it by kind
 * (gp_device_type_*). */
#include "kernels/devices.h"

#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "core/error.h"
#include "kernels/cpu/cpu_device.h"
#include "kernels/cuda_module.h"

/* The host is one device; every CPU device made is on it. */
static gp_status cpu_count(int *count) {
    *count = 1;
    return GP_OK;
}

static gp_status cpu_make(const char *name, int index, int threads, gp_device **out) {
    (void)index;
    return gp_device_cpu_new_threads(name, threads, out);
}

/* MemAvailable (free memory and the caches the kernel can drop), else the free pages alone. */
static gp_status cpu_memory(int index, uint64_t *available) {
    (void)index;
    FILE *f = fopen("/proc/meminfo", "r");
    char line[256];
    unsigned long long kib = 0;
    while (f && fgets(line, sizeof line, f))
        if (sscanf(line, "MemAvailable: %llu kB", &kib) == 1) break;
    if (f) fclose(f);
    if (kib) {
        *available = (uint64_t)kib * 1024;
        return GP_OK;
    }
    const long pages = sysconf(_SC_AVPHYS_PAGES), size = sysconf(_SC_PAGESIZE);
    if (pages > 0 && size > 0) {
        *available = (uint64_t)pages * (uint64_t)size;
        return GP_OK;
    }
    return gp_error(GP_UNSUPPORTED, "the host's available memory is not known (no MemAvailable "
                                    "in /proc/meminfo, no _SC_AVPHYS_PAGES)");
}

static gp_status cpu_ops(const gp_kernels **table) {
    *table = gp_cpu_kernels();
    return GP_OK;
}

/* Device index on GPU index mod the GPUs visible: a pipeline's stage shard w on GPU w mod n. */
static gp_status cuda_make(const char *name, int index, int threads, gp_device **out) {
    (void)threads;
    int count = 0;
    GP_TRY(gp_cuda_device_count(&count));
    return gp_device_cuda_new(name, index % count, out);
}

static gp_status cuda_memory(int index, uint64_t *available) {
    int count = 0;
    GP_TRY(gp_cuda_device_count(&count));
    return gp_cuda_memory(index % count, available);
}

const gp_device_entry gp_device_registry[] = {
    {"cpu", GP_DEVICE_CPU, cpu_count, cpu_make, cpu_memory, cpu_ops},
    {"cuda", GP_DEVICE_CUDA, gp_cuda_device_count, cuda_make, cuda_memory, gp_cuda_kernels},
};
const int gp_device_registry_size =
    (int)(sizeof gp_device_registry / sizeof gp_device_registry[0]);

/* "cpu (0) or cuda (1)" with values, else "cpu or cuda". */
static const char *kinds_list(bool values, char *buf, size_t cap) {
    size_t used = 0;
    buf[0] = '\0';
    for (int i = 0; i < gp_device_registry_size && used < cap; i++) {
        const gp_device_entry *e = &gp_device_registry[i];
        const char *sep = i == 0 ? "" : i + 1 == gp_device_registry_size ? " or " : ", ";
        const int n = values ? snprintf(buf + used, cap - used, "%s%s (%d)", sep, e->name,
                                        (int)e->type)
                             : snprintf(buf + used, cap - used, "%s%s", sep, e->name);
        used += n > 0 ? (size_t)n : 0;
    }
    return buf;
}

static const gp_device_entry *find(gp_device_type type) {
    for (int i = 0; i < gp_device_registry_size; i++)
        if (gp_device_registry[i].type == type) return &gp_device_registry[i];
    return NULL;
}

gp_status gp_device_registry_get(gp_device_type type, const gp_device_entry **out) {
    *out = find(type);
    if (*out) return GP_OK;
    char list[256];
    return gp_error(GP_INVALID_ARGUMENT, "device type %d is no kind of device: expected %s",
                    (int)type, kinds_list(true, list, sizeof list));
}

const char *gp_device_type_name(gp_device_type type) {
    const gp_device_entry *k = find(type);
    return k ? k->name : "unknown";
}

gp_status gp_device_type_parse(const char *name, gp_device_type *type) {
    if (!name || !type)
        return gp_error(GP_INVALID_ARGUMENT, "gp_device_type_parse: name or type is NULL");
    for (int i = 0; i < gp_device_registry_size; i++)
        if (strcmp(gp_device_registry[i].name, name) == 0) {
            *type = gp_device_registry[i].type;
            return GP_OK;
        }
    char list[256];
    return gp_error(GP_INVALID_ARGUMENT, "device kind '%s': expected %s", name,
                    kinds_list(false, list, sizeof list));
}

gp_status gp_device_type_count(gp_device_type type, int *count) {
    if (!count) return gp_error(GP_INVALID_ARGUMENT, "gp_device_type_count: count is NULL");
    *count = 0;
    const gp_device_entry *k;
    GP_TRY(gp_device_registry_get(type, &k));
    return k->count(count);
}

gp_status gp_device_type_new(gp_device_type type, const char *name, int index, int threads,
                             gp_device **out) {
    if (!out) return gp_error(GP_INVALID_ARGUMENT, "gp_device_type_new: out is NULL");
    *out = NULL;
    if (index < 0)
        return gp_error(GP_INVALID_ARGUMENT, "gp_device_type_new: index %d, expected >= 0", index);
    const gp_device_entry *k;
    GP_TRY(gp_device_registry_get(type, &k));
    return k->make(name, index, threads, out);
}

gp_status gp_device_type_memory(gp_device_type type, int index, uint64_t *available) {
    if (!available)
        return gp_error(GP_INVALID_ARGUMENT, "gp_device_type_memory: available is NULL");
    *available = 0;
    if (index < 0)
        return gp_error(GP_INVALID_ARGUMENT, "gp_device_type_memory: index %d, expected >= 0",
                        index);
    const gp_device_entry *k;
    GP_TRY(gp_device_registry_get(type, &k));
    return k->memory(index, available);
}
