"""The sampler's per-row reductions over float32 logits in one C call: the log-normaliser
(logsumexp) and the argmax of each row (``LayerOps.logsumexp_argmax``).

Why: a greedy batch-64 decode step of SmolLM2 (49,152-token vocabulary) spent ~2.7 ms of its
~46 ms in these two reductions as torch ops (logsumexp is amax, sub, exp, sum, log, add: five
passes over a fresh 12.6 MB tensor; argmax another pass), on the 2-core Zen 5. Here a row is
read twice, both times from L2: once for the maximum and its first index, once for the sum of
exp(x - max) (``vexp_src``'s exp, relative error ~2e-7, in float32 over 4 x 16 lanes).

Without a request for log-probabilities the sampler asks for the argmax alone (the second
pass then stops at the maximum's first index).

The draw at a temperature (``LayerOps.categorical``) reads a row three times too: its maximum,
the weights' sums per 256-token block, and the chosen block again (the reference's two-level
inverse CDF, ``ironlm.interfaces.categorical``, with the weights' exp from ``vexp_src``):
(64, 49152) in ~1 ms against ~7 ms for torch's scale, softmax and block sums.

Numerics follow torch's: the first index of the maximum; a row of -inf gives -inf and index 0;
a row holding +inf gives +inf. A row holding NaN is reported (the caller falls back to torch,
whose argmax treats NaN as the maximum).
"""

from __future__ import annotations

import ctypes

import torch

from ironlm.interfaces.categorical import BLOCK

from ironlm_cpu.cbuild import KernelLibrary
from ironlm_cpu.isa import IsaTarget
from ironlm_cpu.truncated_draw import TRUNCATED_DRAW_SOURCE
from ironlm_cpu.vexp_src import VEXP_SOURCE

PARALLEL_ROWS = 8  # fewer rows run on the calling thread (a 49K row takes ~15 us)

_SOURCE = VEXP_SOURCE + f"#define DRAW_BLOCK {BLOCK}\n" + r"""
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

/* exp(s (x - mx)) of VW logits; exactly 0 for -inf (vexp_w clamps its input, so a ruled-out
   token would weigh ~1e-38 otherwise) and below `floor` (min-p; 0: none) */
static inline vf draw_weight(vf a, float mx, float s, float floor) {
    const vf w = vexp_w((a - mx) * s);
    const vi allowed = (a > (vf){0} - INFINITY) & (w >= floor);
    return (vf)((vi)w & allowed);
}
static inline float draw_weight1(float a, float mx, float s, float floor) {
    const float w = expf((a - mx) * s);
    return w >= floor ? w : 0.0f;
}
/* The row's maximum into *mx; 1 when the row holds a NaN. */
static int row_max(const float *x, int64_t v, float *mx) {
    vf best = (vf){0} - INFINITY;
    vi nan = (vi){0};
    int64_t i = 0;
    for (; i + VW <= v; i += VW) {
        const vf a = *(const vf *)(x + i);
        nan |= a != a;
        const vi gt = a > best;
        best = (vf)((gt & (vi)a) | (~gt & (vi)best));
    }
    float m = -INFINITY;
    for (int l = 0; l < VW; l++) {
        if (nan[l]) return 1;
        if (best[l] > m) m = best[l];
    }
    for (; i < v; i++) {
        if (x[i] != x[i]) return 1;
        if (x[i] > m) m = x[i];
    }
    *mx = m;
    return 0;
}
/* Rows without a finite distribution, as the reference's argmax: -1 for a NaN, 0 for a row of
   -inf only, the first +inf of a row holding one (a point mass); -2 for any other row, with
   its maximum in *mx. */
static int64_t row_degenerate(const float *x, int64_t v, float *mx) {
    if (row_max(x, v, mx)) return -1;
    if (*mx == -INFINITY) return 0;
    if (*mx == INFINITY) {
        int64_t i = 0;
        while (x[i] != INFINITY) i++;
        return i;
    }
    return -2;
}
/* One draw from softmax(s * x) over a row of v logits (s > 0), by inverse CDF with u in
   [0, 1): weights exp(s (x - max)) (vexp_w), summed per DRAW_BLOCK block into sums[] (float32
   lanes, a double per block); the block whose running double total passes u * total, then
   that block's weights again, summed in double up to the target. Returns the token, or -1 for a
   row holding a NaN. A row of -inf only gives 0, a row holding +inf its first +inf (the
   reference's rule for rows without a finite distribution: the logits' argmax). Never a token
   of weight 0: a target past the last sum (rounding) takes the last token of nonzero weight.
   Weights below `floor` count as 0 (min-p alone). DRAW_BLOCK comes from
   ironlm.interfaces.categorical.BLOCK (defined ahead of this source). */
static int64_t row_draw(const float *x, int64_t v, float s, double u, double *sums,
                        float floor) {
    float mx;
    const int64_t degenerate = row_degenerate(x, v, &mx);
    if (degenerate != -2) return degenerate;
    const int64_t nb = (v + DRAW_BLOCK - 1) / DRAW_BLOCK;
    double total = 0.0;
    for (int64_t b = 0; b < nb; b++) {
        const int64_t lo = b * DRAW_BLOCK, hi = lo + DRAW_BLOCK < v ? lo + DRAW_BLOCK : v;
        vf acc = (vf){0};
        int64_t j = lo;
        for (; j + VW <= hi; j += VW) acc += draw_weight(*(const vf *)(x + j), mx, s, floor);
        double t = 0.0;
        for (int l = 0; l < VW; l++) t += acc[l];
        for (; j < hi; j++) t += draw_weight1(x[j], mx, s, floor);
        sums[b] = t;
        total += t;
    }
    const double target = u * total;
    double before = 0.0;
    int64_t b = 0, last = -1;
    for (; b < nb; b++) {
        if (sums[b] > 0.0) {
            last = b;
            if (before + sums[b] > target) break;
        }
        before += sums[b];
    }
    if (last < 0) return -1; /* no weight summed (cannot happen for finite s > 0): the reference */
    if (b == nb) { b = last; before = total - sums[b]; } /* rounding: the last nonzero block */
    const int64_t lo = b * DRAW_BLOCK, hi = lo + DRAW_BLOCK < v ? lo + DRAW_BLOCK : v;
    float w[DRAW_BLOCK];
    int64_t j = lo;
    for (; j + VW <= hi; j += VW)
        *(vf *)(w + (j - lo)) = draw_weight(*(const vf *)(x + j), mx, s, floor);
    for (; j < hi; j++) w[j - lo] = draw_weight1(x[j], mx, s, floor);
    const double rest = target - before;
    double run = 0.0;
    int64_t pick = -1;
    for (j = lo; j < hi; j++) {
        if (w[j - lo] > 0.0f) {
            pick = j;
            run += w[j - lo];
            if (run > rest) break;
        }
    }
    return pick;
}

/* rows of v logits at stride `stride`, each drawn at its scale s[r] with its uniform u[r];
   sums: rows x ceil(v / DRAW_BLOCK) doubles of scratch. Returns the number of NaN rows. */
int ironlm_draw_f32(const float *x, int64_t rows, int64_t v, int64_t stride, const float *s,
                    const double *u, double *sums, int64_t *out, int threads) {
    const int64_t nb = (v + DRAW_BLOCK - 1) / DRAW_BLOCK;
    int bad = 0;
    #pragma omp parallel for schedule(static) num_threads(threads) if (threads > 1) \
        reduction(+: bad)
    for (int64_t r = 0; r < rows; r++) {
        out[r] = row_draw(x + r * stride, v, s[r], u[r], sums + r * nb, 0.0f);
        bad += out[r] < 0;
    }
    return bad;
}

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
""" + TRUNCATED_DRAW_SOURCE


class LogitsKernel(KernelLibrary):
    """Loads (building if needed) the C reductions; ``available`` / ``reason`` say whether they
    run here. ``fits`` says whether a logits tensor is one the kernel takes."""

    def __init__(self, target: IsaTarget | None = None) -> None:
        ptr, i32, i64 = ctypes.c_void_p, ctypes.c_int, ctypes.c_int64
        super().__init__(
            "cpu_logits", _SOURCE,
            {"ironlm_lse_argmax_f32": ([ptr, i64, i64, i64, ptr, ptr, i32, i32], i32),
             "ironlm_draw_f32": ([ptr, i64, i64, i64, ptr, ptr, ptr, ptr, i32], i32),
             "ironlm_truncated_draw_f32": ([ptr, i64, i64, i64] + [ptr] * 7 + [i32], i32),
             "ironlm_truncate_f32": ([ptr, i64, i64, i64] + [ptr] * 5 + [i64, ptr, i32], i32)},
            "C logits reductions", target=target,
        )  # fmt: skip
        self._fn = None if self.lib is None else self.lib.ironlm_lse_argmax_f32
        self._draw = None if self.lib is None else self.lib.ironlm_draw_f32
        self._truncated = None if self.lib is None else self.lib.ironlm_truncated_draw_f32
        self._truncate = None if self.lib is None else self.lib.ironlm_truncate_f32

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

    def categorical(
        self, logits: torch.Tensor, scale: torch.Tensor, u: torch.Tensor
    ) -> torch.Tensor:
        """``LayerOps.categorical`` on rows ``fits`` takes: (B, V) float32 logits, (B, 1)
        positive scale, (B, 1) float64 u -> (B,) int64, -1 for each row holding a NaN (the
        caller's reference draws those)."""
        assert self._draw is not None, self.reason
        rows, v = logits.shape
        scale = scale.reshape(rows).to(torch.float32).contiguous()
        u = u.reshape(rows).to(torch.float64).contiguous()
        sums = torch.empty(rows, -(-v // BLOCK), dtype=torch.float64)
        out = torch.empty(rows, dtype=torch.int64)
        threads = torch.get_num_threads() if rows >= PARALLEL_ROWS else 1
        self.call(self._draw, logits.data_ptr(), rows, v, logits.stride(0), scale.data_ptr(),
                  u.data_ptr(), sums.data_ptr(), out.data_ptr(), threads)  # fmt: skip
        return out

    def truncated_categorical(
        self, logits: torch.Tensor, scale: torch.Tensor, top_k: torch.Tensor,
        top_p: torch.Tensor, min_p: torch.Tensor, u: torch.Tensor,
    ) -> torch.Tensor:
        """``LayerOps.truncated_categorical`` on rows ``fits`` takes (positive scale) -> (B,)
        int64: -1 for a row holding a NaN, -2 for a row whose set needs more candidates than
        the kernel holds (``truncated_draw.CAND_CAP``); the caller's reference draws those."""
        assert self._truncated is not None, self.reason
        rows, v = logits.shape
        scale, top_k, top_p, min_p = _limit_rows(rows, scale, top_k, top_p, min_p)
        u = u.reshape(rows).to(torch.float64).contiguous()
        sums = torch.empty(rows, -(-v // BLOCK), dtype=torch.float64)
        out = torch.empty(rows, dtype=torch.int64)
        threads = torch.get_num_threads() if rows >= PARALLEL_ROWS else 1
        self.call(self._truncated, logits.data_ptr(), rows, v, logits.stride(0),
                  scale.data_ptr(), top_k.data_ptr(), top_p.data_ptr(), min_p.data_ptr(),
                  u.data_ptr(), sums.data_ptr(), out.data_ptr(), threads)  # fmt: skip
        return out

    def truncated_logits(
        self, logits: torch.Tensor, scale: torch.Tensor, top_k: torch.Tensor,
        top_p: torch.Tensor, min_p: torch.Tensor,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """``LayerOps.truncated_logits`` on rows ``fits`` takes (positive scale) -> ((B, V)
        float32, (B,) bool rows left to the caller: a row with limits that holds a NaN or no
        finite value, or whose set needs more candidates than the kernel holds)."""
        assert self._truncate is not None, self.reason
        rows, v = logits.shape
        scale, top_k, top_p, min_p = _limit_rows(rows, scale, top_k, top_p, min_p)
        out = torch.empty(rows, v, dtype=torch.float32)
        bad = torch.empty(rows, dtype=torch.int32)
        threads = torch.get_num_threads() if rows >= PARALLEL_ROWS else 1
        self.call(self._truncate, logits.data_ptr(), rows, v, logits.stride(0),
                  scale.data_ptr(), top_k.data_ptr(), top_p.data_ptr(), min_p.data_ptr(),
                  out.data_ptr(), out.stride(0), bad.data_ptr(), threads)  # fmt: skip
        return out, bad != 0


def _limit_rows(
    rows: int, scale: torch.Tensor, top_k: torch.Tensor, top_p: torch.Tensor,
    min_p: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """The (B, 1) scale and limits as the C entry points read them: (B,) contiguous float32
    scale, int64 top_k, float32 top_p and min_p."""
    as_f32 = [t.reshape(rows).to(torch.float32).contiguous() for t in (scale, top_p, min_p)]
    return as_f32[0], top_k.reshape(rows).to(torch.int64).contiguous(), as_f32[1], as_f32[2]
