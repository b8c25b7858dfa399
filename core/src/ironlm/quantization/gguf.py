"""``gguf``: a GGUF file's quantized tensors kept as they are in the file (the gguf layout: row
n of a weight holds the GGML blocks of output row n).

Selected automatically for a .gguf model (its quantization_config is ``{"quant_method":
"gguf", "ggml_types": [...]}``, see ``ModelSource``). Q4_0, Q4_1, Q8_0, Q4_K and Q6_K tensors
stay quantized (``KEPT_TYPES``); the loader dequantizes tensors of other types (logged) and
they run as float weights. The token embedding and a tied LM head stay quantized too
(``ironlm.layers.vocab_embedding``).

The loader hands each kept tensor over as ``<module>.qweight_type`` (0-dim, the
GGMLQuantizationType) followed by ``<module>.weight`` (uint8 (rows, row bytes)). One GGUF file
may store the parts of a merged layer in different types (q and k in Q4_K, v in Q6_K), so each
part is kept on its own (``load_part``); after loading, consecutive parts of the same type are
stacked into one segment, and the forward runs one matmul per segment.
"""

from __future__ import annotations

from typing import Any, ClassVar

import torch
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

from ironlm.interfaces.quant import GGUF, QuantLayout
from ironlm.interfaces.quantization import QuantizationMethod
from ironlm.quantization.base import checked_config

KEPT_TYPES = tuple(
    int(GGMLQuantizationType[name]) for name in ("Q4_0", "Q4_1", "Q8_0", "Q4_K", "Q6_K")
)

# one run of consecutive parts: (layout, packed tensors) or (None, {"weight": packed float})
Segment = tuple[QuantLayout | None, dict[str, torch.Tensor]]


class GGUFMethod(QuantizationMethod):
    name: ClassVar[str] = "gguf"
    supported_platforms: ClassVar[tuple[str, ...]] = ("*",)

    def __init__(self, kept_types: tuple[int, ...]) -> None:
        self.kept_types = kept_types  # the file's types that stay quantized

    @classmethod
    def from_config(cls, quant_config: dict[str, Any] | None) -> GGUFMethod:
        if quant_config is None:
            raise ValueError(
                "quantization 'gguf' serves .gguf files (a GGUF model needs no flag); this "
                "model is not one"
            )
        names = checked_config(cls, quant_config).get("ggml_types", [])
        present = {int(GGMLQuantizationType[name]) for name in names}
        return cls(tuple(t for t in KEPT_TYPES if t in present))

    def layouts(self) -> tuple[QuantLayout, ...]:
        return tuple(QuantLayout(GGUF, ggml_type=t) for t in self.kept_types)

    def create_weights(
        self, layer: torch.nn.Module, in_features: int, out_features: int, dtype: torch.dtype
    ) -> None:
        layer.gguf_types = {}  # shard id -> GGML type announced for its next ``weight``
        layer.gguf_parts = {}  # shard id -> (GGML type or None for float, tensor)

    def load_part(
        self, layer: torch.nn.Module, name: str, share: torch.Tensor, shard_id: str | int | None
    ) -> bool:
        if name == "qweight_type":
            layer.gguf_types[shard_id] = int(share.reshape(()).item())
            return True
        if name != "weight":
            return False  # the bias: the layer's own parameter
        if share.dtype == torch.uint8:
            ggml_type = layer.gguf_types.pop(shard_id, None)
            if ggml_type is None:
                raise ValueError("GGUF block rows arrived without their qweight_type")
            layer.gguf_parts[shard_id] = (ggml_type, share.to(layer.device).contiguous())
        else:
            layer.gguf_parts[shard_id] = (None, share.to(layer.device, layer.dtype))
        return True

    def process_weights_after_loading(self, layer: torch.nn.Module) -> None:
        parts = layer.gguf_parts
        missing = [str(s) for s in layer.shard_ids if s not in parts]
        if missing:
            raise ValueError(
                f"GGUF file lacks the weight of {type(layer).__name__} part(s) "
                f"{', '.join(missing)}"
            )
        runs: list[tuple[int | None, list[torch.Tensor]]] = []
        for shard_id in layer.shard_ids:
            ggml_type, tensor = parts[shard_id]
            if ggml_type is not None:
                _check_rows(tensor, ggml_type, layer.input_size)
            if runs and runs[-1][0] == ggml_type:
                runs[-1][1].append(tensor)
            else:
                runs.append((ggml_type, [tensor]))
        segments: list[Segment] = []
        for ggml_type, tensors in runs:
            stacked = tensors[0] if len(tensors) == 1 else torch.cat(tensors, dim=0)
            if ggml_type is None:
                segments.append((None, {"weight": layer.layer_ops.pack_linear_weight(stacked)}))
            else:
                layout = QuantLayout(GGUF, ggml_type=ggml_type)
                packed = layer.layer_ops.pack_quantized(layout, {"qweight": stacked})
                segments.append((layout, packed))
        layer.gguf_segments = segments
        del layer.gguf_parts, layer.gguf_types

    def apply(
        self, layer: torch.nn.Module, x: torch.Tensor, bias: torch.Tensor | None
    ) -> torch.Tensor:
        segments: list[Segment] = layer.gguf_segments
        if len(segments) == 1:
            return _run(layer, segments[0], x, bias)
        out = torch.cat([_run(layer, segment, x, None) for segment in segments], dim=-1)
        return out if bias is None else out + bias


def _run(
    layer: torch.nn.Module, segment: Segment, x: torch.Tensor, bias: torch.Tensor | None
) -> torch.Tensor:
    layout, tensors = segment
    if layout is None:
        return layer.layer_ops.linear(x, tensors["weight"], bias)
    return layer.layer_ops.quantized_linear(layout, x, tensors, bias)


def _check_rows(rows: torch.Tensor, ggml_type: int, in_features: int) -> None:
    """Rows of GGML blocks must cover exactly ``in_features`` (a tensor-parallel shard must
    hold whole blocks)."""
    block_elems, block_bytes = GGML_QUANT_SIZES[GGMLQuantizationType(ggml_type)]
    row_bytes = rows.shape[-1]
    if rows.dim() != 2 or row_bytes % block_bytes or row_bytes // block_bytes * block_elems != (
        in_features
    ):
        raise ValueError(
            f"GGUF {GGMLQuantizationType(ggml_type).name} rows of {row_bytes} bytes do not "
            f"hold {in_features} input features in whole {block_elems}-element blocks"
        )
