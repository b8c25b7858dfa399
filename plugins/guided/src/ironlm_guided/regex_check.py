"""Regex checks shared by the backends: syntax errors with positions, and anchor handling for
JSON-schema ``pattern`` (which is a search, not a full match)."""

from __future__ import annotations

import re

_REGEX_META = frozenset(r"\.+*?()|[]{}^$#&-~")


def escape_literal(text: str) -> str:
    """Escape ``text`` for a literal match in Rust (outlines-core), Python and interegular
    regexes: only metacharacters get a backslash (Rust rejects escapes of plain letters)."""
    return "".join("\\" + c if c in _REGEX_META else c for c in text)


def check_python_regex(pattern: str, what: str) -> None:
    """ValueError with the position and reason when ``pattern`` is not a valid regex."""
    try:
        re.compile(pattern)
    except re.error as e:
        where = f" at position {e.pos}" if e.pos is not None else ""
        raise ValueError(f"invalid {what} {pattern!r}: {e.msg}{where}") from None


def _unescaped_specials(pattern: str) -> list[tuple[int, str]]:
    """Positions of ``^`` / ``$`` that act as anchors (not escaped, not inside a class)."""
    found: list[tuple[int, str]] = []
    i, in_class = 0, False
    while i < len(pattern):
        c = pattern[i]
        if c == "\\":
            i += 2
            continue
        if in_class:
            if c == "]":
                in_class = False
        elif c == "[":
            in_class = True
            if pattern[i + 1 : i + 2] == "^":
                i += 1
            if pattern[i + 1 : i + 2] == "]":  # a literal ] first in the class
                i += 1
        elif c in "^$":
            found.append((i, c))
        i += 1
    return found


def full_match_body(pattern: str, what: str) -> str:
    """The part of a JSON-schema ``pattern`` to full-match so that every match also satisfies
    the original (search) semantics: outer ``^`` / ``$`` are dropped, anything else is kept.
    Anchors inside the pattern (``^a$|^b$``) are a ValueError: they do not survive wrapping."""
    check_python_regex(pattern, what)
    anchors = _unescaped_specials(pattern)
    body = pattern
    if anchors and anchors[-1] == (len(pattern) - 1, "$"):
        body = body[:-1]
        anchors.pop()
    if anchors and anchors[0] == (0, "^"):
        body = body[1:]
        anchors.pop(0)
    if anchors:
        raise ValueError(
            f"{what} {pattern!r} has anchors inside it (position {anchors[0][0]}); only a "
            "leading ^ and a trailing $ are supported"
        )
    return body
