"""Builds the AttentionBatch every backend consumes from per-sequence host lists."""

from __future__ import annotations

import torch

from ironlm.interfaces.attention import AttentionBatch


def build_attention_batch(
    context_lens: list[int],  # per sequence: tokens already cached before this step
    query_lens: list[int],  # per sequence: new tokens this step (>= 1)
    block_tables: list[list[int]],  # per sequence: physical block ids covering its context
    block_size: int,
    device: torch.device | str = "cpu",
) -> AttentionBatch:
    seq_lens = [c + q for c, q in zip(context_lens, query_lens)]
    max_blocks = max((len(b) for b in block_tables), default=1) or 1
    rows: list[list[int]] = []  # the block table, each row padded with block 0
    slots: list[int] = []
    for i, (blocks, ctx, q) in enumerate(zip(block_tables, context_lens, query_lens)):
        if len(blocks) * block_size < ctx + q:
            raise ValueError(
                f"sequence {i} needs {ctx + q} slots but has {len(blocks)} blocks of {block_size}"
            )
        rows.append(blocks + [0] * (max_blocks - len(blocks)))
        for pos in range(ctx, ctx + q):
            slots.append(blocks[pos // block_size] * block_size + pos % block_size)
    table = torch.tensor(rows, dtype=torch.int32).reshape(len(rows), max_blocks)
    qsl = [0]
    for q in query_lens:
        qsl.append(qsl[-1] + q)
    return AttentionBatch(
        query_start_loc=torch.tensor(qsl, dtype=torch.int32, device=device),
        seq_lens=torch.tensor(seq_lens, dtype=torch.int32, device=device),
        context_lens=torch.tensor(context_lens, dtype=torch.int32, device=device),
        block_tables=table.to(device),
        slot_mapping=torch.tensor(slots, dtype=torch.int64, device=device),
        block_size=block_size,
        max_query_len=max(query_lens, default=0),
        max_seq_len=max(seq_lens, default=0),
        query_lens_cpu=list(query_lens),
        seq_lens_cpu=seq_lens,
    )


def random_paged_batch(
    context_lens: list[int],
    query_lens: list[int],
    block_size: int,
    num_blocks: int,
    generator: torch.Generator,
    device: torch.device | str = "cpu",
) -> AttentionBatch:
    """A batch whose sequences own disjoint, randomly chosen blocks (for kernel tests)."""
    need = [-(-(c + q) // block_size) for c, q in zip(context_lens, query_lens)]
    if sum(need) > num_blocks:
        raise ValueError(f"need {sum(need)} blocks, have {num_blocks}")
    perm = torch.randperm(num_blocks, generator=generator).tolist()
    tables, at = [], 0
    for n in need:
        tables.append(perm[at : at + n])
        at += n
    return build_attention_batch(context_lens, query_lens, tables, block_size, device)
