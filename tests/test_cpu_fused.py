"""The cpu plugin's fused C layer ops (RMSNorm + residual, rotary, gated activations, row
lookups) against the core reference; the C KV-cache write against index_copy."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from ironlm.interfaces.platform import LayerOps
from ironlm_cpu.decode_kernel import PagedDecodeKernel
from ironlm_cpu.fused_kernels import PARALLEL_ROWS, FusedKernels, in_dtype
from ironlm_cpu.isa import GENERIC, IsaTarget, host_target
from ironlm_cpu.layer_ops import CpuLayerOps
from ironlm_cpu.linear_kernel import PackedLinearKernel

REF = LayerOps()


def _runnable_targets() -> list[IsaTarget]:
    best = host_target()
    return [best] if best == GENERIC else [best, GENERIC]


@pytest.fixture(scope="module", params=_runnable_targets(), ids=lambda t: t.name)
def fused(request: pytest.FixtureRequest) -> FusedKernels:
    """The fused ops built for this CPU's best target and for the generic x86-64 one."""
    fused = FusedKernels(target=request.param)
    if not fused.available:
        pytest.skip(fused.reason)
    return fused


@pytest.mark.parametrize("tokens", [1, 5, PARALLEL_ROWS + 3])
@pytest.mark.parametrize("hidden", [40, 60, 64, 100, 576, 640])  # vector loops and tails
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
@pytest.mark.parametrize(
    ("heads", "kv_heads", "head_dim"), [(9, 3, 64), (4, 1, 256), (2, 2, 8), (3, 1, 40)]
)
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


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("tokens", [1, 6, PARALLEL_ROWS + 1])  # the last: rows split
@pytest.mark.parametrize(("heads", "kv_heads", "head_dim"), [(4, 1, 256), (3, 2, 24), (2, 1, 40)])
def test_per_head_rms_norm_reads_qkv_views(
    fused: FusedKernels, dtype: torch.dtype, tokens: int, heads: int, kv_heads: int,
    head_dim: int,
) -> None:  # fmt: skip
    """q/k norms on (tokens, heads, head_dim) slices of the fused qkv output, in place of a
    copy: the same values as the reference on the contiguous rows, written contiguous."""
    gen = torch.Generator().manual_seed(tokens * heads + head_dim)
    q_size, kv_size = heads * head_dim, kv_heads * head_dim
    qkv = (torch.randn(tokens, q_size + 2 * kv_size, generator=gen) * 3).to(dtype)
    q, k, _ = qkv.split([q_size, kv_size, kv_size], dim=-1)
    weight = (torch.randn(head_dim, generator=gen) + 1).to(dtype)
    for view, n in ((q, heads), (k, kv_heads)):
        x = view.unflatten(-1, (n, head_dim))  # token stride: the qkv row
        assert fused.rms_norm_fits(x, None, weight)
        assert not fused.rms_norm_fits(x, torch.zeros_like(x), weight)  # no residual on views
        out, res = fused.rms_norm(x, weight, 1e-6, None)
        ref, _ = REF.rms_norm(x.reshape(-1, head_dim), weight, 1e-6, None)
        assert res is None and out.shape == x.shape and out.is_contiguous()
        tol = BF16_TOL if dtype == torch.bfloat16 else dict(rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(out.reshape(-1, head_dim), ref, **tol)
        ops = CpuLayerOps(fused=fused)  # the layer op takes the view as it is
        torch.testing.assert_close(ops.rms_norm(x, weight, 1e-6, None)[0], out, rtol=0, atol=0)


def _exact_gated(gate_up: torch.Tensor, gelu: bool) -> torch.Tensor:
    """float64 silu(g) * u or gelu_tanh(g) * u (torch's float32 tanh-GELU loses the small
    negative tail to cancellation in 1 + tanh, which the kernel's 1 / (1 + exp) form keeps)."""
    g, u = gate_up.double().chunk(2, dim=-1)
    if gelu:
        return (0.5 * g * (1 + torch.tanh(0.7978845608028654 * (g + 0.044715 * g**3))) * u).float()
    return (g * torch.sigmoid(g) * u).float()


@pytest.mark.parametrize("tokens", [1, 3, PARALLEL_ROWS + 2])
@pytest.mark.parametrize("inter", [5, 64, 1536, 1539])
@pytest.mark.parametrize("gelu", [False, True])
def test_gated_activation_matches_reference(
    fused: FusedKernels, tokens: int, inter: int, gelu: bool
) -> None:
    gen = torch.Generator().manual_seed(tokens * inter + gelu)
    wide = torch.randn(tokens, 2 * inter + 6, generator=gen) * 5
    gate_up = wide[:, 3 : 3 + 2 * inter]  # rows a stride apart, as a view may be
    assert fused.gated_act_fits(gate_up)
    ops = CpuLayerOps(fused=fused)
    got = ops.gelu_tanh_and_mul(gate_up) if gelu else ops.silu_and_mul(gate_up)
    ref = REF.gelu_tanh_and_mul(gate_up) if gelu else REF.silu_and_mul(gate_up)
    torch.testing.assert_close(got, _exact_gated(gate_up, gelu), rtol=2e-6, atol=1e-6)
    torch.testing.assert_close(got, ref, rtol=1e-5, atol=1e-5)


def test_gated_activation_extremes(fused: FusedKernels) -> None:
    g = torch.tensor([-1e4, -100.0, -30.0, -5.0, 0.0, 5.0, 30.0, 100.0, 1e4] * 2)
    gate_up = torch.cat([g, torch.ones_like(g)]).unsqueeze(0)  # 18 lanes: vector part + tail
    for gelu in (False, True):
        got = fused.gated_act(gate_up, gelu)
        assert torch.isfinite(got).all()
        torch.testing.assert_close(got, _exact_gated(gate_up, gelu), rtol=1e-6, atol=1e-30)


@pytest.mark.parametrize("packed", [False, True])
def test_row_lookup_matches_embedding(fused: FusedKernels, packed: bool) -> None:
    table = torch.randn(96, 24)
    ids = torch.tensor([0, 95, 17, 17, 48])
    stored = PackedLinearKernel.pack(table) if packed else table
    assert fused.gather_fits(ids, stored)
    assert torch.equal(CpuLayerOps(fused=fused).embedding(ids, stored), REF.embedding(ids, table))
    with pytest.raises(IndexError, match="outside"):
        fused.gather_rows(torch.tensor([3, 96]), stored)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("packed", [False, True])
@pytest.mark.parametrize("scale", [640**0.5, 1.0, 0.1])
def test_scaled_row_lookup_matches_reference(
    fused: FusedKernels, dtype: torch.dtype, packed: bool, scale: float
) -> None:
    """Gemma's embedding scale: rows times the scale rounded to the table's dtype, the product
    rounded once, bit for bit as the reference's multiply (no separate torch op to capture)."""
    table = (torch.randn(96, 24, generator=torch.Generator().manual_seed(3)) * 4).to(dtype)
    ids = torch.tensor([0, 95, 17, 17, 48])
    stored = PackedLinearKernel.pack(table) if packed else table
    got = CpuLayerOps(fused=fused).embedding(ids, stored, scale)
    want = REF.embedding(ids, table, scale)
    assert want.dtype == dtype and torch.equal(got, want)
    assert torch.equal(want, table[ids] * torch.tensor(scale, dtype=dtype))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("value", [640**0.5, 576**0.5, 2304**0.5, 1 / 3, 1.00390625, 1e-3])
def test_scale_rounds_as_torch(dtype: torch.dtype, value: float) -> None:
    assert in_dtype(value, dtype) == float(torch.tensor(value, dtype=dtype))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_kv_write_matches_index_copy(dtype: torch.dtype) -> None:
    kernel = PagedDecodeKernel()
    if not kernel.available:
        pytest.skip(kernel.reason)
    cache = torch.zeros(2, 6, 16, 3, 8, dtype=dtype)  # (2, blocks, block_size, Hkv, D)
    qkv = torch.randn(4, 4 * 8 + 2 * 3 * 8).to(dtype)
    k = torch.randn(4, 3, 8).to(dtype)
    v = qkv[:, 4 * 8 + 3 * 8 :].view(4, 3, 8)  # a strided view of the QKV output
    slots = torch.tensor([5, 95, -1, 16])  # -1: a padding row, skipped
    assert kernel.write_kv_fits(cache, k, v)
    other = torch.bfloat16 if dtype == torch.float32 else torch.float32
    assert not kernel.write_kv_fits(cache, k.to(other), v)  # one dtype everywhere
    kernel.write_kv(cache, k, v, slots)
    want = torch.zeros_like(cache)
    flat = want.view(2, -1, 3, 8)
    keep = slots >= 0
    flat[0].index_copy_(0, slots[keep], k[keep])
    flat[1].index_copy_(0, slots[keep], v[keep])
    assert torch.equal(cache, want)
    with pytest.raises(IndexError, match="outside the cache"):
        kernel.write_kv(cache, k, v, torch.tensor([0, 1, 2, 96]))


def test_layer_ops_fall_back_where_the_kernels_do_not_fit(fused: FusedKernels) -> None:
    ops = CpuLayerOps(fused=fused)
    half = torch.randn(3, 64, dtype=torch.float16)
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


# -- bfloat16 -------------------------------------------------------------------------------
BF16_TOL = dict(rtol=1.6e-2, atol=1e-2)  # a bf16 ulp is 2^-8 relative


def _bf16_targets() -> list[IsaTarget]:
    """Every code path of the bf16 ops this CPU runs: the best target (AVX-512 BF16's
    ``vcvtneps2bf16`` stores where it has them), AVX-512 without BF16 and AVX2 (integer
    rounding), and the generic build (scalar and SSE2)."""
    best = host_target()
    out = [best]
    if best.has("avx512_bf16"):
        out.append(IsaTarget(tuple(g for g in best.groups if g != "avx512_bf16")))
    if best.has("avx512"):
        out.append(IsaTarget(tuple(g for g in best.groups if g in ("avx2",))))
    return [t for t in out if t != GENERIC] + [GENERIC]


def _target_id(target: IsaTarget) -> str:
    return "+".join(target.groups) or "generic"


@pytest.fixture(scope="module", params=_bf16_targets(), ids=_target_id)
def fused_bf16(request: pytest.FixtureRequest) -> FusedKernels:
    fused = FusedKernels(target=request.param)
    if not fused.available:
        pytest.skip(fused.reason)
    return fused


def _bf16(*shape: int, gen: torch.Generator, scale: float = 1.0) -> torch.Tensor:
    return (torch.randn(*shape, generator=gen) * scale).bfloat16()


@pytest.mark.parametrize("tokens", [1, 5, PARALLEL_ROWS + 3])
@pytest.mark.parametrize("hidden", [64, 576, 70])
@pytest.mark.parametrize("with_residual", [False, True])
def test_bf16_rms_norm_matches_reference(
    fused_bf16: FusedKernels, tokens: int, hidden: int, with_residual: bool
) -> None:
    gen = torch.Generator().manual_seed(tokens * hidden + 1)
    x = _bf16(tokens, hidden, gen=gen, scale=3)
    residual = _bf16(tokens, hidden, gen=gen) if with_residual else None
    weight = _bf16(hidden, gen=gen)
    assert fused_bf16.rms_norm_fits(x, residual, weight)
    assert not fused_bf16.rms_norm_fits(x, residual, weight.float())  # the reference upcasts
    out, res = fused_bf16.rms_norm(x, weight, 1e-6, residual)
    ref_out, ref_res = REF.rms_norm(x, weight, 1e-6, residual)
    assert out.dtype == torch.bfloat16
    torch.testing.assert_close(out, ref_out, **BF16_TOL)
    if with_residual:  # x + residual rounded once, as torch's bf16 add
        assert res is not None and ref_res is not None and torch.equal(res, ref_res)


@pytest.mark.parametrize("tokens", [1, 7, PARALLEL_ROWS + 1])
@pytest.mark.parametrize(
    ("heads", "kv_heads", "head_dim"), [(9, 3, 64), (4, 1, 256), (2, 2, 8), (3, 1, 40)]
)
def test_bf16_rotary_matches_reference_on_qkv_views(
    fused_bf16: FusedKernels, tokens: int, heads: int, kv_heads: int, head_dim: int
) -> None:
    gen = torch.Generator().manual_seed(tokens + heads * head_dim + 1)
    q_size, kv_size = heads * head_dim, kv_heads * head_dim
    qkv = _bf16(tokens, q_size + 2 * kv_size, gen=gen)
    q, k, _ = qkv.split([q_size, kv_size, kv_size], dim=-1)
    q, k = q.reshape(tokens, heads, head_dim), k.reshape(tokens, kv_heads, head_dim)
    angles = torch.rand(tokens, head_dim // 2, generator=gen) * 6.28
    cos, sin = angles.cos().bfloat16(), angles.sin().bfloat16()  # the model dtype's tables
    assert fused_bf16.rotary_fits(q, k, cos)
    assert not fused_bf16.rotary_fits(q, k, cos.float())
    for got, ref in zip(fused_bf16.rotary(q, k, cos, sin), REF.rotary(q, k, cos, sin), strict=True):
        assert got.dtype == torch.bfloat16
        torch.testing.assert_close(got, ref, **BF16_TOL)


@pytest.mark.parametrize("tokens", [1, 3, PARALLEL_ROWS + 2])
@pytest.mark.parametrize("inter", [5, 64, 1536, 1539])
@pytest.mark.parametrize("gelu", [False, True])
def test_bf16_gated_activation_matches_reference(
    fused_bf16: FusedKernels, tokens: int, inter: int, gelu: bool
) -> None:
    gen = torch.Generator().manual_seed(tokens * inter + gelu + 1)
    wide = _bf16(tokens, 2 * inter + 6, gen=gen, scale=5)
    gate_up = wide[:, 3 : 3 + 2 * inter]  # rows a stride apart, as a view may be
    assert fused_bf16.gated_act_fits(gate_up)
    ops = CpuLayerOps(fused=fused_bf16)
    got = ops.gelu_tanh_and_mul(gate_up) if gelu else ops.silu_and_mul(gate_up)
    ref = REF.gelu_tanh_and_mul(gate_up) if gelu else REF.silu_and_mul(gate_up)
    assert got.dtype == torch.bfloat16
    # exact: act(g) rounded to bf16, times u, rounded (torch rounds after each op)
    g, u = gate_up.double().chunk(2, dim=-1)
    act = _exact_gated(torch.cat([g, torch.ones_like(u)], dim=-1), gelu).bfloat16()
    torch.testing.assert_close(got, (act.float() * u.float()).bfloat16(), **BF16_TOL)
    # torch's float32 tanh-GELU loses the negative tail (see _exact_gated): absolute bound
    torch.testing.assert_close(got, ref, rtol=1.6e-2, atol=2e-2 if gelu else 1e-2)


def test_bf16_nan_and_extremes(fused_bf16: FusedKernels) -> None:
    g = torch.tensor([-1e4, -100.0, -30.0, -5.0, 0.0, 5.0, 30.0, 100.0, 1e4] * 2)
    g[3] = g[17] = float("nan")  # one in the 16-lane vector part, one in the tail
    gate_up = torch.cat([g, torch.ones_like(g)]).unsqueeze(0).bfloat16()
    for gelu in (False, True):
        got = fused_bf16.gated_act(gate_up, gelu).float()
        want = _exact_gated(gate_up.float(), gelu)
        assert torch.isnan(got[0, 3]) and torch.isnan(got[0, 17])
        keep = ~torch.isnan(want)
        torch.testing.assert_close(got[keep], want[keep], rtol=1.6e-2, atol=1e-30)
    x = torch.ones(2, 40, dtype=torch.bfloat16)
    x[0, 5] = float("nan")
    out, _ = fused_bf16.rms_norm(x, torch.ones(40, dtype=torch.bfloat16), 1e-6, None)
    assert torch.isnan(out[0]).all() and torch.equal(out[1], torch.ones(40, dtype=torch.bfloat16))


@pytest.mark.parametrize("packed", [False, True])
def test_bf16_row_lookup_matches_embedding(fused_bf16: FusedKernels, packed: bool) -> None:
    table = torch.randn(96, 24).bfloat16()
    ids = torch.tensor([0, 95, 17, 17, 48])
    stored = PackedLinearKernel.pack(table) if packed else table  # (6, 12, 16, 2) when packed
    assert fused_bf16.gather_fits(ids, stored)
    got = CpuLayerOps(fused=fused_bf16).embedding(ids, stored)
    assert torch.equal(got, REF.embedding(ids, table))
    with pytest.raises(IndexError, match="outside"):
        fused_bf16.gather_rows(torch.tensor([3, 96]), stored)


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
