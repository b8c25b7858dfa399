"""RMSNorm through the platform's LayerOps, with the pre-norm residual add fused in."""

from __future__ import annotations

import torch

from ironlm.interfaces.model import ModelContext


class RMSNorm(torch.nn.Module):
    """y = x / rms(x) * scale, over the last dim.

    ``weight_offset`` is added to the checkpoint weight when it is loaded, so the parameter always
    holds the effective scale: 0 for Llama-style norms, 1 for Gemma's ``(1 + w)`` norms (the
    addition happens once at load time, not per step). The running residual stream of a pre-norm
    transformer is passed through ``residual``: ``forward(x, residual)`` normalises
    ``x + residual`` and returns ``(normed, x + residual)``.
    """

    def __init__(
        self, hidden_size: int, eps: float, ctx: ModelContext, weight_offset: float = 0.0
    ) -> None:
        super().__init__()
        self.hidden_size = hidden_size
        self.eps = eps
        self.weight_offset = weight_offset
        self.layer_ops = ctx.layer_ops
        self.weight = torch.nn.Parameter(
            torch.ones(hidden_size, dtype=ctx.dtype), requires_grad=False
        )

    def forward(
        self, x: torch.Tensor, residual: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        # x: (num_tokens, hidden_size), or (num_tokens * num_heads, head_dim) for q/k norms
        return self.layer_ops.rms_norm(x, self.weight, self.eps, residual)

    def norm(self, x: torch.Tensor) -> torch.Tensor:
        """Normalise without a residual stream."""
        return self.layer_ops.rms_norm(x, self.weight, self.eps, None)[0]

    def load_weight(
        self, name: str, loaded: torch.Tensor, shard_id: str | int | None = None
    ) -> None:
        if name != "weight" or shard_id is not None:
            raise ValueError(f"RMSNorm has only 'weight'; got {name!r} (shard {shard_id!r})")
        if loaded.shape != self.weight.shape:
            raise ValueError(
                f"RMSNorm weight: checkpoint shape {tuple(loaded.shape)} does not fit "
                f"parameter shape {tuple(self.weight.shape)}"
            )
        with torch.no_grad():
            # the offset is added in float32, as the reference implementations compute (1 + w)
            self.weight.copy_(loaded.float() + self.weight_offset)

    def extra_repr(self) -> str:
        return f"{self.hidden_size}, eps={self.eps}, weight_offset={self.weight_offset}"
