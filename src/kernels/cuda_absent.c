/* The CUDA device's public calls in a build without CUDA (GP_CUDA=OFF, or no nvcc found): each
 * says so, so that a program asking for a GPU learns why it has none. The build compiles this
 * file in place of cuda/ (CMakeLists.txt). */
#include "core/error.h"

#define GP_NO_CUDA "gpipe was built without CUDA (GP_CUDA=OFF or no nvcc)"

bool gp_cuda_built(void) { return false; }

gp_status gp_cuda_device_count(int *count) {
    if (count) *count = 0;
    return gp_error(GP_UNSUPPORTED, "%s", GP_NO_CUDA);
}

gp_status gp_device_cuda_new(const char *name, int ordinal, gp_device **out) {
    if (out) *out = NULL;
    return gp_error(GP_UNSUPPORTED, "CUDA device %s (GPU %d): %s", name ? name : "cuda", ordinal,
                    GP_NO_CUDA);
}
