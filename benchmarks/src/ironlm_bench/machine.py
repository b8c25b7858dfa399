"""The machine a benchmark ran on, and the limits it can reach, measured in the same run.

- ``describe_machine``: CPU model, cores, ISA flags, memory, torch version and threads, load.
- ``measure_limits``: read bandwidth (sum over a tensor much larger than the caches) and fp32
  and bf16 matmul GFLOP/s, best of a few repeats, at the thread count the engines use.
- ``model_cost``: parameters read (and multiplied) per generated token, from the model config.
- ``bounds``: single-stream decode is bounded by bandwidth / weight bytes per token; a large
  batch is bounded by matmul FLOP/s / (2 * params) per token (attention and sampling extra).
"""

from __future__ import annotations

import os
import platform
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

import torch

_ISA_FLAGS = ("avx", "avx2", "fma", "f16c", "avx_vnni", "avx512f", "avx512bw", "avx512vl",
              "avx512_vnni", "avx512_bf16", "avx512_fp16", "amx_tile", "amx_int8", "amx_bf16")


def _cpu_info() -> tuple[str, list[str]]:
    model, flags = platform.processor() or "unknown", []
    try:
        with open("/proc/cpuinfo") as fh:
            for line in fh:
                key, _, value = line.partition(":")
                if key.strip() == "model name" and model in ("unknown", "", "x86_64"):
                    model = value.strip()
                elif key.strip() == "flags" and not flags:
                    flags = value.split()
    except OSError:
        pass
    return model, [f for f in _ISA_FLAGS if f in flags]


def _mem_total_bytes() -> int | None:
    try:
        return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError):
        return None


def describe_machine(threads: int | None) -> dict[str, Any]:
    """What a reader needs to compare two result files: hardware, software, load at start."""
    model, isa = _cpu_info()
    try:
        affinity = len(os.sched_getaffinity(0))
    except AttributeError:
        affinity = os.cpu_count() or 1
    load1, load5, load15 = os.getloadavg()
    return {
        "cpu_model": model,
        "logical_cores": os.cpu_count(),
        "usable_cores": affinity,
        "isa": isa,
        "mem_total_bytes": _mem_total_bytes(),
        "os": platform.platform(),
        "python": sys.version.split()[0],
        "torch": torch.__version__,
        "threads": threads,
        "load_average_at_start": [load1, load5, load15],
        "cpu_platform": platform_details("cpu"),
        "time": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }


def platform_details(name: str) -> dict[str, Any]:
    """A platform's ``describe()`` (the cpu platform: ISA target, compiler, kernel choices
    measured on this machine), or {} when it is not installed."""
    from ironlm.plugin_manager import PluginManager

    for row in PluginManager().describe():
        for item in row["registered"]:
            if item["kind"] == "platform" and item["name"] == name:
                return dict(item.get("details") or {})
    return {}


def _best_seconds(fn: Callable[[], Any], repeats: int) -> float:
    fn()  # warm-up: page faults, thread pool start
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best


@dataclass
class MachineLimits:
    threads: int
    read_bandwidth_gbs: float  # GB/s (1e9) reading a float32 tensor (torch sum)
    copy_bandwidth_gbs: float  # GB/s (read + write) of a float32 tensor copy
    matmul_gflops: float  # fp32 square matmul, 2 n^3 FLOPs
    matmul_n: int  # its n
    matmul_bf16_gflops: float  # the same in bf16 (oneDNN: AMX or AVX-512 BF16 where present)
    matmul_bf16_n: int  # the size it was measured at (the probe's where bf16 is slow here)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _memory_seconds(tensor_bytes: int, repeats: int) -> tuple[float, float]:
    """Best seconds to sum (read) and to copy (read + write) a float32 tensor of that size."""
    src = torch.ones(tensor_bytes // 4, dtype=torch.float32)
    dst = torch.empty_like(src)
    return (_best_seconds(src.sum, repeats),
            _best_seconds(lambda: dst.copy_(src), repeats))


def _matmul_seconds(n: int, repeats: int, dtype: torch.dtype) -> float:
    a, b = torch.randn(n, n).to(dtype), torch.randn(n, n).to(dtype)
    out = torch.empty(n, n, dtype=dtype)
    return _best_seconds(lambda: torch.mm(a, b, out=out), repeats)


# A matmul slower than this at the probe's size has no fast path for its dtype here
SLOW_MATMUL_GFLOPS = 20.0


def _matmul_gflops(
    n: int, repeats: int, dtype: torch.dtype = torch.float32, probe_n: int = 512
) -> tuple[float, int]:
    """(GFLOP/s, size) of an (n, n) @ (n, n) matmul in ``dtype``, the best of ``repeats``. A
    probe at ``probe_n`` comes first: a dtype without a fast path on this CPU (bf16 without
    AVX-512 BF16 or AMX runs oneDNN's reference loops: 0.3 GFLOP/s on a Zen 5 held to AVX2, ~6
    minutes for the full measurement) is reported at the probe's rate and size instead."""
    if n > probe_n:
        probe = 2 * probe_n**3 / _matmul_seconds(probe_n, 1, dtype) / 1e9
        if probe < SLOW_MATMUL_GFLOPS:
            return probe, probe_n
    return 2 * n**3 / _matmul_seconds(n, repeats, dtype) / 1e9, n


def measure_limits(
    threads: int, tensor_bytes: int = 512 * 1024**2, matmul_n: int = 2048, repeats: int = 5
) -> MachineLimits:
    """Measure with ``threads`` torch threads (restored afterwards)."""
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        read_s, copy_s = _memory_seconds(tensor_bytes, repeats)
        mm, _ = _matmul_gflops(matmul_n, repeats, probe_n=matmul_n)
        mm_bf16, bf16_n = _matmul_gflops(matmul_n, repeats, torch.bfloat16)
    finally:
        torch.set_num_threads(before)
    return MachineLimits(
        threads=threads,
        read_bandwidth_gbs=tensor_bytes / read_s / 1e9,
        copy_bandwidth_gbs=2 * tensor_bytes / copy_s / 1e9,
        matmul_gflops=mm,
        matmul_n=matmul_n,
        matmul_bf16_gflops=mm_bf16,
        matmul_bf16_n=bf16_n,
    )


@dataclass
class ModelCost:
    params: int  # unique parameters of the model
    params_per_token: int  # parameters read and multiplied per token (no input-embedding table
    # when it is not tied to the LM head: decoding reads one row of it)
    bytes_per_param: int
    head_params: int = 0  # the LM head's share of params_per_token (prefill runs it once a
    # prompt, on the last position)

    @property
    def weight_bytes_per_token(self) -> int:
        return self.params_per_token * self.bytes_per_param

    @property
    def flops_per_token(self) -> int:
        return 2 * self.params_per_token

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "weight_bytes_per_token": self.weight_bytes_per_token,
                "flops_per_token": self.flops_per_token}


def model_cost(hf_config: Any, bytes_per_param: int) -> ModelCost:
    """Count parameters by building the model on the meta device (no memory, no weights)."""
    from transformers import AutoModelForCausalLM

    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(hf_config)
    params = sum(p.numel() for p in model.parameters())  # shared (tied) tensors count once
    per_token = params
    emb, head = model.get_input_embeddings(), model.get_output_embeddings()
    if emb is not None and (head is None or head.weight is not emb.weight):
        per_token -= emb.weight.numel()
    return ModelCost(params=params, params_per_token=per_token, bytes_per_param=bytes_per_param,
                     head_params=0 if head is None else head.weight.numel())


def matmul_peak(limits: MachineLimits, dtype: str) -> float:
    """GFLOP/s of the matmul an engine computing in ``dtype`` runs on."""
    return limits.matmul_bf16_gflops if dtype == "bfloat16" else limits.matmul_gflops


def bounds(limits: MachineLimits, cost: ModelCost, dtype: str) -> dict[str, float]:
    """Upper bounds in tokens/s: single-stream decode (bandwidth) and batch (compute, at the
    matmul peak of the engine's dtype: bf16's where it computes in bf16)."""
    peak = matmul_peak(limits, dtype)
    return {
        "decode_bandwidth_bound_tok_s":
            limits.read_bandwidth_gbs * 1e9 / cost.weight_bytes_per_token,
        "batch_compute_bound_tok_s": peak * 1e9 / cost.flops_per_token,
    }


def dtype_bytes(dtype: str) -> int:
    """Bytes per weight for a resolved engine dtype (never auto: see ``common.engine_dtype``)."""
    return 2 if dtype in ("float16", "half", "bfloat16") else 4


def _busy_cpu_seconds() -> float | None:
    """CPU seconds all processes spent busy since boot (/proc/stat), None without /proc."""
    try:
        with open("/proc/stat") as fh:
            fields = fh.readline().split()[1:]
    except OSError:
        return None
    user, nice, system, _idle, _iowait, irq, softirq, steal = (int(x) for x in fields[:8])
    return (user + nice + system + irq + softirq + steal) / os.sysconf("SC_CLK_TCK")


def _own_cpu_seconds() -> float:
    """CPU seconds of this process and its finished children."""
    import resource

    total = 0.0
    for who in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN):
        r = resource.getrusage(who)
        total += r.ru_utime + r.ru_stime
    return total


class ForeignLoadMeter:
    """How much CPU other processes took while a measurement ran: the machine's busy CPU time
    minus ours (this process and its waited-for children), as a share of all cores."""

    def __init__(self) -> None:
        self._start = (time.perf_counter(), _busy_cpu_seconds(), _own_cpu_seconds())

    def stop(self) -> dict[str, float | None]:
        wall = time.perf_counter() - self._start[0]
        busy, own = _busy_cpu_seconds(), _own_cpu_seconds()
        if busy is None or self._start[1] is None or wall <= 0:
            return {"foreign_cpu_share": None, "wall_s": wall}
        foreign = max((busy - self._start[1]) - (own - self._start[2]), 0.0)
        cores = os.cpu_count() or 1
        return {"foreign_cpu_share": foreign / (wall * cores), "wall_s": wall}
