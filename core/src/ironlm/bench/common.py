"""What ``bench throughput`` and ``bench latency`` share: flags, runner specs, machine context."""

from __future__ import annotations

import argparse
import os
import sys
from dataclasses import dataclass, field
from typing import Any

from ironlm.bench.baselines import BASELINES, llama_cpp_missing_reason
from ironlm.bench.engine_args import add_engine_args, engine_kwargs
from ironlm.bench.machine import (
    ForeignLoadMeter,
    MachineLimits,
    ModelCost,
    bounds,
    describe_machine,
    dtype_bytes,
    measure_limits,
    model_cost,
)
from ironlm.bench.worker import run_in_subprocess


def add_offline_args(parser: argparse.ArgumentParser) -> None:
    """Flags of the offline benchmarks: baselines, threads, output, then the engine's own."""
    g = parser.add_argument_group("benchmark")
    g.add_argument("--baseline", action="append", choices=BASELINES, default=[],
                   help="also run this engine on the same prompts in the same run and print "
                   "ours / baseline (repeatable)")
    g.add_argument("--gguf", default=None,
                   help="GGUF file for --baseline llama-cpp (default: --model when it is one)")
    g.add_argument("--baseline-batch-size", type=int, default=None,
                   help="prompts per HF generate call (default: all prompts in one call)")
    g.add_argument("--llama-cpp-flash-attn", action="store_true",
                   help="run llama.cpp with flash attention")
    g.add_argument("--llama-cpp-batched", action="store_true",
                   help="run llama.cpp with every prompt in one batch (its batch API) instead "
                        "of one prompt after another as its server does")
    g.add_argument("--threads", type=int, default=os.cpu_count() or 1,
                   help="torch / llama.cpp threads for every engine (default: %(default)s)")
    g.add_argument("--disable-detokenize", action="store_true",
                   help="do not detokenize IronLM outputs (HF and llama.cpp never do)")
    g.add_argument("--skip-machine-limits", action="store_true",
                   help="do not measure bandwidth and matmul limits")
    g.add_argument("--result-dir", default="benchmarks/results",
                   help="folder for the JSON result (default: %(default)s)")
    g.add_argument("--result-file", default=None, help="JSON result path (overrides --result-dir)")
    add_engine_args(parser)


def baseline_problem(args: argparse.Namespace) -> str | None:
    """Why a requested baseline cannot run here (checked before any work), or None."""
    if "llama-cpp" in args.baseline:
        reason = llama_cpp_missing_reason()
        if reason is not None:
            return f"--baseline llama-cpp: {reason}"
        if gguf_path(args) is None:
            return "--baseline llama-cpp needs a GGUF file: pass --gguf PATH"
    if "hf" in args.baseline and args.model.endswith(".gguf"):
        return "--baseline hf needs an HF folder as --model (the GGUF goes to --gguf)"
    return None


def gguf_path(args: argparse.Namespace) -> str | None:
    if args.gguf:
        return str(args.gguf)
    return args.model if args.model.endswith(".gguf") else None


def runner_specs(args: argparse.Namespace, n_ctx: int) -> list[dict[str, Any]]:
    """IronLM first, then each baseline; ``n_ctx`` sizes llama.cpp's context."""
    specs: list[dict[str, Any]] = [{
        "kind": "ironlm", "model": args.model, "engine_kwargs": engine_kwargs(args),
        "detokenize": not args.disable_detokenize,
    }]
    for name in dict.fromkeys(args.baseline):
        if name == "hf":
            specs.append({"kind": "hf", "model": args.model, "seed": args.seed,
                          "dummy_weights": args.load_format == "dummy",
                          "batch_size": args.baseline_batch_size,
                          # an explicit --dtype runs HF in it too; auto: HF's float32
                          "dtype": "float32" if args.dtype == "auto" else args.dtype})
        else:
            specs.append({"kind": "llama-cpp", "gguf": gguf_path(args), "n_ctx": n_ctx,
                          "seed": args.seed, "flash_attn": args.llama_cpp_flash_attn,
                          "batched": args.llama_cpp_batched})
    return specs


@dataclass
class MachineContext:
    machine: dict[str, Any]
    limits: MachineLimits | None = None
    cost: ModelCost | None = None
    bounds: dict[str, float] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {
            "machine": self.machine,
            "limits": self.limits.to_dict() if self.limits else None,
            "model_cost": self.cost.to_dict() if self.cost else None,
            "bounds": self.bounds,
        }

    def describe(self) -> str:
        lines = [f"machine: {self.machine['cpu_model']}, {self.machine['usable_cores']} cores, "
                 f"torch {self.machine['torch']}, {self.machine['threads']} threads, load "
                 + " ".join(f"{x:.2f}" for x in self.machine["load_average_at_start"])
                 + (" at start, " + " ".join(f"{x:.2f}" for x in end) + " at end"
                    if (end := self.machine.get("load_average_at_end")) else "")]
        if self.limits:
            lines.append(f"limits: read {self.limits.read_bandwidth_gbs:.1f} GB/s, "
                         f"copy {self.limits.copy_bandwidth_gbs:.1f} GB/s, fp32 matmul "
                         f"{self.limits.matmul_gflops:.1f} GFLOP/s")
        if self.cost and self.bounds:
            lines.append(
                f"model: {self.cost.params / 1e6:.1f}M params, "
                f"{self.cost.weight_bytes_per_token / 1e6:.0f} MB read and "
                f"{self.cost.flops_per_token / 1e9:.2f} GFLOP per token -> bounds: decode "
                f"{self.bounds['decode_bandwidth_bound_tok_s']:.1f} tok/s (bandwidth), batch "
                f"{self.bounds['batch_compute_bound_tok_s']:.1f} tok/s (compute)")
        return "\n".join(lines)


def machine_context(args: argparse.Namespace) -> MachineContext:
    """Describe the machine (load at start), measure its limits and the model's cost."""
    ctx = MachineContext(describe_machine(args.threads))
    if args.skip_machine_limits:
        return ctx
    print("measuring machine limits (bandwidth, matmul)...", file=sys.stderr)
    ctx.limits = measure_limits(args.threads)
    try:
        from ironlm.model_loader import resolve_model

        ctx.cost = model_cost(resolve_model(args.model, args.trust_remote_code).hf_config,
                              dtype_bytes(args.dtype))
    except (ValueError, TypeError, KeyError, OSError) as exc:  # unknown architecture: no bounds
        print(f"note: cannot count the model's parameters ({exc}); no bounds", file=sys.stderr)
        return ctx
    ctx.bounds = bounds(ctx.limits, ctx.cost)
    return ctx


def run_engine(spec: dict[str, Any], threads: int, jobs: list[dict[str, Any]]) -> dict[str, Any]:
    """Run one engine's jobs in its own process; adds ``foreign_cpu_share``: the CPU share
    other processes took meanwhile (a disturbed measurement is flagged, not hidden)."""
    meter = ForeignLoadMeter()
    result = run_in_subprocess({"runner": spec, "threads": threads, "jobs": jobs})
    share = meter.stop()["foreign_cpu_share"]
    result["foreign_cpu_share"] = share
    if share is not None and share > 0.05:
        print(f"warning: other processes used {100 * share:.0f}% of the CPU while "
              f"{spec['kind']} ran: its figures are disturbed", file=sys.stderr)
    return result


def fraction(value: float | None, bound: float | None) -> float | None:
    if value is None or not bound:
        return None
    return value / bound
