"""The ``mistral`` and ``granite`` parsers: a marker, then JSON calls.

Each fixed model output: one-shot result as expected, and several hundred seeded random
chunkings (plus whole / one character at a time) streaming to the same result.
"""

from __future__ import annotations

import re

import pytest

from ironlm_toolparsers.granite import GraniteToolParser
from ironlm_toolparsers.mistral import MistralToolParser
from ironlm_toolparsers.testing import assert_extracts, assert_malformed, assert_unretractable

M, G = MistralToolParser, GraniteToolParser
ADD = '{"name": "add", "arguments": {"a": 1, "b": 2}}'
MUL = '{"name": "mul", "arguments": {"x": [1.5, -2], "y": {"z": null}}}'
ADD_ARGS, MUL_ARGS = '{"a": 1, "b": 2}', '{"x": [1.5, -2], "y": {"z": null}}'

MISTRAL_CASES = {
    "plain text": ("No tools needed [1] here.", [], "No tools needed [1] here."),
    "text before": ("Sure.[TOOL_CALLS] [" + ADD + "]", [("add", ADD_ARGS)], "Sure."),
    "two calls in a list": (
        "[TOOL_CALLS][" + ADD + ",\n " + MUL + "]",
        [("add", ADD_ARGS), ("mul", MUL_ARGS)],
        None,
    ),
    "text after the list": ("[TOOL_CALLS][" + ADD + "] Done.", [("add", ADD_ARGS)], " Done."),
    "closing bracket missing at the end": ("[TOOL_CALLS][" + ADD + ", ", [("add", ADD_ARGS)], None),
    "v11 form with [ARGS]": (
        'Let me.[TOOL_CALLS]add[ARGS]{"a": 1, "b": 2}[TOOL_CALLS]mul[ARGS]{"x": [1.5, -2], '
        '"y": {"z": null}}',
        [("add", ADD_ARGS), ("mul", MUL_ARGS)],
        "Let me.",
    ),
    "v11 form without [ARGS]": (
        '[TOOL_CALLS]get-time_v2{"tz": "CET"}[TOOL_CALLS] add{}',
        [("get-time_v2", '{"tz": "CET"}'), ("add", "{}")],
        None,
    ),
    "arguments given as a string": (
        r'[TOOL_CALLS][{"name": "f", "arguments": "{\"q\": \"a \\\"b\\\"\"}"}]',
        [("f", r'{"q": "a \"b\""}')],
        None,
    ),
    "escaped quotes and markers in strings": (
        r'[TOOL_CALLS]say[ARGS]{"t": "\"x\" ]}[TOOL_CALLS] \\"}',
        [("say", r'{"t": "\"x\" ]}[TOOL_CALLS] \\"}')],
        None,
    ),
    "unicode": (
        'Très bien 👍[TOOL_CALLS][{"name": "tr", "arguments": {"t": "日本語 ✓"}}]',
        [("tr", '{"t": "日本語 ✓"}')],
        "Très bien 👍",
    ),
    "marker alone at the end": ("Hmm[TOOL_CALLS]", [], "Hmm[TOOL_CALLS]"),
    "marker cut at the end": ("Hmm [TOOL_CA", [], "Hmm [TOOL_CA"),
    "cut off before the name": ('[TOOL_CALLS][{"name": "ad', [], '[TOOL_CALLS][{"name": "ad'),
    "v11 name cut off": ("ok [TOOL_CALLS]ad", [], "ok [TOOL_CALLS]ad"),
    "v11 [ARGS] cut off": ("[TOOL_CALLS]add[AR", [], "[TOOL_CALLS]add[AR"),
    "second call cut off": (
        "[TOOL_CALLS][" + ADD + ', {"name": "m',
        [("add", ADD_ARGS)],
        '{"name": "m',
    ),
}

MISTRAL_MALFORMED = {
    "empty list": "[TOOL_CALLS][]",
    "object without a list": "[TOOL_CALLS]" + ADD,
    "unquoted name": '[TOOL_CALLS][{"name": add, "arguments": {}}]',
    "no name": '[TOOL_CALLS][{"arguments": {"a": 1}}]',
    "v11 arguments not an object": "[TOOL_CALLS]add[ARGS][1, 2]",
    "v11 parenthesis call": "Sure [TOOL_CALLS]add(1, 2)",
    "list of non-objects": '[TOOL_CALLS]["add"]',
}

MISTRAL_UNRETRACTABLE = {
    "cut off in the arguments": ('[TOOL_CALLS][{"name": "add", "arguments": {"a": 1', "add"),
    "v11 cut off in the arguments": ('[TOOL_CALLS]add[ARGS]{"a": [1, 2', "add"),
    "invalid JSON in the arguments": ('[TOOL_CALLS][{"name": "add", "arguments": {a: 1}}]', "add"),
    "missing comma between calls": ("[TOOL_CALLS][" + ADD + " " + MUL + "]", "add"),
}


@pytest.mark.parametrize("case", MISTRAL_CASES, ids=list(MISTRAL_CASES))
def test_mistral(case: str) -> None:
    text, calls, content = MISTRAL_CASES[case]
    assert_extracts(M, text, calls, content)


@pytest.mark.parametrize("case", MISTRAL_MALFORMED, ids=list(MISTRAL_MALFORMED))
def test_mistral_malformed_is_content(case: str) -> None:
    assert_malformed(M, MISTRAL_MALFORMED[case])


@pytest.mark.parametrize("case", MISTRAL_UNRETRACTABLE, ids=list(MISTRAL_UNRETRACTABLE))
def test_mistral_failure_after_the_name_was_streamed(case: str) -> None:
    text, name = MISTRAL_UNRETRACTABLE[case]
    result = M(None).extract(text)
    assert not result.tools_called and result.content == text
    assert assert_unretractable(M, text, name) > 0


def test_mistral_ids_are_nine_alphanumerics() -> None:
    ids = [c.id for c in M(None).extract("[TOOL_CALLS][" + ADD + ", " + MUL + "]").tool_calls]
    assert len(set(ids)) == 2 and all(re.fullmatch(r"[A-Za-z0-9]{9}", i) for i in ids)


def test_mistral_keeps_special_tokens_for_tool_requests() -> None:
    adjusted = M(None).adjust_request({"tools": [{"type": "function"}], "tool_choice": "auto"})
    assert adjusted["skip_special_tokens"] is False


# -- granite ------------------------------------------------------------------------------------
GRANITE_CASES = {
    "plain text": ("Plain [1, 2] answer.", [], "Plain [1, 2] answer."),
    "granite 3.0 token": ("<|tool_call|>[" + ADD + "]", [("add", ADD_ARGS)], None),
    "granite 3.1 string, text before": (
        "Checking.\n<tool_call>[" + ADD + ", " + MUL + "]",
        [("add", ADD_ARGS), ("mul", MUL_ARGS)],
        "Checking.\n",
    ),
    "arguments given as a string": (
        r'<|tool_call|>[{"name": "f", "arguments": "{\"k\": [1, {\"n\": \"é\"}]}"}]',
        [("f", r'{"k": [1, {"n": "é"}]}')],
        None,
    ),
    "bare list is content": ("[" + ADD + "]", [], "[" + ADD + "]"),
    "cut off before the name": ('<tool_call>[{"na', [], '<tool_call>[{"na'),
}

GRANITE_MALFORMED = {
    "hermes-style object": "<tool_call>" + ADD + "</tool_call>",
    "not JSON": "<|tool_call|>[add(a=1)]",
}


@pytest.mark.parametrize("case", GRANITE_CASES, ids=list(GRANITE_CASES))
def test_granite(case: str) -> None:
    text, calls, content = GRANITE_CASES[case]
    assert_extracts(G, text, calls, content)


@pytest.mark.parametrize("case", GRANITE_MALFORMED, ids=list(GRANITE_MALFORMED))
def test_granite_malformed_is_content(case: str) -> None:
    assert_malformed(G, GRANITE_MALFORMED[case])


def test_granite_cut_off_in_the_arguments() -> None:
    text = '<|tool_call|>[{"name": "add", "arguments": {"a": "x'
    assert G(None).extract(text).content == text
    assert assert_unretractable(G, text, "add") > 0
