"""The cpu plugin's packed linear kernels (float32 narrow and wide tiles, bfloat16) on every ISA
target this CPU runs, against torch's F.linear, and their use by the model layers (linear, LM
head, tied embedding)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from ironlm_cpu.isa import GENERIC, IsaTarget, host_target
from ironlm_cpu.layer_ops import CpuLayerOps
from ironlm_cpu.linear_kernel import PackedLinearKernel
from ironlm_cpu.tuner import KernelTuner


def _runnable_targets() -> list[IsaTarget]:
    """The host's best target, the AVX-512 one below an AMX host (its bf16 dot-product tiles
    instead of the tile unit), the AVX2 one (an AVX-512 CPU runs the AVX2 build's 8-lane code
    too) and the generic one: every target this CPU can run that differs in code (AVX-512
    builds are compiled, not run, unless the CPU has AVX-512)."""
    best = host_target()
    if best == GENERIC:
        return [best]
    below = [host_target("avx512")] if best.name == "amx" else []
    avx2 = host_target("avx2")
    return [best, GENERIC] if avx2 == best else [best, *below, avx2, GENERIC]


@pytest.fixture(scope="module", params=_runnable_targets(), ids=lambda t: t.name)
def kernel(request: pytest.FixtureRequest) -> PackedLinearKernel:
    k = PackedLinearKernel(target=request.param)
    if not k.available:
        pytest.skip(k.reason)
    return k


@pytest.fixture(scope="module")
def ops(tmp_path_factory: pytest.TempPathFactory) -> CpuLayerOps:
    """Layer ops that take the C kernel for every shape it can run (no measuring), so the
    tests below check the kernel path; the measured choice is tested in test_cpu_tuner."""
    kernel = PackedLinearKernel()
    if not kernel.available:
        pytest.skip(kernel.reason)
    tuner = KernelTuner(kernel.target, tmp_path_factory.mktemp("tuning"), mode="0", forced="")
    return CpuLayerOps(kernel, tuner=tuner)


@pytest.mark.parametrize("wide", [False, True], ids=["narrow", "wide"])
@pytest.mark.parametrize("m", [1, 2, 4, 6, 7, 12, 13, 300])
@pytest.mark.parametrize(("n", "k"), [(16, 8), (48, 40), (32, 42), (576, 1536), (4096, 64)])
def test_kernel_matches_torch(
    kernel: PackedLinearKernel, wide: bool, m: int, n: int, k: int
) -> None:
    """Both tiles on every runnable target (the wide one is the 16-lane AVX-512 tile; on AVX2
    and generic builds the same C code runs on 2 or 4 narrower registers per vector). Rows 1
    (the one-row kernels), up to 6 / 12 (one tile: its own prefetch), 7, 13 and 300 (several
    tiles); k 42: a tail after the one-row kernels' four k chains; 48 and 4096: an odd panel
    left for the wide tile."""
    gen = torch.Generator().manual_seed(m * 7919 + n + k)
    w = torch.randn(n, k, generator=gen)
    x = torch.randn(m, k, generator=gen)
    packed = kernel.pack(w)
    assert packed.shape == (n // 16, k, 16)
    b = torch.randn(n, generator=gen)
    expected = torch.nn.functional.linear(x, w, b)
    torch.testing.assert_close(kernel(x, packed, b, wide=wide), expected, rtol=1e-4,
                               atol=1e-4 * k**0.5)  # fmt: skip
    assert torch.equal(kernel.unpack(packed), w)


# AVX-512 BF16 tiles: 8 rows x 3 panels, one-row tiles with two k chains; (32, 42) and (80, 30):
# 2-panel remainders and an odd number of k pairs; m 9 and 13: row remainders
@pytest.mark.parametrize("m", [1, 2, 4, 5, 9, 13, 33, 64, 80])
@pytest.mark.parametrize(
    ("n", "k"), [(16, 8), (96, 40), (576, 1536), (32, 42), (80, 30), (16, 32), (48, 96)]
)
def test_bf16_kernel_matches_torch(kernel: PackedLinearKernel, m: int, n: int, k: int) -> None:
    """bf16 weights and activations, float32 sums, one rounding to bf16: against torch's
    float32 result of the same bf16 values, rounded once."""
    gen = torch.Generator().manual_seed(m * 131 + n + k)
    w = torch.randn(n, k, generator=gen).bfloat16()
    x = torch.randn(m, k, generator=gen).bfloat16()
    b = torch.randn(n, generator=gen).bfloat16()
    packed = kernel.pack(w)
    assert packed.shape == (n // 16, k // 2, 16, 2) and packed.dtype == torch.bfloat16
    expected = torch.nn.functional.linear(x.float(), w.float(), b.float())
    out = kernel(x, packed, b)
    assert out.dtype == torch.bfloat16
    torch.testing.assert_close(out.float(), expected, rtol=1e-2, atol=1e-3 * k**0.5)
    assert torch.equal(kernel.unpack(packed), w)
    assert kernel.bf16_path in ("amx tiles from 2 rows, avx512_bf16 dot products",
                                "avx512_bf16 dot products", "widened to float32")
    # AMX builds (K a multiple of 32, 2+ rows: row blocks of 16, the last zero-padded) where
    # the kernel gave this process the tile state
    assert "amx" not in kernel.bf16_path or kernel.target.name == "amx"


@pytest.mark.parametrize(
    ("m", "n", "k"),
    [(512, 96, 40), (512, 96, 64), (1031, 96, 40), (1031, 96, 64), (300, 352, 1536),
     (200, 368, 1536)],
)
def test_bf16_threads_split_rows_of_a_long_batch(
    kernel: PackedLinearKernel, m: int, n: int, k: int
) -> None:
    """From 256 rows a thread, two threads take a half of the rows each (every column) instead
    of a half of the columns: the same tiles over the same k order, so the values equal one
    thread's bit for bit (1031: one thread has a row more, chunks end mid-tile). AMX builds
    (k % 32 == 0) run their prefill order, two row blocks by two panels at a time over chunks
    of row blocks and groups of panels: the same tiles too. 300 x 352 x 1536: 19 row blocks in
    two chunks (9 and 10: the first ends on a lone block), 22 panels in groups; 200 x 368:
    one chunk of 13 blocks, 23 panels (the last group ends on a lone panel)."""
    gen = torch.Generator().manual_seed(m + k)
    w = torch.randn(n, k, generator=gen).bfloat16()
    x = torch.randn(m, k, generator=gen).bfloat16()
    b = torch.randn(n, generator=gen).bfloat16()
    packed = kernel.pack(w)
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one = kernel(x, packed, b)
        torch.set_num_threads(2)
        two = kernel(x, packed, b)
    finally:
        torch.set_num_threads(before)
    assert torch.equal(two, one)
    expected = torch.nn.functional.linear(x.float(), w.float(), b.float())
    torch.testing.assert_close(two.float(), expected, rtol=1e-2, atol=1e-3 * k**0.5)


@pytest.mark.parametrize("m", [1, 5, 64])
def test_bf16_lm_head_writes_the_float32_of_its_bf16_logits(ops: CpuLayerOps, m: int) -> None:
    """A bf16 LM head on the panel tile: float32 logits equal to linear().float() (the bf16
    rounding kept), written by the kernel itself on AVX-512 BF16 builds."""
    from ironlm.interfaces.platform import LayerOps

    gen = torch.Generator().manual_seed(m)
    w = torch.randn(4096, 64, generator=gen).bfloat16()
    x = torch.randn(m, 64, generator=gen).bfloat16()
    packed = ops.pack_linear_weight(w)
    got = ops.lm_head(x, packed)
    assert got.dtype == torch.float32 and got.shape == (m, 4096)
    assert torch.equal(got, ops.linear(x, packed, None).float())
    torch.testing.assert_close(got, LayerOps().lm_head(x, w), rtol=1e-2, atol=1e-2)
    kernel = PackedLinearKernel()
    if kernel.f32_out_fits(x, packed):
        assert torch.equal(kernel.f32_out(x, packed), got)
    assert not kernel.f32_out_fits(x.float(), packed)


def test_linear_matches_torch(ops: CpuLayerOps) -> None:
    w, x = torch.randn(960, 576), torch.randn(7, 576)
    packed = ops.pack_linear_weight(w)
    assert packed.shape == (60, 576, 16)
    torch.testing.assert_close(ops.linear(x, packed, None), torch.nn.functional.linear(x, w),
                               rtol=1e-4, atol=1e-3)  # fmt: skip


def test_bias_and_non_contiguous_input(ops: CpuLayerOps) -> None:
    w, b = torch.randn(48, 24), torch.randn(48)
    x = torch.randn(9, 48)[:, ::2]  # (9, 24) strided view
    out = ops.linear(x, ops.pack_linear_weight(w), b)
    torch.testing.assert_close(out, torch.nn.functional.linear(x, w, b), rtol=1e-4, atol=1e-4)


def test_empty_batch(ops: CpuLayerOps) -> None:
    out = ops.linear(torch.empty(0, 8), ops.pack_linear_weight(torch.randn(32, 8)), None)
    assert out.shape == (0, 32)


def test_unpackable_weights_stay_row_major(ops: CpuLayerOps) -> None:
    odd = torch.randn(100, 64)  # 100 rows: not a multiple of 16
    half = torch.randn(64, 64, dtype=torch.float16)
    odd_k = torch.randn(32, 63, dtype=torch.bfloat16)  # bf16 pairs need an even K
    assert ops.pack_linear_weight(odd) is odd
    assert ops.pack_linear_weight(half) is half
    assert ops.pack_linear_weight(odd_k) is odd_k
    x = torch.randn(3, 64)
    torch.testing.assert_close(ops.linear(x, odd, None), torch.nn.functional.linear(x, odd))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_embedding_reads_packed_rows(ops: CpuLayerOps, dtype: torch.dtype) -> None:
    w = torch.randn(64, 24).to(dtype)
    ids = torch.tensor([0, 15, 16, 63, 5, 5])
    packed = ops.pack_linear_weight(w)
    assert packed.dim() == (3 if dtype == torch.float32 else 4)
    assert torch.equal(ops.embedding(ids, packed), w[ids])
    assert torch.equal(ops.embedding(ids, w), w[ids])


def test_model_layers_use_packed_weights(ops: CpuLayerOps, tiny_llama_dir: Path) -> None:
    """A tied-embedding model loaded on the cpu platform: every float linear and the shared
    embedding / LM head are packed, and logits equal those of the reference layer ops."""
    from ironlm.interfaces.model import ModelContext
    from ironlm.interfaces.platform import LayerOps
    from ironlm.interfaces.quantization import UnquantizedMethod
    from ironlm.layers.linear import LinearBase
    from ironlm.model_loader.loader import load_model
    from ironlm.model_loader.source import resolve_model
    from ironlm.models.llama import LlamaForCausalLM
    from ironlm_cpu.attention import CpuPagedAttentionBackend

    source = resolve_model(str(tiny_llama_dir))
    source.hf_config.tie_word_embeddings = True

    def build(layer_ops: LayerOps) -> LlamaForCausalLM:
        ctx = ModelContext(CpuPagedAttentionBackend(), layer_ops, UnquantizedMethod(),
                           torch.float32, torch.device("cpu"))  # fmt: skip
        model = load_model(source, LlamaForCausalLM, ctx, load_format="dummy", seed=3)
        assert isinstance(model, LlamaForCausalLM)
        return model

    packed, reference = build(ops), build(LayerOps())
    linears = [m for m in packed.modules() if isinstance(m, LinearBase)]
    assert linears and all(m.weight.dim() == 3 for m in linears)
    assert packed.lm_head.weight is packed.model.embed_tokens.weight
    assert packed.lm_head.weight.dim() == 3
    ids = torch.tensor([1, 7, 30, 2])
    torch.testing.assert_close(packed.model.embed_tokens(ids), reference.model.embed_tokens(ids))
    hidden = torch.randn(5, source.hf_config.hidden_size)
    torch.testing.assert_close(packed.compute_logits(hidden), reference.compute_logits(hidden),
                               rtol=1e-4, atol=1e-5)  # fmt: skip


def test_kernel_reports_missing_compiler(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("IRONLM_CACHE_DIR", str(tmp_path))  # nothing cached there
    monkeypatch.setenv("CC", str(tmp_path / "no-such-compiler"))
    kernel = PackedLinearKernel()
    ops = CpuLayerOps(kernel, tuner=KernelTuner(kernel.target, tmp_path, mode="0", forced=""))
    assert not ops.kernel.available and "unavailable" in ops.kernel.reason
    w = torch.randn(32, 8)
    assert ops.pack_linear_weight(w) is w  # the torch path, row-major


def test_smollm2_bfloat16_on_packed_bf16_weights(
    smollm2_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """SmolLM2 in bfloat16 with every linear on the bf16 panel kernel (forced, so the kernel
    runs whatever the measurement would pick): the next token and its logprob agree with the
    float32 engine."""
    from ironlm import LLM, SamplingParams
    from ironlm.layers.linear import LinearBase

    if not PackedLinearKernel().available:
        pytest.skip("the packed linear kernel does not build here")
    monkeypatch.setenv("IRONLM_CPU_KERNELS", "linear=c")
    kwargs: dict = dict(device="cpu", max_model_len=128, kv_cache_memory=16 * 2**20)
    prompts = ["The capital of France is", "def fibonacci(n):", "One, two, three,"]
    params = SamplingParams(max_tokens=1, temperature=0, logprobs=0)
    bf16 = LLM(str(smollm2_dir), dtype="bfloat16", **kwargs)
    model = bf16.engine.executor.worker.model_runner.model
    linears = [m for m in model.modules() if isinstance(m, LinearBase)]
    assert linears
    assert all(m.weight.dim() == 4 and m.weight.dtype == torch.bfloat16 for m in linears)
    got = bf16.generate(prompts, params, use_tqdm=False)
    del bf16
    fp32 = LLM(str(smollm2_dir), dtype="float32", **kwargs)
    want = fp32.generate(prompts, params, use_tqdm=False)
    for g, w in zip(got, want, strict=True):
        assert g.outputs[0].token_ids == w.outputs[0].token_ids
        lp_g = next(iter(g.outputs[0].logprobs[0].values())).logprob
        lp_w = next(iter(w.outputs[0].logprobs[0].values())).logprob
        assert lp_g == pytest.approx(lp_w, abs=0.15)
