"""The ``pythonic`` parser: ``[f(a=1), g(b='x')]`` read with ast, literal values only.

Each fixed model output: one-shot result as expected, and several hundred seeded random
chunkings (plus whole / one character at a time) streaming to the same result.
"""

from __future__ import annotations

import pytest

from ironlm_toolparsers.pythonic import PythonicToolParser, call_arguments
from ironlm_toolparsers.testing import (
    assert_extracts,
    assert_malformed,
    assert_unretractable,
    stream,
)

Py = PythonicToolParser

PYTHONIC_CASES = {
    "plain text with brackets": (
        "See [1, 2], [note] and [link](http://x.y) or [a.b(c=1)].",
        [],
        "See [1, 2], [note] and [link](http://x.y) or [a.b(c=1)].",
    ),
    "one call": ("[get_weather(city='Paris')]", [("get_weather", '{"city": "Paris"}')], None),
    "text before and after": (
        "Let me check. [get_weather(city='Paris', days=3)] One moment.",
        [("get_weather", '{"city": "Paris", "days": 3}')],
        "Let me check.  One moment.",
    ),
    "two calls, no arguments, trailing comma, newlines": (
        "[\n  get_time(),\n  get_weather(city=\"Oslo\"),\n]",
        [("get_time", "{}"), ("get_weather", '{"city": "Oslo"}')],
        None,
    ),
    "nested values": (
        "[f(a={'b': [1, 2.5, -3], 'c': (True, None)}, d=[[]], e={}, g=False)]",
        [("f", '{"a": {"b": [1, 2.5, -3], "c": [true, null]}, "d": [[]], "e": {}, "g": false}')],
        None,
    ),
    "escaped quotes and brackets inside strings": (
        r"""[say(text='It\'s "fine" )]', other="a \"b\" (c", raw=r'\d+\)')]""",
        [("say", r'{"text": "It' + "'" + r's \"fine\" )]", "other": "a \"b\" (c", '
                 r'"raw": "\\d+\\)"}')],
        None,
    ),
    "triple-quoted string and comment": (
        '[f(doc="""line one\nline "two" """,  # a comment )]\n  n=1)]',
        [("f", '{"doc": "line one\\nline \\"two\\" ", "n": 1}')],
        None,
    ),
    "unicode": (
        "Voilà: [traduire(texte='café 你好 🌍', e='\\u00e9')]",
        [("traduire", '{"texte": "café 你好 🌍", "e": "é"}')],
        "Voilà: ",
    ),
    "arguments given as a string stay a string": (
        "[f(payload='{\"a\": 1}')]",
        [("f", '{"payload": "{\\"a\\": 1}"}')],
        None,
    ),
    "two lists": ("[f(a=1)] and [g(b=2)]", [("f", '{"a": 1}'), ("g", '{"b": 2}')], " and "),
    "cut off in the first call": ("[get_weather(city='Par", [], "[get_weather(city='Par"),
    "second call cut off": ("[f(a=1), g(b='x", [("f", '{"a": 1}')], "g(b='x"),
    "cut off between calls": ("[f(a=1), ", [("f", '{"a": 1}')], None),
    "cut right after the opening": ("Ok [get_", [], "Ok [get_"),
}

PYTHONIC_MALFORMED = {
    "positional argument": "[get_weather('Paris')]",
    "non-literal value": "[f(a=g(1))]",
    "name as value": "[f(a=x)]",
    "star-star kwargs": "[f(**kw)]",
    "repeated keyword": "[f(a=1, a=2)]",
    "set value": "[f(a={1, 2})]",
    "bytes value": "[f(a=b'x')]",
    "infinite float": "[f(a=1e999)]",
    "mismatched brackets": "[f(a=[1)]",
}


@pytest.mark.parametrize("case", PYTHONIC_CASES, ids=list(PYTHONIC_CASES))
def test_pythonic(case: str) -> None:
    text, calls, content = PYTHONIC_CASES[case]
    assert_extracts(Py, text, calls, content)


@pytest.mark.parametrize("case", PYTHONIC_MALFORMED, ids=list(PYTHONIC_MALFORMED))
def test_pythonic_malformed_is_content(case: str) -> None:
    assert_malformed(Py, PYTHONIC_MALFORMED[case])


@pytest.mark.parametrize("text", ["[f(a=1), g(x)]", "Hi [f(a=1) or so]"])
def test_pythonic_list_broken_after_a_streamed_call(text: str) -> None:
    assert Py(None).extract(text).content == text
    assert assert_unretractable(Py, text, "f") > 0


def test_pythonic_sends_a_call_once_it_is_complete() -> None:
    parser = Py(None)
    assert parser.extract_streaming("[get_weather(city='Pa").is_empty()
    delta = parser.extract_streaming("ris'), g(")
    assert [(p.name, p.arguments) for p in delta.tool_calls] == [
        ("get_weather", ""),
        (None, '{"city": "Paris"}'),
    ]


def test_call_arguments_rejects_what_json_cannot_hold() -> None:
    assert call_arguments("f(a=1, b='x')") == '{"a": 1, "b": "x"}'
    assert call_arguments("f(a={1: 2})") is None
    assert call_arguments("f(a=1j)") is None
    assert call_arguments("f.g(a=1)") is None
    assert call_arguments("f(a=1)(b=2)") is None


def test_never_evaluates() -> None:
    got = stream(Py, ["[f(a=__import__('os').system('echo hi'))]"])
    assert got.calls == [] and got.content.startswith("[f(")
