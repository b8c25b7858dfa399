"""Gemma 3 (text): sandwich-norm decoder with interleaved sliding-window and full attention.

Differences from Llama: embeddings scaled by sqrt(hidden_size) (in the model dtype); RMSNorm
scales by ``1 + w``; per-head q/k norms; norms before *and* after attention and MLP; GeGLU MLP
(gelu tanh); scores scaled by ``query_pre_attn_scalar ** -0.5``; sliding-window layers (per
``config.layer_types``) use the local rope base, full layers the global one; optional soft caps
on attention scores and final logits.
"""

from __future__ import annotations

from typing import Any, Iterable

import torch

from ironlm.interfaces.attention import AttentionLayerSpec
from ironlm.interfaces.model import ModelArchitecture, ModelContext
from ironlm.layers.attention import Attention
from ironlm.layers.layernorm import RMSNorm
from ironlm.layers.mlp import GatedMLP
from ironlm.layers.rotary_embedding import RotaryEmbedding, rope_parameters
from ironlm.layers.vocab_embedding import ParallelLMHead, VocabParallelEmbedding
from ironlm.layers.weight_loading import load_named_weights

SLIDING, FULL = "sliding_attention", "full_attention"
GEMMA_NORM_OFFSET = 1.0  # Gemma's RMSNorm multiplies by (1 + w)


def layer_types_of(hf_config: Any) -> list[str]:
    """Per layer, "sliding_attention" or "full_attention": ``config.layer_types`` when set, else
    every ``sliding_window_pattern``-th layer is full (1-based), the others sliding."""
    layer_types = getattr(hf_config, "layer_types", None)
    if layer_types:
        return list(layer_types)
    pattern = getattr(hf_config, "sliding_window_pattern", None) or getattr(
        hf_config, "_sliding_window_pattern", 6
    )
    return [FULL if (i + 1) % pattern == 0 else SLIDING for i in range(hf_config.num_hidden_layers)]


class Gemma3DecoderLayer(torch.nn.Module):
    def __init__(
        self,
        hf_config: Any,
        layer_index: int,
        layer_type: str,
        rotary: RotaryEmbedding,
        ctx: ModelContext,
    ) -> None:
        super().__init__()
        hidden, eps = hf_config.hidden_size, hf_config.rms_norm_eps
        self.is_sliding = layer_type == SLIDING
        self.self_attn = Attention(
            layer_index=layer_index,
            hidden_size=hidden,
            num_heads=hf_config.num_attention_heads,
            num_kv_heads=hf_config.num_key_value_heads,
            head_dim=hf_config.head_dim,
            scale=float(hf_config.query_pre_attn_scalar) ** -0.5,
            rotary=rotary,
            ctx=ctx,
            qkv_bias=bool(getattr(hf_config, "attention_bias", False)),
            o_bias=bool(getattr(hf_config, "attention_bias", False)),
            qk_norm_eps=eps,
            qk_norm_offset=GEMMA_NORM_OFFSET,
            sliding_window=int(hf_config.sliding_window) if self.is_sliding else None,
            logits_soft_cap=getattr(hf_config, "attn_logit_softcapping", None),
        )
        self.mlp = GatedMLP(
            hidden,
            hf_config.intermediate_size,
            getattr(hf_config, "hidden_activation", "gelu_pytorch_tanh"),
            ctx,
        )
        self.input_layernorm = RMSNorm(hidden, eps, ctx, GEMMA_NORM_OFFSET)
        self.post_attention_layernorm = RMSNorm(hidden, eps, ctx, GEMMA_NORM_OFFSET)
        self.pre_feedforward_layernorm = RMSNorm(hidden, eps, ctx, GEMMA_NORM_OFFSET)
        self.post_feedforward_layernorm = RMSNorm(hidden, eps, ctx, GEMMA_NORM_OFFSET)

    def forward(
        self,
        hidden: torch.Tensor,  # (num_tokens, hidden_size): the previous layer's output
        residual: torch.Tensor | None,  # the residual stream before it
        cos_sin: tuple[torch.Tensor, torch.Tensor],  # this layer's rope (local or global)
        kv_cache: torch.Tensor,
        attn_metadata: Any,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        if residual is None:
            residual = hidden
            h = self.input_layernorm.norm(hidden)
        else:
            h, residual = self.input_layernorm(hidden, residual)
        h = self.self_attn(h, cos_sin, kv_cache, attn_metadata)
        h = self.post_attention_layernorm.norm(h)
        h, residual = self.pre_feedforward_layernorm(h, residual)
        h = self.mlp(h)
        return self.post_feedforward_layernorm.norm(h), residual


class Gemma3TextModel(torch.nn.Module):
    def __init__(self, hf_config: Any, ctx: ModelContext) -> None:
        super().__init__()
        hidden = hf_config.hidden_size
        self.embed_tokens = VocabParallelEmbedding(hf_config.vocab_size, hidden, ctx)
        # sqrt(hidden) rounded to the model dtype, as the reference multiplies in that dtype
        self.register_buffer(
            "embed_scale", torch.tensor(hidden**0.5, dtype=ctx.dtype), persistent=False
        )
        max_pos = hf_config.max_position_embeddings
        self.rotary_global = RotaryEmbedding(
            hf_config.head_dim, max_pos, rope_parameters(hf_config, FULL), ctx
        )
        self.rotary_local = RotaryEmbedding(
            hf_config.head_dim, max_pos, _local_rope_parameters(hf_config), ctx
        )
        self.layer_types = layer_types_of(hf_config)
        self.layers = torch.nn.ModuleList(
            Gemma3DecoderLayer(
                hf_config,
                i,
                layer_type,
                self.rotary_local if layer_type == SLIDING else self.rotary_global,
                ctx,
            )
            for i, layer_type in enumerate(self.layer_types)
        )
        self.norm = RMSNorm(hidden, hf_config.rms_norm_eps, ctx, GEMMA_NORM_OFFSET)

    def forward(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        kv_caches: list[torch.Tensor],
        attn_metadata: Any,
    ) -> torch.Tensor:
        hidden = self.embed_tokens(input_ids) * self.embed_scale  # (num_tokens, hidden_size)
        # both rope tables looked up once per step, shared by the layers of each kind
        cos_sin_local = self.rotary_local.lookup(positions)
        cos_sin_global = self.rotary_global.lookup(positions)
        residual: torch.Tensor | None = None
        for layer, kv_cache in zip(self.layers, kv_caches, strict=True):
            cos_sin = cos_sin_local if layer.is_sliding else cos_sin_global
            hidden, residual = layer(hidden, residual, cos_sin, kv_cache, attn_metadata)
        return self.norm(hidden, residual)[0]


def _local_rope_parameters(hf_config: Any) -> dict[str, Any]:
    """Rope of the sliding layers: their own entry in per-layer-type rope parameters, else the
    global parameters with ``rope_local_base_freq`` as base and no scaling."""
    params = getattr(hf_config, "rope_parameters", None) or {}
    if SLIDING in params:
        return rope_parameters(hf_config, SLIDING)
    return {"rope_type": "default", "rope_theta": float(hf_config.rope_local_base_freq)}


class Gemma3ForCausalLM(ModelArchitecture):
    """Gemma 3 text causal LM (HF checkpoint names of ``Gemma3ForCausalLM``)."""

    def __init__(self, hf_config: Any, ctx: ModelContext) -> None:
        super().__init__()
        self.config = hf_config
        self.model = Gemma3TextModel(hf_config, ctx)
        self.tie_word_embeddings = bool(getattr(hf_config, "tie_word_embeddings", True))
        self.lm_head = ParallelLMHead(
            hf_config.vocab_size,
            hf_config.hidden_size,
            ctx,
            tie_to=self.model.embed_tokens if self.tie_word_embeddings else None,
        )
        self.final_logit_softcapping: float | None = getattr(
            hf_config, "final_logit_softcapping", None
        )

    def attention_layers(self) -> list[AttentionLayerSpec]:
        return [layer.self_attn.spec for layer in self.model.layers]

    def forward(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        kv_caches: list[torch.Tensor],
        attn_metadata: Any,
    ) -> torch.Tensor:
        return self.model(input_ids, positions, kv_caches, attn_metadata)

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        logits = self.lm_head(hidden)  # (num_rows, vocab_size) float32
        if self.final_logit_softcapping is not None:
            cap = self.final_logit_softcapping
            logits = torch.tanh(logits / cap) * cap
        return logits

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
        def skip(name: str) -> bool:
            return self.tie_word_embeddings and name == "lm_head.weight"

        load_named_weights(self, weights, skip)
