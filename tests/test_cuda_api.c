/* The CUDA device's public calls. Without CUDA in the build, or without a GPU, they must fail
 * with GP_UNSUPPORTED and say which (this runs everywhere: on a machine without a GPU it checks
 * those messages); with a GPU, a device on it must count its memory, honour a limit and move
 * bytes both ways. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "testutil.h"

#define NO_CUDA "gpipe was built without CUDA (GP_CUDA=OFF or no nvcc)"

static void without_gpu(bool built) {
    const char *why = built ? "no CUDA GPU available" : NO_CUDA;
    int count = -1;
    CHECK_FAILS(gp_cuda_device_count(&count), GP_UNSUPPORTED, why);
    CHECK_EQ_INT(count, 0);
    gp_device *dev = (gp_device *)&count; /* must be cleared */
    CHECK_FAILS(gp_device_cuda_new("gpu0", 0, &dev), GP_UNSUPPORTED, why);
    CHECK(dev == NULL);
    CHECK_FAILS(gp_device_cuda_new("gpu0", 0, &dev), GP_UNSUPPORTED, "CUDA device gpu0 (GPU 0)");
    printf("as expected: %s\n", gp_last_error());
}

/* A choice the environment makes for the devices made while it is set: a bad value is refused
 * by name, both good ones make a device; the run's own value is put back after. */
static void env_switch(const char *var, const char *bad, const char *refusal, const char *good0,
                       const char *good1) {
    gp_device *dev = NULL;
    const char *given = getenv(var);
    char kept[32] = "";
    if (given) snprintf(kept, sizeof kept, "%s", given);
    setenv(var, bad, 1);
    CHECK_FAILS(gp_device_cuda_new("gpu", 0, &dev), GP_INVALID_ARGUMENT, refusal);
    for (int i = 0; i < 2; i++) {
        setenv(var, i ? good1 : good0, 1);
        REQUIRE_OK(gp_device_cuda_new("gpu", 0, &dev));
        gp_device_free(dev);
    }
    if (given)
        setenv(var, kept, 1);
    else
        unsetenv(var);
}

static void with_gpu(int count) {
    gp_device *dev = NULL;
    CHECK_FAILS(gp_device_cuda_new("gpu", count, &dev), GP_INVALID_ARGUMENT, "expected 0 to");
    CHECK_FAILS(gp_device_cuda_new("gpu", -1, &dev), GP_INVALID_ARGUMENT, "expected 0 to");
    env_switch("GP_CUDA_ATTENTION", "flash", "GP_CUDA_ATTENTION=flash: expected fused", "fused",
               "gemm");
    env_switch("GP_CUDA_EPILOGUE", "fused", "GP_CUDA_EPILOGUE=fused: expected lt", "lt",
               "prefill");
    REQUIRE_OK(gp_device_cuda_new("gpu0", 0, &dev));
    CHECK(strcmp(gp_device_kind(dev), "cuda") == 0);
    CHECK(strcmp(gp_device_name(dev), "gpu0") == 0);
    CHECK(!gp_device_is_host(dev));
    gp_tensor t;
    REQUIRE_OK(gp_tensor_alloc(dev, GP_MEM_ACTIVATIONS, gp_shape2(3, 5), GP_F32, &t));
    CHECK(gp_tensor_host_data(&t) == NULL);
    float src[15], back[15];
    for (int i = 0; i < 15; i++) src[i] = (float)i * 0.5f - 3.0f;
    CHECK_OK(gp_tensor_from_host(&t, src, sizeof src));
    CHECK_OK(gp_tensor_to_host(&t, back, sizeof back));
    CHECK(memcmp(src, back, sizeof src) == 0);
    gp_tensor z;
    REQUIRE_OK(gp_tensor_zeros(dev, GP_MEM_PARAMS, gp_shape1(15), GP_F32, &z));
    CHECK_OK(gp_tensor_copy(&z, &t)); /* device to device */
    memset(back, 0, sizeof back);
    CHECK_OK(gp_tensor_to_host(&z, back, sizeof back));
    CHECK(memcmp(src, back, sizeof src) == 0);
    gp_mem_stats st;
    gp_device_mem_stats(dev, &st);
    CHECK_EQ_INT(st.live[GP_MEM_ACTIVATIONS], 60);
    CHECK_EQ_INT(st.live[GP_MEM_PARAMS], 60);
    CHECK_OK(gp_device_set_limit(dev, 1000));
    gp_tensor big;
    CHECK_FAILS(gp_tensor_alloc(dev, GP_MEM_WORKSPACE, gp_shape1(1000), GP_F32, &big),
                GP_MEMORY_LIMIT, "gpu0");
    gp_tensor_release(&t);
    gp_tensor_release(&z);
    CHECK_OK(gp_device_sync(dev));
    gp_device_free(dev);
}

int main(void) {
    int count = 0;
    const bool built = gp_cuda_built();
    if (built && gp_cuda_device_count(&count) == GP_OK) {
        printf("%d CUDA GPU(s): checking a device on GPU 0\n", count);
        with_gpu(count);
    } else {
        without_gpu(built);
    }
    return gp_test_finish("test_cuda_api");
}
