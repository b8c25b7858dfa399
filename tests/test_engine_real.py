"""The engine on the real models: greedy parity with HF transformers, batching, prefix
caching, chunked prefill, preemption, block accounting, bad input."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from real_prompts import PROMPTS

from ironlm import LLM, SamplingParams

pytestmark = pytest.mark.real_model

NEW_TOKENS = 32
GREEDY = SamplingParams(temperature=0.0, max_tokens=NEW_TOKENS)


def _hf_greedy(model_dir: Path, prompts: list[str]) -> list[list[int]]:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    model.eval()
    outs = []
    with torch.inference_mode():
        for p in prompts:
            ids = tok(p, return_tensors="pt").input_ids
            gen = model.generate(
                ids, attention_mask=torch.ones_like(ids), do_sample=False,
                max_new_tokens=NEW_TOKENS, pad_token_id=tok.eos_token_id,
            )
            outs.append(gen[0, ids.shape[1]:].tolist())
    return outs


@pytest.fixture(scope="module", params=["smollm2", "gemma3"])
def model_case(request: pytest.FixtureRequest) -> tuple[Path, list[list[int]]]:
    model_dir = request.getfixturevalue(f"{request.param}_dir")
    return model_dir, _hf_greedy(model_dir, PROMPTS)


def _tokens(outputs: list) -> list[list[int]]:  # type: ignore[type-arg]
    return [o.outputs[0].token_ids for o in outputs]


def test_greedy_matches_hf_one_at_a_time(model_case: tuple[Path, list[list[int]]]) -> None:
    model_dir, expected = model_case
    llm = LLM(str(model_dir), dtype="float32", max_model_len=512, kv_cache_memory=64 << 20)
    got = [_tokens(llm.generate(p, GREEDY, use_tqdm=False))[0] for p in PROMPTS]
    assert got == expected
    assert llm.engine.block_manager.num_used_blocks == 0


def test_batched_cached_chunked_and_preempted_runs_match(
    model_case: tuple[Path, list[list[int]]],
) -> None:
    model_dir, expected = model_case
    # All at once, prefix caching on, a small token budget (chunked prefill), and a KV cache
    # of 12 blocks x 16 tokens for 8 sequences of ~45 tokens: preemption must happen, and
    # with the default swap_space (4 GiB) decoding victims are swapped out and back.
    llm = LLM(
        str(model_dir), dtype="float32", max_model_len=192, num_kv_blocks=12, block_size=16,
        enable_prefix_caching=True, enable_chunked_prefill=True, max_num_batched_tokens=24,
    )
    assert _tokens(llm.generate(PROMPTS, GREEDY, use_tqdm=False)) == expected
    stats = llm.engine.stats()
    assert stats["num_preemptions"] > 0 and stats["num_swap_outs"] > 0, stats
    assert stats["num_swapped"] == 0 and stats["swap_usage"] == 0.0
    assert stats["num_used_blocks"] == 0
    # Prompts sharing a long prefix: the second run is served from the prefix cache (hits
    # counted) and gives the same tokens as a run without the cache. The prefix spans a whole
    # 128-token block (the cpu platform's default block size): only full blocks are shared.
    shared = "You are a helpful assistant who answers briefly and precisely. " * 12
    long_prompts = [shared + p for p in PROMPTS[:3]]
    cold = LLM(str(model_dir), dtype="float32", max_model_len=512, kv_cache_memory=64 << 20,
               enable_prefix_caching=False)
    want = _tokens(cold.generate(long_prompts, GREEDY, use_tqdm=False))
    warm = LLM(str(model_dir), dtype="float32", max_model_len=512, kv_cache_memory=64 << 20)
    assert _tokens(warm.generate(long_prompts[:1], GREEDY, use_tqdm=False)) == want[:1]
    assert _tokens(warm.generate(long_prompts, GREEDY, use_tqdm=False)) == want
    assert warm.engine.stats()["prefix_cache_hits"] >= 3 * 16


def test_long_prefill_threshold_and_block_override(smollm2_dir: Path) -> None:
    # vLLM's long_prefill_token_threshold: the same greedy tokens, the prompt 16 tokens a
    # step (iteration_tokens counts the steps); num_gpu_blocks_override is num_kv_blocks
    prompt = "You are a helpful assistant who answers briefly and precisely. " * 4
    params = SamplingParams(temperature=0.0, max_tokens=4)
    plain = LLM(str(smollm2_dir), dtype="float32", max_model_len=256, num_kv_blocks=16)
    capped = LLM(str(smollm2_dir), dtype="float32", max_model_len=256,
                 num_gpu_blocks_override=16, long_prefill_token_threshold=16)  # fmt: skip
    assert capped.engine.stats()["num_kv_blocks"] == 16
    want = _tokens(plain.generate([prompt], params, use_tqdm=False))
    assert _tokens(capped.generate([prompt], params, use_tqdm=False)) == want
    prompt_len = len(capped.get_tokenizer()(prompt).input_ids)
    steps = [s.engine.stats()["iteration_tokens"]["count"] for s in (plain, capped)]
    assert steps == [1 + 3, -(-prompt_len // 16) + 3]  # prefill steps, then 3 decodes


def test_reset_prefix_cache(smollm2_dir: Path) -> None:
    # vLLM's LLM.reset_prefix_cache: the same prompt again hits the cache, after a reset not
    shared = "You are a helpful assistant who answers briefly and precisely. " * 12
    llm = LLM(str(smollm2_dir), dtype="float32", max_model_len=512, kv_cache_memory=64 << 20)
    params = SamplingParams(temperature=0.0, max_tokens=2)

    def hits_of_one_run() -> int:
        before = llm.engine.stats()["prefix_cache_hits"]
        llm.generate([shared], params, use_tqdm=False)
        return llm.engine.stats()["prefix_cache_hits"] - before

    assert hits_of_one_run() == 0 and hits_of_one_run() > 0
    assert llm.reset_prefix_cache() is True
    assert hits_of_one_run() == 0
    llm.engine.add_request("held", shared, SamplingParams(max_tokens=50))
    llm.engine.step()  # the request holds blocks: no reset
    assert llm.reset_prefix_cache() is False and hits_of_one_run() > 0
    llm.abort("held")


def test_many_mixed_requests_leave_no_blocks(smollm2_dir: Path) -> None:
    llm = LLM(str(smollm2_dir), max_model_len=256, kv_cache_memory=32 << 20, max_num_seqs=32)
    g = torch.Generator().manual_seed(0)
    prompts = [
        torch.randint(100, 40000, (int(torch.randint(1, 120, (1,), generator=g)),),
                      generator=g).tolist()
        for _ in range(100)
    ]
    params = [SamplingParams(max_tokens=int(torch.randint(1, 9, (1,), generator=g)),
                             temperature=0.8, seed=i) for i in range(100)]
    outs = llm.generate(prompts, params, use_tqdm=False)
    assert len(outs) == 100
    assert all(len(o.outputs[0].token_ids) <= p.max_tokens for o, p in zip(outs, params))
    assert llm.engine.block_manager.num_used_blocks == 0


def test_bad_input_is_a_value_error_and_the_engine_keeps_serving(smollm2_dir: Path) -> None:
    llm = LLM(str(smollm2_dir), max_model_len=64, kv_cache_memory=16 << 20)
    with pytest.raises(ValueError, match="maximum model length of 64"):
        llm.generate("word " * 100, SamplingParams(max_tokens=4))
    with pytest.raises(ValueError, match="cannot be empty"):
        llm.generate([[]], SamplingParams(max_tokens=4))
    with pytest.raises(ValueError, match="out of vocabulary"):
        llm.generate([[1, 2, 10_000_000]], SamplingParams(max_tokens=4))
    out = llm.generate("Hello", SamplingParams(max_tokens=3, temperature=0), use_tqdm=False)
    assert len(out[0].outputs[0].token_ids) == 3
    assert llm.engine.block_manager.num_used_blocks == 0
    with pytest.raises(ValueError, match="dtype"):
        LLM(str(smollm2_dir), dtype="float64")
    with pytest.raises(ValueError, match="device 'tpu'"):
        LLM(str(smollm2_dir), device="tpu")


@pytest.mark.parametrize("kv_cache_dtype", ["fp8", "fp8_e4m3", "fp8_e5m2"])
def test_fp8_kv_cache_is_refused_at_start_on_cpu(smollm2_dir: Path, kv_cache_dtype: str) -> None:
    """The cpu attention backend stores no fp8 cache: the offline API refuses it before any
    worker starts, naming the parameter and the platform (as `ironlm serve` does)."""
    with pytest.raises(ValueError, match=rf"kv_cache_dtype='{kv_cache_dtype}'.*platform 'cpu'"):
        LLM(str(smollm2_dir), device="cpu", kv_cache_dtype=kv_cache_dtype)


def test_kv_cache_is_allocated_once_at_the_size_asked(smollm2_dir: Path) -> None:
    llm = LLM(str(smollm2_dir), max_model_len=256, kv_cache_memory=24 << 20)
    kv = llm.engine.executor.worker.kv_cache  # type: ignore[attr-defined]
    total = sum(t.numel() * t.element_size() for t in kv.tensors)
    assert total <= 24 << 20 and total > (24 << 20) - kv.bytes_per_block()
    ptrs = [t.data_ptr() for t in kv.tensors]
    llm.generate(PROMPTS[:4], GREEDY, use_tqdm=False)
    assert [t.data_ptr() for t in kv.tensors] == ptrs


def test_block_size_defaults_to_the_platforms(smollm2_dir: Path) -> None:
    """No block_size given: the platform's default (cpu: 16, handed out in runs of 8 blocks),
    in the block manager and in every layer's cache; a given one is kept (runs of what fits in
    128 tokens)."""
    for asked, want, run in ((None, 16, 8), (128, 128, 1), (32, 32, 4)):
        kwargs = {} if asked is None else {"block_size": asked}
        llm = LLM(str(smollm2_dir), max_model_len=256, kv_cache_memory=16 << 20, **kwargs)
        assert llm.engine.config.block_size == llm.engine.block_manager.block_size == want
        assert llm.engine.block_manager.run == run
        kv = llm.engine.executor.worker.kv_cache  # type: ignore[attr-defined]
        assert all(t.shape[2] == want for t in kv.tensors)  # (2, blocks, block_size, h, d)
        params = SamplingParams(temperature=0.0, max_tokens=140, ignore_eos=True)  # > 128
        out = llm.generate(PROMPTS[:2], params, use_tqdm=False)
        assert all(len(o.outputs[0].token_ids) == 140 for o in out)
        assert llm.engine.block_manager.num_used_blocks == 0


def test_abort_frees_blocks_at_once(smollm2_dir: Path) -> None:
    llm = LLM(str(smollm2_dir), max_model_len=256, kv_cache_memory=16 << 20)
    eng = llm.engine
    eng.add_request("x", "Tell me a long story about dragons",
                    SamplingParams(max_tokens=50, ignore_eos=True))
    eng.step()
    eng.step()
    assert eng.block_manager.num_used_blocks > 0
    llm.abort("x")
    assert eng.block_manager.num_used_blocks == 0
    assert not eng.has_unfinished_requests()


def test_chat_uses_the_template(smollm2_dir: Path) -> None:
    llm = LLM(str(smollm2_dir), max_model_len=512, kv_cache_memory=32 << 20)
    msgs = [{"role": "user", "content": "What is the capital of France? Answer in one word."}]
    out = llm.chat(msgs, SamplingParams(temperature=0, max_tokens=8), use_tqdm=False)
    tok = llm.get_tokenizer()
    expected_prompt = tok.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True)
    assert out[0].prompt == expected_prompt
    assert "Paris" in out[0].outputs[0].text
