/* `gpipe train`: options and their model-dependent defaults, the device, the
 * model and the trainer, then the classifier or language-model loop, the
 * summary and the JSON report. */
#include <errno.h>
#include <float.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli.h"

/* Raw option values; 0 / NULL / negative where the default depends on the model. */
typedef struct train_opts {
    const char *model, *data, *report, *optimizer, *schedule, *trace, *timeline, *prompts;
    const char *metrics, *curve, *augment, *tta, *plan, *device, *tokenizer;
    int devices;
    int epochs, steps, batch, micro_batches, threads, warmup, eval_every, eval_size, log_every;
    int sample, lr_cycles;
    double lr, min_lr, weight_decay, clip, momentum, temperature, label_smoothing, erase;
    double plan_trial; /* --plan-trial seconds; negative: not given */
    uint64_t seed, memory_limit;
    bool quiet;
    gp_cli_pipeline_args pipe; /* --stages --schedule --remat --partition */
    gp_cli_mpi_args mpi;       /* --launcher --data-parallel --comm-timeout --gpu-comm */
    gp_cli_lm_data_args lm_data; /* --data-format --vocab --val-data */
    /* checkpoints */
    const char *ckpt_dir, *init;
    int ckpt_every, keep, stop_after;
    bool resume, ckpt_sync;
} train_opts;

enum { NOPTS = 64 }; /* room for the table below; table_len counts it */

static void make_table(gp_cli_opt tab[NOPTS], train_opts *o) {
    gp_cli_opt pipe[GP_CLI_PIPELINE_NOPTS], mpi[GP_CLI_MPI_NOPTS], lm[GP_CLI_LM_DATA_NOPTS];
    gp_cli_pipeline_options(pipe, &o->pipe, "none: one device, no pipeline (1 with MPI)");
    pipe[2].defval = gp_cli_remat_default_text; /* --remat */
    gp_cli_mpi_options(mpi, &o->mpi);
    gp_cli_lm_data_options(lm, &o->lm_data);
    gp_cli_opt t[NOPTS] = {
        {"--model", GP_CLI_STRING, &o->model, "NAME|FILE",
         "convnet, transformer, gpt2, or a JSON model file (required)", NULL, 0, false, NULL, false, 0,
         false},
        {"--data", GP_CLI_STRING, &o->data, "PATH",
         "IDX directory (classifier) or text file/directory (language model)",
         GP_CLI_FASHION_DIR " or " GP_FORTUNES_DIR, 0, false, NULL, false, 0, false},
        lm[0], /* --data-format */
        lm[1], /* --vocab */
        lm[2], /* --val-data */
        {"--epochs", GP_CLI_INT, &o->epochs, "N", "passes over the training set (classifier)",
         "1 if --steps is not given", 1, false, NULL, false, 0, false},
        {"--steps", GP_CLI_INT, &o->steps, "N", "optimizer steps (instead of --epochs)",
         "1000 for a language model", 1, false, NULL, false, 0, false},
        {"--batch", GP_CLI_INT, &o->batch, "N",
         "mini-batch: images, or sequences of the model's length",
         "128 classifier, 32 language model", 1, false, NULL, false, 0, false},
        {"--micro-batches", GP_CLI_INT, &o->micro_batches, "M",
         "split each mini-batch into M micro-batches (must divide --batch)", "1", 1, false, NULL,
         false, 0, false},
        {"--plan", GP_CLI_CHOICE, &o->plan, "auto",
         "choose --stages, --micro-batches, --schedule and --remat (those not given) by the "
         "fastest simulated step that fits --memory-limit on --devices (gpipe plan --devices): "
         "ranked by FLOPs and the runtime's cost per action measured first, the fastest timed "
         "again on its layers measured at its micro-batch size (--balance time: every plan "
         "timed so), then by running it (--plan-trial)",
         "none", 0, false, "auto", false, 0, false},
        {"--devices", GP_CLI_INT, &o->devices, "N",
         "with --plan auto: stage devices to plan for (K x T = N)",
         "the cores this process may use / --threads", 1, false, NULL, false, GP_MAX_DEVICES,
         false},
        {"--plan-trial", GP_CLI_FLOAT, &o->plan_trial, "SECONDS",
         "with --plan auto: time the chosen plan by running a few steps of it on stand-in "
         "examples (a fresh copy of the model), the step shown as predicted; then, while the "
         "seconds last, the plans with one cell boundary moved by a layer, keeping a move that "
         "ran over 3% faster twice, alternating with the plan it replaces, and trying again from "
         "it; 0: no trial, the predicted step is the modelled one",
         "room for the plan and each move once, at least 4 s and at most 60 s", 0, false, NULL, false, 3600,
         false},
        pipe[0], /* --stages */
        pipe[1], /* --schedule */
        pipe[2], /* --remat */
        pipe[3], /* --partition */
        pipe[4], /* --balance */
        pipe[5], /* --pin */
        pipe[6], /* --tensor-parallel */
        pipe[7], /* --chunks */
        pipe[8], /* --grad-sum */
        pipe[9], /* --precision */
        mpi[0],  /* --launcher */
        mpi[1],  /* --data-parallel */
        mpi[2],  /* --comm-timeout */
        mpi[3],  /* --gpu-comm */
        {"--trace", GP_CLI_STRING, &o->trace, "FILE.json",
         "with --stages: Chrome trace of the last step, one track per stage (Perfetto)", "none",
         0, false, NULL, false, 0, false},
        {"--timeline", GP_CLI_STRING, &o->timeline, "FILE.svg",
         "with --stages: SVG picture of the last step, stages as rows", "none", 0, false, NULL,
         false, 0, false},
        {"--optimizer", GP_CLI_CHOICE, &o->optimizer, "sgd|adamw", "optimizer",
         "sgd classifier, adamw language model", 0, false, "sgd|adamw", false, 0, false},
        /* the float values the optimizer takes: --lr > 0 as a float too */
        {"--lr", GP_CLI_FLOAT, &o->lr, "X", "peak learning rate", "0.05 sgd, 3e-4 adamw",
         FLT_TRUE_MIN, false, NULL, false, FLT_MAX, false},
        {"--min-lr", GP_CLI_FLOAT, &o->min_lr, "X", "where the cosine schedule ends, at most --lr",
         "0", 0, false, NULL, false, FLT_MAX, false},
        {"--momentum", GP_CLI_FLOAT, &o->momentum, "X", "SGD momentum, in [0, 1)", "0.9", 0, false,
         NULL, false, 1, true},
        {"--weight-decay", GP_CLI_FLOAT, &o->weight_decay, "X",
         "weight decay of matrices (decoupled for adamw, L2 for sgd)", "0 sgd, 0.01 adamw", 0,
         false, NULL, false, FLT_MAX, false},
        {"--warmup", GP_CLI_INT, &o->warmup, "N", "steps of linear learning-rate warm-up",
         "0 classifier; language model 100, at most a tenth of the steps", 0, false, NULL, false, 0,
         false},
        {"--lr-schedule", GP_CLI_CHOICE, &o->schedule, "constant|cosine",
         "after warm-up: constant, or cosine decay to the last step",
         "constant classifier, cosine language model", 0, false, "constant|cosine", false, 0,
         false},
        {"--lr-cycles", GP_CLI_INT, &o->lr_cycles, "N",
         "with --lr-schedule cosine: N cosine cycles of equal length, each from --lr down to "
         "--min-lr (warm restarts), the warm-up at the start of the first; each cycle's last "
         "step is a model worth keeping (--checkpoint-every the cycle's steps; gpipe eval "
         "--ensemble averages such models)",
         "1", 1, false, NULL, false, 0, false},
        {"--clip", GP_CLI_FLOAT, &o->clip, "X", "clip the global gradient norm at X, 0: off",
         "0 classifier, 1 language model", 0, false, NULL, false, FLT_MAX, false},
        {"--label-smoothing", GP_CLI_FLOAT, &o->label_smoothing, "X",
         "train against targets smoothed by X in [0, 1): 1 - X + X/C on the label, X/C on each "
         "of the other C - 1 classes (PyTorch's CrossEntropyLoss label_smoothing); evaluation "
         "losses stay the plain cross-entropy",
         "0", 0, false, NULL, false, 1, true},
        {"--seed", GP_CLI_U64, &o->seed, "S", "seed of initialization, data order and sampling",
         "1", 0, false, NULL, false, 0, false},
        {"--device", GP_CLI_CHOICE, &o->device, "cpu|cuda",
         "where the stages compute: CPU devices, or CUDA GPUs (stage k on GPU k mod the GPUs "
         "visible; not yet run on a GPU: without one, exits 1 naming why)",
         "cpu", 0, false, "cpu|cuda", false, 0, false},
        {"--threads", GP_CLI_THREADS, &o->threads, "N",
         "threads of each device (each stage with --stages), at most the cores this process "
         "may use; the same count gives the same bits",
         "the cores this process may use, shared among the stages; 1 per MPI rank", 1, false,
         NULL, false, 0, false},
        {"--memory-limit", GP_CLI_BYTES, &o->memory_limit, "BYTES",
         "fail cleanly past this many bytes on any device (K M G, KiB MiB GiB)", "none", 0, false,
         NULL, false, 0, false},
        {"--eval-every", GP_CLI_INT, &o->eval_every, "N", "also evaluate every N steps",
         "classifier: after each epoch; language model: at the end", 1, false, NULL, false, 0,
         false},
        {"--eval-size", GP_CLI_INT, &o->eval_size, "N",
         "test examples (classifier) or fixed validation windows (language model) to evaluate on",
         "all 10000 test images; 128 windows", 1, false, NULL, false, 0, false},
        {"--sample", GP_CLI_INT, &o->sample, "N",
         "after training, print N bytes (tokens, with token data) generated by the language model",
         "none", 1, false, NULL,
         false, 0, false},
        {"--temperature", GP_CLI_FLOAT, &o->temperature, "X",
         "sampling temperature, 0: always the likeliest byte", "0.8", 0, false, NULL, false, 0,
         false},
        {"--prompts", GP_CLI_STRING, &o->prompts, "FILE",
         "with --sample: one sample after each line of FILE (a UTF-8 text file; empty lines and "
         "lines starting with # skipped; at most 32 prompts)",
         "one sample after a newline", 0, false, NULL, false, 0, false},
        {"--tokenizer", GP_CLI_STRING, &o->tokenizer, "tokenizer.json",
         "token data: --sample prints the tokens' text by this byte-level BPE tokenizer (a "
         "Hugging Face tokenizer.json), which encodes the --prompts lines (without it they are "
         "token ids)",
         "the token ids as numbers", 0, false, NULL, false, 0, false},
        {"--report", GP_CLI_STRING, &o->report, "FILE.json", "write a JSON report (atomically)",
         "none", 0, false, NULL, false, 0, false},
        {"--augment", GP_CLI_STRING, &o->augment, "none|crop|crop1|flip|crop-flip|crop1-flip",
         "classifier: crop: each training image shifted by -2..2 pixels each way (a random crop of "
         "it padded by 2 background pixels); crop1: by -1..1; flip: mirrored left-right with "
         "probability 1/2; crop-flip, crop1-flip: shifted and mirrored; drawn per (seed, step, "
         "image)",
         "none", 0, false, NULL, false, 0, false},
        {"--erase", GP_CLI_FLOAT, &o->erase, "P",
         "classifier: after --augment, with probability P in [0, 1] a random rectangle of each "
         "training image (2-33% of it, aspect ratio 0.3-3.3) set to the data's mean (random "
         "erasing, as torchvision's RandomErasing(p=P)); drawn per (seed, step, image)",
         "0", 0, false, NULL, false, 1, false},
        {"--tta", GP_CLI_STRING, &o->tta, "none|flip|flip-shift", GP_CLI_TTA_HELP, "none", 0,
         false, NULL, false, 0, false},
        {"--metrics", GP_CLI_STRING, &o->metrics, "FILE.jsonl",
         "one JSON object per line: {\"type\":\"train\", step, loss, loss_mean, lr, "
         "tokens_per_s or images_per_s, train_s, elapsed_s, ...} at each logged step (--log-every) "
         "and {\"type\":\"eval\", step, loss, bits_per_byte or accuracy, ...} at each "
         "evaluation; flushed line by line, appended to on --resume",
         "none", 0, false, NULL, false, 0, false},
        {"--curve", GP_CLI_STRING, &o->curve, "FILE.svg",
         "SVG learning curve: training loss and evaluation figures against steps, rewritten "
         "after each evaluation (atomically)",
         "none", 0, false, NULL, false, 0, false},
        {"--log-every", GP_CLI_INT, &o->log_every, "N",
         "log line every N steps when stderr is not a terminal, and --metrics line every N steps", "about 20 lines per run", 1, false,
         NULL, false, 0, false},
        {"--quiet", GP_CLI_FLAG, &o->quiet, NULL, "no progress bar or step log lines", NULL, 0,
         false, NULL, false, 0, false},
        /* checkpoints */
        {"--checkpoint-dir", GP_CLI_STRING, &o->ckpt_dir, "DIR",
         "write checkpoints DIR/ckpt-<step>.safetensors (created if missing)", "none", 0, false,
         NULL, false, 0, false},
        {"--checkpoint-every", GP_CLI_INT, &o->ckpt_every, "N",
         "with --checkpoint-dir: also a checkpoint every N steps", "only at the stop and the end",
         1, false, NULL, false, 0, false},
        {"--checkpoint-sync", GP_CLI_FLAG, &o->ckpt_sync, NULL,
         "with --checkpoint-dir: write each checkpoint before the next step starts (the same "
         "bytes) instead of copying it to host memory and writing it in the background",
         "off", 0, false, NULL, false, 0, false},
        {"--keep", GP_CLI_INT, &o->keep, "K",
         "with --checkpoint-dir: keep only the newest K checkpoints", "3", 1, false, NULL, false, 0,
         false},
        {"--resume", GP_CLI_FLAG, &o->resume, NULL,
         "continue from the newest checkpoint in --checkpoint-dir (none: start fresh)", "off", 0,
         false, NULL, false, 0, false},
        {"--init", GP_CLI_STRING, &o->init, "FILE",
         "start from the parameters of FILE (a checkpoint, or the file of gpipe import) instead "
         "of the seed's; the optimizer starts fresh at step 0",
         "the seed's", 0, false, NULL, false, 0, false},
        {"--stop-after", GP_CLI_INT, &o->stop_after, "N",
         "end this run after step N (--steps still sets the schedule)", "none", 1, false, NULL,
         false, 0, false},
    };
    int n = (int)(sizeof t / sizeof t[0]);
    for (int i = 0; i < NOPTS; i++) tab[i] = i < n ? t[i] : (gp_cli_opt){0};
}

/* Options actually in the table (the array has spare room). */
static int table_len(const gp_cli_opt *tab) {
    int n = 0;
    while (n < NOPTS && tab[n].name) n++;
    return n;
}

static void print_help(const gp_cli_opt *tab, int n) {
    printf("Usage: gpipe train --model convnet|transformer|FILE.json [options]\n\n"
           "Trains a model on one CPU device (or K stage devices, see --stages). A model\n"
           "with int32 input (token ids) is a language model trained on random windows\n"
           "of a text corpus's bytes or of token files (--data-format: llm.c shards, raw\n"
           "uint16/uint32 ids; docs/TOKENS.md), with validation loss and bits per byte\n"
           "(token) on fixed windows; a model with float\n"
           "input is an image classifier trained on IDX data (Fashion-MNIST), shuffled\n"
           "each epoch, inputs standardized with mean %.4f and std %.4f; the last partial\n"
           "batch of an epoch is dropped.\n\n"
           "With --stages K the model is trained as a GPipe pipeline: K cells of\n"
           "contiguous layers on K stage devices (--threads threads each), over the\n"
           "--micro-batches M of every mini-batch, with one synchronous update per step;\n"
           "the losses and parameters equal the single-device run's bit for bit (with\n"
           "as many threads per stage as it had). Evaluation and --sample run between\n"
           "steps on the stages' parameters, with the same results as on one device.\n"
           "The summary and the\n"
           "report give the last step's bubble (idle share) measured, in theory\n"
           "(K-1)/(M+K-1) and simulated; --trace and --timeline draw that step.\n\n"
           "Several processes (MPI): started by mpirun or srun, gpipe runs one stage per\n"
           "process, D = --data-parallel replicas of the K stages on D x K ranks (world rank\n"
           "r: stage r %% K of replica r / K), each replica on its slice of every mini-batch,\n"
           "the stages' gradients summed over the replicas (MPI_Iallreduce in buckets):\n"
           "  mpirun -np 4 gpipe train --model transformer --stages 2 --data-parallel 2 ...\n"
           "Rank 0 alone prints and writes the report; --trace/--timeline hold one track per\n"
           "rank. D = 1 gives the threads launcher's parameters bit for bit. A rank that fails\n"
           "or stops answering for --comm-timeout seconds stops every rank with a message\n"
           "naming it, the action waited on and the peer.\n\n"
           "With --tensor-parallel T each stage's layers are split over T devices (threads,\n"
           "or ranks: D x K x T under MPI, world rank r = shard r %% T of stage r / T %% K of\n"
           "replica r / (K T)): Transformer blocks by heads and d_ff, the embedding and the\n"
           "vocabulary head by vocabulary (a softmax cross-entropy that never gathers the\n"
           "logits), the rest replicated; two all-reduces per block forward, two backward.\n"
           "Same bits for every K at a fixed T; across T equal to rounding.\n\n"
           "With --checkpoint-dir the run writes safetensors checkpoints (parameters,\n"
           "optimizer state, step, model config and options); --resume continues from the\n"
           "newest with the same model and options, on any number of --stages, to the same\n"
           "bits as an uninterrupted run; --stop-after ends a run early with a checkpoint.\n"
           "Under MPI each stage writes its own part and rank 0 commits the set with\n"
           "ckpt-<step>.safetensors.index.json once every part is on disk; either form\n"
           "resumes on either launcher with any K, and gpipe eval/sample read both.\n"
           "\nOptions:\n",
           (double)GP_CLI_IMAGE_MEAN, (double)GP_CLI_IMAGE_STD);
    gp_cli_print_options(tab, n, stdout);
    printf("\nDefaults that depend on the model:\n"
           "  classifier:     --optimizer sgd --momentum 0.9 --lr 0.05 --batch 128 --epochs 1,\n"
           "                  constant learning rate, no clipping\n"
           "  language model: --optimizer adamw --lr 3e-4 --weight-decay 0.01 --batch 32\n"
           "                  --steps %d --warmup %d (at most steps/10), cosine decay,\n"
           "                  --clip 1, evaluation on %d validation windows at the end\n"
           "\nExit status: 0 success, 1 runtime failure, 2 bad usage.\n",
           GP_CLI_LM_DEFAULT_STEPS, GP_CLI_LM_DEFAULT_WARMUP, GP_CLI_LM_DEFAULT_EVAL_WINDOWS);
}

/* Fills t from the options and the model's family; usage errors for
 * combinations that make no sense. Appends the defaults used to `used`. */
static int resolve(gp_cli_train *t, const train_opts *o, gp_cli_opt *tab, int n, char *used,
                   size_t usedlen) {
    const bool lm = t->is_lm;
#define SEEN(name) gp_cli_seen(tab, n, name)
#define USED(...)  snprintf(used + strlen(used), usedlen - strlen(used), __VA_ARGS__)
    if (SEEN("--epochs") && SEEN("--steps"))
        return gp_cli_usage_error("train", "--epochs and --steps: give one of them, not both");
    if (lm && SEEN("--epochs"))
        return gp_cli_usage_error("train", "--epochs: a language model draws random windows and "
                                           "has no epochs; use --steps");
    if (!lm && SEEN("--sample"))
        return gp_cli_usage_error("train",
                                  "--sample: only for language models (int32 input), "
                                  "but --model %s is a classifier",
                                  o->model);
    const int K = SEEN("--stages") ? o->pipe.stages : 1;
    const int T = SEEN("--tensor-parallel") ? o->pipe.tensor_parallel : 1;
    int rc0 = gp_cli_mpi_resolve("train", tab, n, &o->mpi, K, T, &t->place);
    if (rc0 != GP_CLI_EXIT_OK) return rc0;
    const bool mpi = t->place.launcher == GP_LAUNCHER_MPI;
    const bool mesh = mpi || T > 1; /* more than one device: always a pipeline */
    if (!SEEN("--stages") && !mesh)
        for (int i = 0; i < 7; i++) {
            const char *name = (const char *[]){"--schedule", "--remat",  "--partition", "--balance",
                                                "--pin",      "--trace", "--timeline"}[i];
            if (SEEN(name)) return gp_cli_usage_error("train", "%s: only with --stages K", name);
        }
    t->stages = SEEN("--stages") ? o->pipe.stages : mesh ? 1 : 0;
    if (!lm && SEEN("--temperature"))
        return gp_cli_usage_error("train", "--temperature: only with --sample (language models)");
    if (SEEN("--augment") && lm)
        return gp_cli_usage_error("train", "--augment: only for image classifiers (float input), "
                                           "but --model %s is a language model",
                                  o->model);
    if (o->augment && !gp_cli_augment_parse(o->augment, &t->augment))
        return gp_cli_usage_error("train",
                                  "--augment %s: expected none, crop, crop1, flip, crop-flip or "
                                  "crop1-flip",
                                  o->augment);
    if (SEEN("--erase") && lm)
        return gp_cli_usage_error("train", "--erase: only for image classifiers (float input), "
                                           "but --model %s is a language model",
                                  o->model);
    t->erase = SEEN("--erase") ? o->erase : 0.0;
    if (SEEN("--tta") && lm)
        return gp_cli_usage_error("train", "--tta: only for image classifiers (float input), but "
                                           "--model %s is a language model",
                                  o->model);
    if (o->tta && !gp_cli_tta_parse(o->tta, &t->tta))
        return gp_cli_usage_error("train", "--tta %s: expected none, flip or flip-shift", o->tta);
    for (int i = 0; i < GP_CLI_LM_DATA_NOPTS && !lm; i++) {
        const char *name = (const char *[]){"--data-format", "--vocab", "--val-data"}[i];
        if (SEEN(name))
            return gp_cli_usage_error("train", "%s: only for language models (int32 input), but "
                                               "--model %s is a classifier",
                                      name, o->model);
    }
    if (SEEN("--prompts") && !SEEN("--sample"))
        return gp_cli_usage_error("train", "--prompts: only with --sample N (language models)");
    if (!SEEN("--checkpoint-dir"))
        for (int i = 0; i < 4; i++) {
            const char *name = (const char *[]){"--checkpoint-every", "--keep", "--resume",
                                                "--checkpoint-sync"}[i];
            if (SEEN(name)) return gp_cli_usage_error("train", "%s: only with --checkpoint-dir", name);
        }
    t->ckpt_dir = o->ckpt_dir;
    t->ckpt_every = o->ckpt_every;
    t->ckpt_keep = SEEN("--keep") ? o->keep : 3;
    t->ckpt_sync = o->ckpt_sync;
    t->resume = o->resume;
    t->init = o->init;
    t->stop_after = o->stop_after;
    t->model_name = o->model;
    t->data = o->data;
    t->report = o->report;
    t->metrics = o->metrics;
    t->curve = o->curve;
    t->trace = o->trace;
    t->timeline = o->timeline;
    t->quiet = o->quiet || t->place.rank != 0; /* rank 0 alone shows progress */
    t->sample = o->sample;
    t->epochs = o->epochs;
    t->steps = o->steps;
    if (!SEEN("--epochs") && !SEEN("--steps")) {
        if (lm)
            t->steps = GP_CLI_LM_DEFAULT_STEPS, USED(" steps=%d", t->steps);
        else
            t->epochs = 1, USED(" epochs=1");
    }
    t->batch = SEEN("--batch") ? o->batch : (lm ? 32 : 128);
    if (!SEEN("--batch")) USED(" batch=%d", t->batch);
    t->micro_batches = SEEN("--micro-batches") ? o->micro_batches : 1;
    t->optimizer = SEEN("--optimizer") ? o->optimizer : (lm ? "adamw" : "sgd");
    if (!SEEN("--optimizer")) USED(" optimizer=%s", t->optimizer);
    const bool sgd = strcmp(t->optimizer, "sgd") == 0;
    if (SEEN("--momentum") && !sgd)
        return gp_cli_usage_error("train", "--momentum: only for --optimizer sgd");
    t->momentum = SEEN("--momentum") ? o->momentum : 0.9;
    if (sgd && !SEEN("--momentum")) USED(" momentum=0.9");
    t->lr = SEEN("--lr") ? o->lr : (sgd ? 0.05 : 3e-4);
    if (!SEEN("--lr")) USED(" lr=%g", t->lr);
    t->min_lr = SEEN("--min-lr") ? o->min_lr : 0.0;
    if (t->min_lr > t->lr)
        return gp_cli_usage_error("train", "--min-lr %g: must not exceed the peak --lr %g",
                                  t->min_lr, t->lr);
    t->weight_decay = SEEN("--weight-decay") ? o->weight_decay : (sgd ? 0.0 : 0.01);
    if (!SEEN("--weight-decay")) USED(" weight-decay=%g", t->weight_decay);
    t->schedule = SEEN("--lr-schedule") ? o->schedule : (lm ? "cosine" : "constant");
    if (!SEEN("--lr-schedule")) USED(" lr-schedule=%s", t->schedule);
    t->lr_cycles = SEEN("--lr-cycles") ? o->lr_cycles : 1;
    if (t->lr_cycles > 1 && strcmp(t->schedule, "cosine") != 0)
        return gp_cli_usage_error("train", "--lr-cycles %d: only with --lr-schedule cosine (the "
                                           "schedule is %s)",
                                  t->lr_cycles, t->schedule);
    t->clip = SEEN("--clip") ? o->clip : (lm ? 1.0 : 0.0);
    if (!SEEN("--clip")) USED(" clip=%g", t->clip);
    /* The warm-up of a short run is a tenth of it, so the peak is reached. */
    if (SEEN("--warmup")) {
        t->warmup = o->warmup;
    } else if (lm) {
        t->warmup =
            t->steps / 10 < GP_CLI_LM_DEFAULT_WARMUP ? t->steps / 10 : GP_CLI_LM_DEFAULT_WARMUP;
        USED(" warmup=%d", t->warmup);
    } else {
        t->warmup = 0;
        USED(" warmup=0");
    }
    t->seed = SEEN("--seed") ? o->seed : 1;
    if (!SEEN("--seed")) USED(" seed=1");
    t->memory_limit = SEEN("--memory-limit") ? o->memory_limit : 0;
    t->eval_every = SEEN("--eval-every") ? o->eval_every : 0;
    t->eval_size = SEEN("--eval-size") ? o->eval_size : (lm ? GP_CLI_LM_DEFAULT_EVAL_WINDOWS : 0);
    if (!SEEN("--eval-size")) {
        if (lm)
            USED(" eval-size=%d", t->eval_size);
        else
            USED(" eval-size=all");
    }
    t->log_every = SEEN("--log-every") ? o->log_every : 0;
    t->temperature = SEEN("--temperature") ? o->temperature : 0.8;
    if (lm && SEEN("--sample") && !SEEN("--temperature")) USED(" temperature=0.8");
    if (!SEEN("--data")) USED(" data=%s", lm ? GP_FORTUNES_DIR : GP_CLI_FASHION_DIR);
    int rc = gp_cli_pipeline_resolve("train", &o->pipe, t->micro_batches, t->batch,
                                     t->memory_limit, &t->popts, &t->partition);
    if (rc != GP_CLI_EXIT_OK) return rc;
    if (o->device) { /* a kind with no device here fails now, before any work */
        int count = 0;
        if (gp_device_type_parse(o->device, &t->popts.device_type) != GP_OK ||
            gp_device_type_count(t->popts.device_type, &count) != GP_OK) {
            fprintf(stderr, "gpipe train: --device %s: %s\n", o->device, gp_last_error());
            return GP_CLI_EXIT_RUNTIME;
        }
    }
    gp_cli_mpi_apply(&t->place, &t->popts);
    t->popts.label_smoothing = SEEN("--label-smoothing") ? o->label_smoothing : 0.0;
    t->threads = gp_cli_device_threads(SEEN("--threads") ? o->threads : 0,
                                       (t->stages > 0 ? t->stages : 1) * T,
                                       t->place.launcher == GP_LAUNCHER_MPI);
    if (!SEEN("--threads")) USED(" threads=%d", t->threads);
    t->popts.stage_threads = t->threads;
    if (t->stages > 0) {
        if (!SEEN("--schedule")) USED(" schedule=gpipe");
        gp_cli_remat_default(o->plan ? "--plan auto" : SEEN("--remat") ? "--remat" : NULL,
                             SEEN("--memory-limit"), t->stages * T, &t->popts, t->remat_why,
                             sizeof t->remat_why);
        if (!SEEN("--remat")) USED(" remat=%s", gp_remat_name(t->popts.remat));
        if (!SEEN("--partition") && !SEEN("--balance")) USED(" balance=cost");
        if (!SEEN("--pin")) USED(" pin=auto");
    } else {
        /* One device: each micro-batch's forward then its backward, nothing recomputed; cpu0,
         * which holds the batches, where it is of the kind asked for (main), else one the
         * pipeline makes. */
        t->popts.schedule = GP_SCHEDULE_1F1B;
        t->popts.remat = GP_REMAT_NONE;
    }
    rc = gp_cli_pipeline_check("train", t->model, t->batch, &t->popts);
    if (rc != GP_CLI_EXIT_OK) return rc;
    /* No output may replace an input or a checkpoint: checked before any work. */
    const gp_cli_path outs[] = {{"--report", o->report, GP_CLI_PATH_READ},
                                {"--trace", o->trace, GP_CLI_PATH_READ},
                                {"--timeline", o->timeline, GP_CLI_PATH_READ},
                                {"--metrics", o->metrics, GP_CLI_PATH_READ},
                                {"--curve", o->curve, GP_CLI_PATH_READ}};
    const gp_cli_path ins[] = {
        {"--model", gp_cli_model_path(o->model), GP_CLI_PATH_READ},
        {"--data", o->data ? o->data : lm ? GP_FORTUNES_DIR : GP_CLI_FASHION_DIR, GP_CLI_PATH_READ},
        {"--checkpoint-dir", o->ckpt_dir, GP_CLI_PATH_CKPT_DIR},
        {"--init", o->init, GP_CLI_PATH_READ},
        {"--prompts", o->prompts, GP_CLI_PATH_READ},
        {"--val-data", o->lm_data.val_data, GP_CLI_PATH_READ},
        {"--tokenizer", o->tokenizer, GP_CLI_PATH_READ}};
    int rc1 = gp_cli_check_outputs("train", outs, 5, ins, 6);
    if (rc1 != GP_CLI_EXIT_OK) return rc1;
    /* Read now: a bad prompts file fails before the training it would follow. */
    if (o->prompts) {
        rc1 = gp_cli_read_prompts("train", o->prompts, &t->prompts);
        if (rc1 != GP_CLI_EXIT_OK) return rc1;
    }
#undef SEEN
#undef USED
    return GP_CLI_EXIT_OK;
}

/* How many of this run's steps the median step time is taken over: the first only when fewer
 * than 3 ran (it first touches the memory every later step reuses, which no later step pays). */
static int timed_steps(const gp_cli_train *t) {
    const int n = t->steps_done - t->start_step;
    return n >= 3 ? n - 1 : n;
}

/* The median wall time of this run's steps after the first (0: none ran). */
/* The step --plan auto predicts: its trial's, else the chosen plan's modelled one. */
static double predicted_step(const gp_cli_train *t) {
    return t->trial.steps > 0 ? t->trial.step_s : t->plan_found.plans[0].step_s;
}

static double median_step(const gp_cli_train *t) {
    const int n = timed_steps(t);
    return n > 0 && t->step_seconds ? gp_cli_median(t->step_seconds + t->steps_done - n, n) : 0;
}

static cJSON *build_report(gp_cli_train *t, double elapsed) {
    cJSON *r = cJSON_CreateObject();
    char hex[17];
    cJSON_AddStringToObject(r, "model", t->model_name);
    cJSON_AddStringToObject(r, "task", t->is_lm ? "language_model" : "classifier");
    cJSON_AddStringToObject(r, "gpipe_version", gp_version());
    gp_cli_report_u64(r, "seed", t->seed);
    cJSON_AddNumberToObject(r, "steps", t->steps_done);
    if (!t->is_lm) cJSON_AddNumberToObject(r, "epochs", t->epochs_done);
    cJSON_AddNumberToObject(r, "batch", t->batch);
    cJSON_AddNumberToObject(r, "micro_batches", t->micro_batches);
    if (t->is_lm) cJSON_AddNumberToObject(r, "seq_len", (double)t->in_shape.dim[1]);
    cJSON_AddNumberToObject(r, "threads", t->threads); /* per device */
    cJSON_AddStringToObject(r, "optimizer", t->optimizer);
    cJSON_AddNumberToObject(r, "lr", t->lr);
    cJSON_AddNumberToObject(r, "min_lr", t->min_lr);
    cJSON_AddNumberToObject(r, "weight_decay", t->weight_decay);
    cJSON_AddNumberToObject(r, "warmup", t->warmup);
    cJSON_AddStringToObject(r, "lr_schedule", t->schedule);
    cJSON_AddNumberToObject(r, "lr_cycles", t->lr_cycles);
    if (!t->is_lm) cJSON_AddStringToObject(r, "augment", gp_cli_augment_name(t->augment));
    if (!t->is_lm) cJSON_AddNumberToObject(r, "erase", t->erase);
    if (!t->is_lm) cJSON_AddStringToObject(r, "tta", gp_cli_tta_name(t->tta));
    cJSON_AddNumberToObject(r, "clip", t->clip);
    cJSON_AddNumberToObject(r, "label_smoothing", t->popts.label_smoothing);
    cJSON_AddStringToObject(r, "grad_sum", gp_grad_sum_name(t->popts.grad_sum));
    cJSON_AddStringToObject(r, "precision", gp_precision_name(t->popts.precision));
    cJSON_AddNumberToObject(r, "nparams", (double)gp_model_nparams(t->model));
    gp_cli_report_blas_core(r);
    const char *isa;
    (void)gp_cpu_isa(&isa); /* its error stopped main() already */
    cJSON_AddStringToObject(r, "cpu_isa", isa);
    cJSON_AddNumberToObject(r, "elapsed_s", elapsed);
    cJSON *tr = cJSON_AddObjectToObject(r, "train");
    cJSON_AddNumberToObject(tr, "final_loss", t->final_loss);
    cJSON_AddNumberToObject(tr, "seconds", t->train_seconds);
    cJSON_AddNumberToObject(tr, "cpu_seconds", t->train_cpu_seconds);
    cJSON_AddNumberToObject(tr, "examples", (double)t->examples_seen);
    /* This process's steps: start_step+1 .. steps_done (a resumed run starts late). */
    cJSON_AddNumberToObject(tr, "first_step", t->start_step);
    cJSON *losses = cJSON_AddArrayToObject(tr, "step_losses");
    for (int i = t->start_step; t->step_losses && i < t->steps_done; i++)
        cJSON_AddItemToArray(losses, cJSON_CreateNumber((double)t->step_losses[i]));
    cJSON *ev = cJSON_AddObjectToObject(r, "eval");
    if (t->have_eval) {
        cJSON_AddNumberToObject(ev, "loss", t->eval_loss);
        if (t->is_lm) {
            char key[32];
            snprintf(key, sizeof key, "bits_per_%s", t->lm_unit);
            cJSON_AddNumberToObject(ev, key, t->eval_loss / log(2.0));
            cJSON_AddNumberToObject(ev, "windows", (double)t->eval_count);
        } else {
            cJSON_AddNumberToObject(ev, "accuracy", t->eval_accuracy);
            if (t->eval_tta) {
                cJSON_AddNumberToObject(ev, "tta_loss", t->eval_tta_loss);
                cJSON_AddNumberToObject(ev, "tta_accuracy", t->eval_tta_accuracy);
            }
            cJSON_AddNumberToObject(ev, "examples", (double)t->eval_count);
        }
    }
    if (t->eval_history) {
        cJSON_AddItemToObject(r, "eval_history", t->eval_history);
        t->eval_history = NULL;
    }
    cJSON *th = cJSON_AddObjectToObject(r, "throughput");
    double ex_s = t->train_seconds > 0 ? (double)t->examples_seen / t->train_seconds : 0;
    cJSON_AddNumberToObject(th, "examples_per_s", ex_s);
    if (t->is_lm) cJSON_AddNumberToObject(th, "tokens_per_s", ex_s * (double)t->in_shape.dim[1]);
    if (t->ckpt_dir) cJSON_AddItemToObject(r, "checkpoints", gp_cli_ckpt_report(t));
    gp_mem_stats st;
    gp_device_mem_stats(t->dev, &st);
    gp_cli_report_memory(r, &st);
    if (t->stages > 0) gp_cli_pipeline_report(r, t);
    if (t->plan_found.n) {
        cJSON *pa = gp_cli_plan_search_json(&t->plan_found, t->plan_devices);
        cJSON_AddNumberToObject(pa, "predicted_step_s", predicted_step(t));
        cJSON_AddNumberToObject(pa, "action_s", t->action_s);
        if (t->flop_step_s > 0) { /* the FLOP-based figure the calibration replaced */
            cJSON_AddNumberToObject(pa, "flop_step_s", t->flop_step_s);
            cJSON_AddNumberToObject(pa, "calibration_s", t->calibrate_s);
        }
        if (t->trial.steps > 0) { /* predicted_step_s is the trial's; plans[0] the model's */
            cJSON *tr = cJSON_AddObjectToObject(pa, "trial");
            cJSON_AddNumberToObject(tr, "step_s", t->trial.step_s);
            cJSON_AddNumberToObject(tr, "steps", t->trial.steps);
            cJSON_AddNumberToObject(tr, "trials", t->trial.tried);
            cJSON_AddNumberToObject(tr, "seconds", t->trial.seconds);
            cJSON_AddBoolToObject(tr, "moved", t->trial.moved);
            cJSON *part = cJSON_AddArrayToObject(tr, "partition"); /* the cells trained */
            for (int k = 0; k < t->plan_found.plans[0].ncells; k++)
                cJSON_AddItemToArray(part, cJSON_CreateNumber(t->trial.first[k]));
        }
        cJSON_AddNumberToObject(pa, "measured_step_s", median_step(t)); /* median */
        cJSON_AddItemToObject(r, "plan_auto", pa);
    }
    gp_cli_hex64(t->params_hash, hex);
    cJSON_AddStringToObject(r, "params_fnv1a64", hex);
    return r;
}

static void print_summary(gp_cli_train *t) {
    gp_mem_stats st;
    gp_device_mem_stats(t->dev, &st);
    char hex[17], mem[32], dur[32];
    gp_cli_hex64(t->params_hash, hex);
    double ex_s = t->train_seconds > 0 ? (double)t->examples_seen / t->train_seconds : 0;
    if (t->start_step > 0) printf("resumed at step %d; ", t->start_step);
    printf("trained %d steps in %s: %.1f %s/s", t->steps_done - t->start_step,
           gp_cli_fmt_duration(t->train_seconds, dur, sizeof dur), ex_s,
           t->is_lm ? "sequences" : "images");
    if (t->is_lm) printf(" (%.0f tokens/s)", ex_s * (double)t->in_shape.dim[1]);
    printf(", final loss %.4f\n", t->final_loss);
    if (t->ckpt_saves > 0)
        printf("checkpoints: %d saved (%s), %.2fs copying at step boundaries, %.2fs waiting for "
               "a save still being written (%.2fs at the stop), %.2fs of writes\n",
               t->ckpt_saves, t->ckpt_sync ? "--checkpoint-sync" : "in the background",
               t->ckpt_copy_s, t->ckpt_wait_s, t->ckpt_flush_s, t->ckpt_write_s);
    printf("peak memory %s (", gp_cli_fmt_bytes(st.peak_total, mem, sizeof mem));
    for (int c = 0; c < GP_MEM_NCATEGORIES; c++)
        printf("%s%s %s", c ? ", " : "", gp_mem_category_name((gp_mem_category)c),
               gp_cli_fmt_bytes(st.peak[c], mem, sizeof mem));
    printf("); params fnv1a64 %s\n", hex);
    gp_cli_pipeline_summary(t);
    const double measured = median_step(t);
    if (t->plan_found.n && measured > 0)
        printf("plan auto: predicted %.3f s per step, measured %.3f s (median of %d; %.3fx the "
               "prediction)\n",
               predicted_step(t), measured, timed_steps(t), measured / predicted_step(t));
    fflush(stdout);
}

/* The fastest plan by FLOPs, planned again with its layers measured (the distinct layers once
 * each, at its micro-batch size, slowed by the contention of its devices at work together) and
 * the optimizer step measured: FLOPs rank the plans, and no layer runs at the sgemm rate they
 * assume, so the step the user is shown is the calibrated one (gp_plan_search, balance TIME,
 * on this plan alone). Replaces plans[0]; where it cannot, says so and keeps the FLOP plan. */
static int calibrate(gp_cli_train *t, const gp_optim_opts *oo, const gp_pipeline_opts *base,
                     gp_plan_search_opts so, int64_t batch) {
    gp_plan *best = &t->plan_found.plans[0];
    gp_pipeline_opts timed = *base;
    timed.balance = GP_BALANCE_TIME;
    so.stages = best->stages;
    so.data_parallel = best->data_parallel;
    so.micro_batches = best->micro_batches;
    so.schedules = 1u << best->schedule;
    so.chunks = best->chunks;
    so.remats = 1u << best->remat;
    so.max_plans = 1;
    so.progress = NULL;
    gp_plan_search_result cal = {0};
    const double t0 = gp_cli_now();
    if (gp_plan_search(t->model, batch, oo, &timed, 0, &so, &cal) != GP_OK || cal.n != 1) {
        printf("plan auto: the fastest could not be timed again on its layers measured (%s); "
               "its step is the FLOP estimate\n",
               cal.n ? "no plan" : gp_last_error());
        gp_plan_search_free(&cal);
        return GP_CLI_EXIT_OK;
    }
    t->calibrate_s = gp_cli_now() - t0;
    t->flop_step_s = best->step_s;
    const gp_plan flop = *best;
    *best = cal.plans[0];
    cal.plans[0] = flop; /* freed with cal */
    gp_plan_search_free(&cal);
    printf("plan auto: the fastest timed again with its layers measured at micro-batches of "
           "%lld (%.2f s): step %.3f s (by FLOPs %.3f s)\n",
           (long long)best->micro_batch_size, t->calibrate_s, best->step_s, t->flop_step_s);
    fflush(stdout);
    return GP_CLI_EXIT_OK;
}

/* --plan auto's trial (gp_cli_plan_trial) of the plan the options now hold: its step measured
 * by running it on stand-ins shaped as the run's batches, its cells moved where that ran
 * faster (t->partition, which the run trains, and t->plan_partition); plans[] stay the model's. */
static int plan_trial(gp_cli_train *t, const train_opts *o, bool given) {
    const gp_plan *best = &t->plan_found.plans[0];
    if (given && o->plan_trial <= 0) return GP_CLI_EXIT_OK;
    gp_pipeline_opts po = t->popts;
    po.action_s = t->action_s;
    const gp_optim_opts oo = gp_cli_train_optim(t, 0); /* the kind of step, not its rates */
    gp_cli_trial_data d = {.model_src = o->model, .x = t->in_shape, .y = t->out_shape,
                           .x_dtype = gp_model_input_dtype(t->model)};
    d.classes = d.y.dim[d.y.ndim - 1];
    d.y.dim[--d.y.ndim] = 0; /* one label per output row, as the run's batches */
    /* token inputs as the data holds them: bytes of text, ids below the token files' vocabulary */
    d.ids = !t->is_lm ? 1 : t->lm_src.tokens ? t->lm_src.vocab : 256;
    if (d.ids > d.classes) d.ids = d.classes;
    int rc = gp_cli_plan_trial("train", &d, t->model, &oo, &po, t->batch, best->step_s,
                               given ? o->plan_trial : -1, &t->trial);
    if (rc != GP_CLI_EXIT_OK || t->trial.steps == 0) return rc;
    const int n = best->ncells;
    if (t->trial.moved) {
        size_t len = 0;
        const size_t cap = 12 * (size_t)n + 1; /* plan_auto's */
        for (int k = 0; k < n; k++) {
            t->partition[k] = t->trial.first[k];
            len += (size_t)snprintf(t->plan_partition + len, cap - len, "%s%d", k ? "," : "",
                                    t->trial.first[k]);
        }
    }
    printf("plan auto: timed by running it (%d stand-in steps after one, %d trial%s, %.2f s): "
           "step %.3f s (modelled %.3f s)%s%s\n",
           t->trial.steps, t->trial.tried, t->trial.tried == 1 ? "" : "s", t->trial.seconds,
           t->trial.step_s, best->step_s,
           t->trial.moved ? "; trains the cells from layers " : "",
           t->trial.moved ? t->plan_partition : "");
    fflush(stdout);
    return GP_CLI_EXIT_OK;
}

/* --plan auto: searches the stage count, micro-batches, schedule and remat mode not given for
 * the fastest simulated step that fits the memory limit on N stage devices (D = 1: the threads
 * launcher has no replicas), prints the fastest plans, and fills the options in as if given. */
static int plan_auto(gp_cli_train *t, train_opts *o, gp_cli_opt *tab, int n) {
#define SEEN(name) gp_cli_seen(tab, n, name)
    if (SEEN("--partition"))
        return gp_cli_usage_error("train", "--partition: fits one plan only; --plan auto "
                                           "chooses the cells (leave one of them out)");
    int world = 1;
    const bool under_mpi = gp_mpi_launched(&world) && world > 1; /* each rank would plan alone */
    if (SEEN("--data-parallel") || under_mpi ||
        (o->mpi.launcher && strcmp(o->mpi.launcher, "mpi") == 0))
        return gp_cli_usage_error("train", "--plan auto: plans the threads launcher's stages; "
                                           "under MPI give --stages and --data-parallel (see "
                                           "gpipe plan --devices)");
    const int cores = gp_cli_max_threads();
    const int T = SEEN("--tensor-parallel") ? o->pipe.tensor_parallel : 1;
    int N = SEEN("--devices") ? o->devices : cores / (SEEN("--threads") ? o->threads : 1);
    if (N < T) N = T;
    if (!SEEN("--threads")) {
        o->threads = cores / N > 1 ? cores / N : 1;
        gp_cli_set_seen(tab, n, "--threads");
    }
    const int64_t batch = SEEN("--batch") ? o->batch : (t->is_lm ? 32 : 128);
    const char *opt = SEEN("--optimizer") ? o->optimizer : (t->is_lm ? "adamw" : "sgd");
    const gp_optim_opts oo =
        strcmp(opt, "adamw") == 0
            ? gp_adamw_defaults(3e-4f, 0.01f)
            : gp_sgd_defaults(0.05f, SEEN("--momentum") ? (float)o->momentum : 0.9f);
    const bool by_time = o->pipe.balance && strcmp(o->pipe.balance, "time") == 0;
    gp_pipeline_opts base = {.memory_limit = SEEN("--memory-limit") ? o->memory_limit : 0,
                             .stage_threads = o->threads,
                             .tensor_parallel = T,
                             .balance = by_time ? GP_BALANCE_TIME : GP_BALANCE_COST};
    const gp_plan_search_opts so = {
        .devices = N,
        .data_parallel = 1,
        .stages = SEEN("--stages") ? o->pipe.stages : 0,
        .micro_batches = SEEN("--micro-batches") ? o->micro_batches : 0,
        .schedules = SEEN("--schedule") ? 1u << gp_cli_schedule_kind(o->pipe.schedule) : 0,
        .chunks = SEEN("--chunks") ? o->pipe.chunks : 0,
        .remats = !SEEN("--remat")                           ? 0
                  : strcmp(o->pipe.remat, "none") == 0       ? 1u << GP_REMAT_NONE
                  : strcmp(o->pipe.remat, "selective") == 0  ? 1u << GP_REMAT_SELECTIVE
                                                             : 1u << GP_REMAT_CELL};
    double gflops = 0;
    if (!by_time) {
        char why[256];
        if (!gp_cli_bench_sgemm(2048, 2048, 2048, o->threads, false, 2, &gflops, why, sizeof why)) {
            fprintf(stderr, "gpipe train: --plan auto: %s\n", why);
            return GP_CLI_EXIT_RUNTIME;
        }
    }
    /* what each action costs beyond its compute, which thin micro-batches make count */
    const double a0 = gp_cli_now();
    int rc = gp_cli_bench_action("train", N / T, o->threads, &base.action_s);
    if (rc != GP_CLI_EXIT_OK) return rc;
    t->action_s = base.action_s;
    printf("plan auto: searching plans of %d stage device%s (%d thread%s each), times %s, "
           "%.0f us per action of the runtime (measured in %.2f s)\n",
           N, N == 1 ? "" : "s", o->threads, o->threads == 1 ? "" : "s",
           by_time ? "measured layer by layer at each micro-batch size"
                   : "from FLOPs at the sgemm rate measured now",
           base.action_s * 1e6, gp_cli_now() - a0);
    fflush(stdout);
    rc = gp_cli_plan_search("train", t->model, batch, &oo, &base, gflops, so, o->quiet,
                            &t->plan_found);
    if (rc != GP_CLI_EXIT_OK) return rc;
    t->plan_devices = N;
    if (!o->quiet)
        gp_cli_plan_search_print(&t->plan_found, N,
                                 t->is_lm ? gp_model_example_shape(t->model).dim[0] : 0);
    if (!by_time) {
        rc = calibrate(t, &oo, &base, so, batch);
        if (rc != GP_CLI_EXIT_OK) return rc;
    }
    const gp_plan *best = &t->plan_found.plans[0];
    o->pipe.stages = best->stages;
    o->micro_batches = best->micro_batches;
    o->pipe.schedule = gp_schedule_kind_name(best->schedule);
    o->pipe.chunks = best->chunks;
    o->pipe.remat = gp_remat_name(best->remat);
    o->batch = (int)batch;
    /* The plan's cells as given ones: the runtime would balance again (by time: on new, noisy
     * measurements) and could pick others. */
    const size_t cap = 12 * (size_t)best->ncells + 1;
    if (!(t->plan_partition = malloc(cap))) return gp_cli_fail("train", "--plan auto");
    size_t len = 0;
    for (int k = 0; k < best->ncells; k++)
        len += (size_t)snprintf(t->plan_partition + len, cap - len, "%s%d", k ? "," : "",
                                best->cells[k].first);
    o->pipe.partition = t->plan_partition;
    o->pipe.balance = NULL;
    static const char *const chosen[] = {"--stages", "--micro-batches", "--schedule",
                                         "--chunks",  "--remat",          "--batch",
                                         "--optimizer", "--partition"};
    o->optimizer = opt;
    for (size_t i = 0; i < sizeof chosen / sizeof *chosen; i++) gp_cli_set_seen(tab, n, chosen[i]);
    printf("plan auto: training the fastest, K = %d (cells from layers %s), M = %d, %s, remat "
           "%s: predicted step %.3f s\n",
           best->stages, t->plan_partition, best->micro_batches,
           gp_schedule_kind_name(best->schedule), gp_remat_name(best->remat), best->step_s);
    return GP_CLI_EXIT_OK;
#undef SEEN
}

int gp_cli_train_main(int argc, char **argv) {
    double t0 = gp_cli_now();
    train_opts o = {0};
    gp_cli_opt tab[NOPTS];
    make_table(tab, &o);
    int n = table_len(tab);
    int rc = gp_cli_parse(tab, n, argc, argv, 2, "train");
    if (rc == GP_CLI_HELP) {
        print_help(tab, n);
        return GP_CLI_EXIT_OK;
    }
    if (rc != GP_CLI_PARSED) return rc;
    if (!o.model)
        return gp_cli_usage_error("train", "--model: required (convnet, transformer, gpt2 or FILE.json)");

    gp_cli_train t = {0};
    rc = gp_cli_load_model("train", o.model, &t.model);
    if (rc != GP_CLI_EXIT_OK) return rc;
    t.is_lm = gp_model_input_dtype(t.model) == GP_I32; /* token ids: a language model */
    if (o.plan) {
        rc = plan_auto(&t, &o, tab, n);
        if (rc != GP_CLI_EXIT_OK) goto done;
    } else if (gp_cli_seen(tab, n, "--devices") || gp_cli_seen(tab, n, "--plan-trial")) {
        rc = gp_cli_usage_error("train", "%s: only with --plan auto",
                                gp_cli_seen(tab, n, "--devices") ? "--devices" : "--plan-trial");
        goto done;
    }
    char used[1024] = "";
    rc = resolve(&t, &o, tab, n, used, sizeof used);
    if (rc != GP_CLI_EXIT_OK) goto done;
    if (t.ckpt_dir) {
        rc = gp_cli_model_config("train", o.model, &t.model_config);
        if (rc == GP_CLI_EXIT_OK) rc = gp_cli_ckpt_prepare(&t);
        if (rc != GP_CLI_EXIT_OK) goto done;
    }
    if (gp_model_shape(t.model, -1, t.batch, &t.in_shape) != GP_OK ||
        gp_model_shape(t.model, gp_model_nlayers(t.model) - 1, t.batch, &t.out_shape) != GP_OK) {
        rc = gp_cli_fail("train", "--model: cannot infer the model's shapes");
        goto done;
    }
    if (t.is_lm) {
        rc = gp_cli_lm_data_resolve("train", &o.lm_data, o.data,
                                    t.out_shape.dim[t.out_shape.ndim - 1], &t.lm_src);
        if (rc != GP_CLI_EXIT_OK) goto done;
        t.lm_unit = t.lm_src.tokens ? "token" : "byte";
        t.sample_tokens = t.lm_src.tokens;
        t.sample_ids = !o.tokenizer;
        if (o.tokenizer && !t.lm_src.tokens) {
            rc = gp_cli_usage_error("train", "--tokenizer: only with token data (--data-format "
                                             "llmc, u16 or u32); --data %s is text",
                                    t.lm_src.path);
            goto done;
        }
        if (o.tokenizer) rc = gp_cli_load_tokenizer("train", o.tokenizer, &t);
        /* A token model's prompts (ids, or text the tokenizer encodes): checked now, not after
         * the training. */
        for (int i = 0; i < t.prompts.n && t.sample_tokens && rc == GP_CLI_EXIT_OK; i++) {
            int32_t *ids;
            int nids;
            rc = gp_cli_prompt_ids(&t, "train", "--prompts line", t.prompts.text[i], &ids, &nids);
            if (rc == GP_CLI_EXIT_OK) free(ids);
        }
        if (rc != GP_CLI_EXIT_OK) goto done;
    } else if (o.tokenizer) {
        rc = gp_cli_usage_error("train", "--tokenizer: only for language models (int32 input)");
        goto done;
    }
    if (o.plan) {
        rc = plan_trial(&t, &o, gp_cli_seen(tab, n, "--plan-trial"));
        if (rc != GP_CLI_EXIT_OK) goto done;
    }
    char core[GP_CLI_BLAS_CORE_TEXT_SIZE];
    const char *isa;
    (void)gp_cpu_isa(&isa); /* its error stopped main() already */
    printf("gpipe train: model %s (%s, %lld parameters), %d thread(s) per device, BLAS core "
           "%s, CPU kernels %s\n",
           o.model, t.is_lm ? "language model" : "classifier",
           (long long)gp_model_nparams(t.model), t.threads,
           gp_cli_blas_core_text(core, sizeof core), isa);
    printf("defaults used:%s\n", used[0] ? used : " none");
    if (t.stages > 0)
        printf("pipeline: %d stage(s), %d micro-batch(es), schedule %s, remat %s, partition %s%s "
               "(%d thread(s) per stage%s)\n",
               t.popts.stages, t.popts.micro_batches, gp_schedule_kind_name(t.popts.schedule),
               gp_remat_name(t.popts.remat), o.pipe.partition ? o.pipe.partition : "balanced by ",
               o.pipe.partition ? "" : gp_balance_name(t.popts.balance), t.threads,
               t.popts.no_pinning ? ", not pinned" : "");
    if (t.popts.tensor_parallel > 1)
        printf("tensor parallel: each stage's layers split over %d shards (%d devices in all)\n",
               t.popts.tensor_parallel,
               t.place.data_parallel * t.popts.stages * t.popts.tensor_parallel);
    if (t.place.launcher == GP_LAUNCHER_MPI && t.popts.tensor_parallel > 1)
        printf("MPI: %d rank(s) = %d replica(s) x %d stage(s) x %d shard(s); comm timeout %g s\n",
               t.place.nranks, t.place.data_parallel, t.popts.stages, t.popts.tensor_parallel,
               t.place.timeout_s);
    else if (t.place.launcher == GP_LAUNCHER_MPI)
        printf("MPI: %d rank(s) = %d replica(s) x %d stage(s); comm timeout %g s\n",
               t.place.nranks, t.place.data_parallel, t.popts.stages, t.place.timeout_s);
    if (t.stages > 0 && t.popts.balance == GP_BALANCE_TIME)
        printf("profiling each layer's forward and backward for --balance time...\n");
    fflush(stdout);

    /* With stages, cpu0 only holds the batches: the stage devices compute. */
    if (gp_device_cpu_new_threads("cpu0", t.stages > 0 ? 1 : t.threads, &t.dev) != GP_OK) {
        rc = gp_cli_fail("train", "cannot create the CPU device");
        goto done;
    }
    if (t.memory_limit && gp_device_set_limit(t.dev, t.memory_limit) != GP_OK) {
        rc = gp_cli_fail("train", "--memory-limit");
        goto done;
    }
    if (t.stages == 0 &&
        strcmp(gp_device_kind(t.dev), gp_device_type_name(t.popts.device_type)) == 0)
        t.popts.devices = &t.dev;
    /* The pipeline initializes the layers on its stage devices itself. */
    rc = t.is_lm ? gp_cli_train_lm(&t) : gp_cli_train_classifier(&t);
    if (rc == GP_CLI_EXIT_OK) rc = gp_cli_log_finish(&t);
    if (rc != GP_CLI_EXIT_OK) goto done;
    /* Every rank: the parameter hash through every stage, the ranks' timelines. */
    if (gp_pipeline_params_fnv1a64(t.pipeline, &t.params_hash) != GP_OK ||
        gp_pipeline_gather(t.pipeline) != GP_OK) {
        rc = gp_cli_fail("train", "gathering the ranks' parameter hash and timelines");
        goto done;
    }
    print_summary(&t);
    rc = gp_cli_pipeline_write_files(&t);
    if (rc != GP_CLI_EXIT_OK) goto done;
    if (t.sample > 0) {
        FILE *f = t.place.rank == 0 ? stdout : NULL;
        const int nprompts = t.prompts.n ? t.prompts.n : 1;
        for (int i = 0; i < nprompts && rc == GP_CLI_EXIT_OK; i++) {
            const char *prompt = t.prompts.n ? t.prompts.text[i] : NULL;
            const char *unit = t.sample_tokens ? "tokens" : "bytes";
            if (f && prompt) {
                printf("sample %d of %d (%d %s, temperature %g, seed %llu) after the prompt:\n",
                       i + 1, nprompts, t.sample, unit, t.temperature, (unsigned long long)t.seed);
                rc = gp_cli_print_prompt(&t, "train", prompt, stdout);
                if (rc != GP_CLI_EXIT_OK) break;
            } else if (f) {
                printf("sample (%d %s, temperature %g, seed %llu):\n", t.sample, unit,
                       t.temperature, (unsigned long long)t.seed);
            }
            fflush(stdout);
            rc = gp_cli_sample(&t, "train", prompt, t.sample, f);
        }
        if (rc != GP_CLI_EXIT_OK) goto done;
    }
    if (t.report && t.place.rank == 0) {
        cJSON *r = build_report(&t, gp_cli_now() - t0);
        if (!gp_cli_report_write("train", r, t.report, "--report"))
            rc = GP_CLI_EXIT_RUNTIME;
        else
            printf("report written to %s\n", t.report);
        cJSON_Delete(r);
    }
done:
    gp_plan_search_free(&t.plan_found);
    free(t.plan_partition);
    free(t.trial.first);
    gp_cli_log_close(&t);
    gp_cli_prompts_free(&t.prompts);
    gp_tokenizer_free(t.tokenizer);
    cJSON_Delete(t.eval_history);
    free(t.step_losses);
    free(t.step_seconds);
    free(t.model_config);
    gp_pipeline_free(t.pipeline); /* releases the stage devices and the parameters on them */
    free(t.partition);
    gp_model_free(t.model); /* releases the parameters, before their device */
    if (t.dev) gp_device_free(t.dev);
    return rc;
}
