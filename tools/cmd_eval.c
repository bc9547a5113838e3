/* `gpipe eval` and `gpipe sample`: a model rebuilt from a checkpoint (its "model_config"
 * metadata, or --model for a foreign weights file such as one exported from PyTorch), its
 * parameters loaded and checked, then the evaluation `gpipe train` runs at its end, or text
 * generated after a prompt. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"

/* The most checkpoints --ensemble takes. */
#define MAX_MEMBERS 16
#define STR_(x) #x
#define STR(x) STR_(x)

/* --ensemble's models (sharing --checkpoint's device) and their paths. */
typedef struct ensemble {
    gp_cli_train member[MAX_MEMBERS];
    gp_pipeline *pipeline[MAX_MEMBERS]; /* t->members: each member's */
    char *path[MAX_MEMBERS];
} ensemble;

typedef struct ckpt_opts {
    const char *checkpoint, *model, *data, *report, *prompt, *tta, *ensemble, *tokenizer;
    bool tokens;
    const char *from; /* the option that gave checkpoint: --checkpoint (NULL), or --ensemble */
    gp_cli_lm_data_args lm_data; /* --data-format --vocab --val-data */
    int eval_size, batch, threads, nbytes;
    double temperature;
    uint64_t seed;
} ckpt_opts;

/* The option that named o->checkpoint, for messages. */
static const char *ckpt_option(const ckpt_opts *o) { return o->from ? o->from : "--checkpoint"; }

/* gp_cli_fail's message "<the option of o->checkpoint><what>". */
static int ckpt_fail(const char *cmd, const ckpt_opts *o, const char *what) {
    char buf[96];
    snprintf(buf, sizeof buf, "%s%s", ckpt_option(o), what);
    return gp_cli_fail(cmd, buf);
}

/* Builds t->model from the checkpoint f (or --model), checks f's tensors against it before
 * anything is allocated (a model_config of another or a huge model costs nothing), then places
 * it on a fresh device as a one-stage pipeline for inference (no gradients, no optimizer state)
 * and loads the weights. */
static int load_model(const char *cmd, const ckpt_opts *o, gp_checkpoint *f, gp_cli_train *t,
                      FILE *info) {
    int rc = GP_CLI_EXIT_OK;
    const char *config = gp_checkpoint_meta(f, "model_config");
    if (o->model) {
        rc = gp_cli_load_model(cmd, o->model, &t->model);
        t->model_name = o->model;
    } else if (!config) {
        rc = gp_cli_usage_error(cmd, "%s %s has no model_config in its metadata (not "
                                     "written by gpipe train): give --model",
                                ckpt_option(o), o->checkpoint);
    } else {
        char origin[4200];
        snprintf(origin, sizeof origin, "%s (model_config)", o->checkpoint);
        if (gp_model_from_json_string(config, origin, &t->model) != GP_OK)
            rc = ckpt_fail(cmd, o, ": cannot rebuild the model");
        t->model_name = o->checkpoint;
    }
    if (rc == GP_CLI_EXIT_OK && gp_checkpoint_check_model(f, t->model) != GP_OK)
        rc = ckpt_fail(cmd, o, "");
    if (rc == GP_CLI_EXIT_OK && !t->dev && /* an ensemble's members share the first's */
        gp_device_cpu_new_threads("cpu0", gp_cli_device_threads(o->threads, 1, false), &t->dev) !=
            GP_OK)
        rc = gp_cli_fail(cmd, "cannot create the CPU device");
    gp_pipeline_opts po = {.devices = &t->dev};
    if (rc == GP_CLI_EXIT_OK && gp_pipeline_new(t->model, NULL, &po, 1, &t->pipeline) != GP_OK)
        rc = gp_cli_fail(cmd, "cannot allocate the parameters");
    if (rc == GP_CLI_EXIT_OK && gp_pipeline_checkpoint_load(t->pipeline, f) != GP_OK)
        rc = ckpt_fail(cmd, o, "");
    int step = -1;
    if (rc == GP_CLI_EXIT_OK && gp_checkpoint_meta(f, "step") &&
        gp_checkpoint_saved_step(f, &step) != GP_OK)
        rc = ckpt_fail(cmd, o, "");
    if (rc != GP_CLI_EXIT_OK) return rc;
    t->is_lm = gp_model_input_dtype(t->model) == GP_I32;
    if (gp_model_shape(t->model, -1, t->batch, &t->in_shape) != GP_OK ||
        gp_model_shape(t->model, gp_model_nlayers(t->model) - 1, t->batch, &t->out_shape) != GP_OK)
        return gp_cli_fail(cmd, "cannot infer the model's shapes");
    char at[32] = "";
    if (step >= 0) snprintf(at, sizeof at, " (step %d)", step);
    fprintf(info, "loaded %s%s: %s, %lld parameters\n", o->checkpoint, at,
            t->is_lm ? "language model" : "classifier", (long long)gp_model_nparams(t->model));
    fflush(info);
    return GP_CLI_EXIT_OK;
}

/* The outputs (outs) against everything the command reads: --checkpoint and, once it is open
 * (c not NULL), each part of a set, --model's file and --data. Returns an exit status. */
static int check_outputs(const char *cmd, const ckpt_opts *o, const gp_cli_path *outs, int nout,
                         const gp_checkpoint *c) {
    int nparts = c ? gp_checkpoint_nparts(c) : 0;
    gp_cli_path *ins = calloc((size_t)nparts + 4, sizeof *ins);
    if (!ins) {
        fprintf(stderr, "gpipe %s: checking the output paths: out of host memory\n", cmd);
        return GP_CLI_EXIT_RUNTIME;
    }
    int nin = 0;
    char part[32];
    snprintf(part, sizeof part, "%s's part", ckpt_option(o));
    ins[nin++] = (gp_cli_path){ckpt_option(o), o->checkpoint, GP_CLI_PATH_READ};
    if (o->model)
        ins[nin++] = (gp_cli_path){"--model", gp_cli_model_path(o->model), GP_CLI_PATH_READ};
    if (o->data) ins[nin++] = (gp_cli_path){"--data", o->data, GP_CLI_PATH_READ};
    if (o->lm_data.val_data)
        ins[nin++] = (gp_cli_path){"--val-data", o->lm_data.val_data, GP_CLI_PATH_READ};
    for (int i = 0; i < nparts; i++)
        ins[nin++] = (gp_cli_path){part, gp_checkpoint_part_path(c, i),
                                   GP_CLI_PATH_READ};
    int rc = gp_cli_check_outputs(cmd, outs, nout, ins, nin);
    free(ins);
    return rc;
}

/* Opens --checkpoint after checking the outputs against it, then against its parts. */
static int open_checkpoint(const char *cmd, const ckpt_opts *o, const gp_cli_path *outs, int nout,
                           gp_checkpoint **c) {
    *c = NULL;
    int rc = check_outputs(cmd, o, outs, nout, NULL);
    if (rc != GP_CLI_EXIT_OK) return rc;
    if (gp_checkpoint_open(o->checkpoint, c) != GP_OK) return ckpt_fail(cmd, o, "");
    rc = check_outputs(cmd, o, outs, nout, *c);
    if (rc != GP_CLI_EXIT_OK) {
        gp_checkpoint_close(*c);
        *c = NULL;
    }
    return rc;
}

static void free_model(gp_cli_train *t) {
    gp_pipeline_free(t->pipeline);
    gp_model_free(t->model);
    if (t->dev) gp_device_free(t->dev);
}

/* The t10k images must have the model's input size and their labels its classes: else
 * evaluation would fail deep inside (or count nonsense), far from the option to fix. */
static int check_test_set(const ckpt_opts *o, const gp_cli_train *t, const gp_idx_dataset *test,
                          const char *dir) {
    const gp_shape *in = &t->in_shape, *out = &t->out_shape;
    const char *which = o->model ? "--model" : "the model of --checkpoint";
    const char *name = o->model ? o->model : o->checkpoint;
    char buf[96];
    if (in->ndim != 4 || in->dim[1] != 1 || in->dim[2] != test->rows || in->dim[3] != test->cols)
        return gp_cli_usage_error("eval", "--data %s: the t10k images are %dx%d, but %s %s takes "
                                          "input %s",
                                  dir, test->rows, test->cols, which, name,
                                  gp_shape_str(in, buf, sizeof buf));
    int maxlabel = 0;
    for (int64_t i = 0; i < test->n; i++)
        if (test->labels[i] > maxlabel) maxlabel = test->labels[i];
    if (out->ndim != 2 || out->dim[1] <= maxlabel)
        return gp_cli_usage_error("eval", "--data %s: the t10k labels go up to %d, but %s %s "
                                          "outputs %s, expected (batch, classes) with at least %d "
                                          "classes",
                                  dir, maxlabel, which, name, gp_shape_str(out, buf, sizeof buf),
                                  maxlabel + 1);
    return GP_CLI_EXIT_OK;
}

/* "gpipe eval: --data PATH: <what>: <the library's message>". */
static int data_fail(const char *path, const char *what) {
    char msg[4400];
    snprintf(msg, sizeof msg, "--data %s: %s", path, what);
    return gp_cli_fail("eval", msg);
}

/* --ensemble: each checkpoint of the list loaded as --checkpoint was (on its device), into ens
 * and t->members. Returns an exit status; on failure t->nmembers counts the members to free. */
static int load_members(const ckpt_opts *o, const gp_cli_path *outs, gp_cli_train *t,
                        ensemble *ens) {
    if (t->is_lm)
        return gp_cli_usage_error("eval", "--ensemble: only for image classifiers, but the model "
                                          "of %s is a language model",
                                  o->checkpoint);
    t->members = ens->pipeline;
    for (const char *p = o->ensemble; *p;) {
        const char *end = strchr(p, ',');
        const size_t len = end ? (size_t)(end - p) : strlen(p);
        if (len == 0)
            return gp_cli_usage_error("eval", "--ensemble %s: expected FILE[,FILE...], got an "
                                              "empty path",
                                      o->ensemble);
        if (t->nmembers == MAX_MEMBERS)
            return gp_cli_usage_error("eval", "--ensemble %s: at most %d checkpoints",
                                      o->ensemble, MAX_MEMBERS);
        gp_cli_train *u = &ens->member[t->nmembers];
        *u = (gp_cli_train){.cmd = "eval", .dev = t->dev, .batch = t->batch};
        ckpt_opts m = *o;
        m.from = "--ensemble";
        char *path = ens->path[t->nmembers] = malloc(len + 1);
        if (!path) return gp_cli_fail("eval", "--ensemble: out of host memory");
        memcpy(path, p, len);
        path[len] = '\0';
        m.checkpoint = path;
        gp_checkpoint *c;
        int rc = open_checkpoint("eval", &m, outs, 1, &c);
        if (rc == GP_CLI_EXIT_OK) {
            t->nmembers++;
            rc = load_model("eval", &m, c, u, stdout);
            gp_checkpoint_close(c);
        }
        char a[96], b[96], ia[96], ib[96];
        if (rc == GP_CLI_EXIT_OK &&
            (u->is_lm || !gp_shape_equal(&u->in_shape, &t->in_shape) ||
             !gp_shape_equal(&u->out_shape, &t->out_shape)))
            rc = gp_cli_usage_error(
                "eval", "--ensemble %s: its model takes %s and outputs %s, but that of %s takes "
                        "%s and outputs %s (an ensemble's models must agree)",
                path, gp_shape_str(&u->in_shape, ia, sizeof ia),
                gp_shape_str(&u->out_shape, a, sizeof a), o->checkpoint,
                gp_shape_str(&t->in_shape, ib, sizeof ib),
                gp_shape_str(&t->out_shape, b, sizeof b));
        if (rc != GP_CLI_EXIT_OK) return rc;
        ens->pipeline[t->nmembers - 1] = u->pipeline;
        p = end ? end + 1 : p + len;
        if (end && !*p)
            return gp_cli_usage_error("eval", "--ensemble %s: ends in a comma", o->ensemble);
    }
    return GP_CLI_EXIT_OK;
}

static int run_eval(const ckpt_opts *o, gp_cli_train *t, cJSON *report) {
    double loss = 0;
    int rc;
    if (t->is_lm && o->tta)
        return gp_cli_usage_error("eval", "--tta: only for image classifiers, but the model of %s "
                                          "is a language model",
                                  o->checkpoint);
    if (!t->is_lm && (o->lm_data.format || o->lm_data.vocab || o->lm_data.val_data))
        return gp_cli_usage_error("eval", "--data-format, --vocab and --val-data: only for language "
                                          "models, but the model of %s is a classifier",
                                  o->checkpoint);
    if (t->is_lm) {
        gp_cli_lm_data d = {0};
        const int64_t T = t->in_shape.dim[1];
        t->eval_size = o->eval_size ? o->eval_size : GP_CLI_LM_DEFAULT_EVAL_WINDOWS;
        rc = gp_cli_lm_data_resolve("eval", &o->lm_data, o->data,
                                    t->out_shape.dim[t->out_shape.ndim - 1], &t->lm_src);
        if (rc == GP_CLI_EXIT_OK) rc = gp_cli_lm_data_load("eval", &t->lm_src, &d);
        if (rc == GP_CLI_EXIT_OK && d.nvalid < T + 2) {
            fprintf(stderr, "gpipe eval: %s %s: %lld validation %ss, need at least %lld\n",
                    d.src.val_path ? "--val-data" : "--data",
                    d.src.val_path ? d.src.val_path : d.src.path, (long long)d.nvalid, d.unit,
                    (long long)(T + 2));
            rc = GP_CLI_EXIT_RUNTIME;
        } else if (rc == GP_CLI_EXIT_OK) {
            rc = gp_cli_eval_lm(t, &d, &loss);
        }
        const char *unit = d.unit, *path = d.src.val_path ? d.src.val_path : d.src.path;
        char key[32];
        snprintf(key, sizeof key, "bits_per_%s", unit ? unit : "byte");
        if (rc == GP_CLI_EXIT_OK) {
            printf("validation loss %.4f, %.4f bits/%s (%d windows of %s)\n", loss,
                   loss / log(2.0), unit, t->eval_size, path);
            cJSON_AddNumberToObject(report, "loss", loss);
            cJSON_AddNumberToObject(report, key, loss / log(2.0));
        }
        gp_cli_lm_data_free(&d);
        if (rc != GP_CLI_EXIT_OK) return rc;
        cJSON_AddNumberToObject(report, "windows", t->eval_size);
    } else {
        const char *dir = o->data ? o->data : GP_CLI_FASHION_DIR;
        gp_idx_dataset test = {0};
        gp_cli_eval_result r = {0};
        int64_t count = 0;
        if (gp_idx_load_dir(dir, "t10k", &test) != GP_OK) {
            rc = data_fail(dir, "cannot load the t10k IDX split");
        } else {
            count = o->eval_size > 0 && o->eval_size < test.n ? o->eval_size : test.n;
            rc = check_test_set(o, t, &test, dir);
            if (rc == GP_CLI_EXIT_OK) rc = gp_cli_eval_classifier(t, &test, count, &r);
        }
        gp_idx_free(&test);
        if (rc != GP_CLI_EXIT_OK) return rc;
        printf("test accuracy %.4f, loss %.4f", r.accuracy, r.loss);
        const int views = gp_cli_tta_views(t->tta);
        if (r.tta && t->nmembers > 0)
            printf("; ensemble of %d models x %d view%s (--tta %s) %.4f, loss %.4f",
                   1 + t->nmembers, views, views > 1 ? "s" : "", gp_cli_tta_name(t->tta),
                   r.tta_accuracy, r.tta_loss);
        else if (r.tta)
            printf("; --tta %s (%d views) %.4f, loss %.4f", gp_cli_tta_name(t->tta), views,
                   r.tta_accuracy, r.tta_loss);
        printf(" (%lld images of %s)\n", (long long)count, dir);
        cJSON_AddNumberToObject(report, "loss", r.loss);
        cJSON_AddNumberToObject(report, "accuracy", r.accuracy);
        if (r.tta) {
            const char *what = t->nmembers > 0 ? "ensemble" : "tta";
            char key[32];
            cJSON_AddStringToObject(report, "tta", gp_cli_tta_name(t->tta));
            snprintf(key, sizeof key, "%s_loss", what);
            cJSON_AddNumberToObject(report, key, r.tta_loss);
            snprintf(key, sizeof key, "%s_accuracy", what);
            cJSON_AddNumberToObject(report, key, r.tta_accuracy);
        }
        cJSON_AddNumberToObject(report, "examples", (double)count);
    }
    fflush(stdout);
    return GP_CLI_EXIT_OK;
}

int gp_cli_eval_main(int argc, char **argv) {
    ckpt_opts o = {0};
    gp_cli_opt lm[GP_CLI_LM_DATA_NOPTS];
    gp_cli_lm_data_options(lm, &o.lm_data);
    gp_cli_opt tab[] = {
        {"--checkpoint", GP_CLI_STRING, &o.checkpoint, "FILE",
         "a checkpoint of gpipe train (a .safetensors file, or the .safetensors.index.json of one "
         "saved under MPI), or a safetensors weights file with --model (required)",
         NULL, 0, false, NULL, false, 0, false},
        {"--model", GP_CLI_STRING, &o.model, "NAME|FILE",
         "the model, for a file without model_config metadata", "the checkpoint's", 0, false,
         NULL, false, 0, false},
        {"--data", GP_CLI_STRING, &o.data, "PATH",
         "IDX directory (classifier) or text file/directory (language model)",
         GP_CLI_FASHION_DIR " or " GP_FORTUNES_DIR, 0, false, NULL, false, 0, false},
        lm[0], /* --data-format */
        lm[1], /* --vocab */
        lm[2], /* --val-data */
        {"--eval-size", GP_CLI_INT, &o.eval_size, "N",
         "test images (classifier) or fixed validation windows (language model)",
         "all test images; 128 windows", 1, false, NULL, false, 0, false},
        {"--batch", GP_CLI_INT, &o.batch, "N", "examples per evaluation batch", "128", 1, false,
         NULL, false, 0, false},
        {"--threads", GP_CLI_THREADS, &o.threads, "N",
         "threads of the device, at most the cores this process may use",
         "the cores this process may use", 1, false, NULL, false, 0, false},
        {"--report", GP_CLI_STRING, &o.report, "FILE.json", "write a JSON report (atomically)",
         "none", 0, false, NULL, false, 0, false},
        {"--tta", GP_CLI_STRING, &o.tta, "none|flip|flip-shift", GP_CLI_TTA_HELP, "none", 0,
         false, NULL, false, 0, false},
        {"--ensemble", GP_CLI_STRING, &o.ensemble, "FILE[,FILE...]",
         "classifier: more checkpoints of models with --checkpoint's input and classes (such as "
         "the end of each cycle of train --lr-cycles), at most " STR(MAX_MEMBERS) "; "
         "reported beside --checkpoint's own figures: those of each test image's softmax "
         "averaged over all the models (and all --tta views), ensemble_accuracy and "
         "ensemble_loss",
         "none", 0, false, NULL, false, 0, false},
    };
    const int n = (int)(sizeof tab / sizeof tab[0]);
    int rc = gp_cli_parse(tab, n, argc, argv, 2, "eval");
    if (rc == GP_CLI_HELP) {
        printf("Usage: gpipe eval --checkpoint FILE [options]\n\n"
               "Evaluates a checkpoint as gpipe train does at its end: a language model's loss\n"
               "and bits per byte on fixed, evenly spaced validation windows (the same for\n"
               "every run), a classifier's accuracy and loss on the t10k split. The model is\n"
               "rebuilt from the checkpoint's model_config; every tensor is checked against it.\n\n"
               "Options:\n");
        gp_cli_print_options(tab, n, stdout);
        printf("\nExit status: 0 success, 1 runtime failure (a bad checkpoint), 2 bad usage.\n");
        return GP_CLI_EXIT_OK;
    }
    if (rc != GP_CLI_PARSED) return rc;
    if (!o.checkpoint) return gp_cli_usage_error("eval", "--checkpoint: required");
    const gp_cli_path outs[] = {{"--report", o.report, GP_CLI_PATH_READ}};
    gp_checkpoint *c;
    rc = open_checkpoint("eval", &o, outs, 1, &c);
    if (rc != GP_CLI_EXIT_OK) return rc;
    gp_cli_train t = {.cmd = "eval", .data = o.data};
    if (o.tta && !gp_cli_tta_parse(o.tta, &t.tta))
        return gp_cli_usage_error("eval", "--tta %s: expected none, flip or flip-shift", o.tta);
    if (o.tta && t.tta == GP_CLI_TTA_NONE) o.tta = NULL;
    t.batch = o.batch ? o.batch : 128;
    rc = load_model("eval", &o, c, &t, stdout);
    gp_checkpoint_close(c);
    ensemble *ens = o.ensemble ? calloc(1, sizeof *ens) : NULL;
    if (rc == GP_CLI_EXIT_OK && o.ensemble)
        rc = ens ? load_members(&o, outs, &t, ens) : gp_cli_fail("eval", "--ensemble: out of host "
                                                                         "memory");
    cJSON *r = cJSON_CreateObject();
    cJSON_AddStringToObject(r, "checkpoint", o.checkpoint);
    if (t.nmembers > 0) {
        cJSON *list = cJSON_AddArrayToObject(r, "ensemble");
        for (int i = 0; i < t.nmembers; i++)
            cJSON_AddItemToArray(list, cJSON_CreateString(ens->path[i]));
    }
    cJSON *ev = cJSON_AddObjectToObject(r, "eval");
    if (rc == GP_CLI_EXIT_OK) rc = run_eval(&o, &t, ev);
    uint64_t hash = 0;
    if (rc == GP_CLI_EXIT_OK && gp_pipeline_params_fnv1a64(t.pipeline, &hash) != GP_OK)
        rc = gp_cli_fail("eval", "the parameter hash");
    if (rc == GP_CLI_EXIT_OK) {
        char hex[17];
        gp_cli_hex64(hash, hex);
        cJSON_AddStringToObject(r, "params_fnv1a64", hex);
        if (o.report && !gp_cli_report_write("eval", r, o.report, "--report")) rc = GP_CLI_EXIT_RUNTIME;
    }
    cJSON_Delete(r);
    for (int i = 0; ens && i < MAX_MEMBERS; i++) {
        if (i < t.nmembers) {
            ens->member[i].dev = NULL; /* t's */
            free_model(&ens->member[i]);
        }
        free(ens->path[i]);
    }
    free(ens);
    free_model(&t);
    return rc;
}

int gp_cli_sample_main(int argc, char **argv) {
    ckpt_opts o = {0};
    gp_cli_opt tab[] = {
        {"--checkpoint", GP_CLI_STRING, &o.checkpoint, "FILE",
         "a language model's checkpoint (required)", NULL, 0, false, NULL, false, 0, false},
        {"--model", GP_CLI_STRING, &o.model, "NAME|FILE",
         "the model, for a file without model_config metadata", "the checkpoint's", 0, false,
         NULL, false, 0, false},
        {"--prompt", GP_CLI_STRING, &o.prompt, "TEXT",
         "the text to continue (with --tokenizer, encoded by it); with --tokens alone, token ids "
         "(\"464 3290 318\")",
         "a newline; --tokens alone: token id 0", 0, false, NULL, false, 0, false},
        {"--bytes", GP_CLI_INT, &o.nbytes, "N",
         "bytes to generate; with --tokenizer or --tokens, tokens", "200", 1, false, NULL, false,
         0, false},
        {"--tokenizer", GP_CLI_STRING, &o.tokenizer, "tokenizer.json",
         "a model trained on token data: encode --prompt and print each token as its text by "
         "this byte-level BPE tokenizer (a Hugging Face tokenizer.json)",
         "none: a byte model", 0, false, NULL, false, 0, false},
        {"--tokens", GP_CLI_FLAG, &o.tokens, NULL,
         "a model trained on token data: print the prompt's and the drawn token ids, as numbers",
         "off", 0, false,
         NULL, false, 0, false},
        {"--temperature", GP_CLI_FLOAT, &o.temperature, "X",
         "sampling temperature, 0: always the likeliest byte", "0.8", 0, false, NULL, false, 0,
         false},
        {"--seed", GP_CLI_U64, &o.seed, "S", "keys the draws: a seed always gives the same text",
         "1", 0, false, NULL, false, 0, false},
        {"--threads", GP_CLI_THREADS, &o.threads, "N",
         "threads of the device, at most the cores this process may use",
         "the cores this process may use", 1, false, NULL, false, 0, false},
    };
    const int n = (int)(sizeof tab / sizeof tab[0]);
    int rc = gp_cli_parse(tab, n, argc, argv, 2, "sample");
    if (rc == GP_CLI_HELP) {
        printf("Usage: gpipe sample --checkpoint FILE [--prompt TEXT] [--bytes N] [options]\n\n"
               "Prints the prompt, then N bytes generated by a byte-level language model from\n"
               "a checkpoint: each byte drawn from softmax(logits / temperature) at the last\n"
               "position of the last seq_len bytes, with a uniform keyed by (seed, position).\n"
               "A model trained on token data draws tokens: --tokenizer encodes the prompt and\n"
               "prints their text, --tokens their ids (without --tokenizer the prompt is ids).\n\n"
               "Options:\n");
        gp_cli_print_options(tab, n, stdout);
        printf("\nExit status: 0 success, 1 runtime failure (a bad checkpoint), 2 bad usage.\n");
        return GP_CLI_EXIT_OK;
    }
    if (rc != GP_CLI_PARSED) return rc;
    if (!o.checkpoint) return gp_cli_usage_error("sample", "--checkpoint: required");
    gp_checkpoint *c; /* sample writes no file: stdout only */
    rc = open_checkpoint("sample", &o, NULL, 0, &c);
    if (rc != GP_CLI_EXIT_OK) return rc;
    gp_cli_train t = {.cmd = "sample"};
    t.batch = 1;
    t.seed = gp_cli_seen(tab, n, "--seed") ? o.seed : 1;
    t.temperature = gp_cli_seen(tab, n, "--temperature") ? o.temperature : 0.8;
    rc = load_model("sample", &o, c, &t, stderr); /* stdout: the text only */
    gp_checkpoint_close(c);
    if (rc == GP_CLI_EXIT_OK && (!t.is_lm || t.in_shape.ndim != 2 || t.out_shape.ndim != 3)) {
        fprintf(stderr, "gpipe sample: --checkpoint %s: not a byte language model (its input is "
                        "not int32 tokens)\n",
                o.checkpoint);
        rc = GP_CLI_EXIT_RUNTIME;
    }
    t.sample_tokens = o.tokens || o.tokenizer;
    t.sample_ids = o.tokens;
    if (rc == GP_CLI_EXIT_OK && o.tokenizer)
        rc = gp_cli_load_tokenizer("sample", o.tokenizer, &t);
    if (rc == GP_CLI_EXIT_OK) {
        const char *prompt = o.prompt ? o.prompt : t.sample_tokens && !o.tokenizer ? "0" : "\n";
        rc = gp_cli_print_prompt(&t, "sample", prompt, stdout);
        if (rc == GP_CLI_EXIT_OK)
            rc = gp_cli_sample(&t, "sample", prompt, o.nbytes ? o.nbytes : 200, stdout);
    }
    gp_tokenizer_free(t.tokenizer);
    free_model(&t);
    return rc;
}
