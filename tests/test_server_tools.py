"""Tool calling and structured output through the real server with SmolLM2 (issues 7 and 6),
driven by the official ``openai`` client. SmolLM2's own template ignores tools, so the server
runs with a Hermes-style --chat-template; "auto" uses the hermes parser."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any, Iterator, Literal

import openai
import pytest
from pydantic import BaseModel
from server_utils import RemoteServer, outlines_available, smollm2_args


pytestmark = [pytest.mark.server, pytest.mark.real_model]
jsonschema = pytest.importorskip("jsonschema")

MODEL = "smollm2"
TEMPLATE = """\
{%- if tools %}<|im_start|>system
You can call functions. Tools: <tools>{% for t in tools %}{{ t | tojson }}{% endfor %}</tools>
Reply with <tool_call>{"name": ..., "arguments": {...}}</tool_call>.<|im_end|>
{% endif %}
{%- for m in messages %}
{%- if m.role == 'tool' %}<|im_start|>user
<tool_response>{{ m.content }}</tool_response><|im_end|>
{% elif m.tool_calls %}<|im_start|>assistant
{% for c in m.tool_calls %}<tool_call>{{ {"name": c.function.name, "arguments": c.function.arguments} | tojson }}</tool_call>{% endfor %}<|im_end|>
{% else %}<|im_start|>{{ m.role }}
{{ m.content }}<|im_end|>
{% endif %}
{%- endfor %}
{%- if add_generation_prompt %}<|im_start|>assistant
{% endif %}"""
WEATHER_PARAMS = {
    "type": "object",
    "properties": {
        "city": {"type": "string", "enum": ["Paris", "London", "Tokyo"]},
        "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
    },
    "required": ["city", "unit"],
    "additionalProperties": False,
}
TIME_PARAMS = {
    "type": "object",
    "properties": {"zone": {"type": "string", "enum": ["UTC", "CET"]}},
    "required": ["zone"],
    "additionalProperties": False,
}
TOOLS = [
    {"type": "function", "function": {"name": "get_weather", "description": "Weather now",
                                      "parameters": WEATHER_PARAMS}},
    {"type": "function", "function": {"name": "get_time", "description": "Time now",
                                      "parameters": TIME_PARAMS}},
]
SCHEMAS = {"get_weather": WEATHER_PARAMS, "get_time": TIME_PARAMS}
ASK = [{"role": "user", "content": "What is the weather in Paris?"}]
NAMED = {"type": "function", "function": {"name": "get_weather"}}


# The constrained cases run on the outlines backend (compact JSON, so short outputs).
needs_guided = pytest.mark.skipif(not outlines_available(),
                                  reason="guided-decoding backend outlines not installed")


@pytest.fixture(scope="module")
def server(smollm2_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[RemoteServer]:
    template = tmp_path_factory.mktemp("tpl") / "tools.jinja"
    template.write_text(TEMPLATE)
    args = smollm2_args("--max-num-seqs", "32", "--chat-template", str(template),
                        "--enable-auto-tool-choice", "--tool-call-parser", "hermes")
    with RemoteServer(smollm2_dir, args) as srv:
        yield srv


@pytest.fixture(scope="module")
def client(server: RemoteServer) -> openai.OpenAI:
    return server.openai_client(timeout=120)


def _check_calls(calls: Any) -> None:
    assert calls
    for call in calls:
        assert call.type == "function" and call.id
        assert isinstance(call.function.arguments, str)  # JSON text, never double-encoded
        args = json.loads(call.function.arguments)
        jsonschema.validate(args, SCHEMAS[call.function.name])


@pytest.mark.parametrize(("kwargs", "needle"), [
    ({"tool_choice": "required"}, "only allowed when tools"),
    ({"tools": [], "tool_choice": "auto"}, "only allowed when tools"),
    ({"tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "nope"}}},
     "not in tools"),
    ({"tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": 5}}}],
      "tool_choice": "none"}, "not a valid JSON schema"),
    ({"tools": TOOLS, "tool_choice": "required", "response_format": {"type": "json_object"}},
     "cannot be combined"),
])
def test_tool_request_errors(client: openai.OpenAI, kwargs: dict[str, Any], needle: str) -> None:
    with pytest.raises(openai.BadRequestError) as err:
        client.chat.completions.create(model=MODEL, messages=ASK, max_tokens=2, **kwargs)
    assert needle in err.value.message


def test_no_access_log_lines(server: RemoteServer, client: openai.OpenAI) -> None:
    client.models.list()  # --disable-uvicorn-access-log: no '"GET /v1/models ..." 200' line
    assert '"GET /v1/models' not in server.log_text()


def test_tokenizer_info_is_opt_in(server: RemoteServer) -> None:
    # vLLM serves /tokenizer_info (the chat template, tokenizer config) only with
    # --enable-tokenizer-info-endpoint; tests/test_server_openai.py runs with it
    import httpx

    assert httpx.get(server.url("/tokenizer_info"), headers=server.headers()).status_code == 404


def test_beam_search_over_http(client: openai.OpenAI) -> None:
    """use_beam_search (vLLM's extra parameter): the n best of best_of beams; a structured
    output constraint, which beams would drop, is a 400 naming its field."""
    resp = client.chat.completions.create(
        model=MODEL, messages=ASK, max_tokens=4, temperature=0, n=2,
        extra_body={"use_beam_search": True, "best_of": 3})
    assert [c.index for c in resp.choices] == [0, 1]
    assert resp.choices[0].message.content != resp.choices[1].message.content
    for extra in ({"response_format": {"type": "json_object"}}, {"guided_regex": "a+"}):
        with pytest.raises(openai.BadRequestError) as exc:
            client.chat.completions.create(model=MODEL, messages=ASK, max_tokens=4,
                                           temperature=0,
                                           extra_body={"use_beam_search": True, **extra})
        assert exc.value.body["param"] == next(iter(extra))  # type: ignore[index]


def test_request_chat_templates_need_trust(client: openai.OpenAI) -> None:
    # vLLM's rule: without --trust-request-chat-template a request's template (a Jinja program
    # the server would run) is refused, in either place a request can put it
    for extra in ({"chat_template": "{{ messages }}"},
                  {"chat_template_kwargs": {"chat_template": "{{ messages }}"}}):
        with pytest.raises(openai.BadRequestError, match="trust-request-chat-template"):
            client.chat.completions.create(model=MODEL, max_tokens=2, extra_body=extra,
                                           messages=[{"role": "user", "content": "hi"}])


def test_tool_choice_none_gives_text(client: openai.OpenAI) -> None:
    out = client.chat.completions.create(model=MODEL, messages=ASK, tools=TOOLS,
                                         tool_choice="none", max_tokens=5, temperature=0)
    choice = out.choices[0]
    assert isinstance(choice.message.content, str) and not choice.message.tool_calls
    assert choice.finish_reason in ("stop", "length")


@needs_guided
def test_required_calls_validate(client: openai.OpenAI) -> None:
    out = client.chat.completions.create(model=MODEL, messages=ASK, tools=TOOLS,
                                         tool_choice="required", parallel_tool_calls=False,
                                         max_tokens=60, temperature=0)
    choice = out.choices[0]
    assert choice.finish_reason == "tool_calls"
    assert len(choice.message.tool_calls) == 1 and choice.message.content is None
    _check_calls(choice.message.tool_calls)


@needs_guided
def test_named_call_stream_reassembles(client: openai.OpenAI) -> None:
    kwargs = dict(model=MODEL, messages=ASK, tools=TOOLS, tool_choice=NAMED, max_tokens=40,
                  temperature=0)
    full = client.chat.completions.create(**kwargs).choices[0]
    assert full.finish_reason == "tool_calls"
    assert [c.function.name for c in full.message.tool_calls] == ["get_weather"]
    _check_calls(full.message.tool_calls)
    deltas = [c.choices[0] for c in client.chat.completions.create(stream=True, **kwargs)
              if c.choices]
    frags = [tc for d in deltas for tc in (d.delta.tool_calls or [])]
    first, rest = frags[0], frags[1:]
    assert (first.index, first.type, first.function.name) == (0, "function", "get_weather")
    assert first.id
    assert all(f.id is None and f.function.name is None for f in rest)
    arguments = "".join(f.function.arguments or "" for f in frags)
    assert arguments == full.message.tool_calls[0].function.arguments
    assert [d.finish_reason for d in deltas if d.finish_reason] == ["tool_calls"]


@needs_guided
def test_auto_with_hermes_parser(client: openai.OpenAI) -> None:
    forced = '<tool_call>{"name": "get_weather", "arguments": {"city": "Paris", ' \
        '"unit": "celsius"}}</tool_call>'
    kwargs = dict(model=MODEL, messages=ASK, tools=TOOLS, tool_choice="auto", max_tokens=60,
                  temperature=0, extra_body={"guided_choice": [forced]})
    out = client.chat.completions.create(**kwargs).choices[0]
    assert out.finish_reason == "tool_calls" and not out.message.content
    assert [c.function.name for c in out.message.tool_calls] == ["get_weather"]
    assert json.loads(out.message.tool_calls[0].function.arguments) == {
        "city": "Paris", "unit": "celsius"}
    chunks = [c.choices[0] for c in client.chat.completions.create(stream=True, **kwargs)
              if c.choices]
    frags = [tc for ch in chunks for tc in (ch.delta.tool_calls or [])]
    assert frags[0].function.name == "get_weather" and frags[0].id
    assert json.loads("".join(f.function.arguments or "" for f in frags)) == {
        "city": "Paris", "unit": "celsius"}
    # as vLLM: no empty chunk while the parser holds text back
    assert all(ch.delta.role or ch.delta.content is not None or ch.delta.tool_calls
               or ch.finish_reason for ch in chunks)
    # a complete call, then text up to max_tokens: still "tool_calls" in auto mode (vLLM)
    cut = dict(kwargs, extra_body={"guided_regex": re.escape(forced) + "( ok){200}"})
    out = client.chat.completions.create(**cut).choices[0]
    assert out.finish_reason == "tool_calls"
    assert [c.function.name for c in out.message.tool_calls] == ["get_weather"]
    last = [c.choices[0].finish_reason for c in client.chat.completions.create(
        stream=True, **cut) if c.choices and c.choices[0].finish_reason]
    assert last == ["tool_calls"]


def test_tool_round_trip_history(client: openai.OpenAI) -> None:
    messages = ASK + [
        {"role": "assistant", "content": None, "tool_calls": [{
            "id": "call_1", "type": "function",
            "function": {"name": "get_weather",
                         "arguments": '{"city": "Paris", "unit": "celsius"}'}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "18 degrees, sunny"},
    ]
    out = client.chat.completions.create(model=MODEL, messages=messages, tools=TOOLS,
                                         tool_choice="none", max_tokens=8, temperature=0)
    assert isinstance(out.choices[0].message.content, str) and out.choices[0].message.content


# -- structured output through the server (issue 6) ----------------------------------------
class Answer(BaseModel):
    colour: Literal["red", "green", "blue"]
    sure: bool


@needs_guided
def test_guided_choice_and_parse(client: openai.OpenAI) -> None:
    out = client.completions.create(model=MODEL, prompt="My favourite animal is the", n=2,
                                    max_tokens=5, extra_body={"guided_choice": ["cat", "dog"]})
    assert all(c.text in ("cat", "dog") for c in out.choices)
    parsed = client.chat.completions.parse(
        model=MODEL, messages=[{"role": "user", "content": "Pick a colour."}],
        response_format=Answer, max_tokens=30, temperature=0,
    )
    assert isinstance(parsed.choices[0].message.parsed, Answer)


@pytest.mark.parametrize("extra", [
    {"guided_regex": "[a-z]+", "guided_choice": ["a"]},  # two constraints
    {"guided_json": "{not json"},
    {"guided_choice": ["a"], "guided_decoding_backend": "no-such-backend"},
])
def test_guided_errors_are_400(client: openai.OpenAI, extra: dict[str, Any]) -> None:
    with pytest.raises(openai.BadRequestError):
        client.completions.create(model=MODEL, prompt="x", max_tokens=2, extra_body=extra)


def test_tool_call_validity(server: RemoteServer) -> None:
    """required / named calls parse and validate against the tool's schema, on an
    eighth of tests/data/tool_functions.json's real function schemas (tests/tool_call_validity.py
    prints the full table), streaming and not, with the per-request backend "auto". The
    eighth is one whose schemas xgrammar compiles: the schemas it refuses (string maxLength
    above 128) fall back to outlines, whose compile of them takes minutes on this machine."""
    import asyncio

    from tool_call_validity import measure, table

    client = server.async_openai_client(timeout=300)
    results = asyncio.run(measure(client, modes=("required", "required-single", "named"),
                                  every=8, start=2,
                                  max_tokens=128, extra_body={"guided_decoding_backend": "auto"}))
    print(table(results))
    assert sum(len(got) for got in results.values()) == 6 * 7
    # every call parses and validates: ended by the model, or closed within max_tokens where
    # the model loops inside an unbounded value (engine/guided_closing.py)
    assert all(o in ("valid", "closed") for got in results.values() for o in got), table(results)
