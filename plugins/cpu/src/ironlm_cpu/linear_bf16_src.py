"""C source of the bfloat16 linear over panel-packed weights (``linear_kernel``): W packed as
(N / 16, K / 2, 16, 2), x and y bf16, float32 sums. AVX-512 BF16 builds run ``vdpbf16ps``
register tiles; other builds widen the bf16 pairs to float32 (a shift and a mask per 32-bit
lane). Appended to ``linear_kernel``'s source, whose vector types it uses."""

BF16_SOURCE = r"""
#include <omp.h>
/* -- bfloat16: W packed as (n / 16, k / 2, 16, 2), x and y bf16 (m, k) / (m, n), f32 sums --- */
static inline float bf16_f32(uint16_t h) {
    union { uint32_t u; float f; } v = {(uint32_t)h << 16};
    return v.f;
}

/* round to nearest even, as torch converts float32 to bfloat16 */
static inline void store_bf16(uint16_t *y, v8 a) {
    v8u u = (v8u)a;
    u = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
    *(v8h *)y = __builtin_convertvector(u, v8h);
}

#if defined(__AVX512BF16__)
/* AVX-512 BF16: tiles of up to BF_RT rows x BF_PT adjacent panels (8 x 48 outputs, 24 zmm
   accumulators): per k pair, BF_PT loads of a panel row (16 columns x 2 bf16), then per x row
   one broadcast of its (x[k], x[k+1]) pair and BF_PT vdpbf16ps. Each weight load serves 8
   rows and each broadcast 3 panels, so the loop runs near the dot products' peak from 8 rows
   up (~1000 GFLOP/s at 64 and 512 rows on the 2-core Zen 5, oneDNN's bf16 matmul 800-950); a
   single row runs two k chains per panel (decode: the weight streams once).
   A group's weights come from DRAM in a decode step (the model's weights do not fit in L3):
   tile t < BF_PT of a group also asks for panel t of the next group, a line per k pair, into
   L2, so the next group's first tile finds its weights there instead of waiting on memory
   (3072 x 576 at 64 rows on the Zen 5, weights from DRAM: 273 -> 240 us; in cache 227,
   unchanged). */
#define BF_RT 8
#define BF_PT 3
#define BF_PF 32 /* k pairs ahead (2 KiB of a panel) that software prefetch asks for: the
                    hardware prefetchers lag on 3 panel streams (49152 x 576 at 8 rows:
                    1.2 -> 0.8 ms); a prefetch past the weight's end is harmless */
#define BF_PREFETCH(Q, KK) _mm_prefetch((const char *)(p + (Q) * ps + 32 * (int64_t)((KK) + BF_PF)), \
                                        _MM_HINT_T0)

/* The output: bf16 elements, or (f32) the same bf16 values widened to float32 (the LM head's
   logits, which the sampler reads as float32: no separate widening pass). y + e: element e. */
typedef struct { void *p; int f32; } bf_out;
static inline __attribute__((always_inline)) bf_out bf_at(bf_out y, int64_t e) {
    return (bf_out){(char *)y.p + e * (y.f32 ? 4 : 2), y.f32};
}

/* 16 float sums (+ bias) -> 16 bf16, round to nearest even (as float32 for an f32 output) */
static inline __attribute__((always_inline)) void bf_store16(bf_out y, __m512 a,
                                                              const uint16_t *bias) {
    if (bias)
        a = _mm512_add_ps(a, _mm512_castsi512_ps(_mm512_slli_epi32(
                                 _mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)bias)), 16)));
    __m512i u = _mm512_castps_si512(a);
    u = _mm512_add_epi32(u, _mm512_add_epi32(_mm512_set1_epi32(0x7fff),
                                             _mm512_and_si512(_mm512_srli_epi32(u, 16),
                                                              _mm512_set1_epi32(1))));
    if (y.f32)
        _mm512_storeu_si512(y.p, _mm512_and_si512(u, _mm512_set1_epi32((int)0xffff0000u)));
    else
        _mm256_storeu_si256((__m256i *)y.p, _mm512_cvtepi32_epi16(_mm512_srli_epi32(u, 16)));
}

#define BF_PANEL_ROW(Q, KK) \
    ((__m512bh)_mm512_loadu_si512((const void *)(p + (Q) * ps + 32 * (int64_t)(KK))))
#define BF_PAIR(XR, KK) ((__m512bh)_mm512_set1_epi32(*(const int32_t *)((XR) + 2 * (KK))))

/* y rows [0, R) x panels [0, P) of a tile; p: the first panel, ps: uint16s per panel */
static inline __attribute__((always_inline)) void bf_tile(
    const int R, const int P, const uint16_t *x, int64_t ldx, const uint16_t *p, int64_t ps,
    int k2, const uint16_t *bias, bf_out y, int64_t ldy, const uint16_t *next) {
    __m512 acc[BF_RT][BF_PT];
    for (int r = 0; r < R; r++)
        for (int q = 0; q < P; q++) acc[r][q] = _mm512_setzero_ps();
    for (int kk = 0; kk < k2; kk++) {
        __m512bh w[BF_PT];
        for (int q = 0; q < P; q++) {
            w[q] = BF_PANEL_ROW(q, kk);
            BF_PREFETCH(q, kk);
        }
        if (next) _mm_prefetch((const char *)(next + 32 * (int64_t)kk), _MM_HINT_T1);
        for (int r = 0; r < R; r++) {
            const __m512bh xp = BF_PAIR(x + r * ldx, kk);
            for (int q = 0; q < P; q++) acc[r][q] = _mm512_dpbf16_ps(acc[r][q], xp, w[q]);
        }
    }
    for (int r = 0; r < R; r++)
        for (int q = 0; q < P; q++)
            bf_store16(bf_at(y, r * ldy + 16 * q), acc[r][q], bias ? bias + 16 * q : 0);
}

/* one row: two k chains per panel, so the dot products' latency does not bound the stream;
   each panel's stream kicked on once a page (`KICK`: a k pair's panel row is one line),
   instead of BF_PREFETCH's line per k pair: batch-1 SmolLM2 bf16 replay on the Zen 5 4-5%
   faster (0.73-0.78 -> 0.78 of the bandwidth bound at 74-79 GB/s, 0.93 -> 0.96 at 45-48);
   KICK_AHEAD comes from the float32 source this one follows (linear_kernel) */
#define BF_KICK(Q, KK)                                                                         \
    do {                                                                                       \
        _mm_prefetch((const char *)(p + (Q) * ps + 32 * (int64_t)((KK) + KICK_AHEAD)),         \
                     _MM_HINT_T0);                                                             \
        _mm_prefetch((const char *)(p + (Q) * ps + 32 * (int64_t)((KK) + KICK_AHEAD + 1)),     \
                     _MM_HINT_T0);                                                             \
    } while (0)
static inline __attribute__((always_inline)) void bf_tile1(
    const int P, const uint16_t *x, const uint16_t *p, int64_t ps, int k2,
    const uint16_t *bias, bf_out y) {
    __m512 a[BF_PT], b[BF_PT];
    for (int q = 0; q < P; q++) a[q] = b[q] = _mm512_setzero_ps();
    int kk = 0;
    for (; kk + 2 <= k2; kk += 2) {
        const __m512bh x0 = BF_PAIR(x, kk), x1 = BF_PAIR(x, kk + 1);
        for (int q = 0; q < P; q++) {
            if ((kk & 63) == 0) BF_KICK(q, kk);
            a[q] = _mm512_dpbf16_ps(a[q], x0, BF_PANEL_ROW(q, kk));
            b[q] = _mm512_dpbf16_ps(b[q], x1, BF_PANEL_ROW(q, kk + 1));
        }
    }
    if (kk < k2)
        for (int q = 0; q < P; q++) a[q] = _mm512_dpbf16_ps(a[q], BF_PAIR(x, kk), BF_PANEL_ROW(q, kk));
    for (int q = 0; q < P; q++)
        bf_store16(bf_at(y, 16 * q), _mm512_add_ps(a[q], b[q]), bias ? bias + 16 * q : 0);
}

/* the tile for `rows` (1..BF_RT) x `np` (1..BF_PT): constant sizes, so each case unrolls
   and keeps its accumulators in registers;
   next: a panel to pull into L2 alongside (NULL: none; the one-row tile streams alone) */
#define BF_TILES(R)                                                                            \
    if (np == 1) bf_tile(R, 1, x, ldx, p, ps, k2, bias, y, ldy, next);                         \
    else if (np == 2) bf_tile(R, 2, x, ldx, p, ps, k2, bias, y, ldy, next);                    \
    else bf_tile(R, 3, x, ldx, p, ps, k2, bias, y, ldy, next);
#define BF_CASE(R) case R: BF_TILES(R) break;
static void bf_tile_any(int rows, int np, const uint16_t *x, int64_t ldx, const uint16_t *p,
                        int64_t ps, int k2, const uint16_t *bias, bf_out y, int64_t ldy,
                        const uint16_t *next) {
    switch (rows) {
    case 1:
        if (np == 1) bf_tile1(1, x, p, ps, k2, bias, y);
        else if (np == 2) bf_tile1(2, x, p, ps, k2, bias, y);
        else bf_tile1(3, x, p, ps, k2, bias, y);
        break;
    BF_CASE(2) BF_CASE(3) BF_CASE(4) BF_CASE(5) BF_CASE(6) BF_CASE(7)
    default: BF_TILES(BF_RT) break; /* np constant too: acc[][] stays in registers */
    }
}

/* rows [m0, m1) of y for panel groups [g0, g1): tile by tile, rows inner so the group's
   weights serve every row while in L1/L2; with pull_next, the first BF_PT tiles of a group
   pull in the next group, a panel each */
static void linear_bf16_rows(const uint16_t *x, const uint16_t *wp, const uint16_t *bias,
                             bf_out y, int m0, int m1, int n, int k, int g0, int g1,
                             int pull_next) {
    const int panels = n / 16, groups = (panels + BF_PT - 1) / BF_PT;
    const int64_t ps = (int64_t)k * 16;
    for (int g = g0; g < g1; g++) {
        const int pi = g * BF_PT, np = panels - pi < BF_PT ? panels - pi : BF_PT;
        for (int i = m0, t = 0; i < m1; i += BF_RT, t++) {
            const uint16_t *next =
                pull_next && t < BF_PT && g + 1 < groups ? wp + (pi + BF_PT + t) * ps : 0;
            bf_tile_any(m1 - i < BF_RT ? m1 - i : BF_RT, np, x + (int64_t)i * k, k,
                        wp + pi * ps, ps, k / 2, bias ? bias + 16 * pi : 0,
                        bf_at(y, (int64_t)i * n + 16 * pi), n, next);
        }
    }
}

/* Rows per thread from which the threads split the rows instead of the columns: a prefill's
   next ops (norms, activation, rotary, the attention rows) split rows too, so each thread
   finds its rows in its own cache instead of half of every row in the other core's. The
   linear itself runs as fast either way (2 threads, Zen 5: 256-2048 rows of SmolLM2's four
   shapes, 990-1030 GFLOP/s both); the 32 x 64-token prefill step's norms went 19.0 -> 8.4 ms,
   rotary 9.7 -> 4.9, gated activation 31 -> 18-27 (noisy), its attention rows 46.6 -> 33.5. */
#define BF_ROW_SPLIT 256

#if HAVE_AMX && defined(__AVX512BF16__)
/* AMX builds: from AMX_MIN_ROWS rows the tile unit runs it (``linear_amx_src``) */
#define AMX_MIN_ROWS 2
static int amx_linear(const uint16_t *x, const uint16_t *wp, const uint16_t *bias, bf_out y,
                      int m, int n, int k, int threads);
#endif

/* y (m, n) = x (m, k) @ W^T (+ bias) in bfloat16 (float32 sums); n % 16 == 0, k % 2 == 0.
   Work items: (group of BF_PT panels, chunk of rows that stays in L2) */
static void linear_bf16(const uint16_t *x, const uint16_t *wp, const uint16_t *bias, bf_out y,
                        int m, int n, int k, int threads) {
#if HAVE_AMX && defined(__AVX512BF16__)
    if (m >= AMX_MIN_ROWS && amx_linear(x, wp, bias, y, m, n, k, threads)) return;
#endif
    const int panels = n / 16, groups = (panels + BF_PT - 1) / BF_PT;
    const int64_t ps = (int64_t)k * 16;
    int mc = (262144 / (2 * k)) / BF_RT * BF_RT;
    if (mc < BF_RT) mc = BF_RT;
    if (mc > m) mc = m;
    const int chunks = (m + mc - 1) / mc;
    if (threads > 1 && m >= threads * BF_ROW_SPLIT) {
        /* many rows: each thread its own rows, every column (see BF_ROW_SPLIT) */
        #pragma omp parallel num_threads(threads)
        {
            const int t = omp_get_thread_num(), nt = omp_get_num_threads();
            const int q = m / nt, extra = m % nt; /* OpenMP's static split of m rows */
            const int r0 = t * q + (t < extra ? t : extra), r1 = r0 + q + (t < extra);
            const int nc = (r1 - r0 + mc - 1) / mc; /* equal chunks of at most mc rows */
            const int size = ((r1 - r0 + nc - 1) / nc + BF_RT - 1) / BF_RT * BF_RT;
            for (int m0 = r0; m0 < r1; m0 += size)
                linear_bf16_rows(x, wp, bias, y, m0, m0 + size < r1 ? m0 + size : r1, n, k, 0,
                                 groups, 1);
        }
        return;
    }
    #pragma omp parallel for collapse(2) schedule(static) num_threads(threads)
    for (int g = 0; g < groups; g++) {
        for (int c = 0; c < chunks; c++) {
            const int m0 = c * mc, m1 = m0 + mc < m ? m0 + mc : m;
            linear_bf16_rows(x, wp, bias, y, m0, m1, n, k, g, g + 1, c == 0);
        }
    }
}

void ironlm_linear_bf16(const uint16_t *x, const uint16_t *wp, const uint16_t *bias,
                        uint16_t *y, int m, int n, int k, int threads) {
    linear_bf16(x, wp, bias, (bf_out){y, 0}, m, n, k, threads);
}

/* the same into float32 y: each output rounded to bf16 as above, stored widened (the LM
   head's logits: a batch-64 SmolLM2 step's separate bf16 -> float32 pass, 0.37 ms, gone) */
void ironlm_linear_bf16_f32out(const uint16_t *x, const uint16_t *wp, const uint16_t *bias,
                               float *y, int m, int n, int k, int threads) {
    linear_bf16(x, wp, bias, (bf_out){y, 1}, m, n, k, threads);
}
#else
#define BF_MR 4
/* 16 columns x MR rows: a panel row's 32-bit lane c holds (W[c, k], W[c, k+1]); shifting the
   lane left by 16 gives W[c, k] as a float, masking the low half gives W[c, k+1] */
static void bf_tile(int rows, const uint16_t *x, int64_t ldx, const uint16_t *p, int k,
                    const uint16_t *bias, uint16_t *y, int64_t ldy) {
    v8 a0 = {0}, b0 = {0}, a1 = {0}, b1 = {0}, a2 = {0}, b2 = {0}, a3 = {0}, b3 = {0};
    const v8u hi_mask = (v8u){0} + 0xffff0000u;
    for (int kk = 0; kk < k / 2; kk++) {
        const v8u wa = *(const v8u *)(p + 32 * (int64_t)kk);
        const v8u wb = *(const v8u *)(p + 32 * (int64_t)kk + 16);
        const v8 la = (v8)(wa << 16), ha = (v8)(wa & hi_mask);
        const v8 lb = (v8)(wb << 16), hb = (v8)(wb & hi_mask);
#define BF_ROW(I)                                                                              \
        if (rows > I) {                                                                        \
            const float x0 = bf16_f32(x[I * ldx + 2 * kk]);                                    \
            const float x1 = bf16_f32(x[I * ldx + 2 * kk + 1]);                                \
            a##I += x0 * la + x1 * ha;                                                         \
            b##I += x0 * lb + x1 * hb;                                                         \
        }
        BF_ROW(0) BF_ROW(1) BF_ROW(2) BF_ROW(3)
    }
    v8 bl = {0}, bh = {0};
    if (bias)
        for (int c = 0; c < 8; c++) { bl[c] = bf16_f32(bias[c]); bh[c] = bf16_f32(bias[c + 8]); }
#define BF_OUT(I)                                                                              \
    if (rows > I) {                                                                            \
        store_bf16(y + I * ldy, a##I + bl);                                                    \
        store_bf16(y + I * ldy + 8, b##I + bh);                                                \
    }
    BF_OUT(0) BF_OUT(1) BF_OUT(2) BF_OUT(3)
}
/* y (m, n) = x (m, k) @ W^T (+ bias) in bfloat16 (float32 sums); n % 16 == 0, k % 2 == 0 */
void ironlm_linear_bf16(const uint16_t *x, const uint16_t *wp, const uint16_t *bias,
                        uint16_t *y, int m, int n, int k, int threads) {
    const int panels = n / 16;
    int mc = (65536 / k) / BF_MR * BF_MR;
    if (mc < BF_MR) mc = BF_MR;
    if (mc > m) mc = m;
    const int chunks = (m + mc - 1) / mc;
    const int group = m <= BF_MR ? (panels + threads - 1) / threads : 4;
    const int groups = (panels + group - 1) / group;
    #pragma omp parallel for collapse(2) schedule(static) num_threads(threads)
    for (int c = 0; c < chunks; c++) {
        for (int g = 0; g < groups; g++) {
            const int m0 = CHUNK_ROW(c, m, chunks), m1 = CHUNK_ROW(c + 1, m, chunks);
            const int p1 = (g + 1) * group < panels ? (g + 1) * group : panels;
            for (int pi = g * group; pi < p1; pi++)
                for (int i = m0; i < m1; i += BF_MR)
                    bf_tile(m1 - i < BF_MR ? m1 - i : BF_MR, x + (int64_t)i * k, k,
                            wp + (int64_t)pi * k * 16, k, bias ? bias + pi * 16 : NULL,
                            y + (int64_t)i * n + pi * 16, n);
        }
    }
}


/* the same into float32 y (exported by every build, so the library's signatures are one
   list; ``PackedLinearKernel`` calls it on AVX-512 BF16 builds only): the bf16 result widened */
void ironlm_linear_bf16_f32out(const uint16_t *x, const uint16_t *wp, const uint16_t *bias,
                               float *y, int m, int n, int k, int threads) {
    /* the bf16 result in y's first half, widened in place from the end (element e's float
       overwrites bf16 elements 2e and 2e + 1, both read already) */
    uint16_t *h = (uint16_t *)y;
    ironlm_linear_bf16(x, wp, bias, h, m, n, k, threads);
    for (int64_t e = (int64_t)m * n - 1; e >= 0; e--) y[e] = bf16_f32(h[e]);
}
#endif

/* the bf16 path this build runs: 2 AMX tiles (from AMX_MIN_ROWS rows; the kernel granted this
   process the tile state) and AVX-512 BF16 dot products, 1 AVX-512 BF16 dot products, 0
   widening to float32 */
int ironlm_linear_bf16_native(void) {
#if HAVE_AMX && defined(__AVX512BF16__)
    return amx_permitted() ? 2 : 1;
#elif defined(__AVX512BF16__)
    return 1;
#else
    return 0;
#endif
}
"""
