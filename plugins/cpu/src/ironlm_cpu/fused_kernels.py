"""Fused element-wise layer ops in C, float32 and bfloat16 (``fused_bf16``): RMSNorm (+ residual
add), neox rotary, the gated MLP's activation (SiLU or tanh-GELU of the gate times the up half),
and row lookups (embedding, rotary cos/sin) from row-major or panel-packed tables.

Why: after the packed linear kernel, a batch-1 decode step on SmolLM2 spends about half its
time outside the matmuls, in ~1,900 small torch ops (the reference RMSNorm is 8 ops, rotary
about 12) at 5-20 us of dispatch each. One C call per norm and one per rotary (q and k
together) replaces them. Rows are independent; they are split over torch's OpenMP team only
when there are enough of them to pay for the fork (``PARALLEL_ROWS``).

Numerics follow the core's reference (``LayerOps``): RMSNorm in float32 with the mean of squares
from float32 partial sums (one per vector lane and chain) added in double, rotary as x1*cos -
x2*sin, x2*cos + x1*sin on the two halves. The activations use one exp per element, written as g
/ (1 + exp(-a)) (SiLU: a = g; tanh-GELU: a = 2 * sqrt(2/pi) * (g + 0.044715 g^3), since 0.5 * (1
+ tanh(y)) = 1 / (1 + exp(-2y))), with a vector exp of about 1 ulp (range reduction to |r| <=
ln2/2 and Cephes' degree-6 polynomial) on AVX2 and AVX-512 builds, libm's expf otherwise and for
a row's last n % lanes elements. All vector code runs on the target's register width
(``vexp_src.LANES_SOURCE``: 16 float32 lanes on AVX-512 builds, 8 elsewhere). The bf16 variants
compute in float32 and round to bf16 where torch's bf16 ops do (``fused_bf16``).
"""

from __future__ import annotations

import ctypes
import struct
from typing import Any

import torch

from ironlm_cpu.cbuild import KERNEL_DTYPES, KernelLibrary, heads_contiguous
from ironlm_cpu.fused_bf16 import BF16_SOURCE
from ironlm_cpu.isa import IsaTarget
from ironlm_cpu.linear_kernel import PANEL
from ironlm_cpu.vexp_src import LANES_SOURCE

PARALLEL_ROWS = 64  # fewer rows run on the calling thread

_SOURCE = LANES_SOURCE + r"""
#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

/* BW float32 lanes at any alignment */
static inline vf ldf(const float *p) {
    vf v;
    memcpy(&v, p, sizeof v);
    return v;
}
static inline void stf(float *p, vf v) { memcpy(p, &v, sizeof v); }

/* out = rms_norm(x (+ residual)) * w over rows of h; with residual, res_out = x + residual.
   x holds t tokens of `heads` rows each, token i's rows at x + i * xs, contiguous within the
   token (per-head q/k norms read a slice of the fused qkv output in place: heads > 1, xs its
   row length); residual, res_out and out are contiguous (t * heads, h).
   The squares are summed in BW-lane float32 partials on two chains, the partials in double (a
   double accumulated one element at a time waited on its add latency: 38-43 -> 10-13 us a
   call for 64 x 576 on 2 Xeon threads, the Python call included). */
void ironlm_rms_norm_f32(const float *x, int64_t xs, int heads, const float *residual,
                         float *res_out, const float *w, float *out, int t, int h, float eps,
                         int threads) {
    #pragma omp parallel for schedule(static) num_threads(threads) if (threads > 1)
    for (int r = 0; r < t * heads; r++) {
        const float *xr = x + (int64_t)(r / heads) * xs + (int64_t)(r % heads) * h;
        float *o = out + (int64_t)r * h;
        const float *s = xr;
        int j = 0;
        if (residual != NULL) {
            const float *rr = residual + (int64_t)r * h;
            float *ro = res_out + (int64_t)r * h;
            for (; j + BW <= h; j += BW) stf(ro + j, ldf(xr + j) + ldf(rr + j));
            for (; j < h; j++) ro[j] = xr[j] + rr[j];
            s = ro;
        }
        vf acc = {0}, acc2 = {0};
        double sum = 0.0;
        for (j = 0; j + 2 * BW <= h; j += 2 * BW) {
            const vf v = ldf(s + j), v2 = ldf(s + j + BW);
            acc += v * v;
            acc2 += v2 * v2;
        }
        for (; j + BW <= h; j += BW) { const vf v = ldf(s + j); acc += v * v; }
        for (; j < h; j++) sum += (double)s[j] * s[j];
        for (int l = 0; l < BW; l++) sum += (double)acc[l] + (double)acc2[l];
        const float inv = 1.0f / sqrtf((float)(sum / h) + eps);
        for (j = 0; j + BW <= h; j += BW) stf(o + j, ldf(s + j) * inv * ldf(w + j));
        for (; j < h; j++) o[j] = (s[j] * inv) * w[j];
    }
}

/* neox rotary of one tensor: x rows (t, heads, d) with token stride xs, cos/sin (t, d/2) */
static void rotate(const float *x, int64_t xs, int heads, const float *cs, const float *sn,
                   float *out, int t, int d, int threads) {
    const int half = d / 2;
    #pragma omp parallel for schedule(static) num_threads(threads) if (threads > 1)
    for (int r = 0; r < t; r++) {
        const float *c = cs + (int64_t)r * half, *s = sn + (int64_t)r * half;
        for (int hh = 0; hh < heads; hh++) {
            const float *xr = x + (int64_t)r * xs + (int64_t)hh * d;
            float *o = out + ((int64_t)r * heads + hh) * d;
            int j = 0;
            for (; j + BW <= half; j += BW) {
                const vf x1 = ldf(xr + j), x2 = ldf(xr + j + half);
                const vf cv = ldf(c + j), sv = ldf(s + j);
                stf(o + j, x1 * cv - x2 * sv);
                stf(o + j + half, x2 * cv + x1 * sv);
            }
            for (; j < half; j++) {
                const float x1 = xr[j], x2 = xr[j + half];
                o[j] = x1 * c[j] - x2 * s[j];
                o[j + half] = x2 * c[j] + x1 * s[j];
            }
        }
    }
}

void ironlm_rotary_f32(const float *q, int64_t qs, int hq, const float *k, int64_t ks, int hk,
                       const float *cs, const float *sn, float *q_out, float *k_out, int t,
                       int d, int threads) {
    rotate(q, qs, hq, cs, sn, q_out, t, d, threads);
    rotate(k, ks, hk, cs, sn, k_out, t, d, threads);
}

/* out (t, width) = rows ids of a (rows, width) table, row-major or, when packed, as the
   linear kernel packs weights: (rows / 16, width, 16), row v = column v % 16 of panel v / 16;
   times `scale` unless it is 1 (Gemma's embedding scale, already in the table's dtype).
   Returns the number of ids outside [0, rows) (their output rows are left unwritten). */
int ironlm_gather_rows_f32(const int64_t *ids, const float *table, float *out, int t, int width,
                           int64_t rows, int packed, float scale) {
    int bad = 0;
    for (int r = 0; r < t; r++) {
        const int64_t v = ids[r];
        float *o = out + (int64_t)r * width;
        if (v < 0 || v >= rows) {
            bad++;
            continue;
        }
        if (packed) {
            const float *p = table + (v / 16) * (int64_t)width * 16 + v % 16;
            for (int j = 0; j < width; j++) o[j] = p[(int64_t)j * 16];
        } else {
            const float *p = table + v * (int64_t)width;
            for (int j = 0; j < width; j++) o[j] = p[j];
        }
        if (scale != 1.0f)
            for (int j = 0; j < width; j++) o[j] *= scale;
    }
    return bad;
}

#if defined(__AVX512F__) || defined(__AVX2__)
#include <immintrin.h>
#define HAVE_EXP_1ULP 1
/* exp of BW lanes to about 1 ulp, for the float32 activations (vexpv's 2^f polynomial errs by
   up to ~4 ulp at |x| ~ 15, past the reference's tolerance): x = m ln2 + r with m rounded to
   nearest and ln2 in two parts, so |r| <= ln2 / 2 exactly, exp(r) by Cephes' degree-6
   polynomial, times 2^m. Inputs clamped to [-87.3, 88.3]: m + 127 stays in [1, 254]. */
#define EXP_1ULP_STEPS(V, SET1, MIN, MAX, MUL, ADD, FMA, FNMA, ROUND)                          \
    x = MIN(MAX(x, SET1(-87.3f)), SET1(88.3f));                                                \
    const V m = ROUND(MUL(x, SET1(1.44269504089f)));                                           \
    V r = FNMA(m, SET1(0.693359375f), x);                                                      \
    r = FNMA(m, SET1(-2.12194440e-4f), r);                                                     \
    V p = SET1(1.9875691500e-4f);                                                              \
    p = FMA(p, r, SET1(1.3981999507e-3f));                                                     \
    p = FMA(p, r, SET1(8.3334519073e-3f));                                                     \
    p = FMA(p, r, SET1(4.1665795894e-2f));                                                     \
    p = FMA(p, r, SET1(1.6666665459e-1f));                                                     \
    p = FMA(p, r, SET1(5.0000001201e-1f));                                                     \
    p = FMA(p, MUL(r, r), ADD(r, SET1(1.0f)));
#if defined(__AVX512F__)
#define ROUND16(v) _mm512_roundscale_ps(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC)
static inline vf exp_1ulp(vf v) {
    __m512 x = (__m512)v;
    EXP_1ULP_STEPS(__m512, _mm512_set1_ps, _mm512_min_ps, _mm512_max_ps, _mm512_mul_ps,
                   _mm512_add_ps, _mm512_fmadd_ps, _mm512_fnmadd_ps, ROUND16)
    return (vf)_mm512_scalef_ps(p, m);
}
#else
#define ROUND8(v) _mm256_round_ps(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC)
static inline vf exp_1ulp(vf v) {
    __m256 x = (__m256)v;
    EXP_1ULP_STEPS(__m256, _mm256_set1_ps, _mm256_min_ps, _mm256_max_ps, _mm256_mul_ps,
                   _mm256_add_ps, _mm256_fmadd_ps, _mm256_fnmadd_ps, ROUND8)
    const __m256i e = _mm256_slli_epi32(
        _mm256_add_epi32(_mm256_cvtps_epi32(m), _mm256_set1_epi32(127)), 23);
    return (vf)_mm256_mul_ps(p, _mm256_castsi256_ps(e));
}
#endif
#endif

/* out (t, n) = g / (1 + exp(-a(g))) * u, g = x[:, :n], u = x[:, n:2n], x rows xs apart;
   a(g) = g (SiLU) or 2 * sqrt(2/pi) * (g + 0.044715 g^3) (tanh-GELU) */
void ironlm_gated_act_f32(const float *x, int64_t xs, float *out, int t, int n, int gelu,
                          int threads) {
    const float c = 1.5957691216f; /* 2 * sqrt(2 / pi) */
    #pragma omp parallel for schedule(static) num_threads(threads) if (threads > 1)
    for (int r = 0; r < t; r++) {
        const float *g = x + (int64_t)r * xs, *u = g + n;
        float *o = out + (int64_t)r * n;
        int j = 0;
#ifdef HAVE_EXP_1ULP
        for (; j + BW <= n; j += BW) {
            const vf gv = ldf(g + j);
            const vf a = gelu ? c * (gv + 0.044715f * gv * gv * gv) : gv;
            stf(o + j, gv / (1.0f + exp_1ulp(-a)) * ldf(u + j));
        }
#endif
        for (; j < n; j++) {
            const float a = gelu ? c * (g[j] + 0.044715f * g[j] * g[j] * g[j]) : g[j];
            o[j] = g[j] / (1.0f + expf(-a)) * u[j];
        }
    }
}
"""


def in_dtype(value: float, dtype: torch.dtype) -> float:
    """``value`` rounded to float32 and, for bf16, on to bfloat16 (nearest even), as
    ``torch.tensor(value, dtype=dtype)`` rounds it; plain Python, so that a graph capture,
    which refuses new tensors, can call it."""
    bits = struct.unpack("<I", struct.pack("<f", value))[0]
    if dtype == torch.bfloat16:
        bits = ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16) << 16 & 0xFFFFFFFF
    return float(struct.unpack("<f", struct.pack("<I", bits))[0])


class FusedKernels(KernelLibrary):
    """Loads (building if needed) the C ops; ``available`` / ``reason`` say whether they run
    here. Callers check ``fits`` before calling; everything else uses the torch reference."""

    def __init__(self, target: IsaTarget | None = None) -> None:
        ptr, i32, i64, f32 = ctypes.c_void_p, ctypes.c_int, ctypes.c_int64, ctypes.c_float
        signatures = {
            "rms_norm": ([ptr, i64, i32] + [ptr] * 4 + [i32, i32, f32, i32], None),
            "rotary": ([ptr, i64, i32, ptr, i64, i32] + [ptr] * 4 + [i32] * 3, None),
            "gated_act": ([ptr, i64, ptr] + [i32] * 4, None),
            "gather_rows": ([ptr] * 3 + [i32, i32, i64, i32, f32], i32),
        }
        super().__init__(
            "cpu_fused", _SOURCE + BF16_SOURCE,
            {f"ironlm_{op}_{sfx}": sig for op, sig in signatures.items()
             for sfx in KERNEL_DTYPES.values()},
            "fused C layer ops", target=target,
        )  # fmt: skip
        self._lib = self.lib
        # (op, dtype) -> its C function
        self._fns: dict[tuple[str, torch.dtype], Any] = {} if self._lib is None else {
            (op, dt): getattr(self._lib, f"ironlm_{op}_{sfx}")
            for op in signatures for dt, sfx in KERNEL_DTYPES.items()
        }  # fmt: skip

    def _fn(self, op: str, dtype: torch.dtype) -> Any:
        """The C function of ``op`` for tensors of ``dtype``."""
        return self._fns[(op, dtype)]

    @staticmethod
    def _threads(rows: int) -> int:
        return torch.get_num_threads() if rows >= PARALLEL_ROWS else 1

    def rms_norm_fits(
        self, x: torch.Tensor, residual: torch.Tensor | None, weight: torch.Tensor | None = None
    ) -> bool:
        # (T, hidden) contiguous, or (T, heads, head_dim) with heads contiguous inside a token
        # and any token stride (per-head norms on a slice of the qkv output; no residual);
        # float32 or bf16, residual and weight (when given) in x's dtype
        rows_ok = x.is_contiguous() if x.dim() == 2 else (
            x.dim() == 3 and heads_contiguous(x) and residual is None
        )  # fmt: skip
        return (
            self._lib is not None
            and x.dtype in KERNEL_DTYPES
            and rows_ok
            and (residual is None or (residual.dtype == x.dtype and residual.is_contiguous()
                                      and residual.shape == x.shape))
            and (weight is None or (weight.dtype == x.dtype and weight.numel() == x.shape[-1]))
        )  # fmt: skip

    def rms_norm(
        self, x: torch.Tensor, weight: torch.Tensor, eps: float, residual: torch.Tensor | None
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        assert self._lib is not None, self.reason
        t, h = x.shape[0], x.shape[-1]
        heads = x.shape[1] if x.dim() == 3 else 1
        out = torch.empty(x.shape, dtype=x.dtype)  # contiguous, whatever x's strides
        new_res = torch.empty_like(x) if residual is not None else None
        w = weight.contiguous()
        self.call(
            self._fn("rms_norm", x.dtype),
            x.data_ptr(), x.stride(0), heads, None if residual is None else residual.data_ptr(),
            None if new_res is None else new_res.data_ptr(), w.data_ptr(), out.data_ptr(),
            t, h, eps, self._threads(t * heads),
        )  # fmt: skip
        return out, new_res

    def rotary_fits(self, q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor) -> bool:
        # (T, heads, D) with heads contiguous inside a token; any token stride; q, k and the
        # (T, D / 2) cos / sin all float32 or all bf16
        return (
            self._lib is not None
            and q.dim() == 3 and k.dim() == 3 and heads_contiguous(q) and heads_contiguous(k)
            and q.shape[2] % 2 == 0 and q.dtype == k.dtype == cos.dtype
        )  # fmt: skip

    def rotary(
        self, q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        assert self._lib is not None, self.reason
        t, hq, d = q.shape
        c, s = cos.contiguous(), sin.contiguous()  # (T, D/2)
        q_out = torch.empty(t, hq, d, dtype=q.dtype)
        k_out = torch.empty(k.shape, dtype=k.dtype)
        self.call(
            self._fn("rotary", q.dtype),
            q.data_ptr(), q.stride(0), hq, k.data_ptr(), k.stride(0), k.shape[1],
            c.data_ptr(), s.data_ptr(), q_out.data_ptr(), k_out.data_ptr(), t, d,
            self._threads(t),
        )  # fmt: skip
        return q_out, k_out

    def gated_act_fits(self, gate_up: torch.Tensor) -> bool:
        # (T, 2 * I) float32 or bf16 with contiguous rows (any row stride)
        return (
            self._lib is not None
            and gate_up.dtype in KERNEL_DTYPES
            and gate_up.dim() == 2
            and gate_up.stride(1) == 1
            and gate_up.shape[1] % 2 == 0
        )  # fmt: skip

    def gated_act(self, gate_up: torch.Tensor, gelu: bool) -> torch.Tensor:
        """(T, 2 * I) -> (T, I): act(gate) * up with act SiLU, or tanh-GELU when ``gelu``."""
        assert self._lib is not None, self.reason
        t, n = gate_up.shape[0], gate_up.shape[1] // 2
        out = torch.empty(t, n, dtype=gate_up.dtype)
        self.call(
            self._fn("gated_act", gate_up.dtype),
            gate_up.data_ptr(), gate_up.stride(0), out.data_ptr(), t, n, int(gelu),
            self._threads(t),
        )  # fmt: skip
        return out

    def gather_fits(self, ids: torch.Tensor, table: torch.Tensor) -> bool:
        # (T,) int64 ids; a (rows, width) table, or one packed by the linear kernel: float32
        # (rows / 16, width, 16), bf16 (rows / 16, width / 2, 16, 2)
        packed = (
            table.dim() == 3 and table.shape[2] == PANEL if table.dtype == torch.float32
            else table.dim() == 4 and table.shape[2:] == (PANEL, 2)
        )  # fmt: skip
        return (
            self._lib is not None
            and ids.dtype == torch.int64
            and ids.dim() == 1
            and table.dtype in KERNEL_DTYPES
            and table.is_contiguous()
            and (table.dim() == 2 or packed)
        )  # fmt: skip

    def gather_rows(
        self, ids: torch.Tensor, table: torch.Tensor, scale: float | None = None
    ) -> torch.Tensor:
        """(T,) ids -> (T, width): rows of ``table`` (row-major or panel-packed), times
        ``scale`` rounded to the table's dtype when given (as torch multiplies the rows by a
        scalar tensor of their dtype)."""
        assert self._lib is not None, self.reason
        packed = table.dim() > 2
        rows = table.shape[0] * PANEL if packed else table.shape[0]
        width = table.shape[1] * (2 if table.dim() == 4 else 1)
        idx = ids.contiguous()
        out = torch.empty(idx.numel(), width, dtype=table.dtype)
        factor = 1.0 if scale is None else in_dtype(scale, table.dtype)
        bad = self.call(
            self._fn("gather_rows", table.dtype), idx.data_ptr(), table.data_ptr(),
            out.data_ptr(), idx.numel(), width, rows, int(packed), factor,
        )  # fmt: skip
        if bad:
            raise IndexError(f"{bad} id(s) outside the table's {rows} rows")
        return out
