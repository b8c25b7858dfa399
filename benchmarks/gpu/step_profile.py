"""Where a decode step's time goes on a GPU: wall time per step against the GPU's busy time.

    python benchmarks/gpu/step_profile.py .gpu/llama1b --batch 1 256 --out-dir $OUT

Dummy weights, bf16, CUDA graphs on, greedy, EOS ignored. Per batch size: the wall time per
decode step of a ``generate`` (after a warm-up that captures the graphs), the GPU's busy time
per step (the sum of its kernels' times under ``torch.profiler``), the top CPU-side torch ops,
and the top Python functions (cProfile, cumulative). A step whose wall time is well above its
GPU time is bound by the host: Python, launches and copies.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import json
import pstats
import time
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile

from ironlm import LLM, SamplingParams


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("model")
    parser.add_argument("--batch", type=int, nargs="+", default=[1, 256])
    parser.add_argument("--steps", type=int, default=64)
    parser.add_argument("--input-len", type=int, default=128)
    parser.add_argument("--out-dir", default=".")
    parser.add_argument("--decode-partition-size", type=int,
                        help="keys per split-K partition of the decode kernel (backend default)")
    args = parser.parse_args()
    out_dir = Path(args.out_dir)
    options = {} if args.decode_partition_size is None else {
        "decode_partition_size": args.decode_partition_size}
    llm = LLM(args.model, device="cuda", dtype="bfloat16", load_format="dummy",
              max_model_len=1024, gpu_memory_utilization=0.45,
              attention_backend_options=options)  # fmt: skip
    gen = torch.Generator().manual_seed(1)
    result: dict[str, dict[str, float]] = {}
    for batch in args.batch:
        prompts = [{"prompt_token_ids": torch.randint(3, 49000, (args.input_len,),
                                                      generator=gen).tolist()}
                   for _ in range(batch)]  # fmt: skip
        params = SamplingParams(max_tokens=args.steps, temperature=0, ignore_eos=True)
        llm.generate(prompts, params, use_tqdm=False)  # warm-up: captures this size's graph
        torch.cuda.synchronize()
        start = time.perf_counter()
        llm.generate(prompts, params, use_tqdm=False)
        torch.cuda.synchronize()
        wall = time.perf_counter() - start
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            llm.generate(prompts, params, use_tqdm=False)
            torch.cuda.synchronize()
        events = prof.key_averages()
        gpu_us = sum(e.self_device_time_total for e in events)
        table = events.table(sort_by="self_cpu_time_total", row_limit=25)
        table += "\n" + events.table(sort_by="self_device_time_total", row_limit=15)
        tag = f"b{batch}" + (f"-p{args.decode_partition_size}" if options else "")
        (out_dir / f"ops-{tag}.txt").write_text(table)
        py = cProfile.Profile()
        py.enable()
        llm.generate(prompts, params, use_tqdm=False)
        torch.cuda.synchronize()
        py.disable()
        text = io.StringIO()
        pstats.Stats(py, stream=text).sort_stats("cumulative").print_stats(40)
        (out_dir / f"python-{tag}.txt").write_text(text.getvalue())
        # the prompt's prefill step is in every figure; steps = decode steps + 1
        result[tag] = {"wall_ms_per_step": wall / args.steps * 1e3,
                              "gpu_busy_ms_per_step": gpu_us / 1e3 / args.steps,
                              "tok_s": batch * args.steps / wall}  # fmt: skip
        print(tag, json.dumps(result[tag]), flush=True)
    name = "step-profile" + (f"-p{args.decode_partition_size}" if options else "")
    (out_dir / f"{name}.json").write_text(json.dumps(
        {"gpu": torch.cuda.get_device_name(0), "args": vars(args), "result": result}, indent=1))


if __name__ == "__main__":
    main()
