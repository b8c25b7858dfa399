"""Per-token cost of each guided-decoding backend at vocab 49152 (SmolLM2's tokenizer).

For each backend and constraint, a known valid output is tokenized and replayed through a fresh
Grammar; every step times ``fill_mask`` into a zeroed (vocab,) bool row (what the sampler asks
for) and ``accept_token``. Prints compile time and per-token microseconds (median, p90, mean).
The constraints cover the cheap case (JSON structure), free text inside a JSON string, a regex
and a plain ``json_object``.

    python benchmarks/guided_mask.py [--backends outlines,xgrammar] [--repeats N] [--threads N]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from typing import Any

import torch

from ironlm.interfaces.guided import GuidedBackend, GuidedSpec
from ironlm.model_loader.downloads import ensure_test_model

SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 40},
        "age": {"type": "integer"},
        "email": {"type": "string"},
        "tags": {"type": "array", "items": {"type": "string"}, "maxItems": 5},
        "address": {
            "type": "object",
            "properties": {"city": {"type": "string"}, "zip": {"type": "string"}},
            "required": ["city", "zip"],
        },
        "active": {"type": "boolean"},
    },
    "required": ["name", "age", "email", "tags", "address", "active"],
}
PERSON = {
    "name": "Alice Johnson the Third of Westminster",
    "age": 42,
    "email": "alice.johnson at example dot com",
    "tags": ["admin", "early adopter", "night owl"],
    "address": {"city": "San Francisco", "zip": "94110"},
    "active": True,
}
CASES: list[tuple[str, GuidedSpec, str]] = [
    ("json schema", GuidedSpec("json", json.dumps(SCHEMA)), json.dumps(PERSON)),
    ("json_object", GuidedSpec("json_object"), json.dumps({"a": [1, 2, 3], "b": "some text"})),
    ("regex", GuidedSpec("regex", r"[A-Z][a-z]+ [0-9]{3}-[0-9]{4} [a-z ]{10,40}"),
     "Call 555-0123 when the sun goes down over the bay"),
    ("choice", GuidedSpec("choice", choices=("positive", "negative", "neutral")), "neutral"),
]


def backends(tokenizer: Any, vocab_size: int, names: list[str]) -> list[GuidedBackend]:
    from ironlm_guided.lmfe_backend import LMFormatEnforcerBackend
    from ironlm_guided.outlines_backend import OutlinesBackend
    from ironlm_guided.xgrammar_backend import XGrammarBackend

    classes = {c.name: c for c in (OutlinesBackend, LMFormatEnforcerBackend, XGrammarBackend)}
    out = []
    for name in names:
        start = time.perf_counter()
        out.append(classes[name](tokenizer, vocab_size))
        print(f"{name}: backend setup {time.perf_counter() - start:.2f} s")
    return out


def replay(backend: GuidedBackend, compiled: Any, ids: list[int], eos: int) -> list[float]:
    """Microseconds per token (fill_mask + accept_token) over one replay of ``ids`` + EOS."""
    grammar = backend.new_grammar(compiled)
    row = torch.zeros(backend.vocab_size, dtype=torch.bool)
    times = []
    for token in [*ids, eos]:
        row.zero_()
        start = time.perf_counter()
        grammar.fill_mask(row)
        ok = grammar.accept_token(token)
        times.append((time.perf_counter() - start) * 1e6)
        assert ok and bool(row[token]), f"{backend.name} refused token {token}"
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backends", default="outlines,lm-format-enforcer,xgrammar")
    parser.add_argument("--repeats", type=int, default=3, help="replays per case (first warms)")
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0: default)")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(ensure_test_model("smollm2"))
    vocab_size = len(tokenizer)  # 49152
    print(f"vocab {vocab_size}, torch threads {torch.get_num_threads()}")
    header = f"{'backend':<20}{'case':<14}{'compile s':>10}{'tokens':>8}"
    print(header + f"{'median us':>11}{'p90 us':>9}{'mean us':>9}")
    for backend in backends(tokenizer, vocab_size, args.backends.split(",")):
        for case, spec, text in CASES:
            ids = tokenizer.encode(text, add_special_tokens=False)
            start = time.perf_counter()
            compiled = backend.compile(spec)
            compile_s = time.perf_counter() - start
            runs = [replay(backend, compiled, ids, tokenizer.eos_token_id)
                    for _ in range(args.repeats)]
            times = sorted(t for run in runs[1:] or runs for t in run)
            p90 = times[int(0.9 * (len(times) - 1))]
            print(f"{backend.name:<20}{case:<14}{compile_s:>10.2f}{len(ids) + 1:>8}"
                  f"{statistics.median(times):>11.0f}{p90:>9.0f}{statistics.fmean(times):>9.0f}")


if __name__ == "__main__":
    main()
