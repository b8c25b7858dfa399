"""The row-major bf16 gemv kernel (``gemv_kernel``) on every ISA target this CPU runs (AVX-512
BF16 dot products where the CPU has them, the widening path on AVX2 and generic builds), against
torch's float32 linear of the same bf16 values; and its place in the measured linear choice."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from ironlm_cpu.gemv_kernel import RowsGemvKernel
from ironlm_cpu.isa import GENERIC, IsaTarget, host_target
from ironlm_cpu.layer_ops import CpuLayerOps
from ironlm_cpu.op_choice import BUCKETS, decide_linear
from ironlm_cpu.tuner import KernelTuner


def _targets() -> list[IsaTarget]:
    """The host's best target, AVX2 where the host has more, and the generic build."""
    best = host_target()
    out = [best]
    if best.has("avx512_bf16"):
        out.append(host_target("avx512,-avx512_bf16"))
    if best.has("avx2") and best.name != "avx2":
        out.append(host_target("avx2"))
    if best != GENERIC:
        out.append(GENERIC)
    return out


@pytest.fixture(scope="module", params=_targets(), ids=lambda t: t.describe().replace(" ", ""))
def gemv(request: pytest.FixtureRequest) -> RowsGemvKernel:
    k = RowsGemvKernel(target=request.param)
    if not k.available:
        pytest.skip(k.reason)
    return k


@pytest.mark.parametrize("m", [1, 2, 3, 8, 17])
@pytest.mark.parametrize(("n", "k"), [(1, 1), (7, 33), (16, 64), (576, 576), (100, 1537)])
def test_gemv_matches_torch(gemv: RowsGemvKernel, m: int, n: int, k: int) -> None:
    """Odd n (a last group of fewer than 8 rows), k not a multiple of 32 (the masked tail) and
    of 16 (the widening path's scalar tail), an odd number of x rows (one row alone)."""
    gen = torch.Generator().manual_seed(m * 131 + n * 7 + k)
    w = (torch.randn(n, k, generator=gen) / k**0.5).bfloat16()
    x = torch.randn(m, k, generator=gen).bfloat16()
    b = torch.randn(n, generator=gen).bfloat16()
    for bias in (b, None):
        fb = None if bias is None else bias.float()
        want = torch.nn.functional.linear(x.float(), w.float(), fb)
        got = gemv(x, w, bias)
        assert got.dtype == torch.bfloat16 and got.shape == (m, n)
        # float32 sums rounded once to bf16: within one bf16 ulp of the float32 result
        torch.testing.assert_close(got.float(), want, rtol=8e-3, atol=1e-3)


def test_gemv_reads_strided_rows(gemv: RowsGemvKernel) -> None:
    """x rows need not be adjacent (a slice of a wider activation)."""
    gen = torch.Generator().manual_seed(5)
    wide = torch.randn(4, 96, generator=gen).bfloat16()
    w = torch.randn(24, 64, generator=gen).bfloat16()
    x = wide[:, 16:80]
    want = torch.nn.functional.linear(x.float(), w.float())
    torch.testing.assert_close(gemv(x, w, None).float(), want, rtol=8e-3, atol=1e-2)


def test_gemv_rounds_to_nearest_even_and_keeps_nan(gemv: RowsGemvKernel) -> None:
    # 1 + 2^-8 sits halfway between bf16 1.0 and 1 + 2^-7: nearest even is 1.0; 1 + 3 * 2^-8
    # sits halfway between 1 + 2^-7 and 1 + 2^-6: nearest even is 1 + 2^-6
    w = torch.ones(3, 2, dtype=torch.bfloat16)
    x = torch.tensor([[1.0, 2.0**-8]], dtype=torch.bfloat16)
    bias = torch.tensor([0.0, 2.0**-7, float("nan")], dtype=torch.bfloat16)
    got = gemv(x, w, bias)[0].float()
    assert got[0] == 1.0 and got[1] == 1.0 + 2.0**-6 and torch.isnan(got[2])


def test_rows_layout_takes_the_fastest_rows_implementation_per_bucket() -> None:
    """bf16 on a CPU where oneDNN wins big batches but the gemv wins decode: the weight stays
    row-major, the gemv runs 1 and 8 rows, torch 64 and 512."""
    names = ("c_bf16", "c_gemv", "torch")
    times = {"c_bf16": [10, 13, 90, 600], "c_gemv": [7, 12, 80, 700], "torch": [24, 28, 70, 350]}
    us = {str(b): {c: float(times[c][i]) for c in names} for i, b in enumerate(BUCKETS)}
    d = decide_linear(us, {}, names)
    assert d["layout"] == "rows"
    assert d["impls"] == {"1": "c_gemv", "8": "c_gemv", "64": "torch", "512": "torch"}
    assert "c_bf16 1.29x torch's time" in d["why"]  # the panel's loss to torch is named
    # a panel kernel no slower than the rows layout's best anywhere still wins
    times["c_bf16"] = [6, 10, 60, 340]
    us = {str(b): {c: float(times[c][i]) for c in names} for i, b in enumerate(BUCKETS)}
    assert decide_linear(us, {}, names)["layout"] == "panel"
    # 14% slower than the gemv at one row but never slower than torch, faster overall: the
    # bucket is traded (and named); 1.1x torch's time at 512 rows would reject it again
    times["c_bf16"] = [8, 10, 60, 340]
    us = {str(b): {c: float(times[c][i]) for c in names} for i, b in enumerate(BUCKETS)}
    d = decide_linear(us, {}, names)
    assert d["layout"] == "panel" and "traded: M=1: c_bf16 1.14x c_gemv's time" in d["why"]
    times["c_bf16"] = [8, 10, 60, 385]
    us = {str(b): {c: float(times[c][i]) for c in names} for i, b in enumerate(BUCKETS)}
    assert decide_linear(us, {}, names)["layout"] == "rows"


def test_bf16_model_runs_the_gemv_where_forced(tiny_llama_dir: Path, tmp_path: Path) -> None:
    """IRONLM_CPU_KERNELS=linear=c_gemv makes every bf16 linear row-major on the gemv; the
    layer ops then give the same logits as torch's bf16 linear, up to bf16 rounding."""
    if not RowsGemvKernel().available:
        pytest.skip("no C compiler")
    gemv_ops = CpuLayerOps(tuner=KernelTuner(host_target(), tmp_path / "a", mode="0",
                                             forced="linear=c_gemv"))  # fmt: skip
    torch_ops = CpuLayerOps(tuner=KernelTuner(host_target(), tmp_path / "b", mode="0",
                                              forced="linear=torch"))  # fmt: skip
    gen = torch.Generator().manual_seed(3)
    w = torch.randn(40, 64, generator=gen).bfloat16()
    x = torch.randn(3, 64, generator=gen).bfloat16()
    stored = gemv_ops.pack_linear_weight(w)
    assert stored.shape == w.shape  # row-major
    assert gemv_ops.chooser.linear_plan(40, 64, torch.bfloat16).impls == ("c_gemv",) * 4
    got = gemv_ops.linear(x, stored, None)
    want = torch_ops.linear(x, torch_ops.pack_linear_weight(w), None)
    torch.testing.assert_close(got.float(), want.float(), rtol=1.6e-2, atol=1e-2)
