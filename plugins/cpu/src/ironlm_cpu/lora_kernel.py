"""The segmented LoRA matmul of a mixed batch in C (``LayerOps.lora_linear``, float32).

Layout (``ironlm.interfaces.lora``): A stacked as (slots, parts * R, K), B as (slots, N, R),
a slot per token (-1: none). Per token with a slot: shrink x (K,) against the slot's A rows of
every part (only the first ``rank`` rows of each part: the rest is zero padding), then add
each output row's dot with its part's shrunk vector (length ``rank``). Tokens are independent
and split over torch's OpenMP team when there are enough of them; a token's A and B (a few
hundred KiB at rank 16) stay in cache across the tokens of its adapter.

Why C: the reference groups tokens per adapter with torch indexing (~10 small ops per part and
adapter) and cannot be recorded in a decode graph; this is one call per layer, reads the slot
and rank tables when it runs, and so replays correctly after adapters change slots.
"""

from __future__ import annotations

import ctypes

import torch

from ironlm_cpu.cbuild import KernelLibrary

PARALLEL_TOKENS = 8  # fewer tokens run on the calling thread

_SOURCE = r"""
#include <stdint.h>
#ifdef __AVX2__
#include <immintrin.h>
#endif

static inline float dot(const float *a, const float *b, int n) {
    int i = 0;
    float s = 0.0f;
#ifdef __AVX2__
    __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps();
    for (; i + 16 <= n; i += 16) {
        acc0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), acc0);
        acc1 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 8), _mm256_loadu_ps(b + i + 8), acc1);
    }
    for (; i + 8 <= n; i += 8)
        acc0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), acc0);
    const __m256 v = _mm256_add_ps(acc0, acc1);
    const __m128 h = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    const __m128 q = _mm_add_ps(h, _mm_movehl_ps(h, h));
    s = _mm_cvtss_f32(_mm_add_ss(q, _mm_shuffle_ps(q, q, 1)));
#endif
    for (; i < n; i++) s += a[i] * b[i];
    return s;
}

/* y (t, n; row stride ldy) += per token i with s = slots[i] >= 0, per part p (the next
   size_p output rows): (x[i] @ A[s, p*R : p*R + r].T) @ B[s, rows, :r].T, r = ranks[s].
   A (S, parts * R, k), B (S, n, R); x rows ldx apart; parts <= 4 (unused sizes 0). */
void ironlm_lora_f32(const float *x, int64_t ldx, float *y, int64_t ldy, const float *a,
                     const float *b, const int32_t *slots, const int32_t *ranks, int t, int n,
                     int k, int parts, int R, int size0, int size1, int size2, int size3,
                     int threads) {
    const int sizes[4] = {size0, size1, size2, size3};
    int bounds[5] = {0, 0, 0, 0, 0};
    for (int p = 0; p < parts; p++) bounds[p + 1] = bounds[p] + sizes[p];
    #pragma omp parallel for schedule(static) num_threads(threads) if (threads > 1)
    for (int i = 0; i < t; i++) {
        const int s = slots[i];
        if (s < 0) continue;
        int r = ranks[s];
        if (r > R) r = R;
        if (r <= 0) continue;
        float shrunk[4 * 512]; /* parts <= 4, R <= 512 (checked by the caller) */
        const float *xi = x + (int64_t)i * ldx;
        const float *as = a + (int64_t)s * parts * R * k;
        for (int p = 0; p < parts; p++)
            for (int j = 0; j < r; j++)
                shrunk[p * R + j] = dot(xi, as + ((int64_t)p * R + j) * k, k);
        const float *bs = b + (int64_t)s * n * R;
        float *yi = y + (int64_t)i * ldy;
        for (int p = 0; p < parts; p++)
            for (int o = bounds[p]; o < bounds[p + 1]; o++)
                yi[o] += dot(bs + (int64_t)o * R, shrunk + p * R, r);
    }
}
"""

MAX_PARTS, MAX_RANK = 4, 512  # the kernel's stack buffer


class LoRAKernel(KernelLibrary):
    """Loads (building if needed) the C kernel; ``fits`` says whether a call can use it."""

    def __init__(self) -> None:
        ptr, i32, i64 = ctypes.c_void_p, ctypes.c_int, ctypes.c_int64
        super().__init__(
            "cpu_lora", _SOURCE,
            {"ironlm_lora_f32": ([ptr, i64, ptr, i64] + [ptr] * 4 + [i32] * 10, None)},
            "LoRA C kernel",
        )  # fmt: skip
        self._fn = None if self.lib is None else self.lib.ironlm_lora_f32

    def fits(
        self, y: torch.Tensor, x: torch.Tensor, lora_a: torch.Tensor, lora_b: torch.Tensor,
        slices: tuple[int, ...], token_slots: torch.Tensor, slot_ranks: torch.Tensor,
    ) -> bool:  # fmt: skip
        f32 = torch.float32
        return (
            self._fn is not None
            and y.dtype == f32 and x.dtype == f32 and lora_a.dtype == f32 and lora_b.dtype == f32
            and y.dim() == 2 and x.dim() == 2 and y.stride(1) == 1 and x.stride(1) == 1
            and lora_a.is_contiguous() and lora_b.is_contiguous()
            and token_slots.dtype == torch.int32 and token_slots.is_contiguous()
            and slot_ranks.dtype == torch.int32 and slot_ranks.is_contiguous()
            and len(slices) <= MAX_PARTS and lora_b.shape[2] <= MAX_RANK
            and sum(slices) == y.shape[1] and y.device.type == "cpu"
        )  # fmt: skip

    def __call__(
        self,
        y: torch.Tensor,  # (T, N) float32, updated in place
        x: torch.Tensor,  # (T, K) float32
        lora_a: torch.Tensor,  # (S, P * R, K)
        lora_b: torch.Tensor,  # (S, N, R)
        slices: tuple[int, ...],  # (P,) output rows per part
        token_slots: torch.Tensor,  # (T,) int32
        slot_ranks: torch.Tensor,  # (S,) int32
    ) -> torch.Tensor:
        assert self._fn is not None, self.reason
        t, n = y.shape
        sizes = list(slices) + [0] * (MAX_PARTS - len(slices))
        threads = torch.get_num_threads() if t >= PARALLEL_TOKENS else 1
        self.call(
            self._fn, x.data_ptr(), x.stride(0), y.data_ptr(), y.stride(0), lora_a.data_ptr(),
            lora_b.data_ptr(), token_slots.data_ptr(), slot_ranks.data_ptr(), t, n,
            x.shape[1], len(slices), lora_b.shape[2], *sizes, threads,
        )  # fmt: skip
        return y
