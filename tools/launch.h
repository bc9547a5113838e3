/* `gpipe launch`, the supervisor of an MPI training job: what its three files share. cmd_launch.c
 * holds the options, the lock on the checkpoint folder and the restart loop; launch_job.c starts
 * one job under the MPI launcher, passes its output through and tells which rank failed and how;
 * launch_layout.c chooses the mesh for the processes left. */
#ifndef GP_CLI_LAUNCH_H
#define GP_CLI_LAUNCH_H

#include <signal.h>

#include "cli.h"

/* A mesh of D x K x T processes, each replica on M micro-batches. */
typedef struct gp_cli_layout {
    int D, K, T, M;
} gp_cli_layout;

/* What the training job's options fix, for the layout choice: the model, its mini-batch and
 * micro-batches, schedule, remat and memory limit. */
typedef struct gp_cli_layout_ctx {
    gp_model *model;
    int64_t batch;
    int chunks, threads;
    gp_schedule_kind schedule;
    gp_remat remat;
    uint64_t memory_limit;
    gp_optim_opts optim;
} gp_cli_layout_ctx;

/* The mesh for at most `avail` processes (and at least min_np) after `cur` lost some, on the
 * same micro-batches (D M of them, of the same size): D, T and M kept and fewer stages where
 * some K' < K fits (the same bits), else the plan search's fastest plan of as many processes as
 * fit, each replica on D M / D' micro-batches. False, with the reason in why, when none fits. */
bool gp_cli_launch_layout(const gp_cli_layout_ctx *c, const gp_cli_layout *cur, int avail,
                          int min_np, gp_cli_layout *out, char *why, size_t why_size);

/* How one job ended. */
typedef struct gp_cli_job {
    bool start_failed;  /* the launcher could not be executed (start_error: why) */
    char start_error[256];
    int wait_status;    /* the launcher's, from waitpid */
    bool started;       /* rank 0 printed its first line */
    bool interrupted;   /* SIGINT or SIGTERM reached the supervisor */
    bool timed_out;     /* a rank's transport timed out (--comm-timeout) */
    bool rank_lost;     /* a rank was killed, stopped or vanished */
    int failed_rank;    /* -1: not known */
    char failed_host[256]; /* "" unknown */
    char reason[256];      /* how it failed, for the messages and the report */
    double t_end;          /* gp_cli_now() when the launcher had exited */
    double t_resumed;      /* when rank 0 said it resumed (or started fresh); 0: never */
} gp_cli_job;

/* Runs argv (the launcher's command line) in a process group of its own, passing its stdout and
 * stderr through, until it exits; *stop set (by a signal handler) ends it: SIGTERM to the
 * launcher and every process it started, SIGKILL after a grace period. Whatever the outcome, no
 * process of the job is left. */
void gp_cli_job_run(char **argv, volatile sig_atomic_t *stop, gp_cli_job *out);

#endif
