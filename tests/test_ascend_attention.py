"""AscendAttentionBackend against the core reference backend, with the torch_npu TEST FAKE
(tests/fakes/torch_npu) on sys.path. Proves the plugin drives the documented operators correctly;
says nothing about the NPU kernels themselves."""

from __future__ import annotations

import importlib
import random
import sys
from pathlib import Path
from types import ModuleType
from typing import Any, Callable, Iterator

import pytest
import torch

from ironlm.attention.batch import random_paged_batch
from ironlm.attention.reference import ReferenceAttentionBackend
from ironlm.interfaces.attention import AttentionLayerSpec

FAKES = Path(__file__).parent / "fakes"
BLOCK = 128


def _drop_torch_npu() -> None:
    for name in [m for m in sys.modules if m == "torch_npu" or m.startswith("torch_npu.")]:
        del sys.modules[name]


@pytest.fixture
def fake_npu(monkeypatch: pytest.MonkeyPatch) -> Iterator[ModuleType]:
    """The torch_npu test fake, importable as ``torch_npu`` for this test only."""
    _drop_torch_npu()
    monkeypatch.syspath_prepend(str(FAKES))
    module = importlib.import_module("torch_npu")
    assert module.IS_IRONLM_TEST_FAKE
    yield module
    _drop_torch_npu()


def _backend() -> Any:
    from ironlm_ascend.attention import AscendAttentionBackend

    return AscendAttentionBackend()


def _run(
    context_lens: list[int],
    query_lens: list[int],
    heads: tuple[int, int, int],
    dtype: torch.dtype,
    seed: int,
    sliding_window: int | None = None,
) -> None:
    """One step of the Ascend backend and of the reference on identical inputs and caches."""
    num_heads, num_kv_heads, head_dim = heads
    gen = torch.Generator().manual_seed(seed)
    need = sum(-(-(c + q) // BLOCK) for c, q in zip(context_lens, query_lens))
    batch = random_paged_batch(context_lens, query_lens, BLOCK, need + 3, gen)
    layer = AttentionLayerSpec(
        layer_index=0,
        num_heads=num_heads,
        num_kv_heads=num_kv_heads,
        head_dim=head_dim,
        scale=head_dim**-0.5,
        sliding_window=sliding_window,
    )
    tokens = batch.num_tokens
    q = torch.randn(tokens, num_heads, head_dim, generator=gen).to(dtype)
    k = torch.randn(tokens, num_kv_heads, head_dim, generator=gen).to(dtype)
    v = torch.randn(tokens, num_kv_heads, head_dim, generator=gen).to(dtype)
    backend = _backend()
    shape = backend.kv_cache_shape(need + 3, BLOCK, num_kv_heads, head_dim)
    cache = torch.randn(shape, generator=gen).to(dtype)  # earlier steps' keys and values
    ref_cache = cache.clone()

    out = backend.forward(layer, q, k, v, cache, backend.build_metadata(batch))
    expected = ReferenceAttentionBackend().forward(layer, q, k, v, ref_cache, batch)

    assert torch.equal(cache, ref_cache), "KV cache writes differ from the reference"
    assert out.shape == expected.shape and out.dtype == q.dtype
    torch.testing.assert_close(out.float(), expected.float(), atol=2e-2, rtol=2e-2)


def _lens(kind: str, rng: random.Random) -> tuple[list[int], list[int]]:
    n = rng.randint(1, 5)
    if kind == "decode":
        return [rng.randint(0, 600) for _ in range(n)], [1] * n
    if kind == "prefill":
        return [0] * n, [rng.randint(2, 300) for _ in range(n)]
    if kind == "chunked":
        return [rng.randint(1, 400) for _ in range(n)], [rng.randint(2, 200) for _ in range(n)]
    contexts, queries = [], []  # mixed: decodes, fresh prefills and chunks interleaved
    for _ in range(n + 2):
        shape = rng.choice(["decode", "prefill", "chunked"])
        c, q = _lens(shape, rng)
        contexts.append(c[0])
        queries.append(q[0])
    return contexts, queries


HEADS = [(8, 2, 64), (4, 4, 128), (8, 1, 256), (6, 3, 32)]  # GQA, MHA, MQA (large head), GQA


@pytest.mark.parametrize("kind", ["decode", "prefill", "chunked", "mixed"])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_matches_reference_on_random_batches(fake_npu: ModuleType, kind: str, seed: int) -> None:
    rng = random.Random(f"{kind}-{seed}")
    contexts, queries = _lens(kind, rng)
    heads = HEADS[seed % len(HEADS)] if kind != "mixed" else HEADS[(seed + 1) % len(HEADS)]
    dtype = torch.bfloat16 if seed % 2 == 0 else torch.float16
    _run(contexts, queries, heads, dtype, seed)


@pytest.mark.parametrize("heads", HEADS)
def test_every_head_layout_on_a_mixed_batch(fake_npu: ModuleType, heads: tuple) -> None:
    _run([0, 130, 5, 255, 0], [1, 1, 40, 129, 7], heads, torch.bfloat16, seed=7)


@pytest.mark.parametrize("window", [1, 50, 130])
def test_sliding_window_matches_reference(fake_npu: ModuleType, window: int) -> None:
    _run([300, 0, 140, 10], [1, 90, 33, 1], (8, 2, 64), torch.bfloat16, 3, sliding_window=window)
    _run([260, 3], [1, 1], (4, 2, 64), torch.float16, seed=4, sliding_window=window)


def _spy(monkeypatch: pytest.MonkeyPatch, module: ModuleType, name: str) -> list[dict]:
    calls: list[dict] = []
    real: Callable[..., Any] = getattr(module, name)

    def wrapper(*args: Any, **kwargs: Any) -> Any:
        calls.append(kwargs)
        return real(*args, **kwargs)

    monkeypatch.setattr(module, name, wrapper)
    return calls


def test_kernel_routing(fake_npu: ModuleType, monkeypatch: pytest.MonkeyPatch) -> None:
    paged = _spy(monkeypatch, fake_npu, "_npu_paged_attention")
    fused = _spy(monkeypatch, fake_npu, "npu_fused_infer_attention_score")
    _run([10, 200], [1, 1], (8, 2, 64), torch.bfloat16, seed=0)  # decode, 128 * 64 <= 128 * 128
    assert len(paged) == 1 and not fused
    _run([10, 200], [1, 1], (8, 2, 256), torch.bfloat16, seed=0)  # 128 * 256 > 128 * 128
    assert len(paged) == 1 and len(fused) == 1 and fused[0]["atten_mask"] is None
    _run([0, 50], [20, 30], (8, 2, 64), torch.bfloat16, seed=0)  # prefill + chunk
    assert fused[-1]["sparse_mode"] == 3 and fused[-1]["input_layout"] == "BSND"
    assert fused[-1]["actual_seq_lengths"] == [20, 30]
    assert fused[-1]["actual_seq_lengths_kv"] == [20, 80]
    _run([0, 50], [20, 30], (8, 2, 64), torch.bfloat16, seed=0, sliding_window=16)
    assert fused[-1]["sparse_mode"] == 0 and fused[-1]["atten_mask"].shape == (2, 1, 30, 128)


def test_refuses_what_the_kernels_cannot_do(fake_npu: ModuleType) -> None:
    gen = torch.Generator().manual_seed(0)
    backend = _backend()
    batch = random_paged_batch([0], [4], BLOCK, 2, gen)
    meta = backend.build_metadata(batch)
    q = torch.randn(4, 2, 64).to(torch.bfloat16)
    cache = torch.zeros(backend.kv_cache_shape(2, BLOCK, 2, 64), dtype=torch.bfloat16)
    capped = AttentionLayerSpec(0, 2, 2, 64, 0.125, logits_soft_cap=30.0)
    with pytest.raises(ValueError, match="logits_soft_cap"):
        backend.forward(capped, q, q, q, cache, meta)
    plain = AttentionLayerSpec(0, 2, 2, 64, 0.125)
    with pytest.raises(ValueError, match="float16 or bfloat16"):
        backend.forward(plain, q.float(), q.float(), q.float(), cache.float(), meta)
    with pytest.raises(ValueError, match="block size"):
        backend.build_metadata(random_paged_batch([0], [4], 16, 2, gen))


def test_layout_and_availability_with_fake(fake_npu: ModuleType) -> None:
    from ironlm_ascend.attention import AscendAttentionBackend

    status = AscendAttentionBackend.is_available()
    assert status.available and "torch_npu" in status.reason
    backend = AscendAttentionBackend()
    assert backend.kv_cache_shape(10, BLOCK, 4, 64) == (2, 10, BLOCK, 4, 64)
    assert AscendAttentionBackend.supported_platforms == ("npu",)
    with pytest.raises(ValueError, match="takes no options"):
        AscendAttentionBackend(foo=1)
