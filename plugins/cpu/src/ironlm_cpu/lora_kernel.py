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
from ironlm_cpu.isa import IsaTarget

PARALLEL_TOKENS = 8  # fewer tokens run on the calling thread

_SOURCE = r"""
#include <stdint.h>
#include <stdlib.h>
#ifdef __AVX2__
#include <immintrin.h>
#endif

#define TILE 8 /* tokens of one adapter per work item: A and B are read once per tile */

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

/* out[i] = dot(row, x_i) for four token rows: the row is loaded once for the four */
static void dot4(const float *row, const float *x0, const float *x1, const float *x2,
                 const float *x3, int n, float *out) {
    int i = 0;
    float s0 = 0.0f, s1 = 0.0f, s2 = 0.0f, s3 = 0.0f;
#ifdef __AVX2__
    __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
    for (; i + 8 <= n; i += 8) {
        const __m256 w = _mm256_loadu_ps(row + i);
        a0 = _mm256_fmadd_ps(w, _mm256_loadu_ps(x0 + i), a0);
        a1 = _mm256_fmadd_ps(w, _mm256_loadu_ps(x1 + i), a1);
        a2 = _mm256_fmadd_ps(w, _mm256_loadu_ps(x2 + i), a2);
        a3 = _mm256_fmadd_ps(w, _mm256_loadu_ps(x3 + i), a3);
    }
    float t[8];
    _mm256_storeu_ps(t, a0); for (int j = 0; j < 8; j++) s0 += t[j];
    _mm256_storeu_ps(t, a1); for (int j = 0; j < 8; j++) s1 += t[j];
    _mm256_storeu_ps(t, a2); for (int j = 0; j < 8; j++) s2 += t[j];
    _mm256_storeu_ps(t, a3); for (int j = 0; j < 8; j++) s3 += t[j];
#endif
    for (; i < n; i++) {
        s0 += row[i] * x0[i]; s1 += row[i] * x1[i]; s2 += row[i] * x2[i]; s3 += row[i] * x3[i];
    }
    out[0] = s0; out[1] = s1; out[2] = s2; out[3] = s3;
}

/* y[o0:o1] += sum_j sh[j] * bt[j * n + o], j < r: 32 outputs at a time in registers */
static void expand_row(float *y, const float *bt, int64_t n, const float *sh, int r, int o0,
                       int o1) {
    int o = o0;
#ifdef __AVX2__
    for (; o + 32 <= o1; o += 32) {
        __m256 c0 = _mm256_loadu_ps(y + o), c1 = _mm256_loadu_ps(y + o + 8);
        __m256 c2 = _mm256_loadu_ps(y + o + 16), c3 = _mm256_loadu_ps(y + o + 24);
        for (int j = 0; j < r; j++) {
            const float *b = bt + j * n + o;
            const __m256 w = _mm256_set1_ps(sh[j]);
            c0 = _mm256_fmadd_ps(w, _mm256_loadu_ps(b), c0);
            c1 = _mm256_fmadd_ps(w, _mm256_loadu_ps(b + 8), c1);
            c2 = _mm256_fmadd_ps(w, _mm256_loadu_ps(b + 16), c2);
            c3 = _mm256_fmadd_ps(w, _mm256_loadu_ps(b + 24), c3);
        }
        _mm256_storeu_ps(y + o, c0);
        _mm256_storeu_ps(y + o + 8, c1);
        _mm256_storeu_ps(y + o + 16, c2);
        _mm256_storeu_ps(y + o + 24, c3);
    }
#endif
    for (; o < o1; o++) {
        float acc = y[o];
        for (int j = 0; j < r; j++) acc += sh[j] * bt[j * n + o];
        y[o] = acc;
    }
}

/* expand_row for two tokens at once: each B.T load serves both */
static void expand_row2(float *y0, float *y1, const float *bt, int64_t n, const float *sh0,
                        const float *sh1, int r, int o0, int o1) {
    int o = o0;
#ifdef __AVX2__
    for (; o + 32 <= o1; o += 32) {
        __m256 c0 = _mm256_loadu_ps(y0 + o), c1 = _mm256_loadu_ps(y0 + o + 8);
        __m256 c2 = _mm256_loadu_ps(y0 + o + 16), c3 = _mm256_loadu_ps(y0 + o + 24);
        __m256 d0 = _mm256_loadu_ps(y1 + o), d1 = _mm256_loadu_ps(y1 + o + 8);
        __m256 d2 = _mm256_loadu_ps(y1 + o + 16), d3 = _mm256_loadu_ps(y1 + o + 24);
        for (int j = 0; j < r; j++) {
            const float *b = bt + j * n + o;
            const __m256 b0 = _mm256_loadu_ps(b), b1 = _mm256_loadu_ps(b + 8);
            const __m256 b2 = _mm256_loadu_ps(b + 16), b3 = _mm256_loadu_ps(b + 24);
            const __m256 w = _mm256_set1_ps(sh0[j]), v = _mm256_set1_ps(sh1[j]);
            c0 = _mm256_fmadd_ps(w, b0, c0); c1 = _mm256_fmadd_ps(w, b1, c1);
            c2 = _mm256_fmadd_ps(w, b2, c2); c3 = _mm256_fmadd_ps(w, b3, c3);
            d0 = _mm256_fmadd_ps(v, b0, d0); d1 = _mm256_fmadd_ps(v, b1, d1);
            d2 = _mm256_fmadd_ps(v, b2, d2); d3 = _mm256_fmadd_ps(v, b3, d3);
        }
        _mm256_storeu_ps(y0 + o, c0); _mm256_storeu_ps(y0 + o + 8, c1);
        _mm256_storeu_ps(y0 + o + 16, c2); _mm256_storeu_ps(y0 + o + 24, c3);
        _mm256_storeu_ps(y1 + o, d0); _mm256_storeu_ps(y1 + o + 8, d1);
        _mm256_storeu_ps(y1 + o + 16, d2); _mm256_storeu_ps(y1 + o + 24, d3);
    }
#endif
    expand_row(y0, bt, n, sh0, r, o, o1);
    expand_row(y1, bt, n, sh1, r, o, o1);
}

/* y (t, n; rows ldy apart) += per token i with slot s = slots[i] >= 0, per part p (the next
   size_p output rows): (x[i] @ A[s, p*R : p*R + r].T) @ BT[s, :r, rows of p], r = ranks[s].
   A (S, parts * R, k), BT (S, R, n) (B transposed); x rows ldx apart; parts <= 4 (unused
   sizes 0). Tokens are grouped by slot into tiles of up to TILE; tiles run in parallel. */
void ironlm_lora_f32(const float *x, int64_t ldx, float *y, int64_t ldy, const float *a,
                     const float *bt, const int32_t *slots, const int32_t *ranks, int t, int n,
                     int k, int parts, int R, int num_slots, int size0, int size1, int size2,
                     int size3, int threads) {
    const int sizes[4] = {size0, size1, size2, size3};
    int bounds[5] = {0, 0, 0, 0, 0};
    for (int p = 0; p < parts; p++) bounds[p + 1] = bounds[p] + sizes[p];
    /* tokens bucketed by slot (counting sort), then cut into tiles */
    int *order = malloc(sizeof(int) * (size_t)(t > 0 ? t : 1));
    int *start = calloc((size_t)num_slots + 1, sizeof(int));
    int *tiles = malloc(sizeof(int) * (size_t)(t > 0 ? t : 1)); /* first token of each tile */
    if (order == NULL || start == NULL || tiles == NULL) {
        free(order); free(start); free(tiles);
        return;
    }
    for (int i = 0; i < t; i++)
        if (slots[i] >= 0 && slots[i] < num_slots) start[slots[i] + 1]++;
    for (int s = 0; s < num_slots; s++) start[s + 1] += start[s];
    {
        int *fill = calloc((size_t)num_slots, sizeof(int));
        if (fill == NULL) {
            free(order); free(start); free(tiles);
            return;
        }
        for (int i = 0; i < t; i++) {
            const int s = slots[i];
            if (s >= 0 && s < num_slots) order[start[s] + fill[s]++] = i;
        }
        free(fill);
    }
    int num_tiles = 0;
    for (int s = 0; s < num_slots; s++)
        for (int i = start[s]; i < start[s + 1]; i += TILE) tiles[num_tiles++] = i;
    #pragma omp parallel for schedule(dynamic, 1) num_threads(threads) if (threads > 1)
    for (int w = 0; w < num_tiles; w++) {
        const int first = tiles[w];
        const int s = slots[order[first]];
        int m = start[s + 1] - first;
        if (m > TILE) m = TILE;
        int r = ranks[s];
        if (r > R) r = R;
        if (r <= 0) continue;
        float sh[TILE][4 * 64]; /* parts <= 4, R <= 64 per pass; wider ranks loop below */
        const float *as = a + (int64_t)s * parts * R * k;
        const float *bs = bt + (int64_t)s * R * n;
        for (int j0 = 0; j0 < r; j0 += 64) { /* rank in passes of 64: y sums them */
            const int rr = r - j0 < 64 ? r - j0 : 64;
            for (int p = 0; p < parts; p++)
                for (int j = 0; j < rr; j++) {
                    const float *row = as + ((int64_t)p * R + j0 + j) * k;
                    int i = 0;
                    for (; i + 4 <= m; i += 4) {
                        float d[4];
                        dot4(row, x + (int64_t)order[first + i] * ldx,
                             x + (int64_t)order[first + i + 1] * ldx,
                             x + (int64_t)order[first + i + 2] * ldx,
                             x + (int64_t)order[first + i + 3] * ldx, k, d);
                        for (int q = 0; q < 4; q++) sh[i + q][p * 64 + j] = d[q];
                    }
                    for (; i < m; i++)
                        sh[i][p * 64 + j] = dot(row, x + (int64_t)order[first + i] * ldx, k);
                }
            const float *bj = bs + (int64_t)j0 * n;
            for (int p = 0; p < parts; p++) {
                int i = 0;
                for (; i + 2 <= m; i += 2)
                    expand_row2(y + (int64_t)order[first + i] * ldy,
                                y + (int64_t)order[first + i + 1] * ldy, bj, n,
                                &sh[i][p * 64], &sh[i + 1][p * 64], rr, bounds[p],
                                bounds[p + 1]);
                for (; i < m; i++)
                    expand_row(y + (int64_t)order[first + i] * ldy, bj, n, &sh[i][p * 64],
                               rr, bounds[p], bounds[p + 1]);
            }
        }
    }
    free(order);
    free(start);
    free(tiles);
}
"""

MAX_PARTS, MAX_RANK = 4, 512  # the kernel's stack buffer


class LoRAKernel(KernelLibrary):
    """Loads (building if needed) the C kernel; ``fits`` says whether a call can use it."""

    def __init__(self, target: IsaTarget | None = None) -> None:
        ptr, i32, i64 = ctypes.c_void_p, ctypes.c_int, ctypes.c_int64
        super().__init__(
            "cpu_lora", _SOURCE,
            {"ironlm_lora_f32": ([ptr, i64, ptr, i64] + [ptr] * 4 + [i32] * 11, None)},
            "LoRA C kernel", target=target,
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
            and len(slices) <= MAX_PARTS and lora_b.shape[1] <= MAX_RANK
            and sum(slices) == y.shape[1] and y.device.type == "cpu"
        )  # fmt: skip

    def __call__(
        self,
        y: torch.Tensor,  # (T, N) float32, updated in place
        x: torch.Tensor,  # (T, K) float32
        lora_a: torch.Tensor,  # (S, P * R, K)
        lora_b: torch.Tensor,  # (S, R, N)
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
            x.shape[1], len(slices), lora_b.shape[1], lora_a.shape[0], *sizes, threads,
        )  # fmt: skip
        return y
