/* CPU kernels of the ConvNet layers: convolutions (3x3 ones at stride 1 by Winograd's F(2x2,
 * 3x3) in conv_winograd.c where it applies, forward and both gradients; the rest on the direct
 * path of conv_direct.c where that applies, else here as GEMMs over im2col columns), channel
 * biases, batch norm with its statistics summed in double in a fixed lane order (the same bits
 * on any compiler), max and global average pooling. The device's threads split the examples of
 * an im2col convolution (each chunk of examples with its own columns, its GEMMs
 * single-threaded), and the channels or planes of everything else; a sum over examples goes
 * through partial sums over groups of examples fixed by the batch and the geometry alone, so the
 * bits do not depend on the number of threads. */
#include <math.h>
#include <string.h>

#include "kernels/cpu/conv_direct.h"
#include "kernels/cpu/conv_geom.h"
#include "kernels/cpu/conv_winograd.h"
#include "kernels/cpu/cpu_ops.h"
#include "kernels/cpu/gemm.h"
#include "kernels/cpu/pool.h"
#include "kernels/cpu/simd.h"

/* The output columns ow whose input column ow*s - pad + kj lies inside
 * [0, W): [*lo, *hi). Empty when *lo == *hi. */
static void valid_cols(const gp_conv_geom *g, int64_t kj, int64_t *lo, int64_t *hi) {
    int64_t s = g->stride, t = g->pad - kj, u = g->width - 1 + g->pad - kj;
    int64_t a = t <= 0 ? 0 : (t + s - 1) / s;
    int64_t b = u < 0 ? 0 : u / s + 1;
    if (b > g->out_w) b = g->out_w;
    if (a > b) a = b;
    *lo = a;
    *hi = b;
}

/* Columns [0, lo) and [hi, w) of rows of w floats zeroed: a few floats a row (|kj - pad|),
 * stored column by column, which no compiler turns into a memset call per row (on a 7x7 image
 * such calls cost more than the copy). */
static void zero_columns(float *d, int64_t w, int64_t rows, int64_t lo, int64_t hi) {
    for (int64_t c = 0; c < lo; c++)
        for (int64_t r = 0; r < rows; r++) d[r * w + c] = 0.0f;
    for (int64_t c = hi; c < w; c++)
        for (int64_t r = 0; r < rows; r++) d[r * w + c] = 0.0f;
}

/* im2col for stride 1 and an output as wide as the input ("same" padding, every 3x3 pad-1
 * layer): a row (c, ki, kj) of col is the input plane shifted by (ki - pad) rows and (kj - pad)
 * columns, so its valid rows are one contiguous copy; the columns that wrapped around from the
 * neighbouring rows are then zeroed, |kj - pad| per row. */
static void im2col_same(const gp_conv_geom *g, const float *x, int64_t oh0, int64_t oh1,
                        float *col, int64_t ld) {
    const int64_t k = g->kernel, pad = g->pad, H = g->height, W = g->width, rows = oh1 - oh0;
    float *dst = col;
    for (int64_t c = 0; c < g->channels; c++) {
        const float *xc = x + c * H * W;
        for (int64_t ki = 0; ki < k; ki++) {
            /* output rows whose input row oh - pad + ki lies in [0, H) */
            int64_t va = pad - ki > oh0 ? pad - ki : oh0, vb = H + pad - ki < oh1 ? H + pad - ki : oh1;
            if (vb < va) vb = va;
            for (int64_t kj = 0; kj < k; kj++, dst += ld) {
                int64_t lo, hi;
                valid_cols(g, kj, &lo, &hi);
                if (hi <= lo || vb == va) {
                    memset(dst, 0, (size_t)(rows * W) * sizeof *dst);
                    continue;
                }
                /* rows above and below the image: only for the first and last ki (a call per
                 * block would cost more than a 7x7 image's copy) */
                if (va > oh0) memset(dst, 0, (size_t)((va - oh0) * W) * sizeof *dst);
                if (oh1 > vb) memset(dst + (vb - oh0) * W, 0, (size_t)((oh1 - vb) * W) * sizeof *dst);
                float *d = dst + (va - oh0) * W;
                const float *src = xc + (va - pad + ki) * W - pad + kj;
                memcpy(d + lo, src + lo, (size_t)((vb - va - 1) * W + hi - lo) * sizeof *d);
                zero_columns(d, W, vb - va, lo, hi);
            }
        }
    }
}

/* col (C*k*k rows of ld floats; the first (oh1-oh0)*OW of each used) = the patches of output
 * rows [oh0, oh1) of x (C, H, W); row (c*k + ki)*k + kj matches the weight layout
 * (OC, C, k, k); taps outside the image are 0. ld > (oh1-oh0)*OW puts several examples' columns
 * side by side. */
static void im2col(const gp_conv_geom *g, const float *x, int64_t oh0, int64_t oh1, float *col,
                   int64_t ld) {
    const int64_t k = g->kernel, s = g->stride, ow_n = g->out_w, H = g->height, W = g->width;
    if (s == 1 && ow_n == W) {
        im2col_same(g, x, oh0, oh1, col, ld);
        return;
    }
    float *row = col;
    for (int64_t c = 0; c < g->channels; c++) {
        const float *xc = x + c * H * W;
        for (int64_t ki = 0; ki < k; ki++) {
            /* output rows [ra, rb) read input rows oh s - pad + ki inside [0, H) */
            const int64_t t = g->pad - ki, u = H - 1 + g->pad - ki;
            int64_t ra = t <= 0 ? 0 : (t + s - 1) / s, rb = u < 0 ? 0 : u / s + 1;
            ra = ra < oh0 ? oh0 : ra > oh1 ? oh1 : ra;
            rb = rb > oh1 ? oh1 : rb < ra ? ra : rb;
            for (int64_t kj = 0; kj < k; kj++, row += ld) {
                int64_t lo, hi;
                valid_cols(g, kj, &lo, &hi);
                if (ra > oh0) memset(row, 0, (size_t)((ra - oh0) * ow_n) * sizeof *row);
                if (oh1 > rb)
                    memset(row + (rb - oh0) * ow_n, 0, (size_t)((oh1 - rb) * ow_n) * sizeof *row);
                float *d = row + (ra - oh0) * ow_n;
                for (int64_t oh = ra; oh < rb; oh++) {
                    float *dst = d + (oh - ra) * ow_n;
                    /* the tap of column ow: src[ow * s] (in range for lo <= ow < hi) */
                    const float *src = xc + (oh * s - g->pad + ki) * W - g->pad + kj;
                    if (s == 1) {
                        if (hi > lo) memcpy(dst + lo, src + lo, (size_t)(hi - lo) * sizeof *dst);
                    } else if (s == 2) { /* a constant stride: the compiler vectorizes it */
                        for (int64_t ow = lo; ow < hi; ow++) dst[ow] = src[2 * ow];
                    } else {
                        for (int64_t ow = lo; ow < hi; ow++) dst[ow] = src[ow * s];
                    }
                }
                zero_columns(d, ow_n, rb - ra, lo, hi);
            }
        }
    }
}

/* x (C, H, W) += the patches in col (rows ld floats apart): the adjoint of im2col. */
static void col2im_add(const gp_conv_geom *g, const float *col, int64_t ld, int64_t oh0,
                       int64_t oh1, float *x) {
    const int64_t k = g->kernel, s = g->stride, ow_n = g->out_w, H = g->height, W = g->width;
    const float *row = col;
    for (int64_t c = 0; c < g->channels; c++) {
        float *xc = x + c * H * W;
        for (int64_t ki = 0; ki < k; ki++) {
            for (int64_t kj = 0; kj < k; kj++, row += ld) {
                int64_t lo, hi;
                valid_cols(g, kj, &lo, &hi);
                const float *src = row;
                for (int64_t oh = oh0; oh < oh1; oh++, src += ow_n) {
                    int64_t ih = oh * s - g->pad + ki;
                    if (ih < 0 || ih >= H) continue;
                    float *dst = xc + ih * W - g->pad + kj;
                    if (s == 1) {
                        for (int64_t ow = lo; ow < hi; ow++) dst[ow] += src[ow];
                    } else if (s == 2) {
                        for (int64_t ow = lo; ow < hi; ow++) dst[2 * ow] += src[ow];
                    } else {
                        for (int64_t ow = lo; ow < hi; ow++) dst[ow * s] += src[ow];
                    }
                }
            }
        }
    }
}

/* ------------------------------------------------------------ convolution */

/* 1x1, stride 1, no padding: the input plane already is the column matrix. */
static bool is_pointwise(const gp_conv_geom *g) {
    return g->kernel == 1 && g->stride == 1 && g->pad == 0;
}

static int64_t kdim_of(const gp_conv_geom *g) { return g->channels * g->kernel * g->kernel; }
static int64_t npix_of(const gp_conv_geom *g) { return g->out_h * g->out_w; }
static int64_t in_elems_of(const gp_conv_geom *g) { return g->channels * g->height * g->width; }

/* Output rows per im2col band: the whole image when its columns fit in CONV_COL_MAX floats
 * (every C1 layer), fewer for large images so the workspace stays bounded. */
#define CONV_COL_MAX ((int64_t)1 << 20)
static int64_t band_rows(const gp_conv_geom *g) {
    const int64_t row = kdim_of(g) * g->out_w; /* floats per row */
    const int64_t r = CONV_COL_MAX / (row > 0 ? row : 1);
    return r < 1 ? 1 : r > g->out_h ? g->out_h : r;
}

/* Examples whose columns go side by side into one GEMM. A small output (7x7, 14x14) alone
 * makes a GEMM too thin to run near sgemm's rate (and its weight gradient sums over only its
 * few pixels), so chunks of examples span at least CHUNK_PIX pixels, within CONV_COL_MAX
 * floats of columns. Set by the geometry alone, like every cut below, so the bits are too. */
#define CHUNK_PIX 512
static int64_t chunk_examples(const gp_conv_geom *g) {
    const int64_t npix = npix_of(g), per_example = kdim_of(g) * npix;
    if (is_pointwise(g) || npix <= 0 || npix >= CHUNK_PIX) return 1;
    const int64_t want = (CHUNK_PIX + npix - 1) / npix;
    const int64_t fit = CONV_COL_MAX / (per_example > 0 ? per_example : 1);
    return want < fit ? want : fit < 1 ? 1 : fit;
}

/* Floats of one thread's columns (0 for a pointwise convolution): a band of one example, or a
 * chunk of examples. */
static int64_t col_floats(const gp_conv_geom *g) {
    if (is_pointwise(g)) return 0;
    const int64_t e = chunk_examples(g);
    return e > 1 ? kdim_of(g) * e * npix_of(g) : kdim_of(g) * band_rows(g) * g->out_w;
}

/* Floats of one thread's chunk of outputs (OC, e P), gathered or scattered around a GEMM. */
static int64_t chunk_out_floats(const gp_conv_geom *g, int64_t oc) {
    const int64_t e = chunk_examples(g);
    return e > 1 ? oc * e * npix_of(g) : 0;
}

/* Groups of examples whose weight gradients are summed apart, then added in group order: a
 * number set by the batch and the geometry alone, so the sums are the same on any number of
 * threads. Up to CONV_GROUPS; fewer where an example's output is small, so that each group has
 * a chunk of examples to sum in one GEMM, but at least CONV_MIN_GROUPS for the threads. */
#define CONV_GROUPS 16
#define CONV_MIN_GROUPS 4
static int64_t conv_groups(const gp_conv_geom *g, int64_t batch) {
    int64_t n = batch / chunk_examples(g);
    if (n < CONV_MIN_GROUPS) n = CONV_MIN_GROUPS;
    if (n > CONV_GROUPS) n = CONV_GROUPS;
    return n < batch ? n : batch;
}

static int conv_threads(gp_device *dev, int64_t parts) {
    const int threads = gp_cpu_pool_threads(gp_cpu_pool_of(dev));
    return parts < threads ? (int)(parts > 0 ? parts : 1) : threads;
}

/* One thread's forward workspace: columns, then the chunk's outputs. */
static int64_t fwd_floats(const gp_conv_geom *g, int64_t oc) {
    return col_floats(g) + chunk_out_floats(g, oc);
}

/* The backward workspace: the groups' partial weight gradients, the flipped weights (dx by
 * convolution), then each thread's columns of x, its chunk of dy, and the input gradient's
 * workspace (a forward one of the flipped convolution, or dcol). */
typedef struct conv_bwd_layout {
    int64_t partials, flipped, per_thread, col_x, dy_chunk;
} conv_bwd_layout;

static conv_bwd_layout bwd_layout(const gp_conv_geom *g, int64_t batch, int64_t out_ch,
                                  bool want_dx) {
    conv_bwd_layout L = {.partials = conv_groups(g, batch) * out_ch * kdim_of(g),
                         .col_x = col_floats(g), .dy_chunk = chunk_out_floats(g, out_ch)};
    gp_conv_geom gt;
    L.per_thread = L.col_x + L.dy_chunk;
    if (want_dx && gp_conv_dx_geom(g, out_ch, &gt)) {
        L.flipped = out_ch * kdim_of(g);
        L.per_thread += fwd_floats(&gt, g->channels);
    } else if (want_dx) {
        L.per_thread += L.col_x;
    }
    return L;
}

/* The im2col path's workspace. */
static int64_t gemm_ws(gp_device *dev, const gp_conv_geom *g, int64_t batch, int64_t out_ch,
                       bool backward, bool want_dx) {
    if (!backward) {
        const int64_t e = chunk_examples(g), chunks = (batch + e - 1) / e;
        return conv_threads(dev, chunks) * fwd_floats(g, out_ch);
    }
    const conv_bwd_layout L = bwd_layout(g, batch, out_ch, want_dx);
    return L.partials + L.flipped + conv_threads(dev, conv_groups(g, batch)) * L.per_thread;
}

/* The input gradient by Winograd: the flipped convolution's geometry (*gt) where it applies. */
static bool dx_by_winograd(const gp_conv_geom *g, int64_t out_ch, gp_conv_geom *gt) {
    return gp_conv_dx_geom(g, out_ch, gt) && gp_conv_winograd_serves(gt, g->channels);
}

static int64_t conv_ws(gp_device *dev, const gp_conv_geom *g, int64_t batch, int64_t out_ch,
                       bool backward, bool want_dx);

int64_t gp_cpu_conv2d_ws(gp_device *dev, const gp_conv_geom *g, int64_t batch, int64_t out_ch,
                         bool backward, bool want_dx) {
    if (!backward)
        return gp_conv_winograd_serves(g, out_ch) ? gp_conv_winograd_ws(dev, g, batch, out_ch)
                                                   : conv_ws(dev, g, batch, out_ch, false, false);
    /* one after the other: dw by Winograd, dx by Winograd, then what is left on the others */
    gp_conv_geom gt;
    const bool wg_dw = gp_conv_winograd_dw_serves(g, batch, out_ch);
    const bool wg_dx = want_dx && dx_by_winograd(g, out_ch, &gt);
    int64_t need = wg_dw ? gp_conv_winograd_dw_ws(dev, g, batch, out_ch) : 0;
    if (wg_dx) {
        const int64_t n = gp_conv_winograd_ws(dev, &gt, batch, g->channels);
        if (n > need) need = n;
    }
    if (!wg_dw || (want_dx && !wg_dx)) {
        const int64_t n = conv_ws(dev, g, batch, out_ch, true, want_dx && !wg_dx);
        if (n > need) need = n;
    }
    return need;
}

/* The workspace of the direct path, or of im2col. */
static int64_t conv_ws(gp_device *dev, const gp_conv_geom *g, int64_t batch, int64_t out_ch,
                       bool backward, bool want_dx) {
    if (!gp_conv_direct_serves(g, out_ch))
        return gemm_ws(dev, g, batch, out_ch, backward, want_dx);
    const bool dx_direct = want_dx && gp_conv_direct_dx(g, out_ch);
    return gp_conv_direct_ws(dev, g, batch, out_ch, backward, dx_direct) +
           (backward && want_dx && !dx_direct ? gemm_ws(dev, g, batch, out_ch, true, true) : 0);
}

typedef struct conv_args {
    const gp_conv_geom *g;
    int64_t batch, oc, groups;
    const float *x, *w, *dy, *wflip;
    float *y, *dx, *dw, *ws, *partial;
    conv_bwd_layout L;
} conv_args;

/* One example's GEMMs band by band of output rows, each band's columns of x (C, H, W) made
 * first: the forward, y (OC, P) = a (the weights, OC x K) . col, or the weight gradient,
 * c (OC, K) = beta c + a (dy, OC x P) . col^T. */
static void conv_bands(const gp_conv_geom *g, int64_t oc, const float *x, float *col,
                       bool weight_grad, const float *a, float *c, float beta) {
    const int64_t npix = npix_of(g), kdim = kdim_of(g), band = band_rows(g);
    for (int64_t r0 = 0; r0 < g->out_h; r0 += band) {
        const int64_t r1 = r0 + band < g->out_h ? r0 + band : g->out_h;
        const int64_t n = (r1 - r0) * g->out_w;
        im2col(g, x, r0, r1, col, n);
        if (weight_grad)
            gp_cpu_sgemm(false, true, oc, kdim, n, 1.0f, a + r0 * g->out_w, npix, col, n,
                         r0 == 0 ? beta : 1.0f, c, kdim);
        else /* rows r0..r1 of y (row stride P) */
            gp_cpu_sgemm(false, false, oc, n, kdim, 1.0f, a, kdim, col, n, 0.0f,
                         c + r0 * g->out_w, npix);
    }
}

/* The columns of ne examples from x side by side: col (K, ne P). */
static void chunk_im2col(const gp_conv_geom *g, const float *x, int64_t ne, float *col) {
    const int64_t npix = npix_of(g), in_elems = in_elems_of(g);
    for (int64_t j = 0; j < ne; j++) im2col(g, x + j * in_elems, 0, g->out_h, col + j * npix, ne * npix);
}

/* y (OC, P) = w (OC, K) x the columns of x (C, H, W). */
static void conv_one(const gp_conv_geom *g, int64_t oc, const float *w, const float *x,
                     float *y, float *col) {
    const int64_t npix = npix_of(g), kdim = kdim_of(g);
    if (is_pointwise(g))
        gp_cpu_sgemm(false, false, oc, npix, kdim, 1.0f, w, kdim, x, npix, 0.0f, y, npix);
    else
        conv_bands(g, oc, x, col, false, w, y, 0.0f);
}

/* The ne examples from x (their outputs from y): one GEMM over the chunk's columns, whose
 * output (OC, ne P) in ws (after the columns) is then scattered to the examples. */
static void conv_chunk(const gp_conv_geom *g, int64_t oc, const float *w, const float *x,
                       int64_t ne, float *y, float *ws) {
    const int64_t npix = npix_of(g), kdim = kdim_of(g), n = ne * npix;
    if (ne == 1) {
        conv_one(g, oc, w, x, y, ws);
        return;
    }
    float *col = ws, *out = ws + col_floats(g);
    chunk_im2col(g, x, ne, col);
    gp_cpu_sgemm(false, false, oc, n, kdim, 1.0f, w, kdim, col, n, 0.0f, out, n);
    for (int64_t j = 0; j < ne; j++)
        for (int64_t o = 0; o < oc; o++)
            memcpy(y + (j * oc + o) * npix, out + o * n + j * npix, (size_t)npix * sizeof *y);
}

/* Examples [lo, hi) of x into y, in chunks of chunk_examples counted from lo. */
static void conv_examples(const gp_conv_geom *g, int64_t oc, const float *w, const float *x,
                          int64_t lo, int64_t hi, float *y, float *ws) {
    const int64_t e = chunk_examples(g), npix = npix_of(g);
    const int64_t in_elems = in_elems_of(g);
    for (int64_t b = lo; b < hi; b += e) {
        const int64_t ne = b + e < hi ? e : hi - b;
        conv_chunk(g, oc, w, x + b * in_elems, ne, y + b * oc * npix, ws);
    }
}

/* Chunks of part t. */
static void conv_forward_part(void *ctx, int t, int nt) {
    const conv_args *a = ctx;
    const gp_conv_geom *g = a->g;
    const int64_t e = chunk_examples(g), chunks = (a->batch + e - 1) / e;
    int64_t lo, hi;
    gp_cpu_split(chunks, t, nt, 1, &lo, &hi);
    float *ws = a->ws ? a->ws + t * fwd_floats(g, a->oc) : NULL; /* NULL: pointwise, one by one */
    const int64_t b1 = hi * e < a->batch ? hi * e : a->batch;
    if (lo < hi) conv_examples(g, a->oc, a->w, a->x, lo * e, b1, a->y, ws);
}

/* The convolution whose weights conv2d_wt transforms: g's own, or (flipped) the one of dy
 * that makes g's input gradient (*gt, with *oc its output channels); false where no Winograd
 * path runs it. */
static bool wt_geom(const gp_conv_geom *g, int64_t out_ch, bool flipped, gp_conv_geom *gt,
                    int64_t *oc) {
    if (!flipped) {
        *gt = *g, *oc = out_ch;
        return gp_conv_winograd_serves(g, out_ch);
    }
    *oc = g->channels;
    return dx_by_winograd(g, out_ch, gt);
}

int64_t gp_cpu_conv2d_wt_floats(gp_device *dev, const gp_conv_geom *g, int64_t out_ch,
                                bool flipped) {
    (void)dev;
    gp_conv_geom gt;
    int64_t oc;
    return wt_geom(g, out_ch, flipped, &gt, &oc) ? gp_conv_winograd_wt_floats(&gt, oc) : 0;
}

gp_status gp_cpu_conv2d_wt(gp_device *dev, const gp_conv_geom *g, int64_t out_ch,
                           const float *w, bool flipped, float *wt) {
    gp_conv_geom gt;
    int64_t oc;
    if (!wt_geom(g, out_ch, flipped, &gt, &oc))
        return gp_error(GP_INVALID_ARGUMENT,
                        "conv2d_wt: the %s of this convolution (%lldx%lld kernel, stride %lld, "
                        "%lld -> %lld channels) takes no transformed weights (conv2d_wt_floats "
                        "is 0)",
                        flipped ? "input gradient" : "forward", (long long)g->kernel,
                        (long long)g->kernel, (long long)g->stride, (long long)g->channels,
                        (long long)out_ch);
    gp_conv_winograd_weights(dev, &gt, oc, w, flipped, wt);
    return GP_OK;
}

gp_status gp_cpu_conv2d_forward(gp_device *dev, const gp_conv_geom *g, int64_t batch,
                                int64_t out_ch, const float *x, const float *w, const float *wt,
                                float *y, float *ws) {
    if (gp_conv_winograd_serves(g, out_ch)) {
        gp_conv_winograd_forward(dev, g, batch, out_ch, x, w, wt, false, y, ws);
        return GP_OK;
    }
    if (gp_conv_direct_serves(g, out_ch)) {
        if (batch > 0) gp_conv_direct_forward(dev, g, batch, out_ch, x, w, y, ws);
        return GP_OK;
    }
    conv_args a = {.g = g, .batch = batch, .oc = out_ch, .x = x, .w = w, .y = y, .ws = ws};
    const int64_t e = chunk_examples(g);
    if (batch > 0)
        gp_cpu_pool_run(gp_cpu_pool_of(dev), conv_threads(dev, (batch + e - 1) / e),
                        conv_forward_part, &a);
    return GP_OK;
}

/* dy of ne examples (each (OC, P)) side by side: dyc (OC, ne P). */
static void gather_chunk(const float *dy, int64_t oc, int64_t npix, int64_t ne, float *dyc) {
    for (int64_t j = 0; j < ne; j++)
        for (int64_t o = 0; o < oc; o++)
            memcpy(dyc + o * ne * npix + j * npix, dy + (j * oc + o) * npix,
                   (size_t)npix * sizeof *dyc);
}

/* Weight gradient of the ne examples from x: pw (OC, K) = (beta pw) + dy . col^T, one GEMM
 * per chunk (per band of rows for a single large example). */
static void conv_dw_chunk(const conv_args *a, const float *x, const float *dy, int64_t ne,
                          float beta, float *pw, float *col, float *dyc) {
    const gp_conv_geom *g = a->g;
    const int64_t oc = a->oc, npix = npix_of(g), kdim = kdim_of(g);
    if (is_pointwise(g)) { /* dW (OC, C) += dy_b (OC, P) . x_b^T (P, C) */
        gp_cpu_sgemm(false, true, oc, kdim, npix, 1.0f, dy, npix, x, npix, beta, pw, kdim);
        return;
    }
    if (ne > 1) {
        const int64_t n = ne * npix;
        chunk_im2col(g, x, ne, col);
        gather_chunk(dy, oc, npix, ne, dyc);
        gp_cpu_sgemm(false, true, oc, kdim, n, 1.0f, dyc, n, col, n, beta, pw, kdim);
        return;
    }
    conv_bands(g, oc, x, col, true, dy, pw, beta);
}

/* dx of the ne examples from dy through dcol = W^T dy scattered back by col2im. */
static void conv_dx_col2im(const gp_conv_geom *g, int64_t oc, const float *w, const float *dy,
                           int64_t ne, float *dx, float *dcol, float *dyc) {
    const int64_t npix = npix_of(g), kdim = kdim_of(g);
    const int64_t in_elems = in_elems_of(g);
    if (is_pointwise(g)) { /* dx_b (C, P) = W^T . dy_b */
        gp_cpu_sgemm(true, false, kdim, npix, oc, 1.0f, w, kdim, dy, npix, 0.0f, dx, npix);
        return;
    }
    memset(dx, 0, (size_t)(ne * in_elems) * sizeof *dx);
    if (ne > 1) {
        const int64_t n = ne * npix;
        gather_chunk(dy, oc, npix, ne, dyc);
        gp_cpu_sgemm(true, false, kdim, n, oc, 1.0f, w, kdim, dyc, n, 0.0f, dcol, n);
        for (int64_t j = 0; j < ne; j++)
            col2im_add(g, dcol + j * npix, n, 0, g->out_h, dx + j * in_elems);
        return;
    }
    const int64_t band = band_rows(g);
    for (int64_t r0 = 0; r0 < g->out_h; r0 += band) {
        const int64_t r1 = r0 + band < g->out_h ? r0 + band : g->out_h;
        const int64_t n = (r1 - r0) * g->out_w;
        /* dcol (K, n) = W^T (K, OC) . dy (OC, n) */
        gp_cpu_sgemm(true, false, kdim, n, oc, 1.0f, w, kdim, dy + r0 * g->out_w, npix, 0.0f,
                     dcol, n);
        col2im_add(g, dcol, n, r0, r1, dx);
    }
}

/* Groups of part t: each group's weight gradient into its partial (the group's chunks in
 * order), and its examples' input gradients. */
static void conv_backward_part(void *ctx, int t, int nt) {
    const conv_args *a = ctx;
    const gp_conv_geom *g = a->g;
    const int64_t oc = a->oc, npix = npix_of(g), kdim = kdim_of(g), e = chunk_examples(g);
    const int64_t in_elems = in_elems_of(g);
    float *col = a->ws + a->L.partials + a->L.flipped + t * a->L.per_thread;
    float *dyc = col + a->L.col_x;
    float *dxws = dyc + a->L.dy_chunk; /* the flipped convolution's workspace, or dcol */
    gp_conv_geom gt;
    const bool by_conv = a->dx && gp_conv_dx_geom(g, oc, &gt);
    int64_t g0, g1;
    gp_cpu_split(a->groups, t, nt, 1, &g0, &g1);
    for (int64_t gi = g0; gi < g1; gi++) {
        int64_t lo, hi;
        gp_cpu_split(a->batch, (int)gi, (int)a->groups, 1, &lo, &hi);
        if (a->dw)
            for (int64_t b = lo; b < hi; b += e) {
                const int64_t ne = b + e < hi ? e : hi - b;
                conv_dw_chunk(a, a->x + b * in_elems, a->dy + b * oc * npix, ne,
                              b == lo ? 0.0f : 1.0f, a->partial + gi * oc * kdim, col, dyc);
            }
        if (!a->dx) continue;
        if (by_conv) {
            conv_examples(&gt, g->channels, a->wflip, a->dy, lo, hi, a->dx, dxws);
            continue;
        }
        for (int64_t b = lo; b < hi; b += e) {
            const int64_t ne = b + e < hi ? e : hi - b;
            conv_dx_col2im(g, oc, a->w, a->dy + b * oc * npix, ne, a->dx + b * in_elems, dxws,
                           dyc);
        }
    }
}

/* dw[i] += the group partials' sum, groups in order. */
static void conv_reduce_range(void *ctx, int64_t lo, int64_t hi) {
    const conv_args *a = ctx;
    const int64_t n = a->oc * kdim_of(a->g);
    const float *p = a->partial;
    float *dw = a->dw;
    for (int64_t i = lo; i < hi; i++) {
        float s = p[i];
        for (int64_t gi = 1; gi < a->groups; gi++) s += p[gi * n + i];
        dw[i] += s;
    }
}

static gp_status gemm_backward(gp_device *dev, const gp_conv_geom *g, int64_t batch,
                               int64_t out_ch, const float *x, const float *w, const float *dy,
                               float *dx, float *dw, float *ws);

gp_status gp_cpu_conv2d_backward(gp_device *dev, const gp_conv_geom *g, int64_t batch,
                                 int64_t out_ch, const float *x, const float *w, const float *wt,
                                 const float *dy, float *dx, float *dw, float *ws) {
    if (batch <= 0) return GP_OK;
    if (dw && gp_conv_winograd_dw_serves(g, batch, out_ch)) {
        gp_conv_winograd_dw(dev, g, batch, out_ch, x, dy, dw, ws);
        dw = NULL;
    }
    gp_conv_geom gt;
    if (dx && dx_by_winograd(g, out_ch, &gt)) { /* dx = conv(dy) with the flipped weights */
        gp_conv_winograd_forward(dev, &gt, batch, g->channels, dy, w, wt, true, dx, ws);
        dx = NULL;
    }
    if (!dx && !dw) return GP_OK;
    if (gp_conv_direct_serves(g, out_ch)) { /* dx by im2col where the direct path has none */
        const bool dx_direct = dx && gp_conv_direct_dx(g, out_ch);
        gp_conv_direct_backward(dev, g, batch, out_ch, x, w, dy, dx_direct ? dx : NULL, dw, ws);
        if (!dx || dx_direct) return GP_OK;
        return gemm_backward(dev, g, batch, out_ch, x, w, dy, dx, NULL,
                             ws + gp_conv_direct_ws(dev, g, batch, out_ch, true, false));
    }
    return gemm_backward(dev, g, batch, out_ch, x, w, dy, dx, dw, ws);
}

/* The im2col path's backward (also the direct path's input gradient where it has none:
 * gp_conv_direct_dx). */
static gp_status gemm_backward(gp_device *dev, const gp_conv_geom *g, int64_t batch,
                               int64_t out_ch, const float *x, const float *w, const float *dy,
                               float *dx, float *dw, float *ws) {
    const int64_t groups = conv_groups(g, batch);
    conv_args a = {.g = g, .batch = batch, .oc = out_ch, .groups = groups, .x = x, .w = w,
                   .dy = dy, .dx = dx, .dw = dw, .ws = ws, .partial = ws,
                   .L = bwd_layout(g, batch, out_ch, dx != NULL)};
    if (a.L.flipped) {
        gp_conv_flip_weights(g, out_ch, w, ws + a.L.partials);
        a.wflip = ws + a.L.partials;
    }
    gp_cpu_pool *pool = gp_cpu_pool_of(dev);
    gp_cpu_pool_run(pool, conv_threads(dev, groups), conv_backward_part, &a);
    if (dw)
        gp_cpu_parallel_for(pool, out_ch * kdim_of(g), 16, 4096, conv_reduce_range, &a);
    return GP_OK;
}

/* Sums in double over a channel's planes (`planes` planes of hw floats, `stride` floats apart):
 * independent lanes combined once in a fixed tree. That vectorizes without -ffast-math, and the
 * order is set by this code, not the compiler: within a plane, runs of 32 floats go to the 32
 * lanes, then runs of 8 to the first 8, and the last few, summed in order, to lane 0; planes in
 * order, the lanes carried from one to the next. 32 lanes are 8 vectors of 4 doubles, so the
 * additions wait on no latency (8 lanes summed per plane did: 2 floats a cycle, batch norm at
 * 4-9 GB/s on C1's and the Fashion demo's shapes). No lane is indexed by a variable, so the
 * lanes stay in registers. */
#define F64_LANES 32
#define F64_SHORT 8

static double combine(double acc[F64_LANES]) {
    for (int w = F64_LANES / 2; w > 0; w /= 2)
        for (int j = 0; j < w; j++) acc[j] += acc[j + w];
    return acc[0];
}

/* F(lane, element) over the channel's planes, in the order above. */
#define CHANNEL_SUM(planes, hw, stride, F)                                                     \
    for (int64_t b_ = 0; b_ < (planes); b_++) {                                               \
        const int64_t o_ = b_ * (stride);                                                      \
        int64_t i_ = 0;                                                                        \
        for (; i_ + F64_LANES <= (hw); i_ += F64_LANES)                                        \
            for (int j = 0; j < F64_LANES; j++) F(j, o_ + i_ + j);                             \
        for (; i_ + F64_SHORT <= (hw); i_ += F64_SHORT)                                        \
            for (int j = 0; j < F64_SHORT; j++) F(j, o_ + i_ + j);                             \
        for (; i_ < (hw); i_++) F(0, o_ + i_);                                                 \
    }

static double sum_f64(const float *x, int64_t planes, int64_t hw, int64_t stride) {
    double acc[F64_LANES] = {0};
#define ADD_X(j, k) acc[j] += (double)x[k];
    CHANNEL_SUM(planes, hw, stride, ADD_X)
#undef ADD_X
    return combine(acc);
}

static double sumsq_dev_f64(const float *x, int64_t planes, int64_t hw, int64_t stride,
                            double mean) {
    double acc[F64_LANES] = {0};
#define ADD_SQ(j, k)                           \
    {                                          \
        const double d_ = (double)x[k] - mean; \
        acc[j] += d_ * d_;                     \
    }
    CHANNEL_SUM(planes, hw, stride, ADD_SQ)
#undef ADD_SQ
    return combine(acc);
}

/* The sum of a and the sum of a (b - mean_b), in one pass over both. */
static void sum_and_dot_dev_f64(const float *a, const float *b, int64_t planes, int64_t hw,
                                int64_t stride, double mean_b, double *sum_a, double *dot) {
    double acc[F64_LANES] = {0}, dacc[F64_LANES] = {0};
#define ADD_BOTH(j, k)                                \
    {                                                 \
        const double v_ = (double)a[k];               \
        acc[j] += v_;                                 \
        dacc[j] += v_ * ((double)b[k] - mean_b);      \
    }
    CHANNEL_SUM(planes, hw, stride, ADD_BOTH)
#undef ADD_BOTH
    *sum_a = combine(acc);
    *dot = combine(dacc);
}

/* ------------------------------------------------------------ channel bias */

typedef struct plane_args {
    int64_t batch, channels, hw, planes;
    const gp_bn_dims *bn;
    const gp_pool_dims *pd;
    const float *x, *dy, *gamma, *beta, *stats, *bias;
    float *y, *dx, *dgamma, *dbeta, *running_mean, *running_var, *out_stats, *db;
    const int32_t *argmax_in;
    int32_t *argmax;
    bool batch_stats, update_running;
} plane_args;

/* Work per thread below which a plane-wise op stays on one thread (floats touched). */
#define PLANE_GRAIN 16384
static int64_t plane_grain(int64_t floats_per_item) {
    return floats_per_item >= PLANE_GRAIN ? 1 : PLANE_GRAIN / (floats_per_item > 0 ? floats_per_item : 1);
}

static void bias_add_range(void *ctx, int64_t lo, int64_t hi) {
    const plane_args *a = ctx;
    const int64_t npix = a->hw;
    for (int64_t bo = lo; bo < hi; bo++) { /* plane bo = b * channels + o */
        const float bv = a->bias[bo % a->channels];
        float *row = a->y + bo * npix;
        for (int64_t p = 0; p < npix; p++) row[p] += bv;
    }
}

gp_status gp_cpu_channel_bias_add(gp_device *dev, int64_t batch, int64_t channels, int64_t npix,
                                  const float *bias, float *y) {
    plane_args a = {.channels = channels, .hw = npix, .bias = bias, .y = y};
    gp_cpu_parallel_for(gp_cpu_pool_of(dev), batch * channels, 1, plane_grain(npix),
                        bias_add_range, &a);
    return GP_OK;
}

static void bias_grad_range(void *ctx, int64_t lo, int64_t hi) {
    const plane_args *a = ctx;
    const int64_t channels = a->channels, npix = a->hw;
    for (int64_t o = lo; o < hi; o++) {
        /* examples in order: the same sum whichever order channels go in */
        a->db[o] += (float)sum_f64(a->dy + o * npix, a->batch, npix, channels * npix);
    }
}

gp_status gp_cpu_channel_bias_grad(gp_device *dev, int64_t batch, int64_t channels,
                                   int64_t npix, const float *dy, float *db) {
    plane_args a = {.batch = batch, .channels = channels, .hw = npix, .dy = dy, .db = db};
    gp_cpu_parallel_for(gp_cpu_pool_of(dev), channels, 1, plane_grain(batch * npix),
                        bias_grad_range, &a);
    return GP_OK;
}

/* -------------------------------------------------------------- batch norm */

/* Outputs beyond this many bytes go to memory with streaming stores: they would not stay in the
 * caches, and ordinary stores first read every line they write (the normalization's stores
 * were half of batch norm's forward on C1's 12.85 MB). */
#define STREAM_BYTES ((int64_t)8 << 20)

static bool streams(const gp_bn_dims *d) {
    return d->batch * d->channels * d->hw * (int64_t)sizeof(float) > STREAM_BYTES;
}

/* y = (x - m) * scale + shift over n floats, as the scalar expression rounds it (no FMA). */
#if GP_HAVE_AVX2
static void normalize_plane(const float *x, int64_t n, float m, float scale, float shift,
                            bool stream, float *y) {
    int64_t i = 0;
    if (stream) {
        const __m256 vm = _mm256_set1_ps(m), vs = _mm256_set1_ps(scale),
                     vb = _mm256_set1_ps(shift);
        for (; i < n && ((uintptr_t)(y + i) & 31) != 0; i++) y[i] = (x[i] - m) * scale + shift;
        for (; i + 8 <= n; i += 8) {
            const __m256 v = _mm256_sub_ps(_mm256_loadu_ps(x + i), vm);
            _mm256_stream_ps(y + i, _mm256_add_ps(_mm256_mul_ps(v, vs), vb));
        }
    }
    for (; i < n; i++) y[i] = (x[i] - m) * scale + shift;
}

/* dx = k1 (dy - ma - (x - m) bc) over n floats, as the scalar expression rounds it. */
static void input_grad_plane(const float *x, const float *dy, int64_t n, float m,
                             float k1, float ma, float bc, bool stream, float *dx) {
    int64_t i = 0;
    if (stream) {
        const __m256 vm = _mm256_set1_ps(m), vk = _mm256_set1_ps(k1), va = _mm256_set1_ps(ma),
                     vc = _mm256_set1_ps(bc);
        for (; i < n && ((uintptr_t)(dx + i) & 31) != 0; i++)
            dx[i] = k1 * (dy[i] - ma - (x[i] - m) * bc);
        for (; i + 8 <= n; i += 8) {
            const __m256 xc = _mm256_mul_ps(_mm256_sub_ps(_mm256_loadu_ps(x + i), vm), vc);
            const __m256 d = _mm256_sub_ps(_mm256_sub_ps(_mm256_loadu_ps(dy + i), va), xc);
            _mm256_stream_ps(dx + i, _mm256_mul_ps(vk, d));
        }
    }
    for (; i < n; i++) dx[i] = k1 * (dy[i] - ma - (x[i] - m) * bc);
}

/* Streaming stores are ordered by a fence before another thread reads what they wrote. */
static void finish_streams(void) { _mm_sfence(); }
#else
static void normalize_plane(const float *x, int64_t n, float m, float scale, float shift,
                            bool stream, float *y) {
    (void)stream;
    for (int64_t i = 0; i < n; i++) y[i] = (x[i] - m) * scale + shift;
}
static void input_grad_plane(const float *x, const float *dy, int64_t n, float m, float k1,
                             float ma, float bc, bool stream, float *dx) {
    (void)stream;
    for (int64_t i = 0; i < n; i++) dx[i] = k1 * (dy[i] - ma - (x[i] - m) * bc);
}
static void finish_streams(void) {}
#endif

static void bn_forward_range(void *ctx, int64_t lo, int64_t hi) {
    const plane_args *a = ctx;
    const gp_bn_dims *d = a->bn;
    const int64_t batch = d->batch, nch = d->channels, hw = d->hw, count = batch * hw;
    const float *x = a->x;
    float *mean_out = a->out_stats, *invstd_out = a->out_stats + nch; /* (C), (C) */
    const bool stream = streams(d);
    for (int64_t c = lo; c < hi; c++) {
        double mean, invstd;
        if (a->batch_stats) {
            mean = sum_f64(x + c * hw, batch, hw, nch * hw) / (double)count;
            const double ss = sumsq_dev_f64(x + c * hw, batch, hw, nch * hw, mean);
            double var = ss / (double)count; /* biased: normalizes */
            invstd = 1.0 / sqrt(var + d->eps);
            if (a->update_running) {
                double unbiased = ss / (double)(count - 1);
                a->running_mean[c] =
                    (float)((1.0 - d->momentum) * a->running_mean[c] + d->momentum * mean);
                a->running_var[c] =
                    (float)((1.0 - d->momentum) * a->running_var[c] + d->momentum * unbiased);
            }
        } else {
            mean = a->running_mean[c];
            invstd = 1.0 / sqrt((double)a->running_var[c] + d->eps);
        }
        const float m = (float)mean, is = (float)invstd;
        const float scale = a->gamma[c] * is, shift = a->beta[c];
        mean_out[c] = m;
        invstd_out[c] = is;
        for (int64_t b = 0; b < batch; b++)
            normalize_plane(x + (b * nch + c) * hw, hw, m, scale, shift, stream,
                            a->y + (b * nch + c) * hw);
    }
    finish_streams();
}

gp_status gp_cpu_batchnorm_forward(gp_device *dev, const gp_bn_dims *d, const float *x,
                                   const float *gamma, const float *beta, float *running_mean,
                                   float *running_var, bool batch_stats, bool update_running,
                                   float *stats, float *y) {
    plane_args a = {.bn = d, .x = x, .gamma = gamma, .beta = beta, .running_mean = running_mean,
                    .running_var = running_var, .batch_stats = batch_stats,
                    .update_running = update_running, .out_stats = stats, .y = y};
    gp_cpu_parallel_for(gp_cpu_pool_of(dev), d->channels, 1, plane_grain(3 * d->batch * d->hw),
                        bn_forward_range, &a);
    return GP_OK;
}

static void bn_backward_range(void *ctx, int64_t lo, int64_t hi) {
    const plane_args *a = ctx;
    const gp_bn_dims *d = a->bn;
    const int64_t batch = d->batch, nch = d->channels, hw = d->hw;
    const double count = (double)(batch * hw);
    const float *mean_in = a->stats, *invstd_in = a->stats + nch;
    const float *x = a->x, *dy = a->dy;
    const bool stream = streams(d);
    for (int64_t c = lo; c < hi; c++) {
        const float m = mean_in[c], is = invstd_in[c];
        double sdy, sdy_xc; /* sum dy, sum dy * (x - mean) */
        sum_and_dot_dev_f64(dy + c * hw, x + c * hw, batch, hw, nch * hw, (double)m, &sdy,
                            &sdy_xc);
        const double sdy_xhat = sdy_xc * is; /* sum dy * xhat */
        a->dgamma[c] += (float)sdy_xhat;
        a->dbeta[c] += (float)sdy;
        if (!a->dx) continue;
        const float k1 = a->gamma[c] * is;
        /* batch statistics: dx = gamma*invstd * (dy - mean(dy) - xhat * mean(dy*xhat));
         * running statistics are constants: dx = gamma*invstd * dy. */
        const float ma = a->batch_stats ? (float)(sdy / count) : 0.0f;
        const float bc = a->batch_stats ? (float)(sdy_xhat / count * is) : 0.0f;
        for (int64_t b = 0; b < batch; b++) {
            const int64_t at = (b * nch + c) * hw;
            input_grad_plane(x + at, dy + at, hw, m, k1, ma, bc, stream, a->dx + at);
        }
    }
    finish_streams();
}

gp_status gp_cpu_batchnorm_backward(gp_device *dev, const gp_bn_dims *d, const float *x,
                                    const float *dy, const float *stats, const float *gamma,
                                    bool batch_stats, float *dx, float *dgamma, float *dbeta) {
    plane_args a = {.bn = d, .x = x, .dy = dy, .stats = stats, .gamma = gamma,
                    .batch_stats = batch_stats, .dx = dx, .dgamma = dgamma, .dbeta = dbeta};
    gp_cpu_parallel_for(gp_cpu_pool_of(dev), d->channels, 1, plane_grain(4 * d->batch * d->hw),
                        bn_backward_range, &a);
    return GP_OK;
}

/* ----------------------------------------------------------------- pooling */

/* The first maximum in window order, except that a NaN wins (the last NaN): branch-free, since
 * random data mispredicts an if. */
#define POOL_TAKE(v, i)                                  \
    do {                                                 \
        const bool take_ = ((v) > best) | ((v) != (v));  \
        best = take_ ? (v) : best;                       \
        idx = take_ ? (i) : idx;                         \
    } while (0)

/* 2x2 windows at stride 2, every ConvNet's pooling: the window loops unrolled. */
static void maxpool2_forward(const float *xp, int64_t w, int64_t oh_n, int64_t ow_n, float *yp,
                             int32_t *ap) {
    for (int64_t oh = 0; oh < oh_n; oh++) {
        const float *r0 = xp + 2 * oh * w, *r1 = r0 + w;
        const int32_t base = (int32_t)(2 * oh * w);
        for (int64_t ow = 0; ow < ow_n; ow++) {
            const int32_t i = base + (int32_t)(2 * ow);
            float best = -INFINITY;
            int32_t idx = i;
            POOL_TAKE(r0[2 * ow], i);
            POOL_TAKE(r0[2 * ow + 1], i + 1);
            POOL_TAKE(r1[2 * ow], i + (int32_t)w);
            POOL_TAKE(r1[2 * ow + 1], i + (int32_t)w + 1);
            yp[oh * ow_n + ow] = best;
            ap[oh * ow_n + ow] = idx;
        }
    }
}

#if GP_HAVE_AVX2
/* Lane j takes element 2j of (lo, hi), or 2j + 1 with odd: a row's left or right window
 * columns, in window order. */
static __m256 pool_columns(__m256 lo, __m256 hi, bool odd) {
    const __m256 q = odd ? _mm256_shuffle_ps(lo, hi, _MM_SHUFFLE(3, 1, 3, 1))
                         : _mm256_shuffle_ps(lo, hi, _MM_SHUFFLE(2, 0, 2, 0));
    return _mm256_castpd_ps(_mm256_permute4x64_pd(_mm256_castps_pd(q), _MM_SHUFFLE(3, 1, 2, 0)));
}

/* maxpool2_forward, eight windows a vector: each lane makes POOL_TAKE's choices in the same
 * order (its first value taken as it is, whatever it is), so values and indices are the
 * scalar code's bit for bit. A row's last windows are loaded under a mask (C1's rows are 14 and
 * 7 windows wide). */
static void maxpool2_forward_avx2(const float *xp, int64_t w, int64_t oh_n, int64_t ow_n,
                                  float *yp, int32_t *ap) {
    const __m256i lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    const __m256i even = _mm256_add_epi32(lane, lane);
    for (int64_t oh = 0; oh < oh_n; oh++) {
        const float *r0 = xp + 2 * oh * w, *r1 = r0 + w;
        for (int64_t ow = 0; ow < ow_n; ow += 8) {
            const int n = ow_n - ow < 8 ? (int)(ow_n - ow) : 8;
            const float *p0 = r0 + 2 * ow, *p1 = r1 + 2 * ow;
            __m256 a0, a1, b0, b1;
            if (n == 8) {
                a0 = _mm256_loadu_ps(p0), a1 = _mm256_loadu_ps(p0 + 8);
                b0 = _mm256_loadu_ps(p1), b1 = _mm256_loadu_ps(p1 + 8);
            } else {
                /* the row's 2n columns left: lanes below 2n of the first, 2n - 8 of the second */
                const __m256i in_lo = _mm256_cmpgt_epi32(_mm256_set1_epi32(2 * n), lane);
                const __m256i in_hi = _mm256_cmpgt_epi32(_mm256_set1_epi32(2 * n - 8), lane);
                a0 = _mm256_maskload_ps(p0, in_lo), a1 = _mm256_maskload_ps(p0 + 8, in_hi);
                b0 = _mm256_maskload_ps(p1, in_lo), b1 = _mm256_maskload_ps(p1 + 8, in_hi);
            }
            const __m256i i0 =
                _mm256_add_epi32(_mm256_set1_epi32((int32_t)(2 * oh * w + 2 * ow)), even);
            const __m256 cand[3] = {pool_columns(a0, a1, true), pool_columns(b0, b1, false),
                                    pool_columns(b0, b1, true)};
            const int32_t step[3] = {1, (int32_t)w, (int32_t)w + 1};
            __m256 best = pool_columns(a0, a1, false);
            __m256 idx = _mm256_castsi256_ps(i0);
            for (int c = 0; c < 3; c++) {
                const __m256 v = cand[c];
                const __m256 take = _mm256_or_ps(_mm256_cmp_ps(v, best, _CMP_GT_OQ),
                                                 _mm256_cmp_ps(v, v, _CMP_UNORD_Q));
                const __m256i at = _mm256_add_epi32(i0, _mm256_set1_epi32(step[c]));
                best = _mm256_blendv_ps(best, v, take);
                idx = _mm256_blendv_ps(idx, _mm256_castsi256_ps(at), take);
            }
            float *yo = yp + oh * ow_n + ow;
            int32_t *ao = ap + oh * ow_n + ow;
            if (n == 8) {
                _mm256_storeu_ps(yo, best);
                _mm256_storeu_si256((__m256i *)ao, _mm256_castps_si256(idx));
            } else { /* (a masked store is microcoded, slow, on AMD's cores) */
                float yv[8];
                int32_t av[8];
                _mm256_storeu_ps(yv, best);
                _mm256_storeu_si256((__m256i *)av, _mm256_castps_si256(idx));
                memcpy(yo, yv, (size_t)n * sizeof *yo);
                memcpy(ao, av, (size_t)n * sizeof *ao);
            }
        }
    }
}
#endif

static void maxpool_forward_range(void *ctx, int64_t lo, int64_t hi) {
    const plane_args *a = ctx;
    const gp_pool_dims *d = a->pd;
    const int64_t h = d->height, w = d->width, oh_n = d->out_h, ow_n = d->out_w;
    const int64_t k = d->kernel, s = d->stride;
    if (k == 2 && s == 2) {
        void (*plane)(const float *, int64_t, int64_t, int64_t, float *, int32_t *) =
            maxpool2_forward;
#if GP_HAVE_AVX2
        plane = maxpool2_forward_avx2;
#endif
        for (int64_t p = lo; p < hi; p++)
            plane(a->x + p * h * w, w, oh_n, ow_n, a->y + p * oh_n * ow_n,
                  a->argmax + p * oh_n * ow_n);
        return;
    }
    for (int64_t p = lo; p < hi; p++) {
        const float *xp = a->x + p * h * w;
        float *yp = a->y + p * oh_n * ow_n;
        int32_t *ap = a->argmax + p * oh_n * ow_n;
        for (int64_t oh = 0; oh < oh_n; oh++)
            for (int64_t ow = 0; ow < ow_n; ow++) {
                int64_t first = oh * s * w + ow * s, idx = first;
                float best = -INFINITY;
                for (int64_t ki = 0; ki < k; ki++)
                    for (int64_t kj = 0; kj < k; kj++) POOL_TAKE(xp[first + ki * w + kj], first + ki * w + kj);
                yp[oh * ow_n + ow] = best;
                ap[oh * ow_n + ow] = (int32_t)idx;
            }
    }
}

gp_status gp_cpu_maxpool_forward(gp_device *dev, const gp_pool_dims *d, const float *x, float *y,
                                 int32_t *argmax) {
    plane_args a = {.pd = d, .x = x, .y = y, .argmax = argmax};
    gp_cpu_parallel_for(gp_cpu_pool_of(dev), d->planes, 1, plane_grain(d->height * d->width),
                        maxpool_forward_range, &a);
    return GP_OK;
}

static void maxpool_backward_range(void *ctx, int64_t lo, int64_t hi) {
    const plane_args *a = ctx;
    const gp_pool_dims *d = a->pd;
    const int64_t hw = d->height * d->width, ohw = d->out_h * d->out_w;
    memset(a->dx + lo * hw, 0, (size_t)((hi - lo) * hw) * sizeof *a->dx);
    for (int64_t p = lo; p < hi; p++) {
        float *dxp = a->dx + p * hw;
        const float *dyp = a->dy + p * ohw;
        const int32_t *ap = a->argmax_in + p * ohw;
        /* overlapping windows (stride < kernel) add in output order */
        for (int64_t i = 0; i < ohw; i++) dxp[ap[i]] += dyp[i];
    }
}

gp_status gp_cpu_maxpool_backward(gp_device *dev, const gp_pool_dims *d, const int32_t *argmax,
                                  const float *dy, float *dx) {
    plane_args a = {.pd = d, .argmax_in = argmax, .dy = dy, .dx = dx};
    gp_cpu_parallel_for(gp_cpu_pool_of(dev), d->planes, 1, plane_grain(d->height * d->width),
                        maxpool_backward_range, &a);
    return GP_OK;
}

static void avgpool_forward_range(void *ctx, int64_t lo, int64_t hi) {
    const plane_args *a = ctx;
    for (int64_t p = lo; p < hi; p++)
        a->y[p] = (float)(sum_f64(a->x + p * a->hw, 1, a->hw, a->hw) / (double)a->hw);
}

gp_status gp_cpu_avgpool_forward(gp_device *dev, int64_t planes, int64_t hw, const float *x,
                                 float *y) {
    plane_args a = {.hw = hw, .x = x, .y = y};
    gp_cpu_parallel_for(gp_cpu_pool_of(dev), planes, 1, plane_grain(hw), avgpool_forward_range,
                        &a);
    return GP_OK;
}

static void avgpool_backward_range(void *ctx, int64_t lo, int64_t hi) {
    const plane_args *a = ctx;
    const int64_t hw = a->hw;
    for (int64_t p = lo; p < hi; p++) {
        float g = a->dy[p] / (float)hw, *dxp = a->dx + p * hw;
        for (int64_t i = 0; i < hw; i++) dxp[i] = g;
    }
}

gp_status gp_cpu_avgpool_backward(gp_device *dev, int64_t planes, int64_t hw, const float *dy,
                                  float *dx) {
    plane_args a = {.hw = hw, .dy = dy, .dx = dx};
    gp_cpu_parallel_for(gp_cpu_pool_of(dev), planes, 1, plane_grain(hw), avgpool_backward_range,
                        &a);
    return GP_OK;
}
