/* libFuzzer target: the safetensors/checkpoint reader. Any bytes go through the full validation
 * (gp_safetensors_parse); whatever passes is then looked up, read, and loaded as a checkpoint
 * into a small Transformer (parameters only, and with SGD state), which checks every name,
 * dtype and shape before copying. The same bytes as a file go through the reader that reads the
 * header first and tensors when loaded (gp_checkpoint_open), the header-only check against a
 * model never initialized (gp_checkpoint_check_model), and a load. Nothing may crash, leak or
 * read out of bounds. */
#include "fuzz_common.h"
#include "gpipe.h"

static gp_model *model, *bare; /* bare: never initialized */
static gp_device *dev;
static char path[600];

/* The bytes as a file: opened, checked against the bare model, loaded. */
static void from_file(const uint8_t *data, size_t n) {
    fuzz_write(path, data, n);
    gp_checkpoint *c;
    if (gp_checkpoint_open(path, &c) != GP_OK) return;
    (void)gp_checkpoint_check_model(c, bare);
    (void)gp_checkpoint_load_layers(c, model, 0, gp_model_nlayers(model), NULL);
    (void)gp_checkpoint_load_layers(c, model, 1, 3, NULL);
    gp_checkpoint_close(c);
}

/* The model of tests/fuzz/corpus/checkpoint/gpipe_ckpt.safetensors (written by gpipe train). */
static const char *CONFIG = "{\"family\":\"transformer\",\"vocab\":256,\"dim\":4,\"heads\":1,"
                            "\"d_ff\":4,\"layers\":1,\"seq_len\":4}";

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t n) {
    if (!model) {
        if (gp_model_from_json_string(CONFIG, "fuzz", &model) != GP_OK ||
            gp_device_cpu_new("fuzz", &dev) != GP_OK || gp_model_init(model, dev, 1) != GP_OK ||
            gp_model_from_json_string(CONFIG, "fuzz", &bare) != GP_OK)
            abort();
        snprintf(path, sizeof path, "%s", fuzz_scratch("fuzz.safetensors"));
    }
    from_file(data, n);
    gp_safetensors *f;
    if (gp_safetensors_parse(data, n, "fuzz.safetensors", &f) != GP_OK) return 0;
    for (int i = 0; i < gp_safetensors_count(f); i++) {
        const gp_st_entry *e = gp_safetensors_entry(f, i);
        if (gp_safetensors_find(f, e->name) != e) abort();
        int64_t ne = gp_shape_nelem(&e->shape);
        if (ne <= 4096) {
            float *buf = malloc((size_t)ne * 4 + 4);
            if (buf && gp_safetensors_get(f, e->name, e->dtype, &e->shape, buf) != GP_OK) abort();
            free(buf);
        }
    }
    (void)gp_safetensors_meta(f, "step");
    int step;
    (void)gp_checkpoint_step(f, &step);
    gp_optim_opts sgd = gp_sgd_defaults(0.1f, 0.0f);
    (void)gp_checkpoint_load(f, model, NULL);
    (void)gp_checkpoint_load(f, model, &sgd);
    gp_safetensors_free(f);
    return 0;
}
