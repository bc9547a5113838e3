/* The background writer of a pipeline's checkpoints: one thread per process that writes the
 * parts of one save (safetensors files whose tensors were copied to host memory at the step
 * boundary) while the stages train on. One save at a time; the copy's host memory is kept for
 * the next one, which is as large. */
#define _GNU_SOURCE /* SCHED_IDLE */
#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/clock.h"
#include "core/error.h"
#include "core/thread_name.h"
#include "pipeline/checkpoint_writer.h"

struct gp_ckpt_writer {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    pthread_t thread;
    bool started, quit;
    bool submitted; /* a job was handed to the thread and is not finished */
    gp_ckpt_job job;
    gp_ckpt_part *parts;
    int n, cap;
    unsigned char *arena;
    size_t arena_size;
    double write_s;
};

/* Whether a job is with the thread (read under the lock: the thread clears it). */
static bool busy(gp_ckpt_writer *w) {
    pthread_mutex_lock(&w->mu);
    bool b = w->submitted;
    pthread_mutex_unlock(&w->mu);
    return b;
}

gp_status gp_ckpt_writer_new(gp_ckpt_writer **out) {
    gp_ckpt_writer *w = calloc(1, sizeof *w);
    if (!w) return gp_error(GP_OUT_OF_MEMORY, "checkpoint writer: out of host memory");
    pthread_mutex_init(&w->mu, NULL);
    pthread_cond_init(&w->cv, NULL);
    *out = w;
    return GP_OK;
}

static void clear_parts(gp_ckpt_writer *w) {
    for (int i = 0; i < w->n; i++) {
        gp_safetensors_writer_free(w->parts[i].w);
        free(w->parts[i].path);
    }
    w->n = 0;
    gp_ckpt_job *j = &w->job;
    for (int i = 0; i < j->nextra; i++) {
        free((char *)j->extra[i].key);
        free((char *)j->extra[i].value);
    }
    free(j->extra);
    free(j->index);
    free(j->written);
    *j = (gp_ckpt_job){0};
}

gp_ckpt_job *gp_ckpt_writer_job(gp_ckpt_writer *w) { return &w->job; }

static char *dup_or_null(const char *s, bool *ok) {
    char *d = s ? strdup(s) : NULL;
    if (s && !d) *ok = false;
    return d;
}

gp_status gp_ckpt_writer_begin(gp_ckpt_writer *w, int step, const char *written, const char *index,
                               const gp_checkpoint_kv *extra, int nextra, bool background) {
    GP_ASSERT(!w->job.active && w->n == 0);
    gp_ckpt_job *j = &w->job;
    bool ok = true;
    *j = (gp_ckpt_job){.active = true, .background = background, .step = step};
    j->written = dup_or_null(written, &ok);
    j->index = dup_or_null(index, &ok);
    j->extra = nextra > 0 ? calloc((size_t)nextra, sizeof *j->extra) : NULL;
    if (nextra > 0 && !j->extra) ok = false;
    for (int i = 0; i < nextra && j->extra; i++, j->nextra++) {
        j->extra[i].key = dup_or_null(extra[i].key, &ok);
        j->extra[i].value = dup_or_null(extra[i].value, &ok);
    }
    if (ok) return GP_OK;
    clear_parts(w);
    return gp_error(GP_OUT_OF_MEMORY, "checkpoint %s: out of host memory", written);
}

void gp_ckpt_writer_free(gp_ckpt_writer *w) {
    if (!w) return;
    pthread_mutex_lock(&w->mu);
    w->quit = true;
    pthread_cond_broadcast(&w->cv);
    pthread_mutex_unlock(&w->mu);
    /* The thread finishes the job it holds first: a part is never left half written by us. */
    if (w->started) pthread_join(w->thread, NULL);
    clear_parts(w);
    free(w->parts);
    free(w->arena);
    pthread_cond_destroy(&w->cv);
    pthread_mutex_destroy(&w->mu);
    free(w);
}

gp_status gp_ckpt_writer_arena(gp_ckpt_writer *w, size_t n, unsigned char **arena) {
    GP_ASSERT(!busy(w));
    if (n > w->arena_size) {
        unsigned char *a = malloc(n);
        if (!a)
            return gp_error(GP_OUT_OF_MEMORY, "checkpoint: %zu bytes of host memory for the copy "
                                              "of the parameters and optimizer state",
                            n);
        free(w->arena);
        w->arena = a;
        w->arena_size = n;
    }
    *arena = w->arena;
    return GP_OK;
}

/* Part p's outcome after its file was written with status s: with info, its size and CRC-32
 * read back from the file. */
static void note_written(gp_ckpt_part *p, gp_status s) {
    if (s == GP_OK && p->info) s = gp_checkpoint_file_info(p->path, &p->bytes, &p->crc32);
    p->status = s;
    p->wrote = s == GP_OK;
    if (s != GP_OK) snprintf(p->msg, sizeof p->msg, "%s", gp_last_error());
}

/* Writes one part; what it leaves in the part is all the thread touches. A part without a
 * writer was written on the training thread already (one holding no tensor to copy, such as a
 * stage whose only parameter is a tied weight's copy, stored by its owner). */
static void write_part(gp_ckpt_part *p) {
    if (p->w) note_written(p, gp_safetensors_writer_write(p->w, p->path));
}

static void *thread_main(void *arg) {
    gp_ckpt_writer *w = arg;
    gp_thread_name("gp-ckpt-writer");
    /* Idle priority: the writer takes the cores only when the stages leave them (their
     * bubbles, waits for messages), so a save slows the steps as little as it can. Best
     * effort: where refused, it runs at the normal priority. */
    struct sched_param sp = {0};
    (void)pthread_setschedparam(pthread_self(), SCHED_IDLE, &sp);
    pthread_mutex_lock(&w->mu);
    for (;;) {
        while (!w->submitted && !w->quit) pthread_cond_wait(&w->cv, &w->mu);
        if (!w->submitted) break; /* quit, nothing left to write */
        int n = w->n;
        gp_ckpt_part *parts = w->parts;
        pthread_mutex_unlock(&w->mu);
        /* The parts belong to this thread until submitted is cleared. */
        double t0 = gp_now();
        for (int i = 0; i < n; i++) write_part(&parts[i]);
        double dt = gp_now() - t0;
        pthread_mutex_lock(&w->mu);
        w->write_s = dt;
        w->submitted = false;
        pthread_cond_broadcast(&w->cv);
    }
    pthread_mutex_unlock(&w->mu);
    return NULL;
}

gp_status gp_ckpt_writer_add(gp_ckpt_writer *w, const char *path, gp_safetensors_writer *sw,
                             int first, int last, bool info) {
    GP_ASSERT(!busy(w));
    if (w->n == w->cap) {
        int cap = w->cap ? 2 * w->cap : 4;
        gp_ckpt_part *np = realloc(w->parts, (size_t)cap * sizeof *np);
        if (!np) {
            gp_safetensors_writer_free(sw);
            return gp_error(GP_OUT_OF_MEMORY, "checkpoint %s: out of host memory", path);
        }
        w->parts = np;
        w->cap = cap;
    }
    gp_ckpt_part *p = &w->parts[w->n];
    *p = (gp_ckpt_part){.w = sw, .first = first, .last = last, .info = info, .status = GP_OK};
    p->path = strdup(path);
    if (!p->path) {
        gp_safetensors_writer_free(sw);
        return gp_error(GP_OUT_OF_MEMORY, "checkpoint %s: out of host memory", path);
    }
    w->n++;
    return GP_OK;
}

gp_status gp_ckpt_writer_submit(gp_ckpt_writer *w) {
    pthread_mutex_lock(&w->mu);
    GP_ASSERT(!w->submitted);
    gp_status s = GP_OK;
    if (!w->started) {
        int e = pthread_create(&w->thread, NULL, thread_main, w);
        if (e != 0)
            s = gp_error(GP_INTERNAL, "checkpoint: cannot start the writer thread (%s)",
                         strerror(e));
        w->started = e == 0;
    }
    if (s == GP_OK) {
        w->submitted = true;
        pthread_cond_broadcast(&w->cv);
    }
    pthread_mutex_unlock(&w->mu);
    return s;
}

bool gp_ckpt_writer_wait(gp_ckpt_writer *w, bool block) {
    pthread_mutex_lock(&w->mu);
    while (block && w->submitted) pthread_cond_wait(&w->cv, &w->mu);
    bool done = !w->submitted;
    pthread_mutex_unlock(&w->mu);
    return done;
}

int gp_ckpt_writer_nparts(const gp_ckpt_writer *w) { return w->n; }

gp_ckpt_part *gp_ckpt_writer_part(gp_ckpt_writer *w, int i) { return &w->parts[i]; }

double gp_ckpt_writer_seconds(const gp_ckpt_writer *w) { return w->write_s; }

void gp_ckpt_writer_clear(gp_ckpt_writer *w) {
    GP_ASSERT(!busy(w));
    clear_parts(w);
}

gp_status gp_ckpt_writer_add_written(gp_ckpt_writer *w, const char *path, int first, int last,
                                     bool info, gp_status s) {
    GP_TRY(gp_ckpt_writer_add(w, path, NULL, first, last, info));
    note_written(&w->parts[w->n - 1], s);
    w->write_s = 0;
    return GP_OK;
}
