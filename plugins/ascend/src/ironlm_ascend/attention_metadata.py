"""Per-step metadata of the Ascend attention backend, built once and shared by all layers.

The scheduled batch is split into two kernel groups, each served by one torch_npu call:
  * decode: sequences with one new token (``_npu_paged_attention``, or
    ``npu_fused_infer_attention_score`` with Q_S = 1 where the former cannot serve the layer);
  * prefill: sequences with more than one new token, fresh or chunked
    (``npu_fused_infer_attention_score``, layout BSND, queries right-padded to the longest chunk).
Splitting keeps a long prefill chunk from padding every decode in a mixed batch to its length.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from ironlm.interfaces.attention import AttentionBatch

# npu_fused_infer_attention_score's sparse_mode 2/3/4 take an "optimised" 2048 x 2048 mask.
COMPRESSED_MASK_SIZE = 2048


def compressed_causal_mask(device: torch.device) -> torch.Tensor:
    """(2048, 2048) int8, 1 strictly above the diagonal (1 = masked): the compressed mask that
    ``npu_fused_infer_attention_score(sparse_mode=3)`` requires; vllm-ascend builds the same."""
    ones = torch.ones(COMPRESSED_MASK_SIZE, COMPRESSED_MASK_SIZE, device=device)
    return torch.triu(ones, diagonal=1).to(torch.int8)


@dataclass
class KernelGroup:
    """Sequences served by one kernel call: all decodes, or all (chunked) prefills."""

    token_rows: torch.Tensor  # (group_tokens,) int64: rows of the step's flattened q/k/v
    padded_rows: torch.Tensor  # (group_tokens,) int64: rows of the (B * max_query_len) padded q
    block_table: torch.Tensor  # (B, max_blocks) int32: physical block ids of the group's seqs
    context_lens_host: torch.Tensor  # (B,) int32 on the host: seq lens for _npu_paged_attention
    query_lens: list[int]  # per seq new tokens: FIA actual_seq_lengths (BSND: not cumulative)
    seq_lens: list[int]  # per seq cached + new tokens: FIA actual_seq_lengths_kv
    max_query_len: int  # the padded S of the BSND query
    # sliding window -> (B, 1, max_query_len, KV_S) bool FIA mask, built on first use in a step
    window_masks: dict[int, torch.Tensor] = field(default_factory=dict)

    @property
    def num_seqs(self) -> int:
        return len(self.query_lens)

    def window_mask(self, window: int, block_size: int) -> torch.Tensor:
        """Full FIA mask (True = masked) for a sliding-window layer: a query at position p sees
        keys j with p - window < j <= p, as the core reference defines it. KV_S covers the whole
        block table, as the FIA doc requires for a mask with page attention."""
        mask = self.window_masks.get(window)
        if mask is None:
            device = self.block_table.device
            kv_span = self.block_table.shape[1] * block_size
            seq = torch.tensor(self.seq_lens, device=device).view(-1, 1, 1)
            ctx = seq - torch.tensor(self.query_lens, device=device).view(-1, 1, 1)
            q_pos = ctx + torch.arange(self.max_query_len, device=device).view(1, -1, 1)
            k_pos = torch.arange(kv_span, device=device).view(1, 1, -1)
            masked = (k_pos > q_pos) | (q_pos - k_pos >= window) | (k_pos >= seq)
            mask = masked.unsqueeze(1)  # (B, 1, S, KV_S)
            self.window_masks[window] = mask
        return mask


@dataclass
class AscendAttentionMetadata:
    """What ``AscendAttentionBackend.forward`` needs for one step."""

    slot_indices: torch.Tensor  # (num_tokens,) int32: cache slots (_npu_reshape_and_cache dtype)
    block_size: int  # tokens per KV block
    num_tokens: int  # rows of the step's flattened q/k/v
    decode: KernelGroup | None  # sequences with one new token, None when there are none
    prefill: KernelGroup | None  # sequences with more than one new token, None when none
    causal_mask: torch.Tensor  # (2048, 2048) int8 compressed mask for FIA sparse_mode=3


def build_metadata(batch: AttentionBatch, causal_mask: torch.Tensor) -> AscendAttentionMetadata:
    """Split ``batch`` into its decode and prefill kernel groups."""
    starts = [0]
    for q_len in batch.query_lens_cpu:
        starts.append(starts[-1] + q_len)
    decode_ids = [i for i, n in enumerate(batch.query_lens_cpu) if n == 1]
    prefill_ids = [i for i, n in enumerate(batch.query_lens_cpu) if n > 1]
    return AscendAttentionMetadata(
        slot_indices=batch.slot_mapping.to(torch.int32),
        block_size=batch.block_size,
        num_tokens=batch.num_tokens,
        decode=_group(batch, decode_ids, starts),
        prefill=_group(batch, prefill_ids, starts),
        causal_mask=causal_mask,
    )


def _group(batch: AttentionBatch, seq_ids: list[int], starts: list[int]) -> KernelGroup | None:
    if not seq_ids:
        return None
    query_lens = [batch.query_lens_cpu[i] for i in seq_ids]
    seq_lens = [batch.seq_lens_cpu[i] for i in seq_ids]
    max_q = max(query_lens)
    token_rows: list[int] = []
    padded_rows: list[int] = []
    for b, i in enumerate(seq_ids):
        token_rows.extend(range(starts[i], starts[i + 1]))
        padded_rows.extend(range(b * max_q, b * max_q + query_lens[b]))
    device = batch.block_tables.device
    index = torch.tensor(seq_ids, dtype=torch.int64, device=device)
    return KernelGroup(
        token_rows=torch.tensor(token_rows, dtype=torch.int64, device=device),
        padded_rows=torch.tensor(padded_rows, dtype=torch.int64, device=device),
        block_table=batch.block_tables.index_select(0, index).to(torch.int32).contiguous(),
        context_lens_host=torch.tensor(seq_lens, dtype=torch.int32),
        query_lens=query_lens,
        seq_lens=seq_lens,
        max_query_len=max_q,
    )
