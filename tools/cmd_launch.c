/* `gpipe launch`: a supervisor over the MPI launcher. It starts `gpipe train` on N processes;
 * when a rank dies or hangs it ends what is left of the job, takes the lost process slots away,
 * chooses the mesh for the processes that remain (launch_layout.c) and starts again from the
 * newest complete checkpoint with --resume, up to --max-restarts times and down to --min-np
 * processes. A lock in the checkpoint folder keeps a second supervisor off a folder whose job
 * still runs; the restarts go into the final report, --metrics and the supervisor's output. */
#define _GNU_SOURCE
#include <errno.h>
#include <libgen.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "launch.h"

#define LOCK_NAME  "gpipe-launch.lock"
#define HOSTS_NAME "gpipe-launch.hosts"
#define MAX_WORDS  64
#define MAX_HOSTS  1024
#define EXIT_INTERRUPTED 130 /* 128 + SIGINT, as a shell reports it */

static volatile sig_atomic_t g_stop;
static void on_signal(int sig) { g_stop = sig; }

typedef struct host {
    char name[256];
    int slots;
    bool gone;
} host;

typedef struct launch_opts {
    int np, min_np, max_restarts;
    const char *hostfile, *launcher;
} launch_opts;

typedef struct launch {
    launch_opts o;
    int targc;
    char **targv; /* the train options after "-- train" */
    const char *ckpt_dir, *report, *metrics;
    char exe[4096];
    char *words[MAX_WORDS]; /* the launcher's command, split at spaces */
    char words_buf[4096];
    int nwords;
    bool srun;
    host hosts[MAX_HOSTS];
    int nhosts;
    char hosts_path[4096];
    char excluded[MAX_HOSTS][256]; /* srun without --hostfile: the nodes lost */
    int nexcluded;
    gp_cli_layout_ctx ctx;
    cJSON *restarts;
} launch;

/* The value of train option `name` ("--name v" or "--name=v", the last one given), or NULL. */
static const char *targ(const launch *l, const char *name) {
    const char *v = NULL;
    size_t n = strlen(name);
    for (int i = 0; i < l->targc; i++) {
        if (strcmp(l->targv[i], name) == 0 && i + 1 < l->targc) v = l->targv[i + 1];
        if (strncmp(l->targv[i], name, n) == 0 && l->targv[i][n] == '=') v = l->targv[i] + n + 1;
    }
    return v;
}

static int targ_int(const launch *l, const char *name, int dflt) {
    const char *v = targ(l, name);
    return v ? atoi(v) : dflt;
}

/* The options the supervisor sets itself, dropped from the user's (valued ones but --resume). */
static bool dropped(const char *a, bool *valued) {
    static const char *const names[] = {"--stages",    "--data-parallel", "--tensor-parallel",
                                        "--partition", "--launcher",      "--micro-batches",
                                        "--resume"};
    for (size_t i = 0; i < sizeof names / sizeof *names; i++) {
        size_t n = strlen(names[i]);
        if (strncmp(a, names[i], n) == 0 && (a[n] == '\0' || a[n] == '=')) {
            *valued = a[n] == '\0' && strcmp(names[i], "--resume") != 0;
            return true;
        }
    }
    return false;
}

/* Reads --hostfile: "HOST [slots=N]" lines (Open MPI's form; # comments). */
static int read_hosts(launch *l) {
    FILE *f = fopen(l->o.hostfile, "r");
    if (!f) {
        fprintf(stderr, "gpipe launch: --hostfile %s: cannot read: %s\n", l->o.hostfile,
                strerror(errno));
        return GP_CLI_EXIT_USAGE;
    }
    char line[1024];
    while (fgets(line, sizeof line, f)) {
        char *h = strtok(line, " \t\r\n");
        if (!h || h[0] == '#') continue;
        if (l->nhosts == MAX_HOSTS) break;
        host *e = &l->hosts[l->nhosts++];
        snprintf(e->name, sizeof e->name, "%s", h);
        e->slots = 1;
        for (char *w = strtok(NULL, " \t\r\n"); w && w[0] != '#'; w = strtok(NULL, " \t\r\n"))
            if (strncmp(w, "slots=", 6) == 0) e->slots = atoi(w + 6);
        if (e->slots < 1) e->slots = 1;
    }
    fclose(f);
    if (l->nhosts == 0) {
        fprintf(stderr, "gpipe launch: --hostfile %s: no hosts in it\n", l->o.hostfile);
        return GP_CLI_EXIT_USAGE;
    }
    return GP_CLI_EXIT_OK;
}

/* The host that ran world rank r: Open MPI maps ranks to the hostfile's slots in order. */
static host *host_of_rank(launch *l, int r) {
    for (int i = 0; i < l->nhosts; i++) {
        if (l->hosts[i].gone) continue;
        if (r < l->hosts[i].slots) return &l->hosts[i];
        r -= l->hosts[i].slots;
    }
    return NULL;
}

static host *find_host(launch *l, const char *name) {
    for (int i = 0; i < l->nhosts; i++)
        if (!l->hosts[i].gone && strcmp(l->hosts[i].name, name) == 0) return &l->hosts[i];
    return NULL;
}

/* The hosts left, as a hostfile in the checkpoint folder; returns an exit status. */
static int write_hosts(launch *l) {
    snprintf(l->hosts_path, sizeof l->hosts_path, "%s/" HOSTS_NAME, l->ckpt_dir);
    FILE *f = fopen(l->hosts_path, "w");
    if (!f) {
        fprintf(stderr, "gpipe launch: cannot write %s: %s\n", l->hosts_path, strerror(errno));
        return GP_CLI_EXIT_RUNTIME;
    }
    for (int i = 0; i < l->nhosts; i++)
        if (!l->hosts[i].gone) fprintf(f, "%s slots=%d\n", l->hosts[i].name, l->hosts[i].slots);
    return fclose(f) == 0 ? GP_CLI_EXIT_OK : GP_CLI_EXIT_RUNTIME;
}

/* The launcher's command line for a mesh: words, the process count (and hosts), gpipe train
 * with the user's options, the mesh and --resume. argv points into l and bufs. */
static void build_argv(launch *l, const gp_cli_layout *m, char **argv, char bufs[6][64]) {
    int n = 0;
    for (int i = 0; i < l->nwords; i++) argv[n++] = l->words[i];
    snprintf(bufs[0], 64, "%d", m->D * m->K * m->T);
    argv[n++] = l->srun ? "-n" : "-np";
    argv[n++] = bufs[0];
    if (l->srun) {
        /* srun takes Slurm's nodes: the ones lost are excluded */
        static char ex[8192];
        size_t len = (size_t)snprintf(ex, sizeof ex, "--exclude=");
        for (int i = 0; i < l->nhosts + l->nexcluded && len < sizeof ex; i++) {
            if (i < l->nhosts && !l->hosts[i].gone) continue;
            const char *name = i < l->nhosts ? l->hosts[i].name : l->excluded[i - l->nhosts];
            len += (size_t)snprintf(ex + len, sizeof ex - len, "%s%s",
                                    ex[len - 1] == '=' ? "" : ",", name);
        }
        if (len >= sizeof ex) len = sizeof ex - 1; /* cut short: snprintf counted the rest */
        if (ex[len - 1] != '=') argv[n++] = ex;
    } else if (l->nhosts) {
        argv[n++] = "--hostfile";
        argv[n++] = l->hosts_path[0] ? l->hosts_path : (char *)l->o.hostfile;
    }
    argv[n++] = l->exe;
    argv[n++] = "train";
    for (int i = 0; i < l->targc; i++) {
        bool valued;
        if (dropped(l->targv[i], &valued)) {
            i += valued;
            continue;
        }
        argv[n++] = l->targv[i];
    }
    snprintf(bufs[1], 64, "%d", m->K);
    snprintf(bufs[2], 64, "%d", m->D);
    snprintf(bufs[3], 64, "%d", m->T);
    snprintf(bufs[4], 64, "%d", m->M);
    char *tail[] = {"--launcher",        "mpi",   "--stages",        bufs[1], "--data-parallel",
                    bufs[2],             "--tensor-parallel", bufs[3], "--micro-batches",
                    bufs[4],             "--resume"};
    for (size_t i = 0; i < sizeof tail / sizeof *tail; i++) argv[n++] = tail[i];
    argv[n] = NULL;
}

/* Takes the lock of the checkpoint folder, held (by this process and the job it starts, which
 * inherits it) until they have all ended: a lock left by a job that has ended is free again. */
static int take_lock(const launch *l) {
    char path[4096], text[512] = "";
    snprintf(path, sizeof path, "%s/" LOCK_NAME, l->ckpt_dir);
    int fd = open(path, O_RDWR | O_CREAT, 0666); /* not close-on-exec: the job keeps it */
    if (fd < 0) {
        fprintf(stderr, "gpipe launch: cannot open the lock %s: %s\n", path, strerror(errno));
        return GP_CLI_EXIT_RUNTIME;
    }
    if (flock(fd, LOCK_EX | LOCK_NB) != 0) {
        ssize_t n = read(fd, text, sizeof text - 1);
        text[n > 0 ? n : 0] = '\0';
        text[strcspn(text, "\n")] = '\0';
        fprintf(stderr,
                "gpipe launch: --checkpoint-dir %s is in use by a job still running (%s holds "
                "%s): wait for it to end or stop it; two jobs on one folder would overwrite "
                "each other's checkpoints\n",
                l->ckpt_dir, text[0] ? text : "a process", path);
        close(fd);
        return GP_CLI_EXIT_RUNTIME;
    }
    char hostname[256] = "?";
    gethostname(hostname, sizeof hostname - 1);
    time_t now = time(NULL);
    char when[64];
    strftime(when, sizeof when, "%Y-%m-%dT%H:%M:%SZ", gmtime(&now));
    int len = snprintf(text, sizeof text, "gpipe launch pid %d on host %s since %s\n",
                       (int)getpid(), hostname, when);
    if (ftruncate(fd, 0) != 0 || pwrite(fd, text, (size_t)len, 0) != len)
        fprintf(stderr, "gpipe launch: cannot write the lock %s: %s\n", path, strerror(errno));
    return GP_CLI_EXIT_OK; /* fd stays open for the life of this process */
}

/* What the layout choice needs from the train options (the defaults of gpipe train). */
static int layout_ctx(launch *l) {
    const char *model = targ(l, "--model");
    if (!model)
        return gp_cli_usage_error("launch", "-- train: --model is required (as for gpipe train)");
    int rc = gp_cli_load_model("launch", model, &l->ctx.model);
    if (rc != GP_CLI_EXIT_OK) return rc;
    const bool lm = gp_model_input_dtype(l->ctx.model) == GP_I32;
    l->ctx.batch = targ_int(l, "--batch", lm ? 32 : 128);
    l->ctx.chunks = targ_int(l, "--chunks", 0);
    l->ctx.threads = targ_int(l, "--threads", 1);
    l->ctx.schedule = gp_cli_schedule_kind(targ(l, "--schedule"));
    const char *remat = targ(l, "--remat");
    l->ctx.remat = !remat                            ? GP_REMAT_CELL
                   : strcmp(remat, "none") == 0      ? GP_REMAT_NONE
                   : strcmp(remat, "selective") == 0 ? GP_REMAT_SELECTIVE
                                                     : GP_REMAT_CELL;
    const char *lim = targ(l, "--memory-limit");
    if (lim && !gp_cli_parse_bytes(lim, &l->ctx.memory_limit))
        return gp_cli_usage_error("launch", "-- train: --memory-limit %s: not a byte count", lim);
    const char *opt = targ(l, "--optimizer");
    const bool adamw = opt ? strcmp(opt, "adamw") == 0 : lm;
    l->ctx.optim = adamw ? gp_adamw_defaults(3e-4f, 0.01f) : gp_sgd_defaults(0.05f, 0.9f);
    return GP_CLI_EXIT_OK;
}

/* Adds "restarts" to the final run's --report. */
static int add_to_report(const launch *l) {
    if (!l->report) return GP_CLI_EXIT_OK;
    size_t n = 0;
    char *text = NULL;
    FILE *f = fopen(l->report, "rb");
    if (f) {
        fseek(f, 0, SEEK_END);
        long size = ftell(f);
        fseek(f, 0, SEEK_SET);
        text = size > 0 ? malloc((size_t)size + 1) : NULL;
        if (text) n = fread(text, 1, (size_t)size, f);
        fclose(f);
    }
    cJSON *r = text ? (text[n] = '\0', cJSON_Parse(text)) : NULL;
    free(text);
    if (!r) {
        fprintf(stderr, "gpipe launch: --report %s: the final run's report does not read as JSON\n",
                l->report);
        return GP_CLI_EXIT_RUNTIME;
    }
    cJSON_AddItemToObject(r, "restarts", cJSON_Duplicate(l->restarts, true));
    bool ok = gp_cli_report_write("launch", r, l->report, "--report");
    cJSON_Delete(r);
    return ok ? GP_CLI_EXIT_OK : GP_CLI_EXIT_RUNTIME;
}

/* One --metrics line for a restart, appended while no job runs. */
static void add_to_metrics(const launch *l, const cJSON *e) {
    if (!l->metrics) return;
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "type", "restart");
    for (const cJSON *c = e->child; c; c = c->next)
        cJSON_AddItemToObject(o, c->string, cJSON_Duplicate(c, true));
    char *line = cJSON_PrintUnformatted(o);
    FILE *f = line ? fopen(l->metrics, "a") : NULL;
    bool ok = f && fprintf(f, "%s\n", line) >= 0;
    if (f && fclose(f) != 0) ok = false;
    if (!ok)
        fprintf(stderr, "gpipe launch: --metrics %s: cannot add the restart's line: %s\n",
                l->metrics, strerror(errno));
    cJSON_free(line);
    cJSON_Delete(o);
}

/* The newest complete checkpoint's step for the messages (0: none yet). */
static int newest_step(const launch *l, char *path, size_t size) {
    int step;
    if (gp_cli_ckpt_newest(l->ckpt_dir, path, size, &step) != GP_CLI_EXIT_OK)
        fprintf(stderr, "gpipe launch: the newest checkpoint %s does not open; the restart will "
                        "say why\n",
                path);
    return step > 0 ? step : 0;
}

static void print_help(gp_cli_opt *tab, int n) {
    printf("Usage: gpipe launch --np N [options] -- train TRAIN-OPTIONS\n\n"
           "Runs gpipe train on N MPI processes and keeps it going: when a rank dies or hangs\n"
           "(its peers time out after --comm-timeout), ends what is left of the job, takes the\n"
           "lost process slot away (with --hostfile, the failed host's slots), chooses a mesh for\n"
           "the processes left (fewer stages first, the same data-parallel and tensor-parallel\n"
           "sizes, so the bits stay those of an uninterrupted run; where D or T must change, the\n"
           "plan search's fastest plan on the same micro-batches, D x --micro-batches of them)\n"
           "and starts again from the newest complete checkpoint in\n"
           "--checkpoint-dir with --resume. TRAIN-OPTIONS must give --checkpoint-dir; --stages,\n"
           "--data-parallel and --tensor-parallel set the first mesh (D x K x T = N; without\n"
           "--stages, K = N / (D T)), and --partition is dropped on a restart. The folder is\n"
           "locked while the job runs. The final --report gets a \"restarts\" list and --metrics a\n"
           "{\"type\":\"restart\"} line per restart.\n\nOptions:\n");
    gp_cli_print_options(tab, n, stdout);
    printf("\nExit status: 0 the training finished, 1 it could not (the launcher does not start,\n"
           "restarts exhausted, fewer than --min-np processes left, a failure that lost no rank,\n"
           "the folder locked), 2 bad usage, 130 interrupted (SIGINT or SIGTERM: every rank\n"
           "ended, the newest complete checkpoint left to resume from).\n");
}

int gp_cli_launch_main(int argc, char **argv) {
    static launch l; /* large; one per process */
    memset(&l, 0, sizeof l);
    l.o = (launch_opts){.min_np = 1, .max_restarts = 3, .launcher = "mpirun --oversubscribe"};
    gp_cli_opt tab[] = {
        {"--np", GP_CLI_INT, &l.o.np, "N", "processes to start with (required)", NULL, 1, false,
         NULL, false, GP_MAX_DEVICES, false},
        {"--min-np", GP_CLI_INT, &l.o.min_np, "P", "stop rather than run on fewer processes",
         "1", 1, false, NULL, false, GP_MAX_DEVICES, false},
        {"--max-restarts", GP_CLI_INT, &l.o.max_restarts, "R",
         "stop when the job fails after R restarts", "3", 0, false, NULL, false, 0, false},
        {"--hostfile", GP_CLI_STRING, &l.o.hostfile, "FILE",
         "Open MPI hostfile (HOST slots=N lines): a failed host's slots are taken away, and "
         "the job restarts on the others (srun: --exclude)",
         "none: this host, one process fewer per failure", 0, false, NULL, false, 0, false},
        {"--launcher", GP_CLI_STRING, &l.o.launcher, "\"CMD ARGS\"",
         "the MPI launcher, words split at spaces, before -np N (mpirun) or -n N (srun)",
         "mpirun --oversubscribe", 0, false, NULL, false, 0, false},
    };
    const int n = (int)(sizeof tab / sizeof *tab);
    int dash = 2;
    while (dash < argc && strcmp(argv[dash], "--") != 0) dash++;
    int rc = gp_cli_parse(tab, n, dash, argv, 2, "launch");
    if (rc == GP_CLI_HELP) {
        print_help(tab, n);
        return GP_CLI_EXIT_OK;
    }
    if (rc != GP_CLI_PARSED) return rc;
    if (dash + 1 >= argc || strcmp(argv[dash + 1], "train") != 0)
        return gp_cli_usage_error("launch", "expected -- train TRAIN-OPTIONS after the options "
                                            "(gpipe launch --np N -- train --model ...)");
    if (!gp_cli_seen(tab, n, "--np")) return gp_cli_usage_error("launch", "--np: required");
    if (l.o.min_np > l.o.np)
        return gp_cli_usage_error("launch", "--min-np %d: more than --np %d", l.o.min_np, l.o.np);
    l.targc = argc - dash - 2;
    l.targv = argv + dash + 2;
    l.ckpt_dir = targ(&l, "--checkpoint-dir");
    l.report = targ(&l, "--report");
    l.metrics = targ(&l, "--metrics");
    if (!l.ckpt_dir)
        return gp_cli_usage_error("launch", "-- train: --checkpoint-dir is required: a restart "
                                            "continues from its newest checkpoint");
    /* The launcher's words */
    snprintf(l.words_buf, sizeof l.words_buf, "%s", l.o.launcher);
    for (char *w = strtok(l.words_buf, " \t"); w && l.nwords < MAX_WORDS - 1;
         w = strtok(NULL, " \t"))
        l.words[l.nwords++] = w;
    if (l.nwords == 0) return gp_cli_usage_error("launch", "--launcher: empty");
    char first[4096];
    snprintf(first, sizeof first, "%s", l.words[0]);
    l.srun = strcmp(basename(first), "srun") == 0;
    if (l.o.hostfile && (rc = read_hosts(&l)) != GP_CLI_EXIT_OK) return rc;
    ssize_t len = readlink("/proc/self/exe", l.exe, sizeof l.exe - 1);
    if (len <= 0) return gp_cli_fail("launch", "cannot find the gpipe program (/proc/self/exe)");
    l.exe[len] = '\0';
    /* The first mesh */
    gp_cli_layout cur = {targ_int(&l, "--data-parallel", 1), 0, targ_int(&l, "--tensor-parallel", 1),
                         targ_int(&l, "--micro-batches", 1)};
    if (cur.D < 1 || cur.T < 1 || cur.M < 1)
        return gp_cli_usage_error("launch", "-- train: --data-parallel, --tensor-parallel and "
                                            "--micro-batches must be positive");
    cur.K = targ(&l, "--stages") ? targ_int(&l, "--stages", 1) : l.o.np / (cur.D * cur.T);
    if (cur.K < 1 || (long long)cur.D * cur.K * cur.T != l.o.np)
        return gp_cli_usage_error("launch",
                                  "--np %d: not --data-parallel %d x --stages %d x "
                                  "--tensor-parallel %d of the train options",
                                  l.o.np, cur.D, cur.K, cur.T);
    rc = layout_ctx(&l);
    struct stat st;
    if (rc == GP_CLI_EXIT_OK && stat(l.ckpt_dir, &st) != 0 && mkdir(l.ckpt_dir, 0777) != 0) {
        fprintf(stderr, "gpipe launch: --checkpoint-dir %s: cannot create: %s\n", l.ckpt_dir,
                strerror(errno));
        rc = GP_CLI_EXIT_RUNTIME;
    }
    if (rc == GP_CLI_EXIT_OK) rc = take_lock(&l);
    if (rc != GP_CLI_EXIT_OK) {
        gp_model_free(l.ctx.model);
        return rc;
    }
    struct sigaction sa = {0};
    sa.sa_handler = on_signal;
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
    /* A reader of the output that goes away must not end the supervisor and orphan its job. */
    signal(SIGPIPE, SIG_IGN);
    l.restarts = cJSON_CreateArray();
    char *jargv[MAX_WORDS + 24 + l.targc]; /* words, -np N, hosts, gpipe train, ARGS, the mesh */
    char bufs[6][64], path[4096];
    cJSON *pending = NULL; /* the last restart, until its job has resumed */
    double ended_at = 0;
    for (int attempt = 0;; attempt++) {
        build_argv(&l, &cur, jargv, bufs);
        printf("launch: starting %d process(es): D = %d, K = %d, T = %d, %d micro-batch(es) per "
               "replica\n",
               cur.D * cur.K * cur.T, cur.D, cur.K, cur.T, cur.M);
        fflush(stdout);
        gp_cli_job job;
        if (g_stop) /* between two jobs: none is started */
            job = (gp_cli_job){.interrupted = true, .failed_rank = -1};
        else
            gp_cli_job_run(jargv, &g_stop, &job);
        if (pending && job.t_resumed) {
            const double s = job.t_resumed - ended_at;
            cJSON_AddNumberToObject(pending, "restart_s", s);
            printf("launch: restart %d: the job resumed %.2f s after the failed one ended\n",
                   attempt, s);
        }
        pending = NULL;
        if (job.start_failed) {
            fprintf(stderr, "gpipe launch: --launcher: cannot start '%s': %s\n", l.words[0],
                    job.start_error);
            rc = GP_CLI_EXIT_RUNTIME;
            break;
        }
        if (job.interrupted) {
            int step = newest_step(&l, path, sizeof path);
            if (path[0])
                fprintf(stderr, "gpipe launch: interrupted: every rank has ended; the newest "
                                "complete checkpoint is %s (step %d): the same command resumes "
                                "from it\n",
                        path, step);
            else
                fprintf(stderr, "gpipe launch: interrupted: every rank has ended, before any "
                                "checkpoint was written in %s\n",
                        l.ckpt_dir);
            rc = EXIT_INTERRUPTED;
            break;
        }
        if (!job.rank_lost && WIFEXITED(job.wait_status) && WEXITSTATUS(job.wait_status) == 0) {
            printf("launch: the training finished after %d restart(s)\n", attempt);
            rc = add_to_report(&l);
            break;
        }
        if (!job.rank_lost) {
            const int code = WIFEXITED(job.wait_status) ? WEXITSTATUS(job.wait_status) : -1;
            fprintf(stderr, "gpipe launch: the job failed without losing a rank (%s)%s: not "
                            "restarting\n",
                    job.reason,
                    !job.started ? "; the launcher started no training" : "");
            rc = code == GP_CLI_EXIT_USAGE ? GP_CLI_EXIT_USAGE : GP_CLI_EXIT_RUNTIME;
            break;
        }
        /* A rank was lost: which, where, and what is left. */
        host *h = NULL;
        if (l.nhosts && job.failed_host[0]) h = find_host(&l, job.failed_host);
        if (l.nhosts && !h && job.failed_rank >= 0) h = host_of_rank(&l, job.failed_rank);
        if (h) /* the host whose slots go (the launcher may call it otherwise) */
            snprintf(job.failed_host, sizeof job.failed_host, "%s", h->name);
        char who[512];
        if (job.failed_rank >= 0)
            snprintf(who, sizeof who, "rank %d%s%s%s", job.failed_rank,
                     job.failed_host[0] ? " (host " : "", job.failed_host,
                     job.failed_host[0] ? ")" : "");
        else
            snprintf(who, sizeof who, "a rank");
        if (attempt >= l.o.max_restarts) {
            int step = newest_step(&l, path, sizeof path);
            fprintf(stderr, "gpipe launch: stopping: %s %s, and the %d restart(s) allowed "
                            "(--max-restarts) are used up; the newest checkpoint is at step %d "
                            "in %s\n",
                    who, job.reason, l.o.max_restarts, step, l.ckpt_dir);
            rc = GP_CLI_EXIT_RUNTIME;
            break;
        }
        int avail = cur.D * cur.K * cur.T - 1;
        if (l.srun && !l.nhosts && job.failed_host[0]) {
            /* Slurm's nodes: the one named goes, with the tasks it ran (SLURM_NTASKS_PER_NODE,
             * "4" or "4(x2)" in a batch job), and is excluded from the next step. */
            const char *tpn = getenv("SLURM_NTASKS_PER_NODE");
            const int per = tpn && atoi(tpn) > 0 ? atoi(tpn) : 1;
            avail = cur.D * cur.K * cur.T - per;
            if (l.nexcluded < MAX_HOSTS)
                snprintf(l.excluded[l.nexcluded++], sizeof l.excluded[0], "%s", job.failed_host);
        }
        if (h) {
            h->gone = true;
            avail = 0;
            for (int i = 0; i < l.nhosts; i++) avail += l.hosts[i].gone ? 0 : l.hosts[i].slots;
            if (avail > l.o.np) avail = l.o.np;
            if (!l.srun && (rc = write_hosts(&l)) != GP_CLI_EXIT_OK) break;
        }
        gp_cli_layout next;
        char why[512];
        if (avail < l.o.min_np ||
            !gp_cli_launch_layout(&l.ctx, &cur, avail, l.o.min_np, &next, why, sizeof why)) {
            if (avail >= l.o.min_np) fprintf(stderr, "gpipe launch: %s\n", why);
            fprintf(stderr, "gpipe launch: stopping: %s %s, and %d process(es) are left, fewer "
                            "than a mesh of at least --min-np %d needs\n",
                    who, job.reason, avail, l.o.min_np);
            rc = GP_CLI_EXIT_RUNTIME;
            break;
        }
        const int step = newest_step(&l, path, sizeof path);
        /* Another D keeps the bits only under --grad-sum tree, with both D powers of two (the
         * replicas' sums are then the top levels of one tree over the micro-batches). */
        const char *gs = targ(&l, "--grad-sum");
        const bool tree = gs && strcmp(gs, "tree") == 0;
        const bool pow2 = !(next.D & (next.D - 1)) && !(cur.D & (cur.D - 1));
        const bool same_bits = next.T == cur.T && (next.D == cur.D || (tree && pow2));
        cJSON *e = cJSON_CreateObject();
        cJSON_AddNumberToObject(e, "restart", attempt + 1);
        cJSON_AddNumberToObject(e, "step", step);
        cJSON_AddStringToObject(e, "reason", job.reason);
        cJSON *ranks = cJSON_AddArrayToObject(e, "ranks");
        if (job.failed_rank >= 0) cJSON_AddItemToArray(ranks, cJSON_CreateNumber(job.failed_rank));
        if (job.failed_host[0]) cJSON_AddStringToObject(e, "host", job.failed_host);
        cJSON_AddNumberToObject(e, "processes", next.D * next.K * next.T);
        cJSON_AddNumberToObject(e, "data_parallel", next.D);
        cJSON_AddNumberToObject(e, "stages", next.K);
        cJSON_AddNumberToObject(e, "tensor_parallel", next.T);
        cJSON_AddNumberToObject(e, "micro_batches", next.M);
        cJSON_AddBoolToObject(e, "bit_identical", same_bits);
        cJSON_AddItemToArray(l.restarts, e);
        add_to_metrics(&l, e);
        printf("launch: restart %d of at most %d: %s %s; resuming from step %d on %d "
               "process(es): D = %d, K = %d, T = %d (%s)\n",
               attempt + 1, l.o.max_restarts, who, job.reason, step, next.D * next.K * next.T,
               next.D, next.K, next.T,
               same_bits ? "the same bits as an uninterrupted run"
                         : "D or T changed: the bits differ from an uninterrupted run's, within "
                           "float32 rounding");
        fflush(stdout);
        cur = next;
        pending = e;
        ended_at = job.t_end;
    }
    cJSON_Delete(l.restarts);
    gp_model_free(l.ctx.model);
    return rc;
}
