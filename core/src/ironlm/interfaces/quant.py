"""Quantized weight layouts: where quantization methods and platform kernels meet.

A quantization method (``ironlm.interfaces.quantization``) owns a checkpoint format; a platform's
layer ops (``ironlm.interfaces.platform.LayerOps``) own the kernels. Between them sits one of
the canonical layouts below: the method converts what its checkpoint holds into the layout's
tensors once after loading and hands them to ``layer_ops.pack_quantized(layout, tensors)``
(which may repack them for its kernels); each forward calls
``layer_ops.quantized_linear(layout, x, packed, bias)``. The functions here are the pure-torch
reference every platform kernel is tested against; the core's LayerOps runs them as is.

Canonical tensors per layout kind (W is the (N, K) float weight the layout stands for; N output
features, K input features; x is (T, K)):

  int8   qweight (N, K) int8, scale (N,) float32
         W[n, k] = qweight[n, k] * scale[n]                        (per-channel symmetric)
  w8a8   the int8 tensors, and activations quantized per token at run time:
         x[t, k] ~= xq[t, k] * sx[t], sx[t] = max_k |x[t, k]| / 127, xq = round(x / sx)
         y[t, n] = sx[t] * scale[n] * sum_k xq[t, k] * qweight[n, k]   (exact integer sums)
  int4   qweight (N, K // 2) uint8: element k in byte k // 2, low nibble for even k, high
         nibble for odd k; scale (N, K // G) float32; zero (N, K // G) uint8 when the layout has
         zero points (asymmetric), absent otherwise (symmetric: zero 8)
         W[n, k] = (q[n, k] - zero[n, k // G]) * scale[n, k // G],  G = layout.group_size
  fp8    qweight (N, K) float8_e4m3fn, scale () per tensor or (N,) per channel, float32
         W[n, k] = float(qweight[n, k]) * scale[(n)]
  gguf   qweight (N, R) uint8: row n holds the GGML blocks of output row n as in the file
         (R = K / block_elements * block_bytes of ``layout.ggml_type``)
         W[n, :] = gguf.dequantize(row n)

Tensor parallelism slices these tensors proportionally (``ironlm.layers.linear``): a layout
shards when every rank's K is a whole number of groups (int4) or blocks (gguf).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

INT8, W8A8, INT4, FP8, GGUF = "int8", "w8a8", "int4", "fp8", "gguf"
KINDS = (INT8, W8A8, INT4, FP8, GGUF)


@dataclass(frozen=True)
class QuantLayout:
    """One canonical layout (see the module docstring for its tensors)."""

    kind: str  # one of KINDS
    group_size: int | None = None  # int4: input features per scale / zero group (32, 64, 128)
    zero_points: bool = False  # int4: asymmetric, with a ``zero`` tensor
    ggml_type: int | None = None  # gguf: the GGMLQuantizationType value (Q4_0 = 2, ...)

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"unknown quantized layout kind {self.kind!r}; known: {KINDS}")
        if self.kind == INT4 and not self.group_size:
            raise ValueError("an int4 layout needs a group_size")
        if self.kind == GGUF and self.ggml_type is None:
            raise ValueError("a gguf layout needs a ggml_type")

    def describe(self) -> str:
        if self.kind == INT4:
            zeros = "asymmetric" if self.zero_points else "symmetric"
            return f"int4 (group {self.group_size}, {zeros})"
        if self.kind == GGUF:
            return f"gguf ({_ggml_name(self.ggml_type)})"
        return self.kind


def _ggml_name(ggml_type: int | None) -> str:
    from gguf import GGMLQuantizationType

    return GGMLQuantizationType(ggml_type).name if ggml_type is not None else "?"


def unpack_int4(packed: torch.Tensor) -> torch.Tensor:
    """(N, K // 2) uint8 -> (N, K) uint8 values 0..15 (even k from the low nibble)."""
    low = packed & 0x0F
    high = packed >> 4
    return torch.stack((low, high), dim=-1).reshape(packed.shape[0], -1)


def pack_int4(values: torch.Tensor) -> torch.Tensor:
    """(N, K) integer values 0..15, K even -> (N, K // 2) uint8 (inverse of ``unpack_int4``)."""
    v = values.to(torch.uint8).reshape(values.shape[0], -1, 2)
    return v[..., 0] | (v[..., 1] << 4)


def quantize_per_token(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """w8a8 activations: (T, K) float -> (xq (T, K) int8, sx (T,) float32), x ~= xq * sx."""
    xf = x.float()
    sx = xf.abs().amax(dim=-1).clamp(min=1e-8) / 127.0  # (T,)
    xq = torch.round(xf / sx.unsqueeze(1)).clamp(-127, 127).to(torch.int8)
    return xq, sx


def dequantize(layout: QuantLayout, tensors: dict[str, torch.Tensor]) -> torch.Tensor:
    """The (N, K) float32 weight the canonical tensors stand for."""
    q = tensors["qweight"]
    if layout.kind in (INT8, W8A8):
        return q.float() * tensors["scale"].float().unsqueeze(1)
    if layout.kind == INT4:
        assert layout.group_size is not None
        values = unpack_int4(q).float()  # (N, K)
        g = layout.group_size
        scale = tensors["scale"].float().repeat_interleave(g, dim=1)  # (N, K)
        zero = tensors["zero"].float().repeat_interleave(g, dim=1) if layout.zero_points else 8.0
        return (values - zero) * scale
    if layout.kind == FP8:
        scale = tensors["scale"].float()
        w = q.float()
        return w * (scale.unsqueeze(1) if scale.dim() == 1 else scale)
    from gguf import GGMLQuantizationType
    from gguf import dequantize as gguf_dequantize

    rows = gguf_dequantize(q.cpu().numpy(), GGMLQuantizationType(layout.ggml_type))
    return torch.from_numpy(rows.copy()).float().to(q.device)


def reference_linear(
    layout: QuantLayout,
    x: torch.Tensor,  # (T, K)
    tensors: dict[str, torch.Tensor],  # the canonical tensors
    bias: torch.Tensor | None,  # (N,)
) -> torch.Tensor:  # (T, N) in x.dtype
    """x @ W^T + bias for a canonical layout, in pure torch (the oracle for kernels)."""
    if layout.kind == W8A8:
        xq, sx = quantize_per_token(x)
        # int8 x int8 products summed exactly: float64 holds every partial sum of K < 2^38
        acc = xq.double() @ tensors["qweight"].double().t()  # (T, N)
        y = (acc * sx.double().unsqueeze(1) * tensors["scale"].double().unsqueeze(0)).float()
    else:
        y = torch.nn.functional.linear(x.float(), dequantize(layout, tensors))
    if bias is not None:
        y = y + bias.float()
    return y.to(x.dtype)


def reference_embedding(
    layout: QuantLayout, ids: torch.Tensor, tensors: dict[str, torch.Tensor]
) -> torch.Tensor:
    """(T,) ids -> (T, K) float32 rows of the weight a quantized (vocab, hidden) table holds
    (quantized embeddings: GGUF token tables, tied LM heads)."""
    rows = {name: t[ids] if t.dim() > 0 and t.shape[0] > 1 else t for name, t in tensors.items()}
    return dequantize(layout, rows)
