"""Per-step plan of the CPU paged attention backend, built once and shared by every layer.

Sequences are grouped into *buckets* of similar shape. Each bucket runs as one padded batched
attention call: its queries padded to the bucket's longest new-token run ``max_q``, its keys
gathered block by block into a padded buffer of ``num_blocks * block_size`` positions. Decode
sequences (one new token) and prefill chunks land in different buckets, so a long prefill never
pads 63 decodes up to its length; very different context lengths are split to bound padding.
When the fused C decode kernel runs, all decode rows form one bucket it reads without padding
(``DecodeRows``). Everything index-like (gather indices, query positions, masks) is computed
here, on the host, once per step (masks lazily, by the first layer that needs them);
``forward`` only runs tensor ops.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from ironlm.interfaces.attention import AttentionBatch

# Cost model for bucketing, in "key-row" units (one query row against one key position).
# Gathering a key position (K and V copy, then the attention read) costs about as much as a few
# query rows over it; a separate bucket costs a fixed overhead of index ops and a kernel launch.
_GATHER_COST = 2
_BUCKET_OVERHEAD = 4096


@dataclass
class DecodeRows:
    """Query rows as the fused C kernel reads them: no padding, each row's keys straight from
    its sequence's block table. A decode bucket has one row per sequence; prefill tokens run
    as rows too (``_token_rows``), each over its causal prefix, sharing their sequence's
    table row."""

    tokens: torch.Tensor  # (n,) int64: the q / output row of each kernel row
    seq_lens: torch.Tensor  # (n,) int64: keys the row attends to (its context incl. itself)
    tables: torch.Tensor  # (S, num_blocks) int32, contiguous: physical block ids per sequence
    max_len: int  # longest context of the bucket
    table_of: torch.Tensor | None = None  # (n,) int64 row of ``tables``; None: row i, S == n


@dataclass
class Bucket:
    """Sequences attended together as one padded batch of ``n`` sequences."""

    seq_ids: list[int]  # batch indices of the sequences, in bucket order
    max_q: int  # padded new-token rows per sequence
    num_blocks: int  # padded KV blocks per sequence; keys padded to num_blocks * block_size
    block_index: torch.Tensor  # (n * num_blocks,) int64: physical blocks to gather, 0 for padding
    # (n * max_q,) int64 rows of q to gather (padding rows repeat a real row of the same
    # sequence); None when the bucket's rows are exactly tokens 0..num_tokens-1 in order.
    q_index: torch.Tensor | None
    # Valid rows of the padded (n * max_q) output and the token each goes to; None when the
    # padded rows are exactly the tokens in order (no scatter needed).
    out_rows: torch.Tensor | None  # (num_valid,) int64 indices into the padded rows
    out_tokens: torch.Tensor | None  # (num_valid,) int64 token indices
    q_pos: torch.Tensor  # (n, max_q) int64: absolute position of each (padded) query row
    uniform: bool  # all sequences have seq_len == num_blocks * block_size (no key padding)
    fresh: bool  # no sequence has cached context: query row t sits at position t
    block_size: int
    decode: DecodeRows | None  # set when max_q == 1, or when prefill tokens run as rows
    # masks[window]: additive float mask (n, 1, max_q, keys), 0 = attend, -inf = hidden;
    # None when nothing is hidden. Built by the first layer that asks, reused by the rest.
    masks: dict[int | None, torch.Tensor | None] = field(default_factory=dict)

    @property
    def n(self) -> int:
        return len(self.seq_ids)

    @property
    def num_keys(self) -> int:
        return self.num_blocks * self.block_size

    def is_causal(self, window: int | None) -> bool:
        """Whether SDPA's ``is_causal`` (top-left aligned) is exactly this bucket's mask for its
        real rows: prefill chunks without cached context and no window that hides anything.
        Padding rows and padded keys only meet each other, and padding rows are dropped."""
        return self.max_q > 1 and self.fresh and (window is None or window >= self.max_q)

    def mask(self, window: int | None) -> torch.Tensor | None:
        if window not in self.masks:
            self.masks[window] = self._build_mask(window)
        return self.masks[window]

    def _build_mask(self, window: int | None) -> torch.Tensor | None:
        num_keys = self.num_keys
        if self.max_q == 1 and self.uniform and (window is None or window >= num_keys):
            return None  # every key of every sequence is visible: unmasked attention
        k_pos = torch.arange(num_keys).view(1, 1, num_keys)  # (1, 1, keys)
        q_pos = self.q_pos.unsqueeze(-1)  # (n, max_q, 1)
        allowed = k_pos <= q_pos  # causal; also hides padded keys (positions >= seq_len)
        if window is not None:
            allowed &= k_pos > q_pos - window
        mask = torch.zeros(allowed.shape, dtype=torch.float32)
        return mask.masked_fill_(~allowed, float("-inf")).unsqueeze(1)  # (n, 1, max_q, keys)


@dataclass
class CpuAttentionMetadata:
    """What ``CpuPagedAttentionBackend.forward`` needs for one step."""

    batch: AttentionBatch
    buckets: list[Bucket]  # every sequence with new tokens is in exactly one bucket
    graph: bool = False  # built by build_graph_metadata: only the C decode kernel may read it


def _cost(n: int, max_q: int, num_keys: int) -> int:
    return n * num_keys * (max_q + _GATHER_COST) + _BUCKET_OVERHEAD


def _group(
    seq_ids: list[int], q_lens: list[int], blocks: list[int], block_size: int
) -> list[list[int]]:
    """Greedy bucketing: sequences sorted by cost, largest first; a sequence joins the current
    bucket when padding it costs less than a bucket of its own."""
    order = sorted(seq_ids, key=lambda i: -(blocks[i] * (q_lens[i] + _GATHER_COST)))
    groups: list[list[int]] = []
    cur_q = cur_b = 0
    for i in order:
        if groups:
            q, b, n = max(cur_q, q_lens[i]), max(cur_b, blocks[i]), len(groups[-1])
            alone = _cost(1, q_lens[i], blocks[i] * block_size)
            if _cost(n + 1, q, b * block_size) <= _cost(n, cur_q, cur_b * block_size) + alone:
                groups[-1].append(i)
                cur_q, cur_b = q, b
                continue
        groups.append([i])
        cur_q, cur_b = q_lens[i], blocks[i]
    if len(groups) == 1:
        groups[0].sort()  # one bucket: keep batch order so q/out may need no gather at all
    return groups


def _make_bucket(
    batch: AttentionBatch, seq_ids: list[int], starts: list[int], blocks: list[int]
) -> Bucket:
    bs = batch.block_size
    q_lens, seq_lens = batch.query_lens_cpu, batch.seq_lens_cpu
    max_q = max(q_lens[i] for i in seq_ids)
    num_blocks = max(blocks[i] for i in seq_ids)
    ids = torch.tensor(seq_ids, dtype=torch.int64)
    block_index = batch.block_tables[ids, :num_blocks].reshape(-1).to(torch.int64)

    # Padded rows (n, max_q): row t of a sequence is its t-th new token; padding rows repeat
    # the last real token (so their masks are valid rows) and are dropped from the output.
    q_len = torch.tensor([q_lens[i] for i in seq_ids], dtype=torch.int64).unsqueeze(1)
    start = torch.tensor([starts[i] for i in seq_ids], dtype=torch.int64).unsqueeze(1)
    seq_len = torch.tensor([seq_lens[i] for i in seq_ids], dtype=torch.int64).unsqueeze(1)
    t = torch.arange(max_q, dtype=torch.int64).unsqueeze(0)  # (1, max_q)
    real = torch.minimum(t, q_len - 1)  # (n, max_q)
    valid = (t < q_len).reshape(-1)  # (n * max_q,)
    # identity: the padded rows are exactly tokens 0..num_tokens-1 in order (no padding row,
    # and no other bucket: n * max_q == num_tokens alone can hold by chance in a mixed batch)
    identity = (
        seq_ids == list(range(len(seq_ids)))
        and all(q_lens[i] == max_q for i in seq_ids)
        and len(seq_ids) * max_q == batch.num_tokens
    )
    return Bucket(
        seq_ids=seq_ids,
        max_q=max_q,
        num_blocks=num_blocks,
        block_index=block_index,
        q_index=None if identity else (start + real).reshape(-1),
        out_rows=None if identity else valid.nonzero().squeeze(1),
        out_tokens=None if identity else (start + t).reshape(-1)[valid],
        q_pos=seq_len - q_len + real,
        uniform=all(seq_lens[i] == num_blocks * bs for i in seq_ids),
        fresh=all(seq_lens[i] == q_lens[i] for i in seq_ids),
        block_size=bs,
        decode=None,  # the kernel's rows: set by build_cpu_metadata on its bucket
    )


def _token_rows(batch: AttentionBatch, seq_ids: list[int], starts: list[int]) -> DecodeRows:
    """Every new token of ``seq_ids`` as a row of its own for the C kernel: a token at
    position p attends to keys [0, p] (its causal prefix), read from its sequence's blocks
    (one table row per sequence; ``table_of`` maps tokens to them unless every sequence has
    one new token, the decode case)."""
    q_lens, seq_lens = batch.query_lens_cpu, batch.seq_lens_cpu
    tokens = torch.cat([torch.arange(starts[i], starts[i] + q_lens[i]) for i in seq_ids])
    lens = torch.cat([torch.arange(seq_lens[i] - q_lens[i] + 1, seq_lens[i] + 1)
                      for i in seq_ids])  # fmt: skip
    table_of = torch.arange(len(seq_ids)).repeat_interleave(
        torch.tensor([q_lens[i] for i in seq_ids]))  # (n,) the row's sequence in seq_ids
    num_blocks = max(-(-seq_lens[i] // batch.block_size) for i in seq_ids)
    ids = torch.tensor(seq_ids, dtype=torch.int64)
    return DecodeRows(
        tokens=tokens.to(torch.int64), seq_lens=lens.to(torch.int64),
        tables=batch.block_tables[ids, :num_blocks].to(torch.int32).contiguous(),
        max_len=max(seq_lens[i] for i in seq_ids),
        table_of=None if len(table_of) == len(seq_ids) else table_of.to(torch.int64),
    )  # fmt: skip


def build_cpu_metadata(
    batch: AttentionBatch, unpadded_decode: bool, row_keys: int = 0
) -> CpuAttentionMetadata:
    """Bucket the batch's sequences and precompute every index of the step.

    ``unpadded_decode``: decode rows run on a kernel that reads each sequence's own blocks, so
    all of them form one bucket whatever their lengths (only padded buckets are split).
    ``row_keys``: prefill chunks of sequences with at most this many keys (context and new
    tokens) join that bucket too, one kernel row per new token (``_token_rows``); the padded
    fields of the bucket stay valid for a layer the kernel does not take (correct, though
    padded to the bucket's longest chunk and context: the backend sets ``row_keys`` only when
    the kernel takes the model's layers)."""
    bs = batch.block_size
    q_lens, seq_lens = batch.query_lens_cpu, batch.seq_lens_cpu
    blocks = [-(-s // bs) for s in seq_lens]  # blocks covering each context
    starts = [0]
    for q in q_lens:
        starts.append(starts[-1] + q)
    live = [i for i, q in enumerate(q_lens) if q > 0]
    groups: list[list[int]] = []
    rows: list[int] = []
    if unpadded_decode:
        rows = [i for i in live if q_lens[i] == 1 or seq_lens[i] <= row_keys]
        live = [i for i in live if not (q_lens[i] == 1 or seq_lens[i] <= row_keys)]
        groups += [rows] if rows else []
    groups += _group(live, q_lens, blocks, bs) if live else []
    buckets = [_make_bucket(batch, ids, starts, blocks) for ids in groups]
    if rows:
        buckets[0].decode = _token_rows(batch, rows, starts)
    return CpuAttentionMetadata(batch=batch, buckets=buckets)


def build_graph_metadata(batch: AttentionBatch) -> CpuAttentionMetadata:
    """One decode bucket over every row of a static decode batch (``graph_metadata``): the C
    kernel reads the batch's block table in place; the int64 copy of the sequence lengths is
    the one derived tensor, refreshed by ``refresh_graph_metadata``. The padded-path fields
    (block_index, q_pos) are left empty: graph metadata is only valid for the C kernel."""
    n = batch.num_seqs
    rows = DecodeRows(
        tokens=torch.arange(n, dtype=torch.int64),
        seq_lens=batch.seq_lens.to(torch.int64),
        tables=batch.block_tables,  # (n, max_blocks) int32, contiguous, rewritten in place
        max_len=batch.max_seq_len,
    )
    bucket = Bucket(
        seq_ids=list(range(n)), max_q=1, num_blocks=batch.block_tables.shape[1],
        block_index=torch.empty(0, dtype=torch.int64), q_index=None, out_rows=None,
        out_tokens=None, q_pos=torch.empty(0, dtype=torch.int64), uniform=False, fresh=False,
        block_size=batch.block_size, decode=rows,
    )  # fmt: skip
    return CpuAttentionMetadata(batch=batch, buckets=[bucket], graph=True)
