/* Checkpoints of `gpipe train`: DIR/ckpt-<step, 8 digits>.safetensors written every N steps, at
 * --stop-after and at the end (atomically, by the library, in the background unless
 * --checkpoint-sync: copied at the step boundary, written while the next steps run, one save in
 * flight, a boundary waiting for it counted); under MPI instead one part per
 * stage, ckpt-<step>-<k>-of-<K>.safetensors, committed by ckpt-<step>.safetensors.index.json.
 * The newest --keep are kept; --resume takes the newest complete one (a write cut short is only
 * ever a .tmp.<pid> file or parts without an index, which are removed once it has loaded),
 * checks that the model and the options that shape the numbers are the same, and continues at
 * its step, so the run ends with the bits of an uninterrupted one, whatever K saved it and
 * whatever K resumes. */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cli.h"

#define CKPT_PREFIX "ckpt-"
#define CKPT_SUFFIX ".safetensors"

/* Opens --model's file for reading if it is a regular file; a FIFO is refused, not waited on
 * (O_NONBLOCK makes its open return at once). Returns an exit status. */
static int open_model_file(const char *cmd, const char *name, FILE **out) {
    *out = NULL;
    int fd = open(name, O_RDONLY | O_NONBLOCK | O_NOCTTY);
    struct stat st;
    if (fd < 0 || fstat(fd, &st) != 0) {
        fprintf(stderr, "gpipe %s: --model %s: cannot read: %s\n", cmd, name, strerror(errno));
        if (fd >= 0) close(fd);
        return GP_CLI_EXIT_RUNTIME;
    }
    if (!S_ISREG(st.st_mode)) {
        fprintf(stderr, "gpipe %s: --model %s: not a regular file (expected a JSON model file)\n",
                cmd, name);
        close(fd);
        return GP_CLI_EXIT_RUNTIME;
    }
    (void)fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) & ~O_NONBLOCK);
    *out = fdopen(fd, "rb");
    if (!*out) {
        fprintf(stderr, "gpipe %s: --model %s: cannot read: %s\n", cmd, name, strerror(errno));
        close(fd);
        return GP_CLI_EXIT_RUNTIME;
    }
    return GP_CLI_EXIT_OK;
}

int gp_cli_model_config(const char *cmd, const char *name, char **out) {
    *out = NULL;
    if (!gp_cli_model_path(name)) { /* a built-in family */
        size_t n = strlen(name) + 16;
        *out = malloc(n);
        if (*out) snprintf(*out, n, "{\"family\":\"%s\"}", name);
    } else {
        FILE *f;
        int rc = open_model_file(cmd, name, &f);
        if (rc != GP_CLI_EXIT_OK) return rc;
        size_t cap = 4096, n = 0;
        char *buf = malloc(cap);
        while (buf) {
            n += fread(buf + n, 1, cap - n - 1, f);
            if (n < cap - 1 || cap > (64u << 20)) break;
            char *nb = realloc(buf, cap * 2);
            if (!nb) free(buf);
            buf = nb;
            cap *= 2;
        }
        fclose(f);
        if (buf) buf[n] = '\0';
        *out = buf;
    }
    if (!*out) {
        fprintf(stderr, "gpipe %s: --model %s: out of host memory\n", cmd, name);
        return GP_CLI_EXIT_RUNTIME;
    }
    return GP_CLI_EXIT_OK;
}

/* The names in --checkpoint-dir: a one-file checkpoint, the index that commits a multi-part
 * set (MPI), a part of one, and the temporary file of a write cut short. Only these exact
 * forms are gpipe's: anything else in the folder is the user's and is never touched. */
enum { NAME_OTHER, NAME_SINGLE, NAME_INDEX, NAME_PART, NAME_TMP };
#define CKPT_INDEX_SUFFIX CKPT_SUFFIX ".index.json"
#define TMP_INFIX ".tmp." /* gp_file_out writes <final name>.tmp.<pid> */

/* s starts with exactly n decimal digits. */
static bool digits(const char *s, size_t n) {
    for (size_t i = 0; i < n; i++)
        if (s[i] < '0' || s[i] > '9') return false;
    return true;
}

/* The step of "ckpt-<step>": 8 digits with leading zeros (ckpt_path's %08ld), or more without;
 * *rest: what follows. -1 if name is not so. */
static long name_step(const char *name, const char **rest) {
    size_t np = strlen(CKPT_PREFIX), nd = 0;
    if (strncmp(name, CKPT_PREFIX, np) != 0) return -1;
    while (name[np + nd] >= '0' && name[np + nd] <= '9') nd++;
    if (nd < 8 || nd > 10 || (nd > 8 && name[np] == '0')) return -1;
    long v = 0;
    for (size_t i = 0; i < nd; i++) v = v * 10 + (name[np + i] - '0');
    *rest = name + np + nd;
    return v <= 0x7fffffffL ? v : -1;
}

/* The kind of a final (not temporary) name. */
static int final_kind(const char *name, long *step) {
    const char *rest;
    *step = name_step(name, &rest);
    if (*step < 0) return NAME_OTHER;
    if (strcmp(rest, CKPT_SUFFIX) == 0) return NAME_SINGLE;
    if (strcmp(rest, CKPT_INDEX_SUFFIX) == 0) return NAME_INDEX;
    /* -<k, 5 digits>-of-<K, 5 digits>.safetensors (src/pipeline/checkpoint.c) */
    if (rest[0] == '-' && digits(rest + 1, 5) && strncmp(rest + 6, "-of-", 4) == 0 &&
        digits(rest + 10, 5) && strcmp(rest + 15, CKPT_SUFFIX) == 0)
        return NAME_PART;
    *step = -1;
    return NAME_OTHER;
}

static int name_kind(const char *name, long *step) {
    const char *tmp = NULL;
    for (const char *p = strstr(name, TMP_INFIX); p; p = strstr(p + 1, TMP_INFIX)) tmp = p;
    if (!tmp) return final_kind(name, step);
    /* <final name>.tmp.<pid>: the pid in decimal, the final name one of the forms above. */
    const char *pid = tmp + strlen(TMP_INFIX);
    size_t npid = strlen(pid);
    char final[512];
    *step = -1;
    if (npid < 1 || npid > 10 || !digits(pid, npid) || (size_t)(tmp - name) >= sizeof final)
        return NAME_OTHER;
    snprintf(final, sizeof final, "%.*s", (int)(tmp - name), name);
    return final_kind(final, step) == NAME_OTHER ? NAME_OTHER : NAME_TMP;
}

bool gp_cli_ckpt_is_name(const char *name) {
    long step;
    return name_kind(name, &step) != NAME_OTHER;
}

typedef struct ckpt_entry {
    long step;
    bool set; /* committed by an index (else one file) */
} ckpt_entry;

static int cmp_entry_desc(const void *a, const void *b) {
    long x = ((const ckpt_entry *)a)->step, y = ((const ckpt_entry *)b)->step;
    return x < y ? 1 : x > y ? -1 : 0;
}

static void ckpt_path(const char *dir, const ckpt_entry *e, char *buf, size_t n) {
    snprintf(buf, n, "%s/" CKPT_PREFIX "%08ld%s", dir, e->step,
             e->set ? CKPT_INDEX_SUFFIX : CKPT_SUFFIX);
}

static bool has_step(const ckpt_entry *e, int n, long step) {
    for (int i = 0; i < n; i++)
        if (e[i].step == step) return true;
    return false;
}

/* Removes the leftovers of saves cut short: gpipe's temporary files, and parts of sets that
 * were never committed (no index, no one-file checkpoint at their step). Called only once the
 * checkpoint to resume from has loaded (or when there is none), so a failed resume leaves the
 * folder as it was. Returns how many were removed. */
static int clean_dir(const char *dir, const ckpt_entry *e, int n) {
    DIR *d = opendir(dir);
    if (!d) return 0;
    int removed = 0;
    struct dirent *de;
    while ((de = readdir(d))) {
        long st;
        int kind = name_kind(de->d_name, &st);
        if (kind == NAME_TMP || (kind == NAME_PART && !has_step(e, n, st))) {
            char path[4096];
            snprintf(path, sizeof path, "%s/%s", dir, de->d_name);
            if (remove(path) == 0) removed++;
        }
    }
    closedir(d);
    return removed;
}

/* The complete checkpoints in dir, newest first (malloc'd, *n of them). Returns an exit
 * status. */
static int list_checkpoints(const char *dir, ckpt_entry **out, int *n) {
    *out = NULL;
    *n = 0;
    DIR *d = opendir(dir);
    if (!d) {
        fprintf(stderr, "gpipe train: --checkpoint-dir %s: cannot list: %s\n", dir,
                strerror(errno));
        return GP_CLI_EXIT_RUNTIME;
    }
    int cap = 0;
    struct dirent *de;
    while ((de = readdir(d))) {
        long st;
        int kind = name_kind(de->d_name, &st);
        if (kind != NAME_SINGLE && kind != NAME_INDEX) continue;
        if (has_step(*out, *n, st)) { /* both forms at one step: the set */
            for (int i = 0; i < *n; i++)
                if ((*out)[i].step == st && kind == NAME_INDEX) (*out)[i].set = true;
            continue;
        }
        if (*n == cap) {
            cap = cap ? 2 * cap : 16;
            ckpt_entry *ns = realloc(*out, (size_t)cap * sizeof *ns);
            if (!ns) {
                closedir(d);
                fprintf(stderr, "gpipe train: --checkpoint-dir %s: out of host memory\n", dir);
                return GP_CLI_EXIT_RUNTIME;
            }
            *out = ns;
        }
        (*out)[(*n)++] = (ckpt_entry){st, kind == NAME_INDEX};
    }
    closedir(d);
    if (*n) qsort(*out, (size_t)*n, sizeof **out, cmp_entry_desc);
    return GP_CLI_EXIT_OK;
}

/* The options that shape the numbers of a run: a resumed run must use the same. */
static cJSON *train_options(const gp_cli_train *t) {
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "task", t->is_lm ? "language_model" : "classifier");
    cJSON_AddStringToObject(o, "data",
                            t->data ? t->data : t->is_lm ? GP_FORTUNES_DIR : GP_CLI_FASHION_DIR);
    if (t->is_lm && t->lm_src.tokens) { /* only then: text checkpoints resume as before */
        cJSON_AddStringToObject(o, "data_format", gp_token_format_name(t->lm_src.format));
        cJSON_AddNumberToObject(o, "vocab", (double)t->lm_src.vocab);
        if (t->lm_src.val_path) cJSON_AddStringToObject(o, "val_data", t->lm_src.val_path);
    }
    cJSON_AddNumberToObject(o, "steps", t->total_steps);
    cJSON_AddNumberToObject(o, "batch", t->batch);
    cJSON_AddNumberToObject(o, "micro_batches", t->micro_batches);
    cJSON_AddNumberToObject(o, "data_parallel", t->place.data_parallel);
    cJSON_AddStringToObject(o, "optimizer", t->optimizer);
    cJSON_AddNumberToObject(o, "lr", t->lr);
    cJSON_AddNumberToObject(o, "min_lr", t->min_lr);
    cJSON_AddNumberToObject(o, "momentum", t->momentum);
    cJSON_AddNumberToObject(o, "weight_decay", t->weight_decay);
    cJSON_AddNumberToObject(o, "warmup", t->warmup);
    cJSON_AddStringToObject(o, "lr_schedule", t->schedule);
    cJSON_AddNumberToObject(o, "clip", t->clip);
    /* Only when on: checkpoints written before --lr-cycles existed resume without it. */
    if (t->lr_cycles > 1) cJSON_AddNumberToObject(o, "lr_cycles", t->lr_cycles);
    /* Only when on: checkpoints written before --augment existed resume without it. */
    if (t->augment != GP_CLI_AUGMENT_NONE)
        cJSON_AddStringToObject(o, "augment", gp_cli_augment_name(t->augment));
    if (t->erase > 0) cJSON_AddNumberToObject(o, "erase", t->erase);
    if (t->popts.label_smoothing > 0)
        cJSON_AddNumberToObject(o, "label_smoothing", t->popts.label_smoothing);
    /* Only when on: the sum's shape is part of the bits a resume continues. */
    if (t->popts.grad_sum != GP_GRAD_SUM_SEQUENTIAL)
        cJSON_AddStringToObject(o, "grad_sum", gp_grad_sum_name(t->popts.grad_sum));
    /* Only when on, as grad_sum: the GEMMs' rounding is part of the bits too. */
    if (t->popts.precision != GP_PRECISION_FP32)
        cJSON_AddStringToObject(o, "precision", gp_precision_name(t->popts.precision));
    char seed[32]; /* a string: exact for every 64-bit seed */
    snprintf(seed, sizeof seed, "%llu", (unsigned long long)t->seed);
    cJSON_AddStringToObject(o, "seed", seed);
    return o;
}

/* The same model config, or a message saying both. */
static int check_same_model(const gp_cli_train *t, const gp_checkpoint *c, const char *path) {
    const char *mc = gp_checkpoint_meta(c, "model_config");
    cJSON *a = mc ? cJSON_Parse(mc) : NULL, *b = cJSON_Parse(t->model_config);
    bool same_model = a && b && cJSON_Compare(a, b, true);
    cJSON_Delete(a);
    cJSON_Delete(b);
    if (same_model) return GP_CLI_EXIT_OK;
    fprintf(stderr, "gpipe train: --resume: %s was saved from model config %.300s, not from "
                    "--model %s (%.300s)\n",
            path, mc ? mc : "(none)", t->model_name, t->model_config);
    return GP_CLI_EXIT_RUNTIME;
}

/* Same model config and same options, or a message naming what differs. */
static int check_same_run(const gp_cli_train *t, const gp_checkpoint *c, const char *path) {
    int rc0 = check_same_model(t, c, path);
    if (rc0 != GP_CLI_EXIT_OK) return rc0;
    const char *to = gp_checkpoint_meta(c, "train_options");
    cJSON *saved = to ? cJSON_Parse(to) : NULL, *now = train_options(t);
    int rc = GP_CLI_EXIT_OK;
    if (!cJSON_IsObject(saved)) {
        fprintf(stderr, "gpipe train: --resume: %s has no readable train_options in its "
                        "metadata (expected a JSON object; not written by gpipe train?)\n",
                path);
        rc = GP_CLI_EXIT_RUNTIME;
    }
    /* The mini-batch is D x M micro-batches, replica d taking M of them in a row: a run resumes
     * on another D with as many in all, the same micro-batches (the same dropout keys and
     * shapes). A checkpoint that does not say D compares M alone. */
    const cJSON *sd = cJSON_GetObjectItemCaseSensitive(saved, "data_parallel");
    const cJSON *sm = cJSON_GetObjectItemCaseSensitive(saved, "micro_batches");
    if (rc == GP_CLI_EXIT_OK && cJSON_IsNumber(sd) && cJSON_IsNumber(sm)) {
        const double was = sd->valuedouble * sm->valuedouble;
        const double is = (double)t->place.data_parallel * t->micro_batches;
        if (was != is) {
            fprintf(stderr, "gpipe train: --resume: --data-parallel %d x --micro-batches %d = %g "
                            "micro-batches in all differ from the checkpoint's %g x %g = %g (%s): "
                            "resume with as many in all\n",
                    t->place.data_parallel, t->micro_batches, is, sd->valuedouble,
                    sm->valuedouble, was, path);
            rc = GP_CLI_EXIT_RUNTIME;
        }
        cJSON_DeleteItemFromObjectCaseSensitive(now, "micro_batches");
    }
    cJSON_DeleteItemFromObjectCaseSensitive(now, "data_parallel");
    for (const cJSON *c = now->child; c && rc == GP_CLI_EXIT_OK; c = c->next) {
        const cJSON *s = cJSON_GetObjectItemCaseSensitive(saved, c->string);
        if (s && cJSON_Compare(s, c, true)) continue;
        char *sv = s ? cJSON_PrintUnformatted(s) : NULL, *nv = cJSON_PrintUnformatted(c);
        fprintf(stderr, "gpipe train: --resume: %s %s differs from the checkpoint's %s (%s): "
                        "resume with the options of the run that saved it\n",
                gp_cli_option_of(c->string), nv ? nv : "?", sv ? sv : "(none)", path);
        cJSON_free(sv);
        cJSON_free(nv);
        rc = GP_CLI_EXIT_RUNTIME;
    }
    /* The options written only when on: on in the checkpoint, off now. */
    static const char *const optional[][2] = {
        {"augment", "none"}, {"label_smoothing", "0"}, {"lr_cycles", "1"}, {"erase", "0"},
        {"data_format", "text"}, {"val_data", "none"}, {"grad_sum", "sequential"},
        {"precision", "fp32"}};
    for (size_t i = 0; i < sizeof optional / sizeof optional[0] && rc == GP_CLI_EXIT_OK; i++) {
        const cJSON *was = cJSON_GetObjectItemCaseSensitive(saved, optional[i][0]);
        if (!was || cJSON_GetObjectItemCaseSensitive(now, optional[i][0])) continue;
        char *wv = cJSON_IsString(was) ? NULL : cJSON_PrintUnformatted(was);
        fprintf(stderr, "gpipe train: --resume: %s %s differs from the checkpoint's %s (%s): "
                        "resume with the options of the run that saved it\n",
                gp_cli_option_of(optional[i][0]), optional[i][1],
                cJSON_IsString(was) ? was->valuestring : wv ? wv : "?", path);
        cJSON_free(wv);
        rc = GP_CLI_EXIT_RUNTIME;
    }
    cJSON_Delete(saved);
    cJSON_Delete(now);
    return rc;
}

/* The newest complete checkpoint (path) and the one before it (prev, "" if none); *n: how
 * many there are. Returns an exit status. */
static int find_newest(const gp_cli_train *t, char *path, char *prev, size_t size, int *n,
                       long *step) {
    ckpt_entry *e;
    int rc = list_checkpoints(t->ckpt_dir, &e, n);
    path[0] = prev[0] = '\0';
    *step = -1;
    if (rc == GP_CLI_EXIT_OK && *n > 0) {
        ckpt_path(t->ckpt_dir, &e[0], path, size);
        *step = e[0].step;
    }
    if (rc == GP_CLI_EXIT_OK && *n > 1) ckpt_path(t->ckpt_dir, &e[1], prev, size);
    free(e);
    return rc;
}

int gp_cli_ckpt_newest(const char *dir, char *path, size_t size, int *step) {
    ckpt_entry *e;
    int n;
    path[0] = '\0';
    *step = -1;
    int rc = list_checkpoints(dir, &e, &n);
    if (rc != GP_CLI_EXIT_OK || n == 0) {
        free(e);
        return rc;
    }
    ckpt_path(dir, &e[0], path, size);
    free(e);
    gp_checkpoint *c = NULL;
    if (gp_checkpoint_open(path, &c) != GP_OK || gp_checkpoint_saved_step(c, step) != GP_OK)
        rc = GP_CLI_EXIT_RUNTIME;
    gp_checkpoint_close(c);
    return rc;
}

/* The newest checkpoint was committed complete but does not load: taking an older one silently
 * would lose the steps since and hide the damage, so the user decides. */
static void say_previous(const gp_cli_train *t, const char *path, const char *prev) {
    if (prev[0])
        fprintf(stderr, "gpipe train: --resume: %s was committed complete but does not load; to "
                        "resume from the previous checkpoint %s, move the damaged one out of "
                        "%s\n",
                path, prev, t->ckpt_dir);
}

/* Before the model is allocated: the newest checkpoint is of this model config, and its
 * tensors' names, dtypes and shapes are the model's (headers only). */
static int precheck_resume(const gp_cli_train *t, const char *path, const char *prev) {
    gp_checkpoint *c = NULL;
    bool damaged = gp_checkpoint_open(path, &c) != GP_OK;
    int rc = damaged ? gp_cli_fail("train", "--resume") : check_same_model(t, c, path);
    if (rc == GP_CLI_EXIT_OK && gp_checkpoint_check_model(c, t->model) != GP_OK) {
        rc = gp_cli_fail("train", "--resume");
        damaged = true;
    }
    if (damaged) say_previous(t, path, prev);
    gp_checkpoint_close(c);
    return rc;
}

int gp_cli_ckpt_prepare(gp_cli_train *t) {
    if (!t->ckpt_dir) return GP_CLI_EXIT_OK;
    struct stat st;
    if (stat(t->ckpt_dir, &st) != 0) {
        /* EEXIST: another rank of an MPI job made it first. */
        if (errno != ENOENT || (mkdir(t->ckpt_dir, 0777) != 0 && errno != EEXIST)) {
            fprintf(stderr, "gpipe train: --checkpoint-dir %s: cannot create: %s\n", t->ckpt_dir,
                    strerror(errno));
            return GP_CLI_EXIT_RUNTIME;
        }
    } else if (!S_ISDIR(st.st_mode)) {
        fprintf(stderr, "gpipe train: --checkpoint-dir %s: not a directory\n", t->ckpt_dir);
        return GP_CLI_EXIT_RUNTIME;
    }
    char path[4096], prev[4096];
    int n;
    long step;
    int rc = find_newest(t, path, prev, sizeof path, &n, &step);
    if (rc == GP_CLI_EXIT_OK && !t->resume && n > 0) {
        /* A fresh run would mix its checkpoints with these, and --keep could delete its own. */
        fprintf(stderr, "gpipe train: --checkpoint-dir %s already holds checkpoints (the newest "
                        "at step %ld): add --resume to continue from it, or give another folder\n",
                t->ckpt_dir, step);
        rc = GP_CLI_EXIT_RUNTIME;
    }
    if (rc == GP_CLI_EXIT_OK && t->resume && n > 0) rc = precheck_resume(t, path, prev);
    return rc;
}

/* Removes what interrupted saves left in the folder (MPI: rank 0 alone), saying so. */
static void remove_leftovers(const gp_cli_train *t) {
    ckpt_entry *e;
    int n;
    if (t->place.rank != 0 || list_checkpoints(t->ckpt_dir, &e, &n) != GP_CLI_EXIT_OK) return;
    int removed = clean_dir(t->ckpt_dir, e, n);
    free(e);
    if (removed)
        printf("checkpoint: removed %d incomplete file(s) left in %s by an interrupted save\n",
               removed, t->ckpt_dir);
}

int gp_cli_ckpt_resume(gp_cli_train *t) {
    t->start_step = 0;
    if (!t->ckpt_dir || !t->resume) return GP_CLI_EXIT_OK;
    char path[4096], prev[4096];
    int n;
    long newest;
    int rc = find_newest(t, path, prev, sizeof path, &n, &newest);
    if (rc != GP_CLI_EXIT_OK) return rc;
    if (n == 0) {
        /* every save so far was interrupted: its leftovers are garbage, nothing else is there */
        remove_leftovers(t);
        printf("resume: no checkpoint in %s; starting fresh at step 0\n", t->ckpt_dir);
        fflush(stdout);
        return GP_CLI_EXIT_OK;
    }
    gp_checkpoint *c = NULL;
    int step = 0;
    bool damaged = gp_checkpoint_open(path, &c) != GP_OK;
    rc = damaged ? gp_cli_fail("train", "--resume") : check_same_run(t, c, path);
    if (rc == GP_CLI_EXIT_OK &&
        (gp_checkpoint_saved_step(c, &step) != GP_OK ||
         gp_pipeline_checkpoint_load(t->pipeline, c) != GP_OK ||
         gp_pipeline_set_step(t->pipeline, step) != GP_OK)) {
        rc = gp_cli_fail("train", "--resume");
        damaged = true;
    }
    if (damaged) say_previous(t, path, prev);
    gp_checkpoint_close(c);
    if (rc != GP_CLI_EXIT_OK) return rc;
    if (step > t->total_steps) {
        fprintf(stderr, "gpipe train: --resume: %s is at step %d, past the %d steps of this run\n",
                path, step, t->total_steps);
        return GP_CLI_EXIT_RUNTIME;
    }
    /* Loaded: only now are the leftovers of interrupted saves removed. */
    remove_leftovers(t);
    t->start_step = step;
    printf("resume: loaded %s: continuing at step %d of %d\n", path, step, t->total_steps);
    fflush(stdout);
    return GP_CLI_EXIT_OK;
}

/* Removes a checkpoint: its file or index first (so what is left is never taken for complete),
 * then its parts. */
static void remove_checkpoint(const char *dir, const ckpt_entry *e) {
    char path[4096];
    ckpt_entry both[2] = {{e->step, false}, {e->step, true}};
    for (int i = 0; i < 2; i++) {
        ckpt_path(dir, &both[i], path, sizeof path);
        if (remove(path) != 0 && errno != ENOENT)
            fprintf(stderr, "gpipe train: --keep: cannot remove %s: %s\n", path, strerror(errno));
    }
    DIR *d = opendir(dir);
    struct dirent *de;
    while (d && (de = readdir(d))) {
        long st;
        if (name_kind(de->d_name, &st) != NAME_PART || st != e->step) continue;
        snprintf(path, sizeof path, "%s/%s", dir, de->d_name);
        if (remove(path) != 0)
            fprintf(stderr, "gpipe train: --keep: cannot remove %s: %s\n", path, strerror(errno));
    }
    if (d) closedir(d);
}

/* Removes all but the newest --keep checkpoints. */
static void prune(const gp_cli_train *t) {
    ckpt_entry *e;
    int n;
    if (list_checkpoints(t->ckpt_dir, &e, &n) != GP_CLI_EXIT_OK) return;
    for (int i = t->ckpt_keep; i < n; i++) remove_checkpoint(t->ckpt_dir, &e[i]);
    free(e);
}

/* Reports a save that finished (prints it, keeps the newest --keep), or fails naming it. */
static int finished(gp_cli_train *t, gp_cli_progress *p, gp_status s, const gp_checkpoint_saved *d,
                    double waited, bool at_stop) {
    if (at_stop) t->ckpt_flush_s += waited;
    else t->ckpt_wait_s += waited;
    if (s != GP_OK) {
        gp_cli_progress_clear(p);
        return gp_cli_fail("train", "--checkpoint-dir: cannot write a checkpoint");
    }
    if (d->step < 0 || d->pending) return GP_CLI_EXIT_OK;
    t->ckpt_saves++;
    t->ckpt_write_s += d->write_s;
    if (t->place.rank == 0) prune(t);
    gp_cli_progress_clear(p);
    struct stat st;
    char size[32];
    int K = t->place.launcher == GP_LAUNCHER_MPI ? gp_pipeline_stages(t->pipeline) : 0;
    if (K > 0)
        printf("checkpoint: committed %s (step %d, %d parts", d->path, d->step, K);
    else
        printf("checkpoint: wrote %s (step %d, %s", d->path, d->step,
               gp_cli_fmt_bytes(stat(d->path, &st) == 0 ? (uint64_t)st.st_size : 0, size,
                                sizeof size));
    if (t->ckpt_sync)
        printf(", %.2fs)\n", d->write_s + t->ckpt_last_copy_s);
    else
        printf(", copied in %.2fs, written in the background in %.2fs, %s %.2fs)\n",
               t->ckpt_last_copy_s, d->write_s, at_stop ? "the stop waited" : "the step waited",
               waited);
    fflush(stdout);
    return GP_CLI_EXIT_OK;
}

/* The save in flight: finished if written (wait: waited for, as the next save is due). */
static int finish_inflight(gp_cli_train *t, gp_cli_progress *p, bool wait, bool at_stop) {
    gp_checkpoint_saved d;
    gp_status s = gp_pipeline_checkpoint_finish(t->pipeline, wait, &d);
    return finished(t, p, s, &d, d.waited_s, at_stop);
}

int gp_cli_ckpt_after_step(gp_cli_train *t, gp_cli_progress *p, int done) {
    if (!t->ckpt_dir) return GP_CLI_EXIT_OK;
    bool due = done == t->stop_step || (t->ckpt_every > 0 && done % t->ckpt_every == 0);
    /* One save at a time: the one in flight ends first, waited for if this step's is due. */
    int rc = finish_inflight(t, p, due, false);
    if (rc != GP_CLI_EXIT_OK || !due) return rc;
    char buf[64], pos[64];
    double t0 = gp_cli_now();
    cJSON *opts = train_options(t);
    char *opts_text = opts ? cJSON_PrintUnformatted(opts) : NULL;
    cJSON_Delete(opts);
    /* Where the data order stands: windows are keyed by (seed, step); images by the epoch's
     * permutation gp_shuffle(seed, epoch) and the position in it. */
    if (t->is_lm) {
        snprintf(pos, sizeof pos, "{\"step\":%d}", done);
    } else {
        long long e = t->per_epoch ? done / t->per_epoch : 0;
        long long at = t->per_epoch ? (long long)(done % t->per_epoch) * t->batch : 0;
        snprintf(pos, sizeof pos, "{\"epoch\":%lld,\"example\":%lld}", e, at);
    }
    snprintf(buf, sizeof buf, "philox4x32-10 seed %llu", (unsigned long long)t->seed);
    gp_checkpoint_kv kv[] = {{"model_config", t->model_config},
                             {"train_options", opts_text ? opts_text : "{}"},
                             {"data_position", pos},
                             {"rng", buf},
                             {"writer", "gpipe train"}};
    gp_cli_progress_clear(p);
    if (!opts_text) {
        fprintf(stderr, "gpipe train: --checkpoint-dir: out of host memory\n");
        return GP_CLI_EXIT_RUNTIME;
    }
    /* A pipeline saves itself: under MPI one part per stage, committed by an index. */
    char base[4096];
    snprintf(base, sizeof base, "%s/" CKPT_PREFIX "%08d", t->ckpt_dir, done);
    gp_status s = gp_pipeline_checkpoint_start(t->pipeline, base, done, kv, 5, !t->ckpt_sync);
    cJSON_free(opts_text);
    t->ckpt_last_copy_s = gp_cli_now() - t0;
    t->ckpt_copy_s += t->ckpt_last_copy_s;
    if (s != GP_OK) return gp_cli_fail("train", "--checkpoint-dir: cannot write a checkpoint");
    /* The run stops here: its last save is waited for (and so is a synchronous one, done). */
    if (done == t->stop_step || t->ckpt_sync) return finish_inflight(t, p, true, !t->ckpt_sync);
    return GP_CLI_EXIT_OK;
}

int gp_cli_init_params(gp_cli_train *t) {
    gp_checkpoint *c;
    if (gp_checkpoint_open(t->init, &c) != GP_OK) return gp_cli_fail("train", "--init");
    const int L = gp_model_nlayers(t->model);
    gp_status s = gp_checkpoint_check_model(c, t->model);
    if (s == GP_OK) s = gp_model_init(t->model, t->dev, t->seed);
    if (s == GP_OK) s = gp_checkpoint_load_layers(c, t->model, 0, L, NULL);
    gp_checkpoint_close(c);
    if (s != GP_OK) return gp_cli_fail("train", "--init");
    printf("init: loaded the parameters of %s\n", t->init);
    return GP_CLI_EXIT_OK;
}

cJSON *gp_cli_ckpt_report(const gp_cli_train *t) {
    cJSON *c = cJSON_CreateObject();
    if (!c) return NULL;
    cJSON_AddStringToObject(c, "mode", t->ckpt_sync ? "sync" : "background");
    cJSON_AddNumberToObject(c, "every", t->ckpt_every);
    cJSON_AddNumberToObject(c, "saves", t->ckpt_saves);
    cJSON_AddNumberToObject(c, "copy_s", t->ckpt_copy_s);
    cJSON_AddNumberToObject(c, "wait_s", t->ckpt_wait_s);
    cJSON_AddNumberToObject(c, "stop_wait_s", t->ckpt_flush_s);
    cJSON_AddNumberToObject(c, "write_s", t->ckpt_write_s);
    return c;
}
