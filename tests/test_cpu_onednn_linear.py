"""The oneDNN candidate of the cpu plugin's linear choice: a weight reordered once for torch's
``mkldnn._linear_pointwise`` (``onednn_linear``), measured beside the C kernels and torch.

Checked against ``F.linear`` (float32 and bf16, bias, empty and strided inputs); the decision
rule with three layouts on given timings; forcing it (``IRONLM_CPU_KERNELS=linear=onednn``),
where a tied LM head keeps a layout with rows for the embedding; SmolLM2 end to end on it,
decode graphs included, against torch's linear.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from ironlm import LLM, SamplingParams
from ironlm_cpu.isa import host_target
from ironlm_cpu.layer_ops import CpuLayerOps
from ironlm_cpu.onednn_linear import OneDnnLinear
from ironlm_cpu.op_choice import BUCKETS, decide_linear
from ironlm_cpu.tuner import KernelTuner

ONEDNN = OneDnnLinear()
needs_onednn = pytest.mark.skipif(not ONEDNN.available, reason="torch built without oneDNN")


@needs_onednn
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["f32", "bf16"])
@pytest.mark.parametrize("rows", [0, 1, 5, 70])
def test_reordered_weight_gives_the_linear(dtype: torch.dtype, rows: int) -> None:
    gen = torch.Generator().manual_seed(rows)
    w = torch.randn(48, 40, generator=gen).to(dtype)
    bias = torch.randn(48, generator=gen).to(dtype)
    packed = ONEDNN.pack(w)
    assert ONEDNN.is_packed(packed) and packed.shape == w.shape
    x = torch.randn(rows, 80, generator=gen).to(dtype)[:, ::2]  # a strided view
    for b in (None, bias):
        got = ONEDNN(x, packed, b)
        assert got.shape == (rows, 48) and got.dtype == dtype and got.is_contiguous()
        want = torch.nn.functional.linear(x.float(), w.float(), None if b is None else b.float())
        tol = 1e-4 if dtype == torch.float32 else 3e-2
        torch.testing.assert_close(got.float(), want, rtol=tol, atol=tol)


def _timings(times: dict[str, list[float]]) -> dict[str, dict[str, float]]:
    return {str(b): {c: float(t[i]) for c, t in times.items()} for i, b in enumerate(BUCKETS)}


def test_decision_with_three_layouts() -> None:
    names = ("c_bf16", "c_gemv", "onednn", "torch")
    times = {"c_bf16": [10, 20, 100, 800], "c_gemv": [9, 30, 300, 2000],
             "onednn": [12, 15, 50, 300], "torch": [100, 120, 300, 2000]}  # fmt: skip
    d = decide_linear(_timings(times), {}, names)
    # both packed layouts beat the rows everywhere; oneDNN's total is the lower
    assert d["layout"] == "onednn" and set(d["impls"].values()) == {"onednn"}
    assert "panel layout: " in d["why"] and "onednn layout taken" in d["why"]
    # slower than plain torch at one bucket: out, whatever its total
    times["onednn"] = [130, 15, 50, 300]
    d = decide_linear(_timings(times), {}, names)
    assert d["layout"] == "panel" and "onednn layout rejected, slower than torch at M=1" in d["why"]
    # a rejected candidate is out at every bucket; with rows only, the rows layout
    times["onednn"] = [12, 15, 50, 300]
    d = decide_linear(_timings(times), {"c_bf16": "M=1: disagrees", "onednn": "M=8: raised"},
                      names)  # fmt: skip
    assert d["layout"] == "rows" and d["impls"]["1"] == "c_gemv"


def _forced_ops(tmp_path: Path, forced: str) -> CpuLayerOps:
    return CpuLayerOps(tuner=KernelTuner(host_target(), tmp_path, mode="0", forced=forced))


@needs_onednn
def test_forced_onednn_keeps_rows_for_a_tied_weight(tmp_path: Path) -> None:
    ops = _forced_ops(tmp_path, "linear=onednn")
    gen = torch.Generator().manual_seed(5)
    w = torch.randn(64, 32, generator=gen)
    x = torch.randn(3, 32, generator=gen)
    stored = ops.pack_linear_weight(w)
    assert ONEDNN.is_packed(stored)
    torch.testing.assert_close(ops.linear(x, stored, None), torch.nn.functional.linear(x, w),
                               rtol=1e-4, atol=1e-4)  # fmt: skip
    # tied: the embedding looks rows up in the same tensor, so no opaque layout for it
    table = torch.randn(96, 32, generator=gen)
    tied = ops.pack_tied_weight(table)
    assert tied.layout == torch.strided
    ids = torch.tensor([0, 95, 7])
    assert torch.equal(ops.embedding(ids, tied), table[ids])
    torch.testing.assert_close(ops.lm_head(x, tied), x @ table.t(), rtol=1e-4, atol=1e-4)
    why = [d["why"] for d in ops.tuner.decisions.values()]
    assert any("not available for this shape; torch" in w for w in why)


@needs_onednn
def test_smollm2_on_onednn_matches_torch(
    smollm2_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every linear of SmolLM2 but its tied LM head on oneDNN's reordered weights, float32,
    decode graphs on: the greedy tokens of torch's linear, the weights counted."""
    params = SamplingParams(max_tokens=16, temperature=0, ignore_eos=True, logprobs=0)
    prompts = ["The capital of France is", "def fib(n):"]
    runs = {}
    for impl in ("onednn", "torch"):
        monkeypatch.setenv("IRONLM_CPU_KERNELS", f"linear={impl}")
        llm = LLM(str(smollm2_dir), device="cpu", dtype="float32", max_model_len=128,
                  kv_cache_memory=16 * 2**20)  # fmt: skip
        outs = llm.generate(prompts, params, use_tqdm=False)
        worker = llm.engine.executor.worker
        runs[impl] = ([list(o.outputs[0].token_ids) for o in outs],
                      [[next(iter(p.values())).logprob for p in o.outputs[0].logprobs]
                       for o in outs], worker.weight_bytes())  # fmt: skip
        if impl == "onednn":
            proj = worker.model_runner.model.model.layers[0].mlp.down_proj.weight
            assert ONEDNN.is_packed(proj)
            graphs = worker.model_runner.graphs
            assert graphs is not None and graphs.disabled is None and graphs.graphs
        del llm
    (tok_d, lp_d, bytes_d), (tok_t, lp_t, bytes_t) = runs["onednn"], runs["torch"]
    assert tok_d == tok_t
    for a, b in zip(lp_d, lp_t, strict=True):
        assert a == pytest.approx(b, abs=1e-3)
    assert bytes_d == bytes_t  # the reordered weights hold as many float32 values


@needs_onednn
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["f32", "bf16"])
@pytest.mark.parametrize("forced", ["", "linear=c"])
def test_onednn_is_never_a_default(tmp_path: Path, dtype: torch.dtype, forced: str) -> None:
    """Without measuring (IRONLM_CPU_TUNE=0) each weight takes the first candidate, and
    ``linear=c`` means our C kernels: neither is oneDNN, even where no panel fits (40 rows)."""
    ops = CpuLayerOps(tuner=KernelTuner(host_target(), tmp_path, mode="0", forced=forced))
    assert "onednn" in ops.chooser.linear_candidates(40, 32, dtype)
    stored = ops.pack_linear_weight(torch.randn(40, 32).to(dtype))
    assert stored.layout == torch.strided
    plan = ops.chooser.linear_plan(40, 32, dtype)
    assert "onednn" not in plan.impls


_HELD_TO_AVX2 = """
import sys, torch
from pathlib import Path
from ironlm_cpu.isa import host_target
from ironlm_cpu.layer_ops import CpuLayerOps
from ironlm_cpu.tuner import KernelTuner
ops = CpuLayerOps(tuner=KernelTuner(host_target(), Path(sys.argv[1]), mode="refresh", forced=""))
assert not ops.onednn.supports(torch.bfloat16) and ops.onednn.supports(torch.float32)
assert "onednn" not in ops.chooser.linear_candidates(64, 32, torch.bfloat16)
w, x = torch.randn(64, 32).bfloat16(), torch.randn(3, 32).bfloat16()
stored = ops.pack_linear_weight(w)  # measured, never reordered for oneDNN
assert stored.layout == torch.strided
torch.testing.assert_close(ops.linear(x, stored, None).float(),
                           torch.nn.functional.linear(x, w).float(), rtol=3e-2, atol=3e-2)
print("ok")
"""


@needs_onednn
def test_bf16_without_onednn_bf16_is_not_a_candidate(tmp_path: Path) -> None:
    """oneDNN's bf16 reorder raises where the CPU lacks avx512bw/vl/dq (AVX2-only CPUs, shown
    here by holding oneDNN to AVX2): bf16 weights then never get the candidate, and loading one
    measures the others instead of failing."""
    env = {**os.environ, "ONEDNN_MAX_CPU_ISA": "AVX2"}
    done = subprocess.run([sys.executable, "-c", _HELD_TO_AVX2, str(tmp_path)], env=env,
                          capture_output=True, text=True, timeout=300)  # fmt: skip
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr[-2000:]
