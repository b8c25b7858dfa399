"""Group-wise 4-bit weights (the int4 layout): ``weight_only_int4``, and the base of the
``awq`` and ``gptq`` checkpoint readers, which convert their formats into the same layout.

``weight_only_int4`` checkpoint (written by ``ironlm quantize --quant-type weight_only_int4``;
``quantization_config`` {"quant_method": "weight_only_int4", "bits": 4, "group_size": G,
"zero_point": bool}): per linear the layout's canonical tensors, ``qweight`` (N, K / 2) uint8
(two codes per byte, even k in the low nibble), ``scale`` (N, K / G) float32 and, with zero
points, ``zero`` (N, K / G) uint8. Selected by name on a float checkpoint the weights are rounded
to nearest at load: group 64, symmetric (64 divides the hidden sizes of most models; 128 does
not divide e.g. SmolLM2's 576).
"""

from __future__ import annotations

from typing import Any, ClassVar

import torch

from ironlm.interfaces.quant import INT4, QuantLayout
from ironlm.quantization.base import LayoutMethod, checked_config, config_int, parameter
from ironlm.quantization.rtn import check_group_size, quantize_int4

GROUP_SIZES = (32, 64, 128)
DEFAULT_ONLINE_GROUP = 64


class Int4Method(LayoutMethod):
    """An int4 layout of one group size, symmetric or with zero points."""

    supported_platforms: ClassVar[tuple[str, ...]] = ("*",)

    def __init__(self, group_size: int, zero_points: bool) -> None:
        if group_size <= 0:
            raise ValueError(
                f"quantization {self.name!r}: group_size {group_size} (per-channel, one group "
                f"per row) is not supported; the int4 layout takes groups of {GROUP_SIZES}"
            )
        self.group_size = group_size
        self.zero_points = zero_points

    def layout(self) -> QuantLayout:
        return QuantLayout(INT4, group_size=self.group_size, zero_points=self.zero_points)

    def check_layer(self, in_features: int) -> None:
        check_group_size(in_features, self.group_size, f"quantization {self.name!r}")


class WeightOnlyInt4Method(Int4Method):
    name: ClassVar[str] = "weight_only_int4"

    def __init__(self, group_size: int, zero_points: bool, prequantized: bool) -> None:
        super().__init__(group_size, zero_points)
        self.prequantized = prequantized

    @classmethod
    def from_config(cls, quant_config: dict[str, Any] | None) -> WeightOnlyInt4Method:
        if quant_config is None:
            return cls(DEFAULT_ONLINE_GROUP, zero_points=False, prequantized=False)
        config = checked_config(cls, quant_config)
        if config_int(config, "bits", default=4) != 4:
            raise ValueError(f"quantization {cls.name!r} stores 4-bit weights")
        group = config_int(config, "group_size")
        return cls(group, bool(config.get("zero_point", False)), prequantized=True)

    def create_weights(
        self, layer: torch.nn.Module, in_features: int, out_features: int, dtype: torch.dtype
    ) -> None:
        self.check_layer(in_features)
        if not self.prequantized:
            layer.weight = parameter(out_features, in_features, dtype=dtype)
            return
        groups = in_features // self.group_size
        layer.qweight = parameter(out_features, in_features // 2, dtype=torch.uint8)
        layer.scale = parameter(out_features, groups, dtype=torch.float32)
        if self.zero_points:
            layer.zero = parameter(out_features, groups, dtype=torch.uint8)

    def canonical_tensors(self, layer: torch.nn.Module) -> dict[str, torch.Tensor]:
        if not self.prequantized:
            return quantize_int4(layer.weight.data, self.group_size, self.zero_points)
        tensors = {"qweight": layer.qweight.data, "scale": layer.scale.data}
        if self.zero_points:
            tensors["zero"] = layer.zero.data
        return tensors
