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
import sys
from typing import Any

from ironlm_bench.common import (
    MachineContext,
    OfflineReport,
    add_offline_args,
    offline_context,
    run_offline,
)
from ironlm_bench.prompts import load_tokenizer, random_token_prompts
from ironlm_bench.results import fraction, latency_figures
from ironlm_bench.runners import BatchTiming

METRICS = ("latency_mean_s", "latency_p50_s", "latency_p90_s", "latency_p99_s", "ttft_mean_s",
           "decode_tok_s", "output_tok_s", "peak_rss_mib", "bandwidth_bound_fraction",
           "compute_bound_fraction", "foreign_cpu_share")


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
    if result["runner"] != "llama-cpp":  # its bounds differ: it reads 4-5 bit weights
        if batch_size == 1:
            fig["bandwidth_bound_fraction"] = fraction(
                fig["decode_tok_s"], ctx.bounds.get("decode_bandwidth_bound_tok_s"))
        total_tok = sum(sum(t.prompt_tokens) + sum(t.output_tokens) for t in timings)
        fig["compute_bound_fraction"] = fraction(
            total_tok / sum(lat["latencies_s"]), ctx.bounds.get("batch_compute_bound_tok_s"))
    return fig


def main(args: argparse.Namespace) -> int:
    if args.num_iters < 1 or args.batch_size < 1:
        print("ironlm bench latency: --num-iters and --batch-size must be at least 1",
              file=sys.stderr)
        return 2
    ctx = offline_context(args, "latency")
    if ctx is None:
        return 2
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
    report = OfflineReport(
        "latency", METRICS,
        running=f"{args.num_iters_warmup} + {args.num_iters} iterations of batch "
                f"{args.batch_size}",
        workload=f"batch {args.batch_size}, {args.input_len} prompt tokens, "
                 f"{args.output_len} output tokens, {args.num_iters} iterations")
    return run_offline(args, ctx, report, jobs, args.input_len + args.output_len + 8,
                       lambda result: engine_figures(result, ctx, args.batch_size))
