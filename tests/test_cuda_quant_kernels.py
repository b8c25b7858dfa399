"""The cuda plugin's Triton quantized matmuls (int8, w8a8, int4 with and without zero points, fp8
per channel and per tensor) against the core's pure-torch reference. Without a GPU the kernels
run in Triton's interpreter on CPU tensors (small shapes); the GPU test skips there."""

from __future__ import annotations

import os

import pytest
import torch

if not torch.cuda.is_available():
    os.environ["TRITON_INTERPRET"] = "1"  # before triton is imported (the kernels import it lazily)

from ironlm.interfaces.quant import QuantLayout, reference_embedding, reference_linear  # noqa: E402
from ironlm_cuda.triton_layer_ops import TritonLayerOps  # noqa: E402

from test_cpu_quant_kernels import float_layout  # noqa: E402

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
CASES = [("int8", 37, 100), ("w8a8", 37, 100), ("fp8", 37, 100), ("fp8-tensor", 19, 72),
         ("int4-g32", 37, 96), ("int4-g64-sym", 21, 192)]  # fmt: skip


@pytest.fixture(scope="module")
def ops() -> TritonLayerOps:
    return TritonLayerOps()


def _on(tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    return {name: t.to(DEVICE) for name, t in tensors.items()}


@pytest.mark.parametrize("kind, n, k", CASES)
@pytest.mark.parametrize("rows", [1, 7, 33])
def test_quantized_linear_matches_reference(
    ops: TritonLayerOps, kind: str, n: int, k: int, rows: int
) -> None:
    layout, tensors = float_layout(kind, n, k, seed=rows)
    tensors = _on(tensors)
    packed = ops.pack_quantized(layout, tensors)
    g = torch.Generator().manual_seed(rows)
    x = torch.randn(rows, k, generator=g).to(DEVICE)
    bias = torch.randn(n, generator=g).to(DEVICE) if rows != 7 else None
    got = ops.quantized_linear(layout, x, packed, bias)
    want = reference_linear(layout, x, tensors, bias)
    assert got.shape == (rows, n) and got.dtype == x.dtype
    # float32 sums in tile order (w8a8: exact integer sums, a float32 instead of float64 rescale)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5 * want.abs().max().item())


def test_pack_keeps_what_the_reference_reads(ops: TritonLayerOps) -> None:
    layout, tensors = float_layout("fp8-tensor", 19, 72, seed=0)
    packed = ops.pack_quantized(layout, _on(tensors))
    assert packed["scale"].shape == (19,) and packed["scale"].dtype == torch.float32
    x = torch.randn(3, 72).to(DEVICE)
    torch.testing.assert_close(reference_linear(layout, x, packed, None),
                               reference_linear(layout, x, _on(tensors), None))
    ids = torch.tensor([0, 18]).to(DEVICE)
    torch.testing.assert_close(ops.quantized_embedding(layout, ids, packed),
                               reference_embedding(layout, ids, _on(tensors)))


def test_gguf_layouts_are_refused_with_the_reason(ops: TritonLayerOps) -> None:
    status = ops.quantized_support(QuantLayout("gguf", ggml_type=3))
    assert not status.available and "gguf (Q4_1)" in status.reason and "int4" in status.reason
    assert ops.quantized_support(QuantLayout("int4", group_size=128)).available


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("kind", ["int8", "w8a8", "fp8", "int4-g128"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_gpu_shapes_and_half_activations(ops: TritonLayerOps, kind: str, dtype: torch.dtype) -> None:
    layout, tensors = float_layout(kind, 3072, 1024, seed=0)
    tensors = _on(tensors)
    packed = ops.pack_quantized(layout, tensors)
    for rows in (1, 8, 300):
        x = torch.randn(rows, 1024, device="cuda").to(dtype)
        got = ops.quantized_linear(layout, x, packed, None).float()
        want = reference_linear(layout, x, tensors, None).float()
        tol = 1e-4 if dtype == torch.float32 else 2e-2
        assert ((got - want).norm() / want.norm()).item() < tol
