"""The Llama family: Llama, Mistral, Qwen2 (bias on q/k/v), Qwen3 (per-head q/k RMSNorm).

One pre-norm decoder: x -> RMSNorm -> attention -> + -> RMSNorm -> SwiGLU MLP -> +, with the
residual adds fused into the next norm. What differs between the families comes from the HF
config: ``model_type`` (qwen2: q/k/v bias; qwen3: q/k norms), ``attention_bias``,
``mlp_bias``, ``head_dim``, rope parameters, ``sliding_window`` with ``layer_types`` (Qwen) or on
every layer (Mistral), ``tie_word_embeddings``.
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


def head_dim_of(hf_config: Any) -> int:
    head_dim = getattr(hf_config, "head_dim", None)
    return int(head_dim) if head_dim else hf_config.hidden_size // hf_config.num_attention_heads


def sliding_window_of(hf_config: Any, layer_index: int) -> int | None:
    """The layer's window: ``layer_types`` names the sliding layers when the config has it,
    otherwise a configured ``sliding_window`` applies to every layer (Mistral)."""
    window = getattr(hf_config, "sliding_window", None)
    if not window:
        return None
    layer_types = getattr(hf_config, "layer_types", None)
    if layer_types is not None and layer_types[layer_index] != "sliding_attention":
        return None
    return int(window)


class LlamaDecoderLayer(torch.nn.Module):
    def __init__(
        self, hf_config: Any, layer_index: int, rotary: RotaryEmbedding, ctx: ModelContext
    ) -> None:
        super().__init__()
        head_dim = head_dim_of(hf_config)
        model_type = hf_config.model_type
        attention_bias = bool(getattr(hf_config, "attention_bias", False))
        self.self_attn = Attention(
            layer_index=layer_index,
            hidden_size=hf_config.hidden_size,
            num_heads=hf_config.num_attention_heads,
            num_kv_heads=getattr(hf_config, "num_key_value_heads", None)
            or hf_config.num_attention_heads,
            head_dim=head_dim,
            scale=head_dim**-0.5,
            rotary=rotary,
            ctx=ctx,
            qkv_bias=attention_bias or model_type == "qwen2",
            o_bias=attention_bias and model_type != "qwen2",
            qk_norm_eps=hf_config.rms_norm_eps if model_type == "qwen3" else None,
            sliding_window=sliding_window_of(hf_config, layer_index),
        )
        self.mlp = GatedMLP(
            hf_config.hidden_size,
            hf_config.intermediate_size,
            getattr(hf_config, "hidden_act", "silu"),
            ctx,
            bias=bool(getattr(hf_config, "mlp_bias", False)),
        )
        self.input_layernorm = RMSNorm(hf_config.hidden_size, hf_config.rms_norm_eps, ctx)
        self.post_attention_layernorm = RMSNorm(hf_config.hidden_size, hf_config.rms_norm_eps, ctx)

    def forward(
        self,
        hidden: torch.Tensor,  # (num_tokens, hidden_size): the previous layer's output
        residual: torch.Tensor | None,  # (num_tokens, hidden_size): the stream before it
        cos_sin: tuple[torch.Tensor, torch.Tensor],
        kv_cache: torch.Tensor,
        attn_metadata: Any,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        if residual is None:
            residual = hidden
            h = self.input_layernorm.norm(hidden)
        else:
            h, residual = self.input_layernorm(hidden, residual)
        h = self.self_attn(h, cos_sin, kv_cache, attn_metadata)
        h, residual = self.post_attention_layernorm(h, residual)
        return self.mlp(h), residual


class LlamaModel(StageDecoder):
    def __init__(self, hf_config: Any, ctx: ModelContext) -> None:
        rotary = RotaryEmbedding(
            head_dim_of(hf_config),
            hf_config.max_position_embeddings,
            rope_parameters(hf_config),
            ctx,
        )
        super().__init__(
            hf_config,
            ctx,
            lambda i: LlamaDecoderLayer(hf_config, i, rotary, ctx),
            lambda: RMSNorm(hf_config.hidden_size, hf_config.rms_norm_eps, ctx),
        )
        self.rotary_emb = rotary

    def rotary_for(self, positions: torch.Tensor) -> Callable[[torch.nn.Module], CosSin]:
        cos_sin = self.rotary_emb.lookup(positions)  # once for all layers
        return lambda layer: cos_sin


class LlamaForCausalLM(StageCausalLM):
    """Llama / Mistral / Qwen2 / Qwen3 causal LM (HF checkpoint names)."""

    def __init__(self, hf_config: Any, ctx: ModelContext) -> None:
        tied = bool(getattr(hf_config, "tie_word_embeddings", False))
        super().__init__(hf_config, ctx, LlamaModel(hf_config, ctx), tied)


class LlamaForSequenceClassification(StageSequenceClassifier):
    """Llama / Mistral / Qwen2 / Qwen3 sequence classifier (HF's ``model.*`` and ``score``)."""

    def __init__(self, hf_config: Any, ctx: ModelContext) -> None:
        super().__init__(hf_config, ctx, LlamaModel(hf_config, ctx))
