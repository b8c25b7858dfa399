"""``ironlm bench plot``: output tok/s against batch size, per engine, from throughput results.

    ironlm bench plot benchmarks/results/throughput-*.json --out docs/images/throughput_vs_batch.png

Each throughput result file contributes one point per engine (x: its number of prompts). When
several files share a batch size, the newest wins. Needs matplotlib (``pip install matplotlib``).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

LABELS = {"ironlm": "IronLM (fp32)", "hf": "HF transformers (fp32)",
          "llama-cpp": "llama.cpp (Q4_1, sequential)",
          "llama-cpp-batched": "llama.cpp (Q4_1, one batch)"}


def add_cli_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("results", nargs="+", help="throughput result JSON files")
    parser.add_argument("--out", required=True, help="PNG path to write")
    parser.add_argument("--metric", default="output_tok_s",
                        choices=("output_tok_s", "total_tok_s", "requests_per_s"))


def collect(paths: list[str], metric: str) -> tuple[dict[str, dict[int, float]], dict[str, Any]]:
    """{engine: {batch: value}} from the newest file per batch size; and the newest machine."""
    series: dict[str, dict[int, float]] = {}
    machine: dict[str, Any] = {}
    newest: dict[int, str] = {}
    for path in sorted(paths, key=lambda p: Path(p).stat().st_mtime):
        data = json.loads(Path(path).read_text())
        if data.get("kind") != "throughput":
            continue
        machine = data.get("machine", machine)
        for name, fig in data["engines"].items():
            batch = int(fig["num_requests"])
            if (fig.get("info") or {}).get("batching") == "one batch":
                name = f"{name}-batched"  # llama.cpp through its batch API: its own series
            if fig.get(metric) is not None:
                series.setdefault(name, {})[batch] = float(fig[metric])
                newest[batch] = path
    return series, machine


def main(args: argparse.Namespace) -> int:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("ironlm bench plot: matplotlib is not installed: pip install matplotlib",
              file=sys.stderr)
        return 2
    series, machine = collect(args.results, args.metric)
    if not series:
        print("ironlm bench plot: no throughput results in the given files", file=sys.stderr)
        return 1
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for name, points in series.items():
        xs = sorted(points)
        ax.plot(xs, [points[x] for x in xs], marker="o", label=LABELS.get(name, name))
    ax.set_xscale("log", base=2)
    ax.set_xticks(sorted({x for p in series.values() for x in p}))
    ax.get_xaxis().set_major_formatter(matplotlib.ticker.ScalarFormatter())
    ax.set_xlabel("batch size (prompts handed over at once)")
    ax.set_ylabel(args.metric.replace("_", " ").replace("tok s", "tok/s"))
    title = "Throughput vs batch size"
    if machine:
        title += f"\n{machine.get('cpu_model', '')}, {machine.get('threads')} threads"
    ax.set_title(title, fontsize=10)
    ax.grid(True, alpha=0.3)
    ax.legend()
    fig.tight_layout()
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(args.out, dpi=110)
    print(f"plot: {args.out}")
    return 0
