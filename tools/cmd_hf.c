/* `gpipe import` and `gpipe export`: GPT-2 between gpipe's files and Hugging Face's
 * GPT2LMHeadModel folders (config.json + model.safetensors), through gp_hf_gpt2_import and
 * gp_hf_gpt2_export. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "cli.h"
#include "cli_args.h"

int gp_cli_import_main(int argc, char **argv) {
    const char *hf = NULL, *out = NULL, *config_out = NULL;
    gp_cli_opt tab[] = {
        {"--hf", GP_CLI_STRING, &hf, "DIR",
         "a GPT2LMHeadModel folder: config.json and model.safetensors (required)", NULL, 0,
         false, NULL, false, 0, false},
        {"--out", GP_CLI_STRING, &out, "FILE.safetensors",
         "the parameters under gpipe's names, with the gpt2 config in its metadata (required)",
         NULL, 0, false, NULL, false, 0, false},
        {"--config-out", GP_CLI_STRING, &config_out, "FILE.json",
         "also write the gpt2 family config, for gpipe train --model", "none", 0, false, NULL,
         false, 0, false},
    };
    const int n = (int)(sizeof tab / sizeof tab[0]);
    int rc = gp_cli_parse(tab, n, argc, argv, 2, "import");
    if (rc == GP_CLI_HELP) {
        printf("Usage: gpipe import --hf DIR --out FILE.safetensors [--config-out FILE.json]\n\n"
               "Converts a Hugging Face GPT2LMHeadModel (DIR/config.json, DIR/model.safetensors,\n"
               "float32) into a gpipe parameters file: gpipe eval and sample --checkpoint read\n"
               "it, gpipe train --init starts from it. The vocabulary is padded to a multiple of\n"
               "64 rows (zeros), which no logit uses (docs/GPT2.md).\n\nOptions:\n");
        gp_cli_print_options(tab, n, stdout);
        printf("\nExit status: 0 success, 1 runtime failure (a bad file), 2 bad usage.\n");
        return GP_CLI_EXIT_OK;
    }
    if (rc != GP_CLI_PARSED) return rc;
    if (!hf || !out) return gp_cli_usage_error("import", "%s: required", hf ? "--out" : "--hf");
    const gp_cli_path ins[] = {{"--hf", hf, GP_CLI_PATH_READ}};
    const gp_cli_path outs[] = {{"--out", out, GP_CLI_PATH_READ},
                                {"--config-out", config_out, GP_CLI_PATH_READ}};
    rc = gp_cli_check_outputs("import", outs, config_out ? 2 : 1, ins, 1);
    if (rc != GP_CLI_EXIT_OK) return rc;
    gp_transformer_config c;
    if (gp_hf_gpt2_import(hf, out, &c) != GP_OK) return gp_cli_fail("import", "--hf");
    char json[512];
    if (gp_transformer_config_json(&c, "gpt2", json, sizeof json) != GP_OK)
        return gp_cli_fail("import", "the config");
    if (config_out) {
        gp_file_out fo;
        gp_status s = gp_file_out_open(&fo, config_out);
        if (s == GP_OK) {
            gp_file_out_printf(&fo, "%s\n", json);
            s = gp_file_out_close(&fo, true);
        }
        if (s != GP_OK) return gp_cli_fail("import", "--config-out");
    }
    printf("imported %s: %s -> %s\n", hf, json, out);
    return GP_CLI_EXIT_OK;
}

int gp_cli_export_main(int argc, char **argv) {
    const char *ckpt = NULL, *model = NULL, *out = NULL;
    gp_cli_opt tab[] = {
        {"--checkpoint", GP_CLI_STRING, &ckpt, "FILE",
         "a gpt2 model's checkpoint (gpipe train's, or gpipe import's file) (required)", NULL, 0,
         false, NULL, false, 0, false},
        {"--model", GP_CLI_STRING, &model, "FILE.json",
         "the gpt2 family config, for a file without model_config metadata", "the checkpoint's",
         0, false, NULL, false, 0, false},
        {"--out", GP_CLI_STRING, &out, "DIR",
         "the folder to write config.json and model.safetensors in (created if missing) "
         "(required)",
         NULL, 0, false, NULL, false, 0, false},
    };
    const int n = (int)(sizeof tab / sizeof tab[0]);
    int rc = gp_cli_parse(tab, n, argc, argv, 2, "export");
    if (rc == GP_CLI_HELP) {
        printf("Usage: gpipe export --checkpoint FILE --out DIR [--model FILE.json]\n\n"
               "Writes a gpt2 family model as a Hugging Face GPT2LMHeadModel folder:\n"
               "GPT2LMHeadModel.from_pretrained(DIR) loads it (the vocabulary's padding rows\n"
               "left out, weights in Conv1D's layout; docs/GPT2.md).\n\nOptions:\n");
        gp_cli_print_options(tab, n, stdout);
        printf("\nExit status: 0 success, 1 runtime failure (a bad checkpoint), 2 bad usage.\n");
        return GP_CLI_EXIT_OK;
    }
    if (rc != GP_CLI_PARSED) return rc;
    if (!ckpt || !out)
        return gp_cli_usage_error("export", "%s: required", ckpt ? "--out" : "--checkpoint");
    if (mkdir(out, 0777) != 0 && errno != EEXIST) {
        fprintf(stderr, "gpipe export: --out %s: cannot create the folder: %s\n", out,
                strerror(errno));
        return GP_CLI_EXIT_RUNTIME;
    }
    gp_checkpoint *c;
    if (gp_checkpoint_open(ckpt, &c) != GP_OK) return gp_cli_fail("export", "--checkpoint");
    char *text = NULL;
    const char *meta = gp_checkpoint_meta(c, "model_config");
    if (model)
        rc = gp_cli_model_config("export", model, &text);
    else if (!meta)
        rc = gp_cli_usage_error("export", "--checkpoint %s has no model_config in its metadata: "
                                          "give --model",
                                ckpt);
    else if (!(text = strdup(meta)))
        rc = gp_cli_fail("export", "out of host memory");
    const char *origin = model ? model : ckpt;
    gp_transformer_config cfg;
    bool gpt2 = false;
    gp_model *m = NULL;
    gp_device *dev = NULL;
    gp_pipeline *p = NULL;
    if (rc == GP_CLI_EXIT_OK &&
        (gp_transformer_config_from_json(text, origin, &cfg, &gpt2) != GP_OK ||
         gp_model_from_json_string(text, origin, &m) != GP_OK))
        rc = gp_cli_usage_error("export", "--model %s: %s", origin, gp_last_error());
    if (rc == GP_CLI_EXIT_OK && gp_checkpoint_check_model(c, m) != GP_OK)
        rc = gp_cli_fail("export", "--checkpoint");
    if (rc == GP_CLI_EXIT_OK && gp_device_cpu_new("cpu0", &dev) != GP_OK)
        rc = gp_cli_fail("export", "cannot create the CPU device");
    gp_pipeline_opts po = {.devices = &dev};
    if (rc == GP_CLI_EXIT_OK && gp_pipeline_new(m, NULL, &po, 1, &p) != GP_OK)
        rc = gp_cli_fail("export", "cannot allocate the parameters");
    if (rc == GP_CLI_EXIT_OK && gp_pipeline_checkpoint_load(p, c) != GP_OK)
        rc = gp_cli_fail("export", "--checkpoint");
    if (rc == GP_CLI_EXIT_OK && gp_hf_gpt2_export(m, &cfg, out) != GP_OK)
        rc = gp_cli_fail("export", "--out");
    if (rc == GP_CLI_EXIT_OK)
        printf("exported %s (%s%s) -> %s/config.json, %s/model.safetensors\n", ckpt,
               gpt2 ? "gpt2" : "transformer", cfg.tie_embeddings ? "" : ", untied", out, out);
    gp_pipeline_free(p);
    gp_model_free(m);
    if (dev) gp_device_free(dev);
    gp_checkpoint_close(c);
    free(text);
    return rc;
}
