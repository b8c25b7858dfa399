"""ascend_w8a8 (static W8A8 through npu_quantize + npu_quant_matmul) with the torch_npu TEST FAKE
(tests/fakes/torch_npu) on sys.path, against a float matmul."""

from __future__ import annotations

import importlib
import importlib.util
import sys
from pathlib import Path
from types import ModuleType
from typing import Iterator

import pytest
import torch

from ironlm_ascend.w8a8 import AscendW8A8Method

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


def _layer(
    weight: torch.Tensor, dtype: torch.dtype, x_range: tuple[float, float] | None
) -> tuple[AscendW8A8Method, torch.nn.Module]:
    """A linear layer quantized offline, loaded by name as a checkpoint would be, processed."""
    method = AscendW8A8Method.from_config({"quant_method": "ascend"})
    layer = torch.nn.Module()
    out_features, in_features = weight.shape
    method.create_weights(layer, in_features, out_features, dtype)
    kwargs = {} if x_range is None else {"input_min": x_range[0], "input_max": x_range[1]}
    tensors = AscendW8A8Method.quantize(weight, **kwargs)
    for name, value in tensors.items():
        param = getattr(layer, name)
        assert param.shape == value.shape, name
        param.data.copy_(value)
    method.process_weights_after_loading(layer)
    return method, layer


def _rel_err(y: torch.Tensor, ref: torch.Tensor) -> float:
    return float((y.float() - ref).norm() / ref.norm())


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("shape", [(7, 64, 48), (33, 256, 160), (1, 512, 96)])
def test_apply_matches_float_matmul(
    fake_npu: ModuleType, dtype: torch.dtype, shape: tuple[int, int, int]
) -> None:
    tokens, in_features, out_features = shape
    gen = torch.Generator().manual_seed(sum(shape))
    weight = torch.randn(out_features, in_features, generator=gen) * 0.05
    x = (torch.randn(tokens, in_features, generator=gen) * 1.5 + 0.3).to(dtype)
    bias = torch.randn(out_features, generator=gen).to(dtype)
    method, layer = _layer(weight, dtype, (float(x.min()), float(x.max())))
    ref = x.float() @ weight.t() + bias.float()
    y = method.apply(layer, x, bias)
    assert y.shape == (tokens, out_features) and y.dtype == dtype
    # int8 weights (per channel) and int8 activations (per tensor, asymmetric): ~1% error
    assert _rel_err(y, ref) < 0.03
    assert _rel_err(method.apply(layer, x, None), ref - bias.float()) < 0.03


def test_default_activation_range(fake_npu: ModuleType) -> None:
    gen = torch.Generator().manual_seed(1)
    weight = torch.randn(64, 128, generator=gen) * 0.1
    x = torch.randn(16, 128, generator=gen).to(torch.bfloat16)  # RMS-normalised scale
    method, layer = _layer(weight, torch.bfloat16, None)
    assert _rel_err(method.apply(layer, x, None), x.float() @ weight.t()) < 0.05


def test_quantize_tensors_match_create_weights() -> None:
    weight = torch.randn(40, 24, dtype=torch.bfloat16)
    tensors = AscendW8A8Method.quantize(weight, input_min=-3.0, input_max=5.0)
    layer = torch.nn.Module()
    AscendW8A8Method().create_weights(layer, 24, 40, torch.bfloat16)
    declared = {name: p for name, p in layer.named_parameters()}
    assert set(tensors) == set(declared)
    for name, value in tensors.items():
        assert value.shape == declared[name].shape and value.dtype == declared[name].dtype, name
    q = tensors["weight"].to(torch.int32)
    assert int(q.abs().max()) <= 127
    # zero-point term folded into the int32 bias; deq_scale = input_scale * weight_scale
    offset = int(tensors["input_offset"])
    assert torch.equal(tensors["quant_bias"], -offset * q.sum(dim=1))
    scale = 8.0 / 255.0
    expected_deq = scale * tensors["weight_scale"].float().flatten()
    torch.testing.assert_close(tensors["deq_scale"], expected_deq, rtol=1e-2, atol=0)
    assert torch.count_nonzero(tensors["weight_offset"]) == 0


def test_refusals(fake_npu: ModuleType) -> None:
    with pytest.raises(ValueError, match="quant_method"):
        AscendW8A8Method.from_config({"quant_method": "gptq"})
    method, layer = _layer(torch.randn(8, 16), torch.bfloat16, (-1.0, 1.0))
    with pytest.raises(ValueError, match="float16 or bfloat16"):
        method.apply(layer, torch.randn(2, 16), None)
    layer.weight_offset.data.fill_(1.0)
    with pytest.raises(ValueError, match="symmetric"):
        method.process_weights_after_loading(layer)
    with pytest.raises(ValueError, match="float"):
        AscendW8A8Method.quantize(torch.ones(4, 4, dtype=torch.int8))


def test_apply_without_torch_npu_names_it(monkeypatch: pytest.MonkeyPatch) -> None:
    _drop_torch_npu()
    monkeypatch.setattr(sys, "path", [p for p in sys.path if Path(p) != FAKES])
    if importlib.util.find_spec("torch_npu") is not None:
        pytest.skip("a real torch_npu is installed here")
    method, layer = _layer(torch.randn(8, 16), torch.bfloat16, (-1.0, 1.0))
    with pytest.raises(RuntimeError, match="torch_npu"):
        method.apply(layer, torch.randn(2, 16, dtype=torch.bfloat16), None)
