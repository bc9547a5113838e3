/* Winograd F(2x2, 3x3): the transforms, the products' register tiles, and the device's threads
 * around them (see conv_winograd.h). The forward (and input gradient) first, then the weight
 * gradient.
 *
 * The forward's unit of work is a chunk: R rows of tiles of the batch's batch x th, in order
 * (tile i of the chunk is column i of its buffers, rows of examples side by side): V (16, C, Tp)
 * the input tiles' transforms, M (16, OCp, Tp) their products, Tp the chunk's tiles rounded up
 * to the product tile's 24 (and room for 7 more). The 16 positions p = 4 i + j of a transformed
 * tile are the outer axis, so each product reads one V_p. */
#include "kernels/cpu/conv_winograd.h"

#include "kernels/cpu/conv_path.h"
#include "kernels/cpu/pool.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/cpu/simd.h"

#define LANES 8
/* The product tile: 4 output channels by 24 tiles (three vectors; 12 accumulators, 3 loads and
 * 4 broadcasts per 12 multiply-adds), the direct path's widest tile turned around. 6 x 16
 * needs panels of 4 beside those of 6 for 32 or 64 channels, and its 8-accumulator tile of 4
 * took 40% of the products' time for a quarter of their rows. */
#if GP_HAVE_AVX512
#define TILE_T 48 /* three 16-lane vectors: twice the products per multiply-add */
#else
#define TILE_T 24
#endif
#define ROWS 4
/* Floats of V and M together that a chunk aims at (256 KiB: within the core's L2 beside U), and
 * the fewest tiles a chunk has where the batch has them (the products' rows stay long). */
#define CHUNK_FLOATS (1 << 16)
#define CHUNK_MIN_TILES 32

/* The geometry of one call: tiles per row (tw) and column (th) of an image; a chunk is R rows
 * of tiles of the batch's batch x th, in order (a row's tiles never split), Tp columns of V. */
typedef struct wg_geom {
    int64_t C, OC, OCp, H, W, th, tw, rows, R, Tp, Lk, rows_floats;
    int64_t vplane, mplane; /* floats from V_p to V_p+1, M_p to M_p+1 */
} wg_geom;

/* A plane's stride: its floats rounded up to 4 KiB, plus one cache line. The transforms touch
 * all 16 planes at once; at strides that are multiples of 4 KiB (C Tp = 32 x 112, or U's
 * 96 x 96) their 16 streams fall into the same few sets of the L1 cache and evict each other
 * (the input transform ran 3x slower, the weights' 2x). */
static int64_t plane_stride(int64_t floats) { return (floats + 1023) / 1024 * 1024 + 16; }

static int64_t oc_padded(int64_t oc) { return (oc + ROWS - 1) / ROWS * ROWS; }
static int64_t round_tiles(int64_t n) { return (n + TILE_T - 1) / TILE_T * TILE_T; }

/* Chunks of R tile rows: V's rows take the input transform's last 8 tiles whole, up to 7 past
 * the chunk's tiles. */
static void chunk_rows(wg_geom *q, int64_t R) {
    q->R = R;
    q->Tp = round_tiles(R * q->tw + LANES - 1);
    q->vplane = plane_stride(q->C * q->Tp), q->mplane = plane_stride(q->OCp * q->Tp);
}

static wg_geom wg_geom_of(const gp_conv_geom *g, int64_t batch, int64_t oc) {
    wg_geom q = {.C = g->channels, .OC = oc, .OCp = oc_padded(oc), .H = g->height,
                 .W = g->width};
    q.th = (q.H + 1) / 2, q.tw = (q.W + 1) / 2;
    q.rows = (batch > 0 ? batch : 1) * q.th;
    int64_t tiles = CHUNK_FLOATS / (16 * (q.C + q.OCp));
    if (tiles < CHUNK_MIN_TILES) tiles = CHUNK_MIN_TILES;
    /* rows per chunk: at most the aim, and of those within half of it the count whose tiles
     * leave the fewest columns of the last product tile empty */
    const int64_t most = tiles / q.tw > 0 ? tiles / q.tw : 1;
    q.R = most;
    for (int64_t r = most; r > most / 2 && r > 0; r--)
        if ((round_tiles(r * q.tw) - r * q.tw) * q.R < (round_tiles(q.R * q.tw) - q.R * q.tw) * r)
            q.R = r;
    chunk_rows(&q, q.R < q.rows ? q.R : q.rows);
    /* a row of the even (odd) columns of a padded plane: reads of 8 from every k < tw and k + 1 */
    q.Lk = (q.tw + LANES - 1) / LANES * LANES + LANES;
    /* even, odd, the padded plane */
    q.rows_floats = (2 * q.th + 2) * (2 * q.Lk + 2 * q.Lk + LANES);
    return q;
}

bool gp_conv_winograd_serves(const gp_conv_geom *g, int64_t oc) {
    if (!GP_HAVE_AVX2 || !gp_conv_path_on(GP_CONV_WINOGRAD)) return false;
    if (g->kernel != 3 || g->stride != 1 || g->pad != 1 || g->out_h != g->height ||
        g->out_w != g->width)
        return false;
    /* Where it was measured faster than the direct tile (one thread, batch 32): the products
     * must outweigh the transforms (channels 16 x 16: 0.96x; 16 x 36: 1.49x at 14x14), and on
     * small images the tiles past the edge must not (at 7x7 the 2x2 tiles cover 8x8: 24 x 24
     * channels 0.82x, 32 x 32 0.87x, 64 x 64 1.09x, 96 x 96 1.07x). */
    const int64_t pairs = g->channels * oc;
    if (g->channels < 16 || oc < 16 || pairs < 512) return false;
    if (g->height * g->width < 100 && pairs < 4096) return false;
    const wg_geom q = wg_geom_of(g, 1, oc);
    /* one chunk's buffers well within int and the caches' reach */
    return 16 * (q.C > q.OCp ? q.C : q.OCp) * q.Tp <= ((int64_t)1 << 22) &&
           q.C * q.H * q.W <= ((int64_t)1 << 24);
}

/* U_p to U_p+1 (strided like V's and M's planes), and all of U. */
static int64_t u_plane(const wg_geom *q) { return plane_stride(q->OCp * q->C); }
static int64_t u_floats(const wg_geom *q) { return 16 * u_plane(q); }
/* A thread's buffers, rounded up to a cache line so that every thread's V and M start on one
 * (the workspace does): the products' 16-lane loads and stores are then whole lines. */
static int64_t thread_floats(const wg_geom *q) {
    return (16 * q->vplane + 16 * q->mplane + LANES + q->rows_floats + 15) / 16 * 16;
}

static int threads_for(gp_device *dev, int64_t parts) {
    const int threads = gp_cpu_pool_threads(gp_cpu_pool_of(dev));
    return parts < threads ? (int)(parts > 0 ? parts : 1) : threads;
}

static int64_t chunks_of(const wg_geom *q) { return (q->rows + q->R - 1) / q->R; }

int64_t gp_conv_winograd_wt_floats(const gp_conv_geom *g, int64_t oc) {
    const wg_geom q = wg_geom_of(g, 1, oc);
    return u_floats(&q);
}

/* The product tile's columns that the busiest of the threads runs over the batch's chunks of r
 * tile rows: each chunk's tiles rounded up to the product tile. */
static int64_t product_columns(const wg_geom *q, int64_t r, int threads) {
    const int64_t chunks = (q->rows + r - 1) / r;
    const int nt = chunks < threads ? (int)chunks : threads;
    int64_t most = 0;
    for (int t = 0; t < nt; t++) {
        int64_t lo, hi, cols = 0;
        gp_cpu_split(chunks, t, nt, 1, &lo, &hi);
        for (int64_t ch = lo; ch < hi; ch++)
            cols += round_tiles(((ch + 1) * r <= q->rows ? r : q->rows - ch * r) * q->tw);
        if (cols > most) most = cols;
    }
    return most;
}

/* The forward's geometry on the device's threads: chunks of the aim's rows (wg_geom_of), or of
 * up to twice as many where that leaves the busiest thread fewer columns of the product tile
 * past the tiles (the bits do not depend on the chunks). At 7x7 a chunk of the aim's 8 rows of
 * 4 tiles fills 32 of a 48-tile's columns; 11 rows fill 44. */
static wg_geom wg_geom_on(gp_device *dev, const gp_conv_geom *g, int64_t batch, int64_t oc) {
    wg_geom q = wg_geom_of(g, batch, oc);
    const int threads = gp_cpu_pool_threads(gp_cpu_pool_of(dev));
    const int64_t aim = q.R;
    int64_t rows = aim, best = product_columns(&q, aim, threads);
    for (int64_t r = aim / 2 + 1; r <= 2 * aim && r <= q.rows; r++) {
        const int64_t cols = product_columns(&q, r, threads);
        if (cols < best) best = cols, rows = r;
    }
    chunk_rows(&q, rows);
    return q;
}

int64_t gp_conv_winograd_ws(gp_device *dev, const gp_conv_geom *g, int64_t batch, int64_t oc) {
    const wg_geom q = wg_geom_on(dev, g, batch, oc);
    return u_floats(&q) + threads_for(dev, chunks_of(&q)) * thread_floats(&q);
}

#if GP_HAVE_AVX2

/* U_p = G w G^T for the kernels (o, c) of output channels [o_lo, o_hi) (multiples of 4), w's
 * kernel (o, c), or flipped, its kernel (c, o) turned by 180 degrees (gp_conv_flip_weights),
 * packed by panels of 4 output channels: the panel at o0 holds [c][row] = U_p[o0 + row][c],
 * zero past OC. G = [1 0 0; 1/2 1/2 1/2; 1/2 -1/2 1/2; 0 0 1]. The four rows of a panel go in
 * the four lanes of a vector, so that each position's four values are one store (scattered
 * scalar stores took 0.5 ms for 96 x 96 channels, as long as the convolution of 8 7x7 images). */
static void transform_weights(const wg_geom *q, const float *w, bool flipped, float *U,
                              int64_t o_lo, int64_t o_hi) {
    const int64_t C = q->C, pstride = u_plane(q);
    const __m128 half = _mm_set1_ps(0.5f);
    static const float zeros[9] = {0};
    for (int64_t o0 = o_lo; o0 < o_hi; o0 += ROWS)
        for (int64_t c = 0; c < C; c++) {
            const float *kr[ROWS]; /* the panel's kernels (zeros past OC) */
            for (int r = 0; r < ROWS; r++)
                kr[r] = o0 + r >= q->OC ? zeros
                        : flipped      ? w + (c * q->OC + o0 + r) * 9
                                       : w + ((o0 + r) * C + c) * 9;
            __m128 k[9];
            for (int i = 0; i < 9; i++) {
                const int at = flipped ? 8 - i : i;
                k[i] = _mm_setr_ps(kr[0][at], kr[1][at], kr[2][at], kr[3][at]);
            }
            __m128 t[4][3];
            for (int b = 0; b < 3; b++) {
                t[0][b] = k[b];
                t[1][b] = _mm_mul_ps(half, _mm_add_ps(_mm_add_ps(k[b], k[3 + b]), k[6 + b]));
                t[2][b] = _mm_mul_ps(half, _mm_add_ps(_mm_sub_ps(k[b], k[3 + b]), k[6 + b]));
                t[3][b] = k[6 + b];
            }
            float *dst = U + o0 * C + c * ROWS;
            for (int a = 0; a < 4; a++) {
                const __m128 sum = _mm_add_ps(t[a][0], t[a][1]), dif = _mm_sub_ps(t[a][0], t[a][1]);
                const __m128 u1 = _mm_mul_ps(half, _mm_add_ps(sum, t[a][2]));
                const __m128 u2 = _mm_mul_ps(half, _mm_add_ps(dif, t[a][2]));
                _mm_storeu_ps(dst + (a * 4 + 0) * pstride, t[a][0]);
                _mm_storeu_ps(dst + (a * 4 + 1) * pstride, u1);
                _mm_storeu_ps(dst + (a * 4 + 2) * pstride, u2);
                _mm_storeu_ps(dst + (a * 4 + 3) * pstride, t[a][2]);
            }
        }
}

/* The padded plane of a channel: x with one zero row and column before it and zeros after,
 * rows of 2 Lk + 8 floats. Its zeros are set once per thread (zero_padding); a channel's rows
 * overwrite only the middle. */
static int64_t padded_row(const wg_geom *q) { return 2 * q->Lk + LANES; }
static void zero_padding(const wg_geom *q, float *pad) {
    memset(pad, 0, (size_t)((2 * q->th + 2) * padded_row(q)) * sizeof *pad);
}

/* [a0 a2 b0 b2 | a4 a6 b4 b6] (two vectors' even lanes, shuffled) -> [a0 a2 a4 a6 b0 b2 b4 b6]. */
static __m256 in_order(__m256 v) {
    return _mm256_castpd_ps(_mm256_permute4x64_pd(_mm256_castps_pd(v), 0xd8));
}

/* Rows [r0, r1) of one channel of an example, x, into its padded plane's even and odd columns:
 * ev[r][k] = the padded plane at (r, 2k), od[r][k] at (r, 2k + 1). The rows are copied into
 * the padded plane first, all of them, then split by lane parity: loads of a row just stored
 * at another alignment would wait on the stores (masked loads straight from x instead took 17%
 * of the convolution: vmaskmovps is slow on AMD's cores). */
static void split_columns(const wg_geom *q, const float *x, int64_t r0, int64_t r1,
                          float *ev, float *od, float *pad) {
    const int64_t Lk = q->Lk, H = q->H, W = q->W, pw = padded_row(q);
    for (int64_t r = r0 > 1 ? r0 : 1; r < r1 && r <= H; r++) {
        const float *row = x + (r - 1) * W;
        float *dst = pad + r * pw + 1;
        int64_t i = 0;
        for (; i + LANES <= W; i += LANES) _mm256_storeu_ps(dst + i, _mm256_loadu_ps(row + i));
        for (; i < W; i++) dst[i] = row[i];
        /* the same row of the next plane (the next channel, or the next example's first): the
         * hardware's prefetcher does not follow jumps of a plane (a prefetch never faults) */
        for (int64_t f = 0; f < W; f += 16)
            _mm_prefetch((const char *)(row + H * W + f), _MM_HINT_T0);
    }
    for (int64_t r = r0; r < r1; r++) {
        const float *src = pad + r * pw;
        float *e = ev + r * Lk, *o = od + r * Lk;
        for (int64_t k = 0; k < Lk; k += LANES) {
            const __m256 a = _mm256_loadu_ps(src + 2 * k), b = _mm256_loadu_ps(src + 2 * k + LANES);
            const __m256 lo = _mm256_shuffle_ps(a, b, _MM_SHUFFLE(2, 0, 2, 0));
            const __m256 hi = _mm256_shuffle_ps(a, b, _MM_SHUFFLE(3, 1, 3, 1));
            _mm256_storeu_ps(e + k, in_order(lo));
            _mm256_storeu_ps(o + k, in_order(hi));
        }
    }
}

/* V's tiles of channel c in tile rows [ty0, ty1) of an example, the first at column base of
 * V: V_p = B^T d B, B^T = [1 0 -1 0; 0 1 1 0; 0 -1 1 0; 0 1 0 -1], eight tiles of a row at a
 * time. A row's last group is stored whole: up to 7 columns past the row, which the next row
 * overwrites, or past the chunk's tiles (Tp leaves room). Masked stores instead took this
 * transform 2x longer (they are slow on AMD's cores). */
static void transform_input(const wg_geom *q, const float *ev, const float *od,
                            int64_t c, int64_t ty0, int64_t ty1, int64_t base,
                            float *V) {
    const int64_t Lk = q->Lk, plane = q->vplane;
    for (int64_t ty = ty0; ty < ty1; ty++)
        for (int64_t k = 0; k < q->tw; k += LANES) {
            __m256 d[4][4];
            for (int i = 0; i < 4; i++) {
                const int64_t r = (2 * ty + i) * Lk + k;
                d[i][0] = _mm256_loadu_ps(ev + r);
                d[i][1] = _mm256_loadu_ps(od + r);
                d[i][2] = _mm256_loadu_ps(ev + r + 1);
                d[i][3] = _mm256_loadu_ps(od + r + 1);
            }
            __m256 t[4][4];
            for (int j = 0; j < 4; j++) {
                t[0][j] = _mm256_sub_ps(d[0][j], d[2][j]);
                t[1][j] = _mm256_add_ps(d[1][j], d[2][j]);
                t[2][j] = _mm256_sub_ps(d[2][j], d[1][j]);
                t[3][j] = _mm256_sub_ps(d[1][j], d[3][j]);
            }
            float *dst = V + c * q->Tp + base + (ty - ty0) * q->tw + k;
            for (int i = 0; i < 4; i++) {
                _mm256_storeu_ps(dst + (i * 4 + 0) * plane, _mm256_sub_ps(t[i][0], t[i][2]));
                _mm256_storeu_ps(dst + (i * 4 + 1) * plane, _mm256_add_ps(t[i][1], t[i][2]));
                _mm256_storeu_ps(dst + (i * 4 + 2) * plane, _mm256_sub_ps(t[i][2], t[i][1]));
                _mm256_storeu_ps(dst + (i * 4 + 3) * plane, _mm256_sub_ps(t[i][1], t[i][3]));
            }
        }
}

/* m (4, 24) = sum over c in order of u[c][row] x v[c][0..24). */
#define ZERO(i) __m256 a##i = _mm256_setzero_ps(), b##i = a##i, c##i = a##i;
#define STEP(i)                                            \
    {                                                      \
        const __m256 s = _mm256_broadcast_ss(u + (i));     \
        a##i = _mm256_fmadd_ps(s, v0, a##i);               \
        b##i = _mm256_fmadd_ps(s, v1, b##i);               \
        c##i = _mm256_fmadd_ps(s, v2, c##i);               \
    }
#define PUT(i)                                                 \
    _mm256_storeu_ps(m + (i) * mstride, a##i);                 \
    _mm256_storeu_ps(m + (i) * mstride + LANES, b##i);         \
    _mm256_storeu_ps(m + (i) * mstride + 2 * LANES, c##i);
#define FOUR(M) M(0) M(1) M(2) M(3)
#if GP_HAVE_AVX512
#undef ZERO
#undef STEP
#undef PUT
#define ZERO(i) __m512 a##i = _mm512_setzero_ps(), b##i = a##i, c##i = a##i;
#define STEP(i)                                            \
    {                                                      \
        const __m512 s = _mm512_set1_ps(u[i]);             \
        a##i = _mm512_fmadd_ps(s, v0, a##i);               \
        b##i = _mm512_fmadd_ps(s, v1, b##i);               \
        c##i = _mm512_fmadd_ps(s, v2, c##i);               \
    }
#define PUT(i)                                                 \
    _mm512_storeu_ps(m + (i) * mstride, a##i);                 \
    _mm512_storeu_ps(m + (i) * mstride + 16, b##i);            \
    _mm512_storeu_ps(m + (i) * mstride + 32, c##i);
#endif
static void product_tile(const float *u, const float *v, int64_t C, int64_t vstride,
                         float *m, int64_t mstride) {
    FOUR(ZERO)
    for (int64_t c = 0; c < C; c++, u += ROWS, v += vstride) {
#if GP_HAVE_AVX512
        __m512 v0 = _mm512_loadu_ps(v), v1 = _mm512_loadu_ps(v + 16), v2 = _mm512_loadu_ps(v + 32);
        __asm__("" : "+v"(v0), "+v"(v1), "+v"(v2));
#else
        __m256 v0 = _mm256_loadu_ps(v), v1 = _mm256_loadu_ps(v + LANES),
               v2 = _mm256_loadu_ps(v + 2 * LANES);
        /* (kept in registers: GCC would reload them into every multiply-add) */
        __asm__("" : "+x"(v0), "+x"(v1), "+x"(v2));
#endif
        FOUR(STEP)
    }
    FOUR(PUT)
}

/* M_p = U_p V_p over the chunk's first n tiles (rounded up to the tile's 24). */
static void products(const wg_geom *q, const float *U, const float *V, float *M, int64_t n) {
    const int64_t C = q->C;
    for (int p = 0; p < 16; p++) {
        const float *Up = U + p * u_plane(q), *Vp = V + p * q->vplane;
        float *Mp = M + p * q->mplane;
        for (int64_t t0 = 0; t0 < n; t0 += TILE_T)
            for (int64_t o0 = 0; o0 < q->OCp; o0 += ROWS)
                product_tile(Up + o0 * C, Vp + t0, C, q->Tp, Mp + o0 * q->Tp + t0, q->Tp);
    }
}

/* Two output rows' worth of 8 tiles: lanes a (even columns) and b (odd) interleaved into 16
 * columns, the first n of them stored. */
static void store_pairs(__m256 a, __m256 b, float *dst, int64_t n) {
    const __m256 lo = _mm256_unpacklo_ps(a, b), hi = _mm256_unpackhi_ps(a, b);
    const __m256 r0 = _mm256_permute2f128_ps(lo, hi, 0x20);
    const __m256 r1 = _mm256_permute2f128_ps(lo, hi, 0x31);
    if (n >= 2 * LANES) {
        _mm256_storeu_ps(dst, r0);
        _mm256_storeu_ps(dst + LANES, r1);
        return;
    }
    __m256 rest = r0;
    if (n >= LANES) {
        _mm256_storeu_ps(dst, r0);
        dst += LANES, n -= LANES, rest = r1;
    }
    __m128 part = _mm256_castps256_ps128(rest); /* n < 8 lanes: 4, 2 and 1 at a time */
    if (n & 4) {
        _mm_storeu_ps(dst, part);
        dst += 4, part = _mm256_extractf128_ps(rest, 1);
    }
    if (n & 2) {
        _mm_storel_pi((__m64 *)(void *)dst, part);
        dst += 2, part = _mm_movehl_ps(part, part);
    }
    if (n & 1) _mm_store_ss(dst, part);
}

/* Tile rows [ty0, ty1) of y's plane o of an example from M, the first at column base: each
 * 2x2 block A^T m A, A^T = [1 1 1 0; 0 1 -1 -1]. */
static void transform_output(const wg_geom *q, const float *M, int64_t o, int64_t ty0,
                             int64_t ty1, int64_t base, float *y) {
    const int64_t plane = q->mplane, W = q->W;
    for (int64_t ty = ty0; ty < ty1; ty++)
        for (int64_t k = 0; k < q->tw; k += LANES) {
            const float *src = M + o * q->Tp + base + (ty - ty0) * q->tw + k;
            __m256 m[16];
            for (int p = 0; p < 16; p++) m[p] = _mm256_loadu_ps(src + p * plane);
            __m256 t0[4], t1[4];
            for (int j = 0; j < 4; j++) {
                t0[j] = _mm256_add_ps(_mm256_add_ps(m[j], m[4 + j]), m[8 + j]);
                t1[j] = _mm256_sub_ps(_mm256_sub_ps(m[4 + j], m[8 + j]), m[12 + j]);
            }
            const __m256 y00 = _mm256_add_ps(_mm256_add_ps(t0[0], t0[1]), t0[2]);
            const __m256 y01 = _mm256_sub_ps(_mm256_sub_ps(t0[1], t0[2]), t0[3]);
            const __m256 y10 = _mm256_add_ps(_mm256_add_ps(t1[0], t1[1]), t1[2]);
            const __m256 y11 = _mm256_sub_ps(_mm256_sub_ps(t1[1], t1[2]), t1[3]);
            const int64_t n = W - 2 * k; /* columns left in the row from this group */
            float *row = y + (2 * ty) * W + 2 * k;
            store_pairs(y00, y01, row, n);
            if (2 * ty + 1 < q->H) store_pairs(y10, y11, row + W, n);
        }
}


/* Example b's part of the tile rows [r0, r1) of the batch: its tile rows [*ty0, *ty1), the
 * first at column *base of the buffers. */
static void example_span(const wg_geom *q, int64_t r0, int64_t r1, int64_t b, int64_t *ty0,
                         int64_t *ty1, int64_t *base) {
    *ty0 = r0 > b * q->th ? r0 - b * q->th : 0;
    *ty1 = r1 < (b + 1) * q->th ? r1 - b * q->th : q->th;
    *base = (b * q->th + *ty0 - r0) * q->tw;
}

/* V's tiles of every channel of one example, xb, in tile rows [ty0, ty1), the first at column
 * base. */
static void transform_inputs(const wg_geom *q, const float *xb, int64_t ty0, int64_t ty1,
                             int64_t base, float *ev, float *od, float *pad, float *V) {
    const int64_t plane = q->H * q->W;
    for (int64_t c = 0; c < q->C; c++) {
        split_columns(q, xb + c * plane, 2 * ty0, 2 * ty1 + 2, ev, od, pad);
        transform_input(q, ev, od, c, ty0, ty1, base, V);
    }
}

typedef struct wg_job {
    const wg_geom *q;
    const float *x, *U;
    float *y, *ws;
} wg_job;

/* Output channels per thread below which the weights' transform stays on fewer threads. */
#define WEIGHTS_GRAIN 32

typedef struct wg_weights_job {
    const wg_geom *q;
    const float *w;
    bool flipped;
    float *U;
} wg_weights_job;

static void weights_range(void *ctx, int64_t lo, int64_t hi) {
    const wg_weights_job *j = ctx;
    transform_weights(j->q, j->w, j->flipped, j->U, lo, hi);
}

/* (each a pure function of its kernel: the same bits on any split) */
static void weights_of(gp_device *dev, const wg_geom *q, const float *w, bool flipped,
                       float *U) {
    wg_weights_job j = {.q = q, .w = w, .flipped = flipped, .U = U};
    gp_cpu_parallel_for(gp_cpu_pool_of(dev), q->OCp, ROWS, WEIGHTS_GRAIN, weights_range, &j);
}

void gp_conv_winograd_weights(gp_device *dev, const gp_conv_geom *g, int64_t oc, const float *w,
                              bool flipped, float *U) {
    const wg_geom q = wg_geom_of(g, 1, oc);
    weights_of(dev, &q, w, flipped, U);
}

/* Chunks of part t: transform, multiply, transform back, chunk by chunk. */
static void chunks_part(void *ctx, int t, int nt) {
    const wg_job *j = ctx;
    const wg_geom *q = j->q;
    float *V = j->ws + t * thread_floats(q), *M = V + 16 * q->vplane;
    float *ev = M + 16 * q->mplane + LANES, *od = ev + (2 * q->th + 2) * q->Lk;
    float *pad = od + (2 * q->th + 2) * q->Lk;
    const int64_t plane = q->H * q->W;
    int64_t lo, hi;
    gp_cpu_split(chunks_of(q), t, nt, 1, &lo, &hi);
    /* The products run over whole tiles of TILE_T columns, past a chunk's last tile: those
     * columns hold zeros, or an earlier chunk's transforms, never stored. Each chunk writes its
     * own columns before its products read them, so only those past the part's shortest chunk
     * (its last) need the zeros. */
    if (lo < hi) {
        const int64_t last = (hi - 1) * q->R, nmin = (q->rows - last < q->R ? q->rows - last
                                                                              : q->R) * q->tw;
        for (int64_t r = 0; r < 16 * q->C; r++)
            memset(V + (r / q->C) * q->vplane + (r % q->C) * q->Tp + nmin, 0,
                   (size_t)(q->Tp - nmin) * sizeof *V);
    }
    zero_padding(q, pad);
    for (int64_t ch = lo; ch < hi; ch++) {
        const int64_t r0 = ch * q->R, r1 = r0 + q->R < q->rows ? r0 + q->R : q->rows;
        const int64_t n = (r1 - r0) * q->tw;
        for (int64_t b = r0 / q->th; b * q->th < r1; b++) {
            int64_t ty0, ty1, base;
            example_span(q, r0, r1, b, &ty0, &ty1, &base);
            transform_inputs(q, j->x + b * q->C * plane, ty0, ty1, base, ev, od, pad, V);
        }
        products(q, j->U, V, M, n);
        for (int64_t b = r0 / q->th; b * q->th < r1; b++) {
            int64_t ty0, ty1, base;
            example_span(q, r0, r1, b, &ty0, &ty1, &base);
            for (int64_t o = 0; o < q->OC; o++)
                transform_output(q, M, o, ty0, ty1, base, j->y + (b * q->OC + o) * plane);
        }
    }
}

void gp_conv_winograd_forward(gp_device *dev, const gp_conv_geom *g, int64_t batch, int64_t oc,
                              const float *x, const float *w, const float *U, bool flipped,
                              float *y, float *ws) {
    if (batch <= 0) return;
    const wg_geom q = wg_geom_on(dev, g, batch, oc);
    if (!U) weights_of(dev, &q, w, flipped, ws);
    wg_job j = {.q = &q, .x = x, .U = U ? U : ws, .y = y, .ws = ws + u_floats(&q)};
    gp_cpu_pool_run(gp_cpu_pool_of(dev), threads_for(dev, chunks_of(&q)), chunks_part, &j);
}

/* ------------------------------------------------------ the weight gradient */

/* The forward is y = A^T [U . V] A, linear in U = G w G^T: over every tile, dL/dU = (A dy A^T)
 * . V, and dw = G^T (sum over the tiles of dL/dU) G. Per position p that sum is a product
 * dU_p (OC, C) = Y_p (OC, tiles) V_p (C, tiles)^T, Y_p the output gradient's tiles' transforms.
 *
 * The batch's tile rows go in groups fixed by the batch and the geometry: at least
 * DW_MIN_GROUPS where there are as many rows, and as many more as keep each within
 * DW_GROUP_TILES tiles. A thread transforms a whole group, then runs the products over all of
 * its tiles on a tile of 4 output by 3 input channels (12 accumulators of 8 lanes, tile t into
 * lane t mod 8), summing the lanes once at the end: the group's dU. The groups go in rounds of
 * DW_ROUND, the threads splitting a round's groups; after each round its groups' dU add in
 * order onto the running sum (so the workspace holds DW_ROUND of them, whatever the batch), and
 * at the end dw += G^T dU G. The bits do not depend on the number of threads. (Groups of one
 * chunk of the forward's size, summed across their lanes after each, spent a third of the time
 * on the sums; lanes kept across chunks spent it on loading and storing them.) */
#define DW_MIN_GROUPS 4
#define DW_GROUP_TILES 384
#define DW_ROUND 16
#define DW_COLS 3

/* The geometry of the weight gradient: the forward's, with R the most rows of a group and Tp,
 * V's and M's (here Y's) planes sized for a group. */
static wg_geom dw_geom_of(const gp_conv_geom *g, int64_t batch, int64_t oc, int64_t *groups) {
    wg_geom q = wg_geom_of(g, batch, oc);
    int64_t n = (q.rows * q.tw + DW_GROUP_TILES - 1) / DW_GROUP_TILES;
    if (n < DW_MIN_GROUPS) n = DW_MIN_GROUPS;
    if (n > q.rows) n = q.rows;
    *groups = n;
    q.R = (q.rows + n - 1) / n;
    q.Tp = (q.R * q.tw + LANES - 1) / LANES * LANES + LANES; /* 8 tiles stored whole */
    q.vplane = plane_stride(q.C * q.Tp), q.mplane = plane_stride(q.OCp * q.Tp);
    return q;
}

static int64_t c_padded(const wg_geom *q) { return (q->C + DW_COLS - 1) / DW_COLS * DW_COLS; }
/* One group's dU: 16 planes of (OCp, C rounded up to 3). */
static int64_t du_floats(const wg_geom *q) { return 16 * q->OCp * c_padded(q); }
/* A thread's buffers: V (16 planes of C rows), Y (16 of OCp rows), a row of zeros (the input
 * channels past C), the split rows and the padded plane. */
static int64_t dw_thread_floats(const wg_geom *q) {
    return 16 * q->vplane + 16 * q->mplane + LANES + q->Tp + q->rows_floats;
}

/* Measured against the direct tile's weight gradient (bench_conv, two threads): 1.19x for 32 x
 * 32 channels at 28x28 on a batch of 128, 1.45x for 32 x 64 at 14x14, 1.08x for 48 x 48 at
 * 14x14 on 8 images; 24 x 24 at 28x28 on 8 images 0.92x, and 96 x 96 at 7x7 on 8 images
 * (128 tiles: groups of 32) 0.71x. */
#define DW_MIN_PAIRS 1024
#define DW_MIN_TILES 256

bool gp_conv_winograd_dw_serves(const gp_conv_geom *g, int64_t batch, int64_t oc) {
    if (!gp_conv_winograd_serves(g, oc) || g->channels * oc < DW_MIN_PAIRS) return false;
    const int64_t tiles = ((g->height + 1) / 2) * ((g->width + 1) / 2);
    return batch > 0 && batch * tiles >= DW_MIN_TILES;
}

int64_t gp_conv_winograd_dw_ws(gp_device *dev, const gp_conv_geom *g, int64_t batch,
                               int64_t oc) {
    int64_t groups;
    const wg_geom q = dw_geom_of(g, batch, oc, &groups);
    const int64_t slots = groups < DW_ROUND ? groups : DW_ROUND;
    return (1 + slots) * du_floats(&q) + threads_for(dev, slots) * dw_thread_floats(&q);
}

/* Y's tiles of output channel o in tile rows [ty0, ty1) of an example, the first at column
 * base, from the split rows of its output gradient (split_columns of dy as if it were an input:
 * dy[h][2k] = od[h + 1][k], dy[h][2k + 1] = ev[h + 1][k + 1]): Y_p = A D A^T for each 2x2 block
 * D, A = [1 0; 1 1; 1 -1; 0 -1]. Stored 8 tiles whole, as transform_input's. */
static void transform_grad(const wg_geom *q, const float *ev, const float *od,
                           int64_t o, int64_t ty0, int64_t ty1, int64_t base, float *Y) {
    const int64_t Lk = q->Lk, plane = q->mplane;
    for (int64_t ty = ty0; ty < ty1; ty++)
        for (int64_t k = 0; k < q->tw; k += LANES) {
            const int64_t r0 = (2 * ty + 1) * Lk + k, r1 = r0 + Lk;
            const __m256 d00 = _mm256_loadu_ps(od + r0), d01 = _mm256_loadu_ps(ev + r0 + 1);
            const __m256 d10 = _mm256_loadu_ps(od + r1), d11 = _mm256_loadu_ps(ev + r1 + 1);
            /* s = A D (4 x 2), then each row i: (s0, s0 + s1, s0 - s1, -s1) */
            const __m256 zero = _mm256_setzero_ps();
            const __m256 s[4][2] = {{d00, d01},
                                    {_mm256_add_ps(d00, d10), _mm256_add_ps(d01, d11)},
                                    {_mm256_sub_ps(d00, d10), _mm256_sub_ps(d01, d11)},
                                    {_mm256_sub_ps(zero, d10), _mm256_sub_ps(zero, d11)}};
            float *dst = Y + o * q->Tp + base + (ty - ty0) * q->tw + k;
            for (int i = 0; i < 4; i++) {
                _mm256_storeu_ps(dst + (i * 4 + 0) * plane, s[i][0]);
                _mm256_storeu_ps(dst + (i * 4 + 1) * plane, _mm256_add_ps(s[i][0], s[i][1]));
                _mm256_storeu_ps(dst + (i * 4 + 2) * plane, _mm256_sub_ps(s[i][0], s[i][1]));
                _mm256_storeu_ps(dst + (i * 4 + 3) * plane, _mm256_sub_ps(zero, s[i][1]));
            }
        }
}

/* The sum of v's 8 lanes, in a fixed order. */
static float lane_sum(__m256 v) {
    const __m128 h = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    const __m128 d = _mm_add_ps(h, _mm_movehl_ps(h, h));
    return _mm_cvtss_f32(_mm_add_ss(d, _mm_shuffle_ps(d, d, 1)));
}

/* du[row][col] = sum over the first n tiles of y[row][t] v[col][t]: rows 4 (ystride apart),
 * cols 3 (pointers), du's rows du_stride apart. Tile t goes into lane t mod 8, the lanes summed
 * at the end; the last step's lanes past n are masked off in y. */
#define DW_ZERO(i) __m256 a##i = _mm256_setzero_ps(), b##i = a##i, c##i = a##i;
#define DW_STEP(i)                                                                             \
    {                                                                                          \
        __m256 yi = DW_Y(i);                                                                   \
        __asm__("" : "+x"(yi)); /* one load, not one per multiply-add */                       \
        a##i = _mm256_fmadd_ps(yi, v0, a##i);                                                  \
        b##i = _mm256_fmadd_ps(yi, v1, b##i);                                                  \
        c##i = _mm256_fmadd_ps(yi, v2, c##i);                                                  \
    }
#define DW_PUT(i)                                                                              \
    du[(i) * du_stride] = lane_sum(a##i);                                                      \
    du[(i) * du_stride + 1] = lane_sum(b##i);                                                  \
    du[(i) * du_stride + 2] = lane_sum(c##i);
static void dw_tile(const float *y, int64_t ystride, const float *const *v, int64_t n,
                    float *du, int64_t du_stride) {
    FOUR(DW_ZERO)
    const float *v0p = v[0], *v1p = v[1], *v2p = v[2];
    int64_t t = 0;
#define DW_Y(i) _mm256_loadu_ps(y + (i) * ystride + t)
    for (; t + LANES <= n; t += LANES) {
        __m256 v0 = _mm256_loadu_ps(v0p + t), v1 = _mm256_loadu_ps(v1p + t),
               v2 = _mm256_loadu_ps(v2p + t);
        /* (kept in registers: GCC would reload them into every multiply-add) */
        __asm__("" : "+x"(v0), "+x"(v1), "+x"(v2));
        FOUR(DW_STEP)
    }
#undef DW_Y
    if (t < n) {
        const __m256 keep = _mm256_castsi256_ps(_mm256_cmpgt_epi32(
            _mm256_set1_epi32((int)(n - t)), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7)));
        const __m256 v0 = _mm256_loadu_ps(v0p + t), v1 = _mm256_loadu_ps(v1p + t),
                     v2 = _mm256_loadu_ps(v2p + t);
#define DW_Y(i) _mm256_and_ps(_mm256_loadu_ps(y + (i) * ystride + t), keep)
        FOUR(DW_STEP)
#undef DW_Y
    }
    FOUR(DW_PUT)
}

/* du_p = Y_p V_p^T over the group's n tiles, every position. */
static void dw_products(const wg_geom *q, const float *V, const float *Y, const float *zeros,
                        int64_t n, float *du) {
    const int64_t cp = c_padded(q);
    for (int p = 0; p < 16; p++) {
        const float *Vp = V + p * q->vplane, *Yp = Y + p * q->mplane;
        float *dup = du + p * q->OCp * cp;
        for (int64_t c0 = 0; c0 < cp; c0 += DW_COLS) {
            const float *v[DW_COLS];
            for (int i = 0; i < DW_COLS; i++) v[i] = c0 + i < q->C ? Vp + (c0 + i) * q->Tp : zeros;
            for (int64_t o0 = 0; o0 < q->OCp; o0 += ROWS)
                dw_tile(Yp + o0 * q->Tp, q->Tp, v, n, dup + o0 * cp + c0, cp);
        }
    }
}

typedef struct wg_dw_job {
    const wg_geom *q;
    int64_t groups, g0, g1; /* all of them; this round's [g0, g1) */
    const float *x, *dy;
    float *du;    /* the running sum */
    float *slots; /* the round's groups' dU, in order */
    float *ws, *dw;
} wg_dw_job;

/* The round's groups of part t: each transformed whole, then its products into its slot. */
static void dw_groups_part(void *ctx, int t, int nt) {
    const wg_dw_job *j = ctx;
    const wg_geom *q = j->q;
    float *V = j->ws + t * dw_thread_floats(q), *Y = V + 16 * q->vplane;
    float *zeros = Y + 16 * q->mplane + LANES, *ev = zeros + q->Tp;
    float *od = ev + (2 * q->th + 2) * q->Lk, *pad = od + (2 * q->th + 2) * q->Lk;
    const int64_t plane = q->H * q->W;
    /* Y's channels past OC stay zero; the columns past a group's tiles, masked off in Y, must
     * hold numbers in V too (zeros, or an earlier group's: 0 x NaN would be NaN) */
    memset(zeros, 0, (size_t)q->Tp * sizeof *zeros);
    memset(V, 0, (size_t)(16 * q->vplane) * sizeof *V);
    memset(Y, 0, (size_t)(16 * q->mplane) * sizeof *Y);
    zero_padding(q, pad);
    int64_t glo, ghi;
    gp_cpu_split(j->g1 - j->g0, t, nt, 1, &glo, &ghi);
    for (int64_t gi = j->g0 + glo; gi < j->g0 + ghi; gi++) {
        int64_t r0, r1;
        gp_cpu_split(q->rows, (int)gi, (int)j->groups, 1, &r0, &r1);
        for (int64_t b = r0 / q->th; b * q->th < r1; b++) {
            int64_t ty0, ty1, base;
            example_span(q, r0, r1, b, &ty0, &ty1, &base);
            transform_inputs(q, j->x + b * q->C * plane, ty0, ty1, base, ev, od, pad, V);
            for (int64_t o = 0; o < q->OC; o++) {
                split_columns(q, j->dy + (b * q->OC + o) * plane, 2 * ty0 + 1, 2 * ty1 + 1, ev,
                              od, pad);
                transform_grad(q, ev, od, o, ty0, ty1, base, Y);
            }
        }
        dw_products(q, V, Y, zeros, (r1 - r0) * q->tw, j->slots + (gi - j->g0) * du_floats(q));
    }
}

/* The running dU (the first round: its first group's) + the round's groups in order, elements
 * [lo, hi). */
static void dw_reduce_range(void *ctx, int64_t lo, int64_t hi) {
    const wg_dw_job *j = ctx;
    const int64_t n = du_floats(j->q);
    if (j->g0 == 0) memcpy(j->du + lo, j->slots + lo, (size_t)(hi - lo) * sizeof *j->du);
    for (int64_t gi = j->g0 == 0 ? 1 : 0; gi < j->g1 - j->g0; gi++) {
        const float *src = j->slots + gi * n;
        for (int64_t i = lo; i < hi; i++) j->du[i] += src[i];
    }
}

/* dw[o][c] += G^T dU[o][c] G for output channels [lo, hi), G^T = [1 1/2 1/2 0; 0 1/2 -1/2 0;
 * 0 1/2 1/2 1]. */
static void dw_transform_range(void *ctx, int64_t lo, int64_t hi) {
    const wg_dw_job *j = ctx;
    const wg_geom *q = j->q;
    const int64_t cp = c_padded(q), pstride = q->OCp * cp;
    for (int64_t o = lo; o < hi; o++)
        for (int64_t c = 0; c < q->C; c++) {
            float x[4][4], t[3][4];
            for (int p = 0; p < 16; p++) x[p / 4][p % 4] = j->du[p * pstride + o * cp + c];
            for (int b = 0; b < 4; b++) {
                t[0][b] = x[0][b] + 0.5f * (x[1][b] + x[2][b]);
                t[1][b] = 0.5f * (x[1][b] - x[2][b]);
                t[2][b] = 0.5f * (x[1][b] + x[2][b]) + x[3][b];
            }
            float *d = j->dw + (o * q->C + c) * 9;
            for (int a = 0; a < 3; a++) {
                d[a * 3 + 0] += t[a][0] + 0.5f * (t[a][1] + t[a][2]);
                d[a * 3 + 1] += 0.5f * (t[a][1] - t[a][2]);
                d[a * 3 + 2] += 0.5f * (t[a][1] + t[a][2]) + t[a][3];
            }
        }
}

void gp_conv_winograd_dw(gp_device *dev, const gp_conv_geom *g, int64_t batch, int64_t oc,
                         const float *x, const float *dy, float *dw, float *ws) {
    if (batch <= 0) return;
    int64_t groups;
    const wg_geom q = dw_geom_of(g, batch, oc, &groups);
    const int64_t slots = groups < DW_ROUND ? groups : DW_ROUND;
    wg_dw_job j = {.q = &q, .groups = groups, .x = x, .dy = dy, .du = ws,
                   .slots = ws + du_floats(&q), .ws = ws + (1 + slots) * du_floats(&q), .dw = dw};
    gp_cpu_pool *pool = gp_cpu_pool_of(dev);
    for (j.g0 = 0; j.g0 < groups; j.g0 = j.g1) {
        j.g1 = j.g0 + DW_ROUND < groups ? j.g0 + DW_ROUND : groups;
        gp_cpu_pool_run(pool, threads_for(dev, j.g1 - j.g0), dw_groups_part, &j);
        gp_cpu_parallel_for(pool, du_floats(&q), LANES, 1 << 14, dw_reduce_range, &j);
    }
    gp_cpu_parallel_for(pool, oc, 1, WEIGHTS_GRAIN, dw_transform_range, &j);
}

#else /* no AVX2 tiles in this variant: applies() is false, and these are never called */

void gp_conv_winograd_weights(gp_device *dev, const gp_conv_geom *g, int64_t oc, const float *w,
                              bool flipped, float *U) {
    (void)dev, (void)g, (void)oc, (void)w, (void)flipped, (void)U;
}
void gp_conv_winograd_forward(gp_device *dev, const gp_conv_geom *g, int64_t batch, int64_t oc,
                              const float *x, const float *w, const float *U, bool flipped,
                              float *y, float *ws) {
    (void)dev, (void)g, (void)batch, (void)oc, (void)x, (void)w, (void)U, (void)flipped, (void)y,
        (void)ws;
}
bool gp_conv_winograd_dw_serves(const gp_conv_geom *g, int64_t batch, int64_t oc) {
    (void)g, (void)batch, (void)oc;
    return false;
}
int64_t gp_conv_winograd_dw_ws(gp_device *dev, const gp_conv_geom *g, int64_t batch,
                               int64_t oc) {
    (void)dev, (void)g, (void)batch, (void)oc;
    return 0;
}
void gp_conv_winograd_dw(gp_device *dev, const gp_conv_geom *g, int64_t batch, int64_t oc,
                         const float *x, const float *dy, float *dw, float *ws) {
    (void)dev, (void)g, (void)batch, (void)oc, (void)x, (void)dy, (void)dw, (void)ws;
}
#endif
