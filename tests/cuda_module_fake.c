/* Stand-ins for the CUDA device's module (kernels/cuda_module.h), which test_device_registry
 * loads through GP_CUDA_MODULE to see each way a module can fail: one of another build (its abi
 * is not the library's), one that needs a shared library no search finds (GP_FAKE_NEEDS: as a
 * module whose libcudart is missing), and that library (GP_FAKE_LIBRARY), which has no entry.
 * CMakeLists.txt builds each. */
#include "kernels/cuda_module.h"

#define GP_EXPORT __attribute__((visibility("default")))

#ifdef GP_FAKE_LIBRARY
GP_EXPORT int gp_test_absent_library(void) { return 1; }
#else
static const gp_cuda_module other_build = {.abi = "0.0.0-another-build"};

GP_EXPORT const gp_cuda_module *gp_cuda_module_entry(void) { return &other_build; }
#endif

#ifdef GP_FAKE_NEEDS
int gp_test_absent_library(void);
/* A call into the library, so that the linker records it as needed. */
GP_EXPORT int gp_test_needs(void) { return gp_test_absent_library(); }
#endif
