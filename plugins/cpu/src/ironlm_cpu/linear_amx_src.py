"""C source of the AMX bfloat16 linear (``linear_kernel``'s library, AMX builds only): the same
panel-packed weights as the AVX-512 BF16 tiles, multiplied by the tile unit.

Why: on an Intel Xeon with AMX (2 cores) torch's bf16 matmul (oneDNN, AMX) ran a batch-64
SmolLM2 decode step's linears at ~330 GFLOP/s, 5 GB/s of weights from DRAM against the ~20
GB/s the VM reads; the AVX-512 BF16 dot-product tile (``linear_bf16_src``) ran 3x slower than
oneDNN there. One ``tdpbf16ps`` multiplies a 16 x 32 bf16 block of x by a 32 x 16 block of
the weight into a 16 x 16 float32 tile, so compute is cheap and the weight stream is the
limit.

Layout: the bf16 panel layout ``(N / 16, K / 2, 16, 2)`` is already AMX's VNNI B layout: 16
consecutive panel rows (k pairs) are one B tile (16 rows x 64 bytes, stride 64). The driver
(``amx_tiles_src.amx_run``: x packed into A tiles of 16 rows x 32 k values, decode rows against
streamed panels, B tiles asked for ``AMX_BF16_AHEAD`` steps ahead, prefill rows in chunks
against panel groups kept in L2) is shared with the int8 w8a8 kernel; this file gives it the
bf16 product and the flush: the float32 tiles to the bf16 (or float32 LM-head) output with the
rounding and bias of the AVX-512 path (``bf_store16``).

Measured on the 2-core Intel Xeon with AMX (model 207), SmolLM2's four layer shapes x 30 layers,
weights from DRAM, against torch's oneDNN (AMX too) in the same process: 8 rows 10.6-14.9 vs
19.6-29.2 ms, 64 rows 15.9-31.1 vs 25.0-54.9 ms; oneDNN stays faster at 2048 rows (712 vs 870
ms; with the prefill driver's panel groups since stop 42, 252-273 vs 205-242 ms), where the
tuner keeps it. Variants that lost or tied at decode sizes: 2 row blocks x 2 panels per B/A load
pair (64 rows 33.7 vs 26.3 ms; the prefill driver's order), A tiles read from x's rows unpacked
(30.3), no software prefetch (32.9 vs 27.6), prefetch into L1 at 4-32 steps (within the noise).

Where the tile permission is refused, or K is not a multiple of 32, the AVX-512 BF16 path
runs instead.
"""

AMX_SOURCE = r"""
#if HAVE_AMX && defined(__AVX512BF16__)
#define AMX_BF16_AHEAD 16 /* k steps (1 KiB of a panel each) ahead that the weight is asked for */

typedef struct {
    bf_out y;
    const uint16_t *bias;
    int m, n;
} amx_bf16_out;

/* a float32 tile -> y rows [row0, row0 + 16) below m x 16 columns at col0 (bias, rounding) */
static void amx_bf16_flush(const void *tile, int row0, int col0, const void *ctx) {
    const amx_bf16_out *o = ctx;
    const float *t = tile;
    const int valid = o->m - row0 < 16 ? o->m - row0 : 16;
    for (int r = 0; r < valid; r++)
        bf_store16(bf_at(o->y, (int64_t)(row0 + r) * o->n + col0), _mm512_loadu_ps(t + 16 * r),
                   o->bias ? o->bias + col0 : 0);
}

/* y (m, n) = x (m, k) @ W^T (+ bias) on the tile unit; 0: not run (no permission, k % 32) */
static int amx_linear(const uint16_t *x, const uint16_t *wp, const uint16_t *bias, bf_out y,
                      int m, int n, int k, int threads) {
    if (k % 32 != 0) return 0;
    const amx_bf16_out out = {y, bias, m, n};
    const amx_job job = {(const char *)x, 2 * (int64_t)k, (const char *)wp, 32 * (int64_t)k,
                         m, n / 16, k / 32, 0, AMX_BF16_AHEAD, amx_bf16_flush, &out};
    return amx_run(&job, threads);
}
#endif
"""
