"""Per-step metadata of the triton attention backend: the batch split into decode sequences
(split-K kernel) and query blocks of prefill / chunked-prefill sequences (prefill kernel)."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ironlm.interfaces.attention import AttentionBatch

DECODE_TILE = 32  # partitions are rounded to whole tiles of the decode kernel (any size is correct)


@dataclass
class TritonAttentionMetadata:
    """Built once per engine step (``TritonAttentionBackend.build_metadata``), shared by layers."""

    batch: AttentionBatch
    num_decode: int  # sequences with exactly one new token (decode steps)
    # (num_decode,) int32 batch index of each decode sequence; None when every sequence decodes
    # (then decode program i serves sequence i, and nothing is built per step: graph-friendly)
    decode_seq_ids: torch.Tensor | None
    num_splits: int  # key partitions per decode sequence (split-K); 1 skips the reduce pass
    partition_size: int  # keys per partition, a multiple of DECODE_TILE
    block_m: int  # new tokens per prefill query block
    # (num_qblocks,) int32: sequence of each prefill query block, and its first new token
    # counted within that sequence; empty when no sequence prefills
    qblock_seq: torch.Tensor
    qblock_start: torch.Tensor


def build_triton_metadata(
    batch: AttentionBatch, partition_size: int, block_m: int, longest_decode: int | None = None
) -> TritonAttentionMetadata:
    """Split ``batch`` into decode sequences and prefill query blocks (host lists -> device).
    ``longest_decode``: the context the decode partitions must cover (None: this batch's
    longest decode sequence; decode graphs pass the longest there will be)."""
    device = batch.seq_lens.device
    decode_ids: list[int] = []
    qblock_seq: list[int] = []
    qblock_start: list[int] = []
    max_decode_len = 0
    for i, (q_len, seq_len) in enumerate(zip(batch.query_lens_cpu, batch.seq_lens_cpu)):
        if q_len == 1:
            decode_ids.append(i)
            max_decode_len = max(max_decode_len, seq_len)
        else:
            for first in range(0, q_len, block_m):
                qblock_seq.append(i)
                qblock_start.append(first)
    partition = -(-max(partition_size, 1) // DECODE_TILE) * DECODE_TILE
    if longest_decode is not None:
        max_decode_len = longest_decode
    num_splits = max(1, -(-max_decode_len // partition))
    all_decode = len(decode_ids) == batch.num_seqs
    return TritonAttentionMetadata(
        batch=batch,
        num_decode=len(decode_ids),
        decode_seq_ids=None
        if all_decode
        else torch.tensor(decode_ids, dtype=torch.int32).to(device, non_blocking=True),
        num_splits=num_splits,
        partition_size=partition,
        block_m=block_m,
        qblock_seq=torch.tensor(qblock_seq, dtype=torch.int32).to(device, non_blocking=True),
        qblock_start=torch.tensor(qblock_start, dtype=torch.int32).to(device, non_blocking=True),
    )
