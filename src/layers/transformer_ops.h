/* Functional kernels of the Transformer layer family on raw row-major
 * arrays: linear, layer norm, GELU (tanh form), dropout and causal attention,
 * forward and backward. The single layers and the composite block both call
 * these, so each piece of math is written once. */
#ifndef GP_LAYERS_TRANSFORMER_OPS_H
#define GP_LAYERS_TRANSFORMER_OPS_H

#include <stdint.h>

#include "layer.h"

#define GP_LAYERNORM_EPS 1e-5f

/* Out-of-line entry points to the inline, vectorizable approximations of
 * kernels/cpu/transformer_math.h that the kernels use (relative error below
 * 3e-7; NaN propagates): for tests and for callers outside hot loops. */
float gp_op_expf(float x);
float gp_op_tanhf(float x);
/* y[i] = tanh(x[i]); y may alias x. */
void gp_op_tanh(int64_t n, const float *x, float *y);

/* ---- linear: y (rows, out) = x (rows, in) W^T + b [+ res], W (out, in) */

/* b and res may be NULL; res may alias y. */
void gp_op_linear_forward(int64_t rows, int64_t in, int64_t out, const float *x, const float *w,
                          const float *b, const float *res, float *y);
/* dx (rows, in) is written when not NULL; dw (out, in) and db (out) are
 * added into (db may be NULL). */
void gp_op_linear_backward(int64_t rows, int64_t in, int64_t out, const float *x, const float *w,
                           const float *dy, float *dx, float *dw, float *db);

/* ---- layer norm over the last dimension `dim` of (rows, dim) */

/* stats (2, rows): mean in [0, rows), 1/sqrt(var + eps) in [rows, 2 rows). */
void gp_op_layernorm_forward(int64_t rows, int64_t dim, const float *x, const float *w,
                             const float *b, float *y, float *stats);
/* dx = dres + d(LN)/dx . dy when dx is not NULL (dres may be NULL; it may
 * alias dx); dw and db are added into. */
void gp_op_layernorm_backward(int64_t rows, int64_t dim, const float *x, const float *w,
                              const float *stats, const float *dy, const float *dres, float *dx,
                              float *dw, float *db);

/* ---- GELU, tanh form: 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))),
 * evaluated as x / (1 + exp(-2u)), the same function (see the kernel). */

/* y may alias x. */
void gp_op_gelu_forward(int64_t n, const float *x, float *y);
/* dx = dy * gelu'(x); dx may alias dy. When db is not NULL, the columns of
 * dx (rows, cols) are also summed into db. */
void gp_op_gelu_backward(int64_t rows, int64_t cols, const float *x, const float *dy, float *dx,
                         float *db);

/* ---- dropout: keep element i iff u_i >= p (u_i = element i of stream s),
 * scaled by 1 / (1 - p). The mask is never stored: backward calls the same
 * function on dy, which regenerates it from the stream. */

/* y = [res +] mask(x); y may alias x or res; res may be NULL. Returns the
 * number of kept elements. */
int64_t gp_op_dropout(const gp_rng_stream *s, float p, int64_t n, const float *x,
                      const float *res, float *y);
/* The stream of dropout site `site` of the layer at `layer_index` for a run. */
gp_rng_stream gp_op_dropout_stream(uint64_t seed, int layer_index, int site, uint32_t step,
                                   uint32_t micro_batch);

/* ---- causal multi-head attention core on qkv (B, T, 3C): rows [q | k | v],
 * head h using columns h*hd .. (h+1)*hd - 1 of each. */

typedef struct gp_attn_dims {
    int64_t batch, seq, dim, heads; /* B, T, C, H; head_dim = C / H */
} gp_attn_dims;

/* probs (B, H, T, T): softmax(q k^T / sqrt(hd)) with zeros above the
 * diagonal (saved for backward); att (B, T, C): heads concatenated. */
void gp_op_attention_forward(const gp_attn_dims *d, const float *qkv, float *probs, float *att);
/* datt (B, T, C) -> dqkv (B, T, 3C) written; when dbias (3C) is not NULL the
 * rows of dqkv are also summed into it. scratch: T*T floats. */
void gp_op_attention_backward(const gp_attn_dims *d, const float *qkv, const float *probs,
                              const float *datt, float *dqkv, float *dbias, float *scratch);
/* FLOPs of the attention core's forward matrix products as computed (the
 * causal blocking skips most of the masked triangle); backward does twice
 * this. */
double gp_op_attention_gemm_flops(const gp_attn_dims *d);
/* FLOPs of the attention sublayer (projections, core, softmax, biases,
 * dropout when p > 0), forward and backward, for the cost models. */
void gp_op_mha_flops(const gp_attn_dims *d, float p, double *fwd, double *bwd);

/* ---- multi-head attention sublayer: qkv projection, core, output
 * projection, optional dropout (site chosen by the caller's stream). */

typedef struct gp_mha_weights {
    const float *wqkv, *bqkv, *wproj, *bproj; /* (3C, C), (3C), (C, C), (C) */
    float *gwqkv, *gbqkv, *gwproj, *gbproj;   /* their gradients, added into */
} gp_mha_weights;

/* What forward keeps for backward. */
typedef struct gp_mha_saved {
    float *qkv;   /* (B, T, 3C) */
    float *probs; /* (B, H, T, T) */
    float *att;   /* (B, T, C) */
} gp_mha_saved;

/* y (B, T, C) = [res +] drop(att(x) Wproj^T + bproj); drop is skipped when
 * p == 0 or stream is NULL. res may alias y. */
void gp_op_mha_forward(const gp_attn_dims *d, const gp_mha_weights *w, const float *x,
                       const float *res, const gp_rng_stream *drop, float p,
                       const gp_mha_saved *sv, float *y);
/* Workspace floats gp_op_mha_backward needs. */
int64_t gp_op_mha_backward_ws(const gp_attn_dims *d, bool dropout);
/* dy (B, T, C) -> dx (B, T, C) written when not NULL; weight gradients
 * added. ws: gp_op_mha_backward_ws floats, not overlapping dy or dx. */
void gp_op_mha_backward(const gp_attn_dims *d, const gp_mha_weights *w, const float *x,
                        const gp_mha_saved *sv, const gp_rng_stream *drop, float p,
                        const float *dy, float *ws, float *dx);

/* ---- helpers shared by the layers of this family (transformer_ops.c) */

/* Checks a float32 input of 2 to 4 dimensions whose last one is `last`
 * (named `what` in the message); *rows = product of the other dimensions. */
gp_status gp_tl_rows(const gp_layer *l, const gp_shape *in, gp_dtype dtype, int64_t last,
                     const char *what, int64_t *rows);
/* Fails with a message naming the layer if a trainable parameter has no
 * value or gradient tensor (they are allocated by the model and trainer). */
gp_status gp_tl_check_params(const gp_layer *l, bool need_grads);
/* Bytes of all parameters and buffers. */
uint64_t gp_tl_param_bytes(const gp_layer *l);
/* Workspace from the context's device (GP_MEM_WORKSPACE), nfloats floats. */
float *gp_tl_workspace(const gp_layer *l, gp_ctx *c, int64_t nfloats, gp_status *st);
void gp_tl_workspace_release(gp_ctx *c, float *p);

#endif
