"""``gptq``: checkpoints in the GPTQ format AutoGPTQ and GPTQModel write
(``ironlm.quantization.packing``), served through the int4 layout: symmetric checkpoints
(``sym``: every zero is 8) without zero points, the others with them. Selected by the
checkpoint's quantization_config ({"quant_method": "gptq", "bits": 4, "group_size": G,
"desc_act": bool, "sym": bool, "checkpoint_format": "gptq" | "gptq_v2"}); the algorithm
(Hessian-based error compensation) lives in the offline tool, ``ironlm quantize --quant-type
gptq``.

Act-order (``desc_act``) checkpoints number the groups in quantization order, so the input
rows of one group are scattered (``g_idx``). Sorting the input features by group makes every
group contiguous (exact: each group keeps its own rows); the forward then gathers the
activations' columns in that order, ``x[:, perm]``.
"""

from __future__ import annotations

from typing import Any, ClassVar

import torch

from ironlm.interfaces.quant import pack_int4, unpack_int4
from ironlm.quantization.base import checked_config, config_int, parameter
from ironlm.quantization.int4 import Int4Method
from ironlm.quantization.packing import gptq_unpack_cols, gptq_unpack_rows

CHECKPOINT_FORMATS = ("gptq", "gptq_v2")


class GPTQMethod(Int4Method):
    name: ClassVar[str] = "gptq"

    def __init__(self, group_size: int, sym: bool, zeros_minus_one: bool) -> None:
        super().__init__(group_size, zero_points=not sym)
        self.zeros_minus_one = zeros_minus_one  # format "gptq" stores zero - 1

    @classmethod
    def from_config(cls, quant_config: dict[str, Any] | None) -> GPTQMethod:
        if quant_config is None:
            raise ValueError(
                "quantization 'gptq' reads GPTQ checkpoints (quantization_config quant_method "
                "'gptq'); this model is not one. Make one with `ironlm quantize --quant-type gptq`"
            )
        config = checked_config(cls, quant_config)
        bits = config_int(config, "bits")
        if bits != 4:
            raise ValueError(f"quantization 'gptq': only 4-bit checkpoints are supported, got {bits}")
        fmt = str(config.get("checkpoint_format") or config.get("format") or "gptq")
        if fmt not in CHECKPOINT_FORMATS:
            raise ValueError(
                f"quantization 'gptq': checkpoint_format {fmt!r} is not supported "
                f"(supported: {', '.join(CHECKPOINT_FORMATS)})"
            )
        if config.get("lm_head"):
            raise ValueError("quantization 'gptq': a quantized lm_head is not supported")
        return cls(
            config_int(config, "group_size"),
            sym=bool(config.get("sym", True)),
            zeros_minus_one=fmt == "gptq",
        )

    def create_weights(
        self, layer: torch.nn.Module, in_features: int, out_features: int, dtype: torch.dtype
    ) -> None:
        self.check_layer(in_features)
        groups = in_features // self.group_size
        layer.qweight = parameter(out_features, in_features // 2, dtype=torch.uint8)
        layer.qzeros = parameter(out_features, groups, dtype=torch.uint8)
        layer.scales = parameter(out_features, groups, dtype=torch.float32)
        layer.g_idx = parameter(1, in_features, dtype=torch.int32)

    def checkpoint_tensor(self, name: str, tensor: torch.Tensor) -> torch.Tensor:
        # GPTQ stores (in, out); the layer wants (out, in)
        if name == "qweight":
            return pack_int4(gptq_unpack_rows(_int32(name, tensor)).t())  # (N, K / 2)
        if name == "qzeros":
            zeros = gptq_unpack_cols(_int32(name, tensor))  # (K / G, N)
            if self.zeros_minus_one:  # a stored 15 is -1 in 4 bits: zero point 0
                zeros = (zeros + 1) & 0xF
            return zeros.t().contiguous()  # (N, K / G)
        if name == "scales":
            return tensor.t().float().contiguous()  # (N, K / G)
        if name == "g_idx":
            return tensor.reshape(1, -1).to(torch.int32)  # one row: never split by output
        return tensor

    def canonical_tensors(self, layer: torch.nn.Module) -> dict[str, torch.Tensor]:
        qweight, zeros = layer.qweight.data, layer.qzeros.data
        perm = self._group_order(layer.g_idx.data.reshape(-1))
        if perm is not None:
            qweight = pack_int4(unpack_int4(qweight)[:, perm])  # input features by group
            perm = perm.to(qweight.device)
        layer.register_buffer("input_perm", perm, persistent=False)
        tensors = {"qweight": qweight, "scale": layer.scales.data}
        if self.zero_points:
            tensors["zero"] = zeros
        elif bool((zeros != 8).any()):
            raise ValueError(
                "quantization 'gptq': the checkpoint says sym=true but a layer has zero points "
                "other than 8 (corrupt checkpoint, or set sym=false)"
            )
        return tensors

    def _group_order(self, g_idx: torch.Tensor) -> torch.Tensor | None:
        """The permutation of input features that makes groups contiguous; None when they
        already are. ValueError when groups are not whole (the layout needs G rows each)."""
        local = g_idx.long() - g_idx.min()  # a row-parallel shard holds groups from its first
        k = local.numel()
        want = torch.arange(k, device=local.device) // self.group_size
        if torch.equal(local, want):
            return None
        perm = torch.sort(local, stable=True).indices
        if not torch.equal(local[perm], want):
            raise ValueError(
                f"quantization 'gptq': g_idx does not form groups of {self.group_size} input "
                "features (wrong group_size in quantization_config, or a corrupt g_idx)"
            )
        return perm

    def apply(
        self, layer: torch.nn.Module, x: torch.Tensor, bias: torch.Tensor | None
    ) -> torch.Tensor:
        if layer.input_perm is not None:
            x = x.index_select(1, layer.input_perm)  # (T, K) columns in group order
        return super().apply(layer, x, bias)


def _int32(name: str, tensor: torch.Tensor) -> torch.Tensor:
    if tensor.dtype != torch.int32 or tensor.dim() != 2:
        raise ValueError(
            f"GPTQ tensor {name!r} must be a 2-D int32 tensor, got {tensor.dtype} "
            f"{tuple(tensor.shape)} (corrupt or not a GPTQ checkpoint)"
        )
    return tensor
