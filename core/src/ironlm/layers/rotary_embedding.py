"""Rotary position embedding (neox style: the two halves of each head rotate together).

The cos/sin table is computed once, in float32, for every position up to
``max_position_embeddings`` and stored in the model dtype; a forward pass looks up the rows of
its positions once (``lookup``) and every attention layer sharing this rotary reuses them.
"""

from __future__ import annotations

import math
from typing import Any

import torch

from ironlm.interfaces.model import ModelContext

ROPE_TYPES = ("default", "linear", "llama3")


def rope_parameters(hf_config: Any, layer_type: str | None = None) -> dict[str, Any]:
    """The rope parameters of an HF config as transformers normalises them: a dict with
    ``rope_type``, ``rope_theta`` and the scaling fields. Configs with per-layer-type rope
    (Gemma 3: ``{"full_attention": {...}, "sliding_attention": {...}}``) are indexed by
    ``layer_type``."""
    params = getattr(hf_config, "rope_parameters", None)
    if not params:
        raise ValueError(f"{type(hf_config).__name__} has no rope_parameters")
    if layer_type is not None and layer_type in params:
        params = params[layer_type]
    elif "rope_theta" not in params:
        raise ValueError(
            f"rope_parameters are per layer type ({sorted(params)}); name the layer type"
        )
    return dict(params)


def inverse_frequencies(rotary_dim: int, params: dict[str, Any]) -> torch.Tensor:
    """(rotary_dim / 2,) float32 angular frequencies after the configured scaling."""
    base = float(params["rope_theta"])
    rope_type = params.get("rope_type", params.get("type", "default"))
    inv_freq = 1.0 / (
        base ** (torch.arange(0, rotary_dim, 2, dtype=torch.int64).float() / rotary_dim)
    )
    if rope_type == "default":
        return inv_freq
    if rope_type == "linear":
        # positions divided by the factor == frequencies divided by it
        return inv_freq / float(params["factor"])
    if rope_type == "llama3":
        return _llama3_inverse_frequencies(inv_freq, params)
    raise ValueError(f"rope_type {rope_type!r} is not supported; supported: {list(ROPE_TYPES)}")


def _llama3_inverse_frequencies(inv_freq: torch.Tensor, params: dict[str, Any]) -> torch.Tensor:
    """Llama 3.1: long wavelengths slowed by ``factor``, short ones kept, a smooth blend between."""
    factor = float(params["factor"])
    low_freq_factor = float(params["low_freq_factor"])
    high_freq_factor = float(params["high_freq_factor"])
    old_context = float(params["original_max_position_embeddings"])
    low_freq_wavelen = old_context / low_freq_factor
    high_freq_wavelen = old_context / high_freq_factor
    wavelen = 2 * math.pi / inv_freq
    scaled = torch.where(wavelen > low_freq_wavelen, inv_freq / factor, inv_freq)
    smooth = (old_context / wavelen - low_freq_factor) / (high_freq_factor - low_freq_factor)
    blended = (1 - smooth) * scaled / factor + smooth * scaled
    is_medium = (wavelen >= high_freq_wavelen) & (wavelen <= low_freq_wavelen)
    return torch.where(is_medium, blended, scaled)


class RotaryEmbedding(torch.nn.Module):
    """Neox-style rotary over the first ``rotary_dim`` dims of each head (all of them here)."""

    def __init__(
        self,
        head_dim: int,
        max_position: int,
        params: dict[str, Any],
        ctx: ModelContext,
    ) -> None:
        super().__init__()
        self.head_dim = head_dim
        self.max_position = max_position
        self.layer_ops = ctx.layer_ops
        inv_freq = inverse_frequencies(head_dim, params)  # (head_dim / 2,) float32
        positions = torch.arange(max_position, dtype=torch.float32)
        angles = positions[:, None] * inv_freq[None, :]  # (max_position, head_dim / 2) float32
        # Stored in the model dtype so the per-layer apply needs no cast (as the HF reference
        # computes cos/sin in float32, then casts to the activation dtype).
        self.register_buffer("cos_cache", angles.cos().to(ctx.dtype), persistent=False)
        self.register_buffer("sin_cache", angles.sin().to(ctx.dtype), persistent=False)

    def lookup(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(num_tokens,) int64 -> cos, sin: 2 x (num_tokens, head_dim / 2). Row lookups go
        through the platform's ``embedding`` op (one kernel each where the platform has one)."""
        ops = self.layer_ops
        return ops.embedding(positions, self.cos_cache), ops.embedding(positions, self.sin_cache)

    def forward(
        self,
        q: torch.Tensor,  # (num_tokens, num_heads, head_dim)
        k: torch.Tensor,  # (num_tokens, num_kv_heads, head_dim)
        cos_sin: tuple[torch.Tensor, torch.Tensor],  # from lookup(positions)
    ) -> tuple[torch.Tensor, torch.Tensor]:
        return self.layer_ops.rotary(q, k, cos_sin[0], cos_sin[1])

    def extra_repr(self) -> str:
        return f"head_dim={self.head_dim}, max_position={self.max_position}"
