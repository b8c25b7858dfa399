"""``ironlm bench throughput --lora-counts 1,2,4``: multi-LoRA throughput against the base model.

Same prompts, same run: IronLM serving the base model alone, then IronLM with the prompts spread
round-robin over 1, 2, 4, ... adapters (every adapter active in the same steps: ``max_loras`` =
the count), and with ``--lora-merged-baseline`` HF transformers + peft the way one serves
adapters without multi-LoRA batching: each adapter merged into its own copy of the model
(``merge_and_unload``), each adapter's prompts one batch, adapters one after another.

Adapters: ``--lora-path`` (a PEFT folder, vLLM's flag: every adapter reads it, each under its own
id, so each holds its own weights), else random ones of ``--lora-rank`` on all seven projections,
written in PEFT's format (timing does not depend on the values).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from ironlm_bench.results import batch_figures, format_table
from ironlm_bench.runners import BatchTiming

TARGETS = {  # PEFT module name -> the decoder layer's submodule holding it
    "q_proj": "self_attn", "k_proj": "self_attn", "v_proj": "self_attn", "o_proj": "self_attn",
    "gate_proj": "mlp", "up_proj": "mlp", "down_proj": "mlp",
}


def add_lora_args(parser: argparse.ArgumentParser) -> None:
    g = parser.add_argument_group("LoRA (multi-adapter throughput)")
    g.add_argument("--lora-counts", type=_counts, default=None,
                   help="also run IronLM with the prompts spread over this many adapters, "
                   "e.g. 1,2,4 (each figure against the base-model run)")
    g.add_argument("--lora-path", default=None,
                   help="PEFT adapter folder every adapter is read from (default: random "
                   "adapters of --lora-rank)")
    g.add_argument("--lora-rank", type=int, default=16,
                   help="rank of the random adapters (default: %(default)s)")
    g.add_argument("--lora-merged-baseline", action="store_true",
                   help="also run HF transformers + peft with each adapter merged into its own "
                   "model copy, adapters one after another")


def _counts(text: str) -> list[int]:
    try:
        counts = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected counts like 1,2,4, got {text!r}") from None
    if not counts or min(counts) < 1:
        raise argparse.ArgumentTypeError(f"expected counts >= 1 like 1,2,4, got {text!r}")
    return counts


def adapter_paths(args: argparse.Namespace, count: int, workdir: Path) -> list[str]:
    if args.lora_path:
        return [args.lora_path] * count
    from ironlm.model_loader import resolve_model

    hf_config = resolve_model(args.model, args.trust_remote_code).hf_config
    paths = []
    for i in range(count):
        folder = workdir / f"random-lora-{args.lora_rank}-{i}"
        if not folder.exists():
            write_random_adapter(hf_config, folder, args.lora_rank, seed=args.seed + i)
        paths.append(str(folder))
    return paths


def write_random_adapter(hf_config: Any, folder: Path, rank: int, seed: int) -> None:
    """A PEFT-format adapter (adapter_config.json + adapter_model.safetensors) of random
    weights on every projection of every layer."""
    from safetensors.torch import save_file

    hidden, inter = hf_config.hidden_size, hf_config.intermediate_size
    heads = hf_config.num_attention_heads
    kv_heads = getattr(hf_config, "num_key_value_heads", None) or heads
    head_dim = getattr(hf_config, "head_dim", None) or hidden // heads
    shapes = {  # (in, out)
        "q_proj": (hidden, heads * head_dim), "k_proj": (hidden, kv_heads * head_dim),
        "v_proj": (hidden, kv_heads * head_dim), "o_proj": (heads * head_dim, hidden),
        "gate_proj": (hidden, inter), "up_proj": (hidden, inter), "down_proj": (inter, hidden),
    }
    g = torch.Generator().manual_seed(seed)
    tensors = {}
    for layer in range(hf_config.num_hidden_layers):
        for name, (fan_in, fan_out) in shapes.items():
            prefix = f"base_model.model.model.layers.{layer}.{TARGETS[name]}.{name}"
            tensors[f"{prefix}.lora_A.weight"] = torch.randn(rank, fan_in, generator=g) / fan_in**0.5
            tensors[f"{prefix}.lora_B.weight"] = torch.randn(fan_out, rank, generator=g) * 0.01
    folder.mkdir(parents=True)
    save_file(tensors, str(folder / "adapter_model.safetensors"))
    config = {"peft_type": "LORA", "r": rank, "lora_alpha": 2 * rank, "bias": "none",
              "target_modules": list(shapes), "base_model_name_or_path": None}
    (folder / "adapter_config.json").write_text(json.dumps(config, indent=2))


def lora_engine_kwargs(engine_kwargs: dict[str, Any], count: int, rank: int) -> dict[str, Any]:
    """The base run's engine arguments with LoRA on: every adapter may run in every step."""
    from ironlm.config import LORA_MAX_RANKS

    if rank > LORA_MAX_RANKS[-1]:
        raise ValueError(f"adapter rank {rank} is above the highest max_lora_rank "
                         f"{LORA_MAX_RANKS[-1]}")
    max_rank = next(r for r in LORA_MAX_RANKS if r >= rank)
    return {**engine_kwargs, "enable_lora": True, "max_loras": count, "max_cpu_loras": count,
            "max_lora_rank": max(max_rank, engine_kwargs.get("max_lora_rank") or 0)}


def adapter_rank(path: str) -> int:
    config = json.loads((Path(path) / "adapter_config.json").read_text())
    pattern = config.get("rank_pattern") or {}
    return max([int(config["r"]), *(int(v) for v in pattern.values())])


def lora_table(engines: dict[str, dict[str, Any]], base: str = "ironlm") -> str:
    """Throughput of every run and its share of the base model's."""
    base_tok_s = engines.get(base, {}).get("output_tok_s")
    rows = []
    for name, fig in engines.items():
        share = fig["output_tok_s"] / base_tok_s if base_tok_s else None
        rows.append([name, fig["requests_per_s"], fig["output_tok_s"], fig["total_tok_s"],
                     fig.get("ttft_mean_s"), f"{share:.2f}" if share is not None else "-"])
    header = ["run", "requests/s", "output tok/s", "total tok/s", "TTFT mean (s)",
              f"output tok/s vs {base}"]
    return format_table(header, rows)


class HfMergedRunner:
    """HF transformers + peft, one merged model per adapter; prompt i goes to adapter
    i % len(adapters); each adapter's prompts run as one generate batch, in adapter order."""

    name = "hf-merged"

    def __init__(self, model: str, adapters: list[str], batch_size: int | None, seed: int) -> None:
        from peft import PeftModel
        from transformers import AutoModelForCausalLM

        from ironlm_bench.baselines import HfRunner

        self.runner = HfRunner(model, False, batch_size, seed)
        self.adapters = adapters
        self.merged = []
        for path in adapters:
            base = AutoModelForCausalLM.from_pretrained(model, dtype=torch.float32)
            self.merged.append(PeftModel.from_pretrained(base, path).merge_and_unload().eval())

    def info(self) -> dict[str, Any]:
        return {**self.runner.info(), "adapters": len(self.adapters), "merged": True}

    def run(self, prompts: list[list[int]], output_len: int,
            temperature: float = 0.0) -> BatchTiming:
        k = len(self.merged)
        ttft = [0.0] * len(prompts)
        e2e = [0.0] * len(prompts)
        produced = [0] * len(prompts)
        start = time.perf_counter()
        for j, model in enumerate(self.merged):
            rows = [i for i in range(len(prompts)) if i % k == j]
            if not rows:
                continue
            self.runner.model = model
            offset = time.perf_counter() - start
            t = self.runner.run([prompts[i] for i in rows], output_len, temperature)
            for i, first, last, n in zip(rows, t.ttft, t.e2e, t.output_tokens):
                ttft[i], e2e[i], produced[i] = offset + first, offset + last, n
        return BatchTiming(ttft, e2e, [len(p) for p in prompts], produced)


def lora_runs(
    args: argparse.Namespace, engine_kwargs: dict[str, Any], workdir: str | None = None
) -> list[tuple[str, dict[str, Any]]]:
    """(label, runner spec) for every LoRA run the flags ask for."""
    root = Path(workdir or tempfile.mkdtemp(prefix="ironlm-bench-lora-"))
    specs = []
    for count in args.lora_counts or []:
        paths = adapter_paths(args, count, root)
        kwargs = lora_engine_kwargs(engine_kwargs, count, adapter_rank(paths[0]))
        specs.append((f"ironlm-lora{count}", {
            "kind": "ironlm", "model": args.model, "engine_kwargs": kwargs,
            "detokenize": not args.disable_detokenize, "lora_paths": paths,
        }))
        if args.lora_merged_baseline:
            specs.append((f"hf-merged-lora{count}", {
                "kind": "hf-merged", "model": args.model, "lora_paths": paths,
                "batch_size": args.baseline_batch_size, "seed": args.seed,
            }))
    return specs


def figures(result: dict[str, Any]) -> dict[str, Any]:
    fig = batch_figures(BatchTiming.from_dict(result["results"]["batch"][0]))
    fig["info"] = result["info"]
    fig["foreign_cpu_share"] = result["foreign_cpu_share"]
    return fig


def lora_section(
    args: argparse.Namespace, engine_kwargs: dict[str, Any], jobs: list[dict[str, Any]]
) -> Callable[[dict[str, dict[str, Any]]], tuple[str, dict[str, Any]]] | None:
    """The throughput report's extra runs for ``--lora-counts`` (None without it): each LoRA
    run on ``jobs`` in its own process, then a table against the base model's run."""
    if not args.lora_counts:
        return None

    def run(engines: dict[str, dict[str, Any]]) -> tuple[str, dict[str, Any]]:
        from ironlm_bench.common import run_engine

        runs: dict[str, dict[str, Any]] = {}
        for label, spec in lora_runs(args, engine_kwargs):
            print(f"running {label}: the batch with LoRA adapters...", file=sys.stderr)
            runs[label] = figures(run_engine(spec, args.threads, jobs))
        text = ("\nLoRA: prompts spread round-robin over N adapters (ironlm-loraN); vs the base "
                "model alone (ironlm)\n" + lora_table({"ironlm": engines["ironlm"], **runs}))
        return text, {"lora": runs}

    return run
