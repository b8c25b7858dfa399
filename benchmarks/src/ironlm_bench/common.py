"""What ``bench throughput`` and ``bench latency`` share: flags, runner specs, machine context,
and the run of every engine with its report (table, JSON result)."""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from ironlm.entrypoints.engine_args import add_engine_args, engine_kwargs

from ironlm_bench.baselines import BASELINES, llama_cpp_missing_reason
from ironlm_bench.machine import (
    ForeignLoadMeter,
    MachineLimits,
    ModelCost,
    bounds,
    describe_machine,
    dtype_bytes,
    matmul_peak,
    measure_limits,
    model_cost,
    platform_details,
)
from ironlm_bench.results import args_dict, comparison_table, mib, result_path, write_result
from ironlm_bench.roofline import KvCost, batch_bound_tok_s, kv_cost
from ironlm_bench.runners import BatchTiming
from ironlm_bench.worker import WorkerError, run_in_subprocess


def add_engine_flags(parser: argparse.ArgumentParser) -> None:
    """``--model`` (required) and the engine's flags, generated as ``ironlm serve``'s are."""
    group = parser.add_argument_group("engine", "IronLM engine arguments (vLLM's names)")
    group.add_argument("--model", required=True, help="HF folder or GGUF file to benchmark")
    # one engine in this process: data parallelism is the server's (ironlm serve -dp N)
    add_engine_args(group, skip=("model", "data_parallel_size", "data_parallel_backend"))


def add_offline_args(parser: argparse.ArgumentParser) -> None:
    """Flags of the offline benchmarks: baselines, threads, output, then the engine's own."""
    g = parser.add_argument_group("benchmark")
    g.add_argument("--baseline", action="append", choices=BASELINES, default=[],
                   help="also run this engine on the same prompts in the same run and print "
                   "ours / baseline (repeatable)")
    g.add_argument("--gguf", default=None,
                   help="GGUF file for --baseline llama-cpp (default: --model when it is one)")
    g.add_argument("--baseline-model", default=None,
                   help="float model for --baseline unquantized (default: --model; needed when "
                   "--model is a quantized checkpoint or a GGUF file)")
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
    add_engine_flags(parser)


def baseline_problem(args: argparse.Namespace) -> str | None:
    """Why a requested baseline cannot run here (checked before any work), or None."""
    if "llama-cpp" in args.baseline:
        reason = llama_cpp_missing_reason()
        if reason is not None:
            return f"--baseline llama-cpp: {reason}"
        if gguf_path(args) is None:
            return "--baseline llama-cpp needs a GGUF file: pass --gguf PATH"
    if "unquantized" in args.baseline and not args.quantization and not args.baseline_model:
        return ("--baseline unquantized compares against IronLM without --quantization: pass "
                "--quantization, or a quantized --model with --baseline-model FLOAT_MODEL")
    if "unquantized" in args.baseline and not args.baseline_model and args.model.endswith(".gguf"):
        return "--baseline unquantized on a GGUF file needs --baseline-model FLOAT_MODEL"
    if "hf" in args.baseline and args.model.endswith(".gguf"):
        return "--baseline hf needs an HF folder as --model (the GGUF goes to --gguf)"
    loads_the_model = {"hf", "llama-cpp"} & set(args.baseline)
    if getattr(args, "hf_overrides", None) and loads_the_model:
        return ("--hf-overrides changes the model IronLM runs, and the hf / llama-cpp "
                "baselines would load it without them: drop one or the other")
    return None


def gguf_path(args: argparse.Namespace) -> str | None:
    if args.gguf:
        return str(args.gguf)
    return args.model if args.model.endswith(".gguf") else None


def runner_specs(args: argparse.Namespace, n_ctx: int) -> list[dict[str, Any]]:
    """IronLM first, then each baseline; ``n_ctx`` sizes llama.cpp's context."""
    kwargs = engine_kwargs(args)
    specs: list[dict[str, Any]] = [{
        "kind": "ironlm", "model": args.model, "engine_kwargs": kwargs,
        "detokenize": not args.disable_detokenize,
    }]
    if kwargs["tensor_parallel_size"] * kwargs["pipeline_parallel_size"] > 1:
        # the same engine on one rank, for the split's figures side by side with it
        one = dict(kwargs, tensor_parallel_size=1, pipeline_parallel_size=1,
                   distributed_executor_backend=None)
        specs.append({"kind": "ironlm", "name": "ironlm tp=1", "model": args.model,
                      "engine_kwargs": one, "detokenize": not args.disable_detokenize})
    for name in dict.fromkeys(args.baseline):
        if name == "unquantized":
            kwargs = dict(engine_kwargs(args), quantization=None)
            specs.append({"kind": "ironlm", "label": "unquantized",
                          "model": args.baseline_model or args.model, "engine_kwargs": kwargs,
                          "detokenize": not args.disable_detokenize})
        elif name == "hf":
            specs.append({"kind": "hf", "model": args.model, "seed": args.seed,
                          "dummy_weights": args.load_format == "dummy",
                          "batch_size": args.baseline_batch_size,
                          # HF runs in the dtype IronLM runs in (auto: the platform's)
                          "dtype": engine_dtype(args)})
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
    kv: KvCost | None = None
    dtype: str = "float32"  # the engines' (resolved, never auto)
    bounds: dict[str, float] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {
            "machine": self.machine,
            "limits": self.limits.to_dict() if self.limits else None,
            "model_cost": self.cost.to_dict() if self.cost else None,
            "kv_cost": self.kv.to_dict() if self.kv else None,
            "bounds": self.bounds,
        }

    def roofline_tok_s(self, timing: BatchTiming, held_bytes: int | None) -> float | None:
        """The batch's roofline bound (``roofline``) for an engine holding ``held_bytes`` of
        weights (None: not reported), None without limits or model cost. A pass reads the
        fewer of those and the model's float weights per token: quantized weights are fewer,
        and an untied input embedding, which a pass reads one row of, is held but not read."""
        if self.limits is None or self.cost is None or self.kv is None:
            return None
        per_pass = self.cost.weight_bytes_per_token
        return batch_bound_tok_s(
            timing.prompt_tokens, timing.output_tokens, self.cost, self.kv,
            matmul_peak(self.limits, self.dtype), self.limits.read_bandwidth_gbs,
            min(held_bytes, per_pass) if held_bytes else per_pass,
        )  # fmt: skip

    def describe(self) -> str:
        lines = [f"machine: {self.machine['cpu_model']}, {self.machine['usable_cores']} cores, "
                 f"torch {self.machine['torch']}, {self.machine['threads']} threads, load "
                 + " ".join(f"{x:.2f}" for x in self.machine["load_average_at_start"])
                 + (" at start, " + " ".join(f"{x:.2f}" for x in end) + " at end"
                    if (end := self.machine.get("load_average_at_end")) else "")]
        if self.limits:
            lines.append(f"limits: read {self.limits.read_bandwidth_gbs:.1f} GB/s, "
                         f"copy {self.limits.copy_bandwidth_gbs:.1f} GB/s, fp32 matmul "
                         f"{self.limits.matmul_gflops:.1f} GFLOP/s, bf16 matmul "
                         f"{self.limits.matmul_bf16_gflops:.1f} GFLOP/s"
                         + (f" (at {self.limits.matmul_bf16_n}: no fast bf16 path here)"
                            if self.limits.matmul_bf16_n < self.limits.matmul_n else ""))  # fmt: skip
        if self.cost and self.bounds:
            lines.append(
                f"model: {self.cost.params / 1e6:.1f}M params, "
                f"{self.cost.weight_bytes_per_token / 1e6:.0f} MB read and "
                f"{self.cost.flops_per_token / 1e9:.2f} GFLOP per token -> bounds: decode "
                f"{self.bounds['decode_bandwidth_bound_tok_s']:.1f} tok/s (bandwidth), batch "
                f"{self.bounds['batch_compute_bound_tok_s']:.1f} tok/s (compute)")
        return "\n".join(lines)


def offline_context(args: argparse.Namespace, kind: str) -> MachineContext | None:
    """None (after saying why) when a requested baseline cannot run here, checked before any
    work; else the machine context of the run (``machine_context``)."""
    problem = baseline_problem(args)
    if problem:
        print(f"ironlm bench {kind}: {problem}", file=sys.stderr)
        return None
    return machine_context(args)


def engine_dtype(args: argparse.Namespace) -> str:
    """The dtype the engine computes in: ``--dtype``, or for auto the platform's default
    (bf16 on a CPU with AVX-512 BF16, float32 on others)."""
    if args.dtype not in ("auto", None):
        return {"float": "float32", "half": "float16"}.get(args.dtype, args.dtype)
    from ironlm.plugin_manager import PluginManager

    try:
        platform = PluginManager().select_platform(args.device)
    except ValueError:  # unknown or unavailable device: the engine's start-up says why
        return "float32"
    return str(platform.default_dtype(torch.float32)).removeprefix("torch.")


def machine_context(args: argparse.Namespace) -> MachineContext:
    """Describe the machine (load at start), measure its limits and the model's cost."""
    ctx = MachineContext(describe_machine(args.threads))
    if args.skip_machine_limits:
        return ctx
    print("measuring machine limits (bandwidth, matmul)...", file=sys.stderr)
    ctx.limits = measure_limits(args.threads)
    try:
        from ironlm.model_loader import resolve_model

        ctx.dtype = engine_dtype(args)
        hf_config = resolve_model(args.model, args.trust_remote_code,
                                  getattr(args, "hf_overrides", None)).hf_config
        ctx.cost = model_cost(hf_config, dtype_bytes(ctx.dtype))
        ctx.kv = kv_cost(hf_config, dtype_bytes(ctx.dtype))
    except (ValueError, TypeError, KeyError, OSError) as exc:  # unknown architecture: no bounds
        print(f"note: cannot count the model's parameters ({exc}); no bounds", file=sys.stderr)
        return ctx
    ctx.bounds = bounds(ctx.limits, ctx.cost, ctx.dtype)
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


def decode_bound(ctx: MachineContext, result: dict[str, Any]) -> float | None:
    """Single-stream decode bound (tok/s) of one engine: read bandwidth over the weight bytes
    it holds (quantized weights read fewer), else over the model's float weight bytes."""
    held = result["info"].get("weight_bytes")
    if held and ctx.limits is not None:
        return ctx.limits.read_bandwidth_gbs * 1e9 / held
    return ctx.bounds.get("decode_bandwidth_bound_tok_s")


# Rows of the offline tables: figure key -> (label, higher is better; None: no ratio).
METRIC_LABELS: dict[str, tuple[str, bool | None]] = {
    "requests_per_s": ("requests/s", True),
    "latency_mean_s": ("latency mean (s)", False),
    "latency_p50_s": ("latency p50 (s)", False),
    "latency_p90_s": ("latency p90 (s)", False),
    "latency_p99_s": ("latency p99 (s)", False),
    "output_tok_s": ("output tok/s", True),
    "total_tok_s": ("total tok/s", True),
    "ttft_batch_s": ("TTFT batch (s)", False),
    "ttft_mean_s": ("TTFT mean (s)", False),
    "decode_tok_s": ("decode tok/s per request", True),
    "single_decode_tok_s": ("1-stream decode tok/s", True),
    "single_ttft_s": ("1-stream TTFT (s)", False),
    "peak_rss_mib": ("peak RSS (MiB)", False),
    "kv_cache_mib": ("KV cache (MiB)", False),
    "weight_mib": ("resident weights (MiB)", False),
    "compute_bound_fraction": ("batch / compute bound", True),
    "roofline_bound_fraction": ("batch / roofline bound", True),
    "bandwidth_bound_fraction": ("decode / bandwidth bound", True),
    "foreign_cpu_share": ("other processes' CPU share", None),
    "all_reduce_ms_per_step": ("all-reduce ms/step (slowest rank)", None),
    "all_gather_ms_per_step": ("all-gather ms/step (slowest rank)", None),
    "pipeline_recv_ms_per_step": ("pipeline recv ms/step (slowest rank)", None),
}


@dataclass
class OfflineReport:
    """What one offline command says around the shared run: its name, the rows of its table,
    and its lines."""

    kind: str  # "throughput" | "latency": the result's kind and the command's name
    metrics: tuple[str, ...]  # keys of METRIC_LABELS, in table order
    running: str  # after "running <engine>: " while each engine runs
    workload: str  # the "workload: ..." line above the table
    # More runs after the engines': given the engines' figures, their text (printed under the
    # table) and what the JSON result holds under "extra"; None: nothing more
    extra: Callable[[dict[str, dict[str, Any]]], tuple[str, dict[str, Any]]] | None = None


def run_offline(args: argparse.Namespace, ctx: MachineContext, report: OfflineReport,
                jobs: list[dict[str, Any]], n_ctx: int,
                figures: Callable[[dict[str, Any]], dict[str, Any]]) -> int:
    """Run IronLM then each baseline on ``jobs`` (each in its own process), turn each result
    into the command's figures plus those of the process (peak RSS, load time, others' CPU
    share), print the machine, workload and ratio table, and write the JSON result.
    Returns the command's exit status (1 when an engine failed)."""
    engines: dict[str, dict[str, Any]] = {}
    for spec in runner_specs(args, n_ctx):
        print(f"running {spec['kind']}: {report.running}...", file=sys.stderr)
        try:
            result = run_engine(spec, args.threads, jobs)
        except WorkerError as exc:
            print(f"ironlm bench {report.kind}: {exc}", file=sys.stderr)
            return 1
        fig = figures(result)
        fig["peak_rss_mib"] = mib(result["peak_rss_bytes"])
        fig["weight_mib"] = mib(result["info"].get("weight_bytes"))
        fig["load_s"] = result["load_seconds"]
        fig["foreign_cpu_share"] = result["foreign_cpu_share"]
        fig["info"] = result["info"]
        engines[result["runner"]] = fig
    extra_text, extra = "", {}
    if report.extra is not None:
        try:
            extra_text, extra = report.extra(engines)
        except WorkerError as exc:
            print(f"ironlm bench {report.kind}: {exc}", file=sys.stderr)
            return 1
    ctx.machine["load_average_at_end"] = list(os.getloadavg())
    rows = [(key, *METRIC_LABELS[key]) for key in report.metrics]
    table, ratios = comparison_table(rows, engines)
    print(ctx.describe())
    print(f"workload: {report.workload}")
    print(table)
    if extra_text:
        print(extra_text)
    payload = {"kind": report.kind, **ctx.to_dict(), "args": args_dict(args),
               "engines": engines, "ratios": ratios, "extra": extra,
               # what the cpu platform chose for each op on this machine (tuning cache)
               "kernel_choices": platform_details("cpu").get("kernel_choices", {})}
    path = write_result(
        args.result_file or result_path(args.result_dir, report.kind, args.model), payload)
    print(f"result: {path}")
    return 0
