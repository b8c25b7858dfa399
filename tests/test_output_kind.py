"""SamplingParams.output_kind (vLLM's RequestOutputKind) on SmolLM2: CUMULATIVE outputs every
step hold everything so far, DELTA outputs what is new (their concatenation is the cumulative
output), FINAL_ONLY one output at the end; ``LLM.generate`` asks for FINAL_ONLY on copies of the
caller's params."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from ironlm import LLM, RequestOutputKind, SamplingParams


@pytest.fixture(scope="module")
def llm(smollm2_dir: Path) -> LLM:
    return LLM(str(smollm2_dir), device="cpu", max_model_len=256, kv_cache_memory=32 * 2**20)


def _outputs(llm: LLM, kind: RequestOutputKind, **extra: Any) -> list[Any]:
    params = SamplingParams(temperature=0, max_tokens=12, n=2, best_of=2, seed=0, logprobs=1,
                            output_kind=kind, **extra)  # fmt: skip
    rid = f"kind-{kind.name}-{len(extra)}"
    llm.engine.add_request(rid, "The capital of France is", params)
    seen = []
    while llm.engine.has_unfinished_requests():
        seen += [o for o in llm.engine.step() if o.request_id == rid]
    return seen


def test_deltas_add_up_to_the_cumulative_output(llm: LLM) -> None:
    cumulative = _outputs(llm, RequestOutputKind.CUMULATIVE)
    deltas = _outputs(llm, RequestOutputKind.DELTA)
    assert len(deltas) == len(cumulative) > 2 and deltas[-1].finished
    final = cumulative[-1]
    for i in range(2):
        assert "".join(d.outputs[i].text for d in deltas) == final.outputs[i].text
        assert [t for d in deltas for t in d.outputs[i].token_ids] == final.outputs[i].token_ids
        # one logprob entry a token, each holding the sampled token (values may differ from the
        # other run's in the last bits: the batches differed)
        lps = [lp for d in deltas for lp in d.outputs[i].logprobs]
        assert len(lps) == 12 and all(t in lp for t, lp in zip(final.outputs[i].token_ids, lps))
        assert deltas[-1].outputs[i].finish_reason == "length"
    assert all(len(d.outputs[0].token_ids) == 1 for d in deltas)  # one new token a step


def test_final_only_is_one_output_equal_to_the_last_cumulative(llm: LLM) -> None:
    cumulative = _outputs(llm, RequestOutputKind.CUMULATIVE)
    (final,) = _outputs(llm, RequestOutputKind.FINAL_ONLY)
    assert final.finished
    assert [(o.text, o.token_ids) for o in final.outputs] == \
        [(o.text, o.token_ids) for o in cumulative[-1].outputs]  # fmt: skip


def test_prompt_logprobs_come_with_the_first_delta_only(llm: LLM) -> None:
    deltas = _outputs(llm, RequestOutputKind.DELTA, prompt_logprobs=1)
    assert deltas[0].prompt_logprobs is not None and len(deltas[0].prompt_logprobs) > 1
    assert all(d.prompt_logprobs is None for d in deltas[1:])


def test_generate_returns_final_outputs_and_leaves_the_params_alone(llm: LLM) -> None:
    params = SamplingParams(temperature=0, max_tokens=8)
    (out,) = llm.generate("def fib(n):", params, use_tqdm=False)
    assert out.finished and len(out.outputs[0].token_ids) == 8
    assert params.output_kind == RequestOutputKind.CUMULATIVE
    (again,) = llm.generate("def fib(n):", SamplingParams(
        temperature=0, max_tokens=8, output_kind=RequestOutputKind.DELTA), use_tqdm=False)
    assert again.outputs[0].token_ids == out.outputs[0].token_ids  # the whole completion


def test_output_kind_must_be_the_enum() -> None:
    with pytest.raises(ValueError, match="output_kind"):
        SamplingParams(output_kind="delta")  # type: ignore[arg-type]


def test_stream_interval_batches_the_deltas(smollm2_dir: Path, llm: LLM) -> None:
    # vLLM's stream_interval: the first token at once, then every 5th, then the end
    every = _outputs(llm, RequestOutputKind.DELTA)
    batched_llm = LLM(str(smollm2_dir), device="cpu", max_model_len=256,
                      kv_cache_memory=32 * 2**20, stream_interval=5)  # fmt: skip
    batched = _outputs(batched_llm, RequestOutputKind.DELTA)
    assert [len(d.outputs[0].token_ids) for d in batched] == [1, 5, 5, 1]
    assert [d.finished for d in batched] == [False, False, False, True]
    for i in range(2):
        assert [t for d in batched for t in d.outputs[i].token_ids] == \
            [t for d in every for t in d.outputs[i].token_ids]  # fmt: skip
        assert "".join(d.outputs[i].text for d in batched) == \
            "".join(d.outputs[i].text for d in every)  # fmt: skip
        assert len([lp for d in batched for lp in d.outputs[i].logprobs]) == 12
    with pytest.raises(ValueError, match="stream_interval must be at least 1"):
        LLM(str(smollm2_dir), stream_interval=0)


def test_server_streams_at_the_interval(smollm2_dir: Path) -> None:
    from server_utils import RemoteServer

    args = ["--max-model-len", "256", "--kv-cache-memory", "32MiB", "--stream-interval", "4"]
    with RemoteServer(smollm2_dir, args) as server:
        client = server.openai_client(timeout=60)
        body = {"model": str(smollm2_dir), "prompt": "The capital of France is",
                "max_tokens": 10, "temperature": 0, "extra_body": {"ignore_eos": True}}
        chunks = [c for c in client.completions.create(stream=True, **body)]
        whole = client.completions.create(**body).choices[0].text
    texts = [c.choices[0].text for c in chunks if c.choices]
    assert "".join(texts) == whole
    # token 1, tokens 2-5, 6-9, 10 (the finish reason with the last)
    assert len(texts) == 4 and chunks[-1].choices[0].finish_reason == "length"


def test_stream_interval_sends_a_finished_choice_at_once(smollm2_dir: Path) -> None:
    # n=2 sampled choices ending at different steps: each one's end goes out in its own step
    llm = LLM(str(smollm2_dir), device="cpu", max_model_len=256, kv_cache_memory=32 * 2**20,
              stream_interval=8)  # fmt: skip
    for seed in range(6):
        params = SamplingParams(n=2, temperature=1.0, seed=seed, stop=["."], max_tokens=40,
                                output_kind=RequestOutputKind.DELTA)  # fmt: skip
        rid = f"ends-{seed}"
        llm.engine.add_request(rid, "Tell me a fact about cats", params)
        children = llm.engine.outputs.children(rid)
        reported: set[int] = set()
        while llm.engine.has_unfinished_requests():
            for out in llm.engine.step():
                reported |= {o.index for o in out.outputs if o.finish_reason is not None}
            finished = {i for i, c in enumerate(children) if c.is_finished}
            assert finished <= reported, (seed, finished, reported)
