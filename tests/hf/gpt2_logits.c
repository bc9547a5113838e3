/* gpt2_logits CHECKPOINT INPUT OUTPUT: the eval-mode logits a gpipe checkpoint (with its
 * model_config metadata) computes for the int32 tensor "input" (B, T) of the safetensors file
 * INPUT, written as "logits" to OUTPUT. The round trip of `make check-hf` compares them with
 * what transformers computes from the exported model. */
#include <stdio.h>
#include <stdlib.h>

#include "gpipe.h"

static int fail(const char *what) {
    fprintf(stderr, "gpt2_logits: %s: %s\n", what, gp_last_error());
    return 1;
}

int main(int argc, char **argv) {
    if (argc != 4) {
        fprintf(stderr, "usage: gpt2_logits CHECKPOINT INPUT.safetensors OUTPUT.safetensors\n");
        return 2;
    }
    gp_checkpoint *c;
    gp_model *m;
    gp_device *dev;
    gp_pipeline *p;
    if (gp_checkpoint_open(argv[1], &c) != GP_OK) return fail(argv[1]);
    const char *config = gp_checkpoint_meta(c, "model_config");
    if (!config) {
        fprintf(stderr, "gpt2_logits: %s: no model_config metadata\n", argv[1]);
        return 1;
    }
    if (gp_model_from_json_string(config, argv[1], &m) != GP_OK) return fail("model_config");
    if (gp_device_cpu_new("cpu", &dev) != GP_OK) return fail("device");
    gp_pipeline_opts po = {.devices = &dev};
    if (gp_pipeline_new(m, NULL, &po, 1, &p) != GP_OK) return fail("pipeline");
    if (gp_pipeline_checkpoint_load(p, c) != GP_OK) return fail(argv[1]);
    gp_safetensors *in;
    if (gp_safetensors_read(argv[2], &in) != GP_OK) return fail(argv[2]);
    const gp_st_entry *e = gp_safetensors_find(in, "input");
    if (!e || e->shape.ndim != 2) {
        fprintf(stderr, "gpt2_logits: %s: expected an int32 tensor \"input\" (B, T)\n", argv[2]);
        return 1;
    }
    gp_tensor x, logits;
    gp_shape out;
    if (gp_model_shape(m, gp_model_nlayers(m) - 1, e->shape.dim[0], &out) != GP_OK)
        return fail("shape");
    if (gp_tensor_alloc(dev, GP_MEM_ACTIVATIONS, e->shape, GP_I32, &x) != GP_OK ||
        gp_safetensors_get(in, "input", GP_I32, NULL, x.data) != GP_OK ||
        gp_tensor_alloc(dev, GP_MEM_ACTIVATIONS, out, GP_F32, &logits) != GP_OK)
        return fail(argv[2]);
    if (gp_pipeline_predict(p, &x, &logits) != GP_OK) return fail("predict");
    gp_safetensors_writer *w;
    if (gp_safetensors_writer_new(&w) != GP_OK ||
        gp_safetensors_writer_add(w, "logits", GP_F32, out, logits.data) != GP_OK ||
        gp_safetensors_writer_write(w, argv[3]) != GP_OK)
        return fail(argv[3]);
    gp_safetensors_writer_free(w);
    gp_safetensors_free(in);
    gp_tensor_release(&x);
    gp_tensor_release(&logits);
    gp_pipeline_free(p);
    gp_model_free(m);
    gp_device_free(dev);
    gp_checkpoint_close(c);
    return 0;
}
