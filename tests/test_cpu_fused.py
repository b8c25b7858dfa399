"""The cpu plugin's fused C layer ops (RMSNorm + residual, rotary) against the core reference."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from ironlm.interfaces.platform import LayerOps
from ironlm_cpu.fused_kernels import PARALLEL_ROWS, FusedKernels
from ironlm_cpu.layer_ops import CpuLayerOps

REF = LayerOps()


@pytest.fixture(scope="module")
def fused() -> FusedKernels:
    fused = FusedKernels()
    if not fused.available:
        pytest.skip(fused.reason)
    return fused


@pytest.mark.parametrize("tokens", [1, 5, PARALLEL_ROWS + 3])
@pytest.mark.parametrize("hidden", [64, 576, 640])
@pytest.mark.parametrize("with_residual", [False, True])
def test_rms_norm_matches_reference(
    fused: FusedKernels, tokens: int, hidden: int, with_residual: bool
) -> None:
    gen = torch.Generator().manual_seed(tokens * hidden)
    x = torch.randn(tokens, hidden, generator=gen) * 3
    residual = torch.randn(tokens, hidden, generator=gen) if with_residual else None
    weight = torch.randn(hidden, generator=gen)
    assert fused.rms_norm_fits(x, residual)
    out, res = fused.rms_norm(x, weight, 1e-6, residual)
    ref_out, ref_res = REF.rms_norm(x, weight, 1e-6, residual)
    torch.testing.assert_close(out, ref_out, rtol=1e-5, atol=1e-5)
    if with_residual:
        assert res is not None and ref_res is not None and torch.equal(res, ref_res)
    else:
        assert res is None


@pytest.mark.parametrize("tokens", [1, 7, PARALLEL_ROWS + 1])
@pytest.mark.parametrize(("heads", "kv_heads", "head_dim"), [(9, 3, 64), (4, 1, 256), (2, 2, 8)])
def test_rotary_matches_reference_on_qkv_views(
    fused: FusedKernels, tokens: int, heads: int, kv_heads: int, head_dim: int
) -> None:
    gen = torch.Generator().manual_seed(tokens + heads * head_dim)
    q_size, kv_size = heads * head_dim, kv_heads * head_dim
    qkv = torch.randn(tokens, q_size + 2 * kv_size, generator=gen)  # as the QKV linear returns
    q, k, _ = qkv.split([q_size, kv_size, kv_size], dim=-1)
    q, k = q.reshape(tokens, heads, head_dim), k.reshape(tokens, kv_heads, head_dim)
    angles = torch.rand(tokens, head_dim // 2, generator=gen) * 6.28
    cos, sin = angles.cos(), angles.sin()
    assert fused.rotary_fits(q, k, cos)
    got_q, got_k = fused.rotary(q, k, cos, sin)
    ref_q, ref_k = REF.rotary(q, k, cos, sin)
    torch.testing.assert_close(got_q, ref_q, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(got_k, ref_k, rtol=1e-6, atol=1e-6)


def test_layer_ops_fall_back_where_the_kernels_do_not_fit(fused: FusedKernels) -> None:
    ops = CpuLayerOps(fused=fused)
    half = torch.randn(3, 64, dtype=torch.bfloat16)
    strided = torch.randn(3, 128)[:, ::2]
    assert not fused.rms_norm_fits(half, None) and not fused.rms_norm_fits(strided, None)
    for x in (half, strided):
        w = torch.randn(64, dtype=x.dtype)
        torch.testing.assert_close(ops.rms_norm(x, w, 1e-6, None)[0], REF.rms_norm(x, w, 1e-6, None)[0])
    q = torch.randn(2, 4, 16).transpose(0, 1)  # heads not contiguous inside a token
    k = torch.randn(4, 1, 16)
    cos, sin = torch.randn(4, 8), torch.randn(4, 8)
    assert not fused.rotary_fits(q, k, cos)
    for got, ref in zip(ops.rotary(q, k, cos, sin), REF.rotary(q, k, cos, sin), strict=True):
        torch.testing.assert_close(got, ref)


def test_missing_compiler_means_reference_path(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("IRONLM_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("CC", str(tmp_path / "no-such-compiler"))
    fused = FusedKernels()
    assert not fused.available and "unavailable" in fused.reason
    x, w = torch.randn(2, 32), torch.randn(32)
    assert not fused.rms_norm_fits(x, None)
    out = CpuLayerOps(fused=fused).rms_norm(x, w, 1e-6, None)[0]
    torch.testing.assert_close(out, REF.rms_norm(x, w, 1e-6, None)[0])
