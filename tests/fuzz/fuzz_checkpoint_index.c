/* libFuzzer target: the index of a multi-part checkpoint (gp_checkpoint_open on a
 * ".safetensors.index.json"). Any bytes are the index; what opens is then asked for its
 * metadata and step and loaded, whole and by a layer range, into a small Transformer from two
 * real part files in the scratch folder (layers 0-1 and 2-4, parameters only), so the fuzzer
 * reaches the part checks (size, CRC-32, layers, step) and the copy. Nothing may crash, leak or
 * read out of bounds.
 * The seed tests/fuzz/corpus/checkpoint_index/set.json is the valid index of those parts:
 * GP_FUZZ_WRITE_SEED=PATH ./fuzz_checkpoint_index -runs=0 writes it again. */
#include "fuzz_common.h"
#include "gpipe.h"

static gp_model *model;
static gp_device *dev;
static char index_path[600];

static const char *CONFIG = "{\"family\":\"transformer\",\"vocab\":256,\"dim\":4,\"heads\":1,"
                            "\"d_ff\":4,\"layers\":1,\"seq_len\":4}";

static void setup(void) {
    if (gp_model_from_json_string(CONFIG, "fuzz", &model) != GP_OK ||
        gp_device_cpu_new("fuzz", &dev) != GP_OK || gp_model_init(model, dev, 1) != GP_OK)
        abort();
    int L = gp_model_nlayers(model);
    gp_checkpoint_part parts[2] = {{"p1.safetensors", 0, 2, 0, 0}, {"p2.safetensors", 2, L, 0, 0}};
    for (int i = 0; i < 2; i++) {
        char path[600];
        snprintf(path, sizeof path, "%s", fuzz_scratch(parts[i].file));
        if (gp_checkpoint_save(path, model, parts[i].first, parts[i].last, NULL, 7, NULL, 0) !=
                GP_OK ||
            gp_checkpoint_file_info(path, &parts[i].bytes, &parts[i].crc32) != GP_OK)
            abort();
    }
    snprintf(index_path, sizeof index_path, "%s", fuzz_scratch("fuzz.safetensors.index.json"));
    const char *seed = getenv("GP_FUZZ_WRITE_SEED");
    if (seed && gp_checkpoint_commit(seed, model, parts, 2, NULL, 7, NULL, 0) != GP_OK) abort();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t n) {
    if (!model) setup();
    fuzz_write(index_path, data, n);
    gp_checkpoint *c;
    if (gp_checkpoint_open(index_path, &c) != GP_OK) return 0;
    (void)gp_checkpoint_meta(c, "format");
    (void)gp_checkpoint_nparts(c);
    int step;
    (void)gp_checkpoint_saved_step(c, &step);
    (void)gp_checkpoint_load_layers(c, model, 0, gp_model_nlayers(model), NULL);
    (void)gp_checkpoint_load_layers(c, model, 1, 3, NULL);
    gp_checkpoint_close(c);
    return 0;
}
