"""Kernel choice by measurement (``ironlm_cpu.tuner``, ``op_choice``): the decision rule, the
candidate check that rejects a broken implementation, the per-machine cache, forced choices,
recordable torch calls in decode graphs, and what ``ironlm plugins`` shows. No timed
assertions: timings only feed the choice, and the tests check the choice's invariants."""

from __future__ import annotations

import gc
import json
import os
import time
from pathlib import Path

import pytest
import torch
from ironlm_cpu.graphs import CpuGraphCapture
from ironlm_cpu.layer_ops import CpuLayerOps, rows_copy
from ironlm_cpu.linear_kernel import PANEL, PackedLinearKernel
from ironlm_cpu.op_choice import (
    BUCKETS,
    BYTE_CAP,
    COLD_BYTES,
    FLOP_CAP,
    MAX_COPIES,
    OpChooser,
    decide_linear,
    timed_columns,
    weight_copies,
)
from ironlm_cpu.tuner import OUT_OF_RACE, ROUNDS, KernelTuner, parse_forced


@pytest.fixture(scope="module")
def kernel() -> PackedLinearKernel:
    k = PackedLinearKernel()
    if not k.available:
        pytest.skip(k.reason)
    return k


def _ops(kernel: PackedLinearKernel, cache: Path, mode: str = "1", forced: str = "") -> CpuLayerOps:
    # measure however loaded the machine is and however long it takes (the tests check the
    # mechanism, not the timings)
    return CpuLayerOps(
        kernel,
        tuner=KernelTuner(
            kernel.target,
            cache,
            mode=mode,
            forced=forced,
            min_seconds=0.002,
            busy_limit=float("inf"),
            budget_s=float("inf"),
        ),
    )


def _times(panel: list[float], torch_us: list[float]) -> dict[str, dict[str, float]]:
    return {str(b): {"c_narrow": p, "torch": t} for b, p, t in zip(BUCKETS, panel, torch_us)}


def test_rule_takes_panels_only_when_never_slower_than_torch() -> None:
    names = ("c_narrow", "torch")
    faster = decide_linear(_times([1, 2, 3, 4], [2, 4, 6, 4.1]), {}, names)
    assert faster["layout"] == "panel" and set(faster["impls"].values()) == {"c_narrow"}
    # 2x faster at decode, but 1.3x slower at prefill: both layouts, each bucket on its faster;
    # with one copy only, torch everywhere
    mixed = decide_linear(_times([1, 2, 3, 13], [2, 4, 6, 10]), {}, names)
    assert mixed["layout"] == "panel+rows" and "M=512" in mixed["why"]
    assert [mixed["impls"][str(b)] for b in BUCKETS] == ["c_narrow"] * 3 + ["torch"]
    assert mixed["single"] == {"layout": "rows", "impls": {str(b): "torch" for b in BUCKETS}}
    # slower at prefill and barely faster elsewhere: not worth a second copy
    small = decide_linear(_times([1.9, 3.8, 5.7, 13], [2, 4, 6, 10]), {}, names)
    assert small["layout"] == "rows" and set(small["impls"].values()) == {"torch"}
    assert "single" not in small
    # within the noise tolerance at one bucket, faster overall: panels
    assert decide_linear(_times([1, 2, 3, 10.3], [2, 4, 6, 10]), {}, names)["layout"] == "panel"
    slower = decide_linear(_times([3, 5, 7, 11], [2, 4, 6, 10]), {}, names)
    assert slower["layout"] == "rows"


def test_rule_picks_the_fastest_panel_kernel_per_bucket() -> None:
    us = {
        str(b): {"c_narrow": 2.0, "c_wide": 1.0 if b >= 64 else 3.0, "torch": 5.0} for b in BUCKETS
    }
    d = decide_linear(us, {}, ("c_narrow", "c_wide", "torch"))
    assert d["layout"] == "panel"
    assert [d["impls"][str(b)] for b in BUCKETS] == ["c_narrow", "c_narrow", "c_wide", "c_wide"]


def test_rejected_candidates_are_never_chosen() -> None:
    d = decide_linear(
        _times([1, 1, 1, 1], [9, 9, 9, 9]), {"c_narrow": "M=1: wrong"}, ("c_narrow", "torch")
    )
    assert d["layout"] == "rows" and "rejected: c_narrow" in d["why"]


def test_measure_rejects_raising_and_wrong_candidates(tmp_path: Path) -> None:
    from ironlm_cpu.isa import GENERIC

    tuner = KernelTuner(GENERIC, tmp_path, min_seconds=0.001)
    x = torch.randn(4, 8)
    ref = x * 2

    def broken() -> torch.Tensor:
        raise RuntimeError("kernel crashed")

    meas = tuner.measure(
        {"good": lambda: x * 2, "wrong": lambda: x * 3, "broken": broken}, ref, rtol=1e-5, atol=1e-5
    )
    assert set(meas.us) == {"good"} and meas.fastest() == "good"
    assert "disagrees" in meas.rejected["wrong"] and "kernel crashed" in meas.rejected["broken"]


def test_measure_times_far_slower_candidates_in_the_first_round_only(tmp_path: Path) -> None:
    """A candidate over ``OUT_OF_RACE`` times the fastest after one round is not timed again
    (its first-round time is kept); the others go through every round."""
    from ironlm_cpu.isa import GENERIC

    tuner = KernelTuner(GENERIC, tmp_path, min_seconds=0.003)  # the fast one: many calls a round
    x = torch.randn(4, 8)
    calls = {"fast": 0, "slow": 0}

    def fast() -> torch.Tensor:
        calls["fast"] += 1
        return x * 2

    def slow() -> torch.Tensor:  # thousands of times the fast one's best: out after round one
        calls["slow"] += 1
        time.sleep(0.05)
        return x * 2

    meas = tuner.measure({"slow": slow, "fast": fast}, x * 2, rtol=1e-5, atol=1e-5)
    assert meas.fastest() == "fast" and set(meas.us) == {"fast", "slow"}
    assert meas.us["slow"] > OUT_OF_RACE * meas.us["fast"]
    assert calls["slow"] == 1 + 1  # the check, then one timed call
    assert calls["fast"] >= 1 + ROUNDS


def test_measure_can_take_a_candidates_output_as_the_reference(tmp_path: Path) -> None:
    """``reference`` given as a candidate's name: that candidate's first call is the reference
    (no second call to check it against itself); the others are checked against it."""
    from ironlm_cpu.isa import GENERIC

    tuner = KernelTuner(GENERIC, tmp_path, min_seconds=0.0)
    x = torch.randn(4, 8)
    order: list[str] = []

    def call(name: str, factor: float) -> torch.Tensor:
        order.append(name)
        return x * factor

    meas = tuner.measure(
        {"good": lambda: call("good", 2), "wrong": lambda: call("wrong", 3),
         "ref": lambda: call("ref", 2)}, "ref", rtol=1e-5, atol=1e-5,
    )  # fmt: skip
    assert set(meas.us) == {"good", "ref"} and "disagrees" in meas.rejected["wrong"]
    # the reference, the other two checked against it, then the timed rounds (good first)
    assert order[:4] == ["ref", "good", "wrong", "good"]
    assert "wrong" not in order[3:]


def test_timed_weight_is_cut_to_the_flop_and_byte_caps() -> None:
    """A linear is timed on all of its output rows unless one call passes ``FLOP_CAP`` or the
    weight ``BYTE_CAP`` (an LM head): then on fewer, a multiple of two panels."""
    assert timed_columns(1, 576, 576, 4) == 576  # SmolLM2's layers: whole at one row
    lm_head = timed_columns(1, 262144, 640, 2)  # Gemma 3's vocabulary, bf16
    assert lm_head * 640 * 2 <= BYTE_CAP < (lm_head + 2 * PANEL) * 640 * 2
    assert lm_head % (2 * PANEL) == 0
    batch = timed_columns(512, 3072, 576, 4)  # 512 rows: under the FLOP cap
    assert 2 * 512 * batch * 576 <= FLOP_CAP and batch % (2 * PANEL) == 0 and batch < 3072
    assert timed_columns(512, 4 * PANEL, 1 << 20, 4) == 2 * PANEL  # never under two panels


def test_measured_choice_is_cached_and_is_a_candidate(
    kernel: PackedLinearKernel, tmp_path: Path
) -> None:
    ops = _ops(kernel, tmp_path)
    w = torch.randn(64, 48)
    stored = ops.pack_linear_weight(w)
    key = next(k for k in ops.tuner.decisions if k.startswith("linear|float32|64x48|"))
    first = ops.tuner.decisions[key]
    assert first["source"] == "measured"
    assert set(first["impls"].values()) <= set(ops.chooser.linear_candidates(64, 48, torch.float32))
    assert stored.dim() == (3 if first["layout"].startswith("panel") else 2)  # panel(+rows)
    x = torch.randn(5, 48)
    torch.testing.assert_close(
        ops.linear(x, stored, None), torch.nn.functional.linear(x, w), rtol=1e-4, atol=1e-4
    )
    cached = json.loads(ops.tuner.path.read_text())
    assert key in cached["choices"] and cached["machine"]["target"] == kernel.target.describe()
    # a second start-up on this machine reads the decision instead of measuring
    again = _ops(kernel, tmp_path)
    assert again.pack_linear_weight(w).shape == stored.shape
    assert again.tuner.decisions[key]["source"] == "cache"
    # refresh measures again
    fresh = _ops(kernel, tmp_path, mode="refresh")
    fresh.pack_linear_weight(w)
    assert fresh.tuner.decisions[key]["source"] == "measured"


@pytest.mark.parametrize(
    ("forced", "layout"),
    [("linear=torch", "rows"), ("linear=c", "panel"), ("linear=c_narrow", "panel")],
)
def test_forced_choice(
    kernel: PackedLinearKernel, tmp_path: Path, forced: str, layout: str
) -> None:
    ops = _ops(kernel, tmp_path, forced=forced)
    w = torch.randn(32, 16)
    stored = ops.pack_linear_weight(w)
    assert stored.dim() == (3 if layout == "panel" else 2)
    decision = next(iter(ops.tuner.decisions.values()))
    assert decision["source"] == "forced" and forced in decision["why"]
    assert not ops.tuner.path.exists()  # forced choices are not cached
    x = torch.randn(3, 16)
    torch.testing.assert_close(
        ops.linear(x, stored, None), torch.nn.functional.linear(x, w), rtol=1e-4, atol=1e-4
    )


def test_busy_machine_takes_the_default_without_caching(
    kernel: PackedLinearKernel, tmp_path: Path
) -> None:
    tuner = KernelTuner(kernel.target, tmp_path, mode="1", forced="", busy_limit=-1.0)
    ops = CpuLayerOps(kernel, tuner=tuner)
    stored = ops.pack_linear_weight(torch.randn(32, 16))
    decision = next(iter(tuner.decisions.values()))
    assert decision["source"] == "busy" and "machine busy" in decision["why"]
    assert stored.dim() == 3 and not tuner.path.exists()  # the C default, nothing cached
    refresh = KernelTuner(
        kernel.target, tmp_path, mode="refresh", forced="", busy_limit=-1.0, min_seconds=0.002
    )
    CpuLayerOps(kernel, tuner=refresh).pack_linear_weight(torch.randn(32, 16))
    assert next(iter(refresh.decisions.values()))["source"] == "measured"


def test_spent_budget_takes_the_default(kernel: PackedLinearKernel, tmp_path: Path) -> None:
    tuner = KernelTuner(kernel.target, tmp_path, mode="refresh", forced="", budget_s=0.0)
    ops = CpuLayerOps(kernel, tuner=tuner)
    ops.pack_linear_weight(torch.randn(32, 16))  # measured: nothing spent yet
    ops.pack_linear_weight(torch.randn(48, 16))  # the budget is spent now
    sources = [d["source"] for d in tuner.decisions.values()]
    assert sources == ["measured", "busy"]
    assert "budget" in list(tuner.decisions.values())[1]["why"]


def test_bad_forced_value_is_an_error(kernel: PackedLinearKernel, tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="IRONLM_CPU_KERNELS"):
        _ops(kernel, tmp_path, forced="linear=magic")
    with pytest.raises(ValueError, match="op=impl"):
        parse_forced("linear", {"linear": ("torch",)})
    with pytest.raises(ValueError, match="IRONLM_CPU_TUNE"):
        KernelTuner(kernel.target, tmp_path, mode="sometimes")


class _BrokenKernel(PackedLinearKernel):
    """The C kernel computing garbage: the choice must fall back to torch."""

    def __call__(self, x, packed, bias, wide=False):  # type: ignore[no-untyped-def]
        return super().__call__(x, packed, bias, wide) + 1.0


def test_a_failing_candidate_falls_back_to_torch(tmp_path: Path) -> None:
    broken = _BrokenKernel()
    if not broken.available:
        pytest.skip(broken.reason)
    ops = _ops(broken, tmp_path)
    w = torch.randn(32, 16)
    assert ops.pack_linear_weight(w) is w  # row-major: torch runs it
    decision = next(iter(ops.tuner.decisions.values()))
    assert set(decision["impls"].values()) == {"torch"}
    assert "c_narrow" in decision["rejected"] and "disagrees" in decision["rejected"]["c_narrow"]


def test_norm_choice_forced_to_torch_matches(kernel: PackedLinearKernel, tmp_path: Path) -> None:
    ops = _ops(kernel, tmp_path, forced="rms_norm=torch")
    x, r, w = torch.randn(3, 32), torch.randn(3, 32), torch.randn(32)
    out, res = ops.rms_norm(x, w, 1e-6, r)
    want, want_res = CpuLayerOps.__mro__[1].rms_norm(ops, x, w, 1e-6, r)
    torch.testing.assert_close(out, want)
    assert res is not None and torch.equal(res, want_res)


def test_cached_choice_of_an_unknown_implementation_is_measured_again(
    kernel: PackedLinearKernel, tmp_path: Path
) -> None:
    """The cache file is shared by every build of the plugin on the machine: an entry naming an
    implementation this build lacks (another branch's kernel) must not run here."""
    ops = _ops(kernel, tmp_path)
    w = torch.randn(64, 48)
    ops.pack_linear_weight(w)
    key = next(k for k in ops.tuner.decisions if k.startswith("linear|float32|64x48|"))
    data = json.loads(ops.tuner.path.read_text())
    data["choices"][key].update(layout="rows", impls={str(b): "c_other" for b in BUCKETS})
    ops.tuner.path.write_text(json.dumps(data))
    again = _ops(kernel, tmp_path)
    stored = again.pack_linear_weight(w)
    assert again.tuner.decisions[key]["source"] == "measured"
    x = torch.randn(5, 48)
    torch.testing.assert_close(
        again.linear(x, stored, None), torch.nn.functional.linear(x, w), rtol=1e-4, atol=1e-4
    )


def test_bf16_norm_is_measured_under_its_own_key(
    kernel: PackedLinearKernel, tmp_path: Path
) -> None:
    ops = _ops(kernel, tmp_path)
    if not ops.fused.available:
        pytest.skip(ops.fused.reason)
    for dtype in (torch.float32, torch.bfloat16):
        x, r, w = (torch.randn(3, 48).to(dtype) for _ in range(3))
        w = w[0]
        out, res = ops.rms_norm(x, w, 1e-6, r)
        want, want_res = CpuLayerOps.__mro__[1].rms_norm(ops, x, w, 1e-6, r)
        assert out.dtype == dtype
        torch.testing.assert_close(out, want, rtol=1.6e-2, atol=1e-2)
        assert res is not None and torch.equal(res, want_res)
    keys = [k for k in ops.tuner.decisions if k.startswith("rms_norm|")]
    assert sorted(k.split("|")[1] for k in keys) == ["bfloat16", "float32"]
    assert all(ops.tuner.decisions[k]["source"] == "measured" for k in keys)


def test_torch_linear_is_recorded_in_decode_graphs(
    kernel: PackedLinearKernel, tmp_path: Path
) -> None:
    """A torch-chosen linear runs as a recorded call: the replay computes new inputs' output."""
    ops = _ops(kernel, tmp_path, forced="linear=torch")
    w1, w2 = (
        ops.pack_linear_weight(torch.randn(48, 32)),
        ops.pack_linear_weight(torch.randn(32, 24)),
    )
    x = torch.randn(4, 32)
    capture = CpuGraphCapture(ops.libraries())
    graph, out = capture.capture(
        lambda: ops.linear(ops.silu_and_mul(ops.linear(x, w1, None)), w2, None)
    )
    assert len(graph) == 3  # two torch linears and one C activation, all recorded
    x.copy_(torch.randn(4, 32))
    graph.replay()
    want = torch.nn.functional.linear(ops.silu_and_mul(torch.nn.functional.linear(x, w1)), w2)
    torch.testing.assert_close(out, want, rtol=1e-5, atol=1e-5)


def test_platform_describe_and_plugins_listing(
    kernel: PackedLinearKernel, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from ironlm.commands.plugins_cmd import format_details
    from ironlm.plugin_manager import PluginManager
    from ironlm_cpu.platform import CpuPlatform

    monkeypatch.setenv("IRONLM_CACHE_DIR", str(tmp_path))
    _ops(kernel, tmp_path / "tuning").pack_linear_weight(torch.randn(32, 16))
    details = CpuPlatform().describe()
    assert details["isa_target"] == kernel.target.describe()
    assert details["default_dtype"] in ("float32", "bfloat16")
    ((key, line),) = details["kernel_choices"].items()
    assert key.startswith("linear|float32|32x16|") and "layout; M=1:" in line
    rows = PluginManager().describe()
    text = format_details(rows)
    assert "platform:cpu" in text and "isa_target: " in text and "linear|float32|32x16|" in text


def _decode_step(backend: object, seed: int) -> torch.Tensor:
    from ironlm.interfaces.attention import AttentionLayerSpec
    from ironlm_cpu.decode_choice import synthetic_decode_batch

    layer = AttentionLayerSpec(
        layer_index=0,
        num_heads=6,
        num_kv_heads=2,
        head_dim=64,
        scale=0.125,
        sliding_window=None,
        logits_soft_cap=None,
    )
    batch = synthetic_decode_batch(3, 40)
    gen = torch.Generator().manual_seed(seed)
    cache = torch.randn(2, int(batch.block_tables.numel()), 16, 2, 64, generator=gen)
    q, kv = torch.randn(3, 6, 64, generator=gen), torch.randn(3, 2, 64, generator=gen)
    return backend.forward(layer, q, kv, kv, cache, backend.build_metadata(batch))  # type: ignore[attr-defined]


@pytest.mark.parametrize("forced", ["", "decode_attention=torch", "decode_attention=c"])
def test_decode_attention_choice(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, forced: str
) -> None:
    """Measured or forced, decode rows give the torch path's answer; a torch choice turns decode
    graphs off (no graph metadata) instead of failing a capture."""
    from ironlm_cpu.attention import CpuPagedAttentionBackend
    from ironlm_cpu.decode_choice import synthetic_decode_batch

    monkeypatch.setenv("IRONLM_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("IRONLM_CPU_KERNELS", forced)
    monkeypatch.setenv("IRONLM_CPU_TUNE", "refresh")  # measure even on a busy machine
    backend = CpuPagedAttentionBackend()
    if not backend.libraries():
        pytest.skip(backend.decode_path)
    got = _decode_step(backend, 5)
    want = _decode_step(CpuPagedAttentionBackend(native_decode=False), 5)
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)
    decisions = backend._tuner.decisions  # type: ignore[union-attr]
    (decision,) = [d for k, d in decisions.items() if k.startswith("decode_attention|")]
    assert decision["impl"] in ("c", "torch")
    # prefill rows are measured only once decode rows run on the kernel
    prefill = [d for k, d in decisions.items() if k.startswith("prefill_attention|")]
    assert len(prefill) == (decision["impl"] == "c")
    if forced:
        assert decision["impl"] == forced.split("=")[1] and decision["source"] == "forced"
    graphs = backend.graph_metadata(synthetic_decode_batch(2, 8)) is not None
    assert graphs == (decision["impl"] == "c")


def _dual_ops(kernel: PackedLinearKernel, tmp_path: Path, n: int, k: int,
              budget: int | None) -> CpuLayerOps:  # fmt: skip
    """Layer ops whose cached decision for (n, k) float32 keeps both layouts: the panel tile
    at 1-64 rows, torch on the rows at prefill."""
    from ironlm_cpu.tuner import VERSION

    ops = _ops(kernel, tmp_path)
    ops.dual_budget = ops.dual_budget if budget is None else budget
    key = f"linear|float32|{n}x{k}|t{torch.get_num_threads()}|v{VERSION}"
    us = {str(b): {"c_narrow": 1.0, "torch": 2.0 if b < 512 else 0.5} for b in BUCKETS}
    decision = decide_linear(us, {}, ("c_narrow", "torch"))
    assert decision["layout"] == "panel+rows"
    ops.tuner.record(key, {**decision, "source": "measured"})
    return ops


def test_both_layouts_run_each_bucket_on_its_own_copy(
    kernel: PackedLinearKernel, tmp_path: Path
) -> None:
    w = torch.randn(64, 48)
    ops = _dual_ops(kernel, tmp_path, 64, 48, budget=None)
    stored = ops.pack_linear_weight(w)
    assert stored.dim() == 3 and ops.dual_bytes == w.numel() * 4  # panels + one rows copy
    calls: list[str] = []
    for m in (1, 8, 600):
        x = torch.randn(m, 48)
        impl = ops._linear[(stored.shape, stored.dtype, stored.layout)].impl_for(m)
        calls.append(impl)
        torch.testing.assert_close(ops.linear(x, stored, None), torch.nn.functional.linear(x, w),
                                   rtol=1e-4, atol=1e-4)  # fmt: skip
    assert calls == ["c_narrow", "c_narrow", "torch"]  # torch on the rows copy (not the panels)
    # the stored weight is the panels: embedding lookups (a tied LM head) read rows of them
    ids = torch.tensor([3, 17, 63])
    torch.testing.assert_close(ops.embedding(ids, stored), w[ids])
    # the copy lives in the weight's own storage: a parameter wrapping it (a new tensor object,
    # as the model holds it) still finds it once the returned object is gone
    param = torch.nn.Parameter(stored, requires_grad=False)
    del stored
    gc.collect()
    rows = rows_copy(param)
    assert rows is not None and torch.equal(rows, w)
    assert param.untyped_storage().nbytes() == 2 * w.numel() * 4  # freed with it, both copies
    x = torch.randn(600, 48)  # torch on that copy: the very call F.linear makes, bit for bit
    assert torch.equal(ops.linear(x, param, None), torch.nn.functional.linear(x, w))
    assert rows_copy(kernel.pack(w)) is None  # panels packed alone: no copy to find
    assert rows_copy(param[:2]) is None  # nor from a slice of them


def test_both_layouts_fall_back_to_the_rows_past_the_memory_budget(
    kernel: PackedLinearKernel, tmp_path: Path
) -> None:
    w = torch.randn(64, 48)
    ops = _dual_ops(kernel, tmp_path, 64, 48, budget=w.numel() * 4 - 1)
    stored = ops.pack_linear_weight(w)
    assert stored.dim() == 2 and ops.dual_bytes == 0  # one copy: the rows, torch everywhere
    x = torch.randn(5, 48)
    torch.testing.assert_close(ops.linear(x, stored, None), torch.nn.functional.linear(x, w),
                               rtol=1e-4, atol=1e-4)  # fmt: skip


def test_smollm2_keeps_both_copies_where_the_model_holds_its_weights(
    kernel: PackedLinearKernel, tmp_path: Path, smollm2_dir: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:  # fmt: skip
    """Cached decisions that keep both layouts for SmolLM2's float32 linears: every such weight
    the model holds (wrapped in its own parameter object) still has its row-major copy, equal
    to the checkpoint's, so prefill rows run torch on it (stop 36 lost the copies on the way
    into the model, and prefill ran the panel tile at a third of MKL's rate)."""
    from ironlm import LLM, SamplingParams
    from ironlm_cpu.tuner import VERSION
    from transformers import AutoModelForCausalLM

    monkeypatch.setenv("IRONLM_CACHE_DIR", str(tmp_path))
    tuner = KernelTuner(kernel.target, tmp_path / "tuning")
    us = {str(b): {"c_narrow": 1.0, "torch": 2.0 if b < 512 else 0.5} for b in BUCKETS}
    decision = {**decide_linear(us, {}, ("c_narrow", "torch")), "source": "measured"}
    shapes = ["960x576", "576x576", "3072x576", "576x1536"]
    for threads in range(1, (os.cpu_count() or 1) + 1):
        for shape in shapes:
            tuner.record(f"linear|float32|{shape}|t{threads}|v{VERSION}", decision)
    llm = LLM(str(smollm2_dir), device="cpu", dtype="float32", max_model_len=128,
              kv_cache_memory=16 << 20)  # fmt: skip
    model = llm.engine.executor.worker.model_runner.model
    ref = AutoModelForCausalLM.from_pretrained(str(smollm2_dir), torch_dtype=torch.float32)
    ours, theirs = model.model.layers[3], ref.model.layers[3]
    pairs = [(ours.self_attn.o_proj.weight, theirs.self_attn.o_proj.weight),
             (ours.mlp.down_proj.weight, theirs.mlp.down_proj.weight)]
    for packed, original in pairs:
        rows = rows_copy(packed)
        assert packed.dim() == 3 and rows is not None and torch.equal(rows, original)
    # the copies are memory, not weights a forward reads (the bench's decode bound uses these)
    held = {t.data_ptr(): t.numel() * t.element_size()
            for t in [*model.parameters(), *model.buffers()]}  # fmt: skip
    assert llm.engine.executor.worker.weight_bytes() == sum(held.values())
    params = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True)
    out = llm.generate(["The capital of France is"], params, use_tqdm=False)
    assert len(out[0].outputs[0].token_ids) == 8


class _SeenWeights(OpChooser):
    """Records which weight tensors each implementation was timed on."""

    def __init__(self, chooser: OpChooser) -> None:
        super().__init__(chooser.tuner, chooser.kernel, chooser.fused, chooser.torch_ops,
                         chooser.gemv, chooser.onednn)  # fmt: skip
        self.seen: dict[str, set[int]] = {}

    def run_linear(self, impl: str, x: torch.Tensor, w: torch.Tensor,
                   bias: torch.Tensor | None) -> torch.Tensor:  # fmt: skip
        self.seen.setdefault(impl, set()).add(id(w))  # oneDNN's opaque tensors have no address
        return super().run_linear(impl, x, w, bias)


def test_linear_timings_take_turns_over_copies_of_the_weight(
    kernel: PackedLinearKernel, tmp_path: Path
) -> None:
    """A small weight is timed over copies adding up past any L2 (``COLD_BYTES``), each
    candidate on every copy, so no candidate is timed on a weight that sits in L2."""
    chooser = _SeenWeights(_ops(kernel, tmp_path).chooser)
    names = chooser.linear_candidates(64, 48, torch.float32)
    chooser._measure_linear(64, 48, torch.float32, names)
    copies = weight_copies(torch.empty(64, 48))
    assert copies == MAX_COPIES  # 12 KiB a copy
    assert set(chooser.seen) == set(names)
    # every bucket times each candidate on its own set of copies (one weight: 4 at most)
    assert all(len(ids) >= copies for ids in chooser.seen.values()), chooser.seen
    big = torch.empty(COLD_BYTES // 4 + 1)  # float32: one copy is past the bytes already
    assert weight_copies(big) == 1
