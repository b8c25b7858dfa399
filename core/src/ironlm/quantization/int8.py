"""Per-output-channel int8 weights: ``weight_only_int8`` (float activations, int8 layout) and
``smooth_quant`` (W8A8: activations quantized per token at run time, w8a8 layout).

Checkpoint (written by ``ironlm quantize``; ``quantization_config`` {"quant_method": NAME,
"bits": 8}): per linear ``weight`` (N, K) int8 and ``weight_scale`` (N,) float32,
W = weight * weight_scale[:, None]. A SmoothQuant checkpoint has the migration already folded
into the preceding RMSNorm / linear weights, so it loads like any other.

Selected by name on a float checkpoint, the weights are quantized at load (round to nearest,
per channel); SmoothQuant's migration needs calibration activations, which only the offline tool
has, so ``smooth_quant`` on a float checkpoint is plain W8A8 (logged).
"""

from __future__ import annotations

import logging
from typing import Any, ClassVar

import torch

from ironlm.interfaces.quant import INT8, W8A8, QuantLayout
from ironlm.quantization.base import LayoutMethod, checked_config, config_int, parameter
from ironlm.quantization.rtn import quantize_int8

log = logging.getLogger(__name__)


class WeightOnlyInt8Method(LayoutMethod):
    name: ClassVar[str] = "weight_only_int8"
    supported_platforms: ClassVar[tuple[str, ...]] = ("*",)
    kind: ClassVar[str] = INT8

    def __init__(self, prequantized: bool = False) -> None:
        self.prequantized = prequantized  # the checkpoint holds int8 weights

    @classmethod
    def from_config(cls, quant_config: dict[str, Any] | None) -> WeightOnlyInt8Method:
        if quant_config is None:
            return cls(prequantized=False)
        bits = config_int(checked_config(cls, quant_config), "bits", default=8)
        if bits != 8:
            raise ValueError(f"quantization {cls.name!r} stores 8-bit weights; config says {bits}")
        return cls(prequantized=True)

    def layout(self) -> QuantLayout:
        return QuantLayout(self.kind)

    def create_weights(
        self, layer: torch.nn.Module, in_features: int, out_features: int, dtype: torch.dtype
    ) -> None:
        if self.prequantized:
            layer.weight = parameter(out_features, in_features, dtype=torch.int8)
            layer.weight_scale = parameter(out_features, dtype=torch.float32)
        else:
            layer.weight = parameter(out_features, in_features, dtype=dtype)

    def canonical_tensors(self, layer: torch.nn.Module) -> dict[str, torch.Tensor]:
        if self.prequantized:
            return {"qweight": layer.weight.data, "scale": layer.weight_scale.data.float()}
        qweight, scale = quantize_int8(layer.weight.data)
        return {"qweight": qweight, "scale": scale}


class SmoothQuantMethod(WeightOnlyInt8Method):
    name: ClassVar[str] = "smooth_quant"
    kind: ClassVar[str] = W8A8

    @classmethod
    def from_config(cls, quant_config: dict[str, Any] | None) -> WeightOnlyInt8Method:
        if quant_config is None:
            log.warning(
                "smooth_quant on a float checkpoint: W8A8 without the SmoothQuant migration "
                "(it needs calibration activations; `ironlm quantize --quant-type smooth_quant "
                "-sq ALPHA` writes a migrated checkpoint)"
            )
        return super().from_config(quant_config)
