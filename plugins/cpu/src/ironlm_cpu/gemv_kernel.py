"""bfloat16 linears of a few rows on the row-major weight, in C (torch's OpenMP team).

Why: a bf16 weight has one layout. Where torch's bf16 matmul (oneDNN) beats the panel kernel
(``linear_kernel``) at some batch bucket, the tuner keeps the weight row-major, but at 1 and 8
rows oneDNN reads the weight at about half the speed a packed kernel does (SmolLM2's 3072 x 576
gate/up on the Zen 5: 68 us against 41 us at one row). This kernel takes the decode buckets on
the same row-major weight, so the rows layout can run it at small M and torch at large M
(``op_choice``). (On the Zen 5 the panel kernel now wins every bucket, 2026-11-26, so SmolLM2's
bf16 weights are packed there; the rows layout and this kernel serve the CPUs and shapes where
it does not, measured per machine, and output sizes that are not a multiple of 16.)

Work: output rows in groups of 8, split over the threads in contiguous runs (each thread
streams its part of the weight once, 8 rows in flight); x rows two at a time, so at most 16
accumulators, none spent on absent rows. With
AVX-512 BF16, one ``vdpbf16ps`` multiplies 32 bf16 pairs of a weight row and an x row
(row-major rows are already the (2k, 2k + 1) pairs it takes); the K tail is a masked load.
Without it the same loop widens bf16 to float32 (a 16-bit shift) and uses FMAs. Sums are
float32, the bias added in float32, the output rounded to bf16 to nearest even, as torch does.

Scope: x (M, K) and the weight (N, K) bf16 with contiguous rows; any M (meant for M <= 16).
"""

from __future__ import annotations

import ctypes

import torch

from ironlm_cpu.cbuild import KernelLibrary
from ironlm_cpu.isa import IsaTarget

_SOURCE = r"""
#include <stdint.h>
#include <string.h>
#if defined(__AVX512BF16__)
#include <immintrin.h>
#endif

static inline float bf16_to_f32(uint16_t h) {
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

static inline uint16_t f32_to_bf16(float f) { /* round to nearest even; NaN stays NaN */
    uint32_t u;
    memcpy(&u, &f, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40);
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}

#define NR 8 /* weight rows per group: 8 streams in flight */
#define PF 16 /* prefetch the row this many rows ahead (two groups; a hint, never faults) */

/* acc[i][j] = x row i . weight row j over k, i < MR (a compile-time 1 or 2, so no lane is
   wasted on absent rows), j < nr. Fully unrolled so the accumulators stay in registers. */
#if defined(__AVX512BF16__)
#define DOT_BLOCK(MR)                                                                          \
static void dot_block_##MR(const uint16_t *x, int64_t ldx, const uint16_t *w, int64_t k,      \
                           int nr, float acc[2][NR]) {                                        \
    __m512 a[MR][NR];                                                                          \
    _Pragma("GCC unroll 16") for (int i = 0; i < MR; i++)                                      \
        _Pragma("GCC unroll 16") for (int j = 0; j < NR; j++) a[i][j] = _mm512_setzero_ps();   \
    for (int64_t kk = 0; kk < k; kk += 32) {                                                   \
        const int64_t left = k - kk;                                                           \
        const __mmask32 m = left >= 32 ? (__mmask32)0xffffffffu                               \
                                       : (((__mmask32)1 << left) - 1);                         \
        __m512i xv[MR];                                                                        \
        _Pragma("GCC unroll 16") for (int i = 0; i < MR; i++)                                  \
            xv[i] = _mm512_maskz_loadu_epi16(m, x + i * ldx + kk);                             \
        _Pragma("GCC unroll 16") for (int j = 0; j < NR; j++) {                                \
            const __m512i wv = j < nr ? _mm512_maskz_loadu_epi16(m, w + j * k + kk)           \
                                      : _mm512_setzero_si512();                                \
            _mm_prefetch((const char *)(w + (j + PF) * k + kk), _MM_HINT_T0);                  \
            _Pragma("GCC unroll 16") for (int i = 0; i < MR; i++)                              \
                a[i][j] = _mm512_dpbf16_ps(a[i][j], (__m512bh)xv[i], (__m512bh)wv);            \
        }                                                                                      \
    }                                                                                          \
    _Pragma("GCC unroll 16") for (int i = 0; i < MR; i++)                                      \
        _Pragma("GCC unroll 16") for (int j = 0; j < NR; j++)                                  \
            acc[i][j] = _mm512_reduce_add_ps(a[i][j]);                                         \
}
#else
typedef float v16 __attribute__((vector_size(64)));
#define DOT_BLOCK(MR)                                                                          \
static void dot_block_##MR(const uint16_t *x, int64_t ldx, const uint16_t *w, int64_t k,      \
                           int nr, float acc[2][NR]) {                                        \
    v16 a[MR][NR];                                                                             \
    memset(a, 0, sizeof(a));                                                                   \
    int64_t kk = 0;                                                                            \
    for (; kk + 16 <= k; kk += 16) {                                                           \
        v16 xv[MR];                                                                            \
        for (int i = 0; i < MR; i++)                                                           \
            for (int l = 0; l < 16; l++) xv[i][l] = bf16_to_f32(x[i * ldx + kk + l]);          \
        for (int j = 0; j < nr; j++) {                                                         \
            v16 wv;                                                                            \
            for (int l = 0; l < 16; l++) wv[l] = bf16_to_f32(w[j * k + kk + l]);               \
            for (int i = 0; i < MR; i++) a[i][j] += xv[i] * wv;                                \
        }                                                                                      \
    }                                                                                          \
    for (int i = 0; i < MR; i++)                                                               \
        for (int j = 0; j < nr; j++) {                                                         \
            float s = 0.f;                                                                     \
            for (int l = 0; l < 16; l++) s += a[i][j][l];                                      \
            for (int64_t t = kk; t < k; t++)                                                   \
                s += bf16_to_f32(x[i * ldx + t]) * bf16_to_f32(w[j * k + t]);                  \
            acc[i][j] = s;                                                                     \
        }                                                                                      \
}
#endif
DOT_BLOCK(1)
DOT_BLOCK(2)

/* y (m, n) = x (m, k; rows ldx apart) @ w (n, k)^T + bias (n,) or none; all bf16. x rows go
   two at a time (the weight group, 8 rows of k, stays in L1 between them). */
void ironlm_gemv_bf16(const uint16_t *x, int64_t ldx, const uint16_t *w, const uint16_t *bias,
                      uint16_t *y, int m, int n, int k, int threads) {
    const int groups = (n + NR - 1) / NR;
    #pragma omp parallel for schedule(static) num_threads(threads) if (threads > 1)
    for (int g = 0; g < groups; g++) {
        const int j0 = g * NR, nr = n - j0 < NR ? n - j0 : NR;
        for (int i0 = 0; i0 < m; i0 += 2) {
            const int mr = m - i0 < 2 ? 1 : 2;
            float acc[2][NR];
            if (mr == 2)
                dot_block_2(x + (int64_t)i0 * ldx, ldx, w + (int64_t)j0 * k, k, nr, acc);
            else
                dot_block_1(x + (int64_t)i0 * ldx, ldx, w + (int64_t)j0 * k, k, nr, acc);
            for (int i = 0; i < mr; i++)
                for (int j = 0; j < nr; j++) {
                    const float b = bias != NULL ? bf16_to_f32(bias[j0 + j]) : 0.f;
                    y[(int64_t)(i0 + i) * n + j0 + j] = f32_to_bf16(acc[i][j] + b);
                }
        }
    }
}

int ironlm_gemv_bf16_native(void) {
#if defined(__AVX512BF16__)
    return 1;
#else
    return 0;
#endif
}
"""


class RowsGemvKernel(KernelLibrary):
    """x @ W^T (+ bias) for a bf16 row-major weight (``fits``); ``native`` says whether this
    build uses AVX-512 BF16 dot products or widens to float32."""

    def __init__(self, target: IsaTarget | None = None) -> None:
        ptr, i32, i64 = ctypes.c_void_p, ctypes.c_int, ctypes.c_int64
        super().__init__(
            "cpu_gemv", _SOURCE,
            {
                "ironlm_gemv_bf16": ([ptr, i64, ptr, ptr, ptr] + [i32] * 4, None),
                "ironlm_gemv_bf16_native": ([], i32),
            },
            "row-major bf16 gemv kernel", target=target,
        )  # fmt: skip
        lib = self.lib
        self._fn = None if lib is None else lib.ironlm_gemv_bf16
        self.native = lib is not None and bool(lib.ironlm_gemv_bf16_native())

    def fits(self, weight: torch.Tensor) -> bool:
        return (
            self._fn is not None
            and weight.dim() == 2
            and weight.dtype == torch.bfloat16
            and weight.is_contiguous()
        )

    def __call__(
        self,
        x: torch.Tensor,  # (M, K) bf16
        weight: torch.Tensor,  # (N, K) bf16, contiguous
        bias: torch.Tensor | None,  # (N,) bf16
    ) -> torch.Tensor:  # (M, N) bf16
        assert self._fn is not None, self.reason
        if x.stride(-1) != 1:
            x = x.contiguous()
        m, k = x.shape
        n = weight.shape[0]
        y = torch.empty(m, n, dtype=torch.bfloat16)
        if m == 0:
            return y
        b = None if bias is None else bias.to(torch.bfloat16).contiguous()
        self.call(
            self._fn, x.data_ptr(), x.stride(0), weight.data_ptr(),
            None if b is None else b.data_ptr(), y.data_ptr(), m, n, k, torch.get_num_threads(),
        )  # fmt: skip
        return y
