"""Embedding requests preempted in the middle of their chunked prompt (recomputed from the
first token) return what they return alone: the mean-pooled state's running sum starts again
(it used to keep the chunks run before the preemption and count them twice). SmolLM2, in a KV
cache too small for the batch of generations beside them. (A classifier keeps nothing between
chunks: the head reads the last one.)"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from ironlm import LLM, SamplingParams

pytestmark = pytest.mark.real_model

# 12 blocks of 16 tokens, 24 tokens a step: four decoding requests grow into the blocks the
# pooling prompts (~90 tokens, four chunks) hold while they are still in prefill
TIGHT = {"dtype": "float32", "max_model_len": 192, "num_kv_blocks": 12, "block_size": 16,
         "enable_chunked_prefill": True, "max_num_batched_tokens": 24, "swap_space": 0}
SENTENCE = ("The history of the city begins with a small settlement by the river, where "
            "traders met to exchange grain, salt and cloth every spring.")
TEXTS = [" ".join([SENTENCE] * 3), " ".join([SENTENCE] * 3) + " And more."]


def _pooled_beside_decodes(llm: LLM) -> tuple[list[torch.Tensor], int]:
    """The pooling outputs of TEXTS run after four long generations, and the preemptions."""
    engine = llm.engine
    before = engine.stats()["num_preemptions"]
    gen = SamplingParams(temperature=0.0, max_tokens=60, ignore_eos=True)
    for i in range(4):
        engine.add_request(f"g{i}", f"Story number {i}: once upon a time", gen)
    for i, text in enumerate(TEXTS):
        engine.add_request(f"p{i}", text, SamplingParams(max_tokens=1), pooling=True)
    got: dict[str, torch.Tensor] = {}
    while engine.has_unfinished_requests():
        for out in engine.step():
            if out.finished and out.embedding is not None:
                got[out.request_id] = torch.tensor(out.embedding)
    return [got[f"p{i}"] for i in range(len(TEXTS))], engine.stats()["num_preemptions"] - before


def test_embeddings_through_preemption(smollm2_dir: Path) -> None:
    pooled, preemptions = _pooled_beside_decodes(LLM(str(smollm2_dir), **TIGHT))
    assert preemptions >= 2
    alone = LLM(str(smollm2_dir), dtype="float32", max_model_len=192).embed(TEXTS, use_tqdm=False)
    for got, want in zip(pooled, alone):
        assert torch.allclose(got, torch.tensor(want.outputs.embedding), atol=1e-4)
