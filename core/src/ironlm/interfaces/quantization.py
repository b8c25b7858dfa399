"""QuantizationMethod: how a linear layer stores, loads and applies its weight."""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any, ClassVar

import torch

from ironlm.interfaces.quant import QuantLayout


class QuantizationMethod(ABC):
    """Registered through ``register_quantization_methods``. Created with ``from_config`` from
    the checkpoint's HF ``quantization_config`` (or None when selected by name only); one instance
    serves every linear layer of the model."""

    name: ClassVar[str]
    supported_platforms: ClassVar[tuple[str, ...]]
    # other HF ``quantization_config["quant_method"]`` values whose checkpoints this method
    # reads (``name`` itself always counts); a checkpoint is served without a flag by the
    # method it names
    config_names: ClassVar[tuple[str, ...]] = ()

    @classmethod
    def from_config(cls, quant_config: dict[str, Any] | None) -> QuantizationMethod:
        return cls()

    def layout(self) -> QuantLayout | None:
        """The canonical layout this method's weights take (``ironlm.interfaces.quant``), which
        the platform's layer ops must support (checked at start-up); None: the method runs its
        own kernels (e.g. a vendor library) and ``supported_platforms`` alone decides."""
        return None

    def layouts(self) -> tuple[QuantLayout, ...]:
        """Every canonical layout this method's weights may take (all are checked at start-up).
        Default: ``layout()``. A method whose layers differ (GGUF files mix block types per
        tensor) lists them all."""
        layout = self.layout()
        return () if layout is None else (layout,)

    @classmethod
    def reads_checkpoint(cls, quant_method: str) -> bool:
        """Whether a checkpoint whose quantization_config names ``quant_method`` is this
        method's format."""
        return quant_method == cls.name or quant_method in cls.config_names

    @abstractmethod
    def create_weights(
        self, layer: torch.nn.Module, in_features: int, out_features: int, dtype: torch.dtype
    ) -> None:
        """Register the layer's parameters / buffers (names as in the checkpoint, e.g.
        ``weight``, ``weight_scale``). Shapes are those of this rank's shard."""

    def checkpoint_tensor(self, name: str, tensor: torch.Tensor) -> torch.Tensor:
        """A checkpoint tensor (full, unsharded) in the layer's convention, before the layer
        slices this rank's share: output features along dim 0, input features along the last
        dim (``ironlm.layers.linear``). Formats stored the other way round (AutoAWQ's and
        GPTQ's int32-packed tensors) unpack or transpose here. Default: as stored."""
        return tensor

    def load_part(
        self, layer: torch.nn.Module, name: str, share: torch.Tensor, shard_id: str | int | None
    ) -> bool:
        """Take this rank's share of one checkpoint tensor of part ``shard_id`` of a (merged)
        layer and keep it the method's own way; True when taken. For formats whose merged parts
        cannot share one parameter (a GGUF file may store q, k and v in different block types).
        Default False: the layer copies it into the parameter ``name`` registered by
        ``create_weights``."""
        return False

    def process_weights_after_loading(self, layer: torch.nn.Module) -> None:
        """Repack loaded weights for the kernels (transpose, pre-scale, ...). Default: nothing."""

    def unpack_weights(self, layer: torch.nn.Module) -> Any:
        """Weight updates after loading (``model.load_weights`` again, as RL weight sync
        does): give ``layer`` back the parameters ``create_weights`` registered, holding the
        loaded values, so checkpoint tensors can be copied in again; returns what
        ``repack_weights`` needs to process them into the kernels' tensors in place.
        Default: ValueError (a method whose packing cannot be undone takes no updates)."""
        raise ValueError(
            f"quantization method {self.name!r} cannot take new weights after loading; "
            "weight updates need an unquantized model"
        )

    def repack_weights(self, layer: torch.nn.Module, kept: Any) -> None:
        """Process the parameters again after ``unpack_weights`` returned ``kept``, into the
        same tensors the forward reads (their storage stays: captured graphs stay valid)."""
        raise ValueError(f"quantization method {self.name!r} cannot take new weights")

    @abstractmethod
    def apply(
        self, layer: torch.nn.Module, x: torch.Tensor, bias: torch.Tensor | None
    ) -> torch.Tensor:
        """(num_tokens, in_features) -> (num_tokens, out_features)."""

    @classmethod
    def quantize(cls, weight: torch.Tensor) -> dict[str, torch.Tensor]:
        """Offline: quantize one float weight (out, in) into the tensors ``create_weights``
        declares. Methods without an offline path raise ValueError saying so."""
        raise ValueError(f"quantization method {cls.name!r} has no offline quantize()")


class UnquantizedMethod(QuantizationMethod):
    """Plain float weights: the core's default when no quantization is selected. The platform's
    layer ops (``layer.layer_ops``) choose the weight's layout and run the matmul."""

    name = "none"
    supported_platforms = ()

    def create_weights(
        self, layer: torch.nn.Module, in_features: int, out_features: int, dtype: torch.dtype
    ) -> None:
        layer.weight = torch.nn.Parameter(
            torch.empty(out_features, in_features, dtype=dtype), requires_grad=False
        )

    def process_weights_after_loading(self, layer: torch.nn.Module) -> None:
        packed = layer.layer_ops.pack_linear_weight(layer.weight.data)
        layer.weight = torch.nn.Parameter(packed, requires_grad=False)

    def unpack_weights(self, layer: torch.nn.Module) -> torch.nn.Parameter:
        stored = layer.weight
        rows = layer.layer_ops.unpack_linear_weight(stored.data)
        layer.weight = torch.nn.Parameter(rows, requires_grad=False)
        return stored

    def repack_weights(self, layer: torch.nn.Module, kept: torch.nn.Parameter) -> None:
        layer.layer_ops.repack_linear_weight(kept.data, layer.weight.data)
        layer.weight = kept

    def apply(
        self, layer: torch.nn.Module, x: torch.Tensor, bias: torch.Tensor | None
    ) -> torch.Tensor:
        return layer.layer_ops.linear(x, layer.weight, bias)
