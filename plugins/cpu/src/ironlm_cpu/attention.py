"""Attention backend ``cpu_paged``: paged attention on CPU.

Per step, ``build_metadata`` groups the sequences into buckets of similar shape and precomputes
every index and mask (``attention_metadata``); every layer reuses them. Per layer:

- decode rows (one new token per sequence) run on a fused C kernel that reads each sequence's
  KV blocks straight from the cache (``decode_kernel``), when it builds here, the cache and
  queries are float32 or bfloat16, and it measured faster than torch (``decode_choice``);
  prefill tokens of prompts up to a measured length join them as rows of their own, each
  over its causal prefix (``prefill_choice``);
- every other bucket (longer prefill and chunked-prefill chunks, and decode rows otherwise)
  gathers its KV blocks with one ``index_select`` into a reused workspace, views them as (n,
  Hkv, keys, D) without copying, and runs one ``scaled_dot_product_attention`` (GQA without
  repeating K/V, ``is_causal`` for fresh prompts, else the step's precomputed additive mask),
  or an explicit matmul/softmax when the layer soft-caps its logits (``soft_cap``), which SDPA
  cannot do.

Scores are computed in float32 whatever the cache dtype, as the reference does.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, ClassVar

import torch
import torch.nn.functional as F
from ironlm.interfaces.attention import AttentionBackend, AttentionBatch, AttentionLayerSpec
from ironlm.interfaces.graphs import GraphCaptureError

from ironlm_cpu.attention_metadata import (
    Bucket,
    CpuAttentionMetadata,
    build_cpu_metadata,
    build_graph_metadata,
)
from ironlm_cpu.cbuild import KERNEL_DTYPES, KernelLibrary
from ironlm_cpu.decode_choice import choose_decode_path
from ironlm_cpu.decode_kernel import PagedDecodeKernel
from ironlm_cpu.prefill_choice import choose_prefill_rows
from ironlm_cpu.soft_cap import soft_capped_attention
from ironlm_cpu.tuner import KernelTuner

_COMPUTE_DTYPE = torch.float32  # fp32 is both the reference's precision and fastest on AVX2


class CpuPagedAttentionBackend(AttentionBackend):
    """Paged attention for the ``cpu`` platform: prefill, chunked prefill, decode and mixed
    batches in one call; GQA/MQA, sliding window, logits soft cap; fp32/bf16/fp16 caches."""

    name: ClassVar[str] = "cpu_paged"
    supported_platforms: ClassVar[tuple[str, ...]] = ("cpu",)

    def __init__(self, **options: Any) -> None:
        """Options: ``native_decode`` (default True): run decode rows on the fused C kernel
        (``decode_kernel``) when it builds here; otherwise, or when False, on torch ops."""
        native_decode = bool(options.pop("native_decode", True))
        if options:
            raise ValueError(
                f"attention backend {self.name!r} takes only the option 'native_decode'; "
                f"got {sorted(options)}"
            )
        super().__init__()
        kernel = PagedDecodeKernel() if native_decode else None
        self._kernel = kernel if kernel is not None and kernel.available else None
        # why decode rows run where they run (for logs and `ironlm plugins`)
        self.decode_path = (
            "fused C kernel" if self._kernel is not None
            else kernel.reason if kernel is not None else "torch (native_decode=False)"
        )  # fmt: skip
        # C kernel or torch for decode rows: measured at the first forward (a prefill: nothing
        # decodes before it), from the first layer's shape; None until then
        self._tuner = KernelTuner(self._kernel.target) if self._kernel is not None else None
        self._decode_c: bool | None = None if self._kernel is not None else False
        # prefill chunks of sequences up to this many keys run as C kernel rows, one per new
        # token (``prefill_choice``, measured with the decode choice); 0: all on torch
        self._row_keys = 0
        self.prefill_path = "torch (gather + SDPA)"  # why prefill runs where it runs
        # dtype -> flat buffer the KV gathers write into, grown on demand and reused by every
        # layer and step (fresh multi-MB allocations per layer cost page faults)
        self._workspace: dict[torch.dtype, torch.Tensor] = {}

    def build_metadata(self, batch: AttentionBatch) -> CpuAttentionMetadata:
        return build_cpu_metadata(batch, unpadded_decode=self._decode_c is not False,
                                  row_keys=self._row_keys if self._decode_c else 0)  # fmt: skip

    def graph_metadata(self, batch: AttentionBatch) -> CpuAttentionMetadata | None:
        # decode graphs replay the C kernel's calls; the torch path cannot be recorded
        return build_graph_metadata(batch) if self._decode_c is not False else None

    def refresh_graph_metadata(self, metadata: CpuAttentionMetadata, batch: AttentionBatch) -> None:
        rows = metadata.buckets[0].decode
        assert rows is not None
        rows.seq_lens.copy_(batch.seq_lens)

    def libraries(self) -> list[KernelLibrary]:
        """The C libraries this backend calls (what a decode-graph capture records)."""
        return [self._kernel] if self._kernel is not None else []

    def forward(
        self,
        layer: AttentionLayerSpec,
        q: torch.Tensor,  # (num_tokens, num_heads, head_dim)
        k: torch.Tensor,  # (num_tokens, num_kv_heads, head_dim)
        v: torch.Tensor,  # (num_tokens, num_kv_heads, head_dim)
        kv_cache: torch.Tensor,  # (2, num_blocks, block_size, num_kv_heads, head_dim)
        metadata: CpuAttentionMetadata,
    ) -> torch.Tensor:  # (num_tokens, num_heads, head_dim)
        if self._decode_c is None and not metadata.graph:
            self._decode_c = self._choose_decode(layer, q, kv_cache)
            if self._decode_c and _kernel_fits(layer, q, kv_cache):
                self._row_keys = self._choose_prefill(layer, q, kv_cache)
            # this step's metadata was built before the choice: rebuilt in place, so that
            # every layer of the first step runs as every later step will (the same paths,
            # the same numbers: a seeded request repeats its tokens)
            metadata.buckets = self.build_metadata(metadata.batch).buckets
        native = self._decode_c is not False and _kernel_fits(layer, q, kv_cache)
        c_write = self._kernel is not None and PagedDecodeKernel.write_kv_fits(kv_cache, k, v)
        if metadata.graph and not (native and c_write):
            # checked before any write: graph metadata holds padding rows with slot -1
            raise GraphCaptureError(
                f"layer {layer.layer_index}: the C decode kernel and KV write do not take this "
                f"layer (a float32 or bfloat16 cache with q, k, v of its dtype, head_dim % 8 == 0 "
                f"needed; cache {str(kv_cache.dtype).removeprefix('torch.')}, q "
                f"{str(q.dtype).removeprefix('torch.')}, head_dim {layer.head_dim})"
            )
        slots = metadata.batch.slot_mapping
        if c_write:
            assert self._kernel is not None
            self._kernel.write_kv(kv_cache, k, v, slots)
        else:
            _write_kv(kv_cache, k, v, slots)
        buckets = metadata.buckets
        if len(buckets) == 1 and buckets[0].out_rows is None and not native:
            return self._attend_bucket(layer, q, kv_cache, buckets[0]).to(q.dtype)
        out = torch.empty(q.shape, dtype=q.dtype)  # contiguous: the C kernel writes rows
        for bucket in buckets:
            if native and bucket.decode is not None:
                assert self._kernel is not None
                rows = bucket.decode
                self._kernel(
                    q.contiguous(), kv_cache, out, rows.tokens, rows.seq_lens, rows.tables,
                    rows.max_len, layer.scale, layer.sliding_window, layer.logits_soft_cap,
                    rows.table_of,
                )  # fmt: skip
                continue
            padded = self._attend_bucket(layer, q, kv_cache, bucket)  # (n * max_q, H, D)
            if bucket.out_rows is None:  # the bucket is every token, in order
                out.copy_(padded)
                continue
            assert bucket.out_tokens is not None
            if padded.shape[0] != bucket.out_rows.shape[0]:
                padded = padded.index_select(0, bucket.out_rows)  # drop padding rows
            out.index_copy_(0, bucket.out_tokens, padded.to(q.dtype))
        return out

    def _choose_decode(
        self, layer: AttentionLayerSpec, q: torch.Tensor, kv_cache: torch.Tensor
    ) -> bool:
        """Whether decode rows run on the C kernel (``decode_choice``); only asked when the
        kernel built and fits this layer."""
        assert self._kernel is not None and self._tuner is not None
        if not _kernel_fits(layer, q, kv_cache):
            return True  # the torch path runs this layer anyway; others may fit
        torch_path = CpuPagedAttentionBackend(native_decode=False)

        def run(native: bool, batch: AttentionBatch, q: torch.Tensor, kv: torch.Tensor,
                cache: torch.Tensor) -> torch.Tensor:  # fmt: skip
            backend = self if native else torch_path
            return backend.forward(layer, q, kv, kv, cache, backend.build_metadata(batch))

        self._decode_c = True  # measuring runs this backend's C path
        decision = choose_decode_path(self._tuner, layer, q.dtype, run)
        self.decode_path = f"{'fused C kernel' if decision['impl'] == 'c' else 'torch'} " \
            f"({decision['why']})"
        return decision["impl"] == "c"

    def _choose_prefill(
        self, layer: AttentionLayerSpec, q: torch.Tensor, kv_cache: torch.Tensor
    ) -> int:
        """Up to how many keys a prefill sequence runs as C kernel rows (``prefill_choice``);
        only asked once decode rows run on the kernel."""
        assert self._tuner is not None

        def prepare(row_keys: int, batch: AttentionBatch, q: torch.Tensor,
                    kv: torch.Tensor) -> Callable[[], torch.Tensor]:  # fmt: skip
            blocks = int(batch.block_tables.numel())
            cache = torch.zeros(2, blocks, batch.block_size, layer.num_kv_heads,
                                layer.head_dim, dtype=kv_cache.dtype)  # fmt: skip
            meta = build_cpu_metadata(batch, unpadded_decode=True, row_keys=row_keys)
            return lambda: self.forward(layer, q, kv, kv, cache, meta)

        decision = choose_prefill_rows(self._tuner, layer, q.dtype, prepare)
        self.prefill_path = decision["why"]
        return int(decision.get("max_keys", 0))

    # -- one bucket --------------------------------------------------------------------------
    def _attend_bucket(
        self,
        layer: AttentionLayerSpec,
        q: torch.Tensor,  # (num_tokens, H, D)
        kv_cache: torch.Tensor,
        bucket: Bucket,
    ) -> torch.Tensor:  # (n * max_q, H, D): padded rows, in bucket order
        n, max_q = bucket.n, bucket.max_q
        h_kv, d = layer.num_kv_heads, layer.head_dim
        group = layer.num_heads // h_kv
        window = layer.sliding_window
        keys, values = self._gather_kv(kv_cache, bucket)  # 2 x (n, Hkv, keys, D) views
        rows = q if bucket.q_index is None else q.index_select(0, bucket.q_index)
        rows = rows.to(_COMPUTE_DTYPE)  # (n * max_q, H, D), padded rows in bucket order

        if layer.logits_soft_cap is not None:
            return soft_capped_attention(
                rows, keys, values, bucket.mask(window), layer.scale, layer.logits_soft_cap
            )
        if max_q == 1:
            # Decode: a KV head's `group` query heads become its query rows, so SDPA reads each
            # key once per KV head and the (n, 1, 1, keys) mask broadcasts over them.
            qg = rows.view(n, h_kv, group, d)
            o = F.scaled_dot_product_attention(
                qg, keys, values, attn_mask=bucket.mask(window), scale=layer.scale
            )
            return o.reshape(n, h_kv * group, d)
        # Prefill chunks: (n, H, max_q, D) queries as a strided view, GQA inside SDPA; plain
        # causal chunks skip the mask (and SDPA skips the blocks above the diagonal).
        q4 = rows.view(n, max_q, -1, d).transpose(1, 2)
        causal = bucket.is_causal(window)
        o = F.scaled_dot_product_attention(
            q4,
            keys,
            values,
            attn_mask=None if causal else bucket.mask(window),
            is_causal=causal,
            scale=layer.scale,
            enable_gqa=group > 1,
        )  # (n, H, max_q, D)
        return o.transpose(1, 2).reshape(n * max_q, -1, d)

    def _gather_kv(
        self, kv_cache: torch.Tensor, bucket: Bucket
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The bucket's KV blocks, padded per sequence: 2 x (n, Hkv, num_keys, D), as strided
        views of one contiguous (2, n, num_keys, Hkv, D) buffer."""
        _, num_blocks, block_size, h_kv, d = kv_cache.shape
        n_idx = bucket.block_index.numel()
        flat = kv_cache.view(2, num_blocks, block_size * h_kv * d)  # whole blocks as rows
        gathered = torch.index_select(
            flat, 1, bucket.block_index, out=self._buffer(kv_cache.dtype, flat.shape[2], n_idx)
        )
        if gathered.dtype != _COMPUTE_DTYPE:
            gathered = gathered.to(_COMPUTE_DTYPE)
        kv = gathered.view(2, bucket.n, bucket.num_blocks * block_size, h_kv, d)
        return kv[0].transpose(1, 2), kv[1].transpose(1, 2)

    def _buffer(self, dtype: torch.dtype, row: int, rows: int) -> torch.Tensor:
        """A (2, rows, row) tensor backed by the reused workspace of ``dtype``."""
        need = 2 * rows * row
        buf = self._workspace.get(dtype)
        if buf is None or buf.numel() < need:
            buf = torch.empty(need, dtype=dtype)
            self._workspace[dtype] = buf
        return buf[:need].view(2, rows, row)


def _kernel_fits(layer: AttentionLayerSpec, q: torch.Tensor, kv_cache: torch.Tensor) -> bool:
    """The C decode kernel's preconditions: q and cache both float32 or both bf16, a contiguous
    cache (q is made contiguous: a view of a fused QKV projection is not), head_dim a multiple
    of 8."""
    return (
        q.dtype == kv_cache.dtype
        and q.dtype in KERNEL_DTYPES
        and kv_cache.is_contiguous()
        and layer.head_dim % 8 == 0
    )


def _write_kv(
    kv_cache: torch.Tensor,  # (2, num_blocks, block_size, Hkv, D)
    k: torch.Tensor,  # (num_tokens, Hkv, D)
    v: torch.Tensor,
    slot_mapping: torch.Tensor,  # (num_tokens,) int64: block_id * block_size + offset
) -> None:
    """Store the new tokens' keys and values at their cache slots."""
    slots = kv_cache.view(2, -1, kv_cache.shape[-2], kv_cache.shape[-1])  # (2, slots, Hkv, D)
    slots[0].index_copy_(0, slot_mapping, k.to(kv_cache.dtype))
    slots[1].index_copy_(0, slot_mapping, v.to(kv_cache.dtype))
