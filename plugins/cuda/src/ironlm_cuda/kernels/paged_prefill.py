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

from ironlm_cuda.kernels.common import FP8_MAX, dot, pow2_at_least, soft_cap, upcast_dot_operands

BLOCK_N = 32  # keys per inner tile
LOG2E = 1.4426950408889634


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

    m_i = tl.full([BLOCK_M], -1.0e30, tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
    table = block_tables_ptr + seq.to(tl.int64) * stride_bt
    for n0 in range(start, end, BLOCK_N):
        kpos = n0 + tl.arange(0, BLOCK_N)  # (BLOCK_N,)
        k_ok = kpos < end
        block = tl.load(table + kpos // BLOCK_SIZE, mask=k_ok, other=0).to(tl.int64)
        src = block * stride_cb + (kpos % BLOCK_SIZE) * stride_cs + kv_head * stride_ch
        kv_mask = k_ok[:, None] & dim_ok[None, :]
        k = tl.load(k_cache_ptr + src[:, None] + dims[None, :], mask=kv_mask, other=0.0)
        v = tl.load(v_cache_ptr + src[:, None] + dims[None, :], mask=kv_mask, other=0.0)
        if FP8:
            k = k.to(tl.float32) * k_scale
            v = v.to(tl.float32) * v_scale
        k = k.to(q.dtype)  # (BLOCK_N, BLOCK_D)
        v = v.to(q.dtype)
        s = dot(q, tl.trans(k), IEEE)  # (BLOCK_M, BLOCK_N)
        if USE_CAP:
            s = soft_cap(s * qk_scale, cap) * 1.4426950408889634  # log2(e)
        else:
            s = s * qk_scale
        allowed = (kpos[None, :] <= pos[:, None]) & k_ok[None, :]
        if USE_WINDOW:
            allowed = allowed & (pos[:, None] - kpos[None, :] < window)
        s = tl.where(allowed, s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))
        alpha = tl.exp2(m_i - m_new)
        p = tl.exp2(s - m_new[:, None])
        l_i = l_i * alpha + tl.sum(p, 1)
        acc = acc * alpha[:, None] + dot(p.to(v.dtype), v, IEEE)
        m_i = m_new

    out = acc / tl.where(l_i > 0.0, l_i, 1.0)[:, None]
    dst = out_ptr + toks[:, None] * stride_ot + head * stride_oh + dims[None, :]
    tl.store(dst, out.to(out_ptr.dtype.element_ty), mask=q_mask)


def paged_prefill(
    out: torch.Tensor,  # (num_tokens, num_heads, head_dim), written at the prefill tokens' rows
    q: torch.Tensor,  # (num_tokens, num_heads, head_dim)
    kv_cache: torch.Tensor,  # (2, num_blocks, block_size, num_kv_heads, head_dim)
    block_tables: torch.Tensor,  # (num_seqs, max_blocks) int32
    seq_lens: torch.Tensor,  # (num_seqs,) int32
    query_start_loc: torch.Tensor,  # (num_seqs + 1,) int32
    qblock_seq: torch.Tensor,  # (num_qblocks,) int32
    qblock_start: torch.Tensor,  # (num_qblocks,) int32
    block_m: int,  # new tokens per query block (what qblock_start was built with)
    scale: float,
    sliding_window: int | None = None,
    soft_cap_value: float | None = None,
    k_scale: float = 1.0,
    v_scale: float = 1.0,
) -> None:
    """Causal attention of the query blocks' new tokens over their sequences' paged context."""
    num_qblocks = qblock_seq.shape[0]
    if num_qblocks == 0:
        return
    _, num_heads, head_dim = q.shape
    k_cache, v_cache = kv_cache[0], kv_cache[1]
    upcast = upcast_dot_operands(q.dtype, q.device)
    use_cap = soft_cap_value is not None
    _prefill_kernel[(num_qblocks, num_heads)](
        q, k_cache, v_cache, out, block_tables, seq_lens, query_start_loc, qblock_seq, qblock_start,
        scale if use_cap else scale * LOG2E,
        float(soft_cap_value or 1.0), float(k_scale), float(v_scale), int(sliding_window or 0),
        q.stride(0), q.stride(1), out.stride(0), out.stride(1),
        k_cache.stride(0), k_cache.stride(1), k_cache.stride(2), block_tables.stride(0),
        GROUP=num_heads // k_cache.shape[2], HEAD_DIM=head_dim, BLOCK_D=pow2_at_least(head_dim),
        BLOCK_M=block_m, BLOCK_N=BLOCK_N, BLOCK_SIZE=k_cache.shape[1],
        USE_WINDOW=sliding_window is not None, USE_CAP=use_cap,
        FP8=kv_cache.dtype in FP8_MAX, UPCAST=upcast, IEEE=q.dtype == torch.float32 or upcast,
    )
