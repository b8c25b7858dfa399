"""The sampler's per-row reductions over float32 logits in one C call: the log-normaliser
(logsumexp) and the argmax of each row (``LayerOps.logsumexp_argmax``).

Why: a greedy batch-64 decode step of SmolLM2 (49,152-token vocabulary) spent ~2.7 ms of its
~46 ms in these two reductions as torch ops (logsumexp is amax, sub, exp, sum, log, add: five
passes over a fresh 12.6 MB tensor; argmax another pass), on the 2-core Zen 5. Here a row is
read twice, both times from L2: once for the maximum and its first index, once for the sum of
exp(x - max) (``vexp_src``'s exp, relative error ~2e-7, in float32 over 4 x 16 lanes).

Without a request for log-probabilities the sampler asks for the argmax alone (the second
pass then stops at the maximum's first index).

Numerics follow torch's: the first index of the maximum; a row of -inf gives -inf and index 0;
a row holding +inf gives +inf. A row holding NaN is reported (the caller falls back to torch,
whose argmax treats NaN as the maximum).
"""

from __future__ import annotations

import ctypes

import torch

from ironlm_cpu.cbuild import KernelLibrary
from ironlm_cpu.isa import IsaTarget
from ironlm_cpu.vexp_src import VEXP_SOURCE

PARALLEL_ROWS = 8  # fewer rows run on the calling thread (a 49K row takes ~15 us)

_SOURCE = VEXP_SOURCE + r"""
#include <math.h>
#include <stdint.h>

#if defined(__AVX512F__)
#define VW 16
#else
#define VW 8
#endif
typedef float vf __attribute__((vector_size(4 * VW), aligned(4)));
typedef int32_t vi __attribute__((vector_size(4 * VW), aligned(4)));

DEFINE_VEXP(vexp_w, vf, vi) /* exp of VW lanes (vexp_src) */

#if defined(__AVX512F__)
/* row_lse_argmax below on 16 lanes: pass 1 the maximum in four independent chains (and any
   NaN), pass 2 the sum of exp(x - max) (vexp512) in four chains, which also finds the
   maximum's first index (the first lane equal to it). ~2x faster than the generic form on the
   Zen 5 (a batch-64 step's 64 x 49152 logits 0.55 -> ~0.3 ms). */
static int row_lse_argmax(const float *x, int64_t v, float *lse, int64_t *arg, int want_lse) {
    const __m512 ninf = _mm512_set1_ps(-INFINITY);
    __m512 m[4] = {ninf, ninf, ninf, ninf};
    __mmask16 nan = 0;
    int64_t i = 0;
    for (; i + 64 <= v; i += 64)
        for (int c = 0; c < 4; c++) {
            const __m512 a = _mm512_loadu_ps(x + i + 16 * c);
            nan |= _mm512_cmp_ps_mask(a, a, _CMP_UNORD_Q);
            m[c] = _mm512_max_ps(m[c], a);
        }
    for (; i < v; i += 16) {
        const __mmask16 k = v - i >= 16 ? 0xffff : (__mmask16)((1u << (v - i)) - 1);
        const __m512 a = _mm512_mask_loadu_ps(ninf, k, x + i);
        nan |= _mm512_cmp_ps_mask(a, a, _CMP_UNORD_Q);
        m[0] = _mm512_max_ps(m[0], a);
    }
    if (nan) return 1;
    const float mx = _mm512_reduce_max_ps(_mm512_max_ps(_mm512_max_ps(m[0], m[1]),
                                                        _mm512_max_ps(m[2], m[3])));
    if (mx == -INFINITY) { /* every value -inf */
        *arg = 0;
        *lse = -INFINITY;
        return 0;
    }
    const __m512 mv = _mm512_set1_ps(mx);
    int64_t am = -1;
    if (!want_lse) { /* the maximum's first index only: scan until it shows */
        for (i = 0; i < v && am < 0; i += 16) {
            const __mmask16 k = v - i >= 16 ? 0xffff : (__mmask16)((1u << (v - i)) - 1);
            const __m512 a = _mm512_mask_loadu_ps(ninf, k, x + i); /* not past the row */
            const __mmask16 eq = _mm512_cmp_ps_mask(a, mv, _CMP_EQ_OQ);
            if (eq) am = i + __builtin_ctz(eq);
        }
        *arg = am;
        return 0;
    }
    __m512 sm[4] = {_mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps(),
                    _mm512_setzero_ps()};
    for (i = 0; i + 64 <= v; i += 64)
        for (int c = 0; c < 4; c++) {
            const __m512 a = _mm512_loadu_ps(x + i + 16 * c);
            if (am < 0) {
                const __mmask16 eq = _mm512_cmp_ps_mask(a, mv, _CMP_EQ_OQ);
                if (eq) am = i + 16 * c + __builtin_ctz(eq);
            }
            sm[c] = _mm512_add_ps(sm[c], vexp512(_mm512_sub_ps(a, mv)));
        }
    for (; i < v; i += 16) {
        const __mmask16 k = v - i >= 16 ? 0xffff : (__mmask16)((1u << (v - i)) - 1);
        const __m512 a = _mm512_mask_loadu_ps(ninf, k, x + i);
        if (am < 0) {
            const __mmask16 eq = _mm512_cmp_ps_mask(a, mv, _CMP_EQ_OQ);
            if (eq) am = i + __builtin_ctz(eq);
        }
        sm[0] = _mm512_add_ps(sm[0], vexp512(_mm512_sub_ps(a, mv)));
    }
    *arg = am;
    if (mx == INFINITY) {
        *lse = INFINITY;
        return 0;
    }
    const __m512 st = _mm512_add_ps(_mm512_add_ps(sm[0], sm[1]), _mm512_add_ps(sm[2], sm[3]));
    const double tot = _mm512_reduce_add_pd(_mm512_cvtps_pd(_mm512_castps512_ps256(st))) +
                       _mm512_reduce_add_pd(_mm512_cvtps_pd(_mm512_extractf32x8_ps(st, 1)));
    *lse = mx + (float)log(tot);
    return 0;
}
#else
/* One row: its maximum's first index into *arg and logsumexp into *lse; returns 1 when the
   row holds a NaN (nothing written then). */
static int row_lse_argmax(const float *x, int64_t v, float *lse, int64_t *arg, int want_lse) {
    vf best = (vf){0} - INFINITY;
    vi where = (vi){0};
    vi nan = (vi){0};
    vi lane;
    for (int l = 0; l < VW; l++) lane[l] = l;
    int64_t i = 0;
    for (; i + VW <= v && i + VW <= INT32_MAX; i += VW) {
        const vf a = *(const vf *)(x + i);
        const vi gt = a > best; /* strict: each lane keeps its first maximum */
        best = (vf)((gt & (vi)a) | (~gt & (vi)best));
        where = (gt & (lane + (int32_t)i)) | (~gt & where);
        nan |= a != a;
    }
    float mx = -INFINITY;
    int64_t am = -1;
    for (int l = 0; l < VW; l++) {
        if (nan[l]) return 1;
        if (best[l] > mx) {
            mx = best[l];
            am = where[l];
        } else if (best[l] == mx && mx > -INFINITY && where[l] < am) {
            am = where[l]; /* the same maximum at an earlier index */
        }
    }
    for (; i < v; i++) { /* the tail, in index order: a later equal value never wins */
        if (x[i] != x[i]) return 1;
        if (x[i] > mx) { mx = x[i]; am = i; }
    }
    if (am < 0) { /* every value -inf */
        *arg = 0;
        *lse = -INFINITY;
        return 0;
    }
    *arg = am;
    if (!want_lse) return 0;
    if (mx == INFINITY) {
        *lse = INFINITY;
        return 0;
    }
    vf s0 = (vf){0}, s1 = (vf){0}, s2 = (vf){0}, s3 = (vf){0};
    i = 0;
    for (; i + 4 * VW <= v; i += 4 * VW) {
        s0 += vexp_w(*(const vf *)(x + i) - mx);
        s1 += vexp_w(*(const vf *)(x + i + VW) - mx);
        s2 += vexp_w(*(const vf *)(x + i + 2 * VW) - mx);
        s3 += vexp_w(*(const vf *)(x + i + 3 * VW) - mx);
    }
    for (; i + VW <= v; i += VW) s0 += vexp_w(*(const vf *)(x + i) - mx);
    const vf s = (s0 + s1) + (s2 + s3);
    double tot = 0.0;
    for (int l = 0; l < VW; l++) tot += s[l];
    for (; i < v; i++) tot += expf(x[i] - mx);
    *lse = mx + (float)log(tot);
    return 0;
}
#endif

/* rows of v float32 logits at stride `stride`; returns the number of rows holding a NaN.
   want_lse 0: the argmax only (lse is not written) */
int ironlm_lse_argmax_f32(const float *x, int64_t rows, int64_t v, int64_t stride, float *lse,
                          int64_t *arg, int want_lse, int threads) {
    int bad = 0;
    #pragma omp parallel for schedule(static) num_threads(threads) if (threads > 1) \
        reduction(+: bad)
    for (int64_t r = 0; r < rows; r++)
    {
        float unused; /* rows write a logsumexp for some inputs (all -inf) even when not asked */
        bad += row_lse_argmax(x + r * stride, v, want_lse ? lse + r : &unused, arg + r, want_lse);
    }
    return bad;
}
"""


class LogitsKernel(KernelLibrary):
    """Loads (building if needed) the C reductions; ``available`` / ``reason`` say whether they
    run here. ``fits`` says whether a logits tensor is one the kernel takes."""

    def __init__(self, target: IsaTarget | None = None) -> None:
        ptr, i32, i64 = ctypes.c_void_p, ctypes.c_int, ctypes.c_int64
        super().__init__(
            "cpu_logits", _SOURCE,
            {"ironlm_lse_argmax_f32": ([ptr, i64, i64, i64, ptr, ptr, i32, i32], i32)},
            "C logits reductions", target=target,
        )  # fmt: skip
        self._fn = None if self.lib is None else self.lib.ironlm_lse_argmax_f32

    def fits(self, logits: torch.Tensor) -> bool:
        return (
            self._fn is not None and logits.dim() == 2 and logits.dtype == torch.float32
            and logits.device.type == "cpu" and logits.stride(1) == 1 and logits.shape[1] > 0
        )  # fmt: skip

    def __call__(
        self, logits: torch.Tensor, logsumexp: bool = True
    ) -> tuple[torch.Tensor | None, torch.Tensor] | None:
        """(B, V) float32 -> (logsumexp (B,) float32, or None when not asked for; argmax (B,)
        int64); None when a row holds a NaN (the caller's torch ops decide those)."""
        assert self._fn is not None, self.reason
        rows, v = logits.shape
        lse = torch.empty(rows if logsumexp else 0, dtype=torch.float32)
        arg = torch.empty(rows, dtype=torch.int64)
        threads = torch.get_num_threads() if rows >= PARALLEL_ROWS else 1
        bad = self.call(self._fn, logits.data_ptr(), rows, v, logits.stride(0), lse.data_ptr(),
                        arg.data_ptr(), int(logsumexp), threads)  # fmt: skip
        return None if bad else (lse if logsumexp else None, arg)
