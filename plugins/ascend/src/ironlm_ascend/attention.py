"""Attention backend ``ascend``: paged attention on Ascend NPUs through torch_npu operators.

KV-cache layout (one tensor per layer): (2, num_blocks, block_size, num_kv_heads, head_dim),
index 0 keys, 1 values. ``kv_cache[0]`` / ``kv_cache[1]`` are then the
(num_blocks, block_size, num_kv_heads, head_dim) key/value caches that ``_npu_reshape_and_cache``
and ``_npu_paged_attention`` take, and their (num_blocks, block_size, num_kv_heads * head_dim)
views are the page-attention caches of ``npu_fused_infer_attention_score`` (BSND queries). The
layout is vllm-ascend's (``AscendAttentionBackend.get_kv_cache_shape``). Block size 128.

Operators (signatures as documented; see docs/ascend.md for the sources):
  * write:   torch_npu._npu_reshape_and_cache(key, value, key_cache, value_cache, slot_indices)
  * decode:  torch_npu._npu_paged_attention(query, key_cache, value_cache, num_kv_heads,
             num_heads, scale_value, block_table, context_lens, out)
  * prefill, chunked prefill, and decodes the former cannot serve (sliding window, large heads):
             torch_npu.npu_fused_infer_attention_score(query, key, value, *, atten_mask,
             actual_seq_lengths, actual_seq_lengths_kv, block_table, num_heads, scale,
             input_layout="BSND", num_key_value_heads, sparse_mode, block_size)
"""

from __future__ import annotations

from types import ModuleType
from typing import Any, ClassVar

import torch

from ironlm.interfaces.attention import AttentionBackend, AttentionBatch, AttentionLayerSpec
from ironlm.interfaces.platform import Availability
from ironlm_ascend.attention_metadata import (
    AscendAttentionMetadata,
    KernelGroup,
    build_metadata,
    compressed_causal_mask,
)
from ironlm_ascend.npu_ops import import_torch_npu, torch_npu_availability


class AscendAttentionBackend(AttentionBackend):
    """Paged attention through torch_npu (ATB paged attention + fused infer attention score)."""

    name: ClassVar[str] = "ascend"
    supported_platforms: ClassVar[tuple[str, ...]] = ("npu",)
    # the torch_npu operators forward() calls
    required_ops: ClassVar[tuple[str, ...]] = (
        "_npu_reshape_and_cache",
        "_npu_paged_attention",
        "npu_fused_infer_attention_score",
    )
    # ATB PagedAttentionOperation constraint: block_size * head_size <= 128 * 128
    paged_attention_max_block_elems: ClassVar[int] = 128 * 128
    # FIA page attention: block_size a multiple of 128, from 128 to 512
    supported_block_sizes: ClassVar[tuple[int, ...]] = (128, 256, 384, 512)
    kernel_dtypes: ClassVar[tuple[torch.dtype, ...]] = (torch.float16, torch.bfloat16)

    def __init__(self, **options: Any) -> None:
        super().__init__(**options)
        self._npu: ModuleType = import_torch_npu()
        self._causal_masks: dict[torch.device, torch.Tensor] = {}

    @classmethod
    def is_available(cls) -> Availability:
        return torch_npu_availability(cls.required_ops)

    def kv_cache_shape(
        self, num_blocks: int, block_size: int, num_kv_heads: int, head_dim: int
    ) -> tuple[int, ...]:
        """(2, num_blocks, block_size, num_kv_heads, head_dim): keys at 0, values at 1."""
        return (2, num_blocks, block_size, num_kv_heads, head_dim)

    def build_metadata(self, batch: AttentionBatch) -> AscendAttentionMetadata:
        if batch.block_size not in self.supported_block_sizes:
            raise ValueError(
                f"attention backend 'ascend' needs a KV block size in "
                f"{list(self.supported_block_sizes)} (npu_fused_infer_attention_score page "
                f"attention); got {batch.block_size}"
            )
        device = batch.block_tables.device
        mask = self._causal_masks.get(device)
        if mask is None:
            mask = compressed_causal_mask(device)
            self._causal_masks[device] = mask
        return build_metadata(batch, mask)

    def forward(
        self,
        layer: AttentionLayerSpec,
        q: torch.Tensor,  # (num_tokens, num_heads, head_dim)
        k: torch.Tensor,  # (num_tokens, num_kv_heads, head_dim)
        v: torch.Tensor,  # (num_tokens, num_kv_heads, head_dim)
        kv_cache: torch.Tensor,  # (2, num_blocks, block_size, num_kv_heads, head_dim)
        metadata: AscendAttentionMetadata,
    ) -> torch.Tensor:  # (num_tokens, num_heads, head_dim)
        self._check(layer, q, kv_cache)
        if metadata.num_tokens == 0:
            return torch.empty_like(q)
        key_cache, value_cache = kv_cache[0], kv_cache[1]  # (num_blocks, block_size, Hkv, D)
        # op-plugin atb schema: _npu_reshape_and_cache(Tensor key, Tensor value,
        #   Tensor(a!) key_cache, Tensor(b!) value_cache, Tensor slot_indices) -> ()
        # ATB ReshapeAndCacheOperation: key (num_tokens, Hkv, D), slotMapping int32.
        self._npu._npu_reshape_and_cache(
            key=k.to(kv_cache.dtype),
            value=v.to(kv_cache.dtype),
            key_cache=key_cache,
            value_cache=value_cache,
            slot_indices=metadata.slot_indices,
        )
        out = torch.empty_like(q)
        if metadata.decode is not None:
            group = metadata.decode
            if self._paged_attention_serves(layer, metadata.block_size):
                result = self._paged_attention(layer, q, key_cache, value_cache, group)
            else:
                result = self._fused_attention(layer, q, key_cache, value_cache, group, metadata)
            out.index_copy_(0, group.token_rows, result)
        if metadata.prefill is not None:
            group = metadata.prefill
            result = self._fused_attention(layer, q, key_cache, value_cache, group, metadata)
            out.index_copy_(0, group.token_rows, result)
        return out

    # -- kernels -----------------------------------------------------------------------------
    def _paged_attention(
        self,
        layer: AttentionLayerSpec,
        q: torch.Tensor,
        key_cache: torch.Tensor,
        value_cache: torch.Tensor,
        group: KernelGroup,
    ) -> torch.Tensor:  # (num_seqs, num_heads, head_dim)
        query = q.index_select(0, group.token_rows)  # one token per sequence
        result = torch.empty_like(query)
        # op-plugin atb schema: _npu_paged_attention(Tensor query, Tensor key_cache,
        #   Tensor value_cache, int num_kv_heads, int num_heads, float scale_value,
        #   Tensor block_table, Tensor context_lens, Tensor(a!) out) -> ()
        # ATB PagedAttentionOperation: query (num_tokens, N, D), key_cache
        # (num_blocks, block_size, Hkv, D), block_tables (num_tokens, max_blocks) int32,
        # context_lens (num_tokens,) int32 (a host tensor, as vllm-ascend passes it).
        self._npu._npu_paged_attention(
            query=query,
            key_cache=key_cache,
            value_cache=value_cache,
            num_kv_heads=layer.num_kv_heads,
            num_heads=layer.num_heads,
            scale_value=layer.scale,
            block_table=group.block_table,
            context_lens=group.context_lens_host,
            out=result,
        )
        return result

    def _fused_attention(
        self,
        layer: AttentionLayerSpec,
        q: torch.Tensor,
        key_cache: torch.Tensor,
        value_cache: torch.Tensor,
        group: KernelGroup,
        metadata: AscendAttentionMetadata,
    ) -> torch.Tensor:  # (group_tokens, num_heads, head_dim)
        batch, width = group.num_seqs, group.max_query_len
        # BSND query: each sequence's new tokens right-padded to the longest in the group
        padded = q.new_zeros((batch * width, layer.num_heads, layer.head_dim))
        padded.index_copy_(0, group.padded_rows, q.index_select(0, group.token_rows))
        num_blocks, block_size = key_cache.shape[0], key_cache.shape[1]
        if layer.sliding_window is not None:
            # sparse_mode=0 with the full (B, 1, S, KV_S) mask: causal and window in one mask
            mask = group.window_mask(layer.sliding_window, block_size)
            sparse_mode = 0
        elif width > 1:
            # sparse_mode=3 (rightDownCausal): the causal diagonal ends at each sequence's last
            # query and last key, which is what a chunk after cached context needs
            mask, sparse_mode = metadata.causal_mask, 3
        else:
            mask, sparse_mode = None, 0  # Q_S = 1: every cached key is visible
        # torch_npu doc: npu_fused_infer_attention_score(Tensor query, Tensor key, Tensor value,
        #   *, ..., Tensor? atten_mask=None, SymInt[]? actual_seq_lengths=None,
        #   SymInt[]? actual_seq_lengths_kv=None, ..., Tensor? block_table=None, ...,
        #   int num_heads=1, float scale=1.0, int pre_tokens=2147483647,
        #   int next_tokens=2147483647, str input_layout="BSH", int num_key_value_heads=0,
        #   int sparse_mode=0, int inner_precise=0, int block_size=0, ...) -> (Tensor, Tensor)
        # Page attention with BSND queries takes the caches as (blocknum, blocksize, H).
        attn, _ = self._npu.npu_fused_infer_attention_score(
            padded.view(batch, width, layer.num_heads, layer.head_dim),
            key_cache.view(num_blocks, block_size, -1),
            value_cache.view(num_blocks, block_size, -1),
            atten_mask=mask,
            actual_seq_lengths=group.query_lens,
            actual_seq_lengths_kv=group.seq_lens,
            block_table=group.block_table,
            num_heads=layer.num_heads,
            scale=layer.scale,
            input_layout="BSND",
            num_key_value_heads=layer.num_kv_heads,
            sparse_mode=sparse_mode,
            block_size=block_size,
        )
        flat = attn.reshape(batch * width, layer.num_heads, layer.head_dim)
        return flat.index_select(0, group.padded_rows)

    # -- checks ------------------------------------------------------------------------------
    def _paged_attention_serves(self, layer: AttentionLayerSpec, block_size: int) -> bool:
        """ATB paged attention has no sliding window and caps block_size * head_size."""
        return (
            layer.sliding_window is None
            and block_size * layer.head_dim <= self.paged_attention_max_block_elems
        )

    def _check(self, layer: AttentionLayerSpec, q: torch.Tensor, kv_cache: torch.Tensor) -> None:
        if layer.logits_soft_cap is not None:
            raise ValueError(
                f"attention backend 'ascend' cannot apply logits_soft_cap (layer "
                f"{layer.layer_index}): the torch_npu attention kernels have no soft cap; "
                "select attention_backend='torch_ref' for this model"
            )
        if q.dtype not in self.kernel_dtypes or kv_cache.dtype not in self.kernel_dtypes:
            raise ValueError(
                "attention backend 'ascend' runs in float16 or bfloat16 (the torch_npu "
                f"attention kernels); got q {q.dtype}, kv cache {kv_cache.dtype}"
            )
