"""Tokens/s of the same batch with and without a JSON-schema constraint (issue 6 target:
guided costs under 30% of unguided throughput at batch 16).

    python benchmarks/guided_throughput.py [--backend outlines] [--batch 16] [--max-tokens 64]
"""

from __future__ import annotations

import argparse
import json
import time

from ironlm import LLM, GuidedDecodingParams, SamplingParams
from ironlm.model_loader.downloads import ensure_test_model

SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 24},
        "age": {"type": "integer"},
        "tags": {"type": "array", "items": {"type": "string", "maxLength": 12}, "maxItems": 4},
    },
    "required": ["name", "age", "tags"],
}


def run(llm: LLM, prompts: list[str], params: SamplingParams) -> tuple[float, int]:
    start = time.perf_counter()
    outs = llm.generate(prompts, params, use_tqdm=False)
    elapsed = time.perf_counter() - start
    return elapsed, sum(len(o.outputs[0].token_ids) for o in outs)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--backend", default="outlines")
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--max-tokens", type=int, default=64)
    args = ap.parse_args()
    llm = LLM(str(ensure_test_model("smollm2")), max_model_len=512, kv_cache_memory=128 << 20,
              guided_decoding_backend=args.backend)
    prompts = [f"Describe person number {i} as JSON:" for i in range(args.batch)]
    free = SamplingParams(temperature=0.8, seed=0, max_tokens=args.max_tokens)
    guided = SamplingParams(temperature=0.8, seed=0, max_tokens=args.max_tokens,
                            guided_decoding=GuidedDecodingParams(json=SCHEMA))
    run(llm, prompts[:2], free)  # warm-up (kernel build, caches)
    run(llm, prompts[:2], guided)  # warm-up: compiles the schema once
    t_free, n_free = run(llm, prompts, free)
    t_guided, n_guided = run(llm, prompts, guided)
    tps_free, tps_guided = n_free / t_free, n_guided / t_guided
    print(json.dumps({
        "backend": args.backend, "batch": args.batch,
        "unguided_tok_s": round(tps_free, 2), "guided_tok_s": round(tps_guided, 2),
        "guided_cost": round(1 - tps_guided / tps_free, 3),
    }))


if __name__ == "__main__":
    main()
