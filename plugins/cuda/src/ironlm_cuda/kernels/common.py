"""Pieces shared by the attention kernels: tile sizes, tanh soft cap, fp8 limits, dots, and the
online-softmax loop over a sequence's paged keys and values."""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

# float8 dtypes the KV cache may use -> the largest finite value (values are clamped to it).
FP8_MAX: dict[torch.dtype, float] = {
    torch.float8_e4m3fn: 448.0,
    torch.float8_e5m2: 57344.0,
}
# float8 dtype -> (mantissa bits, smallest normal, spacing of the subnormals)
FP8_GRID: dict[torch.dtype, tuple[int, float, float]] = {
    torch.float8_e4m3fn: (3, 2.0**-6, 2.0**-9),
    torch.float8_e5m2: (2, 2.0**-14, 2.0**-16),
}
BLOCK_N = 32  # keys per inner tile of the attention kernels
LOG2E = 1.4426950408889634


def pow2_at_least(n: int, floor: int = 16) -> int:
    """Next power of two >= n, at least ``floor`` (tl.dot needs every dimension >= 16)."""
    return max(floor, triton.next_power_of_2(n))


def upcast_dot_operands(dtype: torch.dtype, device: torch.device) -> bool:
    """Whether the kernels should feed tl.dot float32 operands instead of ``dtype``.

    The Triton interpreter (CPU tensors) computes bfloat16 dots wrongly, so there bf16 operands
    are widened to float32; on a GPU the native bf16 tensor-core dot is used.
    """
    return dtype == torch.bfloat16 and device.type != "cuda"


@dataclass(frozen=True)
class PagedAttention:
    """One layer's attention step over the paged KV cache: what the decode and the prefill
    launcher both take (each adds the metadata of its own share of the batch)."""

    out: torch.Tensor  # (num_tokens, num_heads, head_dim): each launcher writes its tokens' rows
    q: torch.Tensor  # (num_tokens, num_heads, head_dim)
    kv_cache: torch.Tensor  # (2, num_blocks, block_size, num_kv_heads, head_dim)
    block_tables: torch.Tensor  # (num_seqs, max_blocks) int32
    seq_lens: torch.Tensor  # (num_seqs,) int32
    query_start_loc: torch.Tensor  # (num_seqs + 1,) int32
    scale: float
    sliding_window: int | None = None
    soft_cap_value: float | None = None
    k_scale: float = 1.0
    v_scale: float = 1.0

    def scalar_args(self) -> tuple[float | int, ...]:
        """The arguments both kernels take after their pointers, in their order: qk_scale, cap,
        k_scale, v_scale, window, then the q / out / cache / block-table strides. log2(e) is
        folded into qk_scale unless soft-capping (then attend_paged_kv applies it after the
        cap)."""
        q, out, k_cache = self.q, self.out, self.kv_cache[0]
        return (
            self.scale if self.soft_cap_value is not None else self.scale * LOG2E,
            float(self.soft_cap_value or 1.0), float(self.k_scale), float(self.v_scale),
            int(self.sliding_window or 0),
            q.stride(0), q.stride(1), out.stride(0), out.stride(1),
            k_cache.stride(0), k_cache.stride(1), k_cache.stride(2), self.block_tables.stride(0),
        )

    def flags(self) -> dict[str, bool]:
        """The constexpr switches both kernels take (and hand on to attend_paged_kv)."""
        upcast = upcast_dot_operands(self.q.dtype, self.q.device)
        return dict(
            USE_WINDOW=self.sliding_window is not None, USE_CAP=self.soft_cap_value is not None,
            FP8=self.kv_cache.dtype in FP8_MAX, UPCAST=upcast,
            IEEE=self.q.dtype == torch.float32 or upcast,
        )


@triton.jit
def soft_cap(scores, cap):
    """cap * tanh(scores / cap), with tanh(x) = 2 * sigmoid(2x) - 1 (stable at both ends)."""
    return cap * (2.0 * tl.sigmoid(2.0 * scores / cap) - 1.0)


@triton.jit
def dot(a, b, IEEE: tl.constexpr):
    """a @ b accumulated in float32; IEEE: exact float32 products (no TF32), for fp32 models."""
    if IEEE:
        return tl.dot(a, b, input_precision="ieee")
    else:
        return tl.dot(a, b)


@triton.jit
def attend_paged_kv(
    q,  # (ROWS, BLOCK_D): query rows that share one KV head
    pos,  # (ROWS,) absolute position of each query row; read only when CAUSAL
    start, end,  # visit the keys at positions [start, end)
    table,  # the sequence's row of the block table (pointer)
    k_cache_ptr,  # (num_blocks, block_size, num_kv_heads, head_dim)
    v_cache_ptr,
    kv_head,
    qk_scale,  # softmax scale * log2(e); just the scale when soft-capping (log2(e) after the cap)
    cap, k_scale, v_scale, window,
    stride_cb, stride_cs, stride_ch,
    ROWS: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_N: tl.constexpr,
    BLOCK_SIZE: tl.constexpr, CAUSAL: tl.constexpr, WINDOW: tl.constexpr,
    USE_CAP: tl.constexpr, FP8: tl.constexpr, IEEE: tl.constexpr,
):
    """Online softmax of ``q`` over keys [start, end), BLOCK_N keys a tile, each key gathered
    through the block table. CAUSAL: row r sees only keys at positions <= pos[r], and with
    WINDOW only those within ``window`` of it. Returns (acc, m_i, l_i): the unnormalised output
    (ROWS, BLOCK_D) float32, and per row the running max (log2 units) and sum; a row that saw
    no key has l_i = 0."""
    dims = tl.arange(0, BLOCK_D)
    dim_ok = dims < HEAD_DIM
    m_i = tl.full([ROWS], -1.0e30, tl.float32)
    l_i = tl.zeros([ROWS], tl.float32)
    acc = tl.zeros([ROWS, BLOCK_D], tl.float32)
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
        s = dot(q, tl.trans(k), IEEE)  # (ROWS, BLOCK_N)
        if USE_CAP:
            s = soft_cap(s * qk_scale, cap) * 1.4426950408889634  # log2(e)
        else:
            s = s * qk_scale
        if CAUSAL:
            allowed = (kpos[None, :] <= pos[:, None]) & k_ok[None, :]
            if WINDOW:
                allowed = allowed & (pos[:, None] - kpos[None, :] < window)
            s = tl.where(allowed, s, float("-inf"))
        else:
            s = tl.where(k_ok[None, :], s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))
        alpha = tl.exp2(m_i - m_new)
        p = tl.exp2(s - m_new[:, None])
        l_i = l_i * alpha + tl.sum(p, 1)
        acc = acc * alpha[:, None] + dot(p.to(v.dtype), v, IEEE)
        m_i = m_new
    return acc, m_i, l_i


@triton.jit
def round_to_fp8_grid(x, MANT_BITS: tl.constexpr, MIN_NORMAL: tl.constexpr,
                      SUB_SPACING: tl.constexpr, LIMIT: tl.constexpr):
    """float32 x -> the nearest float8 value (ties to even, saturating at +-LIMIT), still in
    float32, so that the cast to float8 that follows is exact. Rounding here rather than in the
    cast gives one defined quantisation on every device (Triton's interpreter rounds fp8 casts
    wrongly: it drops the carry into the exponent)."""
    ax = tl.abs(x)
    # normals: round the float32 mantissa to MANT_BITS bits, ties to even, carry into the exponent
    bits = ax.to(tl.int32, bitcast=True)
    drop: tl.constexpr = 23 - MANT_BITS
    lsb = (bits >> drop) & 1
    bits = (bits + ((1 << (drop - 1)) - 1) + lsb) & ~((1 << drop) - 1)
    normal = bits.to(tl.float32, bitcast=True)
    # subnormals: a fixed spacing; adding 2^23 * spacing makes the float32 add round to it
    magic = SUB_SPACING * 8388608.0
    sub = (ax + magic) - magic
    r = tl.minimum(tl.where(ax < MIN_NORMAL, sub, normal), LIMIT)
    return tl.where(x < 0, -r, r)
