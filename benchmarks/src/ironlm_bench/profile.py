"""``ironlm bench profile``: where one decode step's time goes, at given batch sizes.

    ironlm bench profile --model M --batch-sizes 1,64 --input-len 64 \\
        --max-model-len 512 --kv-cache-memory 512MiB

Per batch size: B requests are prefilled, a few decode steps warm up, then ``--steps`` decode
steps are timed (wall), one is profiled with torch.profiler (torch ops by self CPU time; the
rest of the step's wall time is Python and framework overhead outside torch ops) and one with
cProfile (IronLM functions by cumulative time: scheduler, model runner, sampler, outputs).
"""

from __future__ import annotations

import argparse
import cProfile
import os
import pstats
import re
import sys
import time
from typing import Any

from ironlm.entrypoints.engine_args import engine_kwargs

from ironlm_bench.common import add_engine_flags
from ironlm_bench.machine import describe_machine, platform_details
from ironlm_bench.prompts import load_tokenizer, random_token_prompts
from ironlm_bench.results import args_dict, format_table, result_path, write_result


def add_cli_args(parser: argparse.ArgumentParser) -> None:
    g = parser.add_argument_group("profile")
    g.add_argument("--batch-sizes", default="1,64",
                   help="comma-separated decode batch sizes (default: %(default)s)")
    g.add_argument("--input-len", type=int, default=64, help="prompt tokens (default: %(default)s)")
    g.add_argument("--warmup-steps", type=int, default=3, help="decode steps before timing")
    g.add_argument("--steps", type=int, default=5, help="decode steps timed (default: %(default)s)")
    g.add_argument("--top", type=int, default=15, help="rows per table (default: %(default)s)")
    g.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    g.add_argument("--result-dir", default="benchmarks/results")
    g.add_argument("--result-file", default=None)
    add_engine_flags(parser)


# A file of ironlm or of a plugin (ironlm_cpu, ...): the part from the package folder on.
_IRONLM_FILE = re.compile(r".*/(ironlm(?:_[a-z0-9]+)?/.*)$")


def _step(engine: Any) -> None:
    engine.step()


def torch_op_table(engine: Any) -> tuple[float, list[dict[str, Any]]]:
    """Profile one step: (wall ms, torch ops sorted by self CPU ms)."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU]) as prof:
        t0 = time.perf_counter()
        engine.step()
        wall_ms = (time.perf_counter() - t0) * 1000
    ops = [
        {"op": e.key, "calls": e.count, "self_ms": e.self_cpu_time_total / 1000}
        for e in prof.key_averages()
    ]
    ops.sort(key=lambda r: -r["self_ms"])
    return wall_ms, ops


def python_table(engine: Any, top: int) -> list[dict[str, Any]]:
    """cProfile one step: IronLM functions by cumulative ms (cProfile adds its own overhead)."""
    prof = cProfile.Profile()
    prof.runcall(_step, engine)
    stats = pstats.Stats(prof)
    rows = []
    entries = stats.stats.items()  # type: ignore[attr-defined]
    for (path, line, name), (_cc, calls, tottime, cumtime, _callers) in entries:
        m = _IRONLM_FILE.match(path)
        if m is None or m.group(1).startswith("ironlm_bench/"):
            continue
        short = m.group(1)
        rows.append({"function": f"{short}:{line}({name})", "calls": calls,
                     "cum_ms": cumtime * 1000, "self_ms": tottime * 1000})
    rows.sort(key=lambda r: -r["cum_ms"])
    return rows[:top]


def profile_batch(
    engine: Any, prompts: list[list[int]], args: argparse.Namespace
) -> dict[str, Any]:
    from ironlm.sampling_params import SamplingParams

    total_steps = args.warmup_steps + args.steps + 2 + 8
    params = SamplingParams(temperature=0.0, max_tokens=total_steps, ignore_eos=True)
    ids = [f"profile-{len(prompts)}-{i}" for i in range(len(prompts))]
    for rid, p in zip(ids, prompts):
        engine.add_request(rid, {"prompt_token_ids": p}, params)
    seen: set[str] = set()
    while len(seen) < len(ids):  # prefill (possibly chunked) until every request has a token
        seen.update(o.request_id for o in engine.step() if o.outputs[0].token_ids)
    for _ in range(args.warmup_steps):
        engine.step()
    walls = []
    for _ in range(args.steps):
        t0 = time.perf_counter()
        engine.step()
        walls.append((time.perf_counter() - t0) * 1000)
    prof_wall, ops = torch_op_table(engine)
    py_rows = python_table(engine, args.top)
    engine.abort_request(ids)
    ops_ms = sum(o["self_ms"] for o in ops)
    step_ms = sum(walls) / len(walls)
    return {
        "batch_size": len(prompts),
        "step_ms_mean": step_ms,
        "step_ms_all": walls,
        "tok_s": len(prompts) / step_ms * 1000,
        "profiled_step_wall_ms": prof_wall,
        "torch_ops_self_ms": ops_ms,
        "outside_torch_ops_ms": max(prof_wall - ops_ms, 0.0),
        "top_ops": ops[: args.top],
        "python": py_rows,
    }


def format_report(r: dict[str, Any]) -> str:
    wall = r["profiled_step_wall_ms"]
    head = (f"batch {r['batch_size']}: decode step {r['step_ms_mean']:.1f} ms "
            f"({r['tok_s']:.1f} tok/s); profiled step {wall:.1f} ms = torch ops "
            f"{r['torch_ops_self_ms']:.1f} ms + outside torch ops "
            f"{r['outside_torch_ops_ms']:.1f} ms")
    ops = format_table(["torch op", "calls", "self ms", "% of step"],
                       [[o["op"], o["calls"], o["self_ms"], 100 * o["self_ms"] / wall]
                        for o in r["top_ops"]])
    py = format_table(["ironlm function (cProfile)", "calls", "cum ms", "self ms"],
                      [[p["function"], p["calls"], p["cum_ms"], p["self_ms"]]
                       for p in r["python"]])
    return f"{head}\n\n{ops}\n\n{py}"


def main(args: argparse.Namespace) -> int:
    from ironlm.config import EngineConfig
    from ironlm.engine.llm_engine import LLMEngine

    try:
        sizes = [int(x) for x in args.batch_sizes.split(",") if x.strip()]
    except ValueError:
        print(f"ironlm bench profile: bad --batch-sizes {args.batch_sizes!r}", file=sys.stderr)
        return 2
    os.environ["IRONLM_CPU_THREADS"] = str(args.threads)  # read by the cpu platform
    machine = describe_machine(args.threads)
    tokenizer = load_tokenizer(args.model, args.tokenizer)
    engine = LLMEngine(EngineConfig(model=args.model, **engine_kwargs(args)))
    reports = []
    for i, size in enumerate(sizes):
        prompts = random_token_prompts(size, args.input_len, tokenizer, args.seed + i)
        report = profile_batch(engine, prompts, args)
        print(format_report(report), end="\n\n")
        reports.append(report)
    # what the cpu platform's start-up chose for each op (measured, cached or forced)
    choices = platform_details("cpu").get("kernel_choices", {})
    print(format_table(["op|dtype|shape|threads", "choice (per rows bucket) and why"],
                       [[k, v] for k, v in choices.items()]), end="\n\n")
    payload = {"kind": "profile", "machine": machine, "args": args_dict(args),
               "kernel_choices": choices, "batches": reports}
    path = write_result(args.result_file or result_path(args.result_dir, "profile", args.model),
                        payload)
    print(f"result: {path}")
    return 0
