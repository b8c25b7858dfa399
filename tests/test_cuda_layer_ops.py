"""TritonLayerOps (fused RMSNorm + residual, neox rotary, SiLU/GELU-and-mul) against the core's
pure-torch LayerOps. Without a GPU the kernels run in Triton's interpreter on CPU tensors."""

from __future__ import annotations

import os

import pytest
import torch

if not torch.cuda.is_available():
    os.environ["TRITON_INTERPRET"] = "1"  # before triton is imported (the kernels import it lazily)

from ironlm.interfaces.platform import LayerOps  # noqa: E402
from ironlm_cuda.triton_layer_ops import TritonLayerOps  # noqa: E402

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
DTYPES = [torch.float32, torch.float16, torch.bfloat16]
# the interpreter truncates float32 -> bfloat16 casts (a GPU rounds): allow a bf16 ulp or two
TOL = {
    torch.float32: dict(atol=1e-5, rtol=1e-5),
    torch.float16: dict(atol=2e-3, rtol=2e-3),
    torch.bfloat16: dict(atol=2e-2, rtol=2e-2),
}


@pytest.fixture(scope="module")
def ops() -> TritonLayerOps:
    return TritonLayerOps()


def randn(*shape: int, dtype: torch.dtype, seed: int = 0) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed)).to(DEVICE, dtype)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("hidden", [64, 96, 1000])
@pytest.mark.parametrize("with_residual", [False, True], ids=["plain", "residual"])
def test_rms_norm(
    ops: TritonLayerOps, dtype: torch.dtype, hidden: int, with_residual: bool
) -> None:
    x = randn(7, hidden, dtype=dtype, seed=1)
    weight = randn(hidden, dtype=dtype, seed=2)
    residual = randn(7, hidden, dtype=dtype, seed=3) if with_residual else None
    x_before = x.clone()
    out, new_res = ops.rms_norm(x, weight, 1e-6, residual)
    ref, ref_res = LayerOps().rms_norm(x, weight, 1e-6, residual)
    assert torch.equal(x, x_before)  # inputs untouched
    assert out.dtype == ref.dtype and out.shape == ref.shape
    torch.testing.assert_close(out, ref, **TOL[dtype])
    if with_residual:
        assert new_res is not None and ref_res is not None
        torch.testing.assert_close(new_res, ref_res, **TOL[dtype])
    else:
        assert new_res is None


def test_rms_norm_mixed_weight_dtype_and_strided_rows(ops: TritonLayerOps) -> None:
    big = randn(5, 256, dtype=torch.float16, seed=4)
    x = big[:, :128]  # rows with a stride of 256
    weight = randn(128, dtype=torch.float32, seed=5)
    out, _ = ops.rms_norm(x, weight, 1e-5, None)
    ref, _ = LayerOps().rms_norm(x, weight, 1e-5, None)
    assert out.dtype == torch.float32
    torch.testing.assert_close(out, ref, atol=2e-3, rtol=2e-3)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("heads", [(4, 4, 64), (8, 2, 128)], ids=["H4-KV4-D64", "H8-KV2-D128"])
def test_rotary_neox(ops: TritonLayerOps, dtype: torch.dtype, heads: tuple[int, int, int]) -> None:
    num_heads, num_kv_heads, head_dim = heads
    tokens = 5
    # q and k as views of one fused qkv projection (strided, like the model produces them)
    qkv = randn(tokens, (num_heads + 2 * num_kv_heads) * head_dim, dtype=dtype, seed=6)
    q = qkv[:, : num_heads * head_dim].view(tokens, num_heads, head_dim)
    k = qkv[:, num_heads * head_dim : (num_heads + num_kv_heads) * head_dim].view(
        tokens, num_kv_heads, head_dim
    )
    positions = torch.tensor([0, 1, 7, 100, 4095], dtype=torch.float32)
    inv_freq = 10000.0 ** (-torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim)
    angles = positions[:, None] * inv_freq[None, :]  # (T, D/2)
    cos, sin = angles.cos().to(DEVICE), angles.sin().to(DEVICE)
    qkv_before = qkv.clone()
    q_out, k_out = ops.rotary(q, k, cos, sin)
    q_ref, k_ref = LayerOps().rotary(q, k, cos, sin)
    assert torch.equal(qkv, qkv_before)
    assert q_out.shape == q_ref.shape and k_out.dtype == k_ref.dtype
    torch.testing.assert_close(q_out, q_ref, **TOL[dtype])
    torch.testing.assert_close(k_out, k_ref, **TOL[dtype])


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("inter", [64, 1500])
def test_silu_and_mul(ops: TritonLayerOps, dtype: torch.dtype, inter: int) -> None:
    gate_up = randn(6, 2 * inter, dtype=dtype, seed=7) * 3
    out = ops.silu_and_mul(gate_up)
    ref = LayerOps().silu_and_mul(gate_up)
    assert out.shape == ref.shape and out.dtype == ref.dtype
    torch.testing.assert_close(out, ref, **TOL[dtype])


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=str)
def test_gelu_tanh_and_mul(ops: TritonLayerOps, dtype: torch.dtype) -> None:
    gate_up = randn(6, 2 * 96, dtype=dtype, seed=8) * 3
    torch.testing.assert_close(
        ops.gelu_tanh_and_mul(gate_up), LayerOps().gelu_tanh_and_mul(gate_up), **TOL[dtype]
    )


def test_empty_batch(ops: TritonLayerOps) -> None:
    x = torch.empty(0, 64, device=DEVICE)
    residual = torch.empty(0, 64, device=DEVICE)
    out, res = ops.rms_norm(x, torch.ones(64, device=DEVICE), 1e-6, residual)
    assert out.shape == (0, 64) and res is not None and res.shape == (0, 64)
    assert ops.silu_and_mul(torch.empty(0, 128, device=DEVICE)).shape == (0, 64)
