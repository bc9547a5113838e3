/* Training progress on stderr: on a terminal one bar redrawn in place (step,
 * loss, examples/s, ETA); otherwise a plain log line every N steps, so that
 * logs written to files stay readable. */
#include <math.h>
#include <string.h>
#include <unistd.h>

#include "cli.h"

const char *gp_cli_fmt_duration(double seconds, char *buf, size_t bufsize) {
    if (!isfinite(seconds) || seconds < 0) seconds = 0;
    long s = lround(seconds);
    if (seconds < 60)
        snprintf(buf, bufsize, "%.1fs", seconds);
    else if (s < 3600)
        snprintf(buf, bufsize, "%ldm%02lds", s / 60, s % 60);
    else
        snprintf(buf, bufsize, "%ldh%02ldm", s / 3600, (s / 60) % 60);
    return buf;
}

void gp_cli_progress_init(gp_cli_progress *p, int total, int64_t examples_per_step,
                          int64_t tokens_per_example, int log_every, bool quiet) {
    *p = (gp_cli_progress){0};
    p->total = total;
    p->examples_per_step = examples_per_step;
    p->tokens_per_example = tokens_per_example;
    p->quiet = quiet;
    p->bar = !quiet && isatty(STDERR_FILENO);
    p->log_every = log_every > 0 ? log_every : (total >= 20 ? total / 20 : 1);
    p->last_draw = -1.0;
}

/* "1234 ex/s" or, for language models, also tokens per second. */
static void fmt_rate(const gp_cli_progress *p, double examples_per_s, char *buf, size_t n) {
    if (p->tokens_per_example > 0)
        snprintf(buf, n, "%.1f seq/s %.0f tok/s", examples_per_s,
                 examples_per_s * (double)p->tokens_per_example);
    else
        snprintf(buf, n, "%.1f ex/s", examples_per_s);
}

void gp_cli_progress_step(gp_cli_progress *p, int done, double loss, double train_seconds) {
    if (p->quiet) return;
    p->loss_sum += loss;
    p->loss_n++;
    double rate =
        train_seconds > 0 ? (double)done * (double)p->examples_per_step / train_seconds : 0;
    double eta = done > 0 ? train_seconds / done * (p->total - done) : 0;
    char rbuf[96], ebuf[32];
    fmt_rate(p, rate, rbuf, sizeof rbuf);
    if (p->ckpt_wait_s > 0) { /* saves outpaced by the steps: the time the steps lost to them */
        size_t n = strlen(rbuf);
        snprintf(rbuf + n, sizeof rbuf - n, "  checkpoint wait %.1fs", p->ckpt_wait_s);
    }
    gp_cli_fmt_duration(eta, ebuf, sizeof ebuf);
    if (p->bar) {
        /* Redrawing costs little, but not more than ~10 times a second. */
        double now = gp_cli_now();
        if (done < p->total && p->last_draw >= 0 && now - p->last_draw < 0.1) return;
        p->last_draw = now;
        enum { WIDTH = 24 };
        char bar[WIDTH + 1];
        int fill = p->total > 0 ? (int)((int64_t)done * WIDTH / p->total) : WIDTH;
        for (int i = 0; i < WIDTH; i++) bar[i] = i < fill ? '=' : (i == fill ? '>' : ' ');
        bar[WIDTH] = '\0';
        fprintf(stderr, "\r[%s] %d/%d loss %.4f %s ETA %s\033[K", bar, done, p->total, loss, rbuf,
                ebuf);
        if (done == p->total) {
            fputc('\n', stderr); /* the finished bar stays as a record */
        } else {
            p->drawn = true;
        }
        fflush(stderr);
        return;
    }
    if (done % p->log_every != 0 && done != p->total) return;
    fprintf(stderr, "step %d/%d  loss %.4f (mean of last %d)  %s  ETA %s\n", done, p->total,
            p->loss_sum / p->loss_n, p->loss_n, rbuf, ebuf);
    p->loss_sum = 0;
    p->loss_n = 0;
}

void gp_cli_progress_clear(gp_cli_progress *p) {
    if (!p->drawn) return;
    fprintf(stderr, "\r\033[K");
    fflush(stderr);
    p->drawn = false;
    p->last_draw = -1.0; /* redraw at the next step */
}
