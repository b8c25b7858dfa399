"""Linear layers over panel-packed weights, in C (torch's OpenMP team): float32 and bfloat16.

Why: at the shapes decoding produces, torch's ``F.linear`` can be far from the machine's limits.
Measured on the 2-core AVX2 EPYC (SmolLM2's 3072 x 576 gate/up weight): one row reads the
weight at ~9.5 GB/s (MKL gemv) against ~18 GB/s a plain sum reaches, and 64 rows run at ~40
GFLOP/s against a ~65 GFLOP/s matmul peak, because MKL repacks the weight on every call. Packing
it once, at load time, fixes both: 19 GB/s at one row, 68 GFLOP/s at 64 rows. Whether that holds
on another CPU is measured at start-up (``tuner``): torch stays where it is faster.

Layout: a float32 weight (N, K) is stored as N/16 panels of (K, 16) floats, contiguous
(``pack``): panel p holds output columns 16p..16p+15, row k of a panel is those columns' k-th
input weights. Two register tiles read it, written with GNU vector types so that one source
serves every ISA target (``isa``):
- narrow: up to 6 rows of x times one panel, 12 accumulators of 8 floats (ymm with AVX2);
- wide: up to 12 rows times two adjacent panels, 24 accumulators of 16 floats (zmm with
  AVX-512, where it has 32 registers; on AVX2 it spills and the tuner leaves it out).
Work is split over (chunk of x rows, group of panels); the x chunk is sized to stay in L2
while its panels stream past it. With at most one tile of rows (decode of small batches), each
thread takes one contiguous run of panels, so it streams the weight at full bandwidth, asking
for each page's lines a page ahead of the hardware prefetcher (``KICK`` in the source).

bfloat16 weights are packed as (N/16, K/2, 16, 2): row kk of a panel holds each column's
weights of inputs 2kk and 2kk+1, the pairs an AVX-512 BF16 ``vdpbf16ps`` multiplies (8 rows x
48 columns per tile; ``linear_bf16_src``); without AVX-512 BF16 the same 32-bit lanes are widened to float32 by a
shift and a mask (4 x 16 tiles), so bf16 weights halve the bytes a decode step reads on any
CPU. On AMX builds the same layout is the tile unit's B operand: from 2 rows ``tdpbf16ps``
runs it (``linear_amx_src``). Sums are float32, the output rounded to bf16 to nearest even, as
torch does.

Scope: N a multiple of 16 (bf16: K even too); other weights stay row-major and use torch.
Same numerics as a matmul up to summation order.
"""

from __future__ import annotations

import ctypes

import torch

from ironlm_cpu.cbuild import KernelLibrary
from ironlm_cpu.isa import IsaTarget
from ironlm_cpu.amx_tiles_src import AMX_TILES_SOURCE
from ironlm_cpu.linear_amx_src import AMX_SOURCE
from ironlm_cpu.linear_bf16_src import BF16_SOURCE

PANEL = 16  # output columns per panel

_SOURCE = r"""
#include <stddef.h>
#include <stdint.h>
#if defined(__AVX512BF16__)
#include <immintrin.h>
#endif

/* GNU vector types (alignment 4: loads from packed panels need not be vector-aligned). The
   compiler maps them to the target's registers: v8 is one ymm with AVX2, v16 one zmm with
   AVX-512 (two ymm with AVX2, four xmm on the x86-64 baseline); a * b + c becomes an FMA
   where the target has one. */
typedef float v8 __attribute__((vector_size(32), aligned(4)));
typedef float v16 __attribute__((vector_size(64), aligned(4)));
typedef uint32_t v8u __attribute__((vector_size(32), aligned(4)));
typedef uint16_t v8h __attribute__((vector_size(16), aligned(2)));

/* First row of chunk c when m rows go in `chunks` chunks of equal size (+-1 row). Chunks of a
   fixed size left the last one short, and a static split of (chunk, panel group) items then
   gave one thread the full chunks: batch 128 at K = 576 ran as 108 + 20 rows, one thread
   holding 84% of the work (the Xeon, 2 threads, 3072 x 576: wide tile 173 -> 318 GFLOP/s,
   AVX2 build 100 -> 167; 64 rows at K = 1536, 36 + 28 -> 32 + 32: 256-271 -> 261-327). */
#define CHUNK_ROW(c, m, chunks) ((int)((int64_t)(c) * (m) / (chunks)))

/* A weight read once from DRAM (a row tile that streams its panels: decode of few rows)
   depends on the hardware prefetcher, which stops at each 4 KiB page and starts again only
   after misses on the next: every 64 lines (a page of a panel) the kernels ask for two lines
   KICK_AHEAD lines (8 KiB) on, so the stream is already running when it gets there. The
   batch-1 SmolLM2 float32 graph replay on the Zen 5 (2 threads), against no software
   prefetch, as the fraction of the bandwidth bound a 512 MiB sum reads: AVX2 build 0.77 ->
   0.91 at 73-78 GB/s and 0.95 -> 1.00 at 44-48 GB/s; AVX-512 build 0.83 -> 0.96 at 70-81.
   A prefetch of every line 8-16 lines ahead instead: 0.73-0.78 at 73-78 GB/s (it gains only
   when the VM reads at ~45 GB/s); 64 or 192 lines for KICK_AHEAD: within the noise. */
#define KICK_AHEAD 128
#define KICK(line)                                                                             \
    do {                                                                                       \
        __builtin_prefetch((line) + 16 * KICK_AHEAD, 0, 3);                                    \
        __builtin_prefetch((line) + 16 * KICK_AHEAD + 16, 0, 3);                               \
    } while (0)

/* One register tile: rows [0, MR) of x times 2 vectors' worth of columns, over all k. The
   columns come from b0 = p[16 kk + 0 : W] and b1 = p[16 kk + off1 : W]: one 16-column panel
   as two v8 (narrow, off1 = 8) or two adjacent panels as two v16 (wide, off1 = 16 k). The
   accumulators are named variables, not arrays: gcc kept arrays in memory (a store per FMA). */
#define DECL(V, I) V a##I = {0}, b##I = {0};
#define ROW(I)                                                                                 \
    if (rows > I) {                                                                            \
        const float xs = x[I * ldx + kk];                                                      \
        a##I += xs * w0;                                                                       \
        b##I += xs * w1;                                                                       \
    }
#define OUT(V, I)                                                                              \
    if (rows > I) {                                                                            \
        *(V *)(y + I * ldy) = a##I;                                                            \
        *(V *)(y + I * ldy + sizeof(V) / 4) = b##I;                                            \
    }
#define TILE(NAME, V, MR, KICKS)                                                               \
static void NAME##_##MR(const float *x, int64_t ldx, const float *p, int64_t off1, int k,     \
                        float *y, int64_t ldy, const float *next, int lines) {                 \
    const int rows = MR;                                                                       \
    int due = 0;                                                                               \
    DECL(V, 0) DECL(V, 1) DECL(V, 2) DECL(V, 3) DECL(V, 4) DECL(V, 5)                          \
    DECL(V, 6) DECL(V, 7) DECL(V, 8) DECL(V, 9) DECL(V, 10) DECL(V, 11)                        \
    for (int kk = 0; kk < k; kk++) {                                                           \
        const V w0 = *(const V *)(p + 16 * (int64_t)kk);                                       \
        const V w1 = *(const V *)(p + 16 * (int64_t)kk + off1);                                \
        if (next) { /* `lines` lines of the next unit's panels, spread evenly over k */        \
            due += lines;                                                                      \
            if (due >= k) {                                                                    \
                __builtin_prefetch(next, 0, 2);                                                \
                next += 16;                                                                    \
                due -= k;                                                                      \
            }                                                                                  \
        }                                                                                      \
        else if (KICKS && (kk & 63) == 0) KICK(p + 16 * (int64_t)kk);                          \
        ROW(0) ROW(1) ROW(2) ROW(3) ROW(4) ROW(5) ROW(6) ROW(7) ROW(8) ROW(9) ROW(10) ROW(11)   \
    }                                                                                          \
    OUT(V, 0) OUT(V, 1) OUT(V, 2) OUT(V, 3) OUT(V, 4) OUT(V, 5)                                \
    OUT(V, 6) OUT(V, 7) OUT(V, 8) OUT(V, 9) OUT(V, 10) OUT(V, 11)                              \
}
/* Narrow tiles without a next panel to pull in kick the prefetcher on their own panel (AVX2
   build, 2-6 rows, SmolLM2's layer shapes from DRAM: 13-27% faster); wide ones never (the
   kicks cost the AVX-512 tile of 2-6 rows 5-14%). */
TILE(narrow, v8, 1, 1) TILE(narrow, v8, 2, 1) TILE(narrow, v8, 3, 1)
TILE(narrow, v8, 4, 1) TILE(narrow, v8, 5, 1) TILE(narrow, v8, 6, 1)
TILE(wide, v16, 1, 0) TILE(wide, v16, 2, 0) TILE(wide, v16, 3, 0) TILE(wide, v16, 4, 0)
TILE(wide, v16, 5, 0) TILE(wide, v16, 6, 0) TILE(wide, v16, 7, 0) TILE(wide, v16, 8, 0)
TILE(wide, v16, 9, 0) TILE(wide, v16, 10, 0) TILE(wide, v16, 11, 0) TILE(wide, v16, 12, 0)

typedef void (*tile_fn)(const float *, int64_t, const float *, int64_t, int, float *, int64_t,
                        const float *, int);
static const tile_fn NARROW[7] = {0, narrow_1, narrow_2, narrow_3, narrow_4, narrow_5, narrow_6};
static const tile_fn WIDE[13] = {0, wide_1, wide_2, wide_3, wide_4, wide_5, wide_6, wide_7,
                                 wide_8, wide_9, wide_10, wide_11, wide_12};

/* Row tile t's share of the unit after this one, to pull into L2 while it computes: returns
   where the share starts and sets *lines to its length in panel rows (64 bytes each), which
   the tile asks for evenly over its k steps (NULL: no share). In a decode batch the weights come from DRAM (a model's weights do not
   fit in L3); without this, each unit's first row tile waits on them: 3072 x 576 at 64 rows
   on the Zen 5 (2 threads), weights from DRAM: wide tile 545 -> 475 us, the AVX2 build's
   narrow tile 1029 -> 899 (in cache: 455 and 891, unchanged). The share was a whole panel
   for each of the first one or two tiles, a line per k step: on the Xeon (model 207, 2
   threads) that pace outran the misses a core keeps in flight from DRAM while later tiles
   asked for nothing. SmolLM2's four layer linears x 30 layers from DRAM, wide tile, median of
   10 alternating runs: 64 rows 79 -> 76 ms (9 of 10 pairs faster), 128 rows 148 -> 135; with
   the LM head, 64 rows 98 -> 89; the AVX2 build's narrow tile 64 rows 140 -> 131, 32 rows
   77 -> 72; 8-16 rows unchanged (one or two tiles: the same pace as before). */
static inline const float *next_panel(const float *wp, int n, int k, int pi, int np, int t,
                                      int tiles, int *lines) {
    const int q0 = pi + np, left = n / 16 - q0, nnp = np < left ? np : left;
    const int64_t all = (int64_t)nnp * k, per = (all + tiles - 1) / tiles, t0 = t * per;
    if (tiles < 2 || nnp <= 0 || t0 >= all) return NULL;
    const int64_t mine = all - t0 < per ? all - t0 : per;
    *lines = mine < k ? (int)mine : k; /* at most a line per k step */
    return wp + ((int64_t)q0 * k + t0) * 16;
}

/* One row of x times 2 vectors' worth of columns, as the tiles take them (b0 at p, b1 at
   p + off1): two adjacent panels as two v16 (wide_row, off1 = 16 k) or one panel as two v8
   (narrow_row, off1 = 8; the AVX2 build's decode of one sequence). Four k chains per vector,
   so the FMAs' latency does not hold the weight stream back (decode of one sequence: the
   step streams every weight once); each panel stream kicked on a page ahead (`KICK`). Zen 5,
   2 threads, weights from DRAM, the wide row against the one-chain 1-row tile in the same
   process: 3072 x 576 70-78 -> 73-80 GB/s, 960 x 576 77-81 -> 85-92, 576 x 1536 even. */
#define ONE_ROW(NAME, V)                                                                       \
static void NAME(const float *x, const float *p, int64_t off1, int k, float *y) {             \
    V a0 = {0}, a1 = {0}, a2 = {0}, a3 = {0}, b0 = {0}, b1 = {0}, b2 = {0}, b3 = {0};          \
    int kk = 0;                                                                                \
    for (; kk + 4 <= k; kk += 4) {                                                             \
        const float *pa = p + 16 * (int64_t)kk, *pb = pa + off1; /* 4 panel rows each */       \
        if ((kk & 63) == 0) {                                                                  \
            KICK(pa);                                                                          \
            if (off1 > 8) KICK(pb); /* a second panel: a stream of its own */                  \
        }                                                                                      \
        a0 += x[kk] * *(const V *)pa;                                                          \
        b0 += x[kk] * *(const V *)pb;                                                          \
        a1 += x[kk + 1] * *(const V *)(pa + 16);                                               \
        b1 += x[kk + 1] * *(const V *)(pb + 16);                                               \
        a2 += x[kk + 2] * *(const V *)(pa + 32);                                               \
        b2 += x[kk + 2] * *(const V *)(pb + 32);                                               \
        a3 += x[kk + 3] * *(const V *)(pa + 48);                                               \
        b3 += x[kk + 3] * *(const V *)(pb + 48);                                               \
    }                                                                                          \
    for (; kk < k; kk++) {                                                                     \
        a0 += x[kk] * *(const V *)(p + 16 * (int64_t)kk);                                      \
        b0 += x[kk] * *(const V *)(p + 16 * (int64_t)kk + off1);                               \
    }                                                                                          \
    *(V *)y = (a0 + a1) + (a2 + a3);                                                           \
    *(V *)(y + sizeof(V) / 4) = (b0 + b1) + (b2 + b3);                                         \
}
ONE_ROW(wide_row, v16)
ONE_ROW(narrow_row, v8)

/* rows [m0, m1) of one unit: `np` panels (1 or 2) starting at panel pi. A unit of several row
   tiles pulls the next unit's panels in as it goes (`next_panel`); a unit of one row tile
   (decode of few rows) streams its panels once, kicking the prefetcher on (`KICK`) in the
   one-row kernels and the narrow tiles. */
static void unit(const float *x, const float *wp, const float *bias, float *y, int m0, int m1,
                 int n, int k, int pi, int np, int wide) {
    const float *p = wp + (int64_t)pi * k * 16;
    const float *xr = x + (int64_t)m0 * k;
    float *yr = y + (int64_t)m0 * n + pi * 16;
    const int rows = m1 - m0;
    if (np == 2 && wide && rows == 1) {
        wide_row(xr, p, 16 * (int64_t)k, k, yr);
    } else if (np == 2 && wide && rows <= 12) {
        WIDE[rows](xr, k, p, 16 * (int64_t)k, k, yr, n, NULL, 0);
    } else if (np == 2 && wide) {
        /* rows split evenly over the tiles: a short last tile (13 rows as 12 + 1) runs on too
           few accumulator chains for its share of the weight (SmolLM2's layer shapes from
           DRAM, Zen 5: 13-16 rows 1.4-1.6x faster as 7 + 6 ... 8 + 8; from 20 rows within
           +-3%; the AVX2 build's narrow tile and the bf16 tile: no gain, not split so) */
        const int tiles = (rows + 11) / 12;
        for (int i = m0, t = 0, mr; i < m1; i += mr, t++) {
            mr = rows / tiles + (t < rows % tiles);
            int lines = 0;
            const float *next = next_panel(wp, n, k, pi, np, t, tiles, &lines);
            WIDE[mr](x + (int64_t)i * k, k, p, 16 * (int64_t)k, k, y + (int64_t)i * n + pi * 16, n,
                     next, lines);
        }
    } else if (rows == 1) {
        for (int q = 0; q < np; q++) narrow_row(xr, p + (int64_t)q * k * 16, 8, k, yr + q * 16);
    } else if (rows <= 6) {
        for (int q = 0; q < np; q++)
            NARROW[rows](xr, k, p + (int64_t)q * k * 16, 8, k, yr + q * 16, n, NULL, 0);
    } else {
        const int tiles = np * ((rows + 5) / 6);
        for (int q = 0, t = 0; q < np; q++)
            for (int i = m0; i < m1; i += 6, t++) {
                const int mr = m1 - i < 6 ? m1 - i : 6;
                int lines = 0;
                const float *next = next_panel(wp, n, k, pi, np, t, tiles, &lines);
                NARROW[mr](x + (int64_t)i * k, k, p + (int64_t)q * k * 16, 8, k,
                           y + (int64_t)i * n + (pi + q) * 16, n, next, lines);
            }
    }
    if (bias != NULL)
        for (int i = m0; i < m1; i++)
            for (int c = pi * 16; c < (pi + np) * 16; c++) y[(int64_t)i * n + c] += bias[c];
}

/* y (m, n) = x (m, k) @ W^T (+ bias), W packed as (n / 16, k, 16); n % 16 == 0. Work items are
   (chunk of x rows, group of units); a unit is one panel (narrow) or two (wide). The x chunk
   (~256 KiB) stays in L2 while its panels stream past; with at most one tile of rows (decode),
   each thread takes one contiguous run of panels, so it streams the weight at full bandwidth. */
void ironlm_linear_f32(const float *x, const float *wp, const float *bias, float *y, int m,
                       int n, int k, int threads, int wide) {
    const int panels = n / 16, mr = wide ? 12 : 6, step = wide ? 2 : 1;
    int mc = (65536 / k) / mr * mr;
    if (mc < mr) mc = mr;
    if (mc > m) mc = m;
    const int chunks = (m + mc - 1) / mc;
    const int units = (panels + step - 1) / step;
    const int group = m <= mr ? (units + threads - 1) / threads : 4 / step;
    const int groups = (units + group - 1) / group;
    #pragma omp parallel for collapse(2) schedule(static) num_threads(threads)
    for (int c = 0; c < chunks; c++) {
        for (int g = 0; g < groups; g++) {
            const int m0 = CHUNK_ROW(c, m, chunks), m1 = CHUNK_ROW(c + 1, m, chunks);
            const int u1 = (g + 1) * group < units ? (g + 1) * group : units;
            for (int u = g * group; u < u1; u++) {
                const int pi = u * step, np = panels - pi < step ? panels - pi : step;
                unit(x, wp, bias, y, m0, m1, n, k, pi, np, wide);
            }
        }
    }
}

"""


class PackedLinearKernel(KernelLibrary):
    """Loads (building if needed) the C kernels for an ISA target (the host's by default);
    ``available`` / ``reason`` say whether they run here. ``pack`` lays a weight out for them;
    calling computes x @ W^T (+ bias) with the narrow (6 x 16) or wide (12 x 32) float32 tile,
    or the bfloat16 kernel for a bf16 weight."""

    def __init__(self, target: IsaTarget | None = None) -> None:
        ptr, i32 = ctypes.c_void_p, ctypes.c_int
        super().__init__(
            "cpu_linear", _SOURCE + AMX_TILES_SOURCE + BF16_SOURCE + AMX_SOURCE,
            {
                "ironlm_linear_f32": ([ptr] * 4 + [i32] * 5, None),
                "ironlm_linear_bf16": ([ptr] * 4 + [i32] * 4, None),
                "ironlm_linear_bf16_f32out": ([ptr] * 4 + [i32] * 4, None),
                "ironlm_linear_bf16_native": ([], i32),
            },
            "packed linear kernel", target=target,
        )  # fmt: skip
        lib = self.lib
        self._f32 = None if lib is None else lib.ironlm_linear_f32
        self._bf16 = None if lib is None else lib.ironlm_linear_bf16
        # how this build multiplies bf16: AMX tiles, AVX-512 BF16 dot products, or widening
        level = 0 if lib is None else int(lib.ironlm_linear_bf16_native())
        native = level > 0
        self.bf16_path = "" if lib is None else (
            "widened to float32", "avx512_bf16 dot products",
            "amx tiles from 2 rows, avx512_bf16 dot products",
        )[level]  # fmt: skip
        # bf16 results stored widened to float32 (AVX-512 BF16 builds)
        self._bf16_f32out = None
        if native:
            assert lib is not None
            self._bf16_f32out = lib.ironlm_linear_bf16_f32out

    @staticmethod
    def can_pack(weight: torch.Tensor) -> bool:
        return (
            weight.dim() == 2
            and weight.dtype in (torch.float32, torch.bfloat16)
            and weight.device.type == "cpu"
            and weight.shape[0] % PANEL == 0
            and (weight.dtype == torch.float32 or weight.shape[1] % 2 == 0)
        )

    @staticmethod
    def pack(weight: torch.Tensor) -> torch.Tensor:
        """float32 (N, K) -> (N / 16, K, 16): panel p, row k = W[16p:16p+16, k].
        bfloat16 (N, K) -> (N / 16, K / 2, 16, 2): row kk of panel p holds, per column, the
        weights of inputs 2kk and 2kk + 1 (the pairs AVX-512 BF16 dot products take)."""
        n, k = weight.shape
        if weight.dtype == torch.bfloat16:
            return weight.reshape(n // PANEL, PANEL, k // 2, 2).transpose(1, 2).contiguous()
        return weight.reshape(n // PANEL, PANEL, k).transpose(1, 2).contiguous()

    @staticmethod
    def unpack(packed: torch.Tensor) -> torch.Tensor:
        """The (N, K) row-major weight back from ``pack``'s layout."""
        if packed.dim() == 4:
            panels, half, _, _ = packed.shape
            return packed.transpose(1, 2).reshape(panels * PANEL, half * 2)
        panels, k, _ = packed.shape
        return packed.transpose(1, 2).reshape(panels * PANEL, k)

    @staticmethod
    def rows(packed: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
        """(T,) row ids -> (T, K) rows of the weight in ``pack``'s layout (embedding lookups):
        row v is column v % 16 of panel v // 16."""
        if packed.dim() == 4:
            return packed[ids // PANEL, :, ids % PANEL, :].reshape(ids.numel(), -1)
        return packed[ids // PANEL, :, ids % PANEL]

    def f32_out_fits(self, x: torch.Tensor, packed: torch.Tensor) -> bool:
        """Whether ``f32_out`` takes this bf16 activation and packed bf16 weight."""
        return (
            self._bf16_f32out is not None and packed.dim() == 4
            and packed.dtype == torch.bfloat16 and x.dtype == torch.bfloat16 and x.dim() == 2
            and x.shape[1] == packed.shape[1] * 2
        )  # fmt: skip

    def f32_out(self, x: torch.Tensor, packed: torch.Tensor) -> torch.Tensor:
        """(M, K) bf16 -> (M, N) float32: the bf16 result of ``x @ W^T`` (each value rounded
        to bf16, as the bf16 kernel rounds it) stored as float32, in one pass
        (``f32_out_fits`` first)."""
        assert self._bf16_f32out is not None, "needs an AVX-512 BF16 build"
        x = x.contiguous()
        m, n, k = x.shape[0], packed.shape[0] * PANEL, x.shape[1]
        y = torch.empty(m, n, dtype=torch.float32)
        if m:
            self.call(self._bf16_f32out, x.data_ptr(), packed.data_ptr(), None, y.data_ptr(),
                      m, n, k, torch.get_num_threads())  # fmt: skip
        return y

    def __call__(
        self,
        x: torch.Tensor,  # (M, K) in the weight's dtype
        packed: torch.Tensor,  # from ``pack``: (N / 16, K, 16) f32 or (N / 16, K / 2, 16, 2) bf16
        bias: torch.Tensor | None,  # (N,) in the weight's dtype
        wide: bool = False,  # float32: 12 x 32 tiles (16-wide vectors) instead of 6 x 16
    ) -> torch.Tensor:  # (M, N) in the weight's dtype
        assert self._f32 is not None and self._bf16 is not None, self.reason
        bf16 = packed.dim() == 4
        panels, k = packed.shape[0], packed.shape[1] * (2 if bf16 else 1)
        x = x.contiguous()
        m, n = x.shape[0], panels * PANEL
        y = torch.empty(m, n, dtype=packed.dtype)
        if m == 0:
            return y
        bias = None if bias is None else bias.contiguous()
        b = None if bias is None else bias.data_ptr()
        threads = torch.get_num_threads()
        if bf16:
            self.call(self._bf16, x.data_ptr(), packed.data_ptr(), b, y.data_ptr(), m, n, k,
                      threads)  # fmt: skip
        else:
            self.call(self._f32, x.data_ptr(), packed.data_ptr(), b, y.data_ptr(), m, n, k,
                      threads, int(wide))  # fmt: skip
        return y
