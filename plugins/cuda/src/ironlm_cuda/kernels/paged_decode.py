"""Paged decode attention, split-K (flash-decoding): one query token per sequence.

Pass 1 (``_decode_split_kernel``), grid (num_decode_seqs, num_kv_heads, num_splits): each program
takes the query heads that share one KV head (GQA group, padded to 16 rows for tl.dot) and one
partition of the sequence's keys, and writes an unnormalised partial result with its running max
and sum. Pass 2 (``_decode_reduce_kernel``), grid (num_decode_seqs, num_heads): rescales the
partials to a common max and normalises. With one split, pass 1 normalises and writes the output
itself. Keys are gathered per position through the block table, so any block size works.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ironlm_cuda.kernels.common import BLOCK_N, PagedAttention, attend_paged_kv, pow2_at_least


@triton.jit
def _decode_split_kernel(
    q_ptr,  # (num_tokens, num_heads, head_dim)
    k_cache_ptr,  # (num_blocks, block_size, num_kv_heads, head_dim)
    v_cache_ptr,
    block_tables_ptr,  # (num_seqs, max_blocks) int32
    seq_lens_ptr,  # (num_seqs,) int32
    query_start_ptr,  # (num_seqs + 1,) int32
    seq_ids_ptr,  # (num_decode,) int32: batch index of each decode sequence (if HAS_SEQ_IDS)
    out_ptr,  # (num_tokens, num_heads, head_dim): written when NUM_SPLITS == 1
    part_o_ptr,  # (num_decode, num_heads, NUM_SPLITS, head_dim) float32
    part_ml_ptr,  # (2, num_decode, num_heads, NUM_SPLITS) float32: running max (log2), sum
    qk_scale,  # softmax scale * log2(e); just the scale when soft-capping (log2(e) after the cap)
    cap, k_scale, v_scale, window,
    stride_qt, stride_qh, stride_ot, stride_oh,
    stride_cb, stride_cs, stride_ch, stride_bt,
    num_decode,
    NUM_HEADS: tl.constexpr, GROUP: tl.constexpr, GROUP_PAD: tl.constexpr,
    HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_N: tl.constexpr,
    BLOCK_SIZE: tl.constexpr, PARTITION: tl.constexpr, NUM_SPLITS: tl.constexpr,
    HAS_SEQ_IDS: tl.constexpr, USE_WINDOW: tl.constexpr, USE_CAP: tl.constexpr,
    FP8: tl.constexpr, UPCAST: tl.constexpr, IEEE: tl.constexpr,
):
    i = tl.program_id(0)
    kv_head = tl.program_id(1)
    split = tl.program_id(2)
    seq = i
    if HAS_SEQ_IDS:
        seq = tl.load(seq_ids_ptr + i)
    seq_len = tl.load(seq_lens_ptr + seq)
    tok = tl.load(query_start_ptr + seq).to(tl.int64)

    rows = tl.arange(0, GROUP_PAD)
    heads = kv_head * GROUP + rows  # (GROUP_PAD,) query heads of this KV head
    row_ok = rows < GROUP
    dims = tl.arange(0, BLOCK_D)
    dim_ok = dims < HEAD_DIM
    q_mask = row_ok[:, None] & dim_ok[None, :]
    q = tl.load(q_ptr + tok * stride_qt + heads[:, None] * stride_qh + dims[None, :], mask=q_mask,
                other=0.0)  # (GROUP_PAD, BLOCK_D)
    if UPCAST:
        q = q.to(tl.float32)

    start = split * PARTITION
    end = tl.minimum(start + PARTITION, seq_len)
    if USE_WINDOW:  # the query sits at seq_len - 1 and sees keys j > seq_len - 1 - window
        start = tl.maximum(start, seq_len - window)

    # The one query sees every key in [start, end) (the window went into start): no causal
    # mask, so no query positions (``rows`` stands in for them, unread).
    acc, m_i, l_i = attend_paged_kv(
        q, rows, start, end, block_tables_ptr + seq.to(tl.int64) * stride_bt, k_cache_ptr,
        v_cache_ptr, kv_head, qk_scale, cap, k_scale, v_scale, window, stride_cb, stride_cs,
        stride_ch, ROWS=GROUP_PAD, HEAD_DIM=HEAD_DIM, BLOCK_D=BLOCK_D, BLOCK_N=BLOCK_N,
        BLOCK_SIZE=BLOCK_SIZE, CAUSAL=False, WINDOW=False, USE_CAP=USE_CAP, FP8=FP8, IEEE=IEEE,
    )

    if NUM_SPLITS == 1:
        out = acc / tl.where(l_i > 0.0, l_i, 1.0)[:, None]
        dst = out_ptr + tok * stride_ot + heads[:, None] * stride_oh + dims[None, :]
        tl.store(dst, out.to(out_ptr.dtype.element_ty), mask=q_mask)
    else:
        part = (i * NUM_HEADS + heads).to(tl.int64) * NUM_SPLITS + split  # (GROUP_PAD,)
        tl.store(part_o_ptr + part[:, None] * HEAD_DIM + dims[None, :], acc, mask=q_mask)
        tl.store(part_ml_ptr + part, m_i, mask=row_ok)
        tl.store(part_ml_ptr + num_decode * NUM_HEADS * NUM_SPLITS + part, l_i, mask=row_ok)


@triton.jit
def _decode_reduce_kernel(
    part_o_ptr,  # (num_decode, num_heads, NUM_SPLITS, head_dim) float32
    part_ml_ptr,  # (2, num_decode, num_heads, NUM_SPLITS) float32
    query_start_ptr, seq_ids_ptr,
    out_ptr,  # (num_tokens, num_heads, head_dim)
    stride_ot, stride_oh,
    num_decode,
    NUM_HEADS: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr,
    NUM_SPLITS: tl.constexpr, SPLITS_PAD: tl.constexpr, HAS_SEQ_IDS: tl.constexpr,
):
    i = tl.program_id(0)
    head = tl.program_id(1)
    seq = i
    if HAS_SEQ_IDS:
        seq = tl.load(seq_ids_ptr + i)
    tok = tl.load(query_start_ptr + seq).to(tl.int64)
    splits = tl.arange(0, SPLITS_PAD)
    split_ok = splits < NUM_SPLITS
    dims = tl.arange(0, BLOCK_D)
    dim_ok = dims < HEAD_DIM
    part = (i * NUM_HEADS + head).to(tl.int64) * NUM_SPLITS + splits  # (SPLITS_PAD,)
    m = tl.load(part_ml_ptr + part, mask=split_ok, other=float("-inf"))
    l = tl.load(part_ml_ptr + num_decode * NUM_HEADS * NUM_SPLITS + part, mask=split_ok, other=0.0)
    o = tl.load(part_o_ptr + part[:, None] * HEAD_DIM + dims[None, :],
                mask=split_ok[:, None] & dim_ok[None, :], other=0.0)  # (SPLITS_PAD, BLOCK_D)
    w = tl.exp2(m - tl.max(m, 0))  # empty partitions carry m = -1e30 and l = 0: weight 0
    total = tl.sum(w * l, 0)
    out = tl.sum(w[:, None] * o, 0) / total
    tl.store(out_ptr + tok * stride_ot + head * stride_oh + dims, out.to(out_ptr.dtype.element_ty),
             mask=dim_ok)


def paged_decode(
    attn: PagedAttention,
    seq_ids: torch.Tensor | None,  # (num_decode,) int32; None: every sequence decodes
    num_decode: int,
    num_splits: int,
    partition_size: int,  # keys per split, a multiple of BLOCK_N
) -> None:
    """Attention of each decode sequence's single new token over its whole cached context."""
    if num_decode == 0:
        return
    q, out = attn.q, attn.out
    _, num_heads, head_dim = q.shape
    k_cache, v_cache = attn.kv_cache[0], attn.kv_cache[1]
    num_kv_heads = k_cache.shape[2]
    group = num_heads // num_kv_heads
    block_d = pow2_at_least(head_dim)
    device = q.device
    part_o = part_ml = out  # placeholders, unused when num_splits == 1
    if num_splits > 1:
        part_o = torch.empty((num_decode, num_heads, num_splits, head_dim), dtype=torch.float32,
                             device=device)
        part_ml = torch.empty((2, num_decode, num_heads, num_splits), dtype=torch.float32,
                              device=device)
    ids = seq_ids if seq_ids is not None else attn.seq_lens
    _decode_split_kernel[(num_decode, num_kv_heads, num_splits)](
        q, k_cache, v_cache, attn.block_tables, attn.seq_lens, attn.query_start_loc, ids, out,
        part_o, part_ml, *attn.scalar_args(), num_decode,
        NUM_HEADS=num_heads, GROUP=group, GROUP_PAD=pow2_at_least(group),
        HEAD_DIM=head_dim, BLOCK_D=block_d, BLOCK_N=BLOCK_N,
        BLOCK_SIZE=k_cache.shape[1], PARTITION=partition_size, NUM_SPLITS=num_splits,
        HAS_SEQ_IDS=seq_ids is not None, **attn.flags(),
    )
    if num_splits > 1:
        _decode_reduce_kernel[(num_decode, num_heads)](
            part_o, part_ml, attn.query_start_loc, ids, out,
            out.stride(0), out.stride(1), num_decode,
            NUM_HEADS=num_heads, HEAD_DIM=head_dim, BLOCK_D=block_d,
            NUM_SPLITS=num_splits, SPLITS_PAD=triton.next_power_of_2(num_splits),
            HAS_SEQ_IDS=seq_ids is not None,
        )

