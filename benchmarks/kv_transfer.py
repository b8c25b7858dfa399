"""Time to first token of long prompts computed against loaded from a KV connector's store
(vLLM's --kv-transfer-config, disaggregated prefill), and what storing costs a producer; one
run, side by side, on the same prompts.

    python benchmarks/kv_transfer.py [--dtype float32] [--num-prompts 6] [--input-words 700]
        [--store DIR] [--out FILE.json]

1. the producer (kv_producer, ExampleConnector) runs the batch for one token each, storing
   every full prompt block; the same batch on an engine without a connector;
2. each prompt alone for one token (its time to first token) on the plain engine and on a
   consumer (kv_consumer) that loads the prompt's blocks, alternating, the first tokens
   checked equal. Prefix caching is off in both, so the plain engine computes every prompt.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from ironlm import LLM, SamplingParams
from ironlm.model_loader.downloads import ensure_test_model
from ironlm_bench.machine import describe_machine

ROOT = Path(__file__).resolve().parents[1]


def prompts_from_docs(count: int, words: int) -> list[str]:
    """Distinct long prompts: consecutive runs of words of the repository's documentation."""
    text = " ".join(p.read_text() for p in sorted((ROOT / "docs").glob("*.md"))).split()
    if len(text) < count * words:
        raise SystemExit(f"the docs hold {len(text)} words, fewer than {count} x {words}")
    return [" ".join(text[i * words:(i + 1) * words]) for i in range(count)]


def timed(llm: LLM, prompts: list[str], params: SamplingParams) -> tuple[float, list[Any]]:
    start = time.perf_counter()
    outs = llm.generate(prompts, params, use_tqdm=False)
    return time.perf_counter() - start, outs


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default=None, help="model folder (default: SmolLM2)")
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--num-prompts", type=int, default=6)
    ap.add_argument("--input-words", type=int, default=700)
    ap.add_argument("--store", default=None, help="store folder (default: a temporary one)")
    ap.add_argument("--out", default=None, help="write the figures here as JSON")
    args = ap.parse_args()
    model = args.model or str(ensure_test_model("smollm2"))
    store = Path(args.store or tempfile.mkdtemp(prefix="ironlm-kv-store-"))
    prompts = prompts_from_docs(args.num_prompts, args.input_words)
    one = SamplingParams(temperature=0.0, max_tokens=1)
    base: dict[str, Any] = {"device": "cpu", "dtype": args.dtype, "max_model_len": 4096,
                            "kv_cache_memory": 1 << 30, "enable_prefix_caching": False}

    def transfer(role: str) -> dict[str, Any]:
        return {"kv_connector": "ExampleConnector", "kv_role": role,
                "kv_connector_extra_config": {"shared_storage_path": str(store)}}

    plain = LLM(model, **base)
    timed(plain, prompts[:1], one)  # warm-up
    t_plain_batch, outs = timed(plain, prompts, one)
    lengths = [len(o.prompt_token_ids) for o in outs]
    producer = LLM(model, **base, kv_transfer_config=transfer("kv_producer"))
    t_producer_batch, _ = timed(producer, prompts, one)
    producer.shutdown()
    stored = sum(p.stat().st_size for p in store.rglob("*.safetensors"))
    consumer = LLM(model, **base, kv_transfer_config=transfer("kv_consumer"))
    computed, loaded = [], []
    for prompt in prompts:
        t0, a = timed(plain, [prompt], one)
        t1, b = timed(consumer, [prompt], one)
        if a[0].outputs[0].token_ids != b[0].outputs[0].token_ids:
            raise SystemExit("the consumer's first token differs from the plain engine's")
        computed.append(t0)
        loaded.append(t1)
    hits = consumer.llm_engine.stats()["external_prefix_cache_hits"]
    plain.shutdown()
    consumer.shutdown()
    if args.store is None:
        shutil.rmtree(store)
    figures = {
        "machine": describe_machine(None), "model": model, "dtype": args.dtype,
        "prompt_tokens": lengths, "loaded_tokens": hits,
        "ttft_computed_median_s": statistics.median(computed),
        "ttft_loaded_median_s": statistics.median(loaded),
        "ttft_ratio": statistics.median(computed) / statistics.median(loaded),
        "batch_plain_s": t_plain_batch, "batch_producer_s": t_producer_batch,
        "store_overhead": t_producer_batch / t_plain_batch - 1, "store_bytes": stored,
        "ttft_computed_s": computed, "ttft_loaded_s": loaded,
    }
    m = figures["machine"]
    print(f"{m['cpu_model']} ({m['usable_cores']} cores; {' '.join(m['isa'])}), {args.dtype}")
    print(f"prompts of {min(lengths)}-{max(lengths)} tokens, {hits} loaded in all")
    print(f"time to first token: computed {figures['ttft_computed_median_s']:.3f} s, loaded "
          f"{figures['ttft_loaded_median_s']:.3f} s (median): {figures['ttft_ratio']:.2f}x")
    print(f"batch of {len(prompts)}: plain {t_plain_batch:.2f} s, producer storing "
          f"{stored / 1e6:.0f} MB {t_producer_batch:.2f} s ({figures['store_overhead']:+.0%})")
    if args.out:
        Path(args.out).write_text(json.dumps(figures, indent=1))


if __name__ == "__main__":
    main()
