"""What every layout-based method shares: its checkpoint tensors become one canonical layout
(``ironlm.interfaces.quant``) that the platform's layer ops pack once and run every forward."""

from __future__ import annotations

from typing import Any

import torch

from ironlm.interfaces.quant import QuantLayout
from ironlm.interfaces.quantization import QuantizationMethod


class LayoutMethod(QuantizationMethod):
    """Subclasses define ``layout()``, ``create_weights`` and ``canonical_tensors(layer)``."""

    def canonical_tensors(self, layer: torch.nn.Module) -> dict[str, torch.Tensor]:
        """The layout's tensors from the layer's loaded parameters."""
        raise NotImplementedError

    def process_weights_after_loading(self, layer: torch.nn.Module) -> None:
        tensors = self.canonical_tensors(layer)
        for name in [n for n in layer._parameters if n != "bias"]:
            delattr(layer, name)  # the checkpoint's tensors: the packed ones replace them
        layout = self.layout()
        assert layout is not None
        layer.quant_packed = layer.layer_ops.pack_quantized(layout, tensors)

    def apply(
        self, layer: torch.nn.Module, x: torch.Tensor, bias: torch.Tensor | None
    ) -> torch.Tensor:
        layout = self.layout()
        assert layout is not None
        return layer.layer_ops.quantized_linear(layout, x, layer.quant_packed, bias)


def parameter(*shape: int, dtype: torch.dtype) -> torch.nn.Parameter:
    """An uninitialised, frozen parameter (filled by the checkpoint)."""
    return torch.nn.Parameter(torch.empty(*shape, dtype=dtype), requires_grad=False)


def checked_config(
    cls: type[QuantizationMethod], quant_config: dict[str, Any]
) -> dict[str, Any]:
    """``quant_config`` after checking that it is ``cls``'s format."""
    quant_method = str(quant_config.get("quant_method", ""))
    if not cls.reads_checkpoint(quant_method):
        raise ValueError(
            f"quantization {cls.name!r} cannot read a checkpoint quantized with "
            f"quant_method={quant_method!r}"
        )
    return quant_config


def config_int(quant_config: dict[str, Any], *keys: str, default: int | None = None) -> int:
    """The first of ``keys`` present in ``quant_config`` as an int (formats name the same
    field differently: AutoAWQ's ``w_bit`` is transformers' ``bits``)."""
    for key in keys:
        if quant_config.get(key) is not None:
            return int(quant_config[key])
    if default is None:
        raise ValueError(f"quantization_config lacks {' / '.join(keys)}")
    return default


def layout_of(method: QuantizationMethod) -> QuantLayout:
    layout = method.layout()
    assert layout is not None
    return layout
