"""AttentionBackend: causal attention over the paged KV cache, for prefill, chunked prefill,
decode and mixed batches. Any number of backends may be registered side by side."""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Any, ClassVar

import torch

from ironlm.interfaces.platform import Availability


@dataclass
class AttentionBatch:
    """The scheduled batch as every attention backend sees it (built once per engine step).

    Sequences appear in batch order; the flattened token axis holds each sequence's new tokens
    contiguously, in position order. A decode sequence contributes 1 token, a (chunked) prefill
    sequence contributes its chunk.
    """

    query_start_loc: torch.Tensor  # (num_seqs + 1,) int32: cumulative new-token counts, starts at 0
    seq_lens: torch.Tensor  # (num_seqs,) int32: context length after this step (cached + new)
    context_lens: torch.Tensor  # (num_seqs,) int32: tokens already in the cache before this step
    block_tables: torch.Tensor  # (num_seqs, max_blocks) int32: physical block ids, padded with 0
    slot_mapping: torch.Tensor  # (num_tokens,) int64: cache slot (block_id * block_size + offset)
    block_size: int  # tokens per KV block
    max_query_len: int  # longest new-token run in the batch (1 for a pure decode batch)
    max_seq_len: int  # longest context in the batch
    query_lens_cpu: list[int]  # host copy of the per-sequence new-token counts
    seq_lens_cpu: list[int]  # host copy of seq_lens

    @property
    def num_seqs(self) -> int:
        return len(self.seq_lens_cpu)

    @property
    def num_tokens(self) -> int:
        return int(sum(self.query_lens_cpu))

    @property
    def is_pure_decode(self) -> bool:
        return self.max_query_len == 1


@dataclass(frozen=True)
class AttentionLayerSpec:
    """What one attention layer asks of the backend."""

    layer_index: int
    num_heads: int
    num_kv_heads: int  # num_heads % num_kv_heads == 0 (GQA / MQA when smaller)
    head_dim: int
    scale: float  # multiplies q.k before softmax
    # A query at position i sees keys at positions j with i - sliding_window < j <= i (None: all).
    sliding_window: int | None = None
    logits_soft_cap: float | None = None  # tanh soft cap on scores (None: off)


class AttentionBackend(ABC):
    """A paged attention implementation. Registered through ``register_attention_backends``.

    The host constructs it as ``Backend(**options)`` once per engine (options come from the
    user, e.g. ``attention_backend_options``) and calls, per step, ``build_metadata`` once and
    ``forward`` once per layer.

    KV cache: the engine allocates one tensor per layer of ``kv_cache_shape(...)`` in the model's
    KV dtype on the platform's device, zero-filled, once at start-up. The default layout is
    (2, num_blocks, block_size, num_kv_heads, head_dim): index 0 holds keys, 1 values.
    """

    name: ClassVar[str]
    supported_platforms: ClassVar[tuple[str, ...]]

    def __init__(self, **options: Any) -> None:
        if options:
            raise ValueError(
                f"attention backend {self.name!r} takes no options; got {sorted(options)}"
            )

    @classmethod
    def is_available(cls) -> Availability:
        """Whether the backend's kernels can run here (libraries importable, ...)."""
        return Availability.yes()

    def kv_cache_shape(
        self, num_blocks: int, block_size: int, num_kv_heads: int, head_dim: int
    ) -> tuple[int, ...]:
        """Shape of one layer's KV cache tensor."""
        return (2, num_blocks, block_size, num_kv_heads, head_dim)

    def cache_dtype(self, model_dtype: torch.dtype) -> torch.dtype:
        """The KV cache's element dtype (a backend with an fp8 cache option returns fp8)."""
        return model_dtype

    def build_metadata(self, batch: AttentionBatch) -> Any:
        """Backend-specific metadata for one step, shared by all layers. Default: the batch."""
        return batch

    def graph_metadata(self, batch: AttentionBatch) -> Any | None:
        """Metadata for a decode graph (``ironlm.interfaces.graphs``): ``batch`` is a pure
        decode batch of static tensors (block tables as wide as the longest context, padding
        rows with slot -1 and seq_len 1; ``max_seq_len`` is the longest context there will
        be). Every tensor the result holds must stay in place: ``refresh_graph_metadata``
        updates it after the batch's tensors are overwritten. None (the default): this backend
        does not run under graphs."""
        return None

    def refresh_graph_metadata(self, metadata: Any, batch: AttentionBatch) -> None:
        """Bring ``graph_metadata(batch)``'s tensors up to date with ``batch``'s, in place."""
        raise NotImplementedError(f"attention backend {self.name!r} has no graph metadata")

    def copy_blocks(self, kv_cache: torch.Tensor, src: torch.Tensor, dst: torch.Tensor) -> None:
        """Copy whole blocks ``src[i] -> dst[i]`` inside one layer's cache (copy-on-write for
        forked sequences). Default for the default layout."""
        kv_cache[:, dst] = kv_cache[:, src]

    def swap_blocks(
        self,
        src_cache: torch.Tensor,  # one layer's cache, kv_cache_shape(...) on its device
        dst_cache: torch.Tensor,  # the same layer's cache of the other side (host or device)
        src: list[int],  # block ids in src_cache
        dst: list[int],  # block ids in dst_cache, one per src
    ) -> None:
        """Copy whole blocks ``src[i] -> dst[i]`` between the device cache and the host swap
        space of one layer (both of ``kv_cache_shape``, in the cache dtype), either way:
        swap preemption moves a preempted request's KV out and back. Default for the default
        layout (blocks on dimension 1)."""
        if not src:
            return
        src_ids = torch.tensor(src, dtype=torch.long, device=src_cache.device)
        dst_ids = torch.tensor(dst, dtype=torch.long, device=dst_cache.device)
        dst_cache[:, dst_ids] = src_cache[:, src_ids].to(dst_cache.device)

    @abstractmethod
    def forward(
        self,
        layer: AttentionLayerSpec,
        q: torch.Tensor,  # (num_tokens, num_heads, head_dim)
        k: torch.Tensor,  # (num_tokens, num_kv_heads, head_dim), new tokens only
        v: torch.Tensor,  # (num_tokens, num_kv_heads, head_dim)
        kv_cache: torch.Tensor,  # this layer's cache, kv_cache_shape(...)
        metadata: Any,  # what build_metadata returned
    ) -> torch.Tensor:  # (num_tokens, num_heads, head_dim)
        """Write ``k``/``v`` into the cache at the batch's slot_mapping, then return causal
        attention of each new token over its sequence's context (cached + new tokens),
        honouring ``layer.sliding_window`` and ``layer.logits_soft_cap``."""
