"""C source of the AMX bfloat16 linear (``linear_kernel``'s library, AMX builds only): the same
panel-packed weights as the AVX-512 BF16 tiles, multiplied by the tile unit.

Why: on an Intel Xeon with AMX (2 cores) torch's bf16 matmul (oneDNN, AMX) ran a batch-64
SmolLM2 decode step's linears at ~330 GFLOP/s, 5 GB/s of weights from DRAM against the ~20
GB/s the VM reads; the AVX-512 BF16 dot-product tile (``linear_bf16_src``) ran 3x slower than
oneDNN there. One ``tdpbf16ps`` multiplies a 16 x 32 bf16 block of x by a 32 x 16 block of
the weight into a 16 x 16 float32 tile, so compute is cheap and the weight stream is the
limit.

Layout: the bf16 panel layout ``(N / 16, K / 2, 16, 2)`` is already AMX's VNNI B layout: 16
consecutive panel rows (k pairs) are one B tile (16 rows x 64 bytes, stride 64). x is packed
once per call into A tiles (16 rows x 32 k values, 1 KiB contiguous; rows past m zero).
Tiles: C0..C3 (four row blocks of one panel), A in 4 and 5 (alternating, so a load need not
wait for the product reading the other), B in 6 and 7 (alternating k steps). Each thread
configures its tiles and takes whole panels (decode: each weight byte read once, its tiles
asked for ``AMX_AHEAD`` steps ahead); a prefill's rows go in chunks that stay in L2. The C
tiles go through a float32 scratch to the bf16 (or float32 LM-head) output with the rounding
and bias of the AVX-512 path (``bf_store16``).

Measured on the 2-core Intel Xeon with AMX (model 207), SmolLM2's four layer shapes x 30
layers, weights from DRAM, against torch's oneDNN (AMX too) in the same process: 8 rows
10.6-14.9 vs 19.6-29.2 ms, 64 rows 15.9-31.1 vs 25.0-54.9 ms; oneDNN stays faster at 2048
rows (712 vs 870 ms), where the tuner keeps it. Variants that lost or tied: 2 row blocks x 2
panels per B/A load pair (64 rows 33.7 vs 26.3 ms), A tiles read from x's rows unpacked (30.3),
no software prefetch (32.9 vs 27.6), prefetch into L1 at 4-32 steps (within the noise).

The tile permission and configuration are ``amx_tiles_src``'s; where the permission is
refused, or K is not a multiple of 32, the AVX-512 BF16 path runs instead.
"""

AMX_SOURCE = r"""
#if defined(__AMX_TILE__) && defined(__AMX_BF16__) && defined(__AVX512BF16__)
#include <stdlib.h>

#define AMX_AHEAD 16 /* k steps (1 KiB of a panel each) ahead that the weight is asked for */

/* Row blocks per chunk: a prefill's rows go in chunks (256 rows, 295 KiB of packed x at K =
   576) that stay in L2 while every panel passes; with every row per panel, each panel re-read
   the whole packed x from L3 (SmolLM2's four shapes x 30 layers at 2048 rows, AMX Xeon, 2
   threads: 1360 -> 870 ms; torch's oneDNN 712, so the tuner keeps torch for prefill). */
#define AMX_CHUNK 16

/* C tile T -> y rows [R0, R0 + 16) below m x 16 columns at COL (bias added, rounded) */
#define AMX_FLUSH(T, R0, COL)                                                                  \
    do {                                                                                       \
        _tile_stored(T, scratch, 64);                                                          \
        const int valid = m - (R0) < 16 ? m - (R0) : 16;                                       \
        for (int r = 0; r < valid; r++)                                                        \
            bf_store16(bf_at(y, (int64_t)((R0) + r) * n + (COL)),                              \
                       _mm512_loadu_ps(scratch + 16 * r), bias ? bias + (COL) : 0);            \
    } while (0)

/* row block RB's A tiles, packed: step s's tile at + 512 s (16 rows x 32 bf16, stride 64) */
#define AMX_A(RB) (xp + (int64_t)(RB) * steps * 512)
/* k step S of up to 4 row blocks against B tile TB: A tiles alternate between 4 and 5 so
   the next load need not wait for the product reading the other */
#define AMX_STEP(TB, S)                                                                        \
    do {                                                                                       \
        const int64_t st_ = (S);                                                               \
        _tile_loadd(TB, b + 512 * st_, 64);                                                    \
        for (int l = 0; l < 16; l++) /* the B tile AMX_AHEAD steps on, a line each */        \
            _mm_prefetch((const char *)(b + 512 * (st_ + AMX_AHEAD) + 32 * l), _MM_HINT_T1);   \
        _tile_loadd(4, a0 + 512 * st_, 64);                                                    \
        _tile_dpbf16ps(0, 4, TB);                                                              \
        if (nb > 1) { _tile_loadd(5, a1 + 512 * st_, 64); _tile_dpbf16ps(1, 5, TB); }          \
        if (nb > 2) { _tile_loadd(4, a2 + 512 * st_, 64); _tile_dpbf16ps(2, 4, TB); }          \
        if (nb > 3) { _tile_loadd(5, a3 + 512 * st_, 64); _tile_dpbf16ps(3, 5, TB); }          \
    } while (0)

/* y (m, n) = x (m, k) @ W^T (+ bias) on the tile unit; 0: not run (no permission, k % 32) */
static int amx_linear(const uint16_t *x, const uint16_t *wp, const uint16_t *bias, bf_out y,
                      int m, int n, int k, int threads) {
    if (k % 32 != 0 || !amx_permitted()) return 0;
    const int blocks = (m + 15) / 16, panels = n / 16, steps = k / 32;
    const int chunks = (blocks + AMX_CHUNK - 1) / AMX_CHUNK;
    const int64_t ps = (int64_t)k * 16;
    /* x packed as A tiles (rows past m zero): each tile load reads 1 KiB in a row */
    uint16_t *xp = aligned_alloc(64, sizeof(uint16_t) * (size_t)blocks * 16 * k);
    if (!xp) return 0;
    #pragma omp parallel num_threads(threads)
    {
        float scratch[256] __attribute__((aligned(64)));
        #pragma omp for schedule(static)
        for (int rb = 0; rb < blocks; rb++)
            for (int r = 0; r < 16; r++) {
                const int row = rb * 16 + r;
                for (int st = 0; st < steps; st++) {
                    uint16_t *dst = xp + ((int64_t)rb * steps + st) * 512 + 32 * r;
                    if (row < m) __builtin_memcpy(dst, x + (int64_t)row * k + 32 * st, 64);
                    else __builtin_memset(dst, 0, 64);
                }
            }
        amx_configure();
        #pragma omp for collapse(2) schedule(static)
        for (int c = 0; c < chunks; c++)
        for (int p = 0; p < panels; p++) {
            const uint16_t *b = wp + p * ps;
            const int c1 = CHUNK_ROW(c + 1, blocks, chunks); /* equal chunks of blocks */
            for (int r0 = CHUNK_ROW(c, blocks, chunks); r0 < c1; r0 += 4) {
                const int nb = c1 - r0 < 4 ? c1 - r0 : 4;
                const uint16_t *a0 = AMX_A(r0), *a1 = AMX_A(r0 + 1), *a2 = AMX_A(r0 + 2),
                               *a3 = AMX_A(r0 + 3);
                _tile_zero(0); _tile_zero(1); _tile_zero(2); _tile_zero(3);
                int s = 0;
                for (; s + 2 <= steps; s += 2) { /* B tiles 6 and 7 take turns */
                    AMX_STEP(6, s);
                    AMX_STEP(7, s + 1);
                }
                if (s < steps) AMX_STEP(6, s);
                AMX_FLUSH(0, r0 * 16, p * 16);
                if (nb > 1) AMX_FLUSH(1, r0 * 16 + 16, p * 16);
                if (nb > 2) AMX_FLUSH(2, r0 * 16 + 32, p * 16);
                if (nb > 3) AMX_FLUSH(3, r0 * 16 + 48, p * 16);
            }
        }
        _tile_release();
    }
    free(xp);
    return 1;
}
#endif
"""
