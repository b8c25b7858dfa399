"""One Llama-family decoder layer as plain float32 tensors, for calibration: the offline
algorithms need each linear's input activations and the layer's output under trial weights.

Covers what the core's Llama model covers (Llama, Mistral, Qwen2 q/k/v bias, Qwen3 q/k norms,
rope scaling via ``ironlm.layers.rotary_embedding``); a calibration batch is a flat
(tokens, hidden) tensor of independent causal sequences whose lengths are ``lengths``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F

from ironlm.layers.rotary_embedding import inverse_frequencies, rope_parameters
from ironlm.models.llama import head_dim_of

ARCHITECTURES = ("LlamaForCausalLM", "MistralForCausalLM", "Qwen2ForCausalLM", "Qwen3ForCausalLM")
# the linear layers of one decoder layer, checkpoint names under model.layers.<i>.
ATTN_QKV = ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj")
ATTN_O = "self_attn.o_proj"
MLP_GATE_UP = ("mlp.gate_proj", "mlp.up_proj")
MLP_DOWN = "mlp.down_proj"
LINEARS = (*ATTN_QKV, ATTN_O, *MLP_GATE_UP, MLP_DOWN)
# linears whose input features are split over tensor-parallel ranks (row parallel)
ROW_PARALLEL = (ATTN_O, MLP_DOWN)


@dataclass(frozen=True)
class LlamaShape:
    hidden: int
    intermediate: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    eps: float
    qk_norm: bool  # Qwen3
    act: str

    @classmethod
    def of(cls, hf_config: Any) -> LlamaShape:
        archs = list(getattr(hf_config, "architectures", None) or [])
        if not archs or archs[0] not in ARCHITECTURES:
            raise ValueError(
                f"ironlm quantize supports Llama-family checkpoints ({', '.join(ARCHITECTURES)}); "
                f"this one is {archs[0] if archs else 'of no named architecture'}"
            )
        act = getattr(hf_config, "hidden_act", "silu")
        if act != "silu":
            raise ValueError(f"ironlm quantize: hidden_act {act!r} is not supported (silu only)")
        return cls(
            hidden=hf_config.hidden_size,
            intermediate=hf_config.intermediate_size,
            num_heads=hf_config.num_attention_heads,
            num_kv_heads=getattr(hf_config, "num_key_value_heads", None)
            or hf_config.num_attention_heads,
            head_dim=head_dim_of(hf_config),
            eps=float(hf_config.rms_norm_eps),
            qk_norm=hf_config.model_type == "qwen3",
            act=act,
        )

    def required(self) -> list[str]:
        """The tensors (names within a layer) the forward reads."""
        names = [f"{linear}.weight" for linear in LINEARS]
        names += ["input_layernorm.weight", "post_attention_layernorm.weight"]
        if self.qk_norm:
            names += ["self_attn.q_norm.weight", "self_attn.k_norm.weight"]
        return names

    def in_features(self, linear: str) -> int:
        if linear == ATTN_O:
            return self.num_heads * self.head_dim
        return self.intermediate if linear == MLP_DOWN else self.hidden


class Rotary:
    """cos / sin tables (positions, head_dim / 2) for the calibration lengths."""

    def __init__(self, hf_config: Any, shape: LlamaShape, max_len: int) -> None:
        inv_freq = inverse_frequencies(shape.head_dim, rope_parameters(hf_config))
        angles = torch.arange(max_len, dtype=torch.float32)[:, None] * inv_freq[None, :]
        self.cos, self.sin = angles.cos(), angles.sin()

    def apply(self, x: torch.Tensor) -> torch.Tensor:
        """(L, H, D) -> rotated (neox style: the two halves of each head together)."""
        half = x.shape[-1] // 2
        cos, sin = self.cos[: x.shape[0], None, :], self.sin[: x.shape[0], None, :]
        x1, x2 = x[..., :half], x[..., half:]
        return torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1)


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * weight


class DecoderLayer:
    """Float32 weights of one layer (``tensors``: names relative to the layer, as in the
    checkpoint) and its forward in stages."""

    def __init__(
        self, tensors: dict[str, torch.Tensor], shape: LlamaShape, rotary: Rotary
    ) -> None:
        self.t = tensors
        self.shape = shape
        self.rotary = rotary

    def weight(self, linear: str) -> torch.Tensor:
        return self.t[f"{linear}.weight"]

    def linear(
        self, linear: str, x: torch.Tensor, weight: torch.Tensor | None = None
    ) -> torch.Tensor:
        w = self.weight(linear) if weight is None else weight
        return F.linear(x, w, self.t.get(f"{linear}.bias"))

    # -- stages ------------------------------------------------------------------------------
    def attn_input(self, x: torch.Tensor) -> torch.Tensor:
        """(T, hidden) layer input -> the q/k/v projections' input."""
        return rms_norm(x, self.t["input_layernorm.weight"], self.shape.eps)

    def attention(
        self, h: torch.Tensor, lengths: list[int], qkv: dict[str, torch.Tensor] | None = None
    ) -> torch.Tensor:
        """q/k/v input (T, hidden) -> o_proj's input (T, heads * head_dim); ``qkv`` replaces
        projection weights (name -> weight)."""
        s = self.shape
        w = qkv or {}
        q = self.linear(ATTN_QKV[0], h, w.get(ATTN_QKV[0])).view(-1, s.num_heads, s.head_dim)
        k = self.linear(ATTN_QKV[1], h, w.get(ATTN_QKV[1])).view(-1, s.num_kv_heads, s.head_dim)
        v = self.linear(ATTN_QKV[2], h, w.get(ATTN_QKV[2])).view(-1, s.num_kv_heads, s.head_dim)
        if s.qk_norm:
            q = rms_norm(q, self.t["self_attn.q_norm.weight"], s.eps)
            k = rms_norm(k, self.t["self_attn.k_norm.weight"], s.eps)
        outs, start = [], 0
        for length in lengths:  # independent causal sequences
            qs, ks, vs = (t[start : start + length] for t in (q, k, v))
            qs, ks = self.rotary.apply(qs), self.rotary.apply(ks)
            # (H, L, D) with the KV heads repeated for their query heads
            rep = s.num_heads // s.num_kv_heads
            o = F.scaled_dot_product_attention(
                qs.transpose(0, 1),
                ks.transpose(0, 1).repeat_interleave(rep, dim=0),
                vs.transpose(0, 1).repeat_interleave(rep, dim=0),
                is_causal=True,
            )
            outs.append(o.transpose(0, 1).reshape(length, -1))
            start += length
        return torch.cat(outs)

    def attn_block(
        self, h: torch.Tensor, lengths: list[int], weights: dict[str, torch.Tensor] | None = None
    ) -> torch.Tensor:
        """q/k/v input -> o_proj output (the attention block without the residual)."""
        w = weights or {}
        return self.linear(ATTN_O, self.attention(h, lengths, w), w.get(ATTN_O))

    def mlp_input(self, x_after_attn: torch.Tensor) -> torch.Tensor:
        return rms_norm(x_after_attn, self.t["post_attention_layernorm.weight"], self.shape.eps)

    def down_input(
        self, h: torch.Tensor, weights: dict[str, torch.Tensor] | None = None
    ) -> torch.Tensor:
        w = weights or {}
        gate = self.linear(MLP_GATE_UP[0], h, w.get(MLP_GATE_UP[0]))
        return F.silu(gate) * self.linear(MLP_GATE_UP[1], h, w.get(MLP_GATE_UP[1]))

    def mlp_block(
        self, h: torch.Tensor, weights: dict[str, torch.Tensor] | None = None
    ) -> torch.Tensor:
        w = weights or {}
        return self.linear(MLP_DOWN, self.down_input(h, w), w.get(MLP_DOWN))

    def forward(self, x: torch.Tensor, lengths: list[int]) -> torch.Tensor:
        """(T, hidden) -> (T, hidden), the whole layer with its current weights."""
        x = x + self.attn_block(self.attn_input(x), lengths)
        return x + self.mlp_block(self.mlp_input(x))
