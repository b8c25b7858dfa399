"""vLLM's newer engine arguments on SmolLM2-135M-Instruct: hf_overrides (fields laid over the HF
config before the engine and the workers read it: the context length the engine derives, the
model's rope), max_model_len auto (-1: capped by the KV cache), kv_cache_memory_bytes."""

from __future__ import annotations

from pathlib import Path

import pytest

from ironlm import LLM, BeamSearchParams, SamplingParams
from ironlm.engine.input_processor import check_truncation, output_room

pytestmark = pytest.mark.real_model

KW = {"kv_cache_memory": 64 << 20, "dtype": "float32"}
PROMPT = "The capital of France is"


def test_overrides_reach_the_engine_and_the_model(smollm2_dir: Path) -> None:
    greedy = SamplingParams(temperature=0, max_tokens=8)
    plain = LLM(str(smollm2_dir), max_model_len=256, **KW)
    want = plain.generate(PROMPT, greedy, use_tqdm=False)[0].outputs[0].token_ids
    del plain
    # no max_model_len given: the engine takes the overridden max_position_embeddings
    short = LLM(str(smollm2_dir), hf_overrides={"max_position_embeddings": 300}, **KW)
    assert short.llm_engine.max_model_len == 300
    assert short.generate(PROMPT, greedy, use_tqdm=False)[0].outputs[0].token_ids == want
    del short
    # a rope base of 1 (SmolLM2: 100000) turns each dimension pair a whole radian per
    # position: other tokens
    # (vLLM's recipes set rope_theta at the top; transformers 5 keeps it in rope_parameters)
    moved = LLM(str(smollm2_dir), max_model_len=256, hf_overrides={"rope_theta": 1.0}, **KW)
    assert moved.generate(PROMPT, greedy, use_tqdm=False)[0].outputs[0].token_ids != want
    with pytest.raises(ValueError, match="not both"):
        LLM(str(smollm2_dir), kv_cache_memory=1 << 26, kv_cache_memory_bytes=1 << 26)


def test_max_model_len_auto_is_what_the_kv_cache_holds(smollm2_dir: Path) -> None:
    # 16 MiB of float32 KV (45 KiB a token for SmolLM2) holds a few hundred tokens, far
    # below the model's 8192 positions: auto takes the cache's length instead of refusing
    ngram = {"method": "ngram", "num_speculative_tokens": 3}
    llm = LLM(str(smollm2_dir), max_model_len=-1, kv_cache_memory_bytes=16 << 20,
              dtype="float32", speculative_config=ngram)
    engine = llm.llm_engine
    cache_tokens = engine.block_manager.num_kv_blocks * engine.config.block_size
    assert engine.max_model_len == cache_tokens < 8192
    assert engine.spec.max_model_len == cache_tokens  # drafts planned within that length
    out = llm.generate(PROMPT, SamplingParams(temperature=0, max_tokens=4), use_tqdm=False)
    assert len(out[0].outputs[0].token_ids) == 4
    with pytest.raises(ValueError, match="longer than the maximum model length"):
        llm.generate({"prompt_token_ids": [1792] * cache_tokens}, use_tqdm=False)
    with pytest.raises(ValueError, match="max seq len"):  # an explicit length is not capped
        LLM(str(smollm2_dir), max_model_len=4096, kv_cache_memory_bytes=16 << 20)
    with pytest.raises(ValueError, match="speculative_max_model_len"):  # checked on the cap
        LLM(str(smollm2_dir), max_model_len=-1, kv_cache_memory_bytes=16 << 20,
            speculative_config={**ngram, "max_model_len": 4096})


def test_cache_salt_and_unlimited_logprobs(smollm2_dir: Path) -> None:
    # vLLM's TextPrompt / TokensPrompt key: blocks cached under one salt serve that salt only
    llm = LLM(str(smollm2_dir), max_model_len=256, max_logprobs=-1, **KW)
    # max_logprobs -1: no limit but the vocabulary's (vLLM)
    top = llm.generate("Hi", SamplingParams(max_tokens=1, logprobs=40), use_tqdm=False)
    assert len(top[0].outputs[0].logprobs[0]) >= 40
    text = "Once upon a time, in a kingdom by the sea, there lived a keeper of lights. " * 3
    one = SamplingParams(temperature=0, max_tokens=1)

    def cached(prompt: dict[str, str]) -> int:
        return llm.generate(prompt, one, use_tqdm=False)[0].num_cached_tokens

    assert cached({"prompt": text, "cache_salt": "alice"}) == 0
    assert cached({"prompt": text, "cache_salt": "alice"}) >= 16
    assert cached({"prompt": text, "cache_salt": "bob"}) == 0
    assert cached({"prompt": text}) == 0  # nor unsalted requests
    assert cached({"prompt": text}) >= 16
    with pytest.raises(ValueError, match="cache_salt"):
        llm.generate({"prompt": text, "cache_salt": ""}, one, use_tqdm=False)
    # beam search runs each step's beams under the prompt's salt: their blocks are carol's
    llm.beam_search([{"prompt": text, "cache_salt": "carol"}],
                    BeamSearchParams(beam_width=2, max_tokens=2))
    assert cached({"prompt": text, "cache_salt": "carol"}) >= 16


def test_truncation_minus_one_leaves_room_for_the_output() -> None:
    # vLLM's max_input_tokens: the context less the output's positions (none for an embedding,
    # at least the first token for a generation)
    assert check_truncation(-1, 512, output_room(12)) == 500
    assert check_truncation(-1, 512, output_room(None)) == 511
    assert check_truncation(-1, 512, output_room(None, pooling=True)) == 512
    assert check_truncation(7, 512, output_room(12)) == 7
    with pytest.raises(ValueError, match="max_tokens"):  # nothing left for the prompt
        check_truncation(-1, 512, output_room(4096))
