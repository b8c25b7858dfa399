"""Fused float32 element-wise layer ops in C: RMSNorm (+ residual add) and neox rotary.

Why: after the packed linear kernel, a batch-1 decode step on SmolLM2 spends about half its
time outside the matmuls, in ~1,900 small torch ops (the reference RMSNorm is 8 ops, rotary
about 12) at 5-20 us of dispatch each. One C call per norm and one per rotary (q and k
together) replaces them. Rows are independent; they are split over torch's OpenMP team only
when there are enough of them to pay for the fork (``PARALLEL_ROWS``).

Numerics follow the core's reference (``LayerOps``): RMSNorm in float32 with the mean of squares
accumulated in double, rotary as x1*cos - x2*sin, x2*cos + x1*sin on the two halves.
"""

from __future__ import annotations

import ctypes
import subprocess

import torch

from ironlm_cpu.cbuild import load_library

PARALLEL_ROWS = 64  # fewer rows run on the calling thread

_SOURCE = r"""
#include <math.h>
#include <stddef.h>
#include <stdint.h>

/* out = rms_norm(x (+ residual)) * w over rows of h; with residual, res_out = x + residual */
void ironlm_rms_norm_f32(const float *x, const float *residual, float *res_out, const float *w,
                         float *out, int t, int h, float eps, int threads) {
    #pragma omp parallel for schedule(static) num_threads(threads) if (threads > 1)
    for (int r = 0; r < t; r++) {
        const float *xr = x + (int64_t)r * h;
        float *o = out + (int64_t)r * h;
        const float *s = xr;
        if (residual != NULL) {
            const float *rr = residual + (int64_t)r * h;
            float *ro = res_out + (int64_t)r * h;
            for (int j = 0; j < h; j++) ro[j] = xr[j] + rr[j];
            s = ro;
        }
        double acc = 0.0;
        for (int j = 0; j < h; j++) acc += (double)s[j] * s[j];
        const float inv = 1.0f / sqrtf((float)(acc / h) + eps);
        for (int j = 0; j < h; j++) o[j] = (s[j] * inv) * w[j];
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
            for (int j = 0; j < half; j++) {
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
"""


class FusedKernels:
    """Loads (building if needed) the C ops; ``available`` / ``reason`` say whether they run
    here. Callers check ``fits`` before calling; everything else uses the torch reference."""

    def __init__(self) -> None:
        self.reason = ""
        self._lib: ctypes.CDLL | None = None
        try:
            lib = load_library("cpu_fused", _SOURCE)
            ptr, i32, i64, f32 = ctypes.c_void_p, ctypes.c_int, ctypes.c_int64, ctypes.c_float
            lib.ironlm_rms_norm_f32.argtypes = [ptr] * 5 + [i32, i32, f32, i32]
            lib.ironlm_rms_norm_f32.restype = None
            lib.ironlm_rotary_f32.argtypes = [ptr, i64, i32, ptr, i64, i32] + [ptr] * 4 + [i32] * 3
            lib.ironlm_rotary_f32.restype = None
            self._lib = lib
        except (OSError, subprocess.SubprocessError, RuntimeError) as exc:
            self.reason = f"fused C layer ops unavailable: {exc}"

    @property
    def available(self) -> bool:
        return self._lib is not None

    @staticmethod
    def _threads(rows: int) -> int:
        return torch.get_num_threads() if rows >= PARALLEL_ROWS else 1

    def rms_norm_fits(self, x: torch.Tensor, residual: torch.Tensor | None) -> bool:
        return (
            self._lib is not None
            and x.dtype == torch.float32
            and x.dim() == 2
            and x.is_contiguous()
            and (residual is None or (residual.dtype == torch.float32 and residual.is_contiguous()
                                      and residual.shape == x.shape))
        )  # fmt: skip

    def rms_norm(
        self, x: torch.Tensor, weight: torch.Tensor, eps: float, residual: torch.Tensor | None
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        assert self._lib is not None, self.reason
        t, h = x.shape
        out = torch.empty_like(x)
        new_res = torch.empty_like(x) if residual is not None else None
        w = weight.contiguous()
        self._lib.ironlm_rms_norm_f32(
            x.data_ptr(), None if residual is None else residual.data_ptr(),
            None if new_res is None else new_res.data_ptr(), w.data_ptr(), out.data_ptr(),
            t, h, eps, self._threads(t),
        )  # fmt: skip
        return out, new_res

    def rotary_fits(self, q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor) -> bool:
        # (T, heads, D) with heads contiguous inside a token; any token stride
        def rows_ok(x: torch.Tensor) -> bool:
            return x.dtype == torch.float32 and x.stride(2) == 1 and x.stride(1) == x.shape[2]

        return (
            self._lib is not None
            and q.dim() == 3 and k.dim() == 3 and rows_ok(q) and rows_ok(k)
            and q.shape[2] % 2 == 0 and cos.dtype == torch.float32
        )  # fmt: skip

    def rotary(
        self, q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        assert self._lib is not None, self.reason
        t, hq, d = q.shape
        c, s = cos.contiguous(), sin.contiguous()  # (T, D/2)
        q_out = torch.empty(t, hq, d, dtype=q.dtype)
        k_out = torch.empty(k.shape, dtype=k.dtype)
        self._lib.ironlm_rotary_f32(
            q.data_ptr(), q.stride(0), hq, k.data_ptr(), k.stride(0), k.shape[1],
            c.data_ptr(), s.data_ptr(), q_out.data_ptr(), k_out.data_ptr(), t, d,
            self._threads(t),
        )  # fmt: skip
        return q_out, k_out
