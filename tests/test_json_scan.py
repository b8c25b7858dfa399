"""ironlm.json_scan (contract helper): valid-prefix tracking, strictness and top-level members,
fed in one piece and character by character."""

from __future__ import annotations

import json

import pytest

from ironlm.json_scan import JsonScanner, Member, skip_ws, strict_loads


def _scan(text: str, start: int = 0, by_char: bool = False) -> JsonScanner:
    scanner = JsonScanner(start)
    if by_char:
        for end in range(start + 1, len(text) + 1):
            scanner.feed(text[:end])
    else:
        scanner.feed(text)
    return scanner


VALID = [
    '{"a": 1, "b": [true, false, null], "c": {"d": "e\\u00e9\\n"}}',
    '[1, -0.5, 2e10, -3E-2, "x", {}, []]',
    '{ }',
    '{"s": "braces } ] and \\" quotes"}',
]


@pytest.mark.parametrize("by_char", [False, True])
@pytest.mark.parametrize("text", VALID)
def test_valid_values_complete_where_json_ends(text: str, by_char: bool) -> None:
    scanner = _scan("prefix " + text + " tail", start=7, by_char=by_char)
    assert scanner.done and not scanner.error
    assert scanner.pos == 7 + len(text)
    assert json.loads(text) is not None


@pytest.mark.parametrize("by_char", [False, True])
def test_members_give_raw_value_spans(by_char: bool) -> None:
    text = '{"name": "f", "arguments": {"x": [1, 2]}, "n": 12}'
    scanner = _scan(text, by_char=by_char)
    assert scanner.members == [
        Member("name", 9, 12), Member("arguments", 27, 40), Member("n", 47, 49),
    ]
    assert text[27:40] == '{"x": [1, 2]}'


def test_member_in_progress_and_valid_prefix() -> None:
    text = '{"name": "f", "arguments": {"x": "hal'
    scanner = _scan(text)
    assert not scanner.done and not scanner.error
    assert scanner.pos == len(text)  # the whole text is a valid prefix
    assert scanner.key == "arguments" and text[scanner.value_start:] == '{"x": "hal'
    assert [m.key for m in scanner.members] == ["name"]


@pytest.mark.parametrize("text", [
    '{"a": NaN}', '{"a": Infinity}', '{"a": "raw\ncontrol"}', '{"a": 01}', '{"a": 1.}',
    '{"a" 1}', "{'a': 1}", '{"a": 1,}', '[1 2]', '{"a": tru}x',
    '{"a": "\\x"}', '{"a": "\\u12G4"}',
])
def test_invalid_json_is_an_error(text: str) -> None:
    assert _scan(text).error
    with pytest.raises(ValueError):
        strict_loads(text)


def test_top_level_must_be_a_container() -> None:
    assert _scan('"a string"').error and _scan("12").error


def test_skip_ws_and_strict_loads() -> None:
    assert skip_ws(" \t\r\n x", 0) == 5
    assert skip_ws("x", 0) == 0
    assert strict_loads('{"a": [1.5]}') == {"a": [1.5]}
