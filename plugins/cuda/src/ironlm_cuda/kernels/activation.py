"""Fused gated activations of the MLP: silu(gate) * up and gelu_tanh(gate) * up."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

BLOCK = 1024  # output columns per program


@triton.jit
def _act_and_mul_kernel(
    x_ptr,  # (num_tokens, 2 * inter): gate first, then up
    out_ptr,  # (num_tokens, inter)
    stride_x, stride_o,
    INTER: tl.constexpr,
    BLOCK: tl.constexpr,
    GELU_TANH: tl.constexpr,  # False: silu
):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = cols < INTER
    gate = tl.load(x_ptr + row * stride_x + cols, mask=mask, other=0.0).to(tl.float32)
    up = tl.load(x_ptr + row * stride_x + INTER + cols, mask=mask, other=0.0).to(tl.float32)
    if GELU_TANH:
        inner = 0.7978845608028654 * (gate + 0.044715 * gate * gate * gate)  # sqrt(2/pi)
        act = 0.5 * gate * (1.0 + (2.0 * tl.sigmoid(2.0 * inner) - 1.0))  # tanh via sigmoid
    else:
        act = gate * tl.sigmoid(gate)
    tl.store(out_ptr + row * stride_o + cols, (act * up).to(out_ptr.dtype.element_ty), mask=mask)


def act_and_mul(gate_up: torch.Tensor, gelu_tanh: bool = False) -> torch.Tensor:
    """(..., 2*I) -> (..., I): act(gate) * up, gate first; act is silu or gelu (tanh approx)."""
    inter = gate_up.shape[-1] // 2
    x = gate_up.reshape(-1, 2 * inter)
    if x.stride(-1) != 1:
        x = x.contiguous()
    out = torch.empty((x.shape[0], inter), dtype=gate_up.dtype, device=gate_up.device)
    if x.shape[0] > 0 and inter > 0:
        grid = (x.shape[0], triton.cdiv(inter, BLOCK))
        _act_and_mul_kernel[grid](
            x, out, x.stride(0), out.stride(0), INTER=inter, BLOCK=BLOCK, GELU_TANH=gelu_tanh
        )
    return out.view(*gate_up.shape[:-1], inter)
