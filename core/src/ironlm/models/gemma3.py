"""Gemma 3 (text): sandwich-norm decoder with interleaved sliding-window and full attention.

Differences from Llama: embeddings scaled by sqrt(hidden_size) (in the model dtype); RMSNorm
scales by ``1 + w``; per-head q/k norms; norms before *and* after attention and MLP; GeGLU MLP
(gelu tanh); scores scaled by ``query_pre_attn_scalar ** -0.5``; sliding-window layers (per
``config.layer_types``) use the local rope base, full layers the global one; optional soft caps
on attention scores and final logits.
"""

from __future__ import annotations

from typing import Any, Callable

import torch

from ironlm.interfaces.model import ModelContext
from ironlm.layers.attention import Attention
from ironlm.layers.layernorm import RMSNorm
from ironlm.layers.mlp import GatedMLP
from ironlm.layers.rotary_embedding import RotaryEmbedding, rope_parameters
from ironlm.models.classifier import StageSequenceClassifier
from ironlm.models.decoder import CosSin, StageCausalLM, StageDecoder

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


def _window(hf_config: Any) -> int | None:
    """The sliding layers' window (None: they attend to everything, disable_sliding_window)."""
    window = getattr(hf_config, "sliding_window", None)
    return int(window) if window else None


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
            sliding_window=_window(hf_config) if self.is_sliding else None,
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


class Gemma3TextModel(StageDecoder):
    def __init__(self, hf_config: Any, ctx: ModelContext) -> None:
        hidden = hf_config.hidden_size
        max_pos = hf_config.max_position_embeddings
        rotary_global = RotaryEmbedding(
            hf_config.head_dim, max_pos, rope_parameters(hf_config, FULL), ctx
        )
        rotary_local = RotaryEmbedding(
            hf_config.head_dim, max_pos, _local_rope_parameters(hf_config), ctx
        )
        layer_types = layer_types_of(hf_config)
        super().__init__(
            hf_config,
            ctx,
            lambda i: Gemma3DecoderLayer(
                hf_config, i, layer_types[i],
                rotary_local if layer_types[i] == SLIDING else rotary_global, ctx,
            ),  # fmt: skip
            lambda: RMSNorm(hidden, hf_config.rms_norm_eps, ctx, GEMMA_NORM_OFFSET),
            embed_scale=hidden**0.5,  # rounded to the model dtype, as the reference multiplies
        )
        self.rotary_global, self.rotary_local = rotary_global, rotary_local
        self.layer_types = layer_types

    def rotary_for(self, positions: torch.Tensor) -> Callable[[torch.nn.Module], CosSin]:
        # both rope tables looked up once per step, shared by the layers of each kind
        local = self.rotary_local.lookup(positions)
        full = self.rotary_global.lookup(positions)
        return lambda layer: local if layer.is_sliding else full


def _local_rope_parameters(hf_config: Any) -> dict[str, Any]:
    """Rope of the sliding layers: their own entry in per-layer-type rope parameters, else the
    global parameters with ``rope_local_base_freq`` as base and no scaling."""
    params = getattr(hf_config, "rope_parameters", None) or {}
    if SLIDING in params:
        return rope_parameters(hf_config, SLIDING)
    return {"rope_type": "default", "rope_theta": float(hf_config.rope_local_base_freq)}


class Gemma3ForCausalLM(StageCausalLM):
    """Gemma 3 text causal LM (HF checkpoint names of ``Gemma3ForCausalLM``)."""

    def __init__(self, hf_config: Any, ctx: ModelContext) -> None:
        tied = bool(getattr(hf_config, "tie_word_embeddings", True))
        super().__init__(hf_config, ctx, Gemma3TextModel(hf_config, ctx), tied)
        self.final_logit_softcapping: float | None = getattr(
            hf_config, "final_logit_softcapping", None
        )

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        logits = super().compute_logits(hidden)  # (num_rows, vocab_size) float32
        if self.final_logit_softcapping is not None:
            cap = self.final_logit_softcapping
            logits = torch.tanh(logits / cap) * cap
        return logits


class Gemma3TextForSequenceClassification(StageSequenceClassifier):
    """Gemma 3 text sequence classifier (HF's ``model.*`` and ``score``)."""

    def __init__(self, hf_config: Any, ctx: ModelContext) -> None:
        super().__init__(hf_config, ctx, Gemma3TextModel(hf_config, ctx))
