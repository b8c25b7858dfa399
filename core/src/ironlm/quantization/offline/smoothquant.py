"""SmoothQuant's migration (Xiao et al., 2022): move activation outliers into the weights.

For a linear group reading the same input X, per input channel j:
    s_j = max|X_j| ^ alpha / max|W_j| ^ (1 - alpha)        (W: every consumer's column j)
X / s goes into the producer of X (an RMSNorm's weight, or the rows of a preceding linear), W * s
into the consumers' columns, so the float model computes exactly the same function while the
per-token int8 activations see flatter channels. Folded per decoder layer:
    input_layernorm          -> q_proj, k_proj, v_proj
    post_attention_layernorm -> gate_proj, up_proj
    up_proj (rows)           -> down_proj      (silu(gate) * up is linear in up)
    v_proj (rows)            -> o_proj         (attention output is linear in v; the query heads
                                                sharing a KV head share its scales)
"""

from __future__ import annotations

import torch

from ironlm.quantization.offline.llama_block import (
    ATTN_O,
    ATTN_QKV,
    MLP_DOWN,
    MLP_GATE_UP,
    DecoderLayer,
)

_MIN = 1e-5


def smoothing_scales(
    act_max: torch.Tensor, weights: list[torch.Tensor], alpha: float
) -> torch.Tensor:
    """(C,) per-channel scales from the inputs' absolute maxima and the consumers' columns."""
    w_max = torch.cat([w.abs() for w in weights]).amax(dim=0).clamp(min=_MIN)  # (C,)
    s = act_max.clamp(min=_MIN).pow(alpha) / w_max.pow(1.0 - alpha)
    return s.clamp(min=_MIN)


def smooth_layer(layer: DecoderLayer, act_max: dict[str, torch.Tensor], alpha: float) -> None:
    """Fold the migration into ``layer``'s tensors in place. ``act_max``: per-channel max |x| of
    the inputs of q/k/v ("attn"), o_proj ("o"), gate/up ("mlp") and down_proj ("down")."""
    t, shape = layer.t, layer.shape
    # norms -> the linears they feed
    for norm, consumers, key in (
        ("input_layernorm", ATTN_QKV, "attn"),
        ("post_attention_layernorm", MLP_GATE_UP, "mlp"),
    ):
        s = smoothing_scales(act_max[key], [layer.weight(c) for c in consumers], alpha)
        t[f"{norm}.weight"] = t[f"{norm}.weight"] / s
        for c in consumers:
            t[f"{c}.weight"] = t[f"{c}.weight"] * s
    # up_proj rows -> down_proj columns
    s = smoothing_scales(act_max["down"], [layer.weight(MLP_DOWN)], alpha)
    _scale_rows(layer, MLP_GATE_UP[1], 1.0 / s)
    t[f"{MLP_DOWN}.weight"] = t[f"{MLP_DOWN}.weight"] * s
    # v_proj rows -> o_proj columns, one scale per (KV head, dim) shared by its query heads
    rep = shape.num_heads // shape.num_kv_heads
    grouped_act = act_max["o"].view(shape.num_kv_heads, rep, shape.head_dim).amax(dim=1)
    o_cols = layer.weight(ATTN_O).abs().view(-1, shape.num_kv_heads, rep, shape.head_dim)
    grouped_w = o_cols.amax(dim=(0, 2))  # (kv_heads, head_dim)
    s_kv = smoothing_scales(grouped_act.reshape(-1), [grouped_w.reshape(1, -1)], alpha)
    _scale_rows(layer, ATTN_QKV[2], 1.0 / s_kv)
    s_o = s_kv.view(shape.num_kv_heads, 1, shape.head_dim).expand(-1, rep, -1).reshape(-1)
    t[f"{ATTN_O}.weight"] = t[f"{ATTN_O}.weight"] * s_o


def _scale_rows(layer: DecoderLayer, linear: str, factor: torch.Tensor) -> None:
    t = layer.t
    t[f"{linear}.weight"] = t[f"{linear}.weight"] * factor.unsqueeze(1)
    if f"{linear}.bias" in t:
        t[f"{linear}.bias"] = t[f"{linear}.bias"] * factor
