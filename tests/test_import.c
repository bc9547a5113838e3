/* Weights exported from PyTorch load into gpipe: tests/reference/make_import_fixture.py saves the
 * reference Transformer's and ConvNet's weights with the `safetensors` package's own writer, under
 * the documented name mapping (tests/reference/README.md), with the eval-mode logits PyTorch
 * computed from them. Here the library's reader checks the files, the model is rebuilt from the
 * model_config metadata, gp_checkpoint_load takes the foreign file (parameters only), and the
 * logits must match PyTorch's within 1e-5. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "testutil.h"

static void check_family(const char *family) {
    char wpath[256], epath[256];
    snprintf(wpath, sizeof wpath, "tests/reference/fixtures/import_%s.safetensors", family);
    snprintf(epath, sizeof epath, "tests/reference/fixtures/import_%s.expect.safetensors", family);
    gp_safetensors *w, *e;
    REQUIRE_OK(gp_safetensors_read(wpath, &w));
    REQUIRE_OK(gp_safetensors_read(epath, &e));
    CHECK(gp_safetensors_meta(w, "format") == NULL); /* not a gpipe checkpoint */
    const char *config = gp_safetensors_meta(w, "model_config");
    CHECK(config != NULL);
    gp_model *m;
    REQUIRE_OK(gp_model_from_json_string(config ? config : "{}", wpath, &m));
    gp_device *dev;
    REQUIRE_OK(gp_device_cpu_new("cpu", &dev));
    REQUIRE_OK(gp_model_init(m, dev, 99)); /* every value is then overwritten */
    uint64_t before = gp_test_hash(m);
    gp_optim_opts o = gp_adamw_defaults(1e-3f, 0);
    CHECK_FAILS(gp_checkpoint_load(w, m, &o), GP_FORMAT, "not a gpipe checkpoint");
    REQUIRE_OK(gp_checkpoint_load(w, m, NULL));
    CHECK(gp_test_hash(m) != before);

    const gp_st_entry *in = gp_safetensors_find(e, "input"), *lg = gp_safetensors_find(e, "logits");
    REQUIRE_OK(in && lg ? GP_OK : GP_FORMAT);
    gp_tensor x, logits;
    REQUIRE_OK(gp_tensor_alloc(dev, GP_MEM_ACTIVATIONS, in->shape, in->dtype, &x));
    REQUIRE_OK(gp_safetensors_get(e, "input", gp_model_input_dtype(m), NULL, x.data));
    REQUIRE_OK(gp_tensor_alloc(dev, GP_MEM_ACTIVATIONS, lg->shape, GP_F32, &logits));
    REQUIRE_OK(gp_model_predict(m, &x, &logits));
    int64_t n = gp_tensor_nelem(&logits);
    float *want = malloc((size_t)n * sizeof *want);
    REQUIRE_OK(gp_safetensors_get(e, "logits", GP_F32, &logits.shape, want));
    double worst = 0;
    int64_t bad = 0;
    for (int64_t i = 0; i < n; i++) {
        double a = F32(logits)[i], b = want[i];
        double tol = 1e-5 * fmax(1.0, fmax(fabs(a), fabs(b)));
        if (!(fabs(a - b) <= tol)) bad++;
        if (fabs(a - b) / tol > worst) worst = fabs(a - b) / tol;
    }
    printf("%s: %lld logits from the PyTorch export, worst at %.3f of 1e-5 (relative, at least "
           "absolute)\n",
           family, (long long)n, worst);
    CHECK_EQ_INT(bad, 0);
    free(want);
    gp_tensor_release(&x);
    gp_tensor_release(&logits);
    gp_model_free(m);
    gp_device_free(dev);
    gp_safetensors_free(w);
    gp_safetensors_free(e);
}

int main(void) {
    check_family("transformer");
    check_family("convnet");
    return gp_test_finish("test_import");
}
