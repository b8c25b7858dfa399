"""Multi-step scheduling (``num_scheduler_steps``): the same outputs as one step per plan, with
requests that stop, reach max_tokens or max_model_len, or need guided masks inside a window,
with chunked prefill, preemption and seeded sampling; outputs stream once per step; fewer
plans. Tiny random-weight model for the cases, SmolLM2 for the user-facing check."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from ironlm import LLM, GuidedDecodingParams, SamplingParams
from ironlm.config import EngineConfig
from ironlm.engine.llm_engine import LLMEngine

PROMPTS = [
    "Repeat: a b c d e f a b c d e f a b c",
    "hello world " * 6,
    "x",
    "The list: one, two, three, four, one, two, three, four, one, two,",
    "A much longer prompt that has to be prefilled in several chunks while the others "
    "are already decoding, so that windows meet chunked prefill: " + "lorem ipsum " * 12,
]


class Logprobs:
    """Per-token logprob dicts, equal when the same tokens have logprobs within 1e-4."""

    def __init__(self, entries: list[dict[int, Any]] | None) -> None:
        self.entries = [{t: lp.logprob for t, lp in d.items()} for d in entries or []]

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Logprobs) and len(self.entries) == len(other.entries) and all(
            a.keys() == b.keys() and all(abs(a[t] - b[t]) < 1e-4 for t in a)
            for a, b in zip(self.entries, other.entries))

    def __repr__(self) -> str:
        return repr(self.entries)


def _outs(llm: LLM, prompts: list[Any], params: Any) -> list[tuple[Any, ...]]:
    outs = llm.generate(prompts, params, use_tqdm=False)
    assert llm.engine.stats()["num_used_blocks"] == 0
    return [(tuple(o.outputs[0].token_ids), o.outputs[0].text, o.outputs[0].finish_reason,
             o.outputs[0].stop_reason, Logprobs(o.outputs[0].logprobs)) for o in outs]


def _params(texts: list[str], first_ids: list[int]) -> list[SamplingParams]:
    return [
        SamplingParams(temperature=0, max_tokens=13, ignore_eos=True),  # ends mid-window
        SamplingParams(temperature=0, max_tokens=40, ignore_eos=True, stop=[texts[1][14:17]]),
        SamplingParams(temperature=0, max_tokens=30, ignore_eos=True,
                       stop_token_ids=[first_ids[2]], logprobs=2),
        SamplingParams(temperature=0.9, seed=5, max_tokens=21, ignore_eos=True),
        SamplingParams(temperature=0, max_tokens=19, ignore_eos=True, min_tokens=9,
                       repetition_penalty=1.3),
    ]


def test_eight_steps_per_plan_give_the_outputs_of_one(tiny_llama_dir: Path) -> None:
    base = {"max_model_len": 192, "max_num_batched_tokens": 32}  # long prompt: chunked
    plain = LLM(str(tiny_llama_dir), kv_cache_memory=16 << 20, **base)
    probe = plain.generate(PROMPTS, SamplingParams(temperature=0, max_tokens=40, ignore_eos=True),
                           use_tqdm=False)
    texts = [o.outputs[0].text for o in probe]
    first_ids = [o.outputs[0].token_ids[17] for o in probe]
    params = _params(texts, first_ids)
    want = _outs(plain, PROMPTS, params)
    multi = LLM(str(tiny_llama_dir), kv_cache_memory=16 << 20, num_scheduler_steps=8, **base)
    assert _outs(multi, PROMPTS, params) == want
    assert [w[2] for w in want] == ["length", "stop", "stop", "length", "length"]
    assert len(want[0][0]) == 13 and len(want[4][0]) == 19
    # a KV cache too small for all at once: preemption, windows cut to the blocks left
    tight = LLM(str(tiny_llama_dir), num_kv_blocks=9, block_size=16, num_scheduler_steps=8,
                **{**base, "max_model_len": 128})
    assert _outs(tight, PROMPTS, params) == want
    assert tight.engine.stats()["num_preemptions"] > 0
    # near max_model_len: the window stops where the context ends
    long = {"prompt_token_ids": [9] * 180}
    one = _outs(plain, [long], SamplingParams(temperature=0, max_tokens=50, ignore_eos=True))
    assert _outs(multi, [long], SamplingParams(temperature=0, max_tokens=50, ignore_eos=True)) == one
    assert len(one[0][0]) == 12 and one[0][2] == "length"


def test_guided_requests_take_one_step_inside_windows(tiny_llama_dir: Path) -> None:
    params = [SamplingParams(temperature=0, max_tokens=24, ignore_eos=True),
              SamplingParams(temperature=0, max_tokens=24,
                             guided_decoding=GuidedDecodingParams(regex="(ab|cd)+x")),
              SamplingParams(temperature=0, max_tokens=24, ignore_eos=True)]
    prompts = PROMPTS[:3]
    kw = {"max_model_len": 192, "kv_cache_memory": 16 << 20, "guided_decoding_backend": "xgrammar"}
    want = _outs(LLM(str(tiny_llama_dir), **kw), prompts, params)
    assert _outs(LLM(str(tiny_llama_dir), num_scheduler_steps=8, **kw), prompts, params) == want


def test_outputs_stream_once_per_step_and_plans_are_fewer(tiny_llama_dir: Path) -> None:
    """Driving the engine: every request's outputs grow one token at a time, as with one step
    per plan, while the engine plans about eight times less often."""

    def run(steps: int) -> tuple[list[list[int]], int]:
        engine = LLMEngine(EngineConfig(str(tiny_llama_dir), max_model_len=192,
                                        kv_cache_memory=16 << 20, num_scheduler_steps=steps))
        params = SamplingParams(temperature=0, max_tokens=33, ignore_eos=True)
        for i, p in enumerate(PROMPTS[:4]):
            engine.add_request(str(i), p, params)
        lengths: dict[str, list[int]] = {str(i): [] for i in range(4)}
        plans = 0
        while engine.has_unfinished_requests():
            plans += 1
            for out in engine.step():
                lengths[out.request_id].append(len(out.outputs[0].token_ids))
        return [lengths[str(i)] for i in range(4)], plans

    one, plans_one = run(1)
    eight, plans_eight = run(8)
    assert eight == one == [list(range(1, 34))] * 4
    assert plans_eight * 4 < plans_one


@pytest.mark.real_model
def test_real_model_greedy_with_eight_steps(smollm2_dir: Path) -> None:
    """SmolLM2, chat prompts: stop strings and max_tokens landing inside a window."""
    asks = ["Name three colours.", "What is 2 + 2? Answer in one sentence.",
            "Write a haiku about the sea.", "List the days of the week."]
    # float32: each engine measures its own kernel choices (under CI's load they can differ,
    # e.g. decode attention in C or torch), and bf16 logits tie often enough for greedy to flip
    kw = {"max_model_len": 512, "kv_cache_memory": 64 << 20, "dtype": "float32"}
    plain = LLM(str(smollm2_dir), **kw)
    tok = plain.get_tokenizer()
    prompts = [tok.apply_chat_template([{"role": "user", "content": a}], tokenize=False,
                                       add_generation_prompt=True) for a in asks]
    probe = plain.generate(prompts, SamplingParams(temperature=0, max_tokens=30), use_tqdm=False)
    texts = [o.outputs[0].text for o in probe]
    params = [SamplingParams(temperature=0, max_tokens=11),
              SamplingParams(temperature=0, max_tokens=30, stop=[texts[1][12:16]]),
              SamplingParams(temperature=0, max_tokens=27),
              SamplingParams(temperature=0, max_tokens=30, stop=[texts[3][20:24]],
                             include_stop_str_in_output=True)]
    want = _outs(plain, prompts, params)
    got = _outs(LLM(str(smollm2_dir), num_scheduler_steps=8, **kw), prompts, params)
    assert got == want
    assert want[0][2] == "length" and len(want[0][0]) == 11
    assert want[1][2] == "stop" and want[3][2] == "stop"
