"""``fp8``: float8 e4m3 weights with per-tensor or per-channel scales (the fp8 layout), the
checkpoint layout vLLM's ``fp8`` method loads: quantization_config {"quant_method": "fp8",
"activation_scheme": "dynamic" | "static"}; per linear ``weight`` (N, K) float8_e4m3fn and
``weight_scale`` () per tensor (AutoFP8, ``ironlm quantize --quant-type fp8``) or (N,) / (N, 1)
per channel, W = weight * weight_scale.

Merged layers (q/k/v, gate/up) keep one scale per output row, so parts with different
per-tensor scales merge exactly. Activations: the fp8 layout computes with float activations
(the CPU reference upcasts the weight; a platform may quantize activations dynamically in its
kernel). A static checkpoint's ``input_scale`` is read and not applied (logged).

Selected by name on a float checkpoint, the weights are quantized at load with per-channel
scales.
"""

from __future__ import annotations

import logging
from typing import Any, ClassVar

import torch

from ironlm.interfaces.quant import FP8, QuantLayout
from ironlm.quantization.base import LayoutMethod, checked_config, parameter
from ironlm.quantization.rtn import quantize_fp8

log = logging.getLogger(__name__)

ACTIVATION_SCHEMES = ("dynamic", "static")


class Fp8Method(LayoutMethod):
    name: ClassVar[str] = "fp8"
    supported_platforms: ClassVar[tuple[str, ...]] = ("*",)

    def __init__(self, prequantized: bool = False, static_activations: bool = False) -> None:
        self.prequantized = prequantized
        self.static_activations = static_activations

    @classmethod
    def from_config(cls, quant_config: dict[str, Any] | None) -> Fp8Method:
        if quant_config is None:
            return cls()
        config = checked_config(cls, quant_config)
        if config.get("weight_block_size"):
            raise ValueError(
                "quantization 'fp8': block-wise scales (weight_block_size "
                f"{config['weight_block_size']}) are not supported; the fp8 layout has "
                "per-tensor or per-channel scales"
            )
        if config.get("ignored_layers"):
            raise ValueError(
                f"quantization 'fp8': ignored_layers {config['ignored_layers']} is not "
                "supported (every linear layer of the decoder must be quantized)"
            )
        scheme = str(config.get("activation_scheme", "dynamic"))
        if scheme not in ACTIVATION_SCHEMES:
            raise ValueError(
                f"quantization 'fp8': activation_scheme {scheme!r} is not one of "
                f"{ACTIVATION_SCHEMES}"
            )
        if scheme == "static":
            log.warning(
                "fp8 checkpoint with static activation scales: input_scale is read but not "
                "applied (the fp8 layout computes with float activations)"
            )
        return cls(prequantized=True, static_activations=scheme == "static")

    def layout(self) -> QuantLayout:
        return QuantLayout(FP8)

    def create_weights(
        self, layer: torch.nn.Module, in_features: int, out_features: int, dtype: torch.dtype
    ) -> None:
        if not self.prequantized:
            layer.weight = parameter(out_features, in_features, dtype=dtype)
            return
        layer.weight = parameter(out_features, in_features, dtype=torch.float8_e4m3fn)
        layer.weight_scale = parameter(out_features, dtype=torch.float32)  # one per row
        if self.static_activations:
            layer.input_scale = parameter(out_features, dtype=torch.float32)

    def checkpoint_tensor(self, name: str, tensor: torch.Tensor) -> torch.Tensor:
        if name in ("weight_scale", "input_scale") and tensor.dim() == 2 and tensor.shape[1] == 1:
            return tensor.reshape(-1)  # per channel written as (N, 1)
        return tensor

    def canonical_tensors(self, layer: torch.nn.Module) -> dict[str, torch.Tensor]:
        if not self.prequantized:
            qweight, scale = quantize_fp8(layer.weight.data, per_channel=True)
            return {"qweight": qweight, "scale": scale}
        return {"qweight": layer.weight.data, "scale": layer.weight_scale.data}
