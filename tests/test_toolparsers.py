"""ironlm-toolparsers: discovery, the streaming protocol, and the hermes parser.

Every fixed model output is checked one-shot (``extract``) against the expected calls and content,
and streamed in several hundred seeded random chunkings (plus whole and one character at a time),
each of which must reassemble to the one-shot result. The other parsers have their own
``test_toolparser_*.py`` files built on the same helpers (``ironlm_toolparsers.testing``).
"""

from __future__ import annotations

import re

import pytest

from ironlm.interfaces.tool_parser import ToolParser
from ironlm.plugin_manager import PluginManager
from ironlm.registry import UnknownNameError
from ironlm_toolparsers.hermes import HermesToolParser
from ironlm_toolparsers.testing import (
    assert_extracts,
    assert_malformed,
    assert_unretractable,
    stream,
)

PARSERS = {"hermes", "mistral", "llama3_json", "pythonic", "granite"}
P = HermesToolParser


def call(body: str) -> str:
    return f"<tool_call>{body}</tool_call>"


WEATHER = '{"name": "get_weather", "arguments": {"city": "Paris", "unit": "celsius"}}'
WEATHER_ARGS = '{"city": "Paris", "unit": "celsius"}'


# -- discovery ----------------------------------------------------------------------------------
def _toolparsers_only() -> PluginManager:
    """Discover the installed ``toolparsers`` entry point; the core's own plugin is left out (it
    registers no tool parser, and this test should not depend on the engine's modules)."""
    pm = PluginManager(allow=["toolparsers"])
    pm.unregister("ironlm")
    return pm


def test_plugin_manager_lists_every_parser_with_provenance() -> None:
    """Full discovery, as the server does it: every installed plugin loaded."""
    pm = PluginManager(autoload=True)
    registry = pm.registries.tool_parsers
    assert set(registry.names()) == PARSERS
    for entry in registry:
        assert issubclass(entry.obj, ToolParser) and entry.obj.name == entry.name
        assert entry.provenance.plugin == "toolparsers"
        assert entry.provenance.distribution == "ironlm-toolparsers"
        assert entry.provenance.version
    listed = {row["plugin"]: row for row in pm.describe()}["toolparsers"]
    assert {(item["kind"], item["name"]) for item in listed["registered"]} == \
        {("tool parser", name) for name in PARSERS} | \
        {("reasoning parser", name) for name in ("deepseek_r1", "qwen3")}


def test_selection_by_name_and_unknown_name_lists_installed() -> None:
    pm = _toolparsers_only()
    assert pm.select_tool_parser("hermes") is HermesToolParser
    with pytest.raises(UnknownNameError) as err:
        pm.select_tool_parser("nope")
    for name in PARSERS:
        assert name in str(err.value)


def test_importing_the_plugin_module_imports_no_parser() -> None:
    import ironlm_toolparsers.plugin as plugin

    assert not any(name.endswith("ToolParser") for name in vars(plugin))


# -- shared behaviour ---------------------------------------------------------------------------
def test_ids_are_unique_and_shaped_like_vllm() -> None:
    result = P(None).extract(call(WEATHER) * 3)
    ids = [c.id for c in result.tool_calls]
    assert len(set(ids)) == 3
    assert all(re.fullmatch(r"chatcmpl-tool-[0-9a-f]{32}", i) for i in ids)


def test_first_delta_has_id_and_name_then_only_argument_fragments() -> None:
    parser = P(None)
    deltas = [parser.extract_streaming(c) for c in call(WEATHER)] + [parser.finish_streaming()]
    pieces = [p for d in deltas for p in d.tool_calls]
    assert pieces[0].id and pieces[0].name == "get_weather" and pieces[0].arguments == ""
    assert all(p.id is None and p.name is None for p in pieces[1:])
    assert len(pieces) > 5  # arguments really stream, character by character here
    assert "".join(p.arguments for p in pieces) == WEATHER_ARGS


def test_name_is_sent_before_the_arguments_are_complete() -> None:
    parser = P(None)
    delta = parser.extract_streaming('<tool_call>{"name": "get_weather", "arguments": {"ci')
    pieces = [(p.name, p.arguments) for p in delta.tool_calls]
    assert pieces == [("get_weather", ""), (None, '{"ci')]


def test_possible_marker_is_held_back_then_released() -> None:
    parser = P(None)
    assert parser.extract_streaming("a <tool").content == "a "
    assert parser.extract_streaming("box>").content == "<toolbox>"


def test_adjust_request_keeps_special_tokens_only_when_tools_may_be_called() -> None:
    parser = P(None)
    request = {"messages": [], "tools": [{"type": "function"}]}
    assert parser.adjust_request(request)["skip_special_tokens"] is False
    assert "skip_special_tokens" not in request  # not mutated
    assert parser.adjust_request({**request, "tool_choice": "none"}) == {
        **request,
        "tool_choice": "none",
    }
    assert parser.adjust_request({"messages": []}) == {"messages": []}


def test_one_instance_streams_while_extract_stays_independent() -> None:
    parser = P(None)
    parser.extract_streaming("Hi <tool_call>")
    assert parser.extract(call(WEATHER)).tool_calls[0].name == "get_weather"
    rest = parser.extract_streaming(WEATHER + "</tool_call>")
    assert rest.tool_calls[0].name == "get_weather"


# -- hermes -------------------------------------------------------------------------------------
HERMES_CASES = {
    "plain text": ("The weather is nice today.", [], "The weather is nice today."),
    "empty": ("", [], None),
    "text before": (
        "Let me check.\n" + call("\n" + WEATHER + "\n"),
        [("get_weather", WEATHER_ARGS)],
        "Let me check.\n",
    ),
    "two calls": (
        call(WEATHER) + "\n" + call('{"name": "get_time", "arguments": {"tz": "CET"}}') + "\n",
        [("get_weather", WEATHER_ARGS), ("get_time", '{"tz": "CET"}')],
        None,
    ),
    "text before, between and after": (
        "A" + call(WEATHER) + " B " + call('{"name": "x", "arguments": {}}') + " C",
        [("get_weather", WEATHER_ARGS), ("x", "{}")],
        "A B  C",
    ),
    "arguments given as a string": (
        call(r'{"name": "f", "arguments": "{\"a\": 1, \"b\": \"x y\"}"}'),
        [("f", '{"a": 1, "b": "x y"}')],
        None,
    ),
    "nested values": (
        call('{"name": "f", "arguments": {"a": {"b": [1, -2.5e-3, {"c": null}], "d": true},'
             ' "e": [[], {}], "f": false}}'),
        [("f", '{"a": {"b": [1, -2.5e-3, {"c": null}], "d": true}, "e": [[], {}], "f": false}')],
        None,
    ),
    "escaped quotes and markers inside strings": (
        call(r'{"name": "say", "arguments": {"text": "He said \"hi\" \\ }{ ][ </tool_call>"}}'),
        [("say", r'{"text": "He said \"hi\" \\ }{ ][ </tool_call>"}')],
        None,
    ),
    "unicode": (
        "Voilà 🌍 "
        + call('{"name": "tr", "arguments": {"t": "héllo 你好 🌍", "e": "\\u00e9"}}'),
        [("tr", '{"t": "héllo 你好 🌍", "e": "\\u00e9"}')],
        "Voilà 🌍 ",
    ),
    "keys in any order, extra keys ignored": (
        call('{"arguments": {"a": 1}, "type": "function", "name": "f"}'),
        [("f", '{"a": 1}')],
        None,
    ),
    "missing and null arguments": (
        call('{"name": "f"}') + call('{"name": "g", "arguments": null}'),
        [("f", "{}"), ("g", "{}")],
        None,
    ),
    "closing tag missing at the end": (call(WEATHER)[: -len("</tool_call>")] + "\n",
                                       [("get_weather", WEATHER_ARGS)], None),
    "closing tag cut at the end": (call(WEATHER)[:-4], [("get_weather", WEATHER_ARGS)], None),
    "call cut off before its name": (
        "Sure. <tool_call>\n{\"name\": \"get_wea",
        [],
        "Sure. <tool_call>\n{\"name\": \"get_wea",
    ),
    "second call cut off": (
        call(WEATHER) + '<tool_call>{"na',
        [("get_weather", WEATHER_ARGS)],
        '<tool_call>{"na',
    ),
    "marker cut at the end": ("So a < b and <tool_ca", [], "So a < b and <tool_ca"),
    "stray closing tag": ("x </tool_call> y", [], "x </tool_call> y"),
    "whitespace only outside": ("\n\n " + call(WEATHER) + "\n", [("get_weather", WEATHER_ARGS)],
                                None),
}

HERMES_MALFORMED = {
    "unquoted name": "Hi " + call('{"name": get_weather, "arguments": {}}'),
    "not an object": call("[1, 2]"),
    "no name": call('{"arguments": {"a": 1}}') + " bye",
    "name not a string": call('{"name": 3, "arguments": {}}'),
    "text instead of JSON": call("get_weather(city='Paris')"),
    "arguments a list": call('{"arguments": [1], "name": "f"}'),
    "string arguments not JSON": call('{"arguments": "city=Paris", "name": "f"}'),
    "arguments and parameters": call('{"parameters": {}, "arguments": {}, "name": "f"}'),
    "NaN": call('{"arguments": {"a": NaN}, "name": "f"}'),
}

HERMES_UNRETRACTABLE = {
    "call cut off in its arguments": 'Sure.<tool_call>{"name": "get_weather", "arguments": {"ci',
    "invalid JSON in the arguments": call('{"name": "f", "arguments": {"a": 1,}}'),
    "raw newline in a string": call('{"name": "f", "arguments": {"a": "x\ny"}}'),
    "junk after the object": call('{"name": "f", "arguments": {}} oops'),
    "arguments a list": call('{"name": "f", "arguments": [1]}'),
    "string arguments not JSON": call('{"name": "f", "arguments": "city=Paris"}'),
}


@pytest.mark.parametrize("case", HERMES_CASES, ids=list(HERMES_CASES))
def test_hermes(case: str) -> None:
    text, calls, content = HERMES_CASES[case]
    assert_extracts(P, text, calls, content)


@pytest.mark.parametrize("case", HERMES_MALFORMED, ids=list(HERMES_MALFORMED))
def test_hermes_malformed_is_content(case: str) -> None:
    assert_malformed(P, HERMES_MALFORMED[case])


@pytest.mark.parametrize("case", HERMES_UNRETRACTABLE, ids=list(HERMES_UNRETRACTABLE))
def test_hermes_failure_after_the_name_was_streamed(case: str) -> None:
    text = HERMES_UNRETRACTABLE[case]
    result = P(None).extract(text)
    assert not result.tools_called and result.content == text
    assert assert_unretractable(P, text, "get_weather" if "get_weather" in text else "f") > 0


def test_after_a_malformed_call_the_stream_is_content_only() -> None:
    text = call('{"name": 1}') + call(WEATHER)
    got = stream(P, [text[:5], text[5:]])
    assert got.calls == [] and got.content == text


def test_a_broken_call_after_a_streamed_one() -> None:
    """extract: the whole text is content. A stream has sent the first call already; it keeps
    it and sends the rest, from the broken call on, as content."""
    text = "Hi " + call(WEATHER) + " and " + call('{"name": ]}')
    assert P(None).extract(text).content == text
    for chunks in ([text], list(text)):
        got = stream(P, chunks)
        assert [(c.name, c.arguments) for c in got.calls] == [("get_weather", WEATHER_ARGS)]
        assert got.content == "Hi  and " + call('{"name": ]}')
