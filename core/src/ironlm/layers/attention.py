"""Self-attention block: fused QKV projection, optional per-head q/k RMSNorm, rotary, paged
attention through the selected backend, output projection."""

from __future__ import annotations

from typing import Any

import torch

from ironlm.interfaces.attention import AttentionLayerSpec
from ironlm.interfaces.model import ModelContext
from ironlm.layers.layernorm import RMSNorm
from ironlm.layers.linear import QKVParallelLinear, RowParallelLinear
from ironlm.layers.rotary_embedding import RotaryEmbedding


class Attention(torch.nn.Module):
    """One attention layer of a decoder.

    Checkpoint names it loads (relative to this module): ``q_proj`` / ``k_proj`` / ``v_proj``
    (into ``qkv_proj`` shards "q" / "k" / "v"), ``o_proj``, and with ``qk_norm_eps`` set,
    ``q_norm`` / ``k_norm`` (RMSNorm over head_dim, applied per head before rotary, as Qwen3
    and Gemma 3 do).
    """

    def __init__(
        self,
        layer_index: int,
        hidden_size: int,
        num_heads: int,
        num_kv_heads: int,
        head_dim: int,
        scale: float,
        rotary: RotaryEmbedding,
        ctx: ModelContext,
        qkv_bias: bool = False,
        o_bias: bool = False,
        qk_norm_eps: float | None = None,
        qk_norm_offset: float = 0.0,
        sliding_window: int | None = None,
        logits_soft_cap: float | None = None,
    ) -> None:
        super().__init__()
        self.qkv_proj = QKVParallelLinear(
            hidden_size, head_dim, num_heads, num_kv_heads, ctx, bias=qkv_bias
        )
        self.o_proj = RowParallelLinear(num_heads * head_dim, hidden_size, ctx, bias=o_bias)
        self.num_heads = self.qkv_proj.num_heads  # this rank's heads
        self.num_kv_heads = self.qkv_proj.num_kv_heads
        self.head_dim = head_dim
        self.q_size = self.qkv_proj.q_size
        self.kv_size = self.qkv_proj.kv_size
        if qk_norm_eps is not None:
            self.q_norm: RMSNorm | None = RMSNorm(head_dim, qk_norm_eps, ctx, qk_norm_offset)
            self.k_norm: RMSNorm | None = RMSNorm(head_dim, qk_norm_eps, ctx, qk_norm_offset)
        else:
            self.q_norm = self.k_norm = None
        # shared by every layer of the same rope configuration (one cos/sin table)
        self.rotary = rotary
        self.backend = ctx.attention
        self.spec = AttentionLayerSpec(
            layer_index=layer_index,
            num_heads=self.num_heads,
            num_kv_heads=self.num_kv_heads,
            head_dim=head_dim,
            scale=scale,
            sliding_window=sliding_window,
            logits_soft_cap=logits_soft_cap,
        )

    def forward(
        self,
        hidden: torch.Tensor,  # (num_tokens, hidden_size)
        cos_sin: tuple[torch.Tensor, torch.Tensor],  # rotary.lookup(positions)
        kv_cache: torch.Tensor,  # this layer's cache, backend.kv_cache_shape(...)
        attn_metadata: Any,
    ) -> torch.Tensor:  # (num_tokens, hidden_size)
        num_tokens = hidden.shape[0]
        qkv = self.qkv_proj(hidden)  # (num_tokens, q_size + 2 * kv_size)
        q, k, v = qkv.split([self.q_size, self.kv_size, self.kv_size], dim=-1)
        if self.q_norm is not None and self.k_norm is not None:
            # per-head norms on views of the qkv output: (num_tokens, heads, head_dim)
            q = self.q_norm.norm(q.unflatten(-1, (self.num_heads, self.head_dim)))
            k = self.k_norm.norm(k.unflatten(-1, (self.num_kv_heads, self.head_dim)))
        q = q.reshape(num_tokens, self.num_heads, self.head_dim)
        k = k.reshape(num_tokens, self.num_kv_heads, self.head_dim)
        v = v.reshape(num_tokens, self.num_kv_heads, self.head_dim)
        q, k = self.rotary(q, k, cos_sin)
        out = self.backend.forward(self.spec, q, k, v, kv_cache, attn_metadata)
        # (num_tokens, num_heads, head_dim) -> (num_tokens, hidden_size)
        return self.o_proj(out.reshape(num_tokens, self.num_heads * self.head_dim))

    def weight_targets(self) -> dict[str, tuple[str, str | int | None]]:
        """Checkpoint sub-module name -> (this module's child, shard id)."""
        return {
            "q_proj": ("qkv_proj", "q"),
            "k_proj": ("qkv_proj", "k"),
            "v_proj": ("qkv_proj", "v"),
        }
