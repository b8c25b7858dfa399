"""What runs each linear weight shape and each RMSNorm, decided by measurement (``tuner``).

Linear: a weight is stored in one layout, so the choice has two levels. Per layout, each
batch-size bucket (``BUCKETS``: decode of 1 and of a few sequences, a decode batch, prefill)
takes the fastest implementation that reads it:
- ``panel`` (``linear_kernel.pack``): the C kernels ``c_narrow`` (6 x 16 tiles), ``c_wide``
  (12 x 32 tiles, only offered where the target has AVX-512's 32 vector registers), ``c_bf16``;
- ``onednn`` (``onednn_linear.pack``: oneDNN's blocked format, reordered once): ``onednn``
  (``torch.ops.mkldnn._linear_pointwise``), float32 and bf16, where torch has oneDNN; never for
  a weight that embedding lookups read too (a tied LM head: its layout must have rows);
- ``rows`` (the checkpoint's (N, K)): ``torch`` (``torch.mm``: MKL / oneDNN) and, for bf16,
  ``c_gemv`` (``gemv_kernel``: few rows on the row-major weight).
A layout other than rows is a candidate only when, at every bucket, its best is no slower than
plain torch (within ``TOLERANCE``, the timing noise) and its total (geometric mean over buckets)
is lower than the rows layout's; of those candidates the lowest total wins, and without one the
weight stays row-major and each bucket runs the fastest rows implementation. Against our own
row-major gemv a bucket may be traded for a larger gain elsewhere (the bf16 LM head: the gemv
and the panel tile take turns by a few percent at one row with the VM's state, the tile is 1.4x
faster at 64 rows); against torch never, so no shape runs slower than plain torch, and every
choice is a recordable call (decode graphs work with either).

A packed layout that wins some buckets but loses another to torch (the Intel Xeon with AMX,
float32: the 12 x 32 tile 1.2-3x faster than MKL at 8-64 rows, 1.1-1.2x slower at 512) is kept
beside the rows when the best of both, bucket by bucket, is at most ``DUAL_GAIN`` of the rows'
time: layout ``panel+rows``, two copies of the weight, each bucket on the faster (panels only:
oneDNN's opaque tensors have no address to find their copy by). The layer ops bound those
copies' memory (``CpuLayerOps.dual_budget``); past it the weight keeps the rows alone, as
before (``OpPlan.single``).

Timed on random inputs of the real (N, K); for large batch buckets the weight is cut to fewer
output rows (same K) so that one call stays under ``FLOP_CAP``, and a large weight (an LM
head) to ``BYTE_CAP``: the rate per column is what is compared. The calls take turns over
copies of the weight (``COLD_BYTES``), so that it comes from beyond L2 as in a model's step.
SmolLM2-135M's five shapes take ~1-2 s on the 2-core EPYC, once per machine.
"""

from __future__ import annotations

import itertools
import math
from bisect import bisect_left
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from ironlm_cpu.fused_kernels import FusedKernels
from ironlm_cpu.gemv_kernel import RowsGemvKernel
from ironlm_cpu.linear_kernel import PANEL, PackedLinearKernel
from ironlm_cpu.onednn_linear import OneDnnLinear
from ironlm_cpu.torch_kernels import TorchKernels
from ironlm_cpu.tuner import VERSION, KernelTuner

BUCKETS = (1, 8, 64, 512)  # rows (tokens) per call
_BOUNDS = (2, 22, 181)  # m <= bound -> that bucket (geometric midpoints)
TOLERANCE = 1.05
# A packed layout that wins some buckets but loses others to torch is kept beside the rows (two
# copies of the weight) when the buckets' best of both is at most this fraction of the rows'
# time (geometric mean); the second copy's memory is bounded by the layer ops' budget.
DUAL_GAIN = 0.85
FLOP_CAP = 1e9
# Bytes of the timed weight at most, cut the same way: at one row a weight streams at the same
# rate per column from 64 MiB as from all of it, and a large vocabulary's LM head cost more to
# build than to time (Gemma 3's 262144 x 640 in bf16, the Zen 4: 1.3 s of random numbers and
# 0.4 s of packing for the one-row bucket, its full fp32 reference 0.7 GB more).
BYTE_CAP = 64 << 20
# Bytes of weight copies a linear's timing cycles through: past any core's L2. With one copy
# the weight sat in L2 across the timed calls, which favoured torch's per-call reorder of a
# bf16 weight: the Xeon (model 207), SmolLM2's 576 x 1536 bf16 at 64 rows, torch / our AMX
# tile 1 copy 266 / 177 us, 8 copies (14 MB) 332 / 205, 64 copies (113 MB) 303 / 195; the
# cached choice, timed with one copy, had given that bucket to torch (146 vs 159 us).
COLD_BYTES = 16 << 20
MAX_COPIES = 8


def weight_copies(w: torch.Tensor) -> int:
    """How many copies of ``w`` a timing cycles through (``COLD_BYTES``, at most 8)."""
    size = w.numel() * w.element_size()
    return max(1, min(MAX_COPIES, -(-COLD_BYTES // max(size, 1))))


_LAYOUT = {"c_narrow": "panel", "c_wide": "panel", "c_bf16": "panel", "c_gemv": "rows",
           "onednn": "onednn", "torch": "rows"}  # fmt: skip
PACKED_LAYOUTS = ("panel", "onednn")  # the layouts that replace the checkpoint's rows


def timed_columns(m: int, n: int, k: int, itemsize: int) -> int:
    """Output rows of the weight a linear is timed on at ``m`` rows: all ``n``, or a multiple of
    2 panels under ``FLOP_CAP`` per call and ``BYTE_CAP`` of weight."""
    cap = min(FLOP_CAP / (2 * m * k), BYTE_CAP / (k * itemsize))
    if n <= cap:
        return n
    return max(2 * PANEL, int(cap) // (2 * PANEL) * (2 * PANEL))


def bucket_index(m: int) -> int:
    return bisect_left(_BOUNDS, m)


@dataclass(frozen=True)
class OpPlan:
    """The weight layout (linear) and the implementation per bucket."""

    layout: str  # "panel" | "onednn" | "rows" ("rows" too for non-linear ops) | "panel+rows"
    # (the panels and the rows both kept, each bucket on its own)
    impls: tuple[str, ...]  # one per BUCKETS entry
    single: OpPlan | None = None  # with "+rows": the plan when only one copy may be kept

    def impl_for(self, m: int) -> str:
        return self.impls[bucket_index(m)]

    @property
    def packed_layout(self) -> str:
        """The layout the stored weight is in (the rows copy of a dual plan is kept aside)."""
        return self.layout.removesuffix("+rows")


def _plan_of(decision: dict[str, Any]) -> OpPlan:
    single = decision.get("single")
    return OpPlan(decision["layout"], tuple(decision["impls"][str(b)] for b in BUCKETS),
                  None if single is None else _plan_of(single))  # fmt: skip


def runs_on_rows(impl: str) -> bool:
    """Whether ``impl`` reads the row-major weight."""
    return _LAYOUT.get(impl, "rows") == "rows"


class OpChooser:
    """Plans for this process's linear weights and norms (measured, cached, or forced)."""

    def __init__(
        self, tuner: KernelTuner, kernel: PackedLinearKernel, fused: FusedKernels,
        torch_ops: TorchKernels, gemv: RowsGemvKernel, onednn: OneDnnLinear,
    ) -> None:  # fmt: skip
        self.tuner, self.kernel, self.fused, self.torch_ops = tuner, kernel, fused, torch_ops
        self.gemv, self.onednn = gemv, onednn
        self.forced = tuner.forced()  # raises ValueError on a bad IRONLM_CPU_KERNELS

    # -- linear ------------------------------------------------------------------------------
    def linear_candidates(
        self, n: int, k: int, dtype: torch.dtype, looked_up: bool = False
    ) -> tuple[str, ...]:
        """Implementations that can run an (n, k) weight of ``dtype`` here, default first;
        ``looked_up``: embedding lookups read the weight too (its layout must have rows)."""
        c_ok = self.kernel.available and n % PANEL == 0
        dnn = ("onednn",) if self.onednn.supports(dtype) and not looked_up else ()
        if dtype == torch.float32 and c_ok:
            # the wide tile first where it runs: the default of a start-up that cannot measure
            # (a busy machine), and the faster tile from 8 rows on every AVX-512 CPU measured
            wide = ("c_wide",) if self.kernel.target.has("avx512") else ()
            return (*wide, "c_narrow", "torch", *dnn)
        if dtype == torch.bfloat16:
            panel = ("c_bf16",) if c_ok and k % 2 == 0 else ()
            gemv = ("c_gemv",) if self.gemv.available else ()
            return (*panel, *gemv, "torch", *dnn)  # oneDNN never the default (first)
        return ("torch", *dnn) if dtype == torch.float32 else ("torch",)

    def linear_plan(
        self, n: int, k: int, dtype: torch.dtype, looked_up: bool = False
    ) -> OpPlan:
        threads = torch.get_num_threads()
        key = f"linear|{str(dtype).removeprefix('torch.')}|{n}x{k}|t{threads}|v{VERSION}"
        key += "|rows" if looked_up else ""  # fewer candidates: a decision of its own
        names = self.linear_candidates(n, k, dtype, looked_up)
        forced = self.forced.get("linear")
        if forced is not None:
            pick = [c for c in names if c == forced or (forced == "c" and c.startswith("c_"))]
            impl = pick[0] if pick else "torch"
            why = f"forced by IRONLM_CPU_KERNELS=linear={forced}" + (
                "" if pick else " (not available for this shape; torch)"
            )
            return self._fixed(key, impl, why, "forced")
        if len(names) == 1:
            return self._fixed(
                key, names[0], "the only implementation for this shape/dtype", "only"
            )
        if not self.tuner.measuring:
            return self._fixed(key, names[0], "IRONLM_CPU_TUNE=0: the default", "default")
        cached = self.tuner.lookup(key, known=names)
        if cached is not None:
            return _plan_of(cached)
        busy = self.tuner.busy_reason()
        if busy is not None:
            return self._fixed(key, names[0], busy, "busy")
        decision = self._measure_linear(n, k, dtype, names)
        decision.update(op="linear", dtype=str(dtype), shape=[n, k], threads=threads,
                        target=self.kernel.target.name, source="measured")  # fmt: skip
        self.tuner.record(key, decision)
        return _plan_of(decision)

    def _fixed(self, key: str, impl: str, why: str, source: str) -> OpPlan:
        layout = _LAYOUT.get(impl, "rows")
        decision = {"layout": layout, "impls": {str(b): impl for b in BUCKETS}, "why": why,
                    "source": source}  # fmt: skip
        self.tuner.record(key, decision, persist=False)
        return _plan_of(decision)

    def run_linear(self, impl: str, x: torch.Tensor, w: torch.Tensor,
                   bias: torch.Tensor | None) -> torch.Tensor:  # fmt: skip
        """One linear through ``impl`` (``w`` in that implementation's layout)."""
        if impl == "torch":
            return self.torch_ops.linear(x, w, bias)
        if impl == "c_gemv":
            return self.gemv(x, w, bias)
        if impl == "onednn":
            return self.onednn(x, w, bias)
        return self.kernel(x, w, bias, wide=impl == "c_wide")

    def _measure_linear(
        self, n: int, k: int, dtype: torch.dtype, names: tuple[str, ...]
    ) -> dict[str, Any]:
        gen = torch.Generator().manual_seed(n * 31 + k)
        us: dict[str, dict[str, float]] = {}
        rejected: dict[str, str] = {}
        for m in BUCKETS:
            cols = timed_columns(m, n, k, dtype.itemsize)
            w = (torch.randn(cols, k, generator=gen) / math.sqrt(k)).to(dtype)
            x = torch.randn(m, k, generator=gen).to(dtype)
            ref = torch.nn.functional.linear(x.float(), w.float())
            # the weight in each candidate's layout, in enough copies that the calls, taking
            # them in turn, read it from beyond L2 (as a model's steps do)
            rows = [w] + [w.clone() for _ in range(weight_copies(w) - 1)]
            copies = len(rows)
            stored: dict[str, list[torch.Tensor]] = {"rows": rows}
            if any(_LAYOUT[c] == "panel" for c in names):
                stored["panel"] = [self.kernel.pack(r) for r in rows]
            if "onednn" in names and "onednn" not in rejected:
                try:  # a library that refuses the weight rejects the candidate, never fatal
                    stored["onednn"] = [self.onednn.pack(r) for r in rows]
                except RuntimeError as exc:
                    rejected["onednn"] = f"M={m}: reorder: {exc}"
            turn = itertools.count()
            fns: dict[str, Callable[[], torch.Tensor]] = {
                c: (lambda c=c: self.run_linear(
                    c, x, stored[_LAYOUT[c]][next(turn) % copies], None))
                for c in names if c not in rejected
            }  # fmt: skip
            tol = 1e-3 if dtype == torch.float32 else 3e-2
            meas = self.tuner.measure(fns, ref, rtol=tol, atol=tol)
            rejected.update({c: f"M={m}: {r}" for c, r in meas.rejected.items()})
            us[str(m)] = {c: t for c, t in meas.us.items()}
        return decide_linear(us, rejected, names)

    # -- RMSNorm -----------------------------------------------------------------------------
    def norm_plan(
        self, hidden: int, residual: bool, dtype: torch.dtype = torch.float32
    ) -> OpPlan | None:
        """C or torch per rows bucket for an RMSNorm of ``hidden`` in ``dtype`` (float32 or
        bf16; None: the fused C op is not available here)."""
        if not self.fused.available:
            return None
        threads = torch.get_num_threads()
        name = str(dtype).removeprefix("torch.")
        key = f"rms_norm|{name}|{hidden}|res{int(residual)}|t{threads}|v{VERSION}"
        forced = self.forced.get("rms_norm")
        if forced is not None:
            return self._fixed(
                key, forced, f"forced by IRONLM_CPU_KERNELS=rms_norm={forced}", "forced"
            )
        if not self.tuner.measuring:
            return self._fixed(key, "c", "IRONLM_CPU_TUNE=0: the default", "default")
        cached = self.tuner.lookup(key, known=("c", "torch"))
        if cached is not None:
            return _plan_of(cached)
        busy = self.tuner.busy_reason()
        if busy is not None:
            return self._fixed(key, "c", busy, "busy")
        gen = torch.Generator().manual_seed(hidden)
        w = torch.randn(hidden, generator=gen).to(dtype)
        tol = 1e-4 if dtype == torch.float32 else 1.6e-2  # bf16: about two roundings
        impls, us, rejected = {}, {}, {}
        for m in BUCKETS:
            x = torch.randn(m, hidden, generator=gen).to(dtype)
            res = torch.randn(m, hidden, generator=gen).to(dtype) if residual else None
            meas = self.tuner.measure(
                {"c": lambda: self.fused.rms_norm(x, w, 1e-6, res)[0],
                 "torch": lambda: self.torch_ops.rms_norm(x, w, 1e-6, res)[0]},
                "torch", rtol=tol, atol=tol,
            )  # fmt: skip
            rejected.update({c: f"M={m}: {r}" for c, r in meas.rejected.items()})
            impls[str(m)] = meas.fastest() or "torch"
            us[str(m)] = meas.us
        decision = {"op": "rms_norm", "layout": "rows", "impls": impls, "us": us,
                    "rejected": rejected, "threads": threads, "shape": [hidden], "dtype": name,
                    "why": "fastest per bucket", "source": "measured"}  # fmt: skip
        self.tuner.record(key, decision)
        return _plan_of(decision)


def decide_linear(
    us: dict[str, dict[str, float]], rejected: dict[str, str], names: tuple[str, ...]
) -> dict[str, Any]:
    """The decision from per-bucket timings (``us[bucket][impl]`` in microseconds): see the
    module docstring. ``rejected`` candidates are out at every bucket."""
    ok = [c for c in names if c not in rejected and all(c in us[str(b)] for b in BUCKETS)]
    reasons: list[str] = []
    best = {lay: {str(b): min((c for c in ok if _LAYOUT[c] == lay), key=lambda c: us[str(b)][c])
                  for b in BUCKETS}
            for lay in ("rows", *PACKED_LAYOUTS) if any(_LAYOUT[c] == lay for c in ok)}  # fmt: skip
    layout = "rows"
    dual: tuple[str, dict[str, str], float] | None = None  # (packed layout, impls, time ratio)
    if "rows" not in best:
        packed = [lay for lay in PACKED_LAYOUTS if lay in best]
        if packed:  # the lowest total (log-sum of the buckets' best times)
            layout = min(packed, key=lambda lay: sum(math.log(us[b][best[lay][b]])
                                                     for b in best[lay]))  # fmt: skip
            reasons.append(f"no rows implementation passed; the {layout} layout runs every "
                           "bucket")  # fmt: skip
    else:
        scores: dict[str, float] = {}
        for lay in (lay for lay in PACKED_LAYOUTS if lay in best):
            score, slower, traded = 0.0, [], []
            for b in map(str, BUCKETS):
                p, r = best[lay][b], best["rows"][b]
                floor = "torch" if "torch" in ok else r  # plain torch: the promise never to lose to
                ratio = us[b][p] / us[b][r]
                score += math.log(ratio) / len(BUCKETS)
                if us[b][p] / us[b][floor] > TOLERANCE:
                    slower.append(f"M={b}: {p} {us[b][p] / us[b][floor]:.2f}x {floor}'s time")
                elif ratio > TOLERANCE:
                    traded.append(f"M={b}: {p} {ratio:.2f}x {r}'s time")
            if slower:
                reasons.append(f"{lay} layout rejected, slower than torch at " + ", ".join(slower))
                mixed = {b: best[lay][b] if us[b][best[lay][b]] < us[b][best["rows"][b]]
                         else best["rows"][b] for b in map(str, BUCKETS)}  # fmt: skip
                gain = math.exp(sum(math.log(us[b][mixed[b]] / us[b][best["rows"][b]])
                                    for b in mixed) / len(BUCKETS))  # fmt: skip
                if lay == "panel" and gain <= DUAL_GAIN and (dual is None or gain < dual[2]):
                    dual = (lay, mixed, gain)
            elif score < 0.0:
                scores[lay] = score
                reasons.append(
                    f"{lay} layout: {math.exp(score):.2f}x the rows layout's time (geometric "
                    f"mean over M={', '.join(map(str, BUCKETS))}), never slower than torch"
                    + (" (traded: " + ", ".join(traded) + ")" if traded else "")
                )
            else:
                reasons.append(f"{lay} layout no faster than rows overall ({math.exp(score):.2f}x)")
        if scores:
            layout = min(scores, key=lambda lay: scores[lay])
            if len(scores) > 1:
                reasons.append(f"{layout} layout taken, the faster of the two")
    single: dict[str, Any] | None = None  # what runs where no second copy is allowed
    if layout == "rows" and dual is not None:
        single = {"layout": "rows", "impls": best["rows"]}
        layout, impls = dual[0] + "+rows", dual[1]
        reasons.append(f"both layouts kept ({layout}): {dual[2]:.2f}x the rows layout's time "
                       "(geometric mean), each bucket on the faster of the two")  # fmt: skip
    elif layout in best:
        impls = best[layout]
    else:
        impls = {str(b): "torch" for b in BUCKETS}
        reasons.append("no implementation passed its check; torch kept")
    if layout == "rows" and any(c != "torch" for c in impls.values()):
        reasons.append("fastest rows implementation per bucket")
    if rejected:
        reasons.append("rejected: " + "; ".join(f"{c} ({r})" for c, r in rejected.items()))
    decision = {"layout": layout, "impls": impls, "us": us, "rejected": rejected,
                "why": "; ".join(reasons)}  # fmt: skip
    if single is not None:
        decision["single"] = single
    return decision
