/* A pipeline's checkpoint across processes: each cell's part written by the rank of its stage
 * (replica 0's; the other replicas hold the same values; a stage of V cells writes V parts), every rank told every part's outcome, and the
 * set committed by rank 0's index only when all parts are durable. Every rank ends with the
 * same status, so no rank trains on while another has failed. Loading is the mirror image:
 * each rank reads only the parts that hold its stage's layers. With tensor-parallel shards the
 * files keep whole tensors under their names: a stage's shards put its layers together (shard 0
 * writes them) and on loading each cuts its part out, so a set saved with any T resumes with
 * any other T and K. The whole layers of a stage are held in host memory for the while. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/clock.h"
#include "core/error.h"
#include "io/checkpoint_internal.h"
#include "pipeline/checkpoint_writer.h"
#include "pipeline/mesh.h"
#include "pipeline/pipeline_hooks.h"

/* One rank's outcome for one part, all-gathered (fixed size, plain bytes). */
typedef struct outcome {
    int32_t status;  /* gp_status */
    int32_t wrote;   /* a part file exists under this rank's name */
    int32_t pending; /* still being written */
    int32_t first, last;
    uint64_t bytes;
    uint32_t crc32;
    char msg[476];
} outcome;

static void stage_range(const gp_pipeline *p, int k, int *first, int *last) {
    *first = gp_pipeline_cell_first(p, k);
    *last = k + 1 < gp_pipeline_cells(p) ? gp_pipeline_cell_first(p, k + 1)
                                          : gp_model_nlayers(gp_pipeline_model(p));
}

static void note(outcome *o, gp_status s) {
    o->status = (int32_t)s;
    snprintf(o->msg, sizeof o->msg, "%s", gp_last_error());
}

/* Every rank's n outcomes (all: W x n, rank-major); the first failure (in rank order) becomes
 * every rank's error. */
static gp_status agree(gp_pipeline *p, const outcome *mine, int n, outcome *all,
                       const char *what) {
    int W;
    gp_pipeline_place(p, NULL, &W, NULL, NULL);
    GP_TRY(gp_pipeline_allgather(p, mine, (size_t)n * sizeof *mine, all));
    int K = gp_pipeline_stages(p);
    for (int i = 0; i < W * n; i++)
        if (all[i].status != GP_OK) {
            const int r = i / n;
            gp_status s = all[i].status > 0 && all[i].status < GP_STATUS_COUNT
                              ? (gp_status)all[i].status
                              : GP_INTERNAL;
            if (W == 1) return gp_error(s, "%.*s", (int)sizeof all[i].msg, all[i].msg);
            const int T = p->T;
            if (T > 1)
                return gp_error(s, "%s: rank %d (stage %d shard %d of replica %d) failed: %.*s",
                                what, r, r / T % K, r % T, r / (K * T), (int)sizeof all[i].msg,
                                all[i].msg);
            return gp_error(s, "%s: rank %d (stage %d of replica %d) failed: %.*s", what, r,
                            r % K, r / K, (int)sizeof all[i].msg, all[i].msg);
        }
    return GP_OK;
}

/* Part c + 1 of C of the set `base` ("<base>-<c+1>-of-<C>.safetensors"). */
static void part_name(char *buf, size_t n, const char *base, int c, int C) {
    snprintf(buf, n, "%s-%05d-of-%05d.safetensors", base, c + 1, C);
}

/* The part of layers [first, last) at path into the job: background, a copy of its tensors
 * in the writer's host memory (at *at, advanced), to be written later; else written now. */
static gp_status add_part(gp_pipeline *p, gp_ckpt_writer *cw, const char *path, int first,
                          int last, int step, const gp_checkpoint_kv *extra, int nextra,
                          bool info, unsigned char **at) {
    gp_model *m = gp_pipeline_model(p);
    const gp_optim_opts *o = gp_pipeline_optim(p);
    if (!*at) {
        gp_status w = gp_checkpoint_save(path, m, first, last, o, step, extra, nextra);
        GP_TRY(gp_ckpt_writer_add_written(cw, path, first, last, info, w));
        return gp_ckpt_writer_part(cw, gp_ckpt_writer_nparts(cw) - 1)->status;
    }
    gp_safetensors_writer *sw;
    GP_TRY(gp_safetensors_writer_new(&sw));
    const size_t need = gp_ckpt_data_bytes(m, first, last, o);
    gp_status s = gp_ckpt_snapshot(sw, path, m, first, last, o, step, extra, nextra, *at, need);
    if (s != GP_OK) {
        gp_safetensors_writer_free(sw);
        return s;
    }
    *at += need;
    return gp_ckpt_writer_add(cw, path, sw, first, last, info);
}

/* The host memory the copies of this process's parts take (background saves). */
static size_t snapshot_bytes(gp_pipeline *p, bool set) {
    gp_model *m = gp_pipeline_model(p);
    const gp_optim_opts *o = gp_pipeline_optim(p);
    int k;
    gp_pipeline_place(p, NULL, NULL, &k, NULL);
    if (!set) return gp_ckpt_data_bytes(m, 0, gp_model_nlayers(m), o);
    size_t n = 0;
    const gp_stage *lead = gp_worker(p, k, p->my_shard < 0 ? 0 : p->my_shard);
    for (int v = 0; v < p->V; v++) {
        int first, last;
        stage_range(p, gp_chunk_of(p, lead, v)->k, &first, &last);
        n += gp_ckpt_data_bytes(m, first, last, o);
    }
    return n;
}

/* The parts this process writes: threads, the one file of every layer; MPI, the part of each
 * of its stage's cells (replica 0's shard 0 only: the others hold the same values, and with
 * shards the stage's shards put its layers together for it). Background: copied now into the
 * writer's host memory, else written at once. Every rank learns every rank's outcome. */
static gp_status take_parts(gp_pipeline *p, gp_ckpt_writer *cw, const char *base, int step,
                            const gp_checkpoint_kv *extra, int nextra, bool background) {
    gp_model *m = gp_pipeline_model(p);
    int W, k, d, K = gp_pipeline_stages(p);
    gp_pipeline_place(p, NULL, &W, &k, &d);
    const bool set = k >= 0;
    const int C = gp_pipeline_cells(p), V = set ? C / K : 1, T = p->T;
    unsigned char *at = NULL;
    gp_status s = GP_OK;
    if (background && (!set || (d == 0 && p->my_shard <= 0)))
        s = gp_ckpt_writer_arena(cw, snapshot_bytes(p, set), &at);
    const size_t n = strlen(base) + 64;
    char *path = malloc(n);
    outcome *mine = calloc((size_t)V, sizeof *mine), *all = calloc((size_t)V * W, sizeof *all);
    if (s == GP_OK && (!path || !mine || !all))
        s = gp_error(GP_OUT_OF_MEMORY, "checkpoint %s: %d parts", base, C);
    const gp_stage *lead = set ? gp_worker(p, k, p->my_shard < 0 ? 0 : p->my_shard) : NULL;
    for (int v = 0; v < V && mine && path; v++) {
        int first = 0, last = gp_model_nlayers(m);
        if (set) stage_range(p, gp_chunk_of(p, lead, v)->k, &first, &last);
        if (set) part_name(path, n, base, gp_chunk_of(p, lead, v)->k, C);
        else snprintf(path, n, "%s.safetensors", base);
        if (!set || d == 0) {
            /* The shards put the layers together whatever failed before (it is collective). */
            gp_status r = T > 1 ? gp_mesh_whole_begin(p, first, last, true, true) : GP_OK;
            if (r == GP_OK && p->my_shard <= 0)
                r = s != GP_OK ? s : add_part(p, cw, path, first, last, step, extra, nextra, set, &at);
            if (T > 1) gp_mesh_whole_end(p, first, last);
            if (r != GP_OK && s == GP_OK) note(&mine[v], r);
            if (s == GP_OK) s = r;
        }
    }
    /* Collective even after a failure here, so that no rank waits for another. */
    char what[256];
    snprintf(what, sizeof what, "checkpoint %s: a part was not %s, so the set is not committed",
             base, background ? "copied" : "written");
    if (mine && all) s = agree(p, mine, V, all, what);
    free(path);
    free(mine);
    free(all);
    return s;
}

gp_status gp_pipeline_checkpoint_begin(gp_pipeline *p, const char *base, int step,
                                       const gp_checkpoint_kv *extra, int nextra) {
    return gp_pipeline_checkpoint_start(p, base, step, extra, nextra, true);
}

gp_status gp_pipeline_checkpoint_start(gp_pipeline *p, const char *base, int step,
                                       const gp_checkpoint_kv *extra, int nextra,
                                       bool background) {
    if (!p || !base || (nextra > 0 && !extra))
        return gp_error(GP_INVALID_ARGUMENT, "gp_pipeline_checkpoint_begin: NULL argument");
    if (p->ckpt && gp_ckpt_writer_job(p->ckpt)->active)
        return gp_error(GP_INVALID_ARGUMENT, "checkpoint %s: the save of step %d is still in "
                                             "flight (finish it first: one save at a time)",
                        base, gp_ckpt_writer_job(p->ckpt)->step);
    if (!p->ckpt) GP_TRY(gp_ckpt_writer_new(&p->ckpt));
    int k;
    gp_pipeline_place(p, NULL, NULL, &k, NULL);
    size_t n = strlen(base) + 64;
    char *written = malloc(n), *index = malloc(n);
    gp_status s = written && index ? GP_OK : gp_error(GP_OUT_OF_MEMORY, "checkpoint %s", base);
    if (s == GP_OK) {
        snprintf(written, n, "%s.safetensors%s", base, k >= 0 ? ".index.json" : "");
        snprintf(index, n, "%s.safetensors.index.json", base);
        s = gp_ckpt_writer_begin(p->ckpt, step, written, k >= 0 ? index : NULL, extra, nextra,
                                 background);
    }
    free(written);
    free(index);
    GP_TRY(s);
    s = take_parts(p, p->ckpt, base, step, extra, nextra, background);
    if (s == GP_OK && background) s = gp_ckpt_writer_submit(p->ckpt);
    if (s != GP_OK) { /* nothing in flight: the parts written here are removed */
        for (int i = 0; i < gp_ckpt_writer_nparts(p->ckpt); i++)
            if (gp_ckpt_writer_part(p->ckpt, i)->wrote) remove(gp_ckpt_writer_part(p->ckpt, i)->path);
        gp_ckpt_writer_clear(p->ckpt);
    }
    return s;
}

/* Every part is durable: rank 0 commits the set, and every rank learns whether it did. all:
 * every rank's V outcomes. */
static gp_status commit(gp_pipeline *p, const gp_ckpt_job *job, const outcome *all, int V) {
    gp_model *m = gp_pipeline_model(p);
    const char *index = job->index;
    int rank, W;
    gp_pipeline_place(p, &rank, &W, NULL, NULL);
    const int C = gp_pipeline_cells(p), T = p->T;
    outcome mine = {.status = GP_OK}, *every = calloc((size_t)W, sizeof *every);
    if (!every) return gp_error(GP_OUT_OF_MEMORY, "checkpoint %s: %d ranks", index, W);
    if (rank == 0) {
        /* The parts are named after the index: "<name>-<c>-of-<C>.safetensors". */
        const char *slash = strrchr(index, '/');
        const char *name = slash ? slash + 1 : index;
        const size_t nb = strlen(name) - strlen(".safetensors.index.json");
        const size_t n = nb + 64;
        gp_checkpoint_part *parts = calloc((size_t)C, sizeof *parts);
        char *files = malloc((size_t)C * n), *stem = malloc(nb + 1);
        gp_status c = parts && files && stem ? GP_OK
                                             : gp_error(GP_OUT_OF_MEMORY, "checkpoint %s", index);
        if (stem) snprintf(stem, nb + 1, "%s", name);
        for (int r = 0; r < C && c == GP_OK; r++) { /* replica 0's shard 0 of cell r's stage */
            const gp_stage *cell = gp_worker(p, r, 0);
            const outcome *o_r = &all[(size_t)cell->dk * T * V + (size_t)cell->chunk];
            part_name(files + (size_t)r * n, n, stem, r, C);
            parts[r] = (gp_checkpoint_part){files + (size_t)r * n, o_r->first, o_r->last,
                                            o_r->bytes, o_r->crc32};
        }
        if (c == GP_OK)
            c = gp_checkpoint_commit(index, m, parts, C, gp_pipeline_optim(p), job->step,
                                     job->extra, job->nextra);
        if (c != GP_OK) note(&mine, c);
        free(parts);
        free(files);
        free(stem);
    }
    char what[256];
    snprintf(what, sizeof what, "checkpoint %s: the index (the commit) was not written", index);
    gp_status s = agree(p, &mine, 1, every, what);
    free(every);
    return s;
}

gp_status gp_pipeline_checkpoint_finish(gp_pipeline *p, bool wait, gp_checkpoint_saved *out) {
    if (!p || !out) return gp_error(GP_INVALID_ARGUMENT, "gp_pipeline_checkpoint_finish: NULL argument");
    *out = (gp_checkpoint_saved){.step = -1};
    gp_ckpt_writer *cw = p->ckpt;
    /* Whether a save is in flight is the same on every rank: they began it together. */
    if (!cw || !gp_ckpt_writer_job(cw)->active) return GP_OK;
    const gp_ckpt_job *job = gp_ckpt_writer_job(cw);
    int W, k;
    gp_pipeline_place(p, NULL, &W, &k, NULL);
    const int V = job->index ? p->V : 1;
    bool done = true;
    const double t0 = gp_now();
    if (job->background) done = gp_ckpt_writer_wait(cw, wait);
    outcome *mine = calloc((size_t)V, sizeof *mine), *all = calloc((size_t)V * W, sizeof *all);
    if (!mine || !all) {
        free(mine);
        free(all);
        return gp_error(GP_OUT_OF_MEMORY, "checkpoint %s: %d ranks", job->written, W);
    }
    const int np = done ? gp_ckpt_writer_nparts(cw) : 0;
    for (int v = 0; v < V; v++) {
        mine[v] = (outcome){.status = GP_OK, .pending = !done};
        if (v >= np) continue; /* a rank that writes no part, or still writing */
        const gp_ckpt_part *pt = gp_ckpt_writer_part(cw, v);
        mine[v] = (outcome){.status = (int32_t)pt->status, .wrote = pt->wrote, .first = pt->first,
                            .last = pt->last, .bytes = pt->bytes, .crc32 = pt->crc32};
        snprintf(mine[v].msg, sizeof mine[v].msg, "%s", pt->msg);
        out->bytes += pt->bytes;
    }
    /* The outcomes first (a rank still writing holds the others back: no rank decides alone),
     * then the commit. */
    gp_status s = gp_pipeline_allgather(p, mine, (size_t)V * sizeof *mine, all);
    /* Under MPI a rank's wait ends when the slowest rank's writes do. */
    if (wait && job->background) out->waited_s = gp_now() - t0;
    bool pending = false;
    for (int i = 0; i < V * W && s == GP_OK; i++) pending |= all[i].pending != 0;
    if (s == GP_OK && pending) {
        out->pending = true;
        free(mine);
        free(all);
        return GP_OK;
    }
    out->step = job->step;
    out->write_s = gp_ckpt_writer_seconds(cw);
    char what[256];
    snprintf(what, sizeof what, "checkpoint %s: a part was not written, so the set is not "
                                "committed",
             job->written);
    if (s == GP_OK) s = agree(p, mine, V, all, what);
    const bool parts_durable = s == GP_OK;
    if (s == GP_OK && job->index) s = commit(p, job, all, V);
    if (s == GP_OK) snprintf(out->path, sizeof out->path, "%s", job->written);
    /* Not committed: no orphan part stays. Once every part is durable the parts stay, whatever
     * the commit's agreement says: rank 0 may have written the index before a peer failed (a rank
     * stopped in it), and a committed set must keep its parts; a set left without its index is
     * removed by the next --resume. */
    for (int i = 0; s != GP_OK && !parts_durable && job->index && i < np; i++)
        if (gp_ckpt_writer_part(cw, i)->wrote) remove(gp_ckpt_writer_part(cw, i)->path);
    gp_ckpt_writer_clear(cw);
    free(mine);
    free(all);
    return s;
}

gp_status gp_pipeline_checkpoint_save(gp_pipeline *p, const char *base, int step,
                                      const gp_checkpoint_kv *extra, int nextra, char *written,
                                      size_t written_size) {
    GP_TRY(gp_pipeline_checkpoint_start(p, base, step, extra, nextra, false));
    gp_checkpoint_saved done;
    GP_TRY(gp_pipeline_checkpoint_finish(p, true, &done));
    if (written) snprintf(written, written_size, "%s", done.path);
    return GP_OK;
}

gp_status gp_pipeline_checkpoint_load(gp_pipeline *p, gp_checkpoint *c) {
    if (!p || !c) return gp_error(GP_INVALID_ARGUMENT, "gp_pipeline_checkpoint_load: NULL argument");
    gp_model *m = gp_pipeline_model(p);
    int W, k;
    gp_pipeline_place(p, NULL, &W, &k, NULL);
    outcome mine = {.status = GP_OK, .first = 0, .last = gp_model_nlayers(m)};
    gp_status s = GP_OK;
    /* threads: every layer; MPI: the layers of each of this rank's cells */
    const int V = k >= 0 ? p->V : 1;
    for (int v = 0; v < V && s == GP_OK; v++) {
        int first = 0, last = gp_model_nlayers(m);
        if (k >= 0)
            stage_range(p, gp_chunk_of(p, gp_worker(p, k, p->my_shard < 0 ? 0 : p->my_shard), v)->k,
                        &first, &last);
        mine.first = first, mine.last = last;
        /* With shards: the whole layers are loaded, then each shard here cuts its part out. */
        s = p->T > 1 ? gp_mesh_whole_begin(p, first, last, true, false) : GP_OK;
        if (s == GP_OK) s = gp_checkpoint_load_layers(c, m, first, last, gp_pipeline_optim(p));
        if (s == GP_OK && p->T > 1) s = gp_mesh_whole_scatter(p, first, last, true);
        if (p->T > 1) gp_mesh_whole_end(p, first, last);
    }
    if (s != GP_OK) note(&mine, s);
    outcome *all = calloc((size_t)W, sizeof *all);
    if (!all) return gp_error(GP_OUT_OF_MEMORY, "gp_pipeline_checkpoint_load: %d ranks", W);
    s = agree(p, &mine, 1, all, "loading a checkpoint");
    free(all);
    return s;
}
