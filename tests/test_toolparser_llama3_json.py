"""The ``llama3_json`` parser: JSON calls at the start of the output or after <|python_tag|>.

Each fixed model output: one-shot result as expected, and several hundred seeded random
chunkings (plus whole / one character at a time) streaming to the same result.
"""

from __future__ import annotations

import pytest

from ironlm_toolparsers.llama3_json import Llama3JsonToolParser
from ironlm_toolparsers.testing import assert_extracts, assert_malformed, assert_unretractable

L = Llama3JsonToolParser
WEATHER = '{"name": "get_weather", "parameters": {"city": "Paris"}}'
WEATHER_ARGS = '{"city": "Paris"}'

LLAMA_CASES = {
    "plain text": ("It is sunny {mostly}.", [], "It is sunny {mostly}."),
    "one call with parameters": (WEATHER, [("get_weather", WEATHER_ARGS)], None),
    "arguments key and type key": (
        '\n {"type": "function", "name": "f", "arguments": {"a": [1, 2]}}\n',
        [("f", '{"a": [1, 2]}')],
        None,
    ),
    "python_tag first": ("<|python_tag|>" + WEATHER, [("get_weather", WEATHER_ARGS)], None),
    "text before the python_tag": (
        "Let me look that up. <|python_tag|> " + WEATHER,
        [("get_weather", WEATHER_ARGS)],
        "Let me look that up. ",
    ),
    "two calls separated by ;": (
        WEATHER + '; {"name": "get_time", "parameters": {"tz": "UTC"}}',
        [("get_weather", WEATHER_ARGS), ("get_time", '{"tz": "UTC"}')],
        None,
    ),
    "three calls, odd spacing": (
        WEATHER + ' ;\n' + WEATHER + ';' + '{"name": "x", "parameters": {}}',
        [("get_weather", WEATHER_ARGS), ("get_weather", WEATHER_ARGS), ("x", "{}")],
        None,
    ),
    "text after the call": (WEATHER + "\nDone.", [("get_weather", WEATHER_ARGS)], "\nDone."),
    "trailing semicolon": (WEATHER + ";", [("get_weather", WEATHER_ARGS)], None),
    "arguments given as a string": (
        r'{"name": "f", "parameters": "{\"a\": {\"b\": null}}"}',
        [("f", '{"a": {"b": null}}')],
        None,
    ),
    "nested values, escapes, unicode": (
        r'{"name": "f", "parameters": {"q": "say \"hi\" ; {x}", "u": "ü—😀", '
        r'"n": [[{"d": 1e5}]]}}',
        [("f", r'{"q": "say \"hi\" ; {x}", "u": "ü—😀", "n": [[{"d": 1e5}]]}')],
        None,
    ),
    "brace later in text is content": (
        'Here: {"name": "f", "parameters": {}}',
        [],
        'Here: {"name": "f", "parameters": {}}',
    ),
    "cut off before the name": ('{"name": "get_w', [], '{"name": "get_w'),
    "second call cut off": (
        WEATHER + '; {"na',
        [("get_weather", WEATHER_ARGS)],
        '{"na',
    ),
    "python_tag cut at the end": ("Hi <|python_t", [], "Hi <|python_t"),
}

LLAMA_MALFORMED = {
    "a JSON answer, not a call": '{"answer": 42, "unit": "km"}',
    "built-in tool syntax after the tag": '<|python_tag|>brave_search.call(query="x")',
    "not JSON at the start": "{name: f}",
    "parameters and arguments": '{"parameters": {}, "arguments": {}, "name": "f"}',
}

LLAMA_UNRETRACTABLE = {
    "cut off in the arguments": (
        '{"name": "get_weather", "parameters": {"city": "Par',
        "get_weather",
    ),
    "invalid JSON in the arguments": ('{"name": "f", "parameters": {"a": 01}}', "f"),
    "text after a semicolon": (WEATHER + "; and then", "get_weather"),
}


@pytest.mark.parametrize("case", LLAMA_CASES, ids=list(LLAMA_CASES))
def test_llama3_json(case: str) -> None:
    text, calls, content = LLAMA_CASES[case]
    assert_extracts(L, text, calls, content)


@pytest.mark.parametrize("case", LLAMA_MALFORMED, ids=list(LLAMA_MALFORMED))
def test_llama3_json_malformed_is_content(case: str) -> None:
    assert_malformed(L, LLAMA_MALFORMED[case])


@pytest.mark.parametrize("case", LLAMA_UNRETRACTABLE, ids=list(LLAMA_UNRETRACTABLE))
def test_llama3_json_failure_after_the_name_was_streamed(case: str) -> None:
    text, name = LLAMA_UNRETRACTABLE[case]
    result = L(None).extract(text)
    assert not result.tools_called and result.content == text
    assert assert_unretractable(L, text, name) > 0
