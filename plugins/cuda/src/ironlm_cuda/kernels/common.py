"""Small pieces shared by the attention kernels: tile sizes, tanh soft cap, fp8 limits, dots."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

# float8 dtypes the KV cache may use -> the largest finite value (values are clamped to it).
FP8_MAX: dict[torch.dtype, float] = {
    torch.float8_e4m3fn: 448.0,
    torch.float8_e5m2: 57344.0,
}
# float8 dtype -> (mantissa bits, smallest normal, spacing of the subnormals)
FP8_GRID: dict[torch.dtype, tuple[int, float, float]] = {
    torch.float8_e4m3fn: (3, 2.0**-6, 2.0**-9),
    torch.float8_e5m2: (2, 2.0**-14, 2.0**-16),
}


def pow2_at_least(n: int, floor: int = 16) -> int:
    """Next power of two >= n, at least ``floor`` (tl.dot needs every dimension >= 16)."""
    return max(floor, triton.next_power_of_2(n))


def upcast_dot_operands(dtype: torch.dtype, device: torch.device) -> bool:
    """Whether the kernels should feed tl.dot float32 operands instead of ``dtype``.

    The Triton interpreter (CPU tensors) computes bfloat16 dots wrongly, so there bf16 operands
    are widened to float32; on a GPU the native bf16 tensor-core dot is used.
    """
    return dtype == torch.bfloat16 and device.type != "cuda"


@triton.jit
def soft_cap(scores, cap):
    """cap * tanh(scores / cap), with tanh(x) = 2 * sigmoid(2x) - 1 (stable at both ends)."""
    return cap * (2.0 * tl.sigmoid(2.0 * scores / cap) - 1.0)


@triton.jit
def dot(a, b, IEEE: tl.constexpr):
    """a @ b accumulated in float32; IEEE: exact float32 products (no TF32), for fp32 models."""
    if IEEE:
        return tl.dot(a, b, input_precision="ieee")
    else:
        return tl.dot(a, b)


@triton.jit
def round_to_fp8_grid(x, MANT_BITS: tl.constexpr, MIN_NORMAL: tl.constexpr,
                      SUB_SPACING: tl.constexpr, LIMIT: tl.constexpr):
    """float32 x -> the nearest float8 value (ties to even, saturating at +-LIMIT), still in
    float32, so that the cast to float8 that follows is exact. Rounding here rather than in the
    cast gives one defined quantisation on every device (Triton's interpreter rounds fp8 casts
    wrongly: it drops the carry into the exponent)."""
    ax = tl.abs(x)
    # normals: round the float32 mantissa to MANT_BITS bits, ties to even, carry into the exponent
    bits = ax.to(tl.int32, bitcast=True)
    drop: tl.constexpr = 23 - MANT_BITS
    lsb = (bits >> drop) & 1
    bits = (bits + ((1 << (drop - 1)) - 1) + lsb) & ~((1 << drop) - 1)
    normal = bits.to(tl.float32, bitcast=True)
    # subnormals: a fixed spacing; adding 2^23 * spacing makes the float32 add round to it
    magic = SUB_SPACING * 8388608.0
    sub = (ax + magic) - magic
    r = tl.minimum(tl.where(ax < MIN_NORMAL, sub, normal), LIMIT)
    return tl.where(x < 0, -r, r)
