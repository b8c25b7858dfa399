"""AscendLayerOps: the w8a8 layout through torch_npu's npu_dynamic_quant + npu_quant_matmul, with
the torch_npu TEST FAKE (tests/fakes/torch_npu) on sys.path, against the core's reference; the
layouts it has no kernel for are refused with the reason."""

from __future__ import annotations

import importlib
import importlib.util
import sys
from pathlib import Path
from types import ModuleType
from typing import Iterator

import pytest
import torch
from ironlm.interfaces.quant import QuantLayout, reference_linear

from ironlm_ascend.layer_ops import AscendLayerOps
from ironlm_ascend.platform import AscendPlatform

FAKES = Path(__file__).parent / "fakes"


def _drop_torch_npu() -> None:
    for name in [m for m in sys.modules if m == "torch_npu" or m.startswith("torch_npu.")]:
        del sys.modules[name]


@pytest.fixture
def fake_npu(monkeypatch: pytest.MonkeyPatch) -> Iterator[ModuleType]:
    _drop_torch_npu()
    monkeypatch.syspath_prepend(str(FAKES))
    module = importlib.import_module("torch_npu")
    assert module.IS_IRONLM_TEST_FAKE
    yield module
    _drop_torch_npu()


def _w8a8(n: int, k: int, seed: int) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return {"qweight": torch.randint(-127, 128, (n, k), generator=g).to(torch.int8),
            "scale": torch.rand(n, generator=g) / 50}  # fmt: skip


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
@pytest.mark.parametrize("rows, n, k", [(1, 48, 64), (7, 160, 256), (33, 96, 512)])
def test_w8a8_matches_reference(
    fake_npu: ModuleType, dtype: torch.dtype, rows: int, n: int, k: int
) -> None:
    ops = AscendPlatform().layer_ops()
    assert isinstance(ops, AscendLayerOps)
    layout = QuantLayout("w8a8")
    assert ops.quantized_support(layout).available
    tensors = _w8a8(n, k, seed=rows)
    packed = ops.pack_quantized(layout, tensors)
    g = torch.Generator().manual_seed(rows)
    x = torch.randn(rows, k, generator=g).to(dtype)
    bias = torch.randn(n, generator=g).to(dtype)
    got = ops.quantized_linear(layout, x, packed, bias)
    want = reference_linear(layout, x, tensors, bias)
    assert got.dtype == dtype and got.shape == (rows, n)
    # the same integers and scales; the output rounds to the half dtype once (the reference
    # rounds its float32 result, then adds the bias in float32)
    ulp = 2e-3 if dtype == torch.float16 else 1.6e-2
    torch.testing.assert_close(got.float(), want.float(), rtol=ulp, atol=ulp * want.abs().max().item())


def test_dynamic_quant_fake_follows_the_documented_formula(fake_npu: ModuleType) -> None:
    from ironlm.interfaces.quant import quantize_per_token

    x = torch.randn(5, 96, generator=torch.Generator().manual_seed(0)).to(torch.float16)
    xq, sx = fake_npu.npu_dynamic_quant(x)
    want_q, want_s = quantize_per_token(x)
    assert torch.equal(xq, want_q) and torch.equal(sx, want_s)
    with pytest.raises(RuntimeError, match="float16/bfloat16"):
        fake_npu.npu_dynamic_quant(x.float())
    smooth = torch.rand(96).to(torch.float16)
    sq, _ = fake_npu.npu_dynamic_quant(x, smooth_scales=smooth)
    assert torch.equal(sq, quantize_per_token(x.float() * smooth.float())[0])


def test_float32_activations_are_refused_with_the_reason(fake_npu: ModuleType) -> None:
    ops = AscendLayerOps()
    layout = QuantLayout("w8a8")
    packed = ops.pack_quantized(layout, _w8a8(16, 32, 0))
    with pytest.raises(ValueError, match="float16 or bfloat16"):
        ops.quantized_linear(layout, torch.randn(2, 32), packed, None)


@pytest.mark.parametrize("layout", [QuantLayout("int8"), QuantLayout("int4", group_size=128),
                                    QuantLayout("fp8"), QuantLayout("gguf", ggml_type=3)])  # fmt: skip
def test_other_layouts_are_refused_with_the_reason(fake_npu: ModuleType, layout: QuantLayout) -> None:
    status = AscendLayerOps().quantized_support(layout)
    assert not status.available
    assert layout.describe() in status.reason and "w8a8" in status.reason


def test_w8a8_needs_torch_npu() -> None:
    _drop_torch_npu()
    if importlib.util.find_spec("torch_npu") is not None:
        pytest.skip("a real torch_npu is installed here")
    status = AscendLayerOps().quantized_support(QuantLayout("w8a8"))
    assert not status.available and "torch_npu" in status.reason
