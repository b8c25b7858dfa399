"""Quantized checkpoints load sharded: the proportional slicing of ``ironlm.layers.linear``
keeps int8 (per-channel) and int4 (grouped, two values per byte) layouts correct at tp=2 --
the ranks' column shards side by side, and their row-parallel partial products summed, equal
the unsharded layer. The methods are defined here over the canonical reference layouts."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from ironlm.interfaces.model import ModelContext
from ironlm.interfaces.platform import LayerOps
from ironlm.interfaces.quant import INT4, INT8, QuantLayout, pack_int4, reference_linear
from ironlm.interfaces.quantization import QuantizationMethod
from ironlm.layers.linear import (
    ColumnParallelLinear,
    LinearBase,
    MergedColumnParallelLinear,
    RowParallelLinear,
)

GROUP = 32


class _Int8(QuantizationMethod):
    name = "test-int8"
    supported_platforms = ("*",)
    layout_ = QuantLayout(INT8)

    def layout(self) -> QuantLayout:
        return self.layout_

    def create_weights(self, layer: torch.nn.Module, in_features: int, out_features: int,
                       dtype: torch.dtype) -> None:
        layer.qweight = torch.nn.Parameter(torch.empty(out_features, in_features,
                                                       dtype=torch.int8), requires_grad=False)
        layer.scale = torch.nn.Parameter(torch.empty(out_features), requires_grad=False)

    def apply(self, layer: torch.nn.Module, x: torch.Tensor,
              bias: torch.Tensor | None) -> torch.Tensor:
        tensors = {"qweight": layer.qweight, "scale": layer.scale}
        return reference_linear(self.layout_, x, tensors, bias)

    @classmethod
    def quantize(cls, weight: torch.Tensor) -> dict[str, torch.Tensor]:
        scale = weight.abs().amax(dim=1) / 127
        q = torch.round(weight / scale.unsqueeze(1)).clamp(-127, 127).to(torch.int8)
        return {"qweight": q, "scale": scale}


class _Int4(QuantizationMethod):
    name = "test-int4"
    supported_platforms = ("*",)
    layout_ = QuantLayout(INT4, group_size=GROUP)

    def layout(self) -> QuantLayout:
        return self.layout_

    def create_weights(self, layer: torch.nn.Module, in_features: int, out_features: int,
                       dtype: torch.dtype) -> None:
        if in_features % GROUP:
            raise ValueError(f"{in_features} input features per rank is not a whole number "
                             f"of groups of {GROUP}")
        layer.qweight = torch.nn.Parameter(torch.empty(out_features, in_features // 2,
                                                       dtype=torch.uint8), requires_grad=False)
        layer.scale = torch.nn.Parameter(torch.empty(out_features, in_features // GROUP),
                                         requires_grad=False)

    def apply(self, layer: torch.nn.Module, x: torch.Tensor,
              bias: torch.Tensor | None) -> torch.Tensor:
        tensors = {"qweight": layer.qweight, "scale": layer.scale}
        return reference_linear(self.layout_, x, tensors, bias)

    @classmethod
    def quantize(cls, weight: torch.Tensor) -> dict[str, torch.Tensor]:
        n, k = weight.shape
        groups = weight.reshape(n, k // GROUP, GROUP)
        scale = groups.abs().amax(dim=-1) / 7  # (N, K / G)
        q = torch.round(groups / scale.unsqueeze(-1)).clamp(-8, 7) + 8
        return {"qweight": pack_int4(q.reshape(n, k)), "scale": scale}


def _ctx(method: QuantizationMethod, tp_rank: int, tp_size: int) -> ModelContext:
    return ModelContext(
        attention=None,  # type: ignore[arg-type]
        layer_ops=LayerOps(), quantization=method, dtype=torch.float32,
        device=torch.device("cpu"), tp_rank=tp_rank, tp_size=tp_size,
    )


def _load(layer: LinearBase, tensors: dict[str, torch.Tensor], shard: Any = None) -> LinearBase:
    for name, tensor in tensors.items():
        layer.load_weight(name, tensor, shard)
    return layer


@pytest.mark.parametrize("method", [_Int8(), _Int4()], ids=["int8", "int4-g32"])
def test_quantized_shards_compose_at_tp2(method: QuantizationMethod) -> None:
    torch.manual_seed(0)
    k, n = 128, 96
    x = torch.randn(5, k)
    tensors = type(method).quantize(torch.randn(n, k))
    one = _load(ColumnParallelLinear(k, n, _ctx(method, 0, 1)), tensors)
    want = one(x)
    # column parallel: each rank's output features, side by side
    cols = [_load(ColumnParallelLinear(k, n, _ctx(method, r, 2)), tensors)(x) for r in (0, 1)]
    torch.testing.assert_close(torch.cat(cols, dim=-1), want)
    # row parallel: each rank's input features; the partial products sum to the whole
    rows = [_load(RowParallelLinear(k, n, _ctx(method, r, 2)), tensors) for r in (0, 1)]
    parts = [layer.quant_method.apply(layer, xs, None) for layer, xs in zip(rows, x.chunk(2, -1))]
    torch.testing.assert_close(parts[0] + parts[1], _load(RowParallelLinear(k, n, _ctx(
        method, 0, 1)), tensors)(x), rtol=1e-5, atol=1e-5)
    # merged (gate_up): each rank holds its slice of both parts
    up = type(method).quantize(torch.randn(n, k))
    merged_one = MergedColumnParallelLinear(k, [n, n], _ctx(method, 0, 1))
    _load(_load(merged_one, tensors, 0), up, 1)
    whole = merged_one(x)  # (T, 2n): [gate | up]
    for r in (0, 1):
        merged = MergedColumnParallelLinear(k, [n, n], _ctx(method, r, 2))
        out = _load(_load(merged, tensors, 0), up, 1)(x)
        half = n // 2
        torch.testing.assert_close(out[:, :half], whole[:, r * half:(r + 1) * half])
        torch.testing.assert_close(out[:, half:], whole[:, n + r * half:n + (r + 1) * half])


def test_int4_shard_must_hold_whole_groups() -> None:
    with pytest.raises(ValueError, match="whole number of groups"):
        RowParallelLinear(96, 64, _ctx(_Int4(), 0, 2))  # 48 input features per rank
