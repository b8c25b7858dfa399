"""Fused RMSNorm, optionally with the residual add of a pre-norm transformer block."""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _rms_norm_kernel(
    x_ptr,  # (num_tokens, hidden)
    res_ptr,  # (num_tokens, hidden), read when HAS_RESIDUAL
    w_ptr,  # (hidden,)
    out_ptr,  # (num_tokens, hidden): normed
    res_out_ptr,  # (num_tokens, hidden): x + residual, written when HAS_RESIDUAL
    eps,
    stride_x, stride_r, stride_o, stride_ro,
    HIDDEN: tl.constexpr,
    BLOCK: tl.constexpr,
    HAS_RESIDUAL: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    mask = cols < HIDDEN
    x = tl.load(x_ptr + row * stride_x + cols, mask=mask, other=0.0)
    if HAS_RESIDUAL:
        r = tl.load(res_ptr + row * stride_r + cols, mask=mask, other=0.0)
        x = (x.to(tl.float32) + r.to(tl.float32)).to(res_out_ptr.dtype.element_ty)  # stream dtype
        tl.store(res_out_ptr + row * stride_ro + cols, x, mask=mask)
    xf = x.to(tl.float32)
    rstd = tl.rsqrt(tl.sum(xf * xf, 0) / HIDDEN + eps)
    w = tl.load(w_ptr + cols, mask=mask, other=0.0)
    normed = (xf * rstd).to(x.dtype).to(tl.float32) * w.to(tl.float32)  # as the reference rounds
    tl.store(out_ptr + row * stride_o + cols, normed.to(out_ptr.dtype.element_ty), mask=mask)


def rms_norm(
    x: torch.Tensor,  # (num_tokens, hidden)
    weight: torch.Tensor,  # (hidden,)
    eps: float,
    residual: torch.Tensor | None,  # (num_tokens, hidden) or None
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(normed, new_residual) with LayerOps.rms_norm's contract: with a residual, normalises
    ``x + residual`` and returns that sum as the new residual. Inputs are not modified."""
    hidden = x.shape[-1]
    x2 = x.reshape(-1, hidden)
    if x2.stride(-1) != 1:
        x2 = x2.contiguous()
    res2 = res_out = None
    stream_dtype = x.dtype
    if residual is not None:
        res2 = residual.reshape(-1, hidden)
        if res2.stride(-1) != 1:
            res2 = res2.contiguous()
        stream_dtype = torch.promote_types(x.dtype, residual.dtype)
        res_out = torch.empty(x2.shape, dtype=stream_dtype, device=x.device)
    out_dtype = torch.promote_types(stream_dtype, weight.dtype)
    out = torch.empty(x2.shape, dtype=out_dtype, device=x.device)
    if x2.shape[0] > 0:
        _rms_norm_kernel[(x2.shape[0],)](
            x2, res2 if res2 is not None else x2, weight.contiguous(), out,
            res_out if res_out is not None else out,
            float(eps),
            x2.stride(0), res2.stride(0) if res2 is not None else 0, out.stride(0),
            res_out.stride(0) if res_out is not None else 0,
            HIDDEN=hidden,
            BLOCK=triton.next_power_of_2(hidden),
            HAS_RESIDUAL=residual is not None,
            num_warps=4 if hidden <= 2048 else 8,
        )
    new_res = res_out.view(residual.shape) if res_out is not None and residual is not None else None
    return out.view(x.shape), new_res
