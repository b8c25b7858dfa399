"""The segmented LoRA matmul of a mixed batch (``LayerOps.lora_linear``) in two Triton kernels.

Layout (``ironlm.interfaces.lora``): A stacked (slots, parts * R, K), B.T (slots, R, N), one slot
per token (-1: none), the rank of each slot's adapter in ``slot_ranks``.

- shrink, grid (tokens, parts): shrunk[t, p*R : p*R + r] = x[t] @ A[s, p*R : p*R + r].T over
  K in blocks, float32 accumulation (the rest of the row is never read);
- expand, grid (tokens, N / BLOCK_N): each output row finds its part from the part sizes and
  adds the dot of its B row with its part's shrunk values, in float32.

Tokens without an adapter exit at once. One program per token reads its adapter's A and B
from L2 across the tokens that share it; sorting tokens by adapter (vLLM's SGMV) would batch
them into tile matmuls, which matters for long prefills with many adapters, not for decode.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

BLOCK_K = 64
BLOCK_N = 64
MAX_PARTS = 4


@triton.jit
def _shrink_kernel(
    x_ptr, a_ptr, out_ptr, slots_ptr, ranks_ptr,
    stride_x, stride_out,
    K, PR,  # PR: parts * R, the row count of one slot's A
    R: tl.constexpr,
    BLOCK_R: tl.constexpr,
    BLOCK_K: tl.constexpr,
):
    t = tl.program_id(0).to(tl.int64)
    p = tl.program_id(1)
    s = tl.load(slots_ptr + t)
    if s >= 0:
        r = tl.minimum(tl.load(ranks_ptr + s), R)
        rows = tl.arange(0, BLOCK_R)
        row_ok = rows < r
        acc = tl.zeros((BLOCK_R,), dtype=tl.float32)
        a_base = a_ptr + s.to(tl.int64) * PR * K + (p * R + rows).to(tl.int64)[:, None] * K
        for k0 in range(0, K, BLOCK_K):
            ks = k0 + tl.arange(0, BLOCK_K)
            k_ok = ks < K
            xv = tl.load(x_ptr + t * stride_x + ks, mask=k_ok, other=0.0).to(tl.float32)
            av = tl.load(a_base + ks[None, :], mask=row_ok[:, None] & k_ok[None, :],
                         other=0.0).to(tl.float32)
            acc += tl.sum(av * xv[None, :], axis=1)
        tl.store(out_ptr + t * stride_out + p * R + rows, acc, mask=row_ok)


@triton.jit
def _expand_kernel(
    y_ptr, b_ptr, shrunk_ptr, slots_ptr, ranks_ptr,
    stride_y, stride_shrunk,
    N, B1, B2, B3,  # where parts 1, 2, 3 start among the output rows (N when absent)
    R: tl.constexpr,
    BLOCK_R: tl.constexpr,
    BLOCK_N: tl.constexpr,
):
    t = tl.program_id(0).to(tl.int64)
    s = tl.load(slots_ptr + t)
    if s >= 0:
        r = tl.minimum(tl.load(ranks_ptr + s), R)
        rows = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
        row_ok = rows < N
        part = (rows >= B1).to(tl.int32) + (rows >= B2).to(tl.int32) + (rows >= B3).to(tl.int32)
        js = tl.arange(0, BLOCK_R)
        j_ok = js < r
        mask = row_ok[:, None] & j_ok[None, :]
        sv = tl.load(shrunk_ptr + t * stride_shrunk + part[:, None] * R + js[None, :],
                     mask=mask, other=0.0)
        bv = tl.load(b_ptr + s.to(tl.int64) * R * N + js.to(tl.int64)[None, :] * N
                     + rows[:, None], mask=mask, other=0.0).to(tl.float32)
        delta = tl.sum(sv * bv, axis=1)
        yp = y_ptr + t * stride_y + rows
        yv = tl.load(yp, mask=row_ok, other=0.0).to(tl.float32)
        tl.store(yp, (yv + delta).to(y_ptr.dtype.element_ty), mask=row_ok)


def lora_linear(
    y: torch.Tensor,  # (T, N), updated in place
    x: torch.Tensor,  # (T, K)
    lora_a: torch.Tensor,  # (S, P * R, K)
    lora_b: torch.Tensor,  # (S, R, N)
    slices: tuple[int, ...],  # (P,) output rows per part
    token_slots: torch.Tensor,  # (T,) int32
    slot_ranks: torch.Tensor,  # (S,) int32
) -> torch.Tensor:
    if len(slices) > MAX_PARTS:
        raise ValueError(f"lora_linear: at most {MAX_PARTS} parts, got {len(slices)}")
    t, n = y.shape
    if t == 0:
        return y
    k = x.shape[1]
    parts, rank = len(slices), lora_b.shape[1]
    if x.stride(1) != 1:
        x = x.contiguous()
    if y.stride(1) != 1:
        raise ValueError("lora_linear: y rows must be contiguous (it is updated in place)")
    a, b = lora_a.contiguous(), lora_b.contiguous()
    slots, ranks = token_slots.to(torch.int32).contiguous(), slot_ranks.to(torch.int32).contiguous()
    shrunk = torch.empty(t, parts * rank, dtype=torch.float32, device=y.device)
    block_r = triton.next_power_of_2(rank)
    _shrink_kernel[(t, parts)](
        x, a, shrunk, slots, ranks, x.stride(0), shrunk.stride(0), k, parts * rank,
        R=rank, BLOCK_R=block_r, BLOCK_K=BLOCK_K,
    )
    starts = [sum(slices[:i]) for i in range(1, MAX_PARTS)]
    starts = [st if i + 1 < parts else n for i, st in enumerate(starts)]  # absent parts: N
    _expand_kernel[(t, triton.cdiv(n, BLOCK_N))](
        y, b, shrunk, slots, ranks, y.stride(0), shrunk.stride(0), n, *starts,
        R=rank, BLOCK_R=block_r, BLOCK_N=BLOCK_N,
    )
    return y
