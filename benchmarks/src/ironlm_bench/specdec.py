"""``ironlm bench specdec``: speculative decoding and multi-step scheduling against plain decoding,
in one run, one engine after another in this process.

    ironlm bench specdec --model M [--draft-model D | --draft-layers 4] --output-len 128

- single-stream decode on a repetitive task (chat prompts asking to repeat / edit a paragraph,
  so the answer quotes the prompt): plain decoding, n-gram speculation and a draft model
  (``--draft-model``, or the target's first ``--draft-layers`` layers saved as a draft), with
  decode tok/s, the ratio to plain, acceptance rate, mean accepted length, and the seconds
  spent drafting and in the target;
- multi-step scheduling at each ``--batch-sizes`` (random prompts): ``--num-scheduler-steps``
  against 1, decode tok/s and milliseconds per decode step; the difference per step is the
  engine's per-step overhead the window removes.

Greedy decoding throughout, ``--output-len`` tokens per request (EOS ignored); every engine's
tokens are compared with plain decoding's (they must be identical).
"""

from __future__ import annotations

import argparse
import gc
import os
import sys
import time
from pathlib import Path
from typing import Any

from ironlm.entrypoints.engine_args import parse_size
from ironlm_bench.machine import describe_machine
from ironlm_bench.prompts import random_token_prompts
from ironlm_bench.results import format_table, ratio, result_path, write_result

PARAGRAPH = (
    "The old lighthouse stood at the end of the stone pier, its white paint peeling in the salt "
    "wind that came off the grey water every evening. Each night the keeper climbed the ninety "
    "steps of the spiral stair, trimmed the wick of the great lamp, polished the brass and the "
    "thick glass of the lens, and then sat by the window with a mug of tea to watch the fishing "
    "boats come home. He wrote the name of every boat in a leather book, with the hour it passed "
    "and the state of the sea, and he had done so for thirty-one years without missing a night."
)
ASKS = [
    f"Repeat the following paragraph exactly, word for word:\n\n{PARAGRAPH}",
    f"Rewrite the following paragraph, changing 'keeper' to 'guardian' and nothing else:\n\n"
    f"{PARAGRAPH}",
]


def add_cli_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", required=True, help="target model (HF folder or GGUF)")
    parser.add_argument("--draft-model", default=None, help="draft model sharing the tokenizer")
    parser.add_argument("--draft-layers", type=int, default=4,
                        help="without --draft-model: use the target's first N layers as the "
                        "draft, written once under --draft-dir (default: %(default)s)")
    parser.add_argument("--draft-dir", default=str(Path.home() / ".cache" / "ironlm" / "drafts"),
                        help="where shallow-copy drafts are written (default: %(default)s)")
    parser.add_argument("--num-speculative-tokens", type=int, default=5,
                        help="drafts per step with [ngram] (default: %(default)s)")
    parser.add_argument("--draft-num-speculative-tokens", type=int, default=3,
                        help="drafts per step with the draft model (default: %(default)s)")
    parser.add_argument("--ngram-prompt-lookup-max", type=int, default=4)
    parser.add_argument("--ngram-prompt-lookup-min", type=int, default=1)
    parser.add_argument("--num-scheduler-steps", type=int, default=8,
                        help="multi-step window compared with 1 (default: %(default)s)")
    parser.add_argument("--batch-sizes", default="1,8",
                        help="multi-step batch sizes, comma separated (default: %(default)s)")
    parser.add_argument("--input-len", type=int, default=64,
                        help="multi-step prompt tokens (default: %(default)s)")
    parser.add_argument("--output-len", type=int, default=128,
                        help="tokens per request (default: %(default)s)")
    parser.add_argument("--num-iters", type=int, default=2,
                        help="timed runs per engine, after one untimed (default: %(default)s)")
    parser.add_argument("--sections", default="ngram,draft,multistep",
                        help="which comparisons to run (default: %(default)s)")
    parser.add_argument("--max-model-len", type=int, default=1024)
    parser.add_argument("--kv-cache-memory", type=parse_size, default=256 << 20)
    parser.add_argument("--enforce-eager", action="store_true", help="no decode graphs")
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--result-dir", default="benchmarks/results")
    parser.add_argument("--result-file", default=None)


def _run(engine: Any, prompts: list[list[int]], output_len: int) -> dict[str, Any]:
    """Greedy ``output_len`` tokens for every prompt at once, timed per step."""
    from ironlm.sampling_params import SamplingParams

    params = SamplingParams(temperature=0, max_tokens=output_len, ignore_eos=True,
                            detokenize=False)  # fmt: skip
    base = f"b{time.monotonic_ns()}-"
    for i, p in enumerate(prompts):
        engine.add_request(f"{base}{i}", {"prompt_token_ids": p}, params)
    first: dict[str, float] = {}
    tokens: dict[str, list[int]] = {}
    start = time.perf_counter()
    while engine.has_unfinished_requests():
        for out in engine.step():
            now = time.perf_counter() - start
            first.setdefault(out.request_id, now)
            tokens[out.request_id] = list(out.outputs[0].token_ids)
    end = time.perf_counter() - start
    decode_s = end - min(first.values())
    decode_tokens = sum(len(t) - 1 for t in tokens.values())
    return {
        "decode_seconds": decode_s,
        "decode_tokens": decode_tokens,
        "outputs": [tokens[f"{base}{i}"] for i in range(len(prompts))],
    }


def _engine_figures(kwargs: dict[str, Any], batches: list[list[list[int]]], output_len: int,
                    iters: int) -> dict[str, Any]:  # fmt: skip
    """Build one engine, run one untimed batch, then ``iters`` timed passes over ``batches``."""
    from ironlm.config import EngineConfig
    from ironlm.engine.llm_engine import LLMEngine

    engine = LLMEngine(EngineConfig(**kwargs))
    try:
        _run(engine, batches[0], output_len)
        before = engine.stats()
        seconds = tokens = 0.0
        outputs = []
        steps = 0
        for _ in range(iters):
            for batch in batches:
                r = _run(engine, batch, output_len)
                seconds += r["decode_seconds"]
                tokens += r["decode_tokens"]
                outputs.append(r["outputs"])
                steps += output_len - 1
        after = engine.stats()
    finally:
        engine.shutdown()
        del engine
        gc.collect()
    fig: dict[str, Any] = {"decode_tok_s": tokens / seconds, "ms_per_decode_step":
                           1000 * seconds / steps, "outputs": outputs}  # fmt: skip
    if "spec_decode_num_draft_tokens" in after:
        delta = {k: after[k] - before[k] for k in after if k.startswith("spec_decode_num")
                 or k.endswith("time_seconds")}  # fmt: skip
        drafted, accepted = delta["spec_decode_num_draft_tokens"], delta[
            "spec_decode_num_accepted_tokens"]
        fig["acceptance_rate"] = accepted / drafted if drafted else 0.0
        verifs = delta["spec_decode_num_drafts"]
        fig["mean_accepted_length"] = (
            delta["spec_decode_num_emitted_tokens"] / verifs if verifs else 0.0)
        fig["draft_seconds"] = delta["spec_decode_draft_time_seconds"]
        fig["target_seconds"] = delta["spec_decode_target_time_seconds"]
    return fig


def _draft_path(args: argparse.Namespace) -> str:
    if args.draft_model:
        return str(args.draft_model)
    from ironlm.spec_decode.shallow_copy import write_shallow_copy

    dst = Path(args.draft_dir) / f"{Path(args.model).name}-first{args.draft_layers}layers"
    if not (dst / "config.json").is_file():
        print(f"writing the draft (first {args.draft_layers} layers) to {dst}", file=sys.stderr)
        write_shallow_copy(args.model, dst, args.draft_layers)
    return str(dst)


def main(args: argparse.Namespace) -> int:
    import torch

    from ironlm_bench.prompts import load_tokenizer

    os.environ.setdefault("IRONLM_CPU_THREADS", str(args.threads))
    torch.set_num_threads(args.threads)
    sections = {s.strip() for s in args.sections.split(",") if s.strip()}
    unknown = sections - {"ngram", "draft", "multistep"}
    if unknown or not sections:
        print(f"ironlm bench specdec: unknown --sections {sorted(unknown)}", file=sys.stderr)
        return 2
    machine = describe_machine(args.threads)
    base = {"model": args.model, "max_model_len": args.max_model_len,
            "kv_cache_memory": args.kv_cache_memory, "enforce_eager": args.enforce_eager,
            "seed": args.seed}  # fmt: skip
    tok = load_tokenizer(args.model)
    payload: dict[str, Any] = {"kind": "specdec", "machine": machine, "args": vars(args).copy()}
    payload["args"].pop("func", None)
    report: list[str] = []
    mismatches: list[str] = []  # engines whose tokens differ from plain decoding's

    if sections & {"ngram", "draft"}:
        texts = [tok.apply_chat_template([{"role": "user", "content": a}], tokenize=False,
                                         add_generation_prompt=True) for a in ASKS]
        prompts = [tok(t, add_special_tokens=False).input_ids for t in texts]
        batches = [[p] for p in prompts]  # single stream: one request at a time
        configs: dict[str, dict[str, Any]] = {"plain": {}}
        if "ngram" in sections:
            configs["ngram"] = {"speculative_model": "[ngram]",
                                "num_speculative_tokens": args.num_speculative_tokens,
                                "ngram_prompt_lookup_max": args.ngram_prompt_lookup_max,
                                "ngram_prompt_lookup_min": args.ngram_prompt_lookup_min}
        if "draft" in sections:
            configs["draft model"] = {"speculative_model": _draft_path(args),
                                      "num_speculative_tokens": args.draft_num_speculative_tokens}
        figs = {}
        for name, spec in configs.items():
            print(f"single stream, repetitive task: {name}...", file=sys.stderr)
            figs[name] = _engine_figures({**base, **spec}, batches, args.output_len, args.num_iters)
        plain = figs["plain"]
        rows = []
        for name, f in figs.items():
            if f["outputs"] != plain["outputs"]:
                mismatches.append(name)
            rows.append([name, f["decode_tok_s"], ratio(f["decode_tok_s"], plain["decode_tok_s"]),
                         f.get("acceptance_rate"), f.get("mean_accepted_length"),
                         f.get("draft_seconds"), f.get("target_seconds"),
                         "yes" if f["outputs"] == plain["outputs"] else "NO"])  # fmt: skip
        report.append("single-stream decode, repetitive task (repeat / edit a paragraph), "
                      f"{args.output_len} tokens:")
        report.append(format_table(["engine", "decode tok/s", "x plain", "acceptance",
                                    "mean accepted len", "draft s", "target s",
                                    "same tokens"], rows))  # fmt: skip
        payload["speculative"] = {n: {k: v for k, v in f.items() if k != "outputs"}
                                  for n, f in figs.items()}  # fmt: skip

    if "multistep" in sections:
        rows = []
        payload["multi_step"] = {}
        for bs in [int(b) for b in args.batch_sizes.split(",") if b.strip()]:
            batches = [random_token_prompts(bs, args.input_len, tok, args.seed + i)
                       for i in range(2)]  # fmt: skip
            figs = {}
            for steps in (1, args.num_scheduler_steps):
                print(f"multi-step: batch {bs}, {steps} step(s) per plan...", file=sys.stderr)
                figs[steps] = _engine_figures({**base, "num_scheduler_steps": steps}, batches,
                                              args.output_len, args.num_iters)  # fmt: skip
            one, many = figs[1], figs[args.num_scheduler_steps]
            saved = one["ms_per_decode_step"] - many["ms_per_decode_step"]
            if one["outputs"] != many["outputs"]:
                mismatches.append(f"multi-step batch {bs}")
            rows.append([bs, one["decode_tok_s"], many["decode_tok_s"],
                         ratio(many["decode_tok_s"], one["decode_tok_s"]),
                         one["ms_per_decode_step"], many["ms_per_decode_step"], saved,
                         "yes" if one["outputs"] == many["outputs"] else "NO"])  # fmt: skip
            payload["multi_step"][bs] = {
                str(k): {kk: vv for kk, vv in v.items() if kk != "outputs"}
                for k, v in figs.items()}  # fmt: skip
        n = args.num_scheduler_steps
        report.append(f"multi-step scheduling, {args.input_len}-token prompts, {args.output_len} "
                      "tokens:")
        report.append(format_table(["batch", "tok/s N=1", f"tok/s N={n}", "ratio",
                                    "ms/step N=1", f"ms/step N={n}", "overhead removed ms/step",
                                    "same tokens"], rows))  # fmt: skip

    machine["load_average_at_end"] = list(os.getloadavg())
    print(f"machine: {machine['cpu_model']}, {machine['usable_cores']} cores, {args.threads} "
          f"threads, load {' '.join(f'{x:.2f}' for x in machine['load_average_at_start'])} at "
          f"start, {' '.join(f'{x:.2f}' for x in machine['load_average_at_end'])} at end")
    print("\n\n".join(report))
    path = write_result(args.result_file or result_path(args.result_dir, "specdec", args.model),
                        payload)  # fmt: skip
    print(f"result: {path}")
    if mismatches:
        print(f"ironlm bench specdec: tokens differ from plain decoding: {mismatches}",
              file=sys.stderr)
        return 1
    return 0
