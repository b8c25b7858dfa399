"""Attention with a logits soft cap (Gemma 2's ``cap * tanh(scores / cap)``) as explicit
matmuls: SDPA has no soft cap. The cpu backend's padded buckets use it for such layers."""

from __future__ import annotations

import torch


def soft_capped_attention(
    rows: torch.Tensor,  # (n * max_q, H, D) padded query rows
    keys: torch.Tensor,  # (n, Hkv, keys, D)
    values: torch.Tensor,  # (n, Hkv, keys, D)
    mask: torch.Tensor | None,  # (n, 1, max_q, keys) additive
    scale: float,
    cap: float,
) -> torch.Tensor:  # (n * max_q, H, D)
    """Explicit attention with ``cap * tanh(scores / cap)`` before the mask and softmax (SDPA
    has no soft cap). Query heads sharing a KV head are stacked as rows ordered (g, t), so K/V
    are not repeated and the mask broadcasts over g."""
    n, h_kv, _, d = keys.shape
    max_q = rows.shape[0] // n
    group = rows.shape[1] // h_kv
    qg = rows.view(n, max_q, h_kv, group, d).permute(0, 2, 3, 1, 4)  # (n, Hkv, G, max_q, D)
    qg = qg.reshape(n, h_kv, group * max_q, d)
    scores = torch.matmul(qg, keys.transpose(-1, -2)) * scale  # (n, Hkv, G * max_q, keys)
    scores = torch.tanh(scores / cap) * cap
    if mask is not None:
        scores = scores.view(n, h_kv, group, max_q, -1) + mask.unsqueeze(2)
    probs = torch.softmax(scores.view(n, h_kv, group * max_q, -1), dim=-1)
    o = torch.matmul(probs, values).view(n, h_kv, group, max_q, d)
    return o.permute(0, 3, 1, 2, 4).reshape(n * max_q, h_kv * group, d)
