/* Model loading shared by the subcommands: --model names a built-in family
 * or a JSON file, with the same rules and messages everywhere. */
#include <errno.h>
#include <string.h>
#include <unistd.h>

#include "cli.h"
#include "cli_args.h"

const char *gp_cli_model_path(const char *name) {
    return strcmp(name, "convnet") == 0 || strcmp(name, "transformer") == 0 ||
                   strcmp(name, "gpt2") == 0
               ? NULL
               : name;
}

int gp_cli_load_model(const char *cmd, const char *name, gp_model **out) {
    gp_status s;
    if (strcmp(name, "convnet") == 0) {
        gp_convnet_config c = gp_convnet_defaults();
        s = gp_model_convnet(&c, out);
    } else if (strcmp(name, "transformer") == 0 || strcmp(name, "gpt2") == 0) {
        gp_transformer_config c = name[0] == 't' ? gp_transformer_defaults() : gp_gpt2_defaults();
        s = gp_model_transformer(&c, out);
    } else {
        if (access(name, R_OK) != 0)
            return gp_cli_usage_error(cmd,
                                      "--model: expected convnet, transformer, gpt2 or a readable "
                                      "JSON model file, got '%s' (%s)",
                                      name, strerror(errno));
        s = gp_model_from_json_file(name, out);
    }
    if (s == GP_OK) return GP_CLI_EXIT_OK;
    if (s == GP_OUT_OF_MEMORY || s == GP_INTERNAL) return gp_cli_fail(cmd, "--model");
    return gp_cli_usage_error(cmd, "--model %s: %s", name, gp_last_error());
}
