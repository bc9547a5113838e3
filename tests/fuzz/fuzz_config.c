/* libFuzzer target: the JSON model-config reader (gp_model_from_json_string): any text either
 * builds a model or is refused with a message; nothing may crash or leak. */
#include "fuzz_common.h"
#include "gpipe.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t n) {
    char *text = malloc(n + 1);
    if (!text) return 0;
    memcpy(text, data, n);
    text[n] = '\0';
    gp_model *m = NULL;
    if (gp_model_from_json_string(text, "fuzz.json", &m) == GP_OK) {
        (void)gp_model_nparams(m);
        gp_shape s;
        (void)gp_model_shape(m, gp_model_nlayers(m) - 1, 2, &s);
        gp_model_free(m);
    }
    free(text);
    return 0;
}
