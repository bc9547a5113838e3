/* Strict option parsing for the gpipe CLI: numbers must be whole, finite and
 * in range, unknown or repeated options are refused, and every complaint
 * names the option and what it expected. */
#define _GNU_SOURCE /* sched_getaffinity: the cores this process may use */
#include "cli_args.h"

#include <ctype.h>
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <sched.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "gpipe.h"

int gp_cli_usage_error(const char *cmd, const char *fmt, ...) {
    va_list ap;
    fprintf(stderr, "gpipe %s: ", cmd);
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fprintf(stderr, "\nTry 'gpipe %s --help' for the list of options.\n", cmd);
    return GP_CLI_EXIT_USAGE;
}

const char *gp_cli_option_of(const char *key) {
    static const char *const map[][2] = {
        {"task", "--model"},     {"data", "--data"},
        {"steps", "--steps/--epochs"}, {"batch", "--batch"},
        {"micro_batches", "--micro-batches"}, {"optimizer", "--optimizer"},
        {"lr", "--lr"},          {"min_lr", "--min-lr"},
        {"momentum", "--momentum"}, {"weight_decay", "--weight-decay"},
        {"warmup", "--warmup"},  {"lr_schedule", "--lr-schedule"},
        {"clip", "--clip"},      {"seed", "--seed"},
        {"augment", "--augment"}, {"label_smoothing", "--label-smoothing"},
        {"lr_cycles", "--lr-cycles"}, {"erase", "--erase"}, {"grad_sum", "--grad-sum"},
        {"precision", "--precision"},
        {"data_format", "--data-format"}, {"vocab", "--vocab"}, {"val_data", "--val-data"},
        /* the pipeline's fields (gp_pipeline_opts) that train_options does not name */
        {"stages", "--stages"}, {"schedule", "--schedule"}, {"chunks", "--chunks"},
        {"remat", "--remat"}, {"partition", "--partition"}, {"balance", "--balance"},
        {"tensor_parallel", "--tensor-parallel"}, {"data_parallel", "--data-parallel"},
        {"stage_threads", "--threads"}, {"device_type", "--device"},
        {"launcher", "--launcher"}, {"comm_timeout_s", "--comm-timeout"},
        {"memory_limit", "--memory-limit"}, {"link_gbytes_per_s", "--bandwidth"}};
    for (size_t i = 0; i < sizeof map / sizeof map[0]; i++)
        if (strcmp(map[i][0], key) == 0) return map[i][1];
    return key;
}

int gp_cli_fail(const char *cmd, const char *what) {
    fprintf(stderr, "gpipe %s: %s: %s\n", cmd, what, gp_last_error());
    return GP_CLI_EXIT_RUNTIME;
}

gp_cli_opt *gp_cli_find(gp_cli_opt *opts, int nopts, const char *name) {
    for (int i = 0; i < nopts; i++)
        if (strcmp(opts[i].name, name) == 0) return &opts[i];
    return NULL;
}

bool gp_cli_seen(gp_cli_opt *opts, int nopts, const char *name) {
    gp_cli_opt *o = gp_cli_find(opts, nopts, name);
    return o && o->seen;
}

void gp_cli_set_seen(gp_cli_opt *opts, int nopts, const char *name) {
    gp_cli_opt *o = gp_cli_find(opts, nopts, name);
    if (o) o->seen = true;
}

int gp_cli_max_threads(void) {
    cpu_set_t set;
    CPU_ZERO(&set);
    if (sched_getaffinity(0, sizeof set, &set) == 0 && CPU_COUNT(&set) > 0) return CPU_COUNT(&set);
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    return n > 0 && n < INT_MAX ? (int)n : 1;
}

int gp_cli_device_threads(int requested, int devices, bool mpi) {
    if (requested > 0) return requested;
    if (mpi) return 1;
    const int cores = gp_cli_max_threads(), k = devices > 1 ? devices : 1;
    return cores / k > 1 ? cores / k : 1;
}

/* The whole string must be a base-10 integer; leading spaces and signs that
 * strtoll would forgive are refused by the callers' checks. */
static bool parse_i64(const char *s, long long *out) {
    if (!*s || isspace((unsigned char)*s)) return false;
    char *end;
    errno = 0;
    long long v = strtoll(s, &end, 10);
    if (errno || *end) return false;
    *out = v;
    return true;
}

static bool parse_u64(const char *s, uint64_t *out) {
    if (!isdigit((unsigned char)*s)) return false; /* strtoull accepts "-1" */
    char *end;
    errno = 0;
    unsigned long long v = strtoull(s, &end, 10);
    if (errno || *end) return false;
    *out = (uint64_t)v;
    return true;
}

static bool parse_f64(const char *s, double *out) {
    if (!*s || isspace((unsigned char)*s)) return false;
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (errno || *end || !isfinite(v)) return false;
    *out = v;
    return true;
}

/* True when s is exactly the one-letter suffix, in either case. */
static bool is_letter_suffix(const char *s, const char *suffix) {
    return s[0] && !s[1] && toupper((unsigned char)s[0]) == suffix[0];
}

bool gp_cli_parse_bytes(const char *s, uint64_t *out) {
    if (!isdigit((unsigned char)*s) && *s != '.') return false;
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (errno || !isfinite(v) || v < 0) return false;
    static const struct {
        const char *suffix;
        double scale;
    } units[] = {{"", 1.0},
                 {"B", 1.0},
                 {"K", 1024.0},
                 {"KiB", 1024.0},
                 {"M", 1048576.0},
                 {"MiB", 1048576.0},
                 {"G", 1073741824.0},
                 {"GiB", 1073741824.0},
                 {"T", 1099511627776.0},
                 {"TiB", 1099511627776.0}};
    for (size_t i = 0; i < sizeof units / sizeof units[0]; i++) {
        /* The single letters are accepted in either case ("512m"). */
        bool match = strlen(units[i].suffix) == 1 ? is_letter_suffix(end, units[i].suffix)
                                                  : strcmp(end, units[i].suffix) == 0;
        if (!match) continue;
        double bytes = floor(v * units[i].scale);
        if (bytes < 1.0 || bytes >= 18446744073709551616.0) return false;
        *out = (uint64_t)bytes;
        return true;
    }
    return false;
}

const char *gp_cli_fmt_bytes(uint64_t nbytes, char *buf, size_t bufsize) {
    static const char *const units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
    double v = (double)nbytes;
    int u = 0;
    while (v >= 1024.0 && u < 4) v /= 1024.0, u++;
    if (u == 0)
        snprintf(buf, bufsize, "%llu B", (unsigned long long)nbytes);
    else
        snprintf(buf, bufsize, "%.1f %s", v, units[u]);
    return buf;
}

/* Stores the value of one option, or explains what was wrong with it. */
static int set_value(gp_cli_opt *o, const char *val, const char *cmd) {
    long long i;
    uint64_t u;
    double d;
    switch (o->kind) {
    case GP_CLI_FLAG:
        *(bool *)o->dst = true;
        return GP_CLI_PARSED;
    case GP_CLI_INT:
        if (!parse_i64(val, &i) || i > INT_MAX || (double)i < o->min ||
            (o->max > 0 && (double)i > o->max)) {
            if (o->max > 0)
                return gp_cli_usage_error(cmd,
                                          "%s: expected an integer from %.0f to %.0f, got '%s'",
                                          o->name, o->min, o->max, val);
            if (o->min >= 1)
                return gp_cli_usage_error(cmd, "%s: expected an integer >= %.0f, got '%s'", o->name,
                                          o->min, val);
            return gp_cli_usage_error(cmd, "%s: expected a non-negative integer, got '%s'", o->name,
                                      val);
        }
        *(int *)o->dst = (int)i;
        return GP_CLI_PARSED;
    case GP_CLI_THREADS: {
        const int max = gp_cli_max_threads();
        if (!parse_i64(val, &i) || i < 1 || i > max)
            return gp_cli_usage_error(cmd,
                                      "%s: expected an integer from 1 to %d (the cores this "
                                      "process may use), got '%s'",
                                      o->name, max, val);
        *(int *)o->dst = (int)i;
        return GP_CLI_PARSED;
    }
    case GP_CLI_U64:
        if (!parse_u64(val, &u))
            return gp_cli_usage_error(
                cmd, "%s: expected a non-negative integer below 2^64, got '%s'", o->name, val);
        *(uint64_t *)o->dst = u;
        return GP_CLI_PARSED;
    case GP_CLI_FLOAT:
        if (!parse_f64(val, &d) || d < o->min || (o->min_exclusive && d == o->min) ||
            (o->max > 0 && (d > o->max || (o->max_exclusive && d == o->max)))) {
            if (o->max > 0)
                return gp_cli_usage_error(cmd, "%s: expected a number %s %g and %s %g, got '%s'",
                                          o->name, o->min_exclusive ? ">" : ">=", o->min,
                                          o->max_exclusive ? "<" : "<=", o->max, val);
            return gp_cli_usage_error(cmd, "%s: expected a finite number %s %g, got '%s'", o->name,
                                      o->min_exclusive ? ">" : ">=", o->min, val);
        }
        *(double *)o->dst = d;
        return GP_CLI_PARSED;
    case GP_CLI_BYTES:
        if (!gp_cli_parse_bytes(val, &u))
            return gp_cli_usage_error(cmd,
                                      "%s: expected a positive byte count such as 1048576, 512M "
                                      "or 2GiB (suffixes K M G T, KiB MiB GiB TiB), got '%s'",
                                      o->name, val);
        *(uint64_t *)o->dst = u;
        return GP_CLI_PARSED;
    case GP_CLI_STRING:
        if (!*val) return gp_cli_usage_error(cmd, "%s: expected a non-empty value", o->name);
        *(const char **)o->dst = val;
        return GP_CLI_PARSED;
    case GP_CLI_CHOICE: {
        size_t n = strlen(val);
        for (const char *c = o->choices; n && *c;) {
            const char *bar = strchr(c, '|');
            size_t len = bar ? (size_t)(bar - c) : strlen(c);
            if (len == n && strncmp(c, val, n) == 0) {
                *(const char **)o->dst = val;
                return GP_CLI_PARSED;
            }
            c += len + (bar != NULL);
        }
        return gp_cli_usage_error(cmd, "%s: expected one of %s, got '%s'", o->name, o->choices,
                                  val);
    }
    }
    return gp_cli_usage_error(cmd, "%s: internal error: unknown option kind", o->name);
}

int gp_cli_parse(gp_cli_opt *opts, int nopts, int argc, char **argv, int first, const char *cmd) {
    for (int a = first; a < argc; a++) {
        const char *arg = argv[a];
        if (strcmp(arg, "-h") == 0 || strcmp(arg, "--help") == 0) return GP_CLI_HELP;
        if (strncmp(arg, "--", 2) != 0 || arg[2] == '\0')
            return gp_cli_usage_error(cmd, "unexpected argument '%s' (options start with --)", arg);
        /* "--name=value" or "--name value" */
        char name[64];
        const char *eq = strchr(arg, '=');
        size_t len = eq ? (size_t)(eq - arg) : strlen(arg);
        if (len >= sizeof name) return gp_cli_usage_error(cmd, "unknown option '%.60s...'", arg);
        memcpy(name, arg, len);
        name[len] = '\0';
        gp_cli_opt *o = gp_cli_find(opts, nopts, name);
        if (!o) return gp_cli_usage_error(cmd, "unknown option '%s'", name);
        if (o->seen) return gp_cli_usage_error(cmd, "%s: given more than once", name);
        o->seen = true;
        const char *val = NULL;
        if (o->kind == GP_CLI_FLAG) {
            if (eq) return gp_cli_usage_error(cmd, "%s: takes no value, got '%s'", name, eq + 1);
        } else if (eq) {
            val = eq + 1;
        } else if (a + 1 < argc) {
            val = argv[++a];
        } else {
            return gp_cli_usage_error(cmd, "%s: missing value (expected %s)", name, o->metavar);
        }
        int rc = set_value(o, val, cmd);
        if (rc != GP_CLI_PARSED) return rc;
    }
    return GP_CLI_PARSED;
}

void gp_cli_print_options(const gp_cli_opt *opts, int nopts, FILE *f) {
    for (int i = 0; i < nopts; i++) {
        char lhs[64];
        const gp_cli_opt *o = &opts[i];
        if (o->kind == GP_CLI_FLAG)
            snprintf(lhs, sizeof lhs, "%s", o->name);
        else
            snprintf(lhs, sizeof lhs, "%s %s", o->name, o->metavar);
        /* Two columns within 80 characters: long names and defaults wrap. */
        int col = 27;
        if (strlen(lhs) > 24)
            fprintf(f, "  %s\n%27s", lhs, "");
        else
            fprintf(f, "  %-24s ", lhs);
        col += fprintf(f, "%s", o->help);
        if (o->defval) {
            if (col + (int)strlen(o->defval) + 12 > 80)
                fprintf(f, "\n%27s(default: %s)", "", o->defval);
            else
                fprintf(f, " (default: %s)", o->defval);
        }
        fputc('\n', f);
    }
    fprintf(f, "  %-24s %s\n", "-h, --help", "show this help and exit");
}
