"""TEST FAKE: pure-torch references of torch_npu's paged-attention operators (see __init__)."""

from __future__ import annotations

from typing import Any, Sequence

import torch

_KERNEL_DTYPES = (torch.float16, torch.bfloat16)
_INT_MAX = 2147483647
_COMPRESSED = 2048


def _is_zero(value: Any) -> bool:
    return isinstance(value, (int, bool)) and not value


def _require(ok: bool, message: str) -> None:
    if not ok:
        raise RuntimeError(f"[torch_npu test fake] {message}")


def _gather(cache: torch.Tensor, table: torch.Tensor, length: int) -> torch.Tensor:
    """Rows 0..length-1 of one sequence from a (num_blocks, block_size, ...) cache."""
    block_size = cache.shape[1]
    n_blocks = -(-length // block_size)
    _require(n_blocks <= table.shape[0], f"{length} tokens need {n_blocks} blocks in the table")
    blocks = table[:n_blocks].long()
    _require(
        bool(((blocks >= 0) & (blocks < cache.shape[0])).all()),
        "block id outside [0, num_blocks)",
    )
    return cache[blocks].reshape(-1, *cache.shape[2:])[:length]


def _attend(
    q: torch.Tensor,  # (q_len, N, D)
    k: torch.Tensor,  # (kv_len, Hkv, D)
    v: torch.Tensor,  # (kv_len, Hkv, D)
    scale: float,
    masked: torch.Tensor | None,  # (q_len, kv_len) bool, True = not attended
) -> tuple[torch.Tensor, torch.Tensor]:  # out (q_len, N, D) float32, lse (N, q_len) float32
    group = q.shape[1] // k.shape[1]  # GQA: query head h reads kv head h // group
    kf = k.float().repeat_interleave(group, dim=1)
    vf = v.float().repeat_interleave(group, dim=1)
    scores = torch.einsum("qhd,khd->hqk", q.float(), kf) * scale
    if masked is not None:
        scores = scores.masked_fill(masked.unsqueeze(0), float("-inf"))
    lse = torch.logsumexp(scores, dim=-1)
    probs = torch.nan_to_num(torch.softmax(scores, dim=-1), nan=0.0)  # all-masked rows -> 0
    return torch.einsum("hqk,khd->qhd", probs, vf), lse


def _npu_reshape_and_cache(
    key: torch.Tensor,
    value: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    slot_indices: torch.Tensor,
) -> None:
    """Schema: _npu_reshape_and_cache(Tensor key, Tensor value, Tensor(a!) key_cache,
    Tensor(b!) value_cache, Tensor slot_indices) -> ().

    ATB ReshapeAndCacheOperation: key/value (num_tokens, num_head, head_size); caches
    (num_blocks, block_size, num_head, head_size) updated in place; slotMapping (num_tokens,)
    int32, slot = block * block_size + offset (negative slots are skipped)."""
    _require(key.dim() == 3 and value.shape == key.shape, "key/value must be (T, heads, dim)")
    _require(key_cache.dim() == 4 and value_cache.shape == key_cache.shape, "caches must be 4-D")
    _require(key_cache.shape[2:] == key.shape[1:], "cache (heads, dim) must match key")
    _require(
        key.dtype == value.dtype == key_cache.dtype == value_cache.dtype,
        "key, value and caches must share one dtype",
    )
    _require(slot_indices.dtype == torch.int32, "slot_indices must be int32")
    _require(slot_indices.shape == (key.shape[0],), "slot_indices must be (num_tokens,)")
    _require(key_cache.is_contiguous() and value_cache.is_contiguous(), "caches must be dense")
    valid = slot_indices >= 0
    slots = slot_indices[valid].long()
    _require(bool((slots < key_cache.shape[0] * key_cache.shape[1]).all()), "slot out of range")
    key_cache.view(-1, *key_cache.shape[2:])[slots] = key[valid]
    value_cache.view(-1, *value_cache.shape[2:])[slots] = value[valid]


def _npu_paged_attention(
    query: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    num_kv_heads: int,
    num_heads: int,
    scale_value: float,
    block_table: torch.Tensor,
    context_lens: torch.Tensor,
    out: torch.Tensor,
) -> None:
    """Schema: _npu_paged_attention(Tensor query, Tensor key_cache, Tensor value_cache,
    int num_kv_heads, int num_heads, float scale_value, Tensor block_table,
    Tensor context_lens, Tensor(a!) out) -> ().

    ATB PagedAttentionOperation: query (num_tokens, num_heads, head_size), one token per
    sequence attending to its first context_lens[t] cached tokens; caches
    (num_blocks, block_size, kv_heads, head_size); block_tables (num_tokens, max_blocks) int32;
    contextLens (num_tokens,) int32 host tensor; block_size * head_size <= 128 * 128."""
    _require(query.dim() == 3 and query.shape[1] == num_heads, "query must be (T, num_heads, D)")
    _require(query.dtype in _KERNEL_DTYPES, f"query dtype {query.dtype} is not fp16/bf16")
    _require(key_cache.dtype == value_cache.dtype == query.dtype, "cache dtype != query dtype")
    _require(key_cache.dim() == 4 and key_cache.shape[2] == num_kv_heads, "bad key_cache shape")
    _require(key_cache.shape[3] == query.shape[2], "cache head_size != query head_size")
    _require(num_heads % num_kv_heads == 0, "num_heads must be a multiple of num_kv_heads")
    _require(key_cache.shape[1] * query.shape[2] <= 128 * 128, "block_size * head_size > 128*128")
    tokens = query.shape[0]
    _require(block_table.dtype == torch.int32 and block_table.shape[0] == tokens, "block_table")
    _require(context_lens.dtype == torch.int32 and context_lens.shape == (tokens,), "context_lens")
    _require(context_lens.device.type == "cpu", "context_lens must be a host tensor")
    _require(out.shape == query.shape and out.dtype == query.dtype, "out must be like query")
    for t in range(tokens):
        length = int(context_lens[t])
        _require(length > 0, "context_lens must be positive")
        keys = _gather(key_cache, block_table[t], length)
        values = _gather(value_cache, block_table[t], length)
        result, _ = _attend(query[t : t + 1], keys, values, float(scale_value), None)
        out[t] = result[0].to(out.dtype)


def _lengths(value: Sequence[int] | torch.Tensor | None, batch: int, default: int) -> list[int]:
    """FIA rule: length 1 -> every batch uses it; length >= B -> the first B values."""
    if value is None:
        return [default] * batch
    values = [int(x) for x in (value.tolist() if isinstance(value, torch.Tensor) else value)]
    _require(len(values) == 1 or len(values) >= batch, "seq-length list shorter than batch")
    return values * batch if len(values) == 1 else values[:batch]


def _mask_rows(
    atten_mask: torch.Tensor | None,
    sparse_mode: int,
    b: int,
    q_len: int,
    kv_len: int,
    q_s: int,
    kv_span: int,
) -> torch.Tensor | None:
    """(q_len, kv_len) bool (True = masked) for batch b, or None."""
    if q_s == 1:  # IncreFlashAttention branch: sparse_mode is ignored
        if atten_mask is None:
            return None
        flat = atten_mask.reshape(atten_mask.shape[0], -1)  # (B, KV_S) from (B,[1,[1,]]KV_S)
        _require(flat.shape[1] >= kv_span, "mask KV_S < maxBlockNumPerSeq * blockSize")
        return flat[b, :kv_len].bool().unsqueeze(0)
    if sparse_mode == 0:
        if atten_mask is None:
            return None
        full = atten_mask if atten_mask.dim() > 2 else atten_mask.unsqueeze(0)
        full = full.reshape(full.shape[0], full.shape[-2], full.shape[-1])  # (B or 1, S, KV_S)
        _require(full.shape[1] >= q_s and full.shape[2] >= kv_span, "mask smaller than S x KV_S")
        return full[b if full.shape[0] > 1 else 0, :q_len, :kv_len].bool()
    if sparse_mode == 3:
        _require(atten_mask is not None, "sparse_mode=3 needs the 2048x2048 compressed mask")
        assert atten_mask is not None
        square = atten_mask.reshape(atten_mask.shape[-2], atten_mask.shape[-1])
        _require(square.shape == (_COMPRESSED, _COMPRESSED), "sparse_mode=3 mask must be 2048^2")
        upper = torch.ones(_COMPRESSED, _COMPRESSED, device=square.device).triu(1).bool()
        _require(bool((square.bool() == upper).all()), "sparse_mode=3 mask must be triu(1)")
        # rightDownCausal: the diagonal ends at the last query and the last key
        i = torch.arange(q_len).unsqueeze(1)
        j = torch.arange(kv_len).unsqueeze(0)
        return j > i + (kv_len - q_len)
    raise NotImplementedError(f"[torch_npu test fake] sparse_mode={sparse_mode} is not modelled")


def npu_fused_infer_attention_score(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    *,
    atten_mask: torch.Tensor | None = None,
    actual_seq_lengths: Sequence[int] | torch.Tensor | None = None,
    actual_seq_lengths_kv: Sequence[int] | torch.Tensor | None = None,
    block_table: torch.Tensor | None = None,
    num_heads: int = 1,
    scale: float = 1.0,
    pre_tokens: int = _INT_MAX,
    next_tokens: int = _INT_MAX,
    input_layout: str = "BSH",
    num_key_value_heads: int = 0,
    sparse_mode: int = 0,
    inner_precise: int = 0,
    block_size: int = 0,
    softmax_lse_flag: bool = False,
    **unmodelled: Any,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Documented prototype: npu_fused_infer_attention_score(Tensor query, Tensor key,
    Tensor value, *, Tensor? pse_shift=None, Tensor? atten_mask=None,
    SymInt[]? actual_seq_lengths=None, SymInt[]? actual_seq_lengths_kv=None, ...,
    Tensor? block_table=None, ..., int num_heads=1, float scale=1.0,
    int pre_tokens=2147483647, int next_tokens=2147483647, str input_layout="BSH",
    int num_key_value_heads=0, int sparse_mode=0, int inner_precise=0, int block_size=0,
    int antiquant_mode=0, bool softmax_lse_flag=False, ...) -> (Tensor, Tensor)

    Modelled: page attention (block_table, caches (blocknum, blocksize, H)) with BSH/BSND
    queries, GQA, right-padded queries via actual_seq_lengths, sparse_mode 0 (no mask or a full
    mask) and 3 (rightDownCausal with the compressed 2048x2048 mask). Anything else raises."""
    used = sorted(k for k, v in unmodelled.items() if v is not None and not _is_zero(v))
    if used:
        raise NotImplementedError(f"[torch_npu test fake] arguments not modelled: {used}")
    _require(inner_precise in (0, 1, 2, 3), "inner_precise must be 0..3")
    if input_layout == "BSH":
        _require(query.dim() == 3, "BSH query must be 3-D")
        query4 = query.view(query.shape[0], query.shape[1], num_heads, -1)
    elif input_layout == "BSND":
        _require(query.dim() == 4 and query.shape[2] == num_heads, "BSND query must be (B,S,N,D)")
        query4 = query
    else:
        raise NotImplementedError(f"[torch_npu test fake] input_layout {input_layout!r}")
    if block_table is None:
        raise NotImplementedError("[torch_npu test fake] only page attention is modelled")
    batch, q_s, _, head_dim = query4.shape
    kv_heads = num_key_value_heads or num_heads
    _require(num_heads % kv_heads == 0 and num_heads // kv_heads <= 64, "bad GQA head counts")
    _require(query.dtype in _KERNEL_DTYPES, f"query dtype {query.dtype} is not fp16/bf16")
    _require(key.dtype == value.dtype == query.dtype, "key/value dtype must match query")
    _require(key.dim() == 3 and value.shape == key.shape, "page-attention caches: (blocks, bs, H)")
    _require(key.shape[2] == kv_heads * head_dim, "cache H != num_key_value_heads * D")
    _require(block_size == key.shape[1], "block_size must equal the caches' block size")
    _require(block_size % 128 == 0 and 128 <= block_size <= 512, "block_size: 128..512, x128")
    _require(block_table.dtype == torch.int32 and block_table.dim() == 2, "block_table int32 2-D")
    _require(block_table.shape[0] == batch, "block_table rows must equal B")
    _require(actual_seq_lengths_kv is not None, "page attention needs actual_seq_lengths_kv")
    if q_s > 1 and sparse_mode == 0 and (pre_tokens, next_tokens) != (_INT_MAX, _INT_MAX):
        raise NotImplementedError("[torch_npu test fake] pre_tokens/next_tokens bands")
    q_lens = _lengths(actual_seq_lengths, batch, q_s)
    kv_lens = _lengths(actual_seq_lengths_kv, batch, 0)
    kv_span = -(-max(kv_lens) // block_size) * block_size
    caches = (key.view(key.shape[0], block_size, kv_heads, head_dim),
              value.view(value.shape[0], block_size, kv_heads, head_dim))
    out = torch.zeros_like(query4)
    lse = torch.zeros(batch, num_heads, q_s, 1, dtype=torch.float32)
    for b in range(batch):
        q_len, kv_len = q_lens[b], kv_lens[b]
        _require(0 < q_len <= q_s and kv_len > 0, "bad actual sequence lengths")
        keys = _gather(caches[0], block_table[b], kv_len)
        values = _gather(caches[1], block_table[b], kv_len)
        masked = _mask_rows(atten_mask, sparse_mode, b, q_len, kv_len, q_s, kv_span)
        result, row_lse = _attend(query4[b, :q_len], keys, values, float(scale), masked)
        out[b, :q_len] = result.to(out.dtype)
        lse[b, :, :q_len, 0] = row_lse
    attention_out = out.view(query.shape)
    if not softmax_lse_flag:
        return attention_out, torch.zeros(1, dtype=torch.float32)
    return attention_out, lse
