"""The cpu plugin's packed float32 linear (C kernel) against torch's F.linear, and its use by
the model layers (linear, LM head, tied embedding)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from ironlm_cpu.layer_ops import CpuLayerOps
from ironlm_cpu.linear_kernel import PackedLinearKernel


@pytest.fixture(scope="module")
def ops() -> CpuLayerOps:
    ops = CpuLayerOps()
    if not ops.kernel.available:
        pytest.skip(ops.kernel.reason)
    return ops


@pytest.mark.parametrize("m", [1, 2, 5, 6, 7, 13, 64, 300])
@pytest.mark.parametrize(("n", "k"), [(16, 8), (96, 40), (960, 576), (576, 1536), (4096, 64)])
def test_linear_matches_torch(ops: CpuLayerOps, m: int, n: int, k: int) -> None:
    gen = torch.Generator().manual_seed(m * 7919 + n + k)
    w = torch.randn(n, k, generator=gen)
    x = torch.randn(m, k, generator=gen)
    packed = ops.pack_linear_weight(w)
    assert packed.shape == (n // 16, k, 16)
    expected = torch.nn.functional.linear(x, w)
    torch.testing.assert_close(ops.linear(x, packed, None), expected, rtol=1e-4, atol=1e-4 * k**0.5)


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
    half = torch.randn(64, 64, dtype=torch.bfloat16)
    assert ops.pack_linear_weight(odd) is odd
    assert ops.pack_linear_weight(half) is half
    x = torch.randn(3, 64)
    torch.testing.assert_close(ops.linear(x, odd, None), torch.nn.functional.linear(x, odd))


def test_embedding_reads_packed_rows(ops: CpuLayerOps) -> None:
    w = torch.randn(64, 24)
    ids = torch.tensor([0, 15, 16, 63, 5, 5])
    assert torch.equal(ops.embedding(ids, ops.pack_linear_weight(w)), w[ids])
    assert torch.equal(ops.embedding(ids, w), w[ids])


def test_model_layers_use_packed_weights(ops: CpuLayerOps, tiny_llama_dir: Path) -> None:
    """A tied-embedding model loaded on the cpu platform: every float linear and the shared
    embedding / LM head are packed, and logits equal those of the reference layer ops."""
    from ironlm.interfaces.platform import LayerOps
    from ironlm.interfaces.quantization import UnquantizedMethod
    from ironlm.layers.linear import LinearBase
    from ironlm.model_loader.loader import load_model
    from ironlm.model_loader.source import resolve_model
    from ironlm.models.llama import LlamaForCausalLM
    from ironlm.interfaces.model import ModelContext
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
    ops = CpuLayerOps(PackedLinearKernel())
    assert not ops.kernel.available and "unavailable" in ops.kernel.reason
    w = torch.randn(32, 8)
    assert ops.pack_linear_weight(w) is w  # the torch path, row-major
