"""--reasoning-parser through the real server with SmolLM2 and the official ``openai`` client.

SmolLM2 is no reasoning model, but three worked examples in the conversation make it think
between <think> and </think> before it answers, greedily and in float32 the same way on every
CPU: "3 plus 3 is 6." then "The answer is 6.". The raw text comes from /v1/completions on the
same prompt tokens (completions never split reasoning), so each case compares the split with
what the model wrote."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Iterator

import httpx
import openai
import pytest
from server_utils import RemoteServer, outlines_available, smollm2_args


pytestmark = [pytest.mark.server, pytest.mark.real_model]
jsonschema = pytest.importorskip("jsonschema")

MODEL = "smollm2"
SHOTS = [("What is 2+3?", "<think>2 plus 3 is 5.</think>The answer is 5."),
         ("What is 4+4?", "<think>4 plus 4 is 8.</think>The answer is 8."),
         ("What is 1+6?", "<think>1 plus 6 is 7.</think>The answer is 7.")]
ASK: list[dict[str, Any]] = [m for q, a in SHOTS for m in (
    {"role": "user", "content": q}, {"role": "assistant", "content": a})]
ASK.append({"role": "user", "content": "What is 3+3?"})
SCHEMA = {"type": "object", "properties": {"answer": {"type": "integer"}},
          "required": ["answer"], "additionalProperties": False}


needs_guided = pytest.mark.skipif(not outlines_available(),
                                  reason="guided-decoding backend outlines not installed")


@pytest.fixture(scope="module")
def server(smollm2_dir: Path) -> Iterator[RemoteServer]:
    args = smollm2_args("--max-num-seqs", "16", "--reasoning-parser", "deepseek_r1")
    with RemoteServer(smollm2_dir, args) as srv:
        yield srv


@pytest.fixture(scope="module")
def client(server: RemoteServer) -> openai.OpenAI:
    return server.openai_client(timeout=120)


def _raw(server: RemoteServer, messages: list[dict[str, Any]], max_tokens: int,
         **chat: Any) -> str:
    """What the model writes for this conversation, unsplit (/v1/completions)."""
    ids = httpx.post(server.url("/tokenize"), json={"model": MODEL, "messages": messages,
                                                   **chat}).json()["tokens"]
    body = httpx.post(server.url("/v1/completions"), timeout=120, json={
        "model": MODEL, "prompt": ids, "max_tokens": max_tokens, "temperature": 0}).json()
    return body["choices"][0]["text"]


def _ask(client: openai.OpenAI, **kwargs: Any) -> Any:
    return client.chat.completions.create(model=MODEL, messages=kwargs.pop("messages", ASK),
                                          max_tokens=kwargs.pop("max_tokens", 40),
                                          temperature=kwargs.pop("temperature", 0), **kwargs)


def test_reasoning_and_answer_split(server: RemoteServer, client: openai.OpenAI) -> None:
    raw = _raw(server, ASK, 40)
    assert raw.startswith("<think>") and "</think>" in raw  # the examples made it think
    thought, _, answer = raw.removeprefix("<think>").partition("</think>")
    msg = _ask(client).choices[0].message
    assert (msg.reasoning, msg.reasoning_content, msg.content) == (thought, thought, answer)
    assert thought and answer and "<think>" not in thought + answer


def test_streamed_split_matches(client: openai.OpenAI) -> None:
    """Each chunk carries reasoning or content; reasoning comes first, under both names, and
    the pieces add up to the non-streamed message."""
    whole = _ask(client).choices[0].message
    reasoning, content, kinds = "", "", []
    for chunk in _ask(client, stream=True):
        if not chunk.choices:
            continue
        delta = chunk.choices[0].delta.model_dump()
        assert delta.get("reasoning") == delta.get("reasoning_content")
        if delta.get("reasoning"):
            reasoning += delta["reasoning"]
            kinds.append("r")
        if delta.get("content"):
            content += delta["content"]
            kinds.append("c")
    assert (reasoning, content) == (whole.reasoning, whole.content)
    assert kinds == sorted(kinds, reverse=True) and "r" in kinds and "c" in kinds


def test_include_reasoning_false_leaves_it_out(client: openai.OpenAI) -> None:
    whole = _ask(client).choices[0].message
    msg = _ask(client, extra_body={"include_reasoning": False}).choices[0].message
    assert msg.reasoning is None and msg.reasoning_content is None
    assert msg.content == whole.content
    streamed = [c.choices[0].delta for c in _ask(client, stream=True, extra_body={
        "include_reasoning": False}) if c.choices]
    assert all(getattr(d, "reasoning", None) is None for d in streamed)
    assert "".join(d.content or "" for d in streamed) == whole.content


def test_include_reasoning_false_hides_logprobs(client: openai.OpenAI) -> None:
    """The hidden reasoning does not come back token by token through logprobs (vLLM
    suppresses them too), streamed or not."""
    hidden = {"include_reasoning": False}
    msg = _ask(client, logprobs=True, top_logprobs=2, extra_body=hidden).choices[0]
    assert msg.logprobs is None and msg.message.content
    chunks = [c.choices[0] for c in _ask(client, stream=True, logprobs=True, extra_body=hidden)
              if c.choices]
    assert all(c.logprobs is None for c in chunks)
    shown = _ask(client, logprobs=True).choices[0]  # included: every token's logprob
    assert shown.logprobs is not None
    assert len(shown.logprobs.content) == _ask(client).usage.completion_tokens


def test_streamed_choices_split_alike(client: openai.OpenAI) -> None:
    """n = 2, sampled: each streamed choice adds up to a split of its own (the two non-stream
    and stream runs are seeded alike)."""
    whole = _ask(client, n=2, temperature=1.0, seed=11, max_tokens=30)
    parts: dict[int, list[str]] = {0: ["", ""], 1: ["", ""]}
    for chunk in _ask(client, n=2, temperature=1.0, seed=11, max_tokens=30, stream=True):
        for c in chunk.choices:
            delta = c.delta.model_dump()
            parts[c.index][0] += delta.get("reasoning") or ""
            parts[c.index][1] += delta.get("content") or ""
    for c in whole.choices:
        assert parts[c.index] == [c.message.reasoning or "", c.message.content or ""]


@needs_guided
def test_completions_are_constrained_from_the_first_token(server: RemoteServer) -> None:
    """/v1/completions splits no reasoning, so its guided output is constrained from the
    first token (only chat waits for the end of the thinking)."""
    body = httpx.post(server.url("/v1/completions"), timeout=120, json={
        "model": MODEL, "prompt": "The answer as JSON:", "max_tokens": 40, "temperature": 0,
        "guided_json": SCHEMA}).json()
    jsonschema.validate(json.loads(body["choices"][0]["text"]), SCHEMA)


@needs_guided
def test_include_reasoning_false_with_a_grammar(client: openai.OpenAI) -> None:
    """Left out, the reasoning is not waited for: the grammar constrains from the first token
    and all of it is the answer (newer vLLM), streamed or not."""
    hidden = {"include_reasoning": False}
    fmt = {"type": "json_schema", "json_schema": {"name": "a", "schema": SCHEMA}}
    msg = _ask(client, max_tokens=30, response_format=fmt, extra_body=hidden).choices[0].message
    jsonschema.validate(json.loads(msg.content), SCHEMA)
    streamed = "".join(c.choices[0].delta.content or "" for c in _ask(
        client, max_tokens=30, response_format=fmt, extra_body=hidden, stream=True)
        if c.choices)
    assert streamed == msg.content
    tools = [{"type": "function", "function": {"name": "report", "parameters": SCHEMA}}]
    call = _ask(client, max_tokens=30, tools=tools, tool_choice="required",
                extra_body=hidden).choices[0].message
    assert [c.function.name for c in call.tool_calls] == ["report"] and call.reasoning is None


def test_cut_off_while_thinking(client: openai.OpenAI) -> None:
    """max_tokens ends the output inside the think block: all of it is reasoning, content
    null (vLLM's reading: the model had not answered yet)."""
    msg = _ask(client, max_tokens=5).choices[0].message
    assert msg.content is None and msg.reasoning and "</think>" not in msg.reasoning


def test_prompt_that_closed_the_reasoning(server: RemoteServer, client: openai.OpenAI) -> None:
    """An assistant prefix holding a whole think block, continued: everything generated is
    the answer; an earlier reply's think block in the conversation does not count."""
    closed = ASK + [{"role": "assistant", "content": "<think>3 plus 3 is 6.</think>The"}]
    chat = {"add_generation_prompt": False, "continue_final_message": True}
    raw = _raw(server, closed, 10, **chat)
    msg = _ask(client, messages=closed, max_tokens=10, extra_body=chat).choices[0].message
    assert msg.reasoning is None and msg.content == raw and raw


def test_reasoning_effort(client: openai.OpenAI) -> None:
    assert _ask(client, reasoning_effort="low").choices[0].message.reasoning  # accepted
    with pytest.raises(openai.BadRequestError) as exc:
        _ask(client, extra_body={"reasoning_effort": "extreme"})
    assert "reasoning_effort" in str(exc.value)


@needs_guided
def test_structured_output_constrains_only_the_answer(client: openai.OpenAI) -> None:
    """The grammar waits for </think>: the reasoning is the free run's, token for token, and
    the answer is JSON of the schema."""
    free = _ask(client).choices[0].message
    msg = _ask(client, max_tokens=60, response_format={
        "type": "json_schema", "json_schema": {"name": "a", "schema": SCHEMA}}).choices[0].message
    assert msg.reasoning == free.reasoning
    value = json.loads(msg.content)
    jsonschema.validate(value, SCHEMA)


@needs_guided
def test_required_tool_call_after_reasoning(client: openai.OpenAI) -> None:
    tools = [{"type": "function", "function": {"name": "report", "parameters": SCHEMA}}]
    free = _ask(client).choices[0].message
    resp = _ask(client, max_tokens=60, tools=tools, tool_choice="required")
    msg = resp.choices[0].message
    assert msg.reasoning == free.reasoning and msg.content is None
    assert [c.function.name for c in msg.tool_calls] == ["report"]
    jsonschema.validate(json.loads(msg.tool_calls[0].function.arguments), SCHEMA)
    assert resp.choices[0].finish_reason == "tool_calls"


def test_usage_counts_reasoning_tokens(server: RemoteServer, client: openai.OpenAI,
                                       smollm2_tokenizer) -> None:  # type: ignore[no-untyped-def]
    """completion_tokens_details.reasoning_tokens (newer vLLM, OpenAI's field): the tokens of
    the thinking, markers excluded; the same at the end of a stream; 0 when the prompt
    closed the reasoning."""
    resp = _ask(client)
    thought = resp.choices[0].message.reasoning
    expected = len(smollm2_tokenizer.encode(thought, add_special_tokens=False))
    assert resp.usage.completion_tokens_details.reasoning_tokens == expected > 0
    last = [c for c in _ask(client, stream=True, stream_options={"include_usage": True})][-1]
    assert last.usage.completion_tokens_details.reasoning_tokens == expected
    cut = _ask(client, max_tokens=5)  # never closed: every token but "<think>"'s three
    assert cut.usage.completion_tokens_details.reasoning_tokens == 5 - 3
    closed = ASK + [{"role": "assistant", "content": "<think>3 plus 3 is 6.</think>The"}]
    done = _ask(client, messages=closed, max_tokens=5, extra_body={
        "add_generation_prompt": False, "continue_final_message": True})
    assert done.usage.completion_tokens_details.reasoning_tokens == 0
