"""KV-cache write: store each new token's keys and values at its slot of the paged cache."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ironlm_cuda.kernels.common import FP8_GRID, FP8_MAX, round_to_fp8_grid


@triton.jit
def _kv_write_kernel(
    k_ptr,  # (num_tokens, num_kv_heads, head_dim)
    v_ptr,  # (num_tokens, num_kv_heads, head_dim)
    k_cache_ptr,  # (num_blocks, block_size, num_kv_heads, head_dim)
    v_cache_ptr,  # same shape and strides as k_cache
    slot_mapping_ptr,  # (num_tokens,) int64; a negative slot is a padding token: skipped
    k_scale,  # fp8 only: stored = k / k_scale
    v_scale,
    stride_kt, stride_kh, stride_vt, stride_vh,
    stride_cb, stride_cs, stride_ch,  # cache strides: block, slot in block, head
    NUM_KV_HEADS: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    BLOCK_H: tl.constexpr,
    BLOCK_D: tl.constexpr,
    BLOCK_SIZE: tl.constexpr,
    FP8: tl.constexpr,
    FP8_LIMIT: tl.constexpr,  # fp8: largest finite value; the grid of the fp8 dtype:
    MANT_BITS: tl.constexpr,  # mantissa bits
    MIN_NORMAL: tl.constexpr,  # smallest normal value
    SUB_SPACING: tl.constexpr,  # spacing of the subnormals
):
    tok = tl.program_id(0)
    slot = tl.load(slot_mapping_ptr + tok).to(tl.int64)
    heads = tl.arange(0, BLOCK_H)
    dims = tl.arange(0, BLOCK_D)
    slots = slot + tl.zeros([BLOCK_H], tl.int64)  # a block, not a scalar, in the mask below
    mask = (heads[:, None] < NUM_KV_HEADS) & (dims[None, :] < HEAD_DIM) & (slots[:, None] >= 0)
    k = tl.load(k_ptr + tok * stride_kt + heads[:, None] * stride_kh + dims[None, :], mask=mask)
    v = tl.load(v_ptr + tok * stride_vt + heads[:, None] * stride_vh + dims[None, :], mask=mask)
    if FP8:
        k = round_to_fp8_grid(k.to(tl.float32) / k_scale, MANT_BITS, MIN_NORMAL, SUB_SPACING,
                              FP8_LIMIT)
        v = round_to_fp8_grid(v.to(tl.float32) / v_scale, MANT_BITS, MIN_NORMAL, SUB_SPACING,
                              FP8_LIMIT)
    block = slots[:, None] // BLOCK_SIZE  # (BLOCK_H, 1)
    offset = slots[:, None] % BLOCK_SIZE
    dst = block * stride_cb + offset * stride_cs + heads[:, None] * stride_ch + dims[None, :]
    tl.store(k_cache_ptr + dst, k.to(k_cache_ptr.dtype.element_ty), mask=mask)
    tl.store(v_cache_ptr + dst, v.to(v_cache_ptr.dtype.element_ty), mask=mask)


def write_kv(
    kv_cache: torch.Tensor,  # (2, num_blocks, block_size, num_kv_heads, head_dim)
    k: torch.Tensor,  # (num_tokens, num_kv_heads, head_dim)
    v: torch.Tensor,  # (num_tokens, num_kv_heads, head_dim)
    slot_mapping: torch.Tensor,  # (num_tokens,) int64
    k_scale: float = 1.0,
    v_scale: float = 1.0,
) -> None:
    """Store new keys/values at their cache slots (slot = block_id * block_size + offset). With
    an fp8 cache the values are divided by their scale and rounded to the nearest fp8 value
    (ties to even, saturating at the largest finite one)."""
    num_tokens, num_kv_heads, head_dim = k.shape
    if num_tokens == 0:
        return
    if kv_cache.stride(-1) != 1:
        raise ValueError("write_kv needs the KV cache's head dimension contiguous")
    k = k if k.stride(-1) == 1 else k.contiguous()
    v = v if v.stride(-1) == 1 else v.contiguous()
    k_cache, v_cache = kv_cache[0], kv_cache[1]
    fp8 = kv_cache.dtype in FP8_MAX
    mant_bits, min_normal, sub_spacing = FP8_GRID.get(kv_cache.dtype, (0, 0.0, 0.0))
    _kv_write_kernel[(num_tokens,)](
        k, v, k_cache, v_cache, slot_mapping,
        float(k_scale), float(v_scale),
        k.stride(0), k.stride(1), v.stride(0), v.stride(1),
        k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
        NUM_KV_HEADS=num_kv_heads,
        HEAD_DIM=head_dim,
        BLOCK_H=triton.next_power_of_2(num_kv_heads),
        BLOCK_D=triton.next_power_of_2(head_dim),
        BLOCK_SIZE=kv_cache.shape[2],
        FP8=fp8,
        FP8_LIMIT=FP8_MAX.get(kv_cache.dtype, 0.0),
        MANT_BITS=mant_bits,
        MIN_NORMAL=min_normal,
        SUB_SPACING=sub_spacing,
    )
