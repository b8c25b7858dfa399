"""vLLM's ``vllm:iteration_tokens_total``: the engine counts each step's scheduled tokens in
vLLM's buckets, and the server exports the counts as a Prometheus histogram."""

from __future__ import annotations

from pathlib import Path

from ironlm import LLM, SamplingParams
from ironlm.engine.iteration_tokens import IterationTokens
from ironlm.entrypoints.openai.metrics import ServerMetrics


def test_steps_are_counted_exactly(tiny_llama_dir: Path) -> None:
    llm = LLM(str(tiny_llama_dir), device="cpu", max_model_len=128, kv_cache_memory=16 << 20,
              enable_prefix_caching=False)  # fmt: skip
    prompts = [{"prompt_token_ids": list(range(10, 30))}, {"prompt_token_ids": list(range(5))}]
    llm.generate(prompts, SamplingParams(max_tokens=5, ignore_eos=True), use_tqdm=False)
    stats = llm.engine.stats()["iteration_tokens"]
    # one step runs both prompts (25 tokens), four more one decode each (the fifth token
    # is sampled and never fed back)
    assert (stats["count"], stats["sum"]) == (5, 25 + 4 * 2)
    cumulative = dict((bound, n) for bound, n in stats["buckets"])
    assert (cumulative[1], cumulative[8], cumulative[16], cumulative[32]) == (0, 4, 4, 5)
    assert stats["buckets"][-1] == [float("inf"), 5]


def test_exported_as_a_histogram() -> None:
    metrics = ServerMetrics("m")
    counts = IterationTokens()
    for n in (1, 9, 20000):
        counts.observe(n)
    metrics.set_engine_stats({"iteration_tokens": counts.to_dict()})
    text = metrics.render().decode()
    assert 'vllm:iteration_tokens_total_bucket{le="1.0",model_name="m"} 1.0' in text
    assert 'vllm:iteration_tokens_total_bucket{le="16.0",model_name="m"} 2.0' in text
    assert 'vllm:iteration_tokens_total_bucket{le="+Inf",model_name="m"} 3.0' in text
    assert 'vllm:iteration_tokens_total_sum{model_name="m"} 20010.0' in text
    assert "# TYPE vllm:iteration_tokens_total histogram" in text
