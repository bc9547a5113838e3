/* The background writer of a pipeline's checkpoints (checkpoint_writer.c): the parts of one
 * save, each a safetensors writer over host copies, written by a thread of its own (or on the
 * caller's thread), each part's outcome kept for the commit. Private to the library. */
#ifndef GP_PIPELINE_CHECKPOINT_WRITER_H
#define GP_PIPELINE_CHECKPOINT_WRITER_H

#include <stdbool.h>
#include <stdint.h>

#include "gpipe.h"

typedef struct gp_ckpt_part {
    char *path;
    gp_safetensors_writer *w; /* owned; NULL once the caller wrote the part */
    int first, last;          /* the layers it holds */
    bool info;                /* also its size and CRC-32, for a set's index */
    /* the outcome, once written */
    gp_status status;
    bool wrote;
    uint64_t bytes;
    uint32_t crc32;
    char msg[476];
} gp_ckpt_part;

/* What the save in flight must still do once written: tell its step, and under MPI commit. */
typedef struct gp_ckpt_job {
    bool active;     /* begun and not yet finished */
    bool background; /* written by the thread (else on the caller's, at once) */
    int step;
    char *index;     /* a set's index to commit (NULL: one file, committed by its rename) */
    char *written;   /* what the caller is told was written: the file or the index */
    gp_checkpoint_kv *extra; /* copies, for the index's metadata */
    int nextra;
} gp_ckpt_job;

typedef struct gp_ckpt_writer gp_ckpt_writer;
gp_status gp_ckpt_writer_new(gp_ckpt_writer **out);
/* Waits for the job in flight to be written, then frees everything. */
void gp_ckpt_writer_free(gp_ckpt_writer *w);
/* Host memory of at least n bytes for the next job's copies (kept and reused). */
gp_status gp_ckpt_writer_arena(gp_ckpt_writer *w, size_t n, unsigned char **arena);
/* Adds a part to the next job; the writer takes sw (freed also on failure). */
gp_status gp_ckpt_writer_add(gp_ckpt_writer *w, const char *path, gp_safetensors_writer *sw,
                             int first, int last, bool info);
/* Hands the job to the thread (started at the first job). */
gp_status gp_ckpt_writer_submit(gp_ckpt_writer *w);
/* Adds a part the caller has written itself, with status s (a save on the caller's thread). */
gp_status gp_ckpt_writer_add_written(gp_ckpt_writer *w, const char *path, int first, int last,
                                     bool info, gp_status s);
/* Whether the job handed over is written; block: waits until it is. */
bool gp_ckpt_writer_wait(gp_ckpt_writer *w, bool block);
/* The job's parts (read only once it is written), and the seconds its writing took. */
int gp_ckpt_writer_nparts(const gp_ckpt_writer *w);
gp_ckpt_part *gp_ckpt_writer_part(gp_ckpt_writer *w, int i);
double gp_ckpt_writer_seconds(const gp_ckpt_writer *w);
/* The job's own state, kept with its parts. */
gp_ckpt_job *gp_ckpt_writer_job(gp_ckpt_writer *w);
/* Copies step, written, index (NULL: none) and extra into the job. */
gp_status gp_ckpt_writer_begin(gp_ckpt_writer *w, int step, const char *written, const char *index,
                               const gp_checkpoint_kv *extra, int nextra, bool background);
/* Drops the job (its parts written, or never handed over), for the next one. */
void gp_ckpt_writer_clear(gp_ckpt_writer *w);

#endif
