/* Option tables for the gpipe CLI: one table per subcommand drives both the
 * parser (strict: every bad value is a usage error naming the option) and
 * the --help text, so the help cannot forget an option. */
#ifndef GP_CLI_ARGS_H
#define GP_CLI_ARGS_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

/* Exit statuses of the tool. */
enum { GP_CLI_EXIT_OK = 0, GP_CLI_EXIT_RUNTIME = 1, GP_CLI_EXIT_USAGE = 2 };

typedef enum gp_cli_kind {
    GP_CLI_FLAG,   /* no value; dst: bool */
    GP_CLI_INT,    /* dst: int, at least `min`, at most `max` (INT_MAX without one) */
    GP_CLI_THREADS, /* dst: int, 1 to gp_cli_max_threads() */
    GP_CLI_U64,    /* dst: uint64_t, any non-negative integer */
    GP_CLI_FLOAT,  /* dst: double, finite, >= min (> min when min_exclusive), <= max (< max
                    * when max_exclusive) when there is one */
    GP_CLI_BYTES,  /* dst: uint64_t > 0, with K/M/G/T or KiB/MiB/GiB/TiB suffix */
    GP_CLI_STRING, /* dst: const char *, non-empty */
    GP_CLI_CHOICE  /* dst: const char *, one of `choices` ("sgd|adamw") */
} gp_cli_kind;

typedef struct gp_cli_opt {
    const char *name; /* "--epochs" */
    gp_cli_kind kind;
    void *dst;
    const char *metavar; /* "N" */
    const char *help;    /* one line */
    const char *defval;  /* the default as shown by --help */
    double min;
    bool min_exclusive;
    const char *choices;
    bool seen; /* set by gp_cli_parse */
    /* The largest value (INT and FLOAT; 0: none), where the library, or what the value turns
     * into (an int product, a float), has one: out of range is a usage error naming the option
     * here, not a failure deep inside. */
    double max;
    bool max_exclusive;
} gp_cli_opt;

/* Results of gp_cli_parse besides the exit statuses. */
enum { GP_CLI_PARSED = 0, GP_CLI_HELP = -1 };

/* Parses argv[first..argc) against opts ("--name value" or "--name=value").
 * Returns GP_CLI_PARSED, GP_CLI_HELP (-h/--help seen), or GP_CLI_EXIT_USAGE
 * after printing "gpipe <cmd>: <option>: <what was expected>, got ..." on
 * stderr. */
int gp_cli_parse(gp_cli_opt *opts, int nopts, int argc, char **argv, int first, const char *cmd);

/* Prints the options of a table, one per line with its default. */
void gp_cli_print_options(const gp_cli_opt *opts, int nopts, FILE *f);

/* Finds an option of the table by name (NULL if absent). */
gp_cli_opt *gp_cli_find(gp_cli_opt *opts, int nopts, const char *name);
bool gp_cli_seen(gp_cli_opt *opts, int nopts, const char *name);
/* Marks an option as given, for a value chosen on the user's behalf (train --plan auto). */
void gp_cli_set_seen(gp_cli_opt *opts, int nopts, const char *name);

/* Prints "gpipe <cmd>: <message>" and a hint to use --help; returns
 * GP_CLI_EXIT_USAGE, for checks that involve several options. */
int gp_cli_usage_error(const char *cmd, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 2, 3)))
#endif
    ;
/* Prints "gpipe <cmd>: <what>: <gp_last_error()>" and returns the runtime
 * exit status, for a library call that failed. */
int gp_cli_fail(const char *cmd, const char *what);
/* The option that sets a setting the library (a gp_pipeline_opts field) or a checkpoint's
 * train_options names by key ("micro_batches": "--micro-batches"); the key where none does. */
const char *gp_cli_option_of(const char *key);

/* The most threads an option may ask for: the cores this process may run on (its CPU
 * affinity, as nproc counts them). More would only contend for them. */
int gp_cli_max_threads(void);
/* Threads of each CPU device: `requested` (--threads) when > 0, else the cores this process may
 * use for one device, their share for `devices` devices (K stages x T shards; at least 1 each),
 * and 1 for an MPI rank (ranks are bound one per core as a rule). */
int gp_cli_device_threads(int requested, int devices, bool mpi);

/* Parses a byte count such as "512M", "1.5GiB" or "1000000"; the suffixes
 * are binary (K = KiB = 1024). Returns false on anything else. */
bool gp_cli_parse_bytes(const char *s, uint64_t *out);

/* "1.5 GiB"-style rendering into buf; returns buf. */
const char *gp_cli_fmt_bytes(uint64_t nbytes, char *buf, size_t bufsize);

#endif
