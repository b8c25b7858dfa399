"""Paged prefill / chunked-prefill attention: several new tokens per sequence.

Grid (num_query_blocks, num_heads): each program takes BLOCK_M consecutive new tokens of one
sequence (``qblock_seq`` / ``qblock_start`` map a program to its sequence and first token) and one
query head, and runs an online softmax over the sequence's keys in the paged cache (the new
tokens' keys are written there first), gathered per position through the block table. New token t
of a sequence with ``ctx`` cached tokens sits at position ctx + t and sees keys j <= ctx + t
(and j > ctx + t - window with a sliding window).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ironlm_cuda.kernels.common import BLOCK_N, PagedAttention, attend_paged_kv, pow2_at_least


@triton.jit
def _prefill_kernel(
    q_ptr,  # (num_tokens, num_heads, head_dim)
    k_cache_ptr,  # (num_blocks, block_size, num_kv_heads, head_dim)
    v_cache_ptr,
    out_ptr,  # (num_tokens, num_heads, head_dim)
    block_tables_ptr,  # (num_seqs, max_blocks) int32
    seq_lens_ptr,  # (num_seqs,) int32
    query_start_ptr,  # (num_seqs + 1,) int32
    qblock_seq_ptr,  # (num_qblocks,) int32: the sequence of each query block
    qblock_start_ptr,  # (num_qblocks,) int32: its first new token, counted within the sequence
    qk_scale,  # softmax scale * log2(e); just the scale when soft-capping (log2(e) after the cap)
    cap, k_scale, v_scale, window,
    stride_qt, stride_qh, stride_ot, stride_oh,
    stride_cb, stride_cs, stride_ch, stride_bt,
    GROUP: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_SIZE: tl.constexpr,
    USE_WINDOW: tl.constexpr, USE_CAP: tl.constexpr,
    FP8: tl.constexpr, UPCAST: tl.constexpr, IEEE: tl.constexpr,
):
    qb = tl.program_id(0)
    head = tl.program_id(1)
    kv_head = head // GROUP
    seq = tl.load(qblock_seq_ptr + qb)
    first = tl.load(qblock_start_ptr + qb)
    tok0 = tl.load(query_start_ptr + seq)
    q_len = tl.load(query_start_ptr + seq + 1) - tok0
    seq_len = tl.load(seq_lens_ptr + seq)
    ctx = seq_len - q_len

    rows = first + tl.arange(0, BLOCK_M)  # (BLOCK_M,) new-token index within the sequence
    row_ok = rows < q_len
    pos = ctx + rows  # absolute positions of the queries
    dims = tl.arange(0, BLOCK_D)
    dim_ok = dims < HEAD_DIM
    toks = (tok0 + rows).to(tl.int64)
    q_mask = row_ok[:, None] & dim_ok[None, :]
    q = tl.load(q_ptr + toks[:, None] * stride_qt + head * stride_qh + dims[None, :], mask=q_mask,
                other=0.0)  # (BLOCK_M, BLOCK_D)
    if UPCAST:
        q = q.to(tl.float32)

    end = ctx + tl.minimum(first + BLOCK_M, q_len)  # one past the last key any row sees
    start = 0
    if USE_WINDOW:
        start = tl.maximum(ctx + first - window + 1, 0)

    acc, m_i, l_i = attend_paged_kv(
        q, pos, start, end, block_tables_ptr + seq.to(tl.int64) * stride_bt, k_cache_ptr,
        v_cache_ptr, kv_head, qk_scale, cap, k_scale, v_scale, window, stride_cb, stride_cs,
        stride_ch, ROWS=BLOCK_M, HEAD_DIM=HEAD_DIM, BLOCK_D=BLOCK_D, BLOCK_N=BLOCK_N,
        BLOCK_SIZE=BLOCK_SIZE, CAUSAL=True, WINDOW=USE_WINDOW, USE_CAP=USE_CAP, FP8=FP8, IEEE=IEEE,
    )

    out = acc / tl.where(l_i > 0.0, l_i, 1.0)[:, None]
    dst = out_ptr + toks[:, None] * stride_ot + head * stride_oh + dims[None, :]
    tl.store(dst, out.to(out_ptr.dtype.element_ty), mask=q_mask)


def paged_prefill(
    attn: PagedAttention,
    qblock_seq: torch.Tensor,  # (num_qblocks,) int32
    qblock_start: torch.Tensor,  # (num_qblocks,) int32
    block_m: int,  # new tokens per query block (what qblock_start was built with)
) -> None:
    """Causal attention of the query blocks' new tokens over their sequences' paged context."""
    num_qblocks = qblock_seq.shape[0]
    if num_qblocks == 0:
        return
    q = attn.q
    _, num_heads, head_dim = q.shape
    k_cache, v_cache = attn.kv_cache[0], attn.kv_cache[1]
    _prefill_kernel[(num_qblocks, num_heads)](
        q, k_cache, v_cache, attn.out, attn.block_tables, attn.seq_lens, attn.query_start_loc,
        qblock_seq, qblock_start, *attn.scalar_args(),
        GROUP=num_heads // k_cache.shape[2], HEAD_DIM=head_dim, BLOCK_D=pow2_at_least(head_dim),
        BLOCK_M=block_m, BLOCK_N=BLOCK_N, BLOCK_SIZE=k_cache.shape[1], **attn.flags(),
    )
