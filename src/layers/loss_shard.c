/* The softmax cross-entropy of a vocabulary split over the tensor axis (loss_shard.h): two
 * small all-reduces of per-row figures instead of gathering (rows, vocab) logits. */
#include "layers/loss_shard.h"

#include "core/device.h"
#include "core/error.h"
#include "kernels/kernels.h"

gp_status gp_softmax_xent_shard(const gp_tensor *logits, const gp_tensor *labels, int64_t vocab,
                                int64_t first, const gp_coll_group *g, double normalizer,
                                double smoothing, double *loss, gp_tensor *dlogits) {
    char a[96], b[96];
    if (!logits || !labels || !g || !logits->data || !labels->data || logits->dtype != GP_F32 ||
        labels->dtype != GP_I32 || logits->shape.ndim < 1)
        return gp_error(GP_INVALID_ARGUMENT,
                        "split cross-entropy: float32 logits, int32 labels and a group expected");
    const int64_t classes = logits->shape.dim[logits->shape.ndim - 1];
    const int64_t rows = classes > 0 ? gp_tensor_nelem(logits) / classes : 0;
    if (classes < 1 || gp_tensor_nelem(labels) != rows)
        return gp_error(GP_SHAPE, "split cross-entropy: labels %s for logits %s: one per row",
                        gp_shape_str(&labels->shape, a, sizeof a),
                        gp_shape_str(&logits->shape, b, sizeof b));
    if (dlogits && (!dlogits->data || !gp_shape_equal(&dlogits->shape, &logits->shape)))
        return gp_error(GP_SHAPE, "split cross-entropy: dlogits %s, expected %s",
                        gp_shape_str(&dlogits->shape, a, sizeof a),
                        gp_shape_str(&logits->shape, b, sizeof b));
    gp_device *dev = logits->dev;
    const gp_kernels *k = gp_kernels_of(dev);
    gp_status s = GP_OK;
    /* mx (rows) | sums (2, rows), (3, rows) smoothed */
    const int64_t nsums = (smoothing > 0 ? 3 : 2) * rows;
    float *ws = gp_device_alloc(dev, GP_MEM_WORKSPACE, (size_t)(rows + nsums) * sizeof *ws, &s);
    if (!ws) return gp_error_context(s, "split cross-entropy: workspace");
    float *mx = ws, *sums = ws + rows;
    const float *x = logits->data;
    const int32_t *y = labels->data;
    s = k->row_max(dev, rows, classes, x, mx);
    if (s == GP_OK) s = g->allreduce(g->ctx, dev, mx, rows, GP_REDUCE_MAX);
    if (s == GP_OK)
        s = k->xent_shard_sums(dev, rows, classes, vocab, first, x, y, mx, smoothing, sums);
    if (s == GP_OK) s = g->allreduce(g->ctx, dev, sums, nsums, GP_REDUCE_SUM);
    double l = 0;
    if (s == GP_OK)
        s = k->xent_shard_finish(dev, rows, classes, vocab, first, x, y, mx, sums, normalizer,
                                 smoothing, &l, dlogits ? dlogits->data : NULL);
    gp_device_release(dev, ws);
    if (s != GP_OK)
        return gp_error_context(s, "split cross-entropy, shard %d of %d (classes %lld..%lld)",
                                g->rank, g->size, (long long)first,
                                (long long)(first + classes - 1));
    if (loss) *loss = l;
    return GP_OK;
}
