/* The direct convolution: its tile, the passes over one example or a chunk, and the device's
 * threads around them (see conv_direct.h). */
#include "kernels/cpu/conv_direct.h"

#include "kernels/cpu/conv_geom.h"
#include "kernels/cpu/conv_path.h"
#include "kernels/cpu/pool.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/cpu/simd.h"
#if !GP_HAVE_AVX2
#include <math.h>
#endif

/* The tables of offsets live in the float workspace, 4 bytes an entry. */
_Static_assert(sizeof(int32_t) == sizeof(float), "offset tables share the float workspace");

/* Tiles: MR_WIDEST rows x 3 vectors, MR_WIDE rows x 2 or MR_NARROW rows x 1, of 8 floats. With
 * AVX-512 the widest tile's 24 columns are a 16-lane and an 8-lane vector, and its 8 rows give
 * 16 accumulators: 8 broadcasts and 2 loads per 16 multiply-adds of 192 products against 4 and 3
 * per 12 of 96 (the wider forms' sums per element run in the same order: the same bits). */
#if GP_HAVE_AVX512
#define MR_WIDEST 8
#else
#define MR_WIDEST 4
#endif
#define MR_WIDE 6
#define MR_NARROW 8
#define MR_MAX 8
#define LANES 8
/* Taps below which the im2col path is kept: a 3x3 convolution of one channel (a network's
 * first) has too few multiply-adds per tile for the tile's stores and the weight gradient's
 * transposed dy to pay (measured slower than im2col, 20 against 22 GFLOP/s). */
#define MIN_TAPS 16
/* One example's buffers (floats) beyond which the im2col path is kept. */
#define DIRECT_MAX_FLOATS ((int64_t)1 << 23)

/* Output channels go in panels of 24 (a 4 x 24 tile: 12 accumulators, 3 loads and 4
 * broadcasts per 12 multiply-adds) where they are a multiple of 24, else in panels of 16 (6 x
 * 16: 2 loads and 6 broadcasts) and a last panel of 8 (an 8 x 8 tile) where 8 or fewer are
 * left. On the Fashion demo's 24-channel layers the 4 x 24 tile took 4% less of the step than
 * 16 + 8 (CPU time, alternating runs); a 12 x 8 tile would need more pointers than there are
 * registers. */
#define WIDE (2 * LANES)
#define WIDEST (3 * LANES)
static bool by_24(int64_t oc) { return oc % WIDEST == 0; }
/* With AVX-512, output channels that are a multiple of 48 go in panels of 48: an 8 x 48 tile of
 * three 16-lane vectors, 24 accumulators, 8 broadcasts and 3 loads per 24 multiply-adds (the
 * 8 x 24 tile's 16 multiply-adds hold 8 and 16 lanes: 192 products against 384). */
#if GP_HAVE_AVX512
#define PANEL_MAX (6 * LANES)
static bool by_48(int64_t oc) { return oc % PANEL_MAX == 0; }
#else
#define PANEL_MAX WIDEST
static bool by_48(int64_t oc) { (void)oc; return false; }
#endif
static int64_t wide_panels(int64_t oc) {
    return oc % WIDE > LANES || oc % WIDE == 0 ? (oc + WIDE - 1) / WIDE : oc / WIDE;
}
static bool narrow_panel(int64_t oc) { return oc % WIDE > 0 && oc % WIDE <= LANES; }

static int64_t oc_padded(int64_t oc) {
    return by_24(oc) ? oc : wide_panels(oc) * WIDE + (narrow_panel(oc) ? LANES : 0);
}

static int64_t kdim(const gp_conv_geom *g) { return g->channels * g->kernel * g->kernel; }
static int64_t npix(const gp_conv_geom *g) { return g->out_h * g->out_w; }
static int64_t padded_w(const gp_conv_geom *g) { return g->width + 2 * g->pad; }
static int64_t padded_h(const gp_conv_geom *g) { return g->height + 2 * g->pad; }
/* Floats of the padded copy of one example (none without padding: x itself is read). */
static int64_t xpad_floats(const gp_conv_geom *g) {
    return g->pad > 0 ? g->channels * padded_h(g) * padded_w(g) : 0;
}

static int64_t packed_floats(const gp_conv_geom *g, int64_t oc) {
    return oc_padded(oc) * kdim(g);
}

static int64_t forward_floats(const gp_conv_geom *g) {
    return xpad_floats(g) + kdim(g);
}

/* Pixels of a weight-gradient chunk: each tile runs over all of them (a 7x7 image alone would
 * give it 49 steps between stores), and the threads split the chunk's tiles, waking once per
 * chunk. */
#define DW_CHUNK_PIX 1024
static int64_t dw_example_floats(const gp_conv_geom *g, int64_t oc) {
    return xpad_floats(g) + npix(g) * (oc_padded(oc) + 1);
}

static int64_t dw_chunk(const gp_conv_geom *g, int64_t oc, int64_t batch) {
    const int64_t P = npix(g) > 0 ? npix(g) : 1;
    int64_t e = (DW_CHUNK_PIX + P - 1) / P;
    const int64_t fit = DIRECT_MAX_FLOATS / dw_example_floats(g, oc);
    if (e > fit) e = fit;
    if (e > batch) e = batch;
    return e < 1 ? 1 : e;
}

static int64_t dw_floats(const gp_conv_geom *g, int64_t oc, int64_t batch) {
    return dw_chunk(g, oc, batch) * dw_example_floats(g, oc) + kdim(g);
}

/* dy's copy for the input gradient at strides above 1 (see the phases below). */
typedef struct phase_geom {
    int64_t lead, Hq, Wq; /* dy's copy: zeros before each row and column, rows, columns */
} phase_geom;

static phase_geom phase_geom_of(const gp_conv_geom *g) {
    const int64_t s = g->stride, lead = (g->kernel + s - 1) / s - 1;
    const int64_t last_h = (g->height - 1 + g->pad) / s, last_w = (g->width - 1 + g->pad) / s;
    return (phase_geom){.lead = lead,
                        .Hq = lead + (last_h + 1 > g->out_h ? last_h + 1 : g->out_h),
                        .Wq = lead + (last_w + 1 > g->out_w ? last_w + 1 : g->out_w)};
}

bool gp_conv_direct_serves(const gp_conv_geom *g, int64_t oc) {
    if (!GP_HAVE_AVX2 || !gp_conv_path_on(GP_CONV_DIRECT) || oc <= 0 || kdim(g) < MIN_TAPS)
        return false;
    const int64_t image = g->channels * padded_h(g) * padded_w(g);
    /* one example within bounds; a chunk of them is then too (dw_chunk) */
    const phase_geom q = phase_geom_of(g);
    if (g->stride > 1 && (oc * q.Hq * q.Wq >= INT32_MAX || oc * q.Hq * q.Wq > DIRECT_MAX_FLOATS))
        return false;
    return image * (dw_chunk(g, oc, INT32_MAX) + 1) < INT32_MAX &&
           dw_example_floats(g, oc) + kdim(g) <= DIRECT_MAX_FLOATS &&
           forward_floats(g) <= DIRECT_MAX_FLOATS;
}

/* ------------------------------------------------------------------- tile */

/* out (MR, NR x 8) = sum over steps t < n of broadcast(rows[i][steps[t]]) x b[t bstride ..]
 * (NR vectors), t in order. */
#if GP_HAVE_AVX2
/* The accumulators are named variables, not an array: GCC keeps an array of vectors in
 * registers but also stores it to the stack every step, which halves the tile's speed. */
#define ZERO1(i) __m256 c##i##0 = _mm256_setzero_ps();
#define ZERO2(i) ZERO1(i) __m256 c##i##1 = _mm256_setzero_ps();
#define ZERO3(i) ZERO2(i) __m256 c##i##2 = _mm256_setzero_ps();
#define ROW(i) const float *r##i = rows[i];
#define FMA1(i)                                      \
    const __m256 a##i = _mm256_broadcast_ss(r##i + s); \
    c##i##0 = _mm256_fmadd_ps(a##i, b0, c##i##0);
#define FMA2(i) FMA1(i) c##i##1 = _mm256_fmadd_ps(a##i, b1, c##i##1);
#define FMA3(i) FMA2(i) c##i##2 = _mm256_fmadd_ps(a##i, b2, c##i##2);
#define PUT1(i, nr) _mm256_storeu_ps(out + ((i) * (nr)) * LANES, c##i##0);
#define PUT2(i, nr) PUT1(i, nr) _mm256_storeu_ps(out + ((i) * (nr) + 1) * LANES, c##i##1);
#define PUT3(i, nr) PUT2(i, nr) _mm256_storeu_ps(out + ((i) * (nr) + 2) * LANES, c##i##2);
#define LOADB1 const __m256 b0 = _mm256_loadu_ps(b);
#define LOADB2 LOADB1 const __m256 b1 = _mm256_loadu_ps(b + LANES);
/* (three vectors of B: kept in registers, which GCC would instead reload into every
 * multiply-add, 16 loads a step) */
#define LOADB3                                                                                 \
    __m256 b0 = _mm256_loadu_ps(b), b1 = _mm256_loadu_ps(b + LANES),                          \
           b2 = _mm256_loadu_ps(b + 2 * LANES);                                                \
    __asm__("" : "+x"(b0), "+x"(b1), "+x"(b2));
#define ROWS4(M) M(0) M(1) M(2) M(3)
#define ROWS6(M) ROWS4(M) M(4) M(5)
#define ROWS8(M) ROWS6(M) M(6) M(7)
#define PUTS4(M, nr) M(0, nr) M(1, nr) M(2, nr) M(3, nr)
#define PUTS6(M, nr) PUTS4(M, nr) M(4, nr) M(5, nr)
#define PUTS8(M, nr) PUTS6(M, nr) M(6, nr) M(7, nr)
#define DEFINE_TILE(NR, MR)                                                                    \
    static void tile_##NR(const float *const *rows, const int32_t *steps, int64_t n,           \
                          const float *b, int64_t bstride, float *out) {                       \
        ROWS##MR(ROW) ROWS##MR(ZERO##NR)                                                       \
        for (int64_t t = 0; t < n; t++, b += bstride) {                                        \
            const int64_t s = steps[t];                                                        \
            LOADB##NR ROWS##MR(FMA##NR)                                                        \
        }                                                                                      \
        PUTS##MR(PUT##NR, NR)                                                                  \
    }
#else /* the same sums in plain C: the path is never chosen here (applies() is false) */
#define DEFINE_TILE(NR, MR)                                                                    \
    static void tile_##NR(const float *const *rows, const int32_t *steps, int64_t n,           \
                          const float *b, int64_t bstride, float *out) {                       \
        memset(out, 0, sizeof(float) * MR * NR * LANES);                                       \
        for (int64_t t = 0; t < n; t++, b += bstride)                                          \
            for (int i = 0; i < MR; i++)                                                       \
                for (int j = 0; j < NR * LANES; j++)                                           \
                    out[i * NR * LANES + j] =                                          \
                        fmaf(rows[i][steps[t]], b[j], out[i * NR * LANES + j]);               \
    }
#endif
DEFINE_TILE(1, 8)
DEFINE_TILE(2, 6)
#if GP_HAVE_AVX512
#define ZEROZ(i) __m512 z##i = _mm512_setzero_ps(); __m256 c##i = _mm256_setzero_ps();
#define FMAZ(i)                                                                                \
    {                                                                                          \
        const __m512 a = _mm512_set1_ps(r##i[s]);                                              \
        z##i = _mm512_fmadd_ps(a, b0, z##i);                                                   \
        c##i = _mm256_fmadd_ps(_mm512_castps512_ps256(a), b1, c##i);                           \
    }
#define PUTZ(i, nr)                                                                            \
    _mm512_storeu_ps(out + (i) * WIDEST, z##i);                                                \
    _mm256_storeu_ps(out + (i) * WIDEST + 2 * LANES, c##i);
static void tile_3(const float *const *rows, const int32_t *steps, int64_t n, const float *b,
                   int64_t bstride, float *out) {
    ROWS8(ROW) ROWS8(ZEROZ)
    for (int64_t t = 0; t < n; t++, b += bstride) {
        const int64_t s = steps[t];
        __m512 b0 = _mm512_loadu_ps(b);
        __m256 b1 = _mm256_loadu_ps(b + 2 * LANES);
        __asm__("" : "+v"(b0), "+v"(b1));
        ROWS8(FMAZ)
    }
    PUTS8(PUTZ, 3)
}
#define ZERO6(i) __m512 x##i = _mm512_setzero_ps(), y##i = x##i, z##i = x##i;
#define FMA6(i)                                                                                \
    {                                                                                          \
        const __m512 a = _mm512_set1_ps(r##i[s]);                                              \
        x##i = _mm512_fmadd_ps(a, b0, x##i);                                                   \
        y##i = _mm512_fmadd_ps(a, b1, y##i);                                                   \
        z##i = _mm512_fmadd_ps(a, b2, z##i);                                                   \
    }
#define PUT6(i, nr)                                                                            \
    _mm512_storeu_ps(out + (i) * PANEL_MAX, x##i);                                             \
    _mm512_storeu_ps(out + (i) * PANEL_MAX + 2 * LANES, y##i);                                 \
    _mm512_storeu_ps(out + (i) * PANEL_MAX + 4 * LANES, z##i);
static void tile_6(const float *const *rows, const int32_t *steps, int64_t n, const float *b,
                   int64_t bstride, float *out) {
    ROWS8(ROW) ROWS8(ZERO6)
    for (int64_t t = 0; t < n; t++, b += bstride) {
        const int64_t s = steps[t];
        __m512 b0 = _mm512_loadu_ps(b), b1 = _mm512_loadu_ps(b + 2 * LANES),
               b2 = _mm512_loadu_ps(b + 4 * LANES);
        __asm__("" : "+v"(b0), "+v"(b1), "+v"(b2));
        ROWS8(FMA6)
    }
    PUTS8(PUT6, 6)
}
#else
DEFINE_TILE(3, 4)
#define tile_6 tile_3 /* (never chosen: by_48 is false without AVX-512) */
#endif

typedef void (*tile_fn)(const float *const *, const int32_t *, int64_t, const float *, int64_t,
                        float *);

/* Output channels [o0, o0 + wv) of the packed weights, their tile and its rows. */
typedef struct panel {
    int64_t o0, wv;
    int mr;
    tile_fn tile;
} panel;

/* Panel j of oc output channels: the panels of 24, or those of 16 then the one of 8 if any.
 * Its packed weights start at o0 x K floats. */
static void panel_at(int64_t oc, int64_t j, panel *p) {
    if (by_48(oc))
        *p = (panel){j * PANEL_MAX, PANEL_MAX, MR_MAX, tile_6};
    else if (by_24(oc))
        *p = (panel){j * WIDEST, WIDEST, MR_WIDEST, tile_3};
    else if (j < wide_panels(oc))
        *p = (panel){j * WIDE, WIDE, MR_WIDE, tile_2};
    else
        *p = (panel){j * WIDE, LANES, MR_NARROW, tile_1};
}
static int64_t panel_count(int64_t oc) {
    if (by_48(oc)) return oc / PANEL_MAX;
    return by_24(oc) ? oc / WIDEST : wide_panels(oc) + (narrow_panel(oc) ? 1 : 0);
}

/* ------------------------------------------------------------ the passes */

/* Taps per block of the packing: 16 floats of a weight row read at a time. */
#define PACK_TAPS 16

/* w (oc, K) into the panels: panel p holds [k][lane] = w[o0 + lane][k], zero past oc. */
static void pack(const gp_conv_geom *g, int64_t oc, const float *w, float *packed) {
    const int64_t K = kdim(g), np = panel_count(oc);
    for (int64_t j = 0; j < np; j++) {
        panel p;
        panel_at(oc, j, &p);
        float *dst = packed + p.o0 * K;
        const int64_t valid = oc - p.o0 < p.wv ? oc - p.o0 : p.wv;
        for (int64_t k0 = 0; k0 < K; k0 += PACK_TAPS) {
            const int64_t k1 = k0 + PACK_TAPS < K ? k0 + PACK_TAPS : K;
            for (int64_t o = 0; o < p.wv; o++) {
                const float *src = w + (p.o0 + o) * K;
                for (int64_t k = k0; k < k1; k++) dst[k * p.wv + o] = o < valid ? src[k] : 0.0f;
            }
        }
    }
}

/* The packing of the input gradient's convolution (gp_conv_dx_geom: its output channels are
 * g's C, its taps (o, ki, kj) over g's oc): [k'][lane] = w[o][c0 + lane][k-1-ki][k-1-kj],
 * flipped and packed in one pass. */
static void pack_flipped(const gp_conv_geom *g, int64_t oc, const float *w, float *packed) {
    const int64_t C = g->channels, kk = g->kernel * g->kernel, K = oc * kk;
    const int64_t np = panel_count(C);
    for (int64_t j = 0; j < np; j++) {
        panel p;
        panel_at(C, j, &p);
        float *dst = packed + p.o0 * K;
        const int64_t valid = C - p.o0 < p.wv ? C - p.o0 : p.wv;
        for (int64_t o = 0; o < oc; o++)
            for (int64_t t = 0; t < kk; t++) {
                float *d = dst + (o * kk + t) * p.wv;
                const float *src = w + (o * C + p.o0) * kk + (kk - 1 - t);
                for (int64_t c = 0; c < p.wv; c++) d[c] = c < valid ? src[c * kk] : 0.0f;
            }
    }
}

/* planes (C, H, W) into dst (C, Hq, Wq) at row top and column left, zeros around. */
static void pad_planes(const float *x, int64_t C, int64_t H, int64_t W, float *dst, int64_t Hq,
                       int64_t Wq, int64_t top, int64_t left) {
    const int64_t right = Wq - left - W, bottom = Hq - top - H;
    for (int64_t c = 0; c < C; c++) {
        float *d = dst + c * Hq * Wq;
        const float *s = x + c * H * W;
        memset(d, 0, (size_t)(top * Wq) * sizeof *d);
        for (int64_t h = 0; h < H; h++) {
            float *row = d + (top + h) * Wq;
            memset(row, 0, (size_t)left * sizeof *row);
            memcpy(row + left, s + h * W, (size_t)W * sizeof *row);
            memset(row + left + W, 0, (size_t)right * sizeof *row);
        }
        memset(d + (top + H) * Wq, 0, (size_t)(bottom * Wq) * sizeof *d);
    }
}

/* x (C, H, W) with pad zeros around each plane into xp; x itself without padding. */
static const float *pad_input(const gp_conv_geom *g, const float *x, float *xp) {
    if (g->pad == 0) return x;
    pad_planes(x, g->channels, g->height, g->width, xp, padded_h(g), padded_w(g), g->pad, g->pad);
    return xp;
}

/* off[k] for tap k = (c, ki, kj): its offset from a pixel's first tap in the padded image. */
static void tap_offsets(const gp_conv_geom *g, int32_t *off) {
    const int64_t k = g->kernel, Hp = padded_h(g), Wp = padded_w(g);
    int64_t t = 0;
    for (int64_t c = 0; c < g->channels; c++)
        for (int64_t ki = 0; ki < k; ki++)
            for (int64_t kj = 0; kj < k; kj++) off[t++] = (int32_t)((c * Hp + ki) * Wp + kj);
}

/* The first tap of output pixel p in the padded image. */
static int64_t pixel_base(const gp_conv_geom *g, int64_t p) {
    return (p / g->out_w) * g->stride * padded_w(g) + (p % g->out_w) * g->stride;
}

static void forward_example(const gp_conv_geom *g, int64_t oc, const float *packed,
                                    const float *x, float *y, float *ws) {
    const int64_t K = kdim(g), P = npix(g), np = panel_count(oc);
    const float *xp = pad_input(g, x, ws);
    int32_t *off = (int32_t *)(void *)(ws + xpad_floats(g));
    tap_offsets(g, off);
    float out[MR_MAX * PANEL_MAX];
    for (int64_t j = 0; j < np; j++) {
        panel pn;
        panel_at(oc, j, &pn);
        const int64_t no = oc - pn.o0 < pn.wv ? oc - pn.o0 : pn.wv;
        for (int64_t p0 = 0; p0 < P; p0 += pn.mr) {
            const float *rows[MR_MAX];
            const int64_t npx = P - p0 < pn.mr ? P - p0 : pn.mr;
            for (int i = 0; i < pn.mr; i++) /* past the last pixel: recompute it, stored once */
                rows[i] = xp + pixel_base(g, i < npx ? p0 + i : P - 1);
            pn.tile(rows, off, K, packed + pn.o0 * K, pn.wv, out);
            for (int64_t o = 0; o < no; o++)
                for (int64_t i = 0; i < npx; i++) y[(pn.o0 + o) * P + p0 + i] = out[i * pn.wv + o];
        }
    }
}

/* A chunk's buffers: the padded images (none without padding: x is read), dy transposed
 * (ne P, oc padded; zero past oc), the taps' offsets (K) and the steps' (ne P: example and
 * pixel). */
typedef struct dw_buffers {
    float *xpad, *dyt;
    int32_t *off, *base;
} dw_buffers;

static dw_buffers dw_buffers_of(const gp_conv_geom *g, int64_t oc, int64_t chunk, float *buf) {
    dw_buffers b = {.xpad = buf, .dyt = buf + chunk * xpad_floats(g)};
    b.off = (int32_t *)(void *)(b.dyt + chunk * npix(g) * oc_padded(oc));
    b.base = b.off + kdim(g);
    return b;
}

static void dw_prepare(const gp_conv_geom *g, int64_t oc, int64_t chunk, const float *x,
                               const float *dy, int64_t e0, int64_t e1, float *buf) {
    const int64_t P = npix(g), ocp = oc_padded(oc);
    const int64_t image = g->channels * padded_h(g) * padded_w(g);
    const int64_t in_elems = g->channels * g->height * g->width;
    const dw_buffers b = dw_buffers_of(g, oc, chunk, buf);
    for (int64_t e = e0; e < e1; e++) {
        if (g->pad > 0) pad_input(g, x + e * in_elems, b.xpad + e * image);
        for (int64_t p = 0; p < P; p++) {
            float *row = b.dyt + (e * P + p) * ocp;
            for (int64_t o = 0; o < oc; o++) row[o] = dy[(e * oc + o) * P + p];
            for (int64_t o = oc; o < ocp; o++) row[o] = 0.0f;
            b.base[e * P + p] = (int32_t)(e * image + pixel_base(g, p));
        }
    }
}

/* Tiles of panel pn: one per MR taps. */
static int64_t tap_tiles(const gp_conv_geom *g, const panel *pn) {
    return (kdim(g) + pn->mr - 1) / pn->mr;
}

static int64_t dw_tiles(const gp_conv_geom *g, int64_t oc) {
    int64_t n = 0;
    for (int64_t j = 0; j < panel_count(oc); j++) {
        panel pn;
        panel_at(oc, j, &pn);
        n += tap_tiles(g, &pn);
    }
    return n;
}

static void dw_run(const gp_conv_geom *g, int64_t oc, int64_t chunk, int64_t ne,
                           const float *x, const float *buf, int64_t t0, int64_t t1, float *dw) {
    const int64_t K = kdim(g), ocp = oc_padded(oc);
    const dw_buffers b = dw_buffers_of(g, oc, chunk, (float *)buf);
    const float *xp = g->pad > 0 ? b.xpad : x;
    float out[MR_MAX * PANEL_MAX];
    int64_t first = 0; /* the first tile of panel j */
    for (int64_t j = 0; j < panel_count(oc) && first < t1; j++) {
        panel pn;
        panel_at(oc, j, &pn);
        const int64_t n = tap_tiles(g, &pn);
        const int64_t no = oc - pn.o0 < pn.wv ? oc - pn.o0 : pn.wv;
        for (int64_t t = t0 > first ? t0 - first : 0; t < n && first + t < t1; t++) {
            const int64_t k0 = t * pn.mr, nk = K - k0 < pn.mr ? K - k0 : pn.mr;
            const float *rows[MR_MAX];
            for (int i = 0; i < pn.mr; i++) rows[i] = xp + b.off[i < nk ? k0 + i : K - 1];
            pn.tile(rows, b.base, ne * npix(g), b.dyt + pn.o0, ocp, out);
            for (int64_t o = 0; o < no; o++)
                for (int64_t i = 0; i < nk; i++) dw[(pn.o0 + o) * K + k0 + i] += out[i * pn.wv + o];
        }
        first += n;
    }
}

/* ------------------------------------ the input gradient at strides above 1 */

/* At stride s the input gradient splits by phase: the input pixels (ih, iw) with
 * (ih + pad) mod s = ph and (iw + pad) mod s = pw receive only the taps ki = ph + s a,
 * kj = pw + s b, each from dy at (oh0 - a, ow0 - b), oh0 = (ih + pad) / s (ow0 likewise): per
 * phase a correlation of dy with a sub-kernel, written to a sub-grid of dx. The tile runs it
 * with the phase's input pixels for rows and its taps (o, a, b) for steps, reading a copy of dy
 * with lead = ceil(k / s) - 1 zeros before each row and column and enough after. */
/* Taps of a phase along one axis: ki = ph + s a < k. */
static int64_t phase_taps(int64_t k, int64_t s, int64_t ph) { return ph < k ? (k - ph + s - 1) / s : 0; }

/* The first input row (column) of a phase, and how many of the extent n there are. */
static int64_t phase_first(int64_t pad, int64_t s, int64_t ph) { return ((ph - pad) % s + s) % s; }
static int64_t phase_count(int64_t n, int64_t first, int64_t s) {
    return first < n ? (n - first + s - 1) / s : 0;
}

/* Taps (o, a, b) of phase (ph, pw) for oc output channels. */
static int64_t phase_kdim(const gp_conv_geom *g, int64_t oc, int64_t ph, int64_t pw) {
    return oc * phase_taps(g->kernel, g->stride, ph) * phase_taps(g->kernel, g->stride, pw);
}

/* Floats of every phase's packed weights, and ints of their offset tables. */
static void phase_sizes(const gp_conv_geom *g, int64_t oc, int64_t *packed, int64_t *offsets) {
    const int64_t s = g->stride, cp = oc_padded(g->channels);
    *packed = *offsets = 0;
    for (int64_t ph = 0; ph < s; ph++)
        for (int64_t pw = 0; pw < s; pw++) {
            const int64_t kd = phase_kdim(g, oc, ph, pw);
            *packed += cp * kd, *offsets += kd;
        }
}

/* Each phase's weights packed over the input channels, [tap (o, a, b)][lane c] =
 * w[o][c0 + c][ph + s a][pw + s b], and its taps' offsets in dy's copy from a pixel's base. */
static void phase_pack(const gp_conv_geom *g, int64_t oc, const float *w, float *packed,
                       int32_t *off) {
    const int64_t s = g->stride, k = g->kernel, C = g->channels, kk = k * k;
    const phase_geom q = phase_geom_of(g);
    for (int64_t ph = 0; ph < s; ph++)
        for (int64_t pw = 0; pw < s; pw++) {
            const int64_t na = phase_taps(k, s, ph), nb = phase_taps(k, s, pw), K = oc * na * nb;
            for (int64_t o = 0, t = 0; o < oc; o++)
                for (int64_t a = 0; a < na; a++)
                    for (int64_t b = 0; b < nb; b++, t++)
                        off[t] = (int32_t)((o * q.Hq - a) * q.Wq - b);
            for (int64_t j = 0; j < panel_count(C); j++) {
                panel p;
                panel_at(C, j, &p);
                const int64_t valid = C - p.o0 < p.wv ? C - p.o0 : p.wv;
                float *d = packed + p.o0 * K;
                for (int64_t o = 0; o < oc; o++)
                    for (int64_t a = 0; a < na; a++)
                        for (int64_t b = 0; b < nb; b++, d += p.wv) {
                            const float *src = w + (o * C + p.o0) * kk + (ph + s * a) * k + pw + s * b;
                            for (int64_t c = 0; c < p.wv; c++) d[c] = c < valid ? src[c * kk] : 0.0f;
                        }
            }
            packed += oc_padded(C) * K, off += K;
        }
}

/* dx (C, H, W) of one example from its dy (oc, OH, OW), the phases packed by phase_pack;
 * dyq: the thread's copy of dy. */
static void dx_strided_example(const gp_conv_geom *g, int64_t oc, const float *packed,
                               const int32_t *off, const float *dy, float *dx, float *dyq) {
    const int64_t s = g->stride, C = g->channels, H = g->height, W = g->width;
    const phase_geom q = phase_geom_of(g);
    pad_planes(dy, oc, g->out_h, g->out_w, dyq, q.Hq, q.Wq, q.lead, q.lead);
    if (g->kernel < s) /* phases no tap reaches (a 1x1 at stride 2): their pixels are 0 */
        memset(dx, 0, (size_t)(C * H * W) * sizeof *dx);
    float out[MR_MAX * PANEL_MAX];
    for (int64_t ph = 0; ph < s; ph++)
        for (int64_t pw = 0; pw < s; pw++) {
            const int64_t K = phase_kdim(g, oc, ph, pw);
            const int64_t ih0 = phase_first(g->pad, s, ph), iw0 = phase_first(g->pad, s, pw);
            const int64_t nw = phase_count(W, iw0, s), n = phase_count(H, ih0, s) * nw;
            if (K == 0) continue; /* zeroed above */
            for (int64_t j = 0; j < panel_count(C); j++) {
                panel pn;
                panel_at(C, j, &pn);
                const int64_t nc = C - pn.o0 < pn.wv ? C - pn.o0 : pn.wv;
                for (int64_t p0 = 0; p0 < n; p0 += pn.mr) {
                    const float *rows[MR_MAX];
                    int64_t at[MR_MAX]; /* the pixels' offsets in a plane of dx */
                    const int64_t np = n - p0 < pn.mr ? n - p0 : pn.mr;
                    for (int i = 0; i < pn.mr; i++) {
                        const int64_t pi = i < np ? p0 + i : n - 1;
                        const int64_t ih = ih0 + s * (pi / nw), iw = iw0 + s * (pi % nw);
                        rows[i] = dyq + (q.lead + (ih + g->pad) / s) * q.Wq + q.lead + (iw + g->pad) / s;
                        at[i] = ih * W + iw;
                    }
                    pn.tile(rows, off, K, packed + pn.o0 * K, pn.wv, out);
                    for (int64_t c = 0; c < nc; c++)
                        for (int64_t i = 0; i < np; i++)
                            dx[(pn.o0 + c) * H * W + at[i]] = out[i * pn.wv + c];
                }
            }
            packed += oc_padded(C) * K, off += K;
        }
}

/* ------------------------------------------------------- over the threads */

static int threads_for(gp_device *dev, int64_t parts) {
    const int threads = gp_cpu_pool_threads(gp_cpu_pool_of(dev));
    return parts < threads ? (int)(parts > 0 ? parts : 1) : threads;
}

/* The stride-1 input gradient as the flipped convolution (gp_conv_dx_geom), where that
 * convolution's padded copy of dy stays within the bounds applies() sets for g's input. */
static bool dx_by_conv(const gp_conv_geom *g, int64_t oc, gp_conv_geom *gt) {
    if (!gp_conv_dx_geom(g, oc, gt)) return false;
    const int64_t image = gt->channels * padded_h(gt) * padded_w(gt);
    return image < INT32_MAX && forward_floats(gt) <= DIRECT_MAX_FLOATS;
}

/* The backward workspace: the input gradient's packed weights (flipped, or by phase) and the
 * phases' offsets, each thread's buffer for it (the flipped convolution's forward workspace,
 * or its copy of dy), then one chunk's buffers (dw). */
typedef struct bwd_layout {
    int64_t packed, offsets, dx_thread, dx_threads, chunk_buf;
    bool dx_conv, dx_phases;
    gp_conv_geom gt;
} bwd_layout;

static bwd_layout bwd_layout_of(gp_device *dev, const gp_conv_geom *g, int64_t batch, int64_t oc,
                                bool want_dx) {
    bwd_layout L = {.chunk_buf = dw_floats(g, oc, batch)};
    if (want_dx && dx_by_conv(g, oc, &L.gt)) {
        L.dx_conv = true;
        L.packed = packed_floats(&L.gt, g->channels);
        L.dx_thread = forward_floats(&L.gt);
    } else if (want_dx && g->stride > 1) {
        const phase_geom q = phase_geom_of(g);
        L.dx_phases = true;
        phase_sizes(g, oc, &L.packed, &L.offsets);
        L.dx_thread = oc * q.Hq * q.Wq;
    }
    L.dx_threads = threads_for(dev, batch) * L.dx_thread;
    return L;
}

bool gp_conv_direct_dx(const gp_conv_geom *g, int64_t oc) {
    gp_conv_geom gt;
    return dx_by_conv(g, oc, &gt) || g->stride > 1;
}

int64_t gp_conv_direct_ws(gp_device *dev, const gp_conv_geom *g, int64_t batch, int64_t oc,
                          bool backward, bool with_dx) {
    if (!backward) return packed_floats(g, oc) + threads_for(dev, batch) * forward_floats(g);
    const bwd_layout L = bwd_layout_of(dev, g, batch, oc, with_dx);
    return L.packed + L.offsets + L.dx_threads + L.chunk_buf;
}

typedef struct direct_job {
    const gp_conv_geom *g;
    int64_t oc, batch, chunk, ne, tiles;
    const int32_t *off; /* the phases' offsets (dx at strides above 1) */
    const float *x, *dy, *packed;
    float *y, *dw, *ws, *buf;
    int64_t thread_floats;
} direct_job;

/* Examples of part t: the convolution of g (y = conv(x)), or with the phases' offsets (off)
 * its input gradient by phase (x: dy, y: dx). */
static void examples_part(void *ctx, int t, int nt) {
    const direct_job *j = ctx;
    const gp_conv_geom *g = j->g;
    const int64_t in_elems = g->channels * g->height * g->width, out_elems = j->oc * npix(g);
    int64_t lo, hi;
    gp_cpu_split(j->batch, t, nt, 1, &lo, &hi);
    for (int64_t b = lo; b < hi; b++) {
        float *ws = j->ws + t * j->thread_floats;
        if (j->off)
            dx_strided_example(g, j->oc, j->packed, j->off, j->x + b * out_elems,
                               j->y + b * in_elems, ws);
        else
            forward_example(g, j->oc, j->packed, j->x + b * in_elems, j->y + b * out_elems, ws);
    }
}

static void run_examples(gp_device *dev, direct_job *j) {
    gp_cpu_pool_run(gp_cpu_pool_of(dev), threads_for(dev, j->batch), examples_part, j);
}

void gp_conv_direct_forward(gp_device *dev, const gp_conv_geom *g, int64_t batch, int64_t oc,
                            const float *x, const float *w, float *y, float *ws) {
    pack(g, oc, w, ws);
    direct_job j = {.g = g, .oc = oc, .batch = batch, .x = x, .packed = ws, .y = y,
                    .ws = ws + packed_floats(g, oc), .thread_floats = forward_floats(g)};
    run_examples(dev, &j);
}

/* Examples of part t of the current chunk into its buffers. */
static void dw_prepare_part(void *ctx, int t, int nt) {
    const direct_job *j = ctx;
    int64_t lo, hi;
    gp_cpu_split(j->ne, t, nt, 1, &lo, &hi);
    if (lo < hi) dw_prepare(j->g, j->oc, j->chunk, j->x, j->dy, lo, hi, j->buf);
}

/* Tiles of part t of the current chunk into dw. */
static void dw_run_part(void *ctx, int t, int nt) {
    const direct_job *j = ctx;
    int64_t lo, hi;
    gp_cpu_split(j->tiles, t, nt, 1, &lo, &hi);
    if (lo < hi) dw_run(j->g, j->oc, j->chunk, j->ne, j->x, j->buf, lo, hi, j->dw);
}

void gp_conv_direct_backward(gp_device *dev, const gp_conv_geom *g, int64_t batch, int64_t oc,
                             const float *x, const float *w, const float *dy, float *dx,
                             float *dw, float *ws) {
    if (batch <= 0) return;
    const bwd_layout L = bwd_layout_of(dev, g, batch, oc, dx != NULL);
    float *packed = ws, *dx_ws = packed + L.packed + L.offsets, *buf = dx_ws + L.dx_threads;
    gp_cpu_pool *pool = gp_cpu_pool_of(dev);
    if (dx && L.dx_conv) { /* dx = conv(dy) with the flipped weights */
        pack_flipped(g, oc, w, packed);
        direct_job j = {.g = &L.gt, .oc = g->channels, .batch = batch, .x = dy, .packed = packed,
                        .y = dx, .ws = dx_ws, .thread_floats = L.dx_thread};
        run_examples(dev, &j);
    } else if (dx && L.dx_phases) {
        int32_t *off = (int32_t *)(void *)(packed + L.packed);
        phase_pack(g, oc, w, packed, off);
        direct_job j = {.g = g, .oc = oc, .batch = batch, .off = off, .x = dy, .packed = packed,
                        .y = dx, .ws = dx_ws, .thread_floats = L.dx_thread};
        run_examples(dev, &j);
    }
    if (!dw) return;
    const int64_t chunk = dw_chunk(g, oc, batch), in_elems = g->channels * g->height * g->width;
    const int64_t tiles = dw_tiles(g, oc), out_elems = oc * npix(g);
    tap_offsets(g, dw_buffers_of(g, oc, chunk, buf).off); /* the same for every chunk */
    for (int64_t b = 0; b < batch; b += chunk) {
        direct_job j = {.g = g, .oc = oc, .chunk = chunk,
                        .ne = batch - b < chunk ? batch - b : chunk,
                        .tiles = tiles, .x = x + b * in_elems, .dy = dy + b * out_elems,
                        .dw = dw, .buf = buf};
        gp_cpu_pool_run(pool, threads_for(dev, j.ne), dw_prepare_part, &j);
        gp_cpu_pool_run(pool, threads_for(dev, tiles), dw_run_part, &j);
    }
}
