/* The registry of device kinds and the CUDA module behind its "cuda" entry: every kind found by
 * name and by type, with a complete op table; a CPU training through the registry maps no CUDA
 * library, in any build; a module that is missing, not a module, of another build or that needs
 * a library that is not there is GP_UNSUPPORTED naming the file and the cause, from every call
 * that asks for a GPU, and nothing crashes; in a build with CUDA the module (and the CUDA
 * runtime) is mapped once a GPU is asked for, and only then. */
#include <stdint.h>
#include <string.h>
#include <unistd.h>

#include "kernels/cuda_module.h"
#include "kernels/devices.h"
#include "testutil.h"

/* Whether a mapping of this process names needle (/proc/self/maps, read line by line: its
 * size is not known before). */
static bool mapped(const char *needle) {
    FILE *f = fopen("/proc/self/maps", "r");
    if (!f) {
        fprintf(stderr, "test_device_registry: cannot read /proc/self/maps\n");
        exit(1);
    }
    char line[4096];
    int lines = 0;
    bool found = false;
    while (fgets(line, sizeof line, f)) {
        lines++;
        found = found || strstr(line, needle);
    }
    fclose(f);
    if (lines < 5) { /* the program, libc, the loader, the stack ... */
        fprintf(stderr, "test_device_registry: /proc/self/maps has %d lines\n", lines);
        exit(1);
    }
    return found;
}

static const char *const cuda_files[] = {"libcudart", "libcublas", "libgpipe_cuda"};

static void check_no_cuda_mapped(const char *when) {
    for (size_t i = 0; i < sizeof cuda_files / sizeof cuda_files[0]; i++)
        if (mapped(cuda_files[i])) {
            fprintf(stderr, "%s: %s is mapped\n", when, cuda_files[i]);
            gp_test_failures++;
        }
}

/* Every op of the list (kernel_ops.def) set, each missing one named; a table holds nothing
 * beyond its name and the ops. */
static void check_table_complete(const char *kind, const gp_kernels *t) {
    int ops = 0;
#define GP_KERNEL_OP(op, ret, params)                                                           \
    ops++;                                                                                      \
    if (!t->op) {                                                                               \
        fprintf(stderr, "kind %s: op %s of its table is NULL\n", kind, #op);                    \
        gp_test_failures++;                                                                     \
    }
#include "kernels/kernel_ops.def"
#undef GP_KERNEL_OP
    CHECK(sizeof *t == sizeof(const char *) + (size_t)ops * sizeof(void (*)(void)));
    CHECK(strcmp(t->name, kind) == 0);
}

static void check_registry(void) {
    CHECK(gp_device_registry_size >= 2);
    for (int i = 0; i < gp_device_registry_size; i++) {
        const gp_device_entry *k = &gp_device_registry[i], *got = NULL;
        gp_device_type type = (gp_device_type)-1;
        CHECK_OK(gp_device_type_parse(k->name, &type));
        CHECK_EQ_INT(type, k->type);
        CHECK(strcmp(gp_device_type_name(k->type), k->name) == 0);
        CHECK_OK(gp_device_registry_get(k->type, &got));
        CHECK(got == k);
        const gp_kernels *table = NULL;
        if (k->ops(&table) == GP_OK)
            check_table_complete(k->name, table);
        else
            printf("kind %s: no op table here: %s\n", k->name, gp_last_error());
    }
    gp_device_type type = GP_DEVICE_CUDA;
    CHECK_FAILS(gp_device_type_parse("tpu", &type), GP_INVALID_ARGUMENT,
                "device kind 'tpu': expected cpu or cuda");
    CHECK_EQ_INT(type, GP_DEVICE_CUDA);
    CHECK(strcmp(gp_device_type_name((gp_device_type)7), "unknown") == 0);
    int count = -1;
    CHECK_FAILS(gp_device_type_count((gp_device_type)7, &count), GP_INVALID_ARGUMENT,
                "device type 7 is no kind of device: expected cpu (0) or cuda (1)");
    CHECK_EQ_INT(count, 0);
    CHECK_OK(gp_device_type_count(GP_DEVICE_CPU, &count));
    CHECK_EQ_INT(count, 1);
    gp_device *dev = (gp_device *)&count; /* must be cleared */
    CHECK_FAILS(gp_device_type_new(GP_DEVICE_CPU, "c", -1, 1, &dev), GP_INVALID_ARGUMENT,
                "index -1");
    CHECK(dev == NULL);
    CHECK_FAILS(gp_device_type_new(GP_DEVICE_CPU, "c", 0, 0, &dev), GP_INVALID_ARGUMENT,
                "0 threads");
    REQUIRE_OK(gp_device_type_new(GP_DEVICE_CPU, "cpu7", 7, 2, &dev));
    CHECK(strcmp(gp_device_kind(dev), "cpu") == 0);
    CHECK(strcmp(gp_device_name(dev), "cpu7") == 0);
    CHECK_EQ_INT(gp_device_threads(dev), 2);
    gp_device_free(dev);
    /* The host's available memory, shared by every CPU device: above nothing, at most the RAM. */
    uint64_t avail = 1, again = 0;
    CHECK_FAILS(gp_device_type_memory(GP_DEVICE_CPU, -1, &avail), GP_INVALID_ARGUMENT,
                "index -1");
    CHECK(avail == 0);
    CHECK_FAILS(gp_device_type_memory(GP_DEVICE_CPU, 0, NULL), GP_INVALID_ARGUMENT, "NULL");
    CHECK_FAILS(gp_device_type_memory((gp_device_type)7, 0, &avail), GP_INVALID_ARGUMENT,
                "device type 7 is no kind of device");
    CHECK_OK(gp_device_type_memory(GP_DEVICE_CPU, 0, &avail));
    CHECK_OK(gp_device_type_memory(GP_DEVICE_CPU, 5, &again));
    const uint64_t ram = (uint64_t)sysconf(_SC_PHYS_PAGES) * (uint64_t)sysconf(_SC_PAGESIZE);
    CHECK(avail > 0 && avail <= ram);
    CHECK(again > 0 && again <= ram);
}

/* Two steps of the test Transformer on two CPU stages the pipeline makes through the registry;
 * the loss is finite and the parameters move. */
static void train_on_cpu(void) {
    gp_model *m = gp_test_net_build(GP_TEST_TRANSFORMER);
    const gp_optim_opts o = gp_test_net_optim(GP_TEST_TRANSFORMER);
    const gp_pipeline_opts po = {.stages = 2, .micro_batches = 2, .device_type = GP_DEVICE_CPU};
    gp_pipeline *p = NULL;
    REQUIRE_OK(gp_pipeline_new(m, &o, &po, 5, &p));
    CHECK(strcmp(gp_device_kind(gp_pipeline_device(p, 1)), "cpu") == 0);
    uint64_t before = 0, after = 0;
    CHECK_OK(gp_pipeline_params_fnv1a64(p, &before));
    for (int step = 0; step < 2; step++) {
        gp_test_batch b;
        gp_test_net_batch(GP_TEST_TRANSFORMER, 4, 100 + (uint64_t)step, &b);
        float loss = -1;
        CHECK_OK(gp_pipeline_step(p, &b.x, &b.y_t, &loss));
        CHECK(isfinite(loss) && loss > 0);
    }
    CHECK_OK(gp_pipeline_params_fnv1a64(p, &after));
    CHECK(after != before);
    gp_pipeline_free(p);
    gp_model_free(m);
}

/* Every call that asks for a GPU refuses with GP_UNSUPPORTED and a message containing each
 * needle, with the module named by GP_CUDA_MODULE. */
static void check_refused(const char *module, const char *needle1, const char *needle2) {
    setenv("GP_CUDA_MODULE", module, 1);
    const char *needles[] = {module, needle1, needle2};
    int count = -1;
    for (int i = 0; i < 3; i++) {
        gp_device *dev = (gp_device *)&count;
        CHECK_FAILS(gp_cuda_device_count(&count), GP_UNSUPPORTED, needles[i]);
        CHECK_EQ_INT(count, 0);
        CHECK_FAILS(gp_device_cuda_new("gpu0", 0, &dev), GP_UNSUPPORTED, needles[i]);
        CHECK(dev == NULL);
        CHECK_FAILS(gp_device_type_count(GP_DEVICE_CUDA, &count), GP_UNSUPPORTED, needles[i]);
        uint64_t bytes = 1;
        CHECK_FAILS(gp_device_type_memory(GP_DEVICE_CUDA, 0, &bytes), GP_UNSUPPORTED, needles[i]);
        CHECK(bytes == 0);
        const gp_kernels *table = (const gp_kernels *)&count;
        CHECK_FAILS(gp_cuda_kernels(&table), GP_UNSUPPORTED, needles[i]);
        CHECK(table == NULL);
    }
    /* and a pipeline on GPUs, named as the stage that asked */
    gp_model *m = gp_test_net_build(GP_TEST_TRANSFORMER);
    const gp_optim_opts o = gp_test_net_optim(GP_TEST_TRANSFORMER);
    const gp_pipeline_opts po = {.stages = 2, .micro_batches = 2, .device_type = GP_DEVICE_CUDA};
    gp_pipeline *p = (gp_pipeline *)&count;
    CHECK_FAILS(gp_pipeline_new(m, &o, &po, 5, &p), GP_UNSUPPORTED, needle1);
    CHECK(p == NULL);
    gp_model_free(m);
    printf("as expected: %s\n", gp_last_error());
}

static void check_modules_refused(void) {
    check_refused("/nonexistent/libgpipe_cuda.so", "cannot load the CUDA device's module",
                  "No such file");
    check_refused(GP_TEST_MODULE_NOT_ELF, "cannot load the CUDA device's module", "ELF");
    check_refused(GP_TEST_MODULE_NO_ENTRY, "is not a gpipe CUDA module (no gp_cuda_module_entry)",
                  "undefined symbol");
    check_refused(GP_TEST_MODULE_OTHER, "is of another gpipe build (0.0.0-another-build)",
                  "install the module built with this library");
    check_refused(GP_TEST_MODULE_NEEDS, "cannot load the CUDA device's module",
                  "libgp_test_absent.so: cannot open shared object file");
    unsetenv("GP_CUDA_MODULE");
}

/* Without GP_CUDA_MODULE: the build's own module, mapped now and not before; or, without CUDA
 * in the build, the message that says so. */
static void check_own_module(void) {
    int count = -1;
    const gp_status s = gp_cuda_device_count(&count);
    if (!gp_cuda_built()) {
        CHECK_FAILS(s, GP_UNSUPPORTED, "gpipe was built without CUDA (GP_CUDA=OFF or no nvcc)");
        check_no_cuda_mapped("built without CUDA, after asking for a GPU");
        return;
    }
    if (s != GP_OK) CHECK_FAILS(s, GP_UNSUPPORTED, "no CUDA GPU available");
    printf("the build's CUDA module: %s\n", s == GP_OK ? "loaded, GPUs found" : gp_last_error());
    CHECK(mapped("libgpipe_cuda"));
    CHECK(mapped("libcudart"));
    const gp_kernels *table = NULL;
    CHECK_OK(gp_cuda_kernels(&table));
    CHECK(table && strcmp(table->name, "cuda") == 0);
    uint64_t free0 = 0, wrapped = 0, bytes = 1;
    if (s != GP_OK) { /* the module loads, the GPU is missing: its memory is not known */
        CHECK_FAILS(gp_device_type_memory(GP_DEVICE_CUDA, 0, &bytes), GP_UNSUPPORTED,
                    "no CUDA GPU available");
        CHECK(bytes == 0);
        return;
    }
    /* each GPU's free memory, and GPU count (one past the last) as GPU 0's under the registry */
    const int n = count;
    CHECK_OK(gp_device_type_memory(GP_DEVICE_CUDA, 0, &free0));
    CHECK(free0 > 0);
    CHECK_OK(gp_device_type_memory(GP_DEVICE_CUDA, n, &wrapped));
    CHECK(wrapped > 0);
    CHECK_FAILS(gp_cuda_memory(n, &bytes), GP_INVALID_ARGUMENT, "expected 0 to");
    printf("GPU 0: %.2f GiB free\n", (double)free0 / (1 << 30));
}

int main(void) {
    /* Before anything asks for a GPU: nothing of CUDA in the process, in any build. */
    check_no_cuda_mapped("at start");
    train_on_cpu();
    check_no_cuda_mapped("after a CPU training");
    check_modules_refused();
    check_registry();
    check_own_module();
    return gp_test_finish("test_device_registry");
}
