/* GP_CUDA_PROFILE=1: the GPU time of a CUDA device's work, kernel by kernel, where no whole-step
 * profiler is at hand. An event recorded on the device's stream after each launch, cuBLAS call,
 * copy and fill times it against the one before (apart when the GPU had gone idle in between);
 * the sums per name print when the device goes. Off, the hooks test the context's NULL
 * `profile` and nothing more. */
#ifndef GP_KERNELS_CUDA_PROFILE_H
#define GP_KERNELS_CUDA_PROFILE_H

#include <cuda_runtime_api.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct gp_cuda_profile gp_cuda_profile;

struct gp_device;

/* A profile for the device when the environment's GP_CUDA_PROFILE is set (and neither empty nor
 * "0"), else NULL; NULL too, with a line on stderr, when its memory cannot be had. dev: the
 * device, whose bound on waits (gp_device_wait_bounded) comes before the profile's own waits. */
gp_cuda_profile *gp_cuda_profile_new(const char *device, int ordinal, struct gp_device *dev);

/* After a call that queued work named `name` (a string that outlives the profile) on stream. A
 * failing event call turns the profile off with one line on stderr; the caller never sees it. */
void gp_cuda_profile_mark(gp_cuda_profile *p, cudaStream_t stream, const char *name);

/* After the stream was waited for: what is pending is timed, and the next mark starts a new
 * chain (it is counted, with no time), so the GPU's idle time across the wait counts nowhere. */
void gp_cuda_profile_synced(gp_cuda_profile *p);

/* With the stream idle: times what is pending, prints the table to stderr, frees. NULL: none. */
void gp_cuda_profile_free(gp_cuda_profile *p);

#ifdef __cplusplus
}
#endif

#endif
