/* One job of `gpipe launch`: the MPI launcher started in a process group of its own, its output
 * passed through line by line and read for what failed, and its processes on this host watched
 * in /proc (a rank stopped or gone first names itself there, while a collective that times out
 * names nobody); then every process it started is ended, also those the launcher left behind. */
#define _GNU_SOURCE
#include <ctype.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include "launch.h"

#define MAX_PROCS 1024 /* the job's processes on this host watched at once */
#define SCAN_S 0.1     /* /proc is read this often */
#define GRACE_S 5.0    /* SIGTERM, then SIGKILL after this */
/* After a rank is known lost, the launcher gets this long to end the job itself. */
#define LOST_WAIT_S 30.0

typedef struct proc {
    int pid, rank; /* rank -1: a process that is no rank (the launcher's daemons) */
    bool seen;     /* in the latest scan */
} proc;

typedef struct watch {
    int launcher;
    proc p[MAX_PROCS];
    int n;
    int stopped_rank, gone_rank; /* -1: none */
    int noticed_rank, noticed_signal, named_rank;
    char noticed_host[256], srun_why[128];
    double lost_at;
    char line[2][4096]; /* stdout, stderr: the line being read */
    size_t len[2];
} watch;

/* The world rank from a process's environment (Open MPI, PMIx, MPICH, Slurm), or -1. */
static int env_rank(int pid) {
    char path[64], buf[1 << 16];
    snprintf(path, sizeof path, "/proc/%d/environ", pid);
    int fd = open(path, O_RDONLY);
    if (fd < 0) return -1;
    ssize_t n = read(fd, buf, sizeof buf - 1);
    close(fd);
    if (n <= 0) return -1;
    buf[n] = '\0';
    static const char *const keys[] = {"OMPI_COMM_WORLD_RANK=", "PMIX_RANK=", "PMI_RANK=",
                                       "SLURM_PROCID="};
    for (size_t k = 0; k < sizeof keys / sizeof *keys; k++)
        for (char *s = buf; s < buf + n; s += strlen(s) + 1)
            if (strncmp(s, keys[k], strlen(keys[k])) == 0) return atoi(s + strlen(keys[k]));
    return -1;
}

/* pid's parent and state from /proc/pid/stat; false when it is gone. */
static bool read_stat(int pid, int *ppid, char *state) {
    char path[64], buf[512];
    snprintf(path, sizeof path, "/proc/%d/stat", pid);
    FILE *f = fopen(path, "r");
    if (!f) return false;
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = '\0';
    const char *rp = strrchr(buf, ')'); /* the name may hold spaces and parentheses */
    return rp && sscanf(rp + 1, " %c %d", state, ppid) == 2;
}

/* Reads /proc: the launcher's descendants (orphans come back to this process, a subreaper, so
 * they stay descendants), their ranks, a rank stopped, a rank gone while the others run. */
static void scan(watch *w, bool launcher_alive) {
    static int pid[32768], ppid[32768];
    static char state[32768];
    int n = 0, self = getpid();
    DIR *d = opendir("/proc");
    struct dirent *de;
    while (d && (de = readdir(d)) && n < 32768) {
        if (!isdigit((unsigned char)de->d_name[0])) continue;
        int p = atoi(de->d_name);
        if (read_stat(p, &ppid[n], &state[n])) pid[n++] = p;
    }
    if (d) closedir(d);
    for (int i = 0; i < w->n; i++) w->p[i].seen = false;
    /* Descendants: a few passes over the parent links (the tree is shallow). */
    bool in[32768] = {0};
    for (int pass = 0; pass < 4; pass++)
        for (int i = 0; i < n; i++) {
            if (in[i] || pid[i] == self) continue;
            bool child = ppid[i] == w->launcher || (ppid[i] == self && pid[i] != w->launcher);
            for (int j = 0; j < n && !child; j++) child = in[j] && pid[j] == ppid[i];
            in[i] = child;
        }
    for (int i = 0; i < n; i++) {
        if (!in[i]) continue;
        int k = 0;
        while (k < w->n && w->p[k].pid != pid[i]) k++;
        if (k == w->n) {
            if (w->n == MAX_PROCS) continue;
            w->p[w->n++] = (proc){pid[i], env_rank(pid[i]), false};
        }
        bool dead = state[i] == 'Z' || state[i] == 'X';
        w->p[k].seen = !dead;
        if ((state[i] == 'T' || state[i] == 't') && w->p[k].rank >= 0 && w->stopped_rank < 0)
            w->stopped_rank = w->p[k].rank;
    }
    /* A rank gone while the launcher and another rank still run went first. */
    int alive = 0, gone = -1;
    for (int i = 0; i < w->n; i++)
        if (w->p[i].rank >= 0) {
            if (w->p[i].seen)
                alive++;
            else if (gone < 0)
                gone = w->p[i].rank;
        }
    if (launcher_alive && alive > 0 && gone >= 0 && w->gone_rank < 0) w->gone_rank = gone;
}

/* Sends sig to the launcher's group and every descendant seen. */
static void signal_all(watch *w, int sig) {
    kill(-w->launcher, sig);
    for (int i = 0; i < w->n; i++)
        if (w->p[i].seen) kill(w->p[i].pid, sig);
}

/* What a line of the job's stderr says failed: Open MPI's "process rank N with PID P on node H
 * exited on signal S", srun's "srun: error: H: task N: WHY", and the transport's "timed out
 * after S s ... from/to rank N" (the rank after the timeout is the one waited on; a collective's
 * "waiting in the ..., with rank N, ..." lists the ranks it waited with, not the one missing). */
static void read_err_line(watch *w, const char *s, gp_cli_job *out) {
    const char *p;
    int r, sig;
    char host[256];
    if ((p = strstr(s, "process rank ")) &&
        sscanf(p, "process rank %d with PID %*d on node %255s exited on signal %d", &r, host,
               &sig) == 3 &&
        w->noticed_rank < 0) {
        w->noticed_rank = r;
        w->noticed_signal = sig;
        snprintf(w->noticed_host, sizeof w->noticed_host, "%s", host);
    }
    char why[128];
    if ((p = strstr(s, "srun: error: ")) &&
        sscanf(p, "srun: error: %255[^:]: task %d: %127[^\n]", host, &r, why) == 3 &&
        w->noticed_rank < 0) {
        w->noticed_rank = r;
        snprintf(w->noticed_host, sizeof w->noticed_host, "%s", host);
        snprintf(w->srun_why, sizeof w->srun_why, "%s", why);
    }
    /* Open MPI's "ORTE has lost communication with a remote daemon", then "Remote daemon: ...
     * on node HOST": the host is gone, with whatever ranks ran there. */
    if ((p = strstr(s, "Remote daemon")) && (p = strstr(p, " on node ")) &&
        sscanf(p, " on node %255s", host) == 1 && !w->noticed_host[0])
        snprintf(w->noticed_host, sizeof w->noticed_host, "%s", host);
    if ((p = strstr(s, "timed out after "))) {
        out->timed_out = true;
        const char *q = NULL;
        for (const char *t = strstr(p, "rank "); t; t = strstr(t + 1, "rank ")) q = t;
        const bool collective = strstr(p, " waiting in the ") != NULL;
        if (!collective && q && sscanf(q, "rank %d", &r) == 1 && w->named_rank < 0)
            w->named_rank = r;
    }
}

static void read_out_line(const char *s, gp_cli_job *out) {
    if (strncmp(s, "gpipe train:", 12) == 0) out->started = true;
    if (strncmp(s, "resume: ", 8) == 0 && !out->t_resumed) out->t_resumed = gp_cli_now();
}

/* Passes what fd has through to `to` and reads it line by line; false at its end. */
static bool pump(watch *w, int which, int fd, FILE *to, gp_cli_job *out) {
    char buf[4096];
    ssize_t n = read(fd, buf, sizeof buf);
    if (n < 0 && (errno == EINTR || errno == EAGAIN)) return true;
    if (n <= 0) return false;
    fwrite(buf, 1, (size_t)n, to);
    fflush(to);
    for (ssize_t i = 0; i < n; i++) {
        char *line = w->line[which];
        if (buf[i] != '\n' && w->len[which] < sizeof w->line[which] - 1) {
            line[w->len[which]++] = buf[i];
            continue;
        }
        if (buf[i] != '\n') continue; /* too long: the rest of it is dropped */
        line[w->len[which]] = '\0';
        w->len[which] = 0;
        if (which == 0)
            read_out_line(line, out);
        else
            read_err_line(w, line, out);
    }
    return true;
}

static void explain(const watch *w, gp_cli_job *out) {
    out->failed_rank = -1;
    out->rank_lost = true;
    if (w->noticed_rank >= 0) {
        out->failed_rank = w->noticed_rank;
        snprintf(out->failed_host, sizeof out->failed_host, "%s", w->noticed_host);
        if (w->srun_why[0])
            snprintf(out->reason, sizeof out->reason, "%s", w->srun_why);
        else
            snprintf(out->reason, sizeof out->reason, "killed by signal %d (%s)",
                     w->noticed_signal, strsignal(w->noticed_signal));
    } else if (w->stopped_rank >= 0) {
        out->failed_rank = w->stopped_rank;
        snprintf(out->reason, sizeof out->reason,
                 "hung: stopped (SIGSTOP), the other ranks timed out waiting (--comm-timeout)");
    } else if (w->gone_rank >= 0 && WIFEXITED(out->wait_status) &&
               WEXITSTATUS(out->wait_status) > 128 && !out->timed_out) {
        /* A launcher whose message was not read: its status is 128 + the rank's signal. */
        out->failed_rank = w->gone_rank;
        snprintf(out->reason, sizeof out->reason, "ended by signal %d (the launcher's status %d)",
                 WEXITSTATUS(out->wait_status) - 128, WEXITSTATUS(out->wait_status));
    } else if (w->noticed_host[0]) {
        snprintf(out->reason, sizeof out->reason, "lost with its host");
        snprintf(out->failed_host, sizeof out->failed_host, "%s", w->noticed_host);
    } else if (w->named_rank >= 0) {
        out->failed_rank = w->named_rank;
        snprintf(out->reason, sizeof out->reason,
                 "hung: the transport timed out waiting on it (--comm-timeout)");
    } else if (out->timed_out) {
        snprintf(out->reason, sizeof out->reason,
                 "hung: a rank's transport timed out in a collective, which cannot tell the missing rank "
                 "(--comm-timeout)");
    } else {
        out->rank_lost = false;
        if (WIFSIGNALED(out->wait_status))
            snprintf(out->reason, sizeof out->reason, "the launcher was killed by signal %d",
                     WTERMSIG(out->wait_status));
        else
            snprintf(out->reason, sizeof out->reason, "the job exited with status %d",
                     WEXITSTATUS(out->wait_status));
    }
}

void gp_cli_job_run(char **argv, volatile sig_atomic_t *stop, gp_cli_job *out) {
    memset(out, 0, sizeof *out);
    out->failed_rank = -1;
    static watch w;
    memset(&w, 0, sizeof w);
    w.stopped_rank = w.gone_rank = w.noticed_rank = w.named_rank = -1;
    /* Processes the launcher leaves behind come back to this one, so they are found and ended. */
    (void)prctl(PR_SET_CHILD_SUBREAPER, 1);
    int po[2], pe[2], px[2];
    if (pipe(po) != 0 || pipe(pe) != 0 || pipe2(px, O_CLOEXEC) != 0) {
        out->start_failed = true;
        snprintf(out->start_error, sizeof out->start_error, "cannot make a pipe: %s",
                 strerror(errno));
        return;
    }
    fflush(stdout);
    fflush(stderr);
    pid_t pid = fork();
    if (pid == 0) {
        setpgid(0, 0);
        signal(SIGINT, SIG_DFL);
        signal(SIGTERM, SIG_DFL);
        signal(SIGPIPE, SIG_DFL);
        dup2(po[1], 1);
        dup2(pe[1], 2);
        close(po[0]), close(po[1]), close(pe[0]), close(pe[1]), close(px[0]);
        execvp(argv[0], argv);
        int e = errno;
        if (write(px[1], &e, sizeof e) < 0) _exit(127);
        _exit(127);
    }
    close(po[1]), close(pe[1]), close(px[1]);
    if (pid < 0) {
        out->start_failed = true;
        snprintf(out->start_error, sizeof out->start_error, "cannot fork: %s", strerror(errno));
        close(po[0]), close(pe[0]), close(px[0]);
        return;
    }
    setpgid(pid, pid);
    w.launcher = pid;
    int e = 0;
    if (read(px[0], &e, sizeof e) == (ssize_t)sizeof e) {
        out->start_failed = true;
        snprintf(out->start_error, sizeof out->start_error, "%s", strerror(e));
    }
    close(px[0]);
    bool open_o = true, open_e = true, exited = false, termed = false;
    double last_scan = 0, term_at = 0;
    while (open_o || open_e || !exited) {
        struct pollfd fds[2] = {{open_o ? po[0] : -1, POLLIN, 0}, {open_e ? pe[0] : -1, POLLIN, 0}};
        (void)poll(fds, 2, (int)(SCAN_S * 1000));
        if (open_o && (fds[0].revents & (POLLIN | POLLHUP))) open_o = pump(&w, 0, po[0], stdout, out);
        if (open_e && (fds[1].revents & (POLLIN | POLLHUP))) open_e = pump(&w, 1, pe[0], stderr, out);
        /* The launcher, and the orphans handed to this process, reaped alike. */
        int st, r;
        while ((r = waitpid(-1, &st, WNOHANG)) > 0)
            if (r == pid) {
                exited = true;
                out->wait_status = st;
                out->t_end = gp_cli_now();
            }
        const double now = gp_cli_now();
        if (now - last_scan >= SCAN_S) {
            scan(&w, !exited);
            last_scan = now;
        }
        const bool lost = w.noticed_rank >= 0 || w.noticed_host[0];
        if (lost && !w.lost_at) w.lost_at = now;
        const bool end = *stop || exited || (w.lost_at && now - w.lost_at > LOST_WAIT_S);
        if (end && !termed) {
            /* The launcher may leave ranks or daemons behind: the same end for all. */
            signal_all(&w, SIGTERM);
            termed = true;
            term_at = now;
        }
        if (termed && now - term_at > GRACE_S) {
            signal_all(&w, SIGKILL);
            term_at = now; /* again after another grace period, should any be left */
        }
        if (exited && termed && !open_o && !open_e) {
            scan(&w, false);
            bool left = false;
            for (int i = 0; i < w.n; i++) left |= w.p[i].seen;
            if (!left) break;
        }
    }
    close(po[0]);
    close(pe[0]);
    out->interrupted = *stop != 0;
    if (!out->t_end) out->t_end = gp_cli_now();
    const bool ok = WIFEXITED(out->wait_status) && WEXITSTATUS(out->wait_status) == 0;
    if (!ok && !out->start_failed) explain(&w, out);
}
