"""The cpu plugin's paged attention backend against the core's pure-torch reference."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from ironlm.attention.batch import random_paged_batch
from ironlm.attention.reference import ReferenceAttentionBackend
from ironlm.interfaces.attention import AttentionLayerSpec
from ironlm_cpu.attention import CpuPagedAttentionBackend

TOL = {
    torch.float32: dict(atol=1e-5, rtol=1e-5),
    torch.bfloat16: dict(atol=2e-2, rtol=2e-2),
    torch.float16: dict(atol=2e-3, rtol=2e-3),
}


def _run_both(
    context_lens: list[int],
    query_lens: list[int],
    *,
    num_heads: int = 6,
    num_kv_heads: int = 2,
    head_dim: int = 64,
    block_size: int = 16,
    dtype: torch.dtype = torch.float32,
    sliding_window: int | None = None,
    soft_cap: float | None = None,
    seed: int = 0,
) -> None:
    """Fill a cache with a random context, run one step through the reference and through the
    cpu backend (with and without the fused decode kernel); compare outputs and caches."""
    for native in (True, False):
        _compare(context_lens, query_lens, num_heads, num_kv_heads, head_dim, block_size, dtype,
                 sliding_window, soft_cap, seed, CpuPagedAttentionBackend(native_decode=native))


def _compare(
    context_lens: list[int],
    query_lens: list[int],
    num_heads: int,
    num_kv_heads: int,
    head_dim: int,
    block_size: int,
    dtype: torch.dtype,
    sliding_window: int | None,
    soft_cap: float | None,
    seed: int,
    cpu: CpuPagedAttentionBackend,
) -> None:
    gen = torch.Generator().manual_seed(seed)
    need = sum(-(-(c + q) // block_size) for c, q in zip(context_lens, query_lens))
    num_blocks = need + 3  # a few blocks no sequence owns
    batch = random_paged_batch(context_lens, query_lens, block_size, num_blocks, gen)
    layer = AttentionLayerSpec(
        layer_index=0,
        num_heads=num_heads,
        num_kv_heads=num_kv_heads,
        head_dim=head_dim,
        scale=head_dim**-0.5,
        sliding_window=sliding_window,
        logits_soft_cap=soft_cap,
    )
    cache = torch.randn(2, num_blocks, block_size, num_kv_heads, head_dim, generator=gen)
    cache = cache.to(dtype)
    t = batch.num_tokens
    q = torch.randn(t, num_heads, head_dim, generator=gen).to(dtype)
    k = torch.randn(t, num_kv_heads, head_dim, generator=gen).to(dtype)
    v = torch.randn(t, num_kv_heads, head_dim, generator=gen).to(dtype)

    ref = ReferenceAttentionBackend()
    ref_cache, cpu_cache = cache.clone(), cache.clone()
    want = ref.forward(layer, q, k, v, ref_cache, ref.build_metadata(batch))
    meta = cpu.build_metadata(batch)
    got = cpu.forward(layer, q, k, v, cpu_cache, meta)
    assert got.shape == q.shape and got.dtype == q.dtype
    assert torch.equal(cpu_cache, ref_cache)
    torch.testing.assert_close(got.float(), want.float(), **TOL[dtype])
    # the metadata is reused by every layer of a step: a second layer gives the same answer
    again = cpu.forward(layer, q, k, v, cpu_cache, meta)
    torch.testing.assert_close(again, got, atol=0, rtol=0)


@pytest.mark.parametrize("heads", [(4, 4), (6, 2), (8, 2), (9, 3), (4, 1)])
@pytest.mark.parametrize("head_dim", [64, 128])
def test_decode_gqa_ratios(heads: tuple[int, int], head_dim: int) -> None:
    _run_both([5, 16, 40, 1], [1, 1, 1, 1], num_heads=heads[0], num_kv_heads=heads[1],
              head_dim=head_dim)


@pytest.mark.parametrize("block_size", [1, 16, 32])
def test_decode_block_boundaries(block_size: int) -> None:
    # contexts ending just before, on and just after block boundaries
    ctx = [15, 16, 17, 31, 32, 33, 0, 63]
    _run_both(ctx, [1] * len(ctx), block_size=block_size, seed=1)


def test_many_decode_rows_with_prefills() -> None:
    # enough decode rows that the C kernel schedules whole sequences, plus two prefill chunks
    gen = torch.Generator().manual_seed(21)
    ctx = torch.randint(0, 300, (24,), generator=gen).tolist() + [0, 50]
    _run_both(ctx, [1] * 24 + [17, 33], num_heads=9, num_kv_heads=3, seed=21)
    _run_both(ctx, [1] * 24 + [17, 33], sliding_window=40, seed=22)


def test_head_dim_not_multiple_of_8() -> None:
    _run_both([5, 30, 0], [1, 1, 7], num_heads=4, num_kv_heads=2, head_dim=36, seed=23)


def test_decode_uniform_lengths_unmasked() -> None:
    _run_both([31, 31, 31], [1, 1, 1], seed=2)  # 32 keys each: full blocks, no padding


def test_decode_very_different_lengths_split_buckets() -> None:
    ctx = [700, 3, 5, 650, 9, 2, 300]
    _run_both(ctx, [1] * len(ctx), num_heads=9, num_kv_heads=3, seed=3)


@pytest.mark.parametrize("block_size", [16, 32])
@pytest.mark.parametrize("head_dim", [64, 128])
def test_prefill(block_size: int, head_dim: int) -> None:
    _run_both([0, 0, 0], [37, 1, 64], block_size=block_size, head_dim=head_dim, seed=4)


def test_single_prefill() -> None:
    _run_both([0], [45], num_heads=9, num_kv_heads=3, seed=5)


def test_chunked_prefill() -> None:
    # new chunks attending to cached context and to themselves
    _run_both([20, 33, 64], [13, 31, 5], block_size=16, seed=6)


def test_mixed_batch() -> None:
    ctx = [0, 40, 17, 100, 0, 5, 32]
    qs = [23, 1, 9, 1, 1, 1, 40]
    _run_both(ctx, qs, num_heads=9, num_kv_heads=3, block_size=16, seed=7)
    _run_both(ctx, qs, num_heads=8, num_kv_heads=1, block_size=32, head_dim=128, seed=8)


def test_padded_bucket_beside_decode_rows() -> None:
    # A padded bucket (queries 4 and 6) whose padded row count equals the batch's token count
    # because two decode rows sit in their own bucket: it still needs its gather and scatter
    # (speculative decoding verifies drafts in batches like this one).
    _run_both([24, 20, 42, 67], [4, 6, 1, 1], num_heads=9, num_kv_heads=3, seed=15)
    _run_both([124, 120, 42, 67], [4, 6, 1, 1], num_heads=9, num_kv_heads=3, seed=16)


@pytest.mark.parametrize("window", [1, 4, 19, 1000])
def test_sliding_window(window: int) -> None:
    ctx = [0, 40, 17, 100, 3]
    qs = [23, 1, 9, 1, 30]
    _run_both(ctx, qs, num_heads=6, num_kv_heads=2, sliding_window=window, seed=9)


def test_sliding_window_pure_decode() -> None:
    _run_both([40, 40, 40], [1, 1, 1], sliding_window=8, seed=10)


@pytest.mark.parametrize("window", [None, 7])
def test_soft_cap(window: int | None) -> None:
    ctx, qs = [0, 25, 50], [11, 1, 6]
    _run_both(ctx, qs, soft_cap=5.0, sliding_window=window, seed=11)
    _run_both([30, 31], [1, 1], soft_cap=2.0, seed=12)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_half_precision_caches(dtype: torch.dtype) -> None:
    ctx, qs = [0, 40, 17, 3], [12, 1, 5, 1]
    _run_both(ctx, qs, num_heads=9, num_kv_heads=3, dtype=dtype, seed=13)
    _run_both(ctx, qs, dtype=dtype, sliding_window=6, soft_cap=10.0, seed=14)


def test_random_shapes() -> None:
    gen = torch.Generator().manual_seed(1234)
    for case in range(12):
        num_seqs = int(torch.randint(1, 7, (1,), generator=gen))
        ctx = torch.randint(0, 90, (num_seqs,), generator=gen).tolist()
        qs = [1 if torch.rand(1, generator=gen) < 0.5 else int(torch.randint(1, 40, (1,),
              generator=gen)) for _ in range(num_seqs)]
        kv_heads = [1, 2, 3][case % 3]
        group = [1, 3, 4][(case // 3) % 3]
        window = [None, 5, 50][case % 3 - (case // 4) % 2]
        _run_both(
            ctx,
            qs,
            num_heads=kv_heads * group,
            num_kv_heads=kv_heads,
            head_dim=[64, 128][case % 2],
            block_size=[16, 32, 1][case % 3],
            sliding_window=window,
            soft_cap=30.0 if case % 5 == 0 else None,
            seed=100 + case,
        )


@pytest.mark.parametrize("native", [True, False])
def test_views_of_a_fused_qkv_projection(native: bool) -> None:
    # models split q/k/v out of one projection: non-contiguous (num_tokens, heads, D) views
    gen = torch.Generator().manual_seed(31)
    batch = random_paged_batch([7, 0, 40], [1, 12, 1], 16, 8, gen)
    layer = AttentionLayerSpec(0, 6, 2, 64, 0.125)
    qkv = torch.randn(batch.num_tokens, (6 + 2 + 2) * 64, generator=gen)
    q = qkv[:, : 6 * 64].view(-1, 6, 64)
    k = qkv[:, 6 * 64 : 8 * 64].view(-1, 2, 64)
    v = qkv[:, 8 * 64 :].view(-1, 2, 64)
    cache = torch.randn(2, 8, 16, 2, 64, generator=gen)
    ref_cache, cpu_cache = cache.clone(), cache.clone()
    ref = ReferenceAttentionBackend()
    want = ref.forward(layer, q, k, v, ref_cache, batch)
    cpu = CpuPagedAttentionBackend(native_decode=native)
    got = cpu.forward(layer, q, k, v, cpu_cache, cpu.build_metadata(batch))
    assert torch.equal(cpu_cache, ref_cache)
    torch.testing.assert_close(got, want, **TOL[torch.float32])


@pytest.mark.parametrize("native", [True, False])
def test_empty_batch(native: bool) -> None:
    cpu = CpuPagedAttentionBackend(native_decode=native)
    gen = torch.Generator().manual_seed(0)
    batch = random_paged_batch([], [], 16, 4, gen)
    layer = AttentionLayerSpec(0, 4, 2, 64, 0.125)
    q = torch.empty(0, 4, 64)
    kv = torch.empty(0, 2, 64)
    cache = torch.zeros(2, 4, 16, 2, 64)
    out = cpu.forward(layer, q, kv, kv, cache, cpu.build_metadata(batch))
    assert out.shape == (0, 4, 64)


def test_backend_contract() -> None:
    cpu = CpuPagedAttentionBackend()
    assert cpu.name == "cpu_paged" and cpu.supported_platforms == ("cpu",)
    assert cpu.kv_cache_shape(10, 16, 3, 64) == (2, 10, 16, 3, 64)
    with pytest.raises(ValueError, match="native_decode"):
        CpuPagedAttentionBackend(bogus=1)
    assert CpuPagedAttentionBackend(native_decode=False).decode_path.startswith("torch")


def test_decode_kernel_builds_here() -> None:
    """This machine has a C compiler: the fused decode kernel must build and be used (the
    other tests then cover it); elsewhere the backend falls back to torch with a reason."""
    import shutil

    from ironlm_cpu.decode_kernel import PagedDecodeKernel

    if not (shutil.which("cc") or shutil.which("gcc")):
        pytest.skip("no C compiler on this machine: the backend runs decode on torch ops")
    kernel = PagedDecodeKernel()
    assert kernel.available, kernel.reason
    assert CpuPagedAttentionBackend().decode_path == "fused C kernel"


@pytest.mark.parametrize(("heads", "head_dim"), [((6, 2), 64), ((9, 3), 128), ((4, 4), 48)])
def test_decode_kernel_generic_build(
    heads: tuple[int, int], head_dim: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The decode kernel built for the x86-64 baseline (what a CPU without AVX2 runs), forced
    with IRONLM_CPU_ISA, against the reference."""
    from ironlm_cpu.isa import GENERIC

    monkeypatch.setenv("IRONLM_CPU_ISA", "generic")
    cpu = CpuPagedAttentionBackend()
    if cpu.libraries():
        assert cpu.libraries()[0].target == GENERIC
    _compare([5, 20, 33, 1], [1, 1, 1, 1], heads[0], heads[1], head_dim, 16, torch.float32, None,
             None, 3, cpu)  # fmt: skip


def test_decode_kernel_falls_back_without_compiler(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("IRONLM_CACHE_DIR", str(tmp_path))  # nothing cached there
    monkeypatch.setenv("CC", str(tmp_path / "no-such-compiler"))
    cpu = CpuPagedAttentionBackend()
    assert "unavailable" in cpu.decode_path
    _compare([5, 20], [1, 1], 4, 2, 64, 16, torch.float32, None, None, 0, cpu)


def test_registered_through_plugin_manager() -> None:
    import ironlm_cpu.plugin
    from ironlm.plugin_manager import BUILTIN_PLUGIN, PluginManager
    from ironlm_cpu.platform import CpuPlatform

    pm = PluginManager(autoload=False)
    # only this plugin's hooks: the test does not depend on the core's other registrations
    pm.unregister(BUILTIN_PLUGIN)
    pm.register(ironlm_cpu.plugin, "cpu")
    entry = pm.registries.attention_backends.entry("cpu_paged")
    assert entry.obj is CpuPagedAttentionBackend
    assert entry.provenance.plugin == "cpu"
    # the cpu platform's default backend is this one
    assert pm.select_attention_backend(None, CpuPlatform()) is CpuPagedAttentionBackend


def test_discovered_by_entry_point() -> None:
    from ironlm.plugin_manager import BUILTIN_PLUGIN, PluginManager

    pm = PluginManager(autoload=False)
    pm.unregister(BUILTIN_PLUGIN)
    pm.load_entrypoints(allow=["cpu"])  # the installed ironlm-cpu distribution's entry point
    entry = pm.registries.attention_backends.entry("cpu_paged")
    assert entry.obj is CpuPagedAttentionBackend
    assert entry.provenance.plugin == "cpu"
    assert entry.provenance.distribution == "ironlm-cpu"


def test_in_the_default_plugin_manager() -> None:
    from ironlm.plugin_manager import PluginManager

    registry = PluginManager().registries.attention_backends
    assert "cpu_paged" in registry
    assert registry.entry("cpu_paged").provenance.plugin == "cpu"


def _isa_requests() -> list[str]:
    """IRONLM_CPU_ISA values for every build of the decode kernel this CPU runs."""
    from ironlm_cpu.isa import host_target

    best = host_target()
    out = ["auto"]
    if best.has("avx512_bf16"):
        out.append("avx512,-avx512_bf16")
    if best.has("avx512"):
        out.append("avx2")
    return out + ["generic"]


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=["bf16", "f32"])
@pytest.mark.parametrize("isa", _isa_requests())
@pytest.mark.parametrize(
    ("heads", "head_dim"),
    [((6, 2), 64), ((9, 3), 64), ((9, 3), 128), ((4, 1), 256), ((4, 4), 48), ((2, 1), 128),
     ((4, 4), 64), ((10, 2), 64), ((6, 2), 192)])
def test_decode_kernel_builds_match_reference(
    dtype: torch.dtype, isa: str, heads: tuple[int, int], head_dim: int,
    monkeypatch: pytest.MonkeyPatch,
) -> None:  # fmt: skip
    """The C kernel of every build this CPU runs (forced, so the measured choice cannot route
    it to torch), bf16 and float32 caches: AVX-512 builds run the 16-lane body (bf16 scores by
    vdpbf16ps, head sizes that are multiples of 64: query heads in pairs and threes, an odd
    one alone), other builds and sizes the portable one; float32 softmax, bf16 outputs rounded
    once. Contexts cross blocks and the 8- and 16-key groups at every remainder."""
    monkeypatch.setenv("IRONLM_CPU_ISA", isa)
    # prefill rows are tested in test_cpu_prefill_rows.py; not measured here
    monkeypatch.setenv("IRONLM_CPU_KERNELS", "decode_attention=c,prefill_attention=torch")
    cpu = CpuPagedAttentionBackend()
    if not cpu.libraries():
        pytest.skip(cpu.decode_path)
    h, kv = heads
    _compare([5, 20, 33, 1], [1, 1, 1, 1], h, kv, head_dim, 16, dtype, None, None, 3, cpu)
    assert cpu.decode_path.startswith("fused C kernel")
    _compare([40, 3, 70], [1, 1, 1], h, kv, head_dim, 32, dtype, 6, 10.0, 4, cpu)
    _compare([9, 0, 17], [1, 1, 1], h, kv, head_dim, 1, dtype, None, None, 5, cpu)
    _compare(list(range(7, 40, 3)), [1] * 11, h, kv, head_dim, 16, dtype, 25, None, 6, cpu)


def _paged_rows(
    lengths: list[int], h: int, h_kv: int, d: int, bs: int, dtype: torch.dtype, seed: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """(lens, tables, cache, q) of one decode row per length, blocks scattered over the cache"""
    gen = torch.Generator().manual_seed(seed)
    n, lens = len(lengths), torch.tensor(lengths, dtype=torch.int64)
    per = -(-int(lens.max()) // bs)
    tables = torch.randperm(n * per, generator=gen).to(torch.int32).reshape(n, per)
    cache = torch.randn(2, n * per, bs, h_kv, d, generator=gen).to(dtype)
    return lens, tables, cache, torch.randn(n, h, d, generator=gen).to(dtype)


def _decode_on(
    kernel: Any, threads: int, rows: tuple[torch.Tensor, ...], window: int | None,
    cap: float | None,
) -> torch.Tensor:  # fmt: skip
    """The decode kernel's output for ``_paged_rows`` on ``threads`` threads"""
    lens, tables, cache, q = rows
    out = torch.zeros_like(q)
    torch.set_num_threads(threads)
    try:
        kernel(q, cache, out, torch.arange(q.shape[0]), lens, tables, int(lens.max()),
               q.shape[-1] ** -0.5, window, cap)  # fmt: skip
    finally:
        torch.set_num_threads(2)
    return out


def _assert_matches_softmax(
    out: torch.Tensor, rows: tuple[torch.Tensor, ...], bs: int, window: int | None,
    cap: float | None,
) -> None:  # fmt: skip
    """Each row against the softmax over its sequence's (windowed, soft-capped) keys"""
    lens, tables, cache, q = rows
    h, h_kv, d = q.shape[1], cache.shape[3], q.shape[2]
    for i in range(q.shape[0]):
        L = int(lens[i])
        keys = torch.arange(max(0, L - window) if window else 0, L)
        blk = tables[i, keys // bs].long()
        k = cache[0, blk, keys % bs].float().repeat_interleave(h // h_kv, dim=1)  # (L, h, d)
        v = cache[1, blk, keys % bs].float().repeat_interleave(h // h_kv, dim=1)
        scores = torch.einsum("hd,lhd->hl", q[i].float(), k) * d**-0.5
        if cap:
            scores = cap * torch.tanh(scores / cap)
        ref = torch.einsum("hl,lhd->hd", torch.softmax(scores, dim=-1), v)
        tol = 1e-2 if q.dtype == torch.bfloat16 else 1e-5
        torch.testing.assert_close(out[i].float(), ref, rtol=tol, atol=tol)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("window", [None, 40])
def test_decode_touching_leaves_the_outputs_alone(dtype: torch.dtype, window: int | None) -> None:
    """How the kernel pulls a cold cache in (items touched whole, in pairs, or a chunk at a
    time: ``touch_items`` / ``touch_blocks``) is chosen by its L2 budget; every choice reads
    the same rows, so the outputs are bit for bit the same, and equal to the reference."""
    from ironlm_cpu.decode_kernel import PagedDecodeKernel

    kernel = PagedDecodeKernel()
    if not kernel.available:
        pytest.skip(kernel.reason)
    bs = 16
    rows = _paged_rows([1, 7, 16, 17, 40, 55, 64, 90, 100, 31, 3, 77], 6, 2, 64, bs, dtype, 5)
    outs = []
    for budget in (0, 1 << 30, 8 * 1024):  # never whole; always (pairs); some items only
        kernel.touch_item_bytes = budget
        outs += [_decode_on(kernel, threads, rows, window, None) for threads in (1, 2, 7)]
    assert all(torch.equal(o, outs[0]) for o in outs[1:])
    _assert_matches_softmax(outs[0], rows, bs, window, None)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["f32", "bf16"])
@pytest.mark.parametrize("isa", _isa_requests())
def test_decode_long_rows_split_along_the_context(
    dtype: torch.dtype, isa: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Fewer decode rows than four per thread, with 256+ keys: each row's keys run in pieces
    on every thread, merged by their max scores and sums (``decode_split_src``). Against the
    softmax over each row's (windowed, soft-capped) keys, on every build this CPU runs: one
    row, two rows of very different lengths (the short one's pieces partly empty), five rows,
    a window inside the pieces and one longer than the row; with one thread (never split)."""
    from ironlm_cpu.decode_kernel import PagedDecodeKernel
    from ironlm_cpu.isa import host_target

    monkeypatch.setenv("IRONLM_CPU_ISA", isa)
    kernel = PagedDecodeKernel(host_target())
    if not kernel.available:
        pytest.skip(kernel.reason)
    bs = 16
    cases = [([1500], None, None), ([2100, 40], 700, None), ([1030, 3000], None, 30.0),
             ([600], 1800, None), ([300, 900, 257, 1200, 700], 333, None)]  # fmt: skip
    for seed, (lengths, window, cap) in enumerate(cases):
        rows = _paged_rows(lengths, 9, 3, 64, bs, dtype, seed)
        for threads in (2, 1):
            _assert_matches_softmax(_decode_on(kernel, threads, rows, window, cap), rows, bs,
                                    window, cap)  # fmt: skip


_SCRATCH_REFUSED = """
import torch
from ironlm_cpu.decode_kernel import PagedDecodeKernel
torch.set_num_threads(2)
h, h_kv, d, bs, L = 32, 4, 64, 16, 2048
q, lens = torch.randn(1, h, d), torch.tensor([L])
tables = torch.arange(L // bs, dtype=torch.int32).reshape(1, -1)
try:  # scores scratch: h * max_len floats, 256 GiB
    PagedDecodeKernel()(q, torch.randn(2, L // bs, bs, h_kv, d), torch.zeros_like(q),
                        torch.arange(1), lens, tables, 2**31 - 1, d**-0.5, None, None)
    print("returned")
except MemoryError:
    print("MemoryError")
"""


def test_split_rows_survive_a_refused_scratch() -> None:
    """A long row on two threads takes the split path; when a thread's scratch cannot be had
    (a max_len far past any row: 256 GiB of scores), the call raises MemoryError, or returns
    where the system grants the memory, but never crashes the process (it did, found in
    review: the split path ran on the missing scratch)."""
    import subprocess
    import sys

    from ironlm_cpu.decode_kernel import PagedDecodeKernel

    if not PagedDecodeKernel().available:
        pytest.skip("no C decode kernel here")
    run = subprocess.run([sys.executable, "-c", _SCRATCH_REFUSED], capture_output=True,
                         text=True, timeout=120)  # fmt: skip
    assert run.returncode == 0, run.stderr[-2000:]
    assert run.stdout.strip() in ("MemoryError", "returned"), run.stdout


def test_touch_budget_reads_the_l2_size(tmp_path: Path) -> None:
    from ironlm_cpu.decode_kernel import touch_budget

    for name, (level, kind, size) in {"index0": ("1", "Data", "48K"),
                                      "index1": ("1", "Instruction", "32K"),
                                      "index2": ("2", "Unified", "2048K"),
                                      "index3": ("3", "Unified", "32M")}.items():
        (tmp_path / name).mkdir()
        for field, value in (("level", level), ("type", kind), ("size", size)):
            (tmp_path / name / field).write_text(value + "\n")
    assert touch_budget(tmp_path) == 512 * 1024  # a quarter of the 2 MiB L2
    assert touch_budget(tmp_path / "absent") == 64 * 1024
