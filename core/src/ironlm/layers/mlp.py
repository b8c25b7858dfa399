"""Gated MLP (SwiGLU / GeGLU): down(act(gate(x)) * up(x)) with gate and up in one matmul."""

from __future__ import annotations

import torch

from ironlm.interfaces.model import ModelContext
from ironlm.layers.linear import MergedColumnParallelLinear, RowParallelLinear

ACTIVATIONS = ("silu", "gelu_pytorch_tanh", "gelu_tanh")


class GatedMLP(torch.nn.Module):
    """Checkpoint names: ``gate_proj`` / ``up_proj`` (into ``gate_up_proj`` parts 0 / 1),
    ``down_proj``."""

    def __init__(
        self,
        hidden_size: int,
        intermediate_size: int,
        activation: str,
        ctx: ModelContext,
        bias: bool = False,
    ) -> None:
        super().__init__()
        if activation not in ACTIVATIONS:
            raise ValueError(
                f"activation {activation!r} is not supported; supported: {ACTIVATIONS}"
            )
        self.gate_up_proj = MergedColumnParallelLinear(
            hidden_size, [intermediate_size, intermediate_size], ctx, bias=bias
        )
        self.down_proj = RowParallelLinear(intermediate_size, hidden_size, ctx, bias=bias)
        self.layer_ops = ctx.layer_ops
        self.use_gelu = activation != "silu"

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate_up = self.gate_up_proj(x)  # (num_tokens, 2 * intermediate / tp)
        if self.use_gelu:
            h = self.layer_ops.gelu_tanh_and_mul(gate_up)
        else:
            h = self.layer_ops.silu_and_mul(gate_up)  # (num_tokens, intermediate / tp)
        return self.down_proj(h)

    def weight_targets(self) -> dict[str, tuple[str, str | int | None]]:
        """Checkpoint sub-module name -> (this module's child, shard id)."""
        return {"gate_proj": ("gate_up_proj", 0), "up_proj": ("gate_up_proj", 1)}
