"""The cuda plugin's Triton attention kernels against the core's pure-torch reference.

Without a GPU the kernels run on CPU tensors in Triton's interpreter (TRITON_INTERPRET=1, set
here before anything imports triton); with one they run natively on it. Shapes are small: the
interpreter is slow.
"""

from __future__ import annotations

import os

import pytest
import torch

if not torch.cuda.is_available():
    os.environ["TRITON_INTERPRET"] = "1"  # before triton is imported (the kernels import it lazily)

from ironlm.attention.batch import random_paged_batch  # noqa: E402
from ironlm.attention.reference import ReferenceAttentionBackend  # noqa: E402
from ironlm.interfaces.attention import AttentionLayerSpec  # noqa: E402
from ironlm_cuda.triton_attention import TritonAttentionBackend  # noqa: E402

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
BLOCK_SIZE = 16
TOL = {
    torch.float32: dict(atol=2e-5, rtol=2e-5),
    torch.float16: dict(atol=4e-3, rtol=4e-3),
    torch.bfloat16: dict(atol=3e-2, rtol=3e-2),
}


def run_both(
    context_lens: list[int],
    query_lens: list[int],
    num_heads: int,
    num_kv_heads: int,
    head_dim: int,
    dtype: torch.dtype = torch.float32,
    sliding_window: int | None = None,
    soft_cap: float | None = None,
    q_gain: float = 1.0,
    seed: int = 0,
    **options: object,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """(triton out, reference out, triton cache, reference cache) of one forward over a random
    paged cache whose cached context is random too."""
    gen = torch.Generator().manual_seed(seed)
    need = sum(-(-(c + q) // BLOCK_SIZE) for c, q in zip(context_lens, query_lens))
    num_blocks = need + 3
    batch = random_paged_batch(context_lens, query_lens, BLOCK_SIZE, num_blocks, gen, DEVICE)
    layer = AttentionLayerSpec(
        0, num_heads, num_kv_heads, head_dim, head_dim**-0.5, sliding_window, soft_cap
    )
    options = {"decode_partition_size": 32, "prefill_block_m": 16, **options}
    backend = TritonAttentionBackend(**options)
    shape = backend.kv_cache_shape(num_blocks, BLOCK_SIZE, num_kv_heads, head_dim)
    cache = torch.randn(shape, generator=gen).to(DEVICE, dtype)
    ref_cache = cache.clone()
    tokens = sum(query_lens)
    q = (torch.randn(tokens, num_heads, head_dim, generator=gen) * q_gain).to(DEVICE, dtype)
    k = torch.randn(tokens, num_kv_heads, head_dim, generator=gen).to(DEVICE, dtype)
    v = torch.randn(tokens, num_kv_heads, head_dim, generator=gen).to(DEVICE, dtype)
    out = backend.forward(layer, q, k, v, cache, backend.build_metadata(batch))
    ref = ReferenceAttentionBackend().forward(layer, q, k, v, ref_cache, batch)
    return out, ref, cache, ref_cache


def check(
    out: torch.Tensor, ref: torch.Tensor, cache: torch.Tensor, ref_cache: torch.Tensor
) -> None:
    assert out.dtype == ref.dtype and out.shape == ref.shape
    assert torch.equal(cache, ref_cache)  # the KV write stores exactly what the reference stores
    torch.testing.assert_close(out, ref, **TOL[out.dtype])


GQA_HEADS = [(4, 4, 64), (4, 1, 128), (8, 2, 64)]  # (num_heads, num_kv_heads, head_dim)


def heads_id(heads: tuple[int, int, int]) -> str:
    return f"H{heads[0]}-KV{heads[1]}-D{heads[2]}"


@pytest.mark.parametrize("heads", GQA_HEADS, ids=heads_id)
def test_decode_split_k_across_block_boundaries(heads: tuple[int, int, int]) -> None:
    # contexts 15..79 cross 16-token blocks and the 32-key partitions (up to 3 splits + reduce)
    check(*run_both([14, 15, 16, 31, 47, 79], [1] * 6, *heads))


def test_decode_single_split_writes_output_directly() -> None:
    check(*run_both([5, 33, 60], [1, 1, 1], 4, 1, 64, decode_partition_size=256))


@pytest.mark.parametrize("heads", GQA_HEADS, ids=heads_id)
def test_prefill(heads: tuple[int, int, int]) -> None:
    # query blocks of 16: lengths below, at and across block boundaries
    check(*run_both([0, 0, 0, 0], [3, 16, 17, 34], *heads))


@pytest.mark.parametrize("heads", GQA_HEADS[:2], ids=heads_id)
def test_chunked_prefill_over_cached_context(heads: tuple[int, int, int]) -> None:
    check(*run_both([16, 7, 30, 45], [9, 20, 3, 2], *heads))


@pytest.mark.parametrize("heads", GQA_HEADS, ids=heads_id)
def test_mixed_prefill_and_decode_in_one_forward(heads: tuple[int, int, int]) -> None:
    check(*run_both([20, 0, 33, 5, 64], [1, 18, 1, 12, 1], *heads))


@pytest.mark.parametrize("window", [1, 8, 20])
def test_sliding_window(window: int) -> None:
    out, ref, cache, ref_cache = run_both(
        [20, 0, 33, 5, 70], [1, 18, 1, 12, 1], 4, 1, 64, sliding_window=window
    )
    check(out, ref, cache, ref_cache)
    full, *_ = run_both([20, 0, 33, 5, 70], [1, 18, 1, 12, 1], 4, 1, 64)
    assert not torch.allclose(out, full)  # the window did cut something


def test_sliding_window_chunked_prefill_gqa4_head128() -> None:
    check(*run_both([40, 3], [5, 30], 4, 1, 128, sliding_window=11))


def test_logits_soft_cap() -> None:
    # q scaled up so that raw scores exceed the cap and the cap changes the result
    args = ([20, 0, 33, 5], [1, 18, 1, 12], 4, 1, 64)
    out, ref, cache, ref_cache = run_both(*args, soft_cap=2.0, q_gain=4.0)
    check(out, ref, cache, ref_cache)
    uncapped, *_ = run_both(*args, q_gain=4.0)
    assert not torch.allclose(out, uncapped, atol=1e-3)


def test_soft_cap_with_window_and_gqa() -> None:
    check(*run_both([50, 9], [1, 20], 8, 2, 128, sliding_window=16, soft_cap=3.0, q_gain=3.0))


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
@pytest.mark.parametrize("heads", [(4, 1, 64), (4, 4, 128)], ids=heads_id)
def test_half_precision_mixed(dtype: torch.dtype, heads: tuple[int, int, int]) -> None:
    check(*run_both([20, 0, 40, 5], [1, 18, 1, 12], *heads, dtype=dtype))


def test_head_dim_not_a_power_of_two() -> None:
    check(*run_both([17, 0], [1, 19], 4, 2, 80))


def test_strided_qkv_views_of_a_fused_projection() -> None:
    gen = torch.Generator().manual_seed(3)
    num_heads, num_kv_heads, head_dim = 4, 2, 64
    batch = random_paged_batch([9, 0], [1, 20], BLOCK_SIZE, 6, gen, DEVICE)
    qkv = torch.randn(21, (num_heads + 2 * num_kv_heads) * head_dim, generator=gen).to(DEVICE)
    sizes = [num_heads * head_dim, num_kv_heads * head_dim, num_kv_heads * head_dim]
    q, k, v = qkv.split(sizes, dim=-1)
    q = q.view(21, num_heads, head_dim)  # strided views, as the model passes them
    k, v = k.view(21, num_kv_heads, head_dim), v.view(21, num_kv_heads, head_dim)
    layer = AttentionLayerSpec(0, num_heads, num_kv_heads, head_dim, 0.125)
    backend = TritonAttentionBackend(decode_partition_size=32, prefill_block_m=16)
    cache = torch.randn(backend.kv_cache_shape(6, BLOCK_SIZE, num_kv_heads, head_dim),
                        generator=gen).to(DEVICE)
    ref_cache = cache.clone()
    out = backend.forward(layer, q, k, v, cache, backend.build_metadata(batch))
    ref = ReferenceAttentionBackend().forward(layer, q, k, v, ref_cache, batch)
    check(out, ref, cache, ref_cache)


def test_graph_metadata_covers_the_longest_context() -> None:
    """A decode-graph batch as DecodeGraphs builds it: 4 static rows (the last one padding: slot
    -1, seq_len 1), block tables 8 blocks wide (max_seq_len 128), host lengths left at their
    capture-time 1s. The split count must come from max_seq_len: from the host lengths it would
    be 1, and rows past 32 keys would lose their later partitions."""
    from ironlm.interfaces.attention import AttentionBatch

    gen = torch.Generator().manual_seed(5)
    num_heads, num_kv_heads, head_dim, width = 4, 2, 64, 8
    real = random_paged_batch([9, 40, 70], [1, 1, 1], BLOCK_SIZE, 12, gen, DEVICE)
    tables = torch.zeros(4, width, dtype=torch.int32, device=DEVICE)
    tables[:3, : real.block_tables.shape[1]] = real.block_tables

    def padded(t: torch.Tensor, pad: int) -> torch.Tensor:
        return torch.cat([t, torch.tensor([pad], dtype=t.dtype, device=DEVICE)])

    static = AttentionBatch(
        query_start_loc=torch.arange(5, dtype=torch.int32, device=DEVICE),
        seq_lens=padded(real.seq_lens, 1), context_lens=padded(real.context_lens, 0),
        block_tables=tables, slot_mapping=padded(real.slot_mapping, -1), block_size=BLOCK_SIZE,
        max_query_len=1, max_seq_len=width * BLOCK_SIZE, query_lens_cpu=[1] * 4,
        seq_lens_cpu=[1] * 4,
    )  # fmt: skip
    backend = TritonAttentionBackend(decode_partition_size=32)
    meta = backend.graph_metadata(static)
    assert meta.decode_seq_ids is None and meta.num_splits == 4
    backend.refresh_graph_metadata(meta, static)
    layer = AttentionLayerSpec(0, num_heads, num_kv_heads, head_dim, head_dim**-0.5)
    cache = torch.randn(backend.kv_cache_shape(12, BLOCK_SIZE, num_kv_heads, head_dim),
                        generator=gen).to(DEVICE)
    ref_cache = cache.clone()
    q = torch.randn(4, num_heads, head_dim, generator=gen).to(DEVICE)
    k, v = (torch.randn(4, num_kv_heads, head_dim, generator=gen).to(DEVICE) for _ in range(2))
    out = backend.forward(layer, q, k, v, cache, meta)
    ref = ReferenceAttentionBackend().forward(layer, q[:3], k[:3], v[:3], ref_cache, real)
    check(out[:3], ref, cache, ref_cache)  # the padding row wrote nothing


def test_graph_metadata_caps_the_partitions_at_long_limits() -> None:
    """A 131072-token limit would be 4096 partitions of 32 keys in every replay: the graph's
    partitions grow instead, to at most GRAPH_MAX_SPLITS (the eager path is unchanged)."""
    from ironlm.interfaces.attention import AttentionBatch
    from ironlm_cuda.triton_attention import GRAPH_MAX_SPLITS

    longest = 131072
    static = AttentionBatch(
        query_start_loc=torch.arange(3, dtype=torch.int32),
        seq_lens=torch.ones(2, dtype=torch.int32), context_lens=torch.zeros(2, dtype=torch.int32),
        block_tables=torch.zeros(2, longest // BLOCK_SIZE, dtype=torch.int32),
        slot_mapping=torch.full((2,), -1), block_size=BLOCK_SIZE, max_query_len=1,
        max_seq_len=longest, query_lens_cpu=[1, 1], seq_lens_cpu=[1, 1],
    )  # fmt: skip
    meta = TritonAttentionBackend(decode_partition_size=32).graph_metadata(static)
    assert meta.num_splits <= GRAPH_MAX_SPLITS
    assert meta.num_splits * meta.partition_size >= longest


def test_padding_slot_is_skipped_by_the_kv_write() -> None:
    from ironlm_cuda.kernels.kv_write import write_kv

    cache = torch.zeros(2, 3, BLOCK_SIZE, 2, 64, device=DEVICE)
    k = torch.ones(3, 2, 64, device=DEVICE)
    v = torch.full((3, 2, 64), 2.0, device=DEVICE)
    write_kv(cache, k, v, torch.tensor([17, -1, 5], device=DEVICE))
    flat = cache.view(2, -1, 2, 64)
    assert torch.equal(flat[0, 17], k[0]) and torch.equal(flat[1, 5], v[2])
    assert int((flat[0].abs().sum(dim=(1, 2)) > 0).sum()) == 2  # only slots 17 and 5 written


def test_metadata_split_and_graph_friendly_pure_decode() -> None:
    gen = torch.Generator().manual_seed(0)
    backend = TritonAttentionBackend(decode_partition_size=40, prefill_block_m=16)
    pure = backend.build_metadata(random_paged_batch([10, 90], [1, 1], BLOCK_SIZE, 12, gen))
    assert pure.decode_seq_ids is None and pure.num_decode == 2
    assert pure.partition_size == 64 and pure.num_splits == 2  # 40 rounds up to whole 32-key tiles
    mixed = backend.build_metadata(random_paged_batch([10, 0, 3], [1, 33, 1], BLOCK_SIZE, 12, gen))
    assert mixed.decode_seq_ids is not None and mixed.decode_seq_ids.tolist() == [0, 2]
    assert mixed.qblock_seq.tolist() == [1, 1, 1] and mixed.qblock_start.tolist() == [0, 16, 32]


# -- fp8 KV cache -----------------------------------------------------------------------------


def test_cache_dtype_api_and_option_validation() -> None:
    assert TritonAttentionBackend().cache_dtype(torch.bfloat16) == torch.bfloat16
    for option, dtype in (
        ("fp8", torch.float8_e4m3fn),
        ("fp8_e4m3", torch.float8_e4m3fn),
        ("fp8_e5m2", torch.float8_e5m2),
    ):
        assert TritonAttentionBackend(kv_cache_dtype=option).cache_dtype(torch.float16) == dtype
    with pytest.raises(ValueError, match="kv_cache_dtype='int4'"):
        TritonAttentionBackend(kv_cache_dtype="int4")
    with pytest.raises(ValueError, match="unknown options"):
        TritonAttentionBackend(block_sise=16)
    backend = TritonAttentionBackend(k_scale=0.5, v_scale=0.25, kv_scales={3: (2.0, 4.0)})
    assert backend.scales_of(0) == (0.5, 0.25) and backend.scales_of(3) == (2.0, 4.0)
    backend.set_kv_scales(1, 1.5, 1.5)
    assert backend.scales_of(1) == (1.5, 1.5)


@pytest.mark.parametrize("kv_cache_dtype", ["fp8_e4m3", "fp8_e5m2"])
def test_fp8_kv_cache(kv_cache_dtype: str) -> None:
    gen = torch.Generator().manual_seed(1)
    context_lens, query_lens = [20, 0, 33], [1, 18, 1]
    num_heads, num_kv_heads, head_dim = 4, 1, 64
    k_scale, v_scale = 0.05, 0.02
    backend = TritonAttentionBackend(
        kv_cache_dtype=kv_cache_dtype, decode_partition_size=32, prefill_block_m=16
    )
    backend.set_kv_scales(0, k_scale, v_scale)
    cache_dtype = backend.cache_dtype(torch.float32)
    num_blocks = 8
    batch = random_paged_batch(context_lens, query_lens, BLOCK_SIZE, num_blocks, gen, DEVICE)
    layer = AttentionLayerSpec(0, num_heads, num_kv_heads, head_dim, head_dim**-0.5)
    shape = backend.kv_cache_shape(num_blocks, BLOCK_SIZE, num_kv_heads, head_dim)
    true_cache = torch.randn(shape, generator=gen)  # what an unquantised cache would hold
    scales = torch.tensor([k_scale, v_scale]).view(2, 1, 1, 1, 1)
    cache = (true_cache / scales).to(DEVICE, cache_dtype)
    tokens = sum(query_lens)
    q = torch.randn(tokens, num_heads, head_dim, generator=gen).to(DEVICE)
    k = torch.randn(tokens, num_kv_heads, head_dim, generator=gen).to(DEVICE)
    v = torch.randn(tokens, num_kv_heads, head_dim, generator=gen).to(DEVICE)
    out = backend.forward(layer, q, k, v, cache, backend.build_metadata(batch))

    # the write quantises value / scale
    slots = batch.slot_mapping
    flat = cache.view(2, -1, num_kv_heads, head_dim)
    assert torch.equal(flat[0, slots], (k / k_scale).to(cache_dtype))
    assert torch.equal(flat[1, slots], (v / v_scale).to(cache_dtype))
    # exact given the quantised cache: the reference over the dequantised cache
    dequant = cache.float() * scales.to(DEVICE)
    dflat = dequant.view(2, -1, num_kv_heads, head_dim)
    ref = ReferenceAttentionBackend().forward(layer, q, dflat[0, slots], dflat[1, slots],
                                              dequant.clone(), batch)
    torch.testing.assert_close(out, ref, atol=2e-5, rtol=2e-5)
    # loose against attention over the unquantised values
    true_ref = ReferenceAttentionBackend().forward(layer, q, k, v, true_cache.to(DEVICE), batch)
    loose = 0.1 if kv_cache_dtype == "fp8_e4m3" else 0.2
    torch.testing.assert_close(out, true_ref, atol=loose, rtol=loose)
