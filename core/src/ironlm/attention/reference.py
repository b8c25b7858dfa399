"""Pure-torch paged attention: the definition every plugin kernel is tested against.

Clarity over speed: one sequence at a time, float32 scores, explicit masks.
"""

from __future__ import annotations

from typing import ClassVar

import torch

from ironlm.interfaces.attention import AttentionBackend, AttentionBatch, AttentionLayerSpec


def write_kv(
    kv_cache: torch.Tensor,  # (2, num_blocks, block_size, num_kv_heads, head_dim)
    k: torch.Tensor,  # (num_tokens, num_kv_heads, head_dim)
    v: torch.Tensor,
    slot_mapping: torch.Tensor,  # (num_tokens,) int64
) -> None:
    """Store new keys/values at their cache slots (slot = block_id * block_size + offset)."""
    flat = kv_cache.view(2, -1, kv_cache.shape[-2], kv_cache.shape[-1])
    flat[0].index_copy_(0, slot_mapping, k.to(kv_cache.dtype))
    flat[1].index_copy_(0, slot_mapping, v.to(kv_cache.dtype))


def gather_context(
    kv_cache: torch.Tensor, block_table: torch.Tensor, seq_len: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Keys and values of positions 0..seq_len-1 of one sequence: 2 x (seq_len, Hkv, D)."""
    block_size = kv_cache.shape[2]
    n_blocks = (seq_len + block_size - 1) // block_size
    blocks = block_table[:n_blocks].long()
    keys = kv_cache[0, blocks].reshape(-1, kv_cache.shape[-2], kv_cache.shape[-1])[:seq_len]
    values = kv_cache[1, blocks].reshape(-1, kv_cache.shape[-2], kv_cache.shape[-1])[:seq_len]
    return keys, values


def attend(
    layer: AttentionLayerSpec,
    q: torch.Tensor,  # (q_len, H, D): the last q_len positions of the context
    keys: torch.Tensor,  # (seq_len, Hkv, D)
    values: torch.Tensor,  # (seq_len, Hkv, D)
) -> torch.Tensor:  # (q_len, H, D)
    """Causal (optionally sliding-window, soft-capped) attention of q over one context."""
    q_len, seq_len = q.shape[0], keys.shape[0]
    group = layer.num_heads // layer.num_kv_heads
    k = keys.float().repeat_interleave(group, dim=1)  # (seq_len, H, D)
    v = values.float().repeat_interleave(group, dim=1)
    scores = torch.einsum("qhd,khd->hqk", q.float(), k) * layer.scale  # (H, q_len, seq_len)
    if layer.logits_soft_cap is not None:
        scores = layer.logits_soft_cap * torch.tanh(scores / layer.logits_soft_cap)
    q_pos = torch.arange(seq_len - q_len, seq_len, device=q.device).unsqueeze(1)  # (q_len, 1)
    k_pos = torch.arange(seq_len, device=q.device).unsqueeze(0)  # (1, seq_len)
    allowed = k_pos <= q_pos
    if layer.sliding_window is not None:
        allowed = allowed & (q_pos - k_pos < layer.sliding_window)
    scores = scores.masked_fill(~allowed, float("-inf"))
    probs = torch.softmax(scores, dim=-1)
    return torch.einsum("hqk,khd->qhd", probs, v).to(q.dtype)


class ReferenceAttentionBackend(AttentionBackend):
    """Pure-torch reference; runs on every platform (slow: a Python loop over sequences)."""

    name: ClassVar[str] = "torch_ref"
    supported_platforms: ClassVar[tuple[str, ...]] = ("*",)

    def forward(
        self,
        layer: AttentionLayerSpec,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        kv_cache: torch.Tensor,
        metadata: AttentionBatch,
    ) -> torch.Tensor:
        write_kv(kv_cache, k, v, metadata.slot_mapping)
        out = torch.empty_like(q)
        start = 0
        for i, (q_len, seq_len) in enumerate(zip(metadata.query_lens_cpu, metadata.seq_lens_cpu)):
            keys, values = gather_context(kv_cache, metadata.block_tables[i], seq_len)
            out[start : start + q_len] = attend(layer, q[start : start + q_len], keys, values)
            start += q_len
        return out
