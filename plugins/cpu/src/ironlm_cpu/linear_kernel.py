"""A float32 linear layer over a panel-packed weight, in C (AVX2 + FMA, torch's OpenMP team).

Why: on this kind of CPU, torch's ``F.linear`` is far from the machine's limits at the shapes
decoding produces. Measured on the 2-core AVX2 box (benchmarks/linear_cpu.py, SmolLM2's
3072 x 576 gate/up weight): one row reads the weight at ~9.5 GB/s (MKL gemv) against ~18 GB/s
a plain sum reaches, and 64 rows run at ~40 GFLOP/s against a ~65 GFLOP/s matmul peak, because
MKL repacks the weight on every call. Packing it once, at load time, fixes both: this kernel
reads 19 GB/s at one row and 68 GFLOP/s at 64 rows, and matches MKL for prefill-sized inputs.

Layout: the weight (N, K) is stored as N/16 panels of (K, 16) floats, contiguous
(``pack``): panel p holds output columns 16p..16p+15, row k of a panel is those columns' k-th
input weights. One tile of the output is up to 6 rows of x times one panel: 12 accumulators of
8 floats, per k two panel loads and six broadcasts of x. Work is split over (chunk of x rows,
group of panels); the x chunk is sized to stay in L2 while its panels stream past it. With at
most 6 rows (decode of small batches), each thread takes one contiguous run of panels, so it
streams the weight at full bandwidth.

Scope: float32, N a multiple of 16 (other weights stay row-major and use torch). Same numerics
as a matmul up to summation order.
"""

from __future__ import annotations

import ctypes

import torch

from ironlm_cpu.cbuild import KernelLibrary

PANEL = 16  # output columns per panel

_SOURCE = r"""
#include <immintrin.h>
#include <stdint.h>

/* y[i, 0:16] = x[i, :] @ panel (k, 16) for i < MR. The accumulators are named variables,
   not arrays: gcc kept arrays in memory (a store per FMA), which halved the speed. */
#define ROW(I)                                                                                 \
    if (rows > I) {                                                                              \
        const __m256 a = _mm256_broadcast_ss(x + I * ldx + kk);                                \
        lo##I = _mm256_fmadd_ps(a, b0, lo##I);                                                 \
        hi##I = _mm256_fmadd_ps(a, b1, hi##I);                                                 \
    }
#define OUT(I)                                                                                 \
    if (rows > I) {                                                                              \
        _mm256_storeu_ps(y + I * ldy, lo##I);                                                  \
        _mm256_storeu_ps(y + I * ldy + 8, hi##I);                                              \
    }
#define TILE(MR)                                                                               \
static void tile_##MR(const float *x, int64_t ldx, const float *p, int k, float *y,           \
                      int64_t ldy) {                                                           \
    const int rows = MR;                                                                       \
    __m256 lo0 = _mm256_setzero_ps(), hi0 = lo0, lo1 = lo0, hi1 = lo0, lo2 = lo0, hi2 = lo0;  \
    __m256 lo3 = lo0, hi3 = lo0, lo4 = lo0, hi4 = lo0, lo5 = lo0, hi5 = lo0;                   \
    for (int kk = 0; kk < k; kk++) {                                                           \
        const __m256 b0 = _mm256_loadu_ps(p + 16 * kk), b1 = _mm256_loadu_ps(p + 16 * kk + 8); \
        ROW(0) ROW(1) ROW(2) ROW(3) ROW(4) ROW(5)                                              \
    }                                                                                          \
    OUT(0) OUT(1) OUT(2) OUT(3) OUT(4) OUT(5)                                                  \
}
TILE(1) TILE(2) TILE(3) TILE(4) TILE(5) TILE(6)

static void tile(int mr, const float *x, int64_t ldx, const float *p, int k, float *y,
                 int64_t ldy) {
    switch (mr) {
    case 1: tile_1(x, ldx, p, k, y, ldy); break;
    case 2: tile_2(x, ldx, p, k, y, ldy); break;
    case 3: tile_3(x, ldx, p, k, y, ldy); break;
    case 4: tile_4(x, ldx, p, k, y, ldy); break;
    case 5: tile_5(x, ldx, p, k, y, ldy); break;
    default: tile_6(x, ldx, p, k, y, ldy); break;
    }
}

/* y (m, n) = x (m, k) @ W^T (+ bias), W packed as (n / 16, k, 16); n % 16 == 0 */
void ironlm_linear_f32(const float *x, const float *wp, const float *bias, float *y, int m,
                       int n, int k, int threads) {
    const int panels = n / 16;
    int mc = (65536 / k) / 6 * 6; /* rows of x per chunk: ~256 KiB of x stays in L2 */
    if (mc < 6) mc = 6;
    if (mc > m) mc = m;
    const int chunks = (m + mc - 1) / mc;
    /* panels per work item: one contiguous run per thread when the weight read dominates */
    const int group = m <= 6 ? (panels + threads - 1) / threads : 4;
    const int groups = (panels + group - 1) / group;
    #pragma omp parallel for collapse(2) schedule(static) num_threads(threads)
    for (int c = 0; c < chunks; c++) {
        for (int g = 0; g < groups; g++) {
            const int m0 = c * mc, m1 = m0 + mc < m ? m0 + mc : m;
            const int p1 = (g + 1) * group < panels ? (g + 1) * group : panels;
            for (int pi = g * group; pi < p1; pi++) {
                const float *p = wp + (int64_t)pi * k * 16;
                for (int i = m0; i < m1; i += 6) {
                    const int mr = m1 - i < 6 ? m1 - i : 6;
                    tile(mr, x + (int64_t)i * k, k, p, k, y + (int64_t)i * n + pi * 16, n);
                }
                if (bias != NULL)
                    for (int i = m0; i < m1; i++)
                        for (int q = 0; q < 16; q++) y[(int64_t)i * n + pi * 16 + q] += bias[pi * 16 + q];
            }
        }
    }
}
"""


class PackedLinearKernel(KernelLibrary):
    """Loads (building if needed) the C kernel; ``available`` / ``reason`` say whether it can
    run here. ``pack`` lays a weight out for it; calling it computes x @ W^T (+ bias)."""

    def __init__(self) -> None:
        ptr, i32 = ctypes.c_void_p, ctypes.c_int
        super().__init__(
            "cpu_linear", _SOURCE, {"ironlm_linear_f32": ([ptr] * 4 + [i32] * 4, None)},
            "packed linear kernel", needs_avx2=True,
        )  # fmt: skip
        self._fn = None if self.lib is None else self.lib.ironlm_linear_f32

    @staticmethod
    def can_pack(weight: torch.Tensor) -> bool:
        return (
            weight.dim() == 2
            and weight.dtype == torch.float32
            and weight.device.type == "cpu"
            and weight.shape[0] % PANEL == 0
        )

    @staticmethod
    def pack(weight: torch.Tensor) -> torch.Tensor:
        """(N, K) -> (N / 16, K, 16) contiguous: panel p, row k = W[16p:16p+16, k]."""
        n, k = weight.shape
        return weight.reshape(n // PANEL, PANEL, k).transpose(1, 2).contiguous()

    def __call__(
        self,
        x: torch.Tensor,  # (M, K) float32
        packed: torch.Tensor,  # (N / 16, K, 16) float32 from ``pack``
        bias: torch.Tensor | None,  # (N,) float32
    ) -> torch.Tensor:  # (M, N) float32
        assert self._fn is not None, self.reason
        panels, k, _ = packed.shape
        x = x.contiguous()
        m, n = x.shape[0], panels * PANEL
        y = torch.empty(m, n, dtype=torch.float32)
        if m == 0:
            return y
        b = None if bias is None else bias.contiguous()
        self.call(
            self._fn, x.data_ptr(), packed.data_ptr(), None if b is None else b.data_ptr(),
            y.data_ptr(), m, n, k, torch.get_num_threads(),
        )  # fmt: skip
        return y
