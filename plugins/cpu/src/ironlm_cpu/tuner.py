"""Kernel choice by measurement: time each implementation of an op on the model's real shapes,
once per machine, and remember the fastest.

Why: the plugin's C kernels were tuned on one CPU (AVX2 EPYC, where they beat MKL by up to 2x
at decode shapes); on an AVX-512 Xeon torch's oneDNN / MKL path is faster at large batches. No
rule about ISAs predicts that; a few milliseconds of measurement at start-up does.

``KernelTuner.measure`` runs every candidate on the same inputs, checks its output against a
reference (a candidate that raises or disagrees is rejected with the reason, never chosen), and
times the survivors (best of a few calls, at least ``min_seconds`` of calls each). Callers turn
the timings into a decision and ``record`` it: decisions are cached in
``$IRONLM_CACHE_DIR/tuning/<machine>.json`` (default ~/.cache/ironlm), one file per machine:
CPU model and flags, ISA target, torch version; keys carry the op, dtype, shape and thread
count. A later start-up on the same machine reads the decision instead of measuring, unless it was
measured on a busy machine (load per core above ``BUSY``) by another process and the machine is
quieter now (within one process a decision never changes).

Switches: ``IRONLM_CPU_KERNELS=op=impl[,op=impl]`` forces a choice (e.g. ``linear=torch``,
``rms_norm=c``, ``decode_attention=torch``, ``prefill_attention=c``); ``IRONLM_CPU_TUNE=0``
measures nothing and takes each op's default (the C kernel where it runs; torch for prefill
attention); ``prefill_attention`` applies where decode attention runs on the C kernel, and
``=c`` sends prompts up to the longest measured length (4096 keys) to it;
``IRONLM_CPU_TUNE=refresh`` measures again,
ignoring the cache and the load. On a busy machine (load average per core above ``BUSY``)
nothing is measured: each op takes its default for this process and is measured at a later,
quieter start-up; so are the ops left when one start-up has measured for ``BUDGET_S``.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from collections.abc import Callable, Collection
from pathlib import Path
from typing import Any

import torch

from ironlm_cpu.isa import IsaTarget, host_cpu

FORCE_ENV = "IRONLM_CPU_KERNELS"
TUNE_ENV = "IRONLM_CPU_TUNE"
# op -> implementations IRONLM_CPU_KERNELS may force
KNOWN_OPS: dict[str, tuple[str, ...]] = {
    "linear": ("torch", "c", "c_narrow", "c_wide", "c_bf16", "c_gemv", "onednn"),
    "rms_norm": ("torch", "c"),
    "decode_attention": ("torch", "c"),
    "prefill_attention": ("torch", "c"),
}
ROUNDS = 3
# A candidate this many times slower than the fastest after the first round is timed no more:
# later rounds cannot turn that over, and the slow calls were most of the measuring (Gemma 3's
# prefill attention, bf16, Zen 4: torch 415 ms a call at 1 x 4096 against the kernel's 80).
OUT_OF_RACE = 2.0
BUDGET_S = 10.0  # measuring time per process (per tuner); past it, ops take their default
BUSY = 0.75  # load per core above which a measurement is redone once the machine is quieter
VERSION = 15  # bump when candidates, kernels or the decision rule change: old entries are ignored


def parse_forced(value: str | None, known: dict[str, tuple[str, ...]]) -> dict[str, str]:
    """``IRONLM_CPU_KERNELS`` -> {op: impl}; ``known`` maps each op to its implementations."""
    forced: dict[str, str] = {}
    for part in (value or "").split(","):
        if not part.strip():
            continue
        op, sep, impl = (s.strip() for s in part.partition("="))
        if not sep or op not in known or impl not in known[op]:
            choices = "; ".join(f"{o}={'|'.join(i)}" for o, i in known.items())
            raise ValueError(f"{FORCE_ENV}: bad entry {part.strip()!r}; use op=impl with {choices}")
        forced[op] = impl
    return forced


def best_seconds(fn: Callable[[], Any], min_seconds: float, max_calls: int) -> float:
    """Best time of one call of ``fn`` (already warmed up), over at least ``min_seconds`` of
    calls (and at least one, at most ``max_calls``)."""
    best, spent, calls = float("inf"), 0.0, 0
    while calls < 1 or (spent < min_seconds and calls < max_calls):
        t0 = time.perf_counter()
        fn()
        dt = time.perf_counter() - t0
        best, spent, calls = min(best, dt), spent + dt, calls + 1
    return best


def machine_load() -> float:
    """1-minute load average per usable core (other work here skews every timing)."""
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:
        cores = os.cpu_count() or 1
    return os.getloadavg()[0] / max(cores, 1)


class Measurement:
    """Microseconds per call of each candidate that ran and agreed with the reference, and
    why each other one was rejected."""

    def __init__(self) -> None:
        self.us: dict[str, float] = {}
        self.rejected: dict[str, str] = {}

    def fastest(self, among: tuple[str, ...] | None = None) -> str | None:
        names = [n for n in self.us if among is None or n in among]
        return min(names, key=lambda n: self.us[n]) if names else None


class KernelTuner:
    """Measures, caches and reports kernel choices for one process."""

    def __init__(
        self, target: IsaTarget, cache_dir: Path | None = None, mode: str | None = None,
        forced: str | None = None, min_seconds: float = 0.01, busy_limit: float = BUSY,
        budget_s: float = BUDGET_S,
    ) -> None:  # fmt: skip
        """``mode``/``forced`` default to $IRONLM_CPU_TUNE / $IRONLM_CPU_KERNELS; ``cache_dir``
        to $IRONLM_CACHE_DIR/tuning (None there as well: no cache file)."""
        self.target = target
        mode = os.environ.get(TUNE_ENV, "1") if mode is None else mode
        if mode not in ("0", "1", "refresh"):
            raise ValueError(f"{TUNE_ENV}={mode!r}: use 1 (measure once, cached), 0 or refresh")
        self.measuring = mode != "0"
        self.refresh = mode == "refresh"
        self.forced_text = os.environ.get(FORCE_ENV) if forced is None else forced
        self.min_seconds = min_seconds
        self.busy_limit = busy_limit
        self.budget_s = budget_s
        self.spent_s = 0.0  # measuring time so far in this process
        root = os.environ.get("IRONLM_CACHE_DIR") or os.path.join("~", ".cache", "ironlm")
        cache_dir = cache_dir if cache_dir is not None else Path(root).expanduser() / "tuning"
        self.path = cache_dir / f"{self.machine_key()}.json"
        self.decisions: dict[str, dict[str, Any]] = {}  # made or read in this process

    def machine(self) -> dict[str, Any]:
        cpu = host_cpu()
        return {"cpu_model": cpu.model, "cpu_groups": list(cpu.groups()),
                "target": self.target.describe(), "torch": torch.__version__,
                "tuner_version": VERSION}  # fmt: skip

    def machine_key(self) -> str:
        cpu = host_cpu()
        text = json.dumps([self.machine(), sorted(cpu.flags)], sort_keys=True)
        slug = "".join(c if c.isalnum() else "-" for c in cpu.model.lower()).strip("-")[:40]
        return f"{slug}-{self.target.name}-{hashlib.sha256(text.encode()).hexdigest()[:12]}"

    def forced(self) -> dict[str, str]:
        """{op: impl} from IRONLM_CPU_KERNELS (ValueError when malformed)."""
        return parse_forced(self.forced_text, KNOWN_OPS)

    def forced_op(self, op: str) -> str | None:
        return self.forced().get(op)

    def busy_reason(self) -> str | None:
        """Why not to measure now: the machine is busy (its load per core above the limit),
        and timings taken now would favour whatever suffers least from losing a core, not what
        is fastest. ``refresh`` measures anyway."""
        if self.spent_s > self.budget_s:
            return (f"this start-up's measuring budget ({self.budget_s:.0f} s) is spent: the "
                    f"default, measured at a later start-up")
        load = machine_load()
        if self.refresh or load <= self.busy_limit:
            return None
        return (
            f"machine busy (load {load:.1f} per core > {self.busy_limit}): the default, "
            f"measured at a later start-up on a quieter machine"
        )

    def preset(
        self, op: str, key: str, default: dict[str, Any],
        forced_fields: Callable[[str], dict[str, Any]] | None = None,
    ) -> dict[str, Any] | None:  # fmt: skip
        """The decision on ``op`` (cache key ``key``) when it needs no measuring: forced by
        ``IRONLM_CPU_KERNELS`` (plus ``forced_fields(impl)``), read from the cache, or
        ``default`` (with why) when measuring is off or the machine busy; None: measure now."""
        impl = self.forced_op(op)
        if impl is not None:
            decision = {"op": op, "impl": impl, "source": "forced",
                        "why": f"forced by {FORCE_ENV}={op}={impl}",
                        **(forced_fields(impl) if forced_fields else {})}  # fmt: skip
            self.record(key, decision, persist=False)
            return decision
        cached = self.lookup(key, known=KNOWN_OPS[op]) if self.measuring else None
        if cached is not None:
            return cached
        why = f"{TUNE_ENV}=0: the default" if not self.measuring else self.busy_reason()
        if why is None:
            return None
        decision = {"op": op, **default, "source": "default", "why": why}
        self.record(key, decision, persist=False)
        return decision

    # -- measuring ---------------------------------------------------------------------------
    def measure(
        self,
        candidates: dict[str, Callable[[], torch.Tensor]],
        reference: torch.Tensor | str,
        rtol: float,
        atol: float,
    ) -> Measurement:
        """Run each candidate once and compare with ``reference`` (or, given a candidate's name,
        with that candidate's first output: one slow call fewer), then time the ones that
        agree, in ``ROUNDS`` interleaved rounds (a burst of other work hits all of them alike;
        the best call counts); after the first round only those within ``OUT_OF_RACE`` of the
        fastest go on. A candidate that raises, or whose output differs, is rejected with the
        reason."""
        start = time.perf_counter()
        result = Measurement()
        passed: dict[str, Callable[[], torch.Tensor]] = {}
        trusted = reference if isinstance(reference, str) else None
        # the reference path itself: it raises (to the caller), or it passes
        ref = candidates[trusted]() if trusted is not None else reference
        assert isinstance(ref, torch.Tensor)
        for name, fn in candidates.items():
            if name == trusted:
                passed[name] = fn
                continue
            try:
                out = fn()
                if out.shape != ref.shape:
                    raise ValueError(f"shape {tuple(out.shape)}, expected {tuple(ref.shape)}")
                err = (out.double() - ref.double()).abs()
                bad = err > atol + rtol * ref.double().abs()
                if bool(bad.any()):
                    raise ValueError(
                        f"disagrees with the reference ({int(bad.sum())} elements, max error "
                        f"{float(err.max()):.3g})"
                    )
                passed[name] = fn
            except Exception as exc:  # a broken candidate is skipped, never fatal
                result.rejected[name] = f"{type(exc).__name__}: {exc}"
        for round_ in range(ROUNDS):
            for name, fn in passed.items():
                t = best_seconds(fn, self.min_seconds / ROUNDS, 20) * 1e6
                result.us[name] = min(result.us.get(name, t), t)
            if round_ == 0 and passed:  # the far slower ones are out (their first time kept)
                best = min(result.us[name] for name in passed)
                passed = {n: f for n, f in passed.items() if result.us[n] <= OUT_OF_RACE * best}
        self.spent_s += time.perf_counter() - start
        return result

    # -- the cache -----------------------------------------------------------------------------
    def lookup(self, key: str, known: Collection[str] = ()) -> dict[str, Any] | None:
        """A decision made earlier on this machine (None when refreshing or not cached, or, when
        ``known`` is given, when the entry picks an implementation outside it: the cache file is
        shared by every build of the plugin on this machine, and another build's candidate would
        be run on the wrong weight layout here)."""
        if self.refresh:
            return None
        entry = self._read().get(key)
        if entry is not None and known:
            picked = set(entry.get("impls", {}).values()) | ({entry["impl"]} if "impl" in entry
                                                             else set())
            if not picked <= set(known):
                return None
        if (
            entry is not None
            and entry.get("pid") != os.getpid()
            and entry.get("load", 0.0) > BUSY
            and machine_load() < entry["load"] / 2
        ):
            return None  # measured on a busy machine, which is quieter now: measure again
        if entry is not None:
            self.decisions[key] = {**entry, "source": "cache"}
        return entry

    def record(self, key: str, decision: dict[str, Any], persist: bool = True) -> None:
        """Remember a decision for this process and, when measured, in the cache file."""
        if persist:
            decision = {**decision, "load": round(machine_load(), 2), "pid": os.getpid()}
        self.decisions[key] = decision
        if not persist:
            return
        entries = self._read()
        entries[key] = {k: v for k, v in decision.items() if k != "source"}
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(json.dumps({"machine": self.machine(), "choices": entries}, indent=1))
        os.replace(tmp, self.path)  # atomic: concurrent writers lose an entry at worst

    def _read(self) -> dict[str, Any]:
        try:
            data = json.loads(self.path.read_text())
        except (OSError, ValueError):
            return {}
        choices = data.get("choices") if isinstance(data, dict) else None
        return choices if isinstance(choices, dict) else {}

    def cached(self) -> dict[str, Any]:
        """Every decision in this machine's cache file (what ``describe`` shows)."""
        return self._read()
