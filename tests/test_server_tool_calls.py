"""Tool-call plumbing of the server without a model: tool_choice validation, the guided schema
of "required", and streamed tool-call fragments joining to the one-shot arguments."""

from __future__ import annotations

import json
import random

import pytest

from ironlm.entrypoints.openai.errors import APIError
from ironlm.entrypoints.openai.tool_call_scanner import CallArrayScanner
from ironlm.entrypoints.openai.tool_calls import plan_tools
from ironlm.interfaces.tool_parser import StreamDelta

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Weather in a city",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
            "required": ["city"],
        },
    },
}
TIME = {"type": "function", "function": {"name": "get_time", "parameters": {"type": "object"}}}

REQUIRED_OUTPUTS = [
    '[{"name": "get_weather", "parameters": {"city": "Paris", "days": 3}}]',
    '[ {"name":"get_weather","parameters":{"city":"a \\"quoted\\" {brace}"}} ,\n'
    ' {"name": "get_time", "parameters": {"nested": {"x": [1, {"y": "]"}]}}} ]',
    '[{"parameters": {"city": "Rome"}, "name": "get_weather"}]',
    '[{"name": "get_time", "parameters": 5 }]',
    '[{"name": "get_weather", "parameters": {"city": "Par',  # cut off (finish_reason length)
]


def _plan(choice: object, tools: list | None = None, **kw: object):  # type: ignore[no-untyped-def]
    return plan_tools([WEATHER, TIME] if tools is None else tools, choice,  # type: ignore[arg-type]
                      kw.get("parallel", True), kw.get("auto", False), kw.get("parser"))  # type: ignore[arg-type]


def _stream(extractor, text: str, rng: random.Random) -> tuple[str, dict[int, dict[str, str]]]:  # type: ignore[no-untyped-def]
    """Feed ``text`` in random pieces; join content and per-call name / argument fragments."""
    content, calls = "", {}
    pos = 0
    deltas: list[StreamDelta] = []
    while pos < len(text):
        step = rng.randint(1, 7)
        deltas.append(extractor.feed(text[pos:pos + step]))
        pos += step
    deltas.append(extractor.finish())
    for d in deltas:
        content += d.content or ""
        for c in d.tool_calls:
            call = calls.setdefault(c.index, {"name": "", "arguments": ""})
            if c.name:
                assert not call["name"], "the name comes once, in the first fragment"
                call["name"] = c.name
            else:
                assert call["name"], "argument fragments come after the call's name"
            call["arguments"] += c.arguments
    return content, calls


@pytest.mark.parametrize("text", REQUIRED_OUTPUTS)
def test_required_stream_equals_one_shot(text: str) -> None:
    plan = _plan("required")
    _, calls = plan.extractor(None).extract(text)
    rng = random.Random(0)
    for _ in range(20):
        _, streamed = _stream(plan.extractor(None), text, rng)
        complete = {i: c for i, c in streamed.items() if i < len(calls)}
        assert [(c["name"], c["arguments"]) for c in complete.values()] == [
            (c.name, c.arguments) for c in calls
        ]
    for c in calls:
        json.loads(c.arguments)  # the raw span is the JSON value itself, never re-encoded


def test_required_extract_values() -> None:
    _, calls = _plan("required").extractor(None).extract(REQUIRED_OUTPUTS[1])
    assert [c.name for c in calls] == ["get_weather", "get_time"]
    assert json.loads(calls[0].arguments) == {"city": 'a "quoted" {brace}'}
    assert json.loads(calls[1].arguments) == {"nested": {"x": [1, {"y": "]"}]}}
    content, calls = _plan("required").extractor(None).extract(REQUIRED_OUTPUTS[-1])
    assert calls == [] and content == REQUIRED_OUTPUTS[-1]


def test_named_stream_equals_one_shot() -> None:
    plan = _plan({"type": "function", "function": {"name": "get_weather"}})
    text = '  \n{"city": "Oslo",  "days": 2}\n  '
    content, calls = plan.extractor(None).extract(text)
    assert content is None and calls[0].name == "get_weather"
    assert calls[0].arguments == '{"city": "Oslo",  "days": 2}'
    for seed in range(10):
        _, streamed = _stream(plan.extractor(None), text, random.Random(seed))
        assert streamed == {0: {"name": "get_weather", "arguments": calls[0].arguments}}


def test_required_schema_accepts_calls_only() -> None:
    jsonschema = pytest.importorskip("jsonschema")
    schema = json.loads(_plan("required").guided_spec().value)  # type: ignore[union-attr]
    jsonschema.Draft202012Validator.check_schema(schema)
    jsonschema.validate(json.loads(REQUIRED_OUTPUTS[0]), schema)
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate([{"name": "nope", "parameters": {}}], schema)
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate([], schema)
    single = json.loads(_plan("required", parallel=False).guided_spec().value)  # type: ignore[union-attr]
    assert single["maxItems"] == 1
    named = _plan({"type": "function", "function": {"name": "get_weather"}}).guided_spec()
    assert json.loads(named.value) == WEATHER["function"]["parameters"]  # type: ignore[union-attr,index]


@pytest.mark.parametrize(
    ("tools", "choice", "needle"),
    [
        (None, "auto", "only allowed when tools"),
        ([], "required", "only allowed when tools"),
        ([WEATHER], {"type": "function", "function": {"name": "missing"}}, "not in tools"),
        ([WEATHER], "auto", "--enable-auto-tool-choice"),
        ([WEATHER], None, "--enable-auto-tool-choice"),  # tools default to "auto"
        ([WEATHER], "sometimes", "invalid tool_choice"),
        ([{"type": "function", "function": {"name": "bad name!"}}], "none", "name must match"),
        ([{"type": "function", "function": {"name": "f", "parameters": {"type": "banana"}}}],
         "none", "not a valid JSON schema"),
        ([{"type": "function", "function": {"name": "f", "parameters": []}}], "none",
         "not a valid JSON schema"),
        ([WEATHER, WEATHER], "none", "defined twice"),
    ],
)
def test_tool_choice_errors(tools: list | None, choice: object, needle: str) -> None:
    with pytest.raises(APIError) as err:
        plan_tools(tools, choice, True, False, None)  # type: ignore[arg-type]
    assert err.value.status == 400 and needle in err.value.message


def test_scanner_incremental_prefixes() -> None:
    text = REQUIRED_OUTPUTS[1]
    scanner = CallArrayScanner()
    seen: list[str] = []
    for ch in text:
        scanner.feed(ch)
        now = scanner.available_args(scanner.calls[0]) if scanner.calls else ""
        if seen:
            assert now.startswith(seen[-1])  # streamed argument text only ever grows
        seen.append(now)
