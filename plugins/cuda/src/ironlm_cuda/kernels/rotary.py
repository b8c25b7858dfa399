"""Fused neox-style rotary embedding of q and k in one launch."""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _rotate_heads(
    src_ptr, dst_ptr, cos, sin, tok, stride_st, stride_sh, stride_dt, stride_dh,
    NUM_HEADS: tl.constexpr, HALF: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_HALF: tl.constexpr,
):
    """Rotate all heads of one token: (x1, x2) -> (x1*c - x2*s, x2*c + x1*s), halves of D."""
    heads = tl.arange(0, BLOCK_H)
    cols = tl.arange(0, BLOCK_HALF)
    mask = (heads[:, None] < NUM_HEADS) & (cols[None, :] < HALF)
    src = src_ptr + tok * stride_st + heads[:, None] * stride_sh + cols[None, :]
    x1 = tl.load(src, mask=mask, other=0.0).to(tl.float32)  # (BLOCK_H, BLOCK_HALF)
    x2 = tl.load(src + HALF, mask=mask, other=0.0).to(tl.float32)
    dst = dst_ptr + tok * stride_dt + heads[:, None] * stride_dh + cols[None, :]
    ty = dst_ptr.dtype.element_ty
    tl.store(dst, (x1 * cos[None, :] - x2 * sin[None, :]).to(ty), mask=mask)
    tl.store(dst + HALF, (x2 * cos[None, :] + x1 * sin[None, :]).to(ty), mask=mask)


@triton.jit
def _rotary_kernel(
    q_ptr, k_ptr,  # (num_tokens, num_heads, head_dim), (num_tokens, num_kv_heads, head_dim)
    q_out_ptr, k_out_ptr,  # same shapes, contiguous
    cos_ptr, sin_ptr,  # (num_tokens, head_dim // 2)
    stride_qt, stride_qh, stride_kt, stride_kh,
    stride_qot, stride_qoh, stride_kot, stride_koh,
    stride_ct, stride_st,
    NUM_HEADS: tl.constexpr, NUM_KV_HEADS: tl.constexpr, HALF: tl.constexpr,
    BLOCK_H: tl.constexpr, BLOCK_KV: tl.constexpr, BLOCK_HALF: tl.constexpr,
    ROUND_CS: tl.constexpr,  # round cos/sin to the activations' dtype first (as the reference)
):
    tok = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK_HALF)
    cos = tl.load(cos_ptr + tok * stride_ct + cols, mask=cols < HALF, other=0.0)
    sin = tl.load(sin_ptr + tok * stride_st + cols, mask=cols < HALF, other=0.0)
    if ROUND_CS:
        cos = cos.to(q_ptr.dtype.element_ty)
        sin = sin.to(q_ptr.dtype.element_ty)
    cos = cos.to(tl.float32)
    sin = sin.to(tl.float32)
    _rotate_heads(q_ptr, q_out_ptr, cos, sin, tok, stride_qt, stride_qh, stride_qot, stride_qoh,
                  NUM_HEADS, HALF, BLOCK_H, BLOCK_HALF)
    _rotate_heads(k_ptr, k_out_ptr, cos, sin, tok, stride_kt, stride_kh, stride_kot, stride_koh,
                  NUM_KV_HEADS, HALF, BLOCK_KV, BLOCK_HALF)


def rotary(
    q: torch.Tensor,  # (num_tokens, num_heads, head_dim)
    k: torch.Tensor,  # (num_tokens, num_kv_heads, head_dim)
    cos: torch.Tensor,  # (num_tokens, head_dim // 2)
    sin: torch.Tensor,  # (num_tokens, head_dim // 2)
) -> tuple[torch.Tensor, torch.Tensor]:
    """Neox-style rotary; returns new (q, k), the inputs are not modified."""
    num_tokens, num_heads, head_dim = q.shape
    num_kv_heads = k.shape[1]
    half = head_dim // 2
    q = q if q.stride(-1) == 1 else q.contiguous()
    k = k if k.stride(-1) == 1 else k.contiguous()
    cos = cos if cos.stride(-1) == 1 else cos.contiguous()
    sin = sin if sin.stride(-1) == 1 else sin.contiguous()
    q_out = torch.empty_like(q, memory_format=torch.contiguous_format)
    k_out = torch.empty_like(k, memory_format=torch.contiguous_format)
    if num_tokens > 0:
        _rotary_kernel[(num_tokens,)](
            q, k, q_out, k_out, cos, sin,
            q.stride(0), q.stride(1), k.stride(0), k.stride(1),
            q_out.stride(0), q_out.stride(1), k_out.stride(0), k_out.stride(1),
            cos.stride(0), sin.stride(0),
            NUM_HEADS=num_heads, NUM_KV_HEADS=num_kv_heads, HALF=half,
            BLOCK_H=triton.next_power_of_2(num_heads),
            BLOCK_KV=triton.next_power_of_2(num_kv_heads),
            BLOCK_HALF=triton.next_power_of_2(half),
            ROUND_CS=q.dtype != torch.float32,
        )
    return q_out, k_out
