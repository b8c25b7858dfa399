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


_ASCII_CLASS = {"d": "0-9", "w": "0-9A-Za-z_", "s": " \\t\\n\\r\\f\\v"}


def ascii_shorthands(pattern: str) -> str:
    """``\\d``, ``\\w``, ``\\s`` rewritten as their ASCII classes, inside and outside brackets.

    Rust regexes (outlines-core) read them as Unicode classes that differ from Python's (``\\w``
    takes combining marks, ``\\d`` digits of newer Unicode), so generated text could fail
    ``re.fullmatch``; the ASCII classes are a subset of both. Negated forms (``\\D``, and any
    shorthand inside ``[^...]``) stay as written: their ASCII versions would be supersets."""
    out: list[str] = []
    i, in_class, negated = 0, False, False
    while i < len(pattern):
        c = pattern[i]
        if c == "\\" and i + 1 < len(pattern):
            nxt = pattern[i + 1]
            if nxt in _ASCII_CLASS and not negated:
                out.append(_ASCII_CLASS[nxt] if in_class else f"[{_ASCII_CLASS[nxt]}]")
            else:
                out.append(pattern[i : i + 2])
            i += 2
            continue
        if in_class and c == "]":
            in_class = negated = False
        elif not in_class and c == "[":
            in_class = True
            out.append(c)
            i += 1
            for lead in ("^", "]"):  # a negation, then a literal ] first in the class
                if pattern[i : i + 1] == lead:
                    negated = negated or lead == "^"
                    out.append(lead)
                    i += 1
            continue
        out.append(c)
        i += 1
    return "".join(out)
