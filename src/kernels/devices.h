/* The registry of device kinds: every kind of device the library can make, each with its name,
 * its value in gp_pipeline_opts.device_type, its constructor and its op table. Code that needs
 * a device of a kind asks here (the pipeline's stage devices, the public gp_device_type_*
 * calls), never branches on the kind. The CPU is built in; CUDA's entry loads the CUDA module
 * the first time it is asked anything (kernels/cuda_module.c). */
#ifndef GP_KERNELS_DEVICES_H
#define GP_KERNELS_DEVICES_H

#include "gpipe.h"
#include "kernels/kernel_table.h"

typedef struct gp_device_entry {
    const char *name; /* "cpu", "cuda": gp_device_kind() of its devices */
    gp_device_type type;
    /* Devices of the kind the process can reach, at least 1 on GP_OK: the CPU is one; CUDA
     * counts the GPUs visible. GP_UNSUPPORTED, with the reason, where there is none. */
    gp_status (*count)(int *count);
    /* A device named name: device `index` mod count of the kind (a GPU; every CPU device is the
     * host's), with `threads` threads where the kind runs its kernels on host threads. */
    gp_status (*make)(const char *name, int index, int threads, gp_device **out);
    /* The bytes device `index` mod count of the kind can still give (the host's for the CPU). */
    gp_status (*memory)(int index, uint64_t *available);
    /* The ops the kind supports: its op table, every member set. */
    gp_status (*ops)(const gp_kernels **table);
} gp_device_entry;

extern const gp_device_entry gp_device_registry[];
extern const int gp_device_registry_size;

/* The kind of a gp_device_type, or GP_INVALID_ARGUMENT naming the kinds there are. */
gp_status gp_device_registry_get(gp_device_type type, const gp_device_entry **out);

#endif
