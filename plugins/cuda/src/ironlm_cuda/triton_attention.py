"""Attention backend ``triton``: paged attention in Triton kernels for the cuda platform.

One forward per layer: the KV-write kernel stores the new keys/values at their slots, then the
split-K decode kernel serves the sequences with one new token and the prefill kernel the query
blocks of (chunked) prefills, both reading the paged cache, into one output tensor. Mixed
prefill + decode batches therefore run in one forward. Triton is imported lazily, inside the
methods that launch kernels; this module is safe to import anywhere.
"""

from __future__ import annotations

from typing import Any, ClassVar

import torch

from ironlm.interfaces.attention import AttentionBackend, AttentionBatch, AttentionLayerSpec
from ironlm.interfaces.platform import Availability
from ironlm_cuda.availability import triton_installed
from ironlm_cuda.triton_attention_metadata import TritonAttentionMetadata, build_triton_metadata

GRAPH_MAX_SPLITS = 64  # most split-K partitions per row in a decode graph (longer ones beyond)

# kv_cache_dtype option -> cache dtype (None: the model's dtype)
KV_CACHE_DTYPES: dict[str, torch.dtype | None] = {
    "auto": None,
    "fp8": torch.float8_e4m3fn,
    "fp8_e4m3": torch.float8_e4m3fn,
    "fp8_e5m2": torch.float8_e5m2,
}


class TritonAttentionBackend(AttentionBackend):
    """Paged attention (decode, prefill, chunked prefill, mixed) with GQA, sliding window, soft
    cap, and an optional fp8 KV cache.

    Options (``attention_backend_options``):
      kv_cache_dtype: "auto" (the model's dtype), "fp8" / "fp8_e4m3" (float8_e4m3fn) or
        "fp8_e5m2" (float8_e5m2). Ask ``cache_dtype(model_dtype)`` for the dtype to allocate.
      k_scale, v_scale: fp8 scales of every layer (stored = value / scale), default 1.0;
        ``set_kv_scales(layer_index, k_scale, v_scale)`` overrides them per layer (checkpoint
        scales), as does the ``kv_scales`` option {layer_index: (k_scale, v_scale)}.
      decode_partition_size: keys per split-K partition of the decode kernel (default 256).
      prefill_block_m: new tokens per prefill query block, a power of two >= 16 (default 64).
    """

    name: ClassVar[str] = "triton"
    supported_platforms: ClassVar[tuple[str, ...]] = ("cuda",)

    def __init__(
        self,
        *,
        kv_cache_dtype: str = "auto",
        k_scale: float = 1.0,
        v_scale: float = 1.0,
        kv_scales: dict[int, tuple[float, float]] | None = None,
        decode_partition_size: int = 256,
        prefill_block_m: int = 64,
        **unknown: Any,
    ) -> None:
        if unknown:
            raise ValueError(
                f"attention backend {self.name!r} got unknown options {sorted(unknown)}; it takes "
                "kv_cache_dtype, k_scale, v_scale, kv_scales, decode_partition_size, "
                "prefill_block_m"
            )
        if kv_cache_dtype not in KV_CACHE_DTYPES:
            raise ValueError(
                f"kv_cache_dtype={kv_cache_dtype!r} is not supported by attention backend "
                f"{self.name!r}; choose one of {list(KV_CACHE_DTYPES)}"
            )
        if prefill_block_m < 16 or prefill_block_m & (prefill_block_m - 1):
            raise ValueError(f"prefill_block_m must be a power of two >= 16, got {prefill_block_m}")
        if decode_partition_size < 1:
            raise ValueError(f"decode_partition_size must be >= 1, got {decode_partition_size}")
        self.kv_cache_dtype = kv_cache_dtype
        self.default_scales = (float(k_scale), float(v_scale))
        self.kv_scales: dict[int, tuple[float, float]] = {}
        for layer_index, (ks, vs) in (kv_scales or {}).items():
            self.set_kv_scales(int(layer_index), ks, vs)
        self.decode_partition_size = decode_partition_size
        self.prefill_block_m = prefill_block_m

    @classmethod
    def is_available(cls) -> Availability:
        if torch.version.cuda is None:
            return Availability.no(
                f"torch {torch.__version__} is a CPU-only build (torch.version.cuda is None); "
                "the triton attention backend needs a CUDA build of torch"
            )
        if not torch.cuda.is_available():
            return Availability.no(
                "torch.cuda.is_available() is False: the triton attention backend needs a CUDA GPU"
            )
        return triton_installed()

    # -- KV cache ----------------------------------------------------------------------------
    def cache_dtype(self, model_dtype: torch.dtype) -> torch.dtype:
        """The dtype the engine allocates the KV cache in: ``model_dtype`` for "auto", else the
        chosen float8 dtype (the kernels quantise on write and dequantise on load)."""
        return KV_CACHE_DTYPES[self.kv_cache_dtype] or model_dtype

    def set_kv_scales(self, layer_index: int, k_scale: float, v_scale: float) -> None:
        """fp8 cache scales of one layer (stored = value / scale); ignored by a non-fp8 cache."""
        if not (k_scale > 0 and v_scale > 0):
            raise ValueError(f"fp8 KV scales must be positive, got ({k_scale}, {v_scale})")
        self.kv_scales[layer_index] = (float(k_scale), float(v_scale))

    def scales_of(self, layer_index: int) -> tuple[float, float]:
        """(k_scale, v_scale) of a layer."""
        return self.kv_scales.get(layer_index, self.default_scales)

    # -- per step ----------------------------------------------------------------------------
    def build_metadata(self, batch: AttentionBatch) -> TritonAttentionMetadata:
        return build_triton_metadata(batch, self.decode_partition_size, self.prefill_block_m)

    def graph_metadata(self, batch: AttentionBatch) -> TritonAttentionMetadata:
        """Every row decodes (no per-step index tensor) and the split-K partitions cover
        ``batch.max_seq_len``, the longest context there will be, so each replay launches the
        same grid; partitions past a row's length contribute nothing. At most
        GRAPH_MAX_SPLITS partitions (larger ones at long limits): each replay runs every
        partition's program and the reduce reads them all, whatever the rows' lengths."""
        partition = max(self.decode_partition_size, -(-batch.max_seq_len // GRAPH_MAX_SPLITS))
        return build_triton_metadata(batch, partition, self.prefill_block_m,
                                     longest_decode=batch.max_seq_len)

    def refresh_graph_metadata(self, metadata: TritonAttentionMetadata,
                               batch: AttentionBatch) -> None:
        """Nothing to do: the kernels read the batch's own tensors, rewritten in place."""

    def forward(
        self,
        layer: AttentionLayerSpec,
        q: torch.Tensor,  # (num_tokens, num_heads, head_dim)
        k: torch.Tensor,  # (num_tokens, num_kv_heads, head_dim)
        v: torch.Tensor,  # (num_tokens, num_kv_heads, head_dim)
        kv_cache: torch.Tensor,  # (2, num_blocks, block_size, num_kv_heads, head_dim)
        metadata: TritonAttentionMetadata,
    ) -> torch.Tensor:  # (num_tokens, num_heads, head_dim)
        from ironlm_cuda.kernels.common import PagedAttention
        from ironlm_cuda.kernels.kv_write import write_kv
        from ironlm_cuda.kernels.paged_decode import paged_decode
        from ironlm_cuda.kernels.paged_prefill import paged_prefill

        if q.stride(-1) != 1:
            q = q.contiguous()
        batch = metadata.batch
        k_scale, v_scale = self.scales_of(layer.layer_index)
        write_kv(kv_cache, k, v, batch.slot_mapping, k_scale, v_scale)
        out = torch.empty(q.shape, dtype=q.dtype, device=q.device)
        attn = PagedAttention(
            out, q, kv_cache, batch.block_tables, batch.seq_lens, batch.query_start_loc,
            layer.scale, layer.sliding_window, layer.logits_soft_cap, k_scale, v_scale,
        )
        paged_decode(attn, metadata.decode_seq_ids, metadata.num_decode, metadata.num_splits,
                     metadata.partition_size)
        paged_prefill(attn, metadata.qblock_seq, metadata.qblock_start, metadata.block_m)
        return out
