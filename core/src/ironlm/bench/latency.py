"""``ironlm bench latency``: end-to-end latency of one batch, repeated, against baselines.

    ironlm bench latency --model M --batch-size 1 --input-len 32 --output-len 128 \\
        --num-iters 5 --num-iters-warmup 1 --max-model-len 512 --kv-cache-memory 256MiB \\
        --baseline hf

Each iteration hands ``--batch-size`` fresh random prompts (seeded per iteration, so the prefix
cache never turns a repeat into a hit) to the engine and waits for all of them; mean and
p50/p90/p99 of those latencies, the time to first token, and per-request decode tok/s (for
batch 1: single-stream decode, compared with the bandwidth bound measured in the same run).
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any

from ironlm.bench.common import (
    MachineContext,
    add_offline_args,
    baseline_problem,
    decode_bound,
    fraction,
    machine_context,
    run_engine,
    runner_specs,
)
from ironlm.bench.prompts import load_tokenizer, random_token_prompts
from ironlm.bench.results import (
    args_dict,
    comparison_table,
    latency_figures,
    mib,
    result_path,
    write_result,
)
from ironlm.bench.runners import BatchTiming
from ironlm.bench.worker import WorkerError

METRICS: list[tuple[str, str, bool | None]] = [
    ("latency_mean_s", "latency mean (s)", False),
    ("latency_p50_s", "latency p50 (s)", False),
    ("latency_p90_s", "latency p90 (s)", False),
    ("latency_p99_s", "latency p99 (s)", False),
    ("ttft_mean_s", "TTFT mean (s)", False),
    ("decode_tok_s", "decode tok/s per request", True),
    ("output_tok_s", "output tok/s", True),
    ("peak_rss_mib", "peak RSS (MiB)", False),
    ("weight_mib", "resident weights (MiB)", False),
    ("bandwidth_bound_fraction", "decode / bandwidth bound", True),
    ("compute_bound_fraction", "batch / compute bound", True),
    ("foreign_cpu_share", "other processes' CPU share", None),
]


def add_cli_args(parser: argparse.ArgumentParser) -> None:
    w = parser.add_argument_group("workload")
    w.add_argument("--batch-size", type=int, default=8, help="requests per iteration "
                   "(default: %(default)s)")
    w.add_argument("--input-len", type=int, default=32, help="prompt tokens (default: %(default)s)")
    w.add_argument("--output-len", type=int, default=128,
                   help="tokens generated per request (default: %(default)s)")
    w.add_argument("--num-iters", type=int, default=30, help="timed iterations "
                   "(default: %(default)s)")
    w.add_argument("--num-iters-warmup", type=int, default=10,
                   help="untimed iterations first (default: %(default)s)")
    add_offline_args(parser)


def engine_figures(result: dict[str, Any], ctx: MachineContext, batch_size: int) -> dict[str, Any]:
    timings = [BatchTiming.from_dict(t) for t in result["results"]["timed"]]
    lat = latency_figures(timings)
    fig: dict[str, Any] = {f"latency_{k}_s": v for k, v in lat["latency_s"].items()}
    fig["ttft_mean_s"] = lat["ttft_s"]["mean"]
    fig["ttft_p50_s"] = lat["ttft_s"]["p50"]
    fig["decode_tok_s"] = lat["decode_tok_s_per_request"]["mean"]
    fig["output_tok_s"] = lat["output_tok_s"]
    fig["latencies_s"] = lat["latencies_s"]
    fig["iterations"] = lat["iterations"]
    fig["peak_rss_mib"] = mib(result["peak_rss_bytes"])
    fig["weight_mib"] = mib(result["info"].get("weight_bytes"))
    fig["load_s"] = result["load_seconds"]
    if result["runner"] != "llama-cpp":  # its bounds differ: it reads 4-5 bit weights
        if batch_size == 1:
            fig["bandwidth_bound_fraction"] = fraction(
                fig["decode_tok_s"], decode_bound(ctx, result))
        total_tok = sum(sum(t.prompt_tokens) + sum(t.output_tokens) for t in timings)
        fig["compute_bound_fraction"] = fraction(
            total_tok / sum(lat["latencies_s"]), ctx.bounds.get("batch_compute_bound_tok_s"))
    fig["foreign_cpu_share"] = result["foreign_cpu_share"]
    fig["info"] = result["info"]
    return fig


def main(args: argparse.Namespace) -> int:
    problem = baseline_problem(args)
    if problem:
        print(f"ironlm bench latency: {problem}", file=sys.stderr)
        return 2
    if args.num_iters < 1 or args.batch_size < 1:
        print("ironlm bench latency: --num-iters and --batch-size must be at least 1",
              file=sys.stderr)
        return 2
    ctx = machine_context(args)
    tokenizer = load_tokenizer(args.model, args.tokenizer)

    def batches(count: int, seed: int) -> list[list[list[int]]]:
        return [random_token_prompts(args.batch_size, args.input_len, tokenizer, seed + i)
                for i in range(count)]

    jobs = [
        {"label": "warmup", "output_len": args.output_len,
         "batches": batches(args.num_iters_warmup, args.seed + 1_000_000)},
        {"label": "timed", "output_len": args.output_len,
         "batches": batches(args.num_iters, args.seed)},
    ]
    engines: dict[str, dict[str, Any]] = {}
    for spec in runner_specs(args, args.input_len + args.output_len + 8):
        print(f"running {spec['kind']}: {args.num_iters_warmup} + {args.num_iters} iterations "
              f"of batch {args.batch_size}...", file=sys.stderr)
        try:
            result = run_engine(spec, args.threads, jobs)
        except WorkerError as exc:
            print(f"ironlm bench latency: {exc}", file=sys.stderr)
            return 1
        engines[result["runner"]] = engine_figures(result, ctx, args.batch_size)
    ctx.machine["load_average_at_end"] = list(os.getloadavg())
    table, ratios = comparison_table(METRICS, engines)
    print(ctx.describe())
    print(f"workload: batch {args.batch_size}, {args.input_len} prompt tokens, "
          f"{args.output_len} output tokens, {args.num_iters} iterations")
    print(table)
    payload = {"kind": "latency", **ctx.to_dict(), "args": args_dict(args),
               "engines": engines, "ratios": ratios}
    path = write_result(args.result_file or result_path(args.result_dir, "latency", args.model),
                        payload)
    print(f"result: {path}")
    return 0
