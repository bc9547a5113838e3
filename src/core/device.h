/* The device interface (private): a device is where tensors live and kernels run. Each kind of
 * device (the CPU in kernels/cpu/, later CUDA GPUs) implements the small iface below; this part
 * wraps it with what every device shares: per-category live and peak counters, the limit, a
 * cache of freed blocks by size, and the records that let a block be released by its address
 * alone (kept on the host, since a device's memory may be out of the host's reach).
 *
 * Only a device or kernel implementation touches tensor bytes: everything else moves them with
 * gp_device_copy / gp_device_fill (or the gp_tensor_* wrappers) and computes with the device's
 * kernel table (gp_device_kernels). */
#ifndef GP_CORE_DEVICE_H
#define GP_CORE_DEVICE_H

#include "gpipe.h"

typedef enum gp_copy_kind {
    GP_COPY_HOST_TO_DEVICE = 0,
    GP_COPY_DEVICE_TO_HOST,
    GP_COPY_DEVICE_TO_DEVICE /* both on this device */
} gp_copy_kind;

/* What a kind of device implements. Every member is required unless marked optional; ctx is
 * the implementation's own state, given at gp_device_new. Raw memory only: the accounting, the
 * limit and the cache are the wrapper's. Errors name the device, the call and the cause. */
typedef struct gp_device_iface {
    const char *kind; /* "cpu", "cuda" */
    /* The device's pointers are host addresses: host code may view its memory directly (a
     * host tensor view of it is valid) and copies are plain memory copies. */
    bool host_memory;
    gp_status (*alloc)(void *ctx, size_t nbytes, void **ptr); /* 64-byte aligned at least */
    void (*free)(void *ctx, void *ptr);
    gp_status (*copy)(void *ctx, void *dst, const void *src, size_t nbytes, gp_copy_kind kind);
    gp_status (*fill)(void *ctx, void *dst, size_t nbytes, int byte);
    gp_status (*sync)(void *ctx); /* waits for the device's queued work */
    /* Optional: copies nbytes from src, in the memory of another device of the same kind (its
     * context from_ctx), to dst without the host, after the work queued so far on both devices
     * and before any queued later on either. NULL: copies between two such devices go through
     * host memory (gp_tensor_copy). */
    gp_status (*copy_peer)(void *ctx, void *dst, void *from_ctx, const void *src, size_t nbytes);
    void (*destroy)(void *ctx);   /* optional: frees ctx when the device goes */
} gp_device_iface;

struct gp_kernels; /* kernels/kernels.h: the op table */

/* A device of the given kind: the wrapper takes ctx (iface->destroy frees it with the device)
 * and borrows kernels. name is copied. */
gp_status gp_device_new(const char *name, const gp_device_iface *iface, void *ctx,
                        const struct gp_kernels *kernels, gp_device **out);
void *gp_device_context(const gp_device *dev);
const struct gp_kernels *gp_device_kernels(const gp_device *dev);

/* Allocates nbytes counted under cat. On failure returns NULL with the message set (naming
 * device, category, request and limit) and *status set when status is not NULL. */
void *gp_device_alloc(gp_device *dev, gp_mem_category cat, size_t nbytes, gp_status *status);
/* Frees memory from gp_device_alloc on the same device; NULL is ignored. */
void gp_device_release(gp_device *dev, void *p);
/* Host memory held for the device's work (a communication buffer for its memory: the host copy
 * of a gradient bucket, a partner's partial sum), allocated by the caller and counted here as
 * live bytes of cat, as if the device had allocated them: under its limit (GP_MEMORY_LIMIT
 * naming `what` where they would pass it) and in its statistics. gp_device_uncount_host gives
 * back bytes counted so. */
gp_status gp_device_count_host(gp_device *dev, gp_mem_category cat, size_t nbytes,
                               const char *what);
void gp_device_uncount_host(gp_device *dev, gp_mem_category cat, size_t nbytes);
/* While on, blocks the device would give back to its backend (a trim, a size with no cache bin,
 * a build without the cache) are held instead, until it is turned off or
 * gp_device_release_held: a backend's free that waits for the whole GPU (cudaFree) must not run
 * while an NCCL operation of this GPU waits for another process, which may itself be waiting
 * for this one. Held blocks count neither as live nor as cached. */
void gp_device_hold_frees(gp_device *dev, bool on);
void gp_device_release_held(gp_device *dev);
/* Optional: a bound on the host's waits for the device's queued work (gp_device_sync, a copy to
 * or from the host, a backend's kernel that reads a result back). While set, every such wait
 * first calls wait(ctx, what), which returns once the work queued so far is done, or with an
 * error when its own deadline passes or a peer fails: a stream holding a collective whose peers
 * may be gone (NCCL's gradient sums) would otherwise hold the host forever. wait NULL: none. */
typedef gp_status (*gp_device_wait_fn)(void *ctx, const char *what);
void gp_device_bound_waits(gp_device *dev, gp_device_wait_fn wait, void *ctx);
/* The bound's wait for `what` (GP_OK at once where none is set): a backend calls it before each
 * wait of its own that the device's interface does not make (a kernel's read-back). */
gp_status gp_device_wait_bounded(gp_device *dev, const char *what);
/* Through the iface, with the device named in errors; a copy to or from the host and the sync
 * first take the bound's wait. */
gp_status gp_device_copy(gp_device *dev, void *dst, const void *src, size_t nbytes,
                         gp_copy_kind kind);
gp_status gp_device_fill(gp_device *dev, void *dst, size_t nbytes, int byte);
/* Copies nbytes from src on device from to dst on dev, two devices of the same kind, without
 * the host where the kind can (iface->copy_peer); *done false where it cannot (nothing done). */
gp_status gp_device_copy_peer(gp_device *dev, void *dst, gp_device *from, const void *src,
                              size_t nbytes, bool *done);

#endif
