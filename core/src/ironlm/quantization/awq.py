"""``awq``: checkpoints in AutoAWQ's GEMM format (``ironlm.quantization.packing``), served
through the int4 layout with zero points. Selected by the checkpoint's quantization_config
({"quant_method": "awq", "bits"/"w_bit": 4, "group_size"/"q_group_size": G,
"zero_point": true, "version": "gemm"}); the algorithm itself (activation-aware scale search)
lives in the offline tool, ``ironlm quantize --quant-type awq``.
"""

from __future__ import annotations

from typing import Any, ClassVar

import torch

from ironlm.quantization.base import checked_config, config_int, parameter
from ironlm.quantization.int4 import Int4Method
from ironlm.quantization.packing import awq_unpack
from ironlm.interfaces.quant import pack_int4


class AWQMethod(Int4Method):
    name: ClassVar[str] = "awq"

    @classmethod
    def from_config(cls, quant_config: dict[str, Any] | None) -> AWQMethod:
        if quant_config is None:
            raise ValueError(
                "quantization 'awq' reads AWQ checkpoints (quantization_config quant_method "
                "'awq'); this model is not one. Make one with `ironlm quantize --quant-type awq`"
            )
        config = checked_config(cls, quant_config)
        bits = config_int(config, "bits", "w_bit")
        if bits != 4:
            raise ValueError(f"quantization 'awq': only 4-bit checkpoints are supported, got {bits}")
        version = str(config.get("version", "gemm")).lower()
        if version != "gemm":
            raise ValueError(
                f"quantization 'awq': AutoAWQ version {version!r} is not supported (only the "
                "GEMM packing, version 'gemm')"
            )
        if not config.get("zero_point", True):
            raise ValueError("quantization 'awq': checkpoints without zero points are not supported")
        if config.get("modules_to_not_convert"):
            raise ValueError(
                "quantization 'awq': modules_to_not_convert "
                f"{config['modules_to_not_convert']} is not supported (every linear layer of "
                "the decoder must be quantized)"
            )
        return cls(config_int(config, "group_size", "q_group_size"), zero_points=True)

    def create_weights(
        self, layer: torch.nn.Module, in_features: int, out_features: int, dtype: torch.dtype
    ) -> None:
        self.check_layer(in_features)
        groups = in_features // self.group_size
        layer.qweight = parameter(out_features, in_features // 2, dtype=torch.uint8)
        layer.qzeros = parameter(out_features, groups, dtype=torch.uint8)
        layer.scales = parameter(out_features, groups, dtype=torch.float32)

    def checkpoint_tensor(self, name: str, tensor: torch.Tensor) -> torch.Tensor:
        # AutoAWQ stores (in, out) with eight output columns per int32; the layer wants
        # (out, in): canonical nibble pairs for qweight, one code per byte for qzeros
        if name == "qweight":
            return pack_int4(awq_unpack(_int32(name, tensor)).t())  # (N, K / 2)
        if name == "qzeros":
            return awq_unpack(_int32(name, tensor)).t().contiguous()  # (N, K / G)
        if name == "scales":
            return tensor.t().float().contiguous()  # (N, K / G)
        return tensor

    def canonical_tensors(self, layer: torch.nn.Module) -> dict[str, torch.Tensor]:
        return {"qweight": layer.qweight.data, "scale": layer.scales.data, "zero": layer.qzeros.data}


def _int32(name: str, tensor: torch.Tensor) -> torch.Tensor:
    if tensor.dtype != torch.int32 or tensor.dim() != 2:
        raise ValueError(
            f"AWQ tensor {name!r} must be a 2-D int32 tensor, got {tensor.dtype} "
            f"{tuple(tensor.shape)} (corrupt or not an AutoAWQ GEMM checkpoint)"
        )
    return tensor
