"""Quantized matmuls for the canonical layouts (``ironlm.interfaces.quant``): y = x @ W^T + b.

- int8 / int4 / fp8 (weight-only): one kernel; each program computes a (BLOCK_M, BLOCK_N) tile
  of y, dequantizing its (BLOCK_K, BLOCK_N) slice of W in registers per K step (int8: the value;
  int4: the nibble minus the group's zero point, times the group's scale; fp8: e4m3 bits decoded
  exactly), and ``tl.dot`` accumulates in float32. Per-row scales (int8, fp8) multiply the
  finished tile. The weight stays in its canonical (N, K) layout: decode reads it once.
- w8a8: activations quantized per token by ``_quantize_rows`` with the reference's rounding
  (sx = max |x| / 127, round half to even), then an int8 x int8 -> int32 ``tl.dot`` and the
  per-token x per-channel rescale.
Numerics follow the reference up to float summation order (and, for half-precision activations
on a GPU, the dot's input precision). Float32 dots ask for IEEE products (no TF32).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ironlm_cuda.kernels.common import dot

INT8, INT4, FP8 = 0, 1, 2


@triton.jit
def _fp8_e4m3_to_f32(b):
    """uint8 e4m3fn bits -> float32 value (exact): s eeee mmm, bias 7, e == 0 subnormal."""
    b = b.to(tl.int32)
    e = (b >> 3) & 0xF
    m = b & 7
    normal = (((e + 120) << 23) | (m << 20)).to(tl.float32, bitcast=True)
    value = tl.where(e == 0, m.to(tl.float32) * 0.001953125, normal)  # subnormal: m * 2^-9
    return tl.where((b & 0x80) != 0, -value, value)


@triton.jit
def _weight_only_kernel(
    x_ptr, w_ptr, s_ptr, z_ptr, b_ptr, y_ptr,
    M, N, K, GROUP,
    stride_xm, stride_wn, stride_sn, stride_ym,
    KIND: tl.constexpr, HAS_ZERO: tl.constexpr, HAS_BIAS: tl.constexpr, IEEE: tl.constexpr,
    DOT_DTYPE: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
):  # fmt: skip
    rm = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    rn = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    m_ok, n_ok = rm < M, rn < N
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        rk = k0 + tl.arange(0, BLOCK_K)
        k_ok = rk < K
        x = tl.load(x_ptr + rm[:, None].to(tl.int64) * stride_xm + rk[None, :],
                    mask=m_ok[:, None] & k_ok[None, :], other=0.0)  # (BLOCK_M, BLOCK_K)
        wmask = k_ok[:, None] & n_ok[None, :]
        rows = rn[None, :].to(tl.int64)
        if KIND == 1:  # int4: byte k // 2, low nibble for even k
            byte = tl.load(w_ptr + rows * stride_wn + (rk // 2)[:, None], mask=wmask, other=0)
            q = ((byte.to(tl.int32) >> ((rk % 2) * 4)[:, None]) & 0xF).to(tl.float32)
            g = (rk // GROUP)[:, None]
            scale = tl.load(s_ptr + rows * stride_sn + g, mask=wmask, other=0.0)
            if HAS_ZERO:
                zero = tl.load(z_ptr + rows * stride_sn + g, mask=wmask, other=0).to(tl.float32)
            else:
                zero = 8.0
            w = (q - zero) * scale  # (BLOCK_K, BLOCK_N)
        elif KIND == 2:  # fp8 bits
            w = _fp8_e4m3_to_f32(tl.load(w_ptr + rows * stride_wn + rk[:, None], mask=wmask, other=0))
        else:
            w = tl.load(w_ptr + rows * stride_wn + rk[:, None], mask=wmask, other=0).to(tl.float32)
        acc += dot(x.to(DOT_DTYPE), w.to(DOT_DTYPE), IEEE)
    if KIND != 1:  # per output channel
        acc *= tl.load(s_ptr + rn, mask=n_ok, other=0.0)[None, :]
    if HAS_BIAS:
        acc += tl.load(b_ptr + rn, mask=n_ok, other=0.0).to(tl.float32)[None, :]
    tl.store(y_ptr + rm[:, None].to(tl.int64) * stride_ym + rn[None, :],
             acc.to(y_ptr.dtype.element_ty), mask=m_ok[:, None] & n_ok[None, :])


@triton.jit
def _round_half_even(v):
    f = tl.floor(v)
    d = v - f
    odd = (f - 2.0 * tl.floor(f * 0.5)) != 0.0
    return tl.where(d > 0.5, f + 1.0, tl.where(d < 0.5, f, tl.where(odd, f + 1.0, f)))


@triton.jit
def _quantize_rows(x_ptr, q_ptr, s_ptr, K, stride_xm, BLOCK: tl.constexpr):
    """One row per program: sx = max(max |x|, 1e-8) / 127, q = clamp(round(x / sx), +-127)."""
    row = tl.program_id(0).to(tl.int64)
    amax = tl.zeros((BLOCK,), dtype=tl.float32)
    for k0 in range(0, K, BLOCK):
        rk = k0 + tl.arange(0, BLOCK)
        x = tl.load(x_ptr + row * stride_xm + rk, mask=rk < K, other=0.0).to(tl.float32)
        amax = tl.maximum(amax, tl.abs(x))
    sx = tl.maximum(tl.max(amax, 0), 1e-8) / 127.0
    for k0 in range(0, K, BLOCK):
        rk = k0 + tl.arange(0, BLOCK)
        x = tl.load(x_ptr + row * stride_xm + rk, mask=rk < K, other=0.0).to(tl.float32)
        q = tl.minimum(tl.maximum(_round_half_even(tl.math.div_rn(x, sx)), -127.0), 127.0)
        tl.store(q_ptr + row * K + rk, q.to(tl.int8), mask=rk < K)
    tl.store(s_ptr + row, sx)


@triton.jit
def _w8a8_kernel(
    q_ptr, sx_ptr, w_ptr, s_ptr, b_ptr, y_ptr, M, N, K, stride_wn, stride_ym,
    HAS_BIAS: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
):  # fmt: skip
    rm = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    rn = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    m_ok, n_ok = rm < M, rn < N
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.int32)
    for k0 in range(0, K, BLOCK_K):
        rk = k0 + tl.arange(0, BLOCK_K)
        k_ok = rk < K
        xq = tl.load(q_ptr + rm[:, None].to(tl.int64) * K + rk[None, :],
                     mask=m_ok[:, None] & k_ok[None, :], other=0)
        wq = tl.load(w_ptr + rn[None, :].to(tl.int64) * stride_wn + rk[:, None],
                     mask=k_ok[:, None] & n_ok[None, :], other=0)
        acc += tl.dot(xq, wq, out_dtype=tl.int32)  # exact integer sums
    sx = tl.load(sx_ptr + rm, mask=m_ok, other=0.0)
    scale = tl.load(s_ptr + rn, mask=n_ok, other=0.0)
    y = acc.to(tl.float32) * sx[:, None] * scale[None, :]
    if HAS_BIAS:
        y += tl.load(b_ptr + rn, mask=n_ok, other=0.0).to(tl.float32)[None, :]
    tl.store(y_ptr + rm[:, None].to(tl.int64) * stride_ym + rn[None, :],
             y.to(y_ptr.dtype.element_ty), mask=m_ok[:, None] & n_ok[None, :])


def _blocks(m: int, n: int) -> tuple[int, int, int]:
    """(BLOCK_M, BLOCK_N, BLOCK_K): small M (decode) gets wide N tiles; every dim >= 16."""
    block_m = 16 if m <= 16 else 32 if m <= 32 else 64
    return block_m, 64 if n >= 64 else 32 if n >= 32 else 16, 64


def weight_only_matmul(
    kind: int,  # INT8, INT4 or FP8
    x: torch.Tensor,  # (M, K)
    qweight: torch.Tensor,  # int8 (N, K); int4 uint8 (N, K / 2); fp8 bits as uint8 (N, K)
    scale: torch.Tensor,  # float32: (N,); int4: (N, K / group)
    zero: torch.Tensor | None,  # int4 with zero points: uint8 (N, K / group)
    group: int,
    bias: torch.Tensor | None,  # (N,)
) -> torch.Tensor:  # (M, N) in x.dtype
    if x.stride(-1) != 1:
        x = x.contiguous()
    m, k = x.shape
    n = qweight.shape[0]
    y = torch.empty(m, n, dtype=x.dtype, device=x.device)
    if m == 0:
        return y
    bm, bn, bk = _blocks(m, n)
    on_gpu = x.device.type == "cuda"
    # the dot's operand dtype: x's half type on a GPU (tensor cores); float32 otherwise
    dot_dtype = {torch.float16: tl.float16, torch.bfloat16: tl.bfloat16}.get(x.dtype, tl.float32)
    if not on_gpu:
        dot_dtype = tl.float32
    grid = (triton.cdiv(m, bm), triton.cdiv(n, bn))
    _weight_only_kernel[grid](
        x, qweight, scale, zero if zero is not None else scale,
        bias if bias is not None else scale, y,
        m, n, k, max(group, 1), x.stride(0), qweight.stride(0), scale.stride(0), y.stride(0),
        KIND=kind, HAS_ZERO=zero is not None, HAS_BIAS=bias is not None,
        IEEE=dot_dtype == tl.float32, DOT_DTYPE=dot_dtype,
        BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk,
    )  # fmt: skip
    return y


def w8a8_matmul(
    x: torch.Tensor,  # (M, K)
    qweight: torch.Tensor,  # int8 (N, K)
    scale: torch.Tensor,  # float32 (N,)
    bias: torch.Tensor | None,
) -> torch.Tensor:  # (M, N) in x.dtype
    if x.stride(-1) != 1:
        x = x.contiguous()
    m, k = x.shape
    n = qweight.shape[0]
    y = torch.empty(m, n, dtype=x.dtype, device=x.device)
    if m == 0:
        return y
    xq = torch.empty(m, k, dtype=torch.int8, device=x.device)
    sx = torch.empty(m, dtype=torch.float32, device=x.device)
    _quantize_rows[(m,)](x, xq, sx, k, x.stride(0), BLOCK=min(1024, triton.next_power_of_2(k)))
    bm, bn, bk = _blocks(m, n)
    _w8a8_kernel[(triton.cdiv(m, bm), triton.cdiv(n, bn))](
        xq, sx, qweight, scale, bias if bias is not None else scale, y, m, n, k,
        qweight.stride(0), y.stride(0), HAS_BIAS=bias is not None,
        BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk,
    )  # fmt: skip
    return y
