"""Figures from timings, side-by-side tables with ratios, and JSON result files.

A result file holds ``{"kind", "machine", "limits", "args", "engines": {name: figures},
"ratios": {baseline: {metric: ours / baseline}}}``; one file per command run, written under
benchmarks/results/ unless ``--result-file`` names another path.
"""

from __future__ import annotations

import json
import math
import re
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ironlm_bench.runners import BatchTiming
from ironlm_bench.stats import summarize

MIB = 1024**2


def batch_figures(t: BatchTiming) -> dict[str, Any]:
    """Offline batch figures: rates over the whole batch, time until every first token."""
    elapsed = t.elapsed
    out_tokens, in_tokens = sum(t.output_tokens), sum(t.prompt_tokens)
    return {
        "num_requests": len(t.e2e),
        "prompt_tokens": in_tokens,
        "output_tokens": out_tokens,
        "elapsed_s": elapsed,
        "requests_per_s": len(t.e2e) / elapsed,
        "output_tok_s": out_tokens / elapsed,
        "total_tok_s": (in_tokens + out_tokens) / elapsed,
        "ttft_batch_s": max(t.ttft),  # until every request has its first token
        "ttft_mean_s": sum(t.ttft) / len(t.ttft),
    }


def single_stream_figures(t: BatchTiming) -> dict[str, Any]:
    """One request: its TTFT and decode rate after the first token."""
    return {"ttft_s": t.ttft[0], "decode_tok_s": t.decode_tok_s()[0], "e2e_s": t.e2e[0]}


def latency_figures(timings: Sequence[BatchTiming]) -> dict[str, Any]:
    """Per iteration end-to-end latency of the batch; decode rate of its requests."""
    lat = [t.elapsed for t in timings]
    ttft = [max(t.ttft) for t in timings]
    decode = [r for t in timings for r in t.decode_tok_s() if not math.isnan(r)]
    return {
        "iterations": len(timings),
        "latency_s": summarize(lat),
        "ttft_s": summarize(ttft),
        "decode_tok_s_per_request": summarize(decode),
        "output_tok_s": sum(sum(t.output_tokens) for t in timings) / sum(lat),
        "latencies_s": lat,
    }


def ratio(ours: float | None, base: float | None) -> float | None:
    if ours is None or base is None or not base or math.isnan(ours) or math.isnan(base):
        return None
    return ours / base


def fraction(value: float | None, bound: float | None) -> float | None:
    """``value`` as a fraction of a machine bound (None without either)."""
    if value is None or not bound:
        return None
    return value / bound


def fmt(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        if math.isnan(value):
            return "-"
        return f"{value:.3g}" if abs(value) < 100 else f"{value:.1f}"
    return str(value)


def format_table(header: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    cells = [list(header)] + [[fmt(v) for v in row] for row in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(header))]
    lines = []
    for n, row in enumerate(cells):
        lines.append("  ".join(c.ljust(w) if i == 0 else c.rjust(w)
                               for i, (c, w) in enumerate(zip(row, widths))).rstrip())
        if n == 0:
            lines.append("  ".join("-" * w for w in widths))
    return "\n".join(lines)


def comparison_table(
    metrics: Sequence[tuple[str, str, bool | None]],
    engines: dict[str, dict[str, Any]],
    ours: str = "ironlm",
) -> tuple[str, dict[str, dict[str, float | None]]]:
    """Rows of ``(key, label, higher_is_better)`` for every engine, then ``ours / baseline``
    per baseline (none where higher_is_better is None: a context figure, not a score).
    Returns the printed table and the ratios."""
    names = list(engines)
    baselines = [n for n in names if n != ours]
    header = ["metric", *names, *[f"{ours}/{b}" for b in baselines], "better"]
    rows, ratios = [], {b: {} for b in baselines}
    for key, label, higher in metrics:
        values = [engines[n].get(key) for n in names]
        rs = []
        for b in baselines:
            if higher is None:
                rs.append("")
                continue
            r = ratio(engines.get(ours, {}).get(key), engines[b].get(key))
            ratios[b][key] = r
            rs.append(f"{r:.2f}x" if r is not None else "-")
        better = "" if higher is None else "higher" if higher else "lower"
        rows.append([label, *values, *rs, better])
    return format_table(header, rows), ratios


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "-", text).strip("-") or "model"


def result_path(result_dir: str | Path, kind: str, model: str) -> Path:
    stamp = time.strftime("%Y%m%d-%H%M%S")
    return Path(result_dir) / f"{kind}-{_slug(Path(model).name)}-{stamp}.json"


def write_result(path: str | Path, payload: dict[str, Any]) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    text = json.dumps(_finite(payload), indent=2, default=_json_default, allow_nan=False)
    path.write_text(text + "\n")
    return path


def _finite(value: Any) -> Any:
    """NaN and infinities become null: result files stay strict JSON."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite(v) for v in value]
    return value


def _json_default(value: Any) -> Any:
    if isinstance(value, Path):
        return str(value)
    raise TypeError(f"not JSON serialisable: {type(value)}")


def args_dict(args: Any) -> dict[str, Any]:
    """The command's parsed flags (argparse Namespace), for the result file."""
    return {k: v for k, v in vars(args).items() if not callable(v)}


def mib(value: int | None) -> float | None:
    return None if value is None else value / MIB
