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

#include "core/error.h"
#include "pipeline/pipeline_internal.h"

/* One rank's outcome, all-gathered (fixed size, plain bytes). */
typedef struct outcome {
    int32_t status; /* gp_status */
    int32_t wrote;  /* a part file exists under this rank's name */
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

/* Every rank's outcome; the first failure (in rank order) becomes every rank's error. */
static gp_status agree(gp_pipeline *p, const outcome *mine, outcome *all, const char *what) {
    int W;
    gp_pipeline_place(p, NULL, &W, NULL, NULL);
    GP_TRY(gp_pipeline_allgather(p, mine, sizeof *mine, all));
    int K = gp_pipeline_stages(p);
    for (int r = 0; r < W; r++)
        if (all[r].status != GP_OK) {
            gp_status s = all[r].status > 0 && all[r].status < GP_STATUS_COUNT
                              ? (gp_status)all[r].status
                              : GP_INTERNAL;
            if (W == 1) return gp_error(s, "%.*s", (int)sizeof all[r].msg, all[r].msg);
            const int T = p->T;
            if (T > 1)
                return gp_error(s, "%s: rank %d (stage %d shard %d of replica %d) failed: %.*s",
                                what, r, r / T % K, r % T, r / (K * T), (int)sizeof all[r].msg,
                                all[r].msg);
            return gp_error(s, "%s: rank %d (stage %d of replica %d) failed: %.*s", what, r,
                            r % K, r / K, (int)sizeof all[r].msg, all[r].msg);
        }
    return GP_OK;
}

gp_status gp_pipeline_checkpoint_save(gp_pipeline *p, const char *base, int step,
                                      const gp_checkpoint_kv *extra, int nextra, char *written,
                                      size_t written_size) {
    if (!p || !base || (nextra > 0 && !extra))
        return gp_error(GP_INVALID_ARGUMENT, "gp_pipeline_checkpoint_save: NULL argument");
    gp_model *m = gp_pipeline_model(p);
    const gp_optim_opts *o = gp_pipeline_optim(p);
    int rank, W, k, d, K = gp_pipeline_stages(p);
    gp_pipeline_place(p, &rank, &W, &k, &d);
    size_t n = strlen(base) + 64;
    char *path = malloc(n), *index = malloc(n);
    outcome *all = calloc((size_t)W, sizeof *all), mine = {.status = GP_OK};
    if (!path || !index || !all) {
        free(path);
        free(index);
        free(all);
        return gp_error(GP_OUT_OF_MEMORY, "checkpoint %s: %d ranks", base, W);
    }
    gp_status s;
    const int T = p->T, L = gp_model_nlayers(m);
    if (k < 0) { /* threads: this process holds every stage, so one file */
        snprintf(path, n, "%s.safetensors", base);
        s = T > 1 ? gp_mesh_whole_begin(p, 0, L, true, true) : GP_OK;
        if (s == GP_OK) s = gp_checkpoint_save(path, m, 0, L, o, step, extra, nextra);
        if (T > 1) gp_mesh_whole_end(p, 0, L);
        if (s == GP_OK && written) snprintf(written, written_size, "%s", path);
        goto done;
    }
    snprintf(index, n, "%s.safetensors.index.json", base);
    /* One round per chunk: this rank's cell of that chunk writes its part, every rank learns
     * every part's outcome. */
    const int C = gp_pipeline_cells(p), V = C / K;
    outcome *every = calloc((size_t)V * (size_t)W, sizeof *every);
    char *mine_paths = calloc((size_t)V, n);
    int *wrote = calloc((size_t)V, sizeof *wrote);
    s = every && mine_paths && wrote ? GP_OK
                                     : gp_error(GP_OUT_OF_MEMORY, "checkpoint %s: %d parts", base, C);
    const gp_stage *lead = gp_worker(p, k, p->my_shard < 0 ? 0 : p->my_shard);
    for (int v = 0; v < V && s == GP_OK; v++) {
        const int c = gp_chunk_of(p, lead, v)->k;
        char *part_path = mine_paths + (size_t)v * n;
        mine = (outcome){.status = GP_OK};
        if (d == 0) {
            stage_range(p, c, &mine.first, &mine.last);
            snprintf(part_path, n, "%s-%05d-of-%05d.safetensors", base, c + 1, C);
            /* The stage's shards put its layers together; shard 0 writes them. */
            s = T > 1 ? gp_mesh_whole_begin(p, mine.first, mine.last, true, true) : GP_OK;
            if (s == GP_OK && p->my_shard <= 0) {
                s = gp_checkpoint_save(part_path, m, mine.first, mine.last, o, step, extra, nextra);
                mine.wrote = s == GP_OK;
                wrote[v] = s == GP_OK;
                if (s == GP_OK) s = gp_checkpoint_file_info(part_path, &mine.bytes, &mine.crc32);
            }
            if (T > 1) gp_mesh_whole_end(p, mine.first, mine.last);
            if (s != GP_OK) note(&mine, s);
        }
        char what[256];
        snprintf(what, sizeof what, "checkpoint %s: a part was not written, so the set is not "
                                    "committed",
                 index);
        s = agree(p, &mine, every + (size_t)v * (size_t)W, what);
    }
    const bool parts_durable = s == GP_OK;
    if (s == GP_OK) {
        /* Every part is durable: rank 0 commits, and every rank learns whether it did. */
        outcome commit = {.status = GP_OK};
        if (rank == 0) {
            gp_checkpoint_part *parts = calloc((size_t)C, sizeof *parts);
            const char *slash = strrchr(base, '/');
            const char *name = slash ? slash + 1 : base;
            char *files = malloc((size_t)C * n);
            gp_status c = parts && files ? GP_OK
                                         : gp_error(GP_OUT_OF_MEMORY, "checkpoint %s", index);
            for (int r = 0; r < C && c == GP_OK; r++) { /* replica 0's shard 0 of cell r's stage */
                const gp_stage *cell = gp_worker(p, r, 0);
                const outcome *o_r = &every[(size_t)cell->chunk * (size_t)W + (size_t)cell->dk * T];
                snprintf(files + (size_t)r * n, n, "%s-%05d-of-%05d.safetensors", name, r + 1, C);
                parts[r] = (gp_checkpoint_part){files + (size_t)r * n, o_r->first, o_r->last,
                                                o_r->bytes, o_r->crc32};
            }
            if (c == GP_OK)
                c = gp_checkpoint_commit(index, m, parts, C, o, step, extra, nextra);
            if (c != GP_OK) note(&commit, c);
            free(parts);
            free(files);
        }
        char what[256];
        snprintf(what, sizeof what, "checkpoint %s: the index (the commit) was not written", index);
        s = agree(p, &commit, all, what);
    }
    /* Not committed: no orphan part stays. Once every part is durable the parts stay, whatever
     * the commit's agreement says: rank 0 may have written the index before a peer failed (a rank
     * stopped in it), and a committed set must keep its parts; a set left without its index is
     * removed by the next --resume. */
    for (int v = 0; s != GP_OK && !parts_durable && wrote && v < V; v++)
        if (wrote[v]) remove(mine_paths + (size_t)v * n);
    if (s == GP_OK && written) snprintf(written, written_size, "%s", index);
    free(every);
    free(mine_paths);
    free(wrote);
done:
    free(path);
    free(index);
    free(all);
    return s;
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
    s = agree(p, &mine, all, "loading a checkpoint");
    free(all);
    return s;
}
