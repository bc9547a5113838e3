/* Flatten: (B, d1, ..., dn) -> (B, d1*...*dn), as PyTorch's nn.Flatten(). The
 * bytes do not move in row-major order; forward and backward are copies
 * because the caller owns separate output and gradient tensors. */
#include <stdint.h>

#include "layers/layer_base.h"

static gp_status flatten_out_shape(const gp_layer *l, const gp_shape *in, gp_dtype dtype,
                                   gp_shape *out) {
    char buf[96];
    GP_TRY(gp_expect_dtype(l, dtype, GP_F32));
    if (in->ndim < 2)
        return gp_error(
            GP_SHAPE,
            "layer %d (flatten): input shape %s has %d dimension(s), expected at least 2 "
            "(B, ...)",
            l->index, gp_shape_str(in, buf, sizeof buf), in->ndim);
    int64_t rest = 1;
    for (int i = 1; i < in->ndim; i++) rest *= in->dim[i];
    *out = gp_shape2(in->dim[0], rest);
    return GP_OK;
}

static gp_cost flatten_cost(const gp_layer *l, const gp_shape *in) {
    return (gp_cost){.out_bytes = (uint64_t)gp_shape_nelem(in) * sizeof(float)};
}

static gp_status check_same_count(const gp_layer *l, const gp_tensor *a, const gp_tensor *b,
                                  const char *what) {
    char x[96], y[96];
    if (gp_tensor_nelem(a) != gp_tensor_nelem(b) || a->shape.dim[0] != b->shape.dim[0])
        return gp_error(GP_SHAPE,
                        "layer %d (flatten): %s has shape %s, expected %lld values for %s",
                        l->index, what, gp_shape_str(&b->shape, x, sizeof x),
                        (long long)gp_tensor_nelem(a), gp_shape_str(&a->shape, y, sizeof y));
    return GP_OK;
}

static gp_status flatten_forward(gp_layer *l, gp_ctx *ctx, const gp_tensor *x, gp_tensor *y) {
    gp_shape want;
    char a[96], b[96];
    GP_TRY(flatten_out_shape(l, &x->shape, x->dtype, &want));
    if (!gp_shape_equal(&want, &y->shape))
        return gp_error(GP_SHAPE, "layer %d (flatten): output has shape %s, expected %s", l->index,
                        gp_shape_str(&y->shape, a, sizeof a), gp_shape_str(&want, b, sizeof b));
    return gp_tensor_copy(y, x);
}

static gp_status flatten_backward(gp_layer *l, gp_ctx *ctx, const gp_tensor *dy, gp_tensor *dx) {
    if (!dx) return GP_OK;
    GP_TRY(check_same_count(l, dx, dy, "output gradient"));
    return gp_tensor_copy(dx, dy);
}

/* Replicated over the tensor axis: every shard holds the whole layer. */
static gp_layer *flatten_shard(const gp_layer *l, int nshards) {
    (void)nshards;
    return gp_layer_copy(l, 0);
}

static const gp_layer_ops flatten_ops = {
    .kind = "flatten",
    .out_shape = flatten_out_shape,
    .cost = flatten_cost,
    .forward = flatten_forward,
    .backward = flatten_backward,
    .shard = flatten_shard,
};

gp_layer *gp_flatten(void) { return gp_layer_new(&flatten_ops, NULL); }
