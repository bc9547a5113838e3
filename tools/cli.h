/* Shared declarations of the gpipe command-line tool: the subcommands, the
 * resolved training setup that the classifier and language-model loops share,
 * progress output, JSON reports and text sampling. Uses the public API only. */
#ifndef GP_CLI_H
#define GP_CLI_H

#include <cjson/cJSON.h>

#include "cli_args.h"
#include "gpipe.h"
#include "support/blas_core.h"
#include "support/support.h"

/* ------------------------------------------------------------ subcommands */

int gp_cli_train_main(int argc, char **argv);
int gp_cli_bench_main(int argc, char **argv);
int gp_cli_plan_main(int argc, char **argv);
int gp_cli_launch_main(int argc, char **argv);

/* ------------------------------------------------------------- plan search */

/* gp_plan_search with a progress line on stderr (none when quiet); the library's message on
 * failure. Returns an exit status; the caller frees *res (gp_plan_search_free). */
int gp_cli_plan_search(const char *cmd, gp_model *m, int64_t batch, const gp_optim_opts *oo,
                       const gp_pipeline_opts *base, double gflops, gp_plan_search_opts so,
                       bool quiet, gp_plan_search_result *res);
/* The pipeline runtime's seconds per action on `stages` stage devices of `threads` threads,
 * measured now (gp_pipeline_opts.action_s); returns an exit status. */
int gp_cli_bench_action(const char *cmd, int stages, int threads, double *action_s);
/* --plan auto's trial: the chosen plan's step timed by running it (gp_cli_plan_trial), and the
 * cuts next to it where one was faster. */
typedef struct gp_cli_trial {
    double step_s;  /* the kept plan's median step (the mean of its trials' medians) */
    double seconds; /* all trials together */
    int steps;      /* steps timed per trial (after one untimed); 0: no trial ran */
    int tried;      /* trials run: the chosen plan, moved cuts, and their second runs */
    bool moved;     /* a moved cut was faster: first differs from the given partition */
    int *first;     /* owned (malloc): the kept plan's cells' first layers */
} gp_cli_trial;
/* What a trial runs on: the model as --model names it (a fresh copy each time), the stand-in batch's
 * shapes (x as the run's input, y its labels: the output's shape without its last axis), and the
 * ids drawn (token inputs below `ids`, labels below `classes`). */
typedef struct gp_cli_trial_data {
    const char *model_src;
    gp_shape x, y;
    gp_dtype x_dtype;
    int64_t ids, classes;
} gp_cli_trial_data;
/* Times po's plan (po->partition given, K V entries) by training steps of a fresh model copy on
 * stand-in examples, then each plan with one cell boundary moved by one layer, keeping a move
 * that ran more than 3% faster twice, alternating with the kept plan, and trying again from
 * it, while the next trial fits in budget_s seconds (negative: room for each move once, 4 to
 * 60 s; the first trial always runs; modelled_s, the plan's predicted step, sizes the trials).
 * A plan that cannot run is skipped; where the first cannot, says so and leaves out->steps 0.
 * Returns an exit status. */
int gp_cli_plan_trial(const char *cmd, const gp_cli_trial_data *d, const gp_model *m,
                      const gp_optim_opts *oo, const gp_pipeline_opts *po, int64_t batch,
                      double modelled_s, double budget_s, gp_cli_trial *out);
/* The table of the fastest plans: K, D, T, M, schedule, remat (each cell's when selective),
 * predicted step, bubble, bytes on the fullest device, tokens or examples per second. */
void gp_cli_plan_search_print(const gp_plan_search_result *r, int devices,
                              int64_t tokens_per_example);
/* {devices, candidates, fitting, plans: [{stages, data_parallel, tensor_parallel,
 * micro_batches, schedule, remat, partition, cell_remat, step_s, bubble_simulated,
 * fullest_device_bytes}]} */
cJSON *gp_cli_plan_search_json(const gp_plan_search_result *r, int devices);

/* ------------------------------------------------------------- progress */

typedef struct gp_cli_progress {
    bool bar;   /* stderr is a terminal: one line redrawn in place */
    bool quiet; /* neither bar nor log lines */
    bool drawn; /* the bar is on screen now */
    int total, log_every;
    int64_t examples_per_step, tokens_per_example; /* tokens: 0 for classifiers */
    double last_draw;
    double loss_sum; /* since the last log line */
    int loss_n;
    double ckpt_wait_s; /* step boundaries' waits for a save still being written (shown if > 0) */
} gp_cli_progress;

/* log_every 0: about 20 lines per run. */
void gp_cli_progress_init(gp_cli_progress *p, int total, int64_t examples_per_step,
                          int64_t tokens_per_example, int log_every, bool quiet);
/* After step `done` (1-based) with its loss; train_seconds so far. */
void gp_cli_progress_step(gp_cli_progress *p, int done, double loss, double train_seconds);
/* Wipes the bar so that a normal line can be printed. */
void gp_cli_progress_clear(gp_cli_progress *p);
/* "1h02m", "3m05s", "12.3s" */
const char *gp_cli_fmt_duration(double seconds, char *buf, size_t bufsize);

/* ------------------------------------------------------------- training */

/* Defaults of `gpipe train`, also quoted by its --help. */
#define GP_CLI_LM_DEFAULT_STEPS        1000
#define GP_CLI_LM_DEFAULT_WARMUP       100
#define GP_CLI_LM_DEFAULT_EVAL_WINDOWS 128
#define GP_CLI_IMAGE_MEAN              0.2860f
#define GP_CLI_IMAGE_STD               0.3530f
#define GP_CLI_FASHION_DIR             "/usr/share/datasets/fashion-mnist"

/* Where this process runs (gp_cli_mpi_resolve, below). */
typedef struct gp_cli_mpi_place {
    gp_launcher launcher;
    int data_parallel; /* D */
    int rank, nranks;  /* world rank and size (0 and 1 on threads) */
    double timeout_s;
    gp_gpu_comm gpu_comm; /* --gpu-comm */
} gp_cli_mpi_place;

/* --augment of image classifiers (augment.c). */
typedef enum gp_cli_augment {
    GP_CLI_AUGMENT_NONE = 0,
    GP_CLI_AUGMENT_CROP,      /* shifted by -2..2 pixels each way, background filling */
    GP_CLI_AUGMENT_CROP_FLIP, /* and mirrored left-right with probability 1/2 */
    GP_CLI_AUGMENT_CROP1,     /* shifted by -1..1 pixels each way */
    GP_CLI_AUGMENT_FLIP,      /* mirrored left-right with probability 1/2, not shifted */
    GP_CLI_AUGMENT_CROP1_FLIP /* crop1's shifts and flip's mirroring */
} gp_cli_augment;
const char *gp_cli_augment_name(gp_cli_augment a);
bool gp_cli_augment_parse(const char *s, gp_cli_augment *out);
/* out (H x W) = in mirrored left-right (flip), then moved so that out[i][j] = in[i + dy][j + dx],
 * background where that falls outside: what --augment and --tta do to an image plane. */
void gp_cli_move_image(const float *in, int64_t H, int64_t W, int64_t dx, int64_t dy, bool flip,
                       float background, float *out);
/* Augments the (B, C, H, W) batch x in place (host memory), keyed by (seed, step, example):
 * mode's shifts and mirrors, then random erasing with probability erase (0: none). */
int gp_cli_augment_batch(gp_cli_augment mode, double erase, float background, uint64_t seed,
                         int step, gp_tensor *x);

/* --tta of train and eval (eval_views.c): test-time augmentation of classifiers. */
typedef enum gp_cli_tta {
    GP_CLI_TTA_NONE = 0,
    GP_CLI_TTA_FLIP,      /* the image and its mirror image */
    GP_CLI_TTA_FLIP_SHIFT /* both, as they are and moved by a pixel each way: 10 views */
} gp_cli_tta;

/* The prompts of --prompts FILE: text[i] points into buffer (owned). */
#define GP_CLI_MAX_PROMPTS 32
typedef struct gp_cli_prompts {
    char *buffer;
    const char *text[GP_CLI_MAX_PROMPTS];
    int n;
} gp_cli_prompts;

/* Reads FILE of --prompts for subcommand cmd: one prompt per line (UTF-8 text of at most
 * 64 KiB, at most 32 prompts; empty lines and lines starting with '#' skipped). A file that is
 * not a regular readable text file with a prompt in it is a usage error naming it. */
int gp_cli_read_prompts(const char *cmd, const char *path, gp_cli_prompts *out);
void gp_cli_prompts_free(gp_cli_prompts *p);

/* The language model's data options (lm_data.c): --data-format, --vocab, --val-data, shared by
 * train and eval. */
typedef struct gp_cli_lm_data_args {
    const char *format, *val_data;
    int vocab;
} gp_cli_lm_data_args;
enum { GP_CLI_LM_DATA_NOPTS = 3 };
void gp_cli_lm_data_options(gp_cli_opt out[GP_CLI_LM_DATA_NOPTS], gp_cli_lm_data_args *a);
/* What the options name: text, or token files of a format and vocabulary. */
typedef struct gp_cli_lm_source {
    const char *path;     /* --data (the fortunes by default) */
    const char *val_path; /* --val-data, or NULL: the last 1/20 of --data's tokens */
    bool tokens;
    gp_token_format format;
    int64_t vocab; /* ids must be below it */
} gp_cli_lm_source;
/* Resolves the options against --data (NULL: the default corpus) and the model's vocabulary (its
 * logits); combinations that make no sense are usage errors. Returns an exit status. */
int gp_cli_lm_data_resolve(const char *cmd, const gp_cli_lm_data_args *a, const char *data,
                           int64_t model_vocab, gp_cli_lm_source *out);
/* Both splits as sequences of ids of `width` bytes (1: the text's bytes). */
typedef struct gp_cli_lm_data {
    gp_cli_lm_source src;
    const void *train, *valid;
    int64_t ntrain, nvalid;
    int width;
    int nfiles;
    const char *unit; /* "byte" or "token": of bits per unit */
    gp_text_corpus text;
    gp_token_shard shard, vshard;
} gp_cli_lm_data;
/* Reads (maps) and checks the data, every token id against the vocabulary; a bad file is a
 * runtime failure naming it and the byte offset. Returns an exit status; the caller frees d,
 * also on failure. */
int gp_cli_lm_data_load(const char *cmd, const gp_cli_lm_source *src, gp_cli_lm_data *d);
void gp_cli_lm_data_free(gp_cli_lm_data *d);

typedef struct gp_cli_train {
    const char *cmd; /* the subcommand, for messages: "eval", "sample"; NULL: "train" */
    /* options, with the defaults resolved */
    const char *model_name;
    const char *data;  /* NULL: the family's default */
    gp_cli_lm_source lm_src; /* language models: what --data holds (gp_cli_lm_data_resolve) */
    const char *lm_unit;     /* "token" with token data, else "byte": of the bits per unit */
    bool sample_tokens;      /* sampling: the model's ids are tokens, not bytes */
    gp_tokenizer *tokenizer; /* --tokenizer, owned, or NULL: prompts encoded, tokens decoded */
    bool sample_ids;         /* token ids printed as numbers (no tokenizer, or sample --tokens) */
    int epochs, steps; /* one of them is 0 before the data is loaded */
    int batch, micro_batches, threads, warmup, eval_every, eval_size, log_every, sample;
    int lr_cycles; /* --lr-cycles: cosine cycles (1: one) */
    double lr, min_lr, weight_decay, clip, momentum, temperature;
    gp_cli_prompts prompts; /* --prompts: one sample after each (n 0: one after a newline) */
    const char *metrics, *curve; /* --metrics FILE.jsonl, --curve FILE.svg, or NULL */
    gp_cli_augment augment;      /* --augment (classifiers) */
    double erase;                /* --erase: random erasing's probability (classifiers) */
    gp_cli_tta tta;              /* --tta (classifiers) */
    FILE *metrics_f;             /* open on rank 0 while training (learning_log.c) */
    double run_t0;               /* gp_cli_now() when training began */
    double log_loss_sum;         /* losses since the last metrics line */
    int log_loss_n;
    uint64_t seed, memory_limit;
    const char *optimizer, *schedule, *report;
    bool quiet;
    /* --stages K (0: not given: one stage on `dev`, 1f1b without re-materialization, the
     * single-device run, reported without a "pipeline" object); the rest of popts from
     * --micro-batches, --schedule, --remat, --partition, --memory-limit */
    int stages;
    gp_pipeline_opts popts;
    char remat_why[256];      /* how popts.remat was chosen (gp_cli_remat_default) */
    int *partition;           /* owned, NULL unless --partition */
    const char *trace, *timeline; /* --trace / --timeline of the last step, or NULL */
    gp_cli_mpi_place place; /* --launcher, --data-parallel, --comm-timeout (gp_cli_mpi_resolve) */

    /* checkpoints: --checkpoint-dir (NULL: none), --checkpoint-every (0: only at the stop and
     * the end), --keep, --resume, --stop-after (0: none) */
    const char *ckpt_dir;
    int ckpt_every, ckpt_keep, stop_after;
    bool resume;
    const char *init; /* --init: the parameters to start from, or NULL */
    bool ckpt_sync; /* --checkpoint-sync: written on the training thread, not in the background */
    /* what the saves cost this process: how many finished, the seconds the training thread
     * spent copying them to host memory (or, --checkpoint-sync, writing them), the seconds a
     * step boundary waited for the previous save still being written, the seconds the run's
     * stop waited for its last one, and the seconds the background writes took */
    int ckpt_saves;
    double ckpt_copy_s, ckpt_wait_s, ckpt_flush_s, ckpt_write_s;
    double ckpt_last_copy_s; /* the copy (or synchronous write) of the save in flight */
    char *model_config; /* owned: the JSON the model was built from, for the metadata */

    /* set up by gp_cli_train_main */
    gp_model *model;
    gp_device *dev;        /* the batches' device, and the single stage's without --stages */
    gp_pipeline *pipeline; /* once the step count is known (gp_cli_train_begin) */
    /* gpipe eval --ensemble: more models on `dev`, whose softmax evaluation averages with the
     * pipeline's (gp_cli_eval_views) */
    gp_pipeline **members;
    int nmembers;
    gp_optim_opts optim;
    bool is_lm;
    gp_shape in_shape;  /* (batch, ...) */
    gp_shape out_shape; /* (batch, classes) or (batch, T, vocab) */

    int total_steps;    /* the schedule's length: the run ends there */
    int start_step;     /* 0, or the step of the checkpoint resumed from */
    int stop_step;      /* min(total_steps, --stop-after): this process stops there */
    int64_t per_epoch;  /* classifier: steps per epoch (the data position) */
    float *step_losses; /* owned: (total_steps), the loss of each step this process ran */
    double *step_seconds; /* owned: (total_steps), each step's wall time with its batch */

    /* results, for the summary and the report */
    int steps_done, epochs_done;
    double final_loss;
    double train_seconds; /* forward+backward+update and batch assembly, no evaluation */
    double train_cpu_seconds; /* this process's CPU seconds in the pipeline's steps alone */
    int64_t examples_seen;
    bool have_eval;
    double eval_loss, eval_accuracy; /* accuracy: classifier only */
    bool eval_tta;                   /* --tta: the last evaluation's augmented figures */
    double eval_tta_loss, eval_tta_accuracy;
    int64_t eval_count;              /* test examples or validation windows */
    cJSON *eval_history;             /* array of {step, loss, ...}, owned */
    uint64_t params_hash;            /* params_fnv1a64 at the end, over every stage */
    /* --plan auto: the plans searched (plans[0] trained) and the devices searched for */
    gp_plan_search_result plan_found;
    int plan_devices;
    /* by FLOPs (the default): plans[0] timed again on its layers measured at its micro-batch
     * size (the calibration, which took calibrate_s); flop_step_s: its FLOP-based step, 0 when
     * not calibrated */
    double flop_step_s, calibrate_s;
    double action_s; /* the runtime's measured seconds per action the plans were timed with */
    char *plan_partition; /* owned: its cells as a --partition list */
    gp_cli_trial trial; /* --plan-trial: plans[0] timed by running it (steps 0: not run) */
} gp_cli_train;

/* The optimizer the options give, for a run of total_steps steps (the cosine schedule's
 * length). */
gp_optim_opts gp_cli_train_optim(const gp_cli_train *t, int total_steps);
/* The loops' common start: the pipeline for `total_steps` steps (the cosine
 * schedule needs it), the evaluation history, `nhost` int64 of host scratch
 * (`host_what` names it when out of memory) and the training batch. Returns
 * an exit status; the caller releases what was made, also on failure. */
int gp_cli_train_begin(gp_cli_train *t, int total_steps, int64_t nhost, const char *host_what,
                       int64_t **host, gp_tensor *x, gp_tensor *y);
/* "gpipe train: cannot load <what><path> (--data; the default needs the
 * Debian <needs>): <library message>"; returns the runtime exit status. */
int gp_cli_data_fail(const char *what, const char *path, const char *needs);
/* Batch tensors of nb examples: x as the model's input (its dtype), y the
 * int32 labels, one per output row: (nb) for (nb, classes) logits, (nb, T)
 * for (nb, T, vocab). */
gp_status gp_cli_alloc_batch(const gp_cli_train *t, int64_t nb, gp_tensor *x, gp_tensor *y);
/* Trains step `step` (0-based) on the batch assembled since t0, counts it and
 * shows the progress; a non-finite loss fails, suggesting `diverged_hint`. */
int gp_cli_train_step(gp_cli_train *t, gp_cli_progress *p, int step, const gp_tensor *x,
                      const gp_tensor *y, double t0, const char *diverged_hint);

/* One evaluation pass over `count` fixed examples, in batches of at most
 * t->batch (a smaller one for the remainder). fill puts examples
 * first..first+nb-1 into x and y; rows is scratch room for nb int64. */
typedef struct gp_cli_eval_pass {
    int64_t count;
    gp_status (*fill)(void *ctx, int64_t first, int64_t nb, int64_t *rows, gp_tensor *x,
                      gp_tensor *y);
    void *ctx;
    /* for the messages: "<name>: out of host memory", "<name> counted no <units>" */
    const char *name, *units;
    const char *alloc_what, *eval_what; /* what failed, before the library's message */
    bool tta; /* --tta: the images' other views too (gp_cli_eval_views) */
} gp_cli_eval_pass;
/* An evaluation's figures: the mean loss per counted target and the fraction right (classifiers);
 * with --tta also those of each image's softmax averaged over its views. */
typedef struct gp_cli_eval_result {
    double loss, accuracy;
    bool tta;
    double tta_loss, tta_accuracy;
} gp_cli_eval_result;
int gp_cli_evaluate(gp_cli_train *t, const gp_cli_eval_pass *e, gp_cli_eval_result *r);
/* --tta's modes (eval_views.c) */
bool gp_cli_tta_parse(const char *s, gp_cli_tta *out);
const char *gp_cli_tta_name(gp_cli_tta m);
int gp_cli_tta_views(gp_cli_tta m); /* 1 for none */
#define GP_CLI_TTA_HELP                                                                           \
    "classifier: test-time augmentation, each test image's softmax averaged over views of it, "   \
    "reported beside the plain figures (tta_accuracy, tta_loss), which stay the same bits; "      \
    "flip: the image and its mirror image; flip-shift: both, as they are and moved by one pixel " \
    "left, right, up and down (10 views)"
/* Sums over batches: loss, predictions right, targets counted. */
typedef struct gp_cli_tally {
    double loss;
    int64_t correct, count;
} gp_cli_tally;
/* --tta and --ensemble (eval_views.c): n batches of images through the pipeline, and through
 * each of t->members, in each of t->tta's views; plain: the figures of the pipeline's images as
 * they are (the bits of gp_pipeline_evaluate_batches), augmented: of the mean softmax over the
 * models and views. Returns an exit status; `what` names the evaluation in
 * a failure's message. */
int gp_cli_eval_views(gp_cli_train *t, int n, const gp_tensor *xs, const gp_tensor *ys,
                      const char *what, gp_cli_tally *plain, gp_cli_tally *augmented);
/* Both return an exit status and fill the results. */
int gp_cli_train_classifier(gp_cli_train *t);
int gp_cli_train_lm(gp_cli_train *t);

/* Builds the model that --model names (convnet, transformer or a JSON file)
 * for subcommand `cmd`; a bad name is a usage error of --model. */
int gp_cli_load_model(const char *cmd, const char *name, gp_model **out);
/* The file --model name reads: name, or NULL for a built-in family. */
const char *gp_cli_model_path(const char *name);

/* --metrics and --curve (learning_log.c). gp_cli_log_open: once the step to start from is
 * known (a resumed run appends to its metrics file); gp_cli_log_step: after every step (a line at
 * the progress log's cadence); gp_cli_log_eval: after every evaluation, with its record (a line,
 * and the curve rewritten); gp_cli_log_finish: the final curve, the file closed;
 * gp_cli_log_close: on failure paths. */
int gp_cli_log_open(gp_cli_train *t);
int gp_cli_log_step(gp_cli_train *t, const gp_cli_progress *p, int done, double loss);
int gp_cli_log_eval(gp_cli_train *t, const cJSON *e);
int gp_cli_log_finish(gp_cli_train *t);
void gp_cli_log_close(gp_cli_train *t);

/* Generates nbytes bytes (tokens, with t->sample_tokens) after the context `prompt` (NULL: one
 * newline; token models: gp_cli_prompt_ids's, without a tokenizer id 0) and writes them raw
 * (token models: each token's bytes, or " <id>" with t->sample_ids) to f (NULL: nowhere, as ranks other than 0 do), drawn with t->temperature and
 * keyed by t->seed. Collective under MPI. */
int gp_cli_sample(gp_cli_train *t, const char *cmd, const char *prompt, int nbytes, FILE *f);
/* --tokenizer FILE of train and sample: loads it into t->tokenizer (a bad file is a runtime
 * failure naming it). Returns an exit status. */
int gp_cli_load_tokenizer(const char *cmd, const char *path, gp_cli_train *t);
/* A token model's prompt as ids: text encoded by t->tokenizer, or without one a list of ids;
 * each below the model's vocabulary (usage errors naming option). *ids malloc'd. */
int gp_cli_prompt_ids(const gp_cli_train *t, const char *cmd, const char *option,
                      const char *prompt, int32_t **ids, int *n);
/* Writes the prompt before its sample: as given, or with t->sample_ids its ids. Returns an exit
 * status. */
int gp_cli_print_prompt(const gp_cli_train *t, const char *cmd, const char *prompt, FILE *f);

/* ------------------------------------------------------------ checkpoints */

/* The JSON text --model stands for ({"family": ...} or the file), malloc'd. */
int gp_cli_model_config(const char *cmd, const char *name, char **out);
/* Before the model is allocated: creates --checkpoint-dir if missing; refuses a folder that
 * holds checkpoints without --resume; with it, checks the newest checkpoint against t->model
 * (model config, tensor names, dtypes and shapes, from headers only). */
int gp_cli_ckpt_prepare(gp_cli_train *t);
/* With the pipeline made and --resume: loads the newest complete checkpoint (same model and
 * options required), sets t->start_step, and only then removes the leftovers of interrupted
 * saves. Returns an exit status. */
int gp_cli_ckpt_resume(gp_cli_train *t);
/* With --init, before the pipeline is made: initializes the model on t->dev and loads the
 * parameters of that file (a checkpoint's, or gpipe import's) over it. Returns an exit status. */
int gp_cli_init_params(gp_cli_train *t);
/* gpipe import and gpipe export (cmd_hf.c). */
int gp_cli_import_main(int argc, char **argv);
int gp_cli_export_main(int argc, char **argv);
/* After `done` steps: finishes the save in flight if it is written (waiting for it, the wait
 * counted, when the next one is due), reporting it and keeping the newest --keep; then, when
 * due (every --checkpoint-every steps and at the stop), begins DIR/ckpt-<done>.safetensors,
 * written in the background (at the stop, waited for). */
int gp_cli_ckpt_after_step(gp_cli_train *t, gp_cli_progress *p, int done);
/* The checkpoint counters as a report object. */
cJSON *gp_cli_ckpt_report(const gp_cli_train *t);
/* The newest complete checkpoint in dir (path, "" if none) and its step (-1 if none), opened as
 * --resume opens it (a set: its index and the records of its parts); one that does not open is
 * a runtime failure with the library's message. Returns an exit status. */
int gp_cli_ckpt_newest(const char *dir, char *path, size_t size, int *step);
/* Runs the evaluation of gpipe train on a loaded model: the LM's validation
 * windows (loss) or the classifier's t10k images (loss, accuracy; with t->tta the augmented
 * figures too). */
int gp_cli_eval_lm(gp_cli_train *t, const gp_cli_lm_data *d, double *loss);
int gp_cli_eval_classifier(gp_cli_train *t, const gp_idx_dataset *test, int64_t count,
                           gp_cli_eval_result *r);
int gp_cli_eval_main(int argc, char **argv);
int gp_cli_sample_main(int argc, char **argv);

/* True for the names gpipe train gives files in --checkpoint-dir: checkpoints, the parts and
 * index of a set, and the temporary files of their writes. */
bool gp_cli_ckpt_is_name(const char *name);

/* ---------------------------------------------------------------- paths */

/* A path option of a subcommand, for gp_cli_check_outputs. */
typedef struct gp_cli_path {
    const char *option; /* "--checkpoint" */
    const char *path;   /* NULL: not given */
    int kind;           /* of an input: GP_CLI_PATH_READ or GP_CLI_PATH_CKPT_DIR */
} gp_cli_path;
enum {
    GP_CLI_PATH_READ = 0,    /* a file read, or a folder whose files are read */
    GP_CLI_PATH_CKPT_DIR = 1 /* --checkpoint-dir: the checkpoints' names in it are taken */
};
/* Before any work: refuses, as a usage error naming both options, an output that is an input
 * (the same file by device and inode, or by resolved path when it does not exist yet), lies in
 * an input folder, has a checkpoint's name in --checkpoint-dir, or is another output. Paths
 * NULL are skipped. Returns an exit status. */
int gp_cli_check_outputs(const char *cmd, const gp_cli_path *outs, int nout,
                         const gp_cli_path *ins, int nin);

/* ------------------------------------------------------------- pipeline */

/* --stages, --schedule, --remat, --partition, --balance, --pin, --tensor-parallel, --chunks,
 * --grad-sum, shared by plan, train and bench. */
typedef struct gp_cli_pipeline_args {
    int stages;
    const char *schedule, *remat, *partition, *balance, *pin;
    int tensor_parallel;
    int chunks;
    const char *grad_sum;
    const char *precision;
} gp_cli_pipeline_args;
enum { GP_CLI_PIPELINE_NOPTS = 10 };
/* --schedule's kind by name (NULL: gpipe; the option's choices are the kinds' names). */
gp_schedule_kind gp_cli_schedule_kind(const char *name);
/* The table entries, in that order, writing into a; --stages shows
 * stages_default. */
void gp_cli_pipeline_options(gp_cli_opt out[GP_CLI_PIPELINE_NOPTS], gp_cli_pipeline_args *a,
                             const char *stages_default);
/* Fills po (stages 0 counts as 1) for mini-batches of `batch` examples;
 * *first: the parsed --partition (malloc'ed, the caller frees it, also on
 * failure) or NULL. A list that cannot be read, or whose length is not K V, is
 * a usage error, as are --partition with --balance and what gp_cli_pipeline_check finds in
 * the options alone. Returns an exit status. */
int gp_cli_pipeline_resolve(const char *cmd, const gp_cli_pipeline_args *a, int micro_batches,
                            int64_t batch, uint64_t memory_limit, gp_pipeline_opts *po,
                            int **first);
/* --remat's default in train and bench, where --stages is given: SELECTIVE, planned against
 * each stage device's memory (--memory-limit where given, else the host's available memory
 * shared evenly by the `devices` stage devices of this process). Under MPI (each rank would
 * see only its own host, and the ranks must plan alike) and on CUDA (the GPU's memory is not
 * known to the planner) without --memory-limit: CELL. given_by: the option that chose the mode
 * ("--remat", "--plan auto"), NULL where none did. Sets po->remat and, where it planned against
 * the host, po->memory_limit; why: the line's reason (gp_cli_remat_print). */
/* The least bytes any of `devices` stage devices of the kind can count on: stage device w is
 * device w mod count of the kind, so each one's free memory is shared by the stage devices on
 * it; *unit_bytes that device's whole. 0, with the reason in why, where the kind cannot say. */
uint64_t gp_cli_stage_device_bytes(gp_device_type type, int devices, uint64_t *unit_bytes,
                                   char *why, size_t whysize);
void gp_cli_remat_default(const char *given_by, bool limit_given, int devices,
                          gp_pipeline_opts *po, char *why, size_t whysize);
extern const char gp_cli_remat_default_text[]; /* --remat's default as --help shows it */
/* The line that says which mode each cell of p (planned with `mode`) got and why. */
void gp_cli_remat_print(const gp_pipeline *p, gp_remat mode, const char *why);
/* The library's check of po (gp_pipeline_opts_check) against m and a mini-batch of `batch`
 * examples (NULL, 0: not known yet), its complaint a usage error naming the option for the field
 * at fault ("--micro-batches 3: does not divide the batch of 16 examples"). Returns an exit
 * status. */
int gp_cli_pipeline_check(const char *cmd, const gp_model *m, int64_t batch,
                          const gp_pipeline_opts *po);
/* Adds "pipeline": {stages, tensor_parallel, micro_batches, schedule, remat, partition,
 * partition_source, stage_peak_bytes: [{stage, shard, <category>: n, total}],
 * busy_fraction, bubble_measured, bubble_theory, bubble_simulated, step_s}
 * to a train report; the last five are of the last step. */
void gp_cli_pipeline_report(cJSON *root, const gp_cli_train *t);
/* One line per stage with its peak bytes by category, and one with the
 * measured, theoretical and simulated bubble of the last step. */
void gp_cli_pipeline_summary(const gp_cli_train *t);
/* Writes --trace (Chrome JSON) and --timeline (SVG) of the last step where
 * given; returns an exit status. */
int gp_cli_pipeline_write_files(const gp_cli_train *t);

/* ------------------------------------------------------------------ MPI */

/* --launcher, --data-parallel, --comm-timeout, --gpu-comm, shared by train and bench. */
typedef struct gp_cli_mpi_args {
    const char *launcher;
    int data_parallel;
    double comm_timeout;
    const char *gpu_comm;
} gp_cli_mpi_args;
enum { GP_CLI_MPI_NOPTS = 4 };
void gp_cli_mpi_options(gp_cli_opt out[GP_CLI_MPI_NOPTS], gp_cli_mpi_args *a);
/* Chooses the launcher (MPI when mpirun or srun started the process and MPI was built, or
 * --launcher), checks the combination, and for MPI initializes it and checks that the launch
 * has D x K x T ranks (a usage error, printed by rank 0, before any work); ranks other than 0
 * then write nothing to stdout. Returns an exit status. */
int gp_cli_mpi_resolve(const char *cmd, gp_cli_opt *tab, int n, const gp_cli_mpi_args *a, int K,
                       int T, gp_cli_mpi_place *out);
/* Copies the launcher, D, the timeout and --gpu-comm into po. */
void gp_cli_mpi_apply(const gp_cli_mpi_place *pl, gp_pipeline_opts *po);
/* Under MPI on CUDA devices, one line on what the GPU ranks use between them (NCCL, or MPI with
 * host staging and why). */
void gp_cli_gpu_comm_print(const gp_pipeline *p, const gp_cli_mpi_place *pl,
                           gp_device_type type);
/* Adds "bytes_sent_last_step": [{rank, stage, shard, replica, p2p, allreduce, tensor}]: what
 * each rank handed to MPI in the last step on each mesh axis (gp_pipeline_bytes_sent and
 * gp_pipeline_bytes_tensor: point-to-point along the pipeline, the data-parallel all-reduce, the
 * tensor axis's collectives); on threads one entry per stage shard with its tensor bytes only
 * (the others are not counted there), empty with T = 1. */
void gp_cli_comm_report(cJSON *obj, const gp_pipeline *p, const gp_cli_mpi_place *pl);

/* ---------------------------------------------------------------- bench */

/* One training workload of `gpipe bench` (T1, T2 or C1), timed step by step. */
/* The side of the square fp32 GEMM whose rate is a GPU's ceiling (gp_device_gemm_rate): large
 * enough that launch costs vanish, small enough (192 MiB) to fit beside any workload. */
enum { GP_CLI_GPU_CEILING_N = 4096 };

typedef struct gp_cli_bench {
    /* options */
    const char *workload;
    int steps, warmup, batch; /* batch 0: the workload's own */
    int layers;               /* T2: Transformer blocks, 0: the workload's 32 */
    int d_ff;                 /* T2: the MLP's width, 0: the workload's 1024 */
    bool tie_embeddings;      /* T1, T2: the head's weight tied to the token embedding */
    uint64_t seed;
    bool quiet;
    /* T2 only: stages 0 trains one stage on one device with popts.micro_batches;
     * stages K >= 1 through gp_pipeline with popts */
    int stages;
    int threads; /* of the device, or of each stage device */
    gp_pipeline_opts popts;
    char remat_why[256]; /* how popts.remat was chosen (gp_cli_remat_default) */
    /* results */
    double *step_seconds; /* the `steps` timed steps, owned */
    double *step_cpu_seconds; /* their CPU seconds (every thread's), owned */
    double *step_ceiling; /* 2048^3 sgemm GFLOP/s measured right after each timed step, owned */
    /* Pipelines of several devices on threads: the same sgemm on one device's threads alone,
     * right after; owned (NULL otherwise). */
    double *step_ceiling_alone;
    double flops_per_step;
    int64_t examples_per_step, tokens_per_example; /* tokens: 0 for C1 */
    int64_t nparams;
    double final_loss;
    gp_mem_stats mem; /* the device's, or (pipeline) each category summed over the stages */
    char model_desc[160];
    /* pipeline results (stages >= 1) */
    double *step_bubble;     /* measured bubble of each timed step, owned */
    double *step_bubble_sim; /* the simulator's bubble of each timed step, owned */
    double *step_bubble_replay; /* the simulator replaying each timed step's actions, owned */
    gp_pipeline_stats last;  /* of the last timed step */
    gp_stage_stats *last_stages; /* (stages) of the last timed step, owned */
    gp_mem_stats *stage_mem; /* (stages x T) each stage shard device's counters, owned */
    gp_remat *cell_remat;    /* (cells) each cell's mode as planned, owned */
    int ncells;
    gp_cli_mpi_place place;  /* MPI: where this rank runs */
    uint64_t *bytes_p2p, *bytes_allreduce; /* (ranks) sent in the last step, owned (MPI) */
    uint64_t *bytes_tensor; /* (devices, mesh order) given to the tensor axis, owned (T > 1) */
    int ndevices;           /* entries of bytes_tensor and stage_mem: K x T */
    uint64_t *rss_peak;  /* (ranks) each process's peak resident set (getrusage), owned */
    int nranks;          /* entries of rss_peak */
} gp_cli_bench;

/* Builds the workload's model, trains warmup + steps steps on random data
 * and records the timings; returns an exit status. The caller frees the
 * owned arrays, also on failure. */
int gp_cli_bench_train(gp_cli_bench *b);

/* Median of n values (n >= 1), without changing them. */
double gp_cli_median(const double *v, int n);

/* --------------------------------------------------------------- reports */

/* Adds "memory": {"peak_bytes": {<category>: n, ..., "total": n},
 * "limit_bytes": n, "allocations": n} from a device's counters. */
void gp_cli_report_memory(cJSON *root, const gp_mem_stats *st);
/* Adds "blas_core": the OpenBLAS core in use, "blas_core_chosen_by": "OpenBLAS",
 * "OPENBLAS_CORETYPE" or "gpipe" (gp_cli_blas_core_chosen_by; absent for another BLAS), and with
 * "gpipe", "blas_core_openblas_chose": the core OpenBLAS had chosen itself. */
void gp_cli_report_blas_core(cJSON *root);
/* Adds an exact unsigned integer (cJSON numbers are doubles). */
void gp_cli_report_u64(cJSON *obj, const char *key, uint64_t v);
/* Writes the JSON to path.tmp.<pid> and renames it over path, checking every
 * write; on failure prints why ("gpipe <cmd>: <option>", and the file) and returns
 * false. */
bool gp_cli_report_write(const char *cmd, const cJSON *root, const char *path,
                         const char *option);
/* 16 lowercase hex digits and a NUL. */
void gp_cli_hex64(uint64_t v, char out[17]);

#endif
