"""OpenAI's Responses API (POST /v1/responses, GET / DELETE /v1/responses/{id}) on SmolLM2,
through the official ``openai`` client: the reply equals the chat endpoint's for the same
conversation, streamed events add up to it, previous_response_id continues a stored
conversation, function tools give function_call items, text.format constrains the text, and
what is not supported is a 400 naming the field. The event re-telling of reasoning and tool
call deltas is checked on synthetic chat chunks too."""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path
from typing import Any, Iterator

import httpx
import openai
import pytest
from server_utils import RemoteServer
from starlette.responses import StreamingResponse

from ironlm.entrypoints.openai.responses_api import (
    ResponsesRequest,
    ResponseStore,
    conversation_after,
    input_messages,
    output_items,
    responses_param,
    usage_of,
)
from ironlm.entrypoints.openai.serving_responses import _Events

pytestmark = pytest.mark.real_model

# no prefix caching: a cached prefix runs other kernels, and greedy text may differ in a late token
ARGS = ["--max-model-len", "512", "--kv-cache-memory", "64MiB", "--served-model-name", "s",
        "--no-enable-prefix-caching"]
INSTRUCTIONS = "You answer in one short sentence."


@pytest.fixture(scope="module")
def server(smollm2_dir: Path) -> Iterator[RemoteServer]:
    with RemoteServer(smollm2_dir, ARGS) as srv:
        yield srv


def chat_text(client: Any, messages: list[dict[str, Any]], max_tokens: int) -> Any:
    return client.chat.completions.create(model="s", messages=messages, max_tokens=max_tokens,
                                          temperature=0)  # fmt: skip


def test_reply_equals_the_chat_endpoints(server: RemoteServer) -> None:
    client = server.openai_client(timeout=120)
    resp = client.responses.create(model="s", instructions=INSTRUCTIONS, max_output_tokens=12,
                                   input="What is the capital of France?", temperature=0)
    chat = chat_text(client, [{"role": "system", "content": INSTRUCTIONS},
                              {"role": "user", "content": "What is the capital of France?"}], 12)
    assert resp.output_text == chat.choices[0].message.content
    assert resp.id.startswith("resp_") and resp.object == "response"
    assert resp.status == ("incomplete" if chat.choices[0].finish_reason == "length"
                           else "completed")  # fmt: skip
    assert resp.usage.input_tokens == chat.usage.prompt_tokens
    assert resp.usage.output_tokens == chat.usage.completion_tokens
    assert [item.type for item in resp.output] == ["message"]
    # stored (OpenAI's default): retrievable, then deleted
    assert client.responses.retrieve(resp.id).output_text == resp.output_text
    client.responses.delete(resp.id)
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(resp.id)


def test_stream_events_add_up(server: RemoteServer) -> None:
    client = server.openai_client(timeout=120)
    kwargs = {"model": "s", "input": "Name three colours.", "max_output_tokens": 16,
              "temperature": 0}  # fmt: skip
    whole = client.responses.create(**kwargs)
    events = list(client.responses.create(stream=True, **kwargs))
    types = [e.type for e in events]
    assert types[:2] == ["response.created", "response.in_progress"]
    assert types[-1] in ("response.completed", "response.incomplete")
    assert [e.sequence_number for e in events] == list(range(len(events)))
    deltas = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert deltas == whole.output_text == events[-1].response.output_text
    assert "response.output_text.done" in types and "response.output_item.done" in types
    assert events[-1].response.usage.output_tokens == whole.usage.output_tokens
    # top_logprobs: one entry a generated token on the text, streamed or not
    scored = client.responses.create(top_logprobs=2, **kwargs).model_dump()
    entries = scored["output"][0]["content"][0]["logprobs"]
    assert len(entries) == scored["usage"]["output_tokens"]
    assert all(len(e["top_logprobs"]) == 2 and e["logprob"] <= 0 for e in entries)
    streamed = [e.model_dump() for e in client.responses.create(stream=True, top_logprobs=2,
                                                                **kwargs)]  # fmt: skip
    assert [e["token"] for d in streamed if d["type"] == "response.output_text.delta"
            for e in d["logprobs"]] == [e["token"] for e in entries]  # fmt: skip


def test_previous_response_continues_the_conversation(server: RemoteServer) -> None:
    client = server.openai_client(timeout=120)
    first = client.responses.create(model="s", input="My name is Ada.", max_output_tokens=10,
                                    temperature=0)  # fmt: skip
    second = client.responses.create(model="s", input="What is my name?", temperature=0,
                                     previous_response_id=first.id, max_output_tokens=10)
    chat = chat_text(client, [{"role": "user", "content": "My name is Ada."},
                              {"role": "assistant", "content": first.output_text},
                              {"role": "user", "content": "What is my name?"}], 10)
    assert second.output_text == chat.choices[0].message.content
    assert second.previous_response_id == first.id
    with pytest.raises(openai.NotFoundError):
        client.responses.create(model="s", input="x", previous_response_id="resp_none")


def test_function_tools_and_text_format(server: RemoteServer) -> None:
    client = server.openai_client(timeout=120)
    tool = {"type": "function", "name": "get_weather", "description": "Weather of a city",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                           "required": ["city"]}}  # fmt: skip
    resp = client.responses.create(model="s", input="Weather in Paris?", tools=[tool],
                                   tool_choice="required", max_output_tokens=40, temperature=0)
    (call,) = [item for item in resp.output if item.type == "function_call"]
    assert call.name == "get_weather" and "city" in json.loads(call.arguments)
    # the call's output goes back as the next turn's input
    # (tool_choice "none": "auto" needs --enable-auto-tool-choice, as on the chat endpoint)
    follow = client.responses.create(model="s", previous_response_id=resp.id, tools=[tool],
                                     tool_choice="none",
                                     input=[{"type": "function_call_output",
                                             "call_id": call.call_id, "output": "sunny"}],
                                     max_output_tokens=8, temperature=0)  # fmt: skip
    assert follow.status in ("completed", "incomplete") and follow.output_text
    schema = {"type": "object", "properties": {"answer": {"type": "integer"}},
              "required": ["answer"], "additionalProperties": False}  # fmt: skip
    fmt = {"format": {"type": "json_schema", "name": "a", "schema": schema}}
    data = client.responses.create(model="s", input="2 + 2 = ?", text=fmt, temperature=0,
                                   max_output_tokens=30)  # fmt: skip
    assert isinstance(json.loads(data.output_text)["answer"], int)


@pytest.mark.parametrize("body,param", [
    ({"input": "x", "background": True}, "background"),
    ({"input": "x", "tools": [{"type": "web_search"}]}, "tools[0].type"),
    ({"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "u"}]}]},
     "input[0].content"),
    ({"input": "x", "n": 2}, "n"),
    ({"input": "x", "max_output_tokens": "many"}, "max_output_tokens"),
    ({"input": "x", "text": {"format": {"type": "yaml"}}}, "text.format"),
    ({"input": "x", "text": {"format": "json"}}, "text.format"),
    ({"input": [{"type": "message", "content": 5}]}, "input[0].content"),
    ({"input": [{"type": "message", "content": [5]}]}, "input[0].content"),
    ({"input": [{"type": "function_call", "name": "f"}]}, "input[0].call_id"),
    ({"input": [{"type": "function_call_output", "call_id": "c", "output": 5}]},
     "input[0].output"),
    # the chat request's checks, named as the Responses request names the field
    ({"input": "x", "max_output_tokens": -1}, "max_output_tokens"),
    ({"input": "x", "reasoning": {"effort": 5}}, "reasoning.effort"),
    ({"input": []}, "input"),
])  # fmt: skip
def test_unsupported_is_a_400_naming_the_field(server: RemoteServer, body: dict,
                                               param: str) -> None:  # fmt: skip
    r = httpx.post(server.url("/v1/responses"), json={"model": "s", **body}, timeout=60)
    assert r.status_code == 400 and r.json()["error"]["param"] == param, r.text
    assert httpx.get(server.url("/health"), timeout=10).status_code == 200


def test_events_retell_reasoning_and_calls() -> None:
    # synthetic chat chunks: reasoning, then text, then two tool calls in pieces
    chunks = [
        {"choices": [{"index": 0, "delta": {"reasoning": "Think"}}]},
        {"choices": [{"index": 0, "delta": {"reasoning": "ing."}}]},
        {"choices": [{"index": 0, "delta": {"content": "Calling."}}]},
        {"choices": [{"index": 0, "delta": {"tool_calls": [
            {"index": 0, "id": "call_a", "function": {"name": "f", "arguments": "{\"x\""}}]}}]},
        {"choices": [{"index": 0, "delta": {"tool_calls": [
            {"index": 0, "function": {"arguments": ": 1}"}}]}}]},
        {"choices": [{"index": 0, "delta": {"tool_calls": [
            {"index": 1, "id": "call_b", "function": {"name": "g", "arguments": "{}"}}]}}]},
        {"choices": [{"index": 0, "delta": {}, "finish_reason": "tool_calls"}]},
        {"choices": [], "usage": {"prompt_tokens": 5, "completion_tokens": 7,
                                  "total_tokens": 12}},
    ]  # fmt: skip

    class State:
        responses = None

    req = ResponsesRequest(model="s", input="x", store=False)
    got = _retell(_Events(State(), req, "s", "resp_1", 0, []), chunks)  # type: ignore[arg-type]
    final = got[-1]["response"]
    assert got[-1]["type"] == "response.completed"
    assert [i["type"] for i in final["output"]] == ["reasoning", "message", "function_call",
                                                    "function_call"]  # fmt: skip
    assert final["output"][0]["content"][0]["text"] == "Thinking."
    assert final["output"][1]["content"][0]["text"] == "Calling."
    assert [(i["call_id"], i["name"], i["arguments"]) for i in final["output"][2:]] == [
        ("call_a", "f", '{"x": 1}'), ("call_b", "g", "{}")]
    assert final["usage"]["total_tokens"] == 12
    added = [e["output_index"] for e in got if e["type"] == "response.output_item.added"]
    done = [e["output_index"] for e in got if e["type"] == "response.output_item.done"]
    assert added == done == [0, 1, 2, 3]
    args = [e["delta"] for e in got if e["type"] == "response.function_call_arguments.delta"]
    assert args == ['{"x"', ": 1}", "{}"]


def _retell(events: _Events, chunks: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The Responses events ``events`` makes of the chat stream of ``chunks``."""

    async def body() -> Any:
        for c in chunks:
            yield f"data: {json.dumps(c)}\n\n"
        yield "data: [DONE]\n\n"

    async def collect() -> list[dict[str, Any]]:
        return [json.loads(text.split("data: ", 1)[1])
                async for text in events.run(StreamingResponse(body()))]  # fmt: skip

    return asyncio.run(collect())


def test_a_stream_cut_short_is_not_stored() -> None:
    # the chat stream ends without a finish_reason when the client left: no "completed"
    # response with half the text is kept for GET or previous_response_id
    class State:
        responses = ResponseStore()

    state = State()
    req = ResponsesRequest(model="s", input="x")
    chunks = [{"choices": [{"index": 0, "delta": {"content": "Half"}}]}]
    got = _retell(_Events(state, req, "s", "resp_1", 0, []), chunks)  # type: ignore[arg-type]
    assert got[-1]["type"] == "response.output_text.delta" and not state.responses.items
    chunks.append({"choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]})
    got = _retell(_Events(state, req, "s", "resp_2", 0, []), chunks)  # type: ignore[arg-type]
    assert got[-1]["type"] == "response.completed" and list(state.responses.items) == ["resp_2"]


def test_usage_and_error_fields_as_the_responses_api_names_them() -> None:
    usage = usage_of({"prompt_tokens": 4, "completion_tokens": 9, "total_tokens": 13,
                      "completion_tokens_details": {"reasoning_tokens": 6}})  # fmt: skip
    assert usage is not None and usage["output_tokens_details"] == {"reasoning_tokens": 6}
    # the chat messages hold the instructions and earlier turns too: their index is not the
    # input's, so the field is named as a whole
    assert responses_param("messages.2.content") == "input"
    assert responses_param("response_format.json_schema") == "text.format"
    assert responses_param("max_completion_tokens") == "max_output_tokens"
    assert responses_param("tools.0.function") == "tools.0.function"


def test_the_reply_names_the_served_model(server: RemoteServer) -> None:
    body = {"input": "Hi", "max_output_tokens": 2}  # no model: the served one answers
    assert httpx.post(server.url("/v1/responses"), json=body, timeout=60).json()["model"] == "s"
    with httpx.stream("POST", server.url("/v1/responses"), json={**body, "stream": True},
                      timeout=60) as r:  # fmt: skip
        models = [json.loads(line[6:])["response"]["model"] for line in r.iter_lines()
                  if line.startswith("data: ") and '"response"' in line]  # fmt: skip
    assert models and set(models) == {"s"}


async def _abandoned(server: RemoteServer, body: dict[str, Any]) -> None:
    """POST /v1/responses and leave (close the connection) after half a second."""
    data = json.dumps(body).encode()
    reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
    writer.write(f"POST /v1/responses HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: "
                 f"application/json\r\nContent-Length: {len(data)}\r\n\r\n".encode() + data)
    await writer.drain()
    try:
        await asyncio.wait_for(reader.read(), 0.5)
    except TimeoutError:
        pass
    writer.close()
    await writer.wait_closed()


def test_a_client_that_leaves_is_no_server_error(server: RemoteServer) -> None:
    # the chat endpoint answers 499 to a client that left: passed on, not read as a reply
    body = {"model": "s", "input": "Tell a long story.", "max_output_tokens": 400,
            "ignore_eos": True}  # fmt: skip
    asyncio.run(_abandoned(server, body))
    time.sleep(1.0)  # the server notices the disconnect
    assert "unhandled error on POST /v1/responses" not in server.log_text()
    assert httpx.get(server.url("/health"), timeout=10).status_code == 200


def test_output_passed_back_reads_as_the_stored_conversation() -> None:
    # a reply's text and calls are one assistant turn, whether the next request names the
    # reply by previous_response_id or passes its output items back as input
    message = {"content": "Let me look.", "reasoning": "Weather: ask the tool.", "tool_calls": [
        {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}},
        {"id": "c2", "type": "function", "function": {"name": "g", "arguments": "{}"}}]}
    output = output_items(message)
    turn = {"role": "assistant", "content": "Let me look.", "tool_calls": [
        {"id": c, "type": "function", "function": {"name": n, "arguments": "{}"}}
        for c, n in (("c1", "f"), ("c2", "g"))]}  # fmt: skip
    assert conversation_after([], output) == input_messages(output) == [turn]
    assert conversation_after([], output_items({"reasoning": "Hm"}))[-1] == {
        "role": "assistant", "content": ""}
