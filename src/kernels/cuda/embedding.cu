// CUDA token embeddings, whole-table and vocabulary shard. The ids are copied to the host and
// checked there first, with the CPU's messages (a kernel cannot name the bad position). The
// backward adds without atomics: the host also groups the positions by row (a stable counting
// sort: positions in order within a row), and a block per row adds its positions' gradients in
// that order, column by column: each element gets the CPU's sum, bit for bit.
#include <stdlib.h>

#include "kernels/cuda/cuda_kernels.h"
#include "kernels/cuda/math.cuh"

// The ids (n) in host memory (the device's pinned scratch), checked as the CPU checks them.
static gp_status checked_ids(gp_cuda_ctx *c, const int32_t *ids, int64_t n, int64_t row_len,
                             int64_t vocab, int32_t **out) {
    void *h;
    GP_TRY(gp_cuda_host_scratch(c, (size_t)n * sizeof(int32_t), &h));
    GP_TRY(gp_cuda_to_host(c, h, ids, (size_t)n * sizeof(int32_t)));
    *out = (int32_t *)h;
    return gp_kernels_check_ids(n, row_len, vocab, *out);
}

// y row i = w row ids[i] - first when that is in [0, rows), else zeros (first 0, rows vocab:
// the whole table).
static __global__ void embedding_forward_kernel(int64_t n, int64_t dim, int64_t first,
                                                int64_t rows, const int32_t *ids,
                                                const float *w, float *y) {
    GP_CUDA_FOR(i, n * dim) {
        const int64_t p = i / dim, j = i % dim;
        const int64_t r = (int64_t)ids[p] - first;
        y[i] = r >= 0 && r < rows ? w[r * dim + j] : 0.0f;
    }
}

static gp_status forward(gp_device *dev, int64_t n, int64_t row_len, int64_t dim, int64_t vocab,
                         int64_t first, int64_t rows, const int32_t *ids, const float *w,
                         float *y) {
    gp_status s;
    gp_cuda_ctx *c = gp_cuda_begin(dev, &s);
    if (!c) return s;
    if (n <= 0) return GP_OK;
    int32_t *h;
    GP_TRY(checked_ids(c, ids, n, row_len, vocab, &h));
    if (dim > 0)
        GP_CUDA_LAUNCH(c, embedding_forward_kernel, n * dim, n, dim, first, rows, ids, w, y);
    return GP_OK;
}

// The plan of a backward, in one block of int64: used rows (nused), their offsets into the
// positions (nused + 1), the positions grouped by row, in order within a row.
typedef struct plan {
    int64_t *data;
    int64_t nused, npos;
} plan;

static gp_status make_plan(const int32_t *ids, int64_t n, int64_t first, int64_t rows, plan *p) {
    int64_t *count = (int64_t *)calloc((size_t)rows + 1, sizeof *count);
    if (!count) return gp_error(GP_OUT_OF_MEMORY, "embedding backward: %lld row counts", (long long)rows);
    p->nused = p->npos = 0;
    for (int64_t i = 0; i < n; i++) {
        const int64_t r = (int64_t)ids[i] - first;
        if (r < 0 || r >= rows) continue;
        p->nused += count[r + 1]++ == 0;
        p->npos++;
    }
    p->data = (int64_t *)malloc((size_t)(2 * p->nused + 1 + p->npos) * sizeof(int64_t));
    if (!p->data) {
        free(count);
        return gp_error(GP_OUT_OF_MEMORY, "embedding backward: a plan of %lld positions",
                        (long long)p->npos);
    }
    int64_t *used = p->data, *off = used + p->nused, *pos = off + p->nused + 1;
    int64_t u = 0;
    for (int64_t r = 0; r < rows; r++) { // count[r + 1] -> the start of row r's positions
        const int64_t k = count[r + 1];
        count[r + 1] = count[r] + k;
        if (k) {
            used[u] = r;
            off[u++] = count[r];
        }
    }
    off[u] = p->npos;
    for (int64_t i = 0; i < n; i++) { // positions in order: a stable sort
        const int64_t r = (int64_t)ids[i] - first;
        if (r >= 0 && r < rows) pos[count[r]++] = i;
    }
    free(count);
    return GP_OK;
}

// A block per used row (looping past the grid), a thread per column: dw[row] += dy rows of its
// positions, in position order.
static __global__ void embedding_backward_kernel(int64_t nused, int64_t dim, const int64_t *used,
                                                 const int64_t *off, const int64_t *pos,
                                                 const float *dy, float *dw) {
    for (int64_t u = blockIdx.x; u < nused; u += gridDim.x) {
        float *row = dw + used[u] * dim;
        for (int64_t j = threadIdx.x; j < dim; j += blockDim.x) {
            float acc = row[j];
            for (int64_t k = off[u]; k < off[u + 1]; k++) acc += dy[pos[k] * dim + j];
            row[j] = acc;
        }
    }
}

static gp_status backward(gp_device *dev, int64_t n, int64_t row_len, int64_t dim, int64_t vocab,
                          int64_t first, int64_t rows, const int32_t *ids, const float *dy,
                          float *dw) {
    gp_status s;
    gp_cuda_ctx *c = gp_cuda_begin(dev, &s);
    if (!c) return s;
    if (n <= 0) return GP_OK;
    int32_t *h;
    GP_TRY(checked_ids(c, ids, n, row_len, vocab, &h));
    plan p = {NULL, 0, 0};
    GP_TRY(make_plan(h, n, first, rows, &p));
    if (!p.nused || dim <= 0) {
        free(p.data);
        return GP_OK;
    }
    const size_t nbytes = (size_t)(2 * p.nused + 1 + p.npos) * sizeof(int64_t);
    int64_t *d = (int64_t *)gp_cuda_workspace(dev, nbytes, &s);
    if (d) {
        s = gp_cuda_from_host(c, d, p.data, nbytes);
        if (s == GP_OK) {
            const unsigned blocks =
                (unsigned)(p.nused < GP_CUDA_MAX_GRID ? p.nused : GP_CUDA_MAX_GRID);
            embedding_backward_kernel<<<blocks, GP_CUDA_THREADS, 0, c->stream>>>(
                p.nused, dim, d, d + p.nused, d + 2 * p.nused + 1, dy, dw);
            s = gp_cuda_launched(c, "embedding_backward_kernel");
        }
        gp_cuda_workspace_release(dev, d);
    }
    free(p.data);
    return s;
}

extern "C" gp_status gp_cuda_embedding_forward(gp_device *dev, int64_t n, int64_t row_len,
                                               int64_t dim, int64_t vocab, const int32_t *ids,
                                               const float *w, float *y) {
    return forward(dev, n, row_len, dim, vocab, 0, vocab, ids, w, y);
}

extern "C" gp_status gp_cuda_embedding_backward(gp_device *dev, int64_t n, int64_t row_len,
                                                int64_t dim, int64_t vocab, const int32_t *ids,
                                                const float *dy, float *dw) {
    return backward(dev, n, row_len, dim, vocab, 0, vocab, ids, dy, dw);
}

extern "C" gp_status gp_cuda_embedding_shard_forward(gp_device *dev, int64_t n, int64_t row_len,
                                                     int64_t dim, int64_t vocab, int64_t first,
                                                     int64_t rows, const int32_t *ids,
                                                     const float *w, float *y) {
    GP_TRY(gp_kernels_check_shard(vocab, first, rows, "embedding"));
    return forward(dev, n, row_len, dim, vocab, first, rows, ids, w, y);
}

extern "C" gp_status gp_cuda_embedding_shard_backward(gp_device *dev, int64_t n, int64_t row_len,
                                                      int64_t dim, int64_t vocab, int64_t first,
                                                      int64_t rows, const int32_t *ids,
                                                      const float *dy, float *dw) {
    GP_TRY(gp_kernels_check_shard(vocab, first, rows, "embedding"));
    return backward(dev, n, row_len, dim, vocab, first, rows, ids, dy, dw);
}
