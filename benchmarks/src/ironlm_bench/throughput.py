"""``ironlm bench throughput``: offline batch throughput, IronLM against baselines, same run.

    ironlm bench throughput --model M --num-prompts 64 --input-len 64 --output-len 128 \\
        --max-model-len 512 --kv-cache-memory 512MiB --baseline hf

Every engine runs in its own process (peak RSS per engine), on the same seeded prompts,
greedy (``--temperature T``: sampled from the whole distribution), EOS ignored: each request
makes exactly ``--output-len`` tokens. Per engine: a short warm-up request, the batch (all
prompts handed over at once), then one single-stream request for the decode rate. The
machine's bandwidth and matmul limits are measured in the same run.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from ironlm_bench.common import (
    MachineContext,
    OfflineReport,
    add_offline_args,
    decode_bound,
    offline_context,
    run_offline,
)
from ironlm.entrypoints.engine_args import engine_kwargs

from ironlm_bench.lora import add_lora_args, lora_section
from ironlm_bench.prompts import file_prompts, load_tokenizer, random_token_prompts
from ironlm_bench.results import batch_figures, fraction, mib, single_stream_figures
from ironlm_bench.runners import BatchTiming

WARMUP_TOKENS = 4

METRICS = ("requests_per_s", "output_tok_s", "total_tok_s", "ttft_batch_s", "ttft_mean_s",
           "single_decode_tok_s", "single_ttft_s", "peak_rss_mib", "kv_cache_mib", "weight_mib",
           "compute_bound_fraction", "roofline_bound_fraction", "bandwidth_bound_fraction",
           "foreign_cpu_share", "all_reduce_ms_per_step", "all_gather_ms_per_step",
           "pipeline_recv_ms_per_step")


def add_cli_args(parser: argparse.ArgumentParser) -> None:
    w = parser.add_argument_group("workload")
    w.add_argument("--num-prompts", type=int, default=64, help="requests (default: %(default)s)")
    w.add_argument("--input-len", type=int, default=64,
                   help="tokens per random prompt (default: %(default)s)")
    w.add_argument("--output-len", type=int, default=128,
                   help="tokens generated per request (default: %(default)s)")
    w.add_argument("--dataset", default=None,
                   help="text file, one prompt per line (instead of random token ids)")
    w.add_argument("--temperature", type=float, default=0.0,
                   help="sampling temperature of every engine's requests (default: 0, greedy); "
                        "above 0 they sample from the whole distribution (no top-k / top-p); "
                        "IronLM and the hf baselines only")
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
    batch = BatchTiming.from_dict(runs["batch"][0])
    fig = batch_figures(batch)
    if "single" in runs:
        single = single_stream_figures(BatchTiming.from_dict(runs["single"][0]))
        fig["single_decode_tok_s"] = single["decode_tok_s"]
        fig["single_ttft_s"] = single["ttft_s"]
    fig["rss_after_load_mib"] = mib(result["rss_after_load_bytes"])
    kv = result["info"].get("kv_cache_bytes")
    fig["kv_cache_mib"] = mib(kv)
    if kv is not None:
        fig["peak_rss_minus_kv_mib"] = mib(result["peak_rss_bytes"] - kv)
    if result["runner"] != "llama-cpp":  # its bounds differ: it reads 4-5 bit weights
        fig["compute_bound_fraction"] = fraction(
            fig["total_tok_s"], ctx.bounds.get("batch_compute_bound_tok_s"))
        fig["roofline_bound_fraction"] = fraction(
            fig["total_tok_s"], ctx.roofline_tok_s(batch, result["info"].get("weight_bytes")))
        fig["bandwidth_bound_fraction"] = fraction(
            fig.get("single_decode_tok_s"), decode_bound(ctx, result))
    fig.update(collective_figures(result["info"].get("collective") or []))
    return fig


def collective_figures(ranks: list[dict[str, Any]]) -> dict[str, float]:
    """Per step, the slowest rank's milliseconds in each kind of communication (includes the
    wait for the other ranks: a rank that arrives early waits inside the collective)."""
    out: dict[str, float] = {}
    for key, label in (("all_reduce_s", "all_reduce_ms_per_step"),
                       ("all_gather_s", "all_gather_ms_per_step"),
                       ("recv_s", "pipeline_recv_ms_per_step")):
        per_step = [1e3 * r[key] / r["steps"] for r in ranks if r.get("steps")]
        if per_step and max(per_step) > 0:
            out[label] = max(per_step)
    return out


def main(args: argparse.Namespace) -> int:
    ctx = offline_context(args, "throughput")
    if ctx is None:
        return 2
    if args.temperature < 0:
        print("ironlm bench throughput: --temperature must be at least 0", file=sys.stderr)
        return 2
    if args.temperature > 0 and "llama-cpp" in args.baseline:
        print("ironlm bench throughput: the llama-cpp baseline runs greedy only: drop "
              "--temperature or that baseline", file=sys.stderr)
        return 2
    prompts = make_prompts(args)
    n_ctx = max(len(p) for p in prompts) + args.output_len + 8
    jobs = [
        {"label": "warmup", "output_len": min(WARMUP_TOKENS, args.output_len),
         "batches": [[prompts[0]]], "temperature": args.temperature},
        {"label": "batch", "output_len": args.output_len, "batches": [prompts],
         "temperature": args.temperature},
    ]
    if args.single_stream:
        jobs.append({"label": "single", "output_len": args.output_len, "batches": [[prompts[0]]],
                     "temperature": args.temperature})
    report = OfflineReport(
        "throughput", METRICS, running=f"{len(prompts)} prompts x {args.output_len} tokens",
        workload=f"{len(prompts)} prompts, {sum(len(p) for p in prompts)} prompt tokens, "
                 f"{args.output_len} output tokens each, "
                 + (f"sampled at temperature {args.temperature:g}" if args.temperature > 0
                    else "greedy"),
        # LoRA runs (--lora-counts): the batch job again with the prompts over N adapters
        extra=lora_section(args, engine_kwargs(args), jobs[:2]))
    return run_offline(args, ctx, report, jobs, n_ctx, lambda result: engine_figures(result, ctx))
