"""``ironlm bench throughput``: offline batch throughput, IronLM against baselines, same run.

    ironlm bench throughput --model M --num-prompts 64 --input-len 64 --output-len 128 \\
        --max-model-len 512 --kv-cache-memory 512MiB --baseline hf

Every engine runs in its own process (peak RSS per engine), on the same seeded prompts,
greedy, EOS ignored: each request makes exactly ``--output-len`` tokens. Per engine: a short
warm-up request, the batch (all prompts handed over at once), then one single-stream request
for the decode rate. The machine's bandwidth and matmul limits are measured in the same run.
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
    fraction,
    machine_context,
    run_engine,
    runner_specs,
)
from ironlm.bench.engine_args import engine_kwargs
from ironlm.bench.lora import add_lora_args, figures, lora_runs, lora_table
from ironlm.bench.prompts import file_prompts, load_tokenizer, random_token_prompts
from ironlm.bench.results import (
    args_dict,
    batch_figures,
    comparison_table,
    mib,
    result_path,
    single_stream_figures,
    write_result,
)
from ironlm.bench.runners import BatchTiming
from ironlm.bench.worker import WorkerError

WARMUP_TOKENS = 4

METRICS: list[tuple[str, str, bool | None]] = [
    ("requests_per_s", "requests/s", True),
    ("output_tok_s", "output tok/s", True),
    ("total_tok_s", "total tok/s", True),
    ("ttft_batch_s", "TTFT batch (s)", False),
    ("ttft_mean_s", "TTFT mean (s)", False),
    ("single_decode_tok_s", "1-stream decode tok/s", True),
    ("single_ttft_s", "1-stream TTFT (s)", False),
    ("peak_rss_mib", "peak RSS (MiB)", False),
    ("kv_cache_mib", "KV cache (MiB)", False),
    ("compute_bound_fraction", "batch / compute bound", True),
    ("bandwidth_bound_fraction", "decode / bandwidth bound", True),
    ("foreign_cpu_share", "other processes' CPU share", None),
]


def add_cli_args(parser: argparse.ArgumentParser) -> None:
    w = parser.add_argument_group("workload")
    w.add_argument("--num-prompts", type=int, default=64, help="requests (default: %(default)s)")
    w.add_argument("--input-len", type=int, default=64,
                   help="tokens per random prompt (default: %(default)s)")
    w.add_argument("--output-len", type=int, default=128,
                   help="tokens generated per request (default: %(default)s)")
    w.add_argument("--dataset", default=None,
                   help="text file, one prompt per line (instead of random token ids)")
    w.add_argument("--no-single-stream", dest="single_stream", action="store_false",
                   help="skip the single-request decode measurement after the batch")
    add_lora_args(parser)
    add_offline_args(parser)


def make_prompts(args: argparse.Namespace) -> list[list[int]]:
    tokenizer = load_tokenizer(args.model, args.tokenizer)
    if args.dataset:
        return file_prompts(args.dataset, args.num_prompts, tokenizer)
    return random_token_prompts(args.num_prompts, args.input_len, tokenizer, args.seed)


def engine_figures(result: dict[str, Any], ctx: MachineContext) -> dict[str, Any]:
    runs = result["results"]
    fig = batch_figures(BatchTiming.from_dict(runs["batch"][0]))
    if "single" in runs:
        single = single_stream_figures(BatchTiming.from_dict(runs["single"][0]))
        fig["single_decode_tok_s"] = single["decode_tok_s"]
        fig["single_ttft_s"] = single["ttft_s"]
    fig["peak_rss_mib"] = mib(result["peak_rss_bytes"])
    fig["rss_after_load_mib"] = mib(result["rss_after_load_bytes"])
    fig["load_s"] = result["load_seconds"]
    kv = result["info"].get("kv_cache_bytes")
    fig["kv_cache_mib"] = mib(kv)
    if kv is not None:
        fig["peak_rss_minus_kv_mib"] = mib(result["peak_rss_bytes"] - kv)
    if result["runner"] != "llama-cpp":  # its bounds differ: it reads 4-5 bit weights
        fig["compute_bound_fraction"] = fraction(
            fig["total_tok_s"], ctx.bounds.get("batch_compute_bound_tok_s"))
        fig["bandwidth_bound_fraction"] = fraction(
            fig.get("single_decode_tok_s"), ctx.bounds.get("decode_bandwidth_bound_tok_s"))
    fig["foreign_cpu_share"] = result["foreign_cpu_share"]
    fig["info"] = result["info"]
    return fig


def main(args: argparse.Namespace) -> int:
    problem = baseline_problem(args)
    if problem:
        print(f"ironlm bench throughput: {problem}", file=sys.stderr)
        return 2
    ctx = machine_context(args)
    prompts = make_prompts(args)
    n_ctx = max(len(p) for p in prompts) + args.output_len + 8
    jobs = [
        {"label": "warmup", "output_len": min(WARMUP_TOKENS, args.output_len),
         "batches": [[prompts[0]]]},
        {"label": "batch", "output_len": args.output_len, "batches": [prompts]},
    ]
    if args.single_stream:
        jobs.append({"label": "single", "output_len": args.output_len, "batches": [[prompts[0]]]})
    engines: dict[str, dict[str, Any]] = {}
    for spec in runner_specs(args, n_ctx):
        print(f"running {spec['kind']}: {len(prompts)} prompts x {args.output_len} tokens...",
              file=sys.stderr)
        try:
            result = run_engine(spec, args.threads, jobs)
        except WorkerError as exc:
            print(f"ironlm bench throughput: {exc}", file=sys.stderr)
            return 1
        engines[result["runner"]] = engine_figures(result, ctx)
    lora_engines: dict[str, dict[str, Any]] = {}
    for label, spec in lora_runs(args, engine_kwargs(args)):  # same prompts, batch job only
        print(f"running {label}: {len(prompts)} prompts x {args.output_len} tokens...",
              file=sys.stderr)
        try:
            lora_engines[label] = figures(run_engine(spec, args.threads, jobs[:2]))
        except WorkerError as exc:
            print(f"ironlm bench throughput: {exc}", file=sys.stderr)
            return 1
    ctx.machine["load_average_at_end"] = list(os.getloadavg())
    table, ratios = comparison_table(METRICS, engines)
    print(ctx.describe())
    print(f"workload: {len(prompts)} prompts, {sum(len(p) for p in prompts)} prompt tokens, "
          f"{args.output_len} output tokens each")
    print(table)
    if lora_engines:
        print("\nLoRA: prompts spread round-robin over N adapters (ironlm-loraN); vs the base "
              "model alone (ironlm)")
        print(lora_table({"ironlm": engines["ironlm"], **lora_engines}))
    payload = {"kind": "throughput", **ctx.to_dict(), "args": args_dict(args),
               "engines": engines, "ratios": ratios, "lora": lora_engines}
    path = write_result(args.result_file or result_path(args.result_dir, "throughput", args.model),
                        payload)
    print(f"result: {path}")
    return 0
