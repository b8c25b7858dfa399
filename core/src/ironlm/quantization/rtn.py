"""Round-to-nearest quantizers into the canonical layouts (``ironlm.interfaces.quant``).

Used online (a float checkpoint served with ``quantization=NAME``) and by the offline tool
(the final rounding step of AWQ and GPTQ, and the round-to-nearest baselines).

int4 conventions (the ones GPTQ and AutoAWQ write):
  symmetric   scale = 2 * max|w| / 15 per group, zero 8: q = clamp(round(w / scale) + 8, 0, 15)
  asymmetric  scale = (max w - min w) / 15, zero = clamp(round(-min w / scale), 0, 15)
"""

from __future__ import annotations

import torch

from ironlm.interfaces.quant import pack_int4

FP8_MAX = 448.0  # largest finite float8_e4m3fn
_TINY = 1e-10


def quantize_int8(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(N, K) float -> (qweight (N, K) int8, scale (N,) float32), per output channel,
    symmetric: W ~= qweight * scale[:, None]."""
    w = weight.float()
    scale = (w.abs().amax(dim=1) / 127.0).clamp(min=_TINY)  # (N,)
    q = torch.round(w / scale.unsqueeze(1)).clamp(-127, 127).to(torch.int8)
    return q, scale


def int4_params(
    weight: torch.Tensor, group_size: int, zero_points: bool
) -> tuple[torch.Tensor, torch.Tensor]:
    """Round-to-nearest group parameters of an (N, K) weight: (scale, zero), each
    (N, K // group_size) float32 (zero holds integers 0..15; 8 when symmetric)."""
    w = _grouped(weight, group_size)  # (N, K // G, G)
    if zero_points:
        high, low = w.amax(dim=-1), w.amin(dim=-1)
        scale = ((high - low) / 15.0).clamp(min=_TINY)
        zero = torch.round(-low / scale).clamp(0, 15)
    else:
        scale = (w.abs().amax(dim=-1) * 2.0 / 15.0).clamp(min=_TINY)
        zero = torch.full_like(scale, 8.0)
    return scale, zero


def int4_values(
    weight: torch.Tensor, scale: torch.Tensor, zero: torch.Tensor, group_size: int
) -> torch.Tensor:
    """(N, K) integer codes 0..15 of ``weight`` under group (scale, zero), as float32."""
    w = _grouped(weight, group_size)
    # in place after the first op: one buffer instead of one per step (these run on whole
    # weights many times in the offline searches)
    q = torch.div(w, scale.unsqueeze(-1)).round_().add_(zero.unsqueeze(-1))
    return q.clamp_(0, 15).reshape(weight.shape)


def fake_int4(
    weight: torch.Tensor, scale: torch.Tensor, zero: torch.Tensor, group_size: int
) -> torch.Tensor:
    """The float32 weight the int4 codes of ``weight`` stand for (quantize, dequantize)."""
    q = _grouped(int4_values(weight, scale, zero, group_size), group_size)
    return q.sub_(zero.unsqueeze(-1)).mul_(scale.unsqueeze(-1)).reshape(weight.shape)


def quantize_int4(
    weight: torch.Tensor, group_size: int, zero_points: bool
) -> dict[str, torch.Tensor]:
    """(N, K) float -> the int4 layout's canonical tensors (round to nearest)."""
    scale, zero = int4_params(weight, group_size, zero_points)
    return int4_tensors(int4_values(weight, scale, zero, group_size), scale, zero, zero_points)


def int4_tensors(
    values: torch.Tensor, scale: torch.Tensor, zero: torch.Tensor, zero_points: bool
) -> dict[str, torch.Tensor]:
    """Codes (N, K), scale and zero (N, K // G) -> the int4 layout's canonical tensors."""
    tensors = {"qweight": pack_int4(values), "scale": scale.float().contiguous()}
    if zero_points:
        tensors["zero"] = zero.to(torch.uint8).contiguous()
    return tensors


def quantize_fp8(weight: torch.Tensor, per_channel: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """(N, K) float -> (qweight (N, K) float8_e4m3fn, scale (N,) or () float32):
    W ~= qweight * scale, the largest magnitude mapped to the format's largest value."""
    w = weight.float()
    amax = w.abs().amax(dim=1) if per_channel else w.abs().amax()
    scale = (amax / FP8_MAX).clamp(min=_TINY)
    divisor = scale.unsqueeze(1) if per_channel else scale
    q = (w / divisor).clamp(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn)
    return q, scale.float()


def check_group_size(in_features: int, group_size: int, what: str) -> None:
    """ValueError unless ``in_features`` is a whole number of groups."""
    if group_size <= 0 or in_features % group_size != 0:
        raise ValueError(
            f"{what}: group_size {group_size} does not divide the layer's {in_features} input "
            "features (each group of input features shares a scale); use a group size that "
            "divides every layer's input (per tensor-parallel shard)"
        )


def _grouped(weight: torch.Tensor, group_size: int) -> torch.Tensor:
    n, k = weight.shape
    check_group_size(k, group_size, "int4 quantization")
    return weight.float().reshape(n, k // group_size, group_size)
