"""The canonical quantized layouts' pure-torch reference (ironlm.interfaces.quant), which every
platform kernel is tested against, checked against hand-computed dequantisation."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from ironlm.interfaces.platform import LayerOps
from ironlm.interfaces.quant import (
    QuantLayout,
    dequantize,
    pack_int4,
    quantize_per_token,
    unpack_int4,
)

N, K = 16, 64


def test_int4_nibble_order_and_round_trip() -> None:
    values = torch.randint(0, 16, (N, K), generator=torch.Generator().manual_seed(0))
    packed = pack_int4(values)
    assert packed.shape == (N, K // 2) and packed.dtype == torch.uint8
    assert int(packed[0, 0]) == int(values[0, 0]) | (int(values[0, 1]) << 4)  # even k: low
    assert torch.equal(unpack_int4(packed), values.to(torch.uint8))


def test_int4_asymmetric_and_symmetric_dequantise_per_group() -> None:
    g = torch.Generator().manual_seed(1)
    values = torch.randint(0, 16, (N, K), generator=g)
    scale = torch.rand(N, K // 32, generator=g)
    zero = torch.randint(0, 16, (N, K // 32), generator=g).to(torch.uint8)
    want = torch.empty(N, K)
    for n in range(N):
        for k in range(K):
            want[n, k] = (values[n, k] - zero[n, k // 32]) * scale[n, k // 32]
    layout = QuantLayout("int4", group_size=32, zero_points=True)
    got = dequantize(layout, {"qweight": pack_int4(values), "scale": scale, "zero": zero})
    assert torch.allclose(got, want)
    sym = dequantize(QuantLayout("int4", group_size=32), {"qweight": pack_int4(values),
                                                           "scale": scale})
    assert torch.allclose(sym, (values - 8) * scale.repeat_interleave(32, dim=1))


def test_w8a8_reference_sums_integers_exactly() -> None:
    g = torch.Generator().manual_seed(2)
    x = torch.randn(3, K, generator=g)
    q = torch.randint(-127, 128, (N, K), generator=g).to(torch.int8)
    scale = torch.rand(N, generator=g)
    xq, sx = quantize_per_token(x)
    assert xq.abs().max() == 127
    want = (xq.long() @ q.long().t()).double() * sx.double()[:, None] * scale.double()[None]
    got = LayerOps().quantized_linear(QuantLayout("w8a8"), x, {"qweight": q, "scale": scale}, None)
    assert torch.allclose(got.double(), want, rtol=1e-6)
    exact = x @ (q.float() * scale[:, None]).t()  # only the activations' rounding differs
    assert (got - exact).norm() / exact.norm() < 0.02


def test_gguf_reference_is_gguf_dequantize() -> None:
    from gguf import GGMLQuantizationType, quantize
    from gguf import dequantize as gguf_dequantize

    w = np.random.default_rng(3).standard_normal((N, K)).astype(np.float32)
    raw = quantize(w, GGMLQuantizationType.Q8_0)  # (N, K / 32 * 34) uint8
    layout = QuantLayout("gguf", ggml_type=int(GGMLQuantizationType.Q8_0))
    tensors = {"qweight": torch.from_numpy(raw)}
    want = torch.from_numpy(gguf_dequantize(raw, GGMLQuantizationType.Q8_0))
    assert torch.equal(dequantize(layout, tensors), want)
    ids = torch.tensor([5, 0, 5])
    assert torch.equal(LayerOps().quantized_embedding(layout, ids, tensors), want[ids])


def test_layouts_are_checked() -> None:
    with pytest.raises(ValueError, match="group_size"):
        QuantLayout("int4")
    with pytest.raises(ValueError, match="unknown quantized layout"):
        QuantLayout("int3")
    assert QuantLayout("int4", group_size=128).describe() == "int4 (group 128, symmetric)"
    assert QuantLayout("gguf", ggml_type=3).describe() == "gguf (Q4_1)"
