"""JsonScanner: an incremental, strict JSON scanner for one object or array in a growing text.

Tool-call extraction must decide, character by character, how far a call's JSON is known to be
valid, where its top-level members start and end, and when it is complete -- without waiting for
the end of the generation. ``json.loads`` cannot answer "is this a valid prefix?", so this scanner
walks the JSON grammar (RFC 8259, as strict as ``json.loads`` with NaN/Infinity rejected and raw
control characters forbidden in strings) and can be fed more text at any time.

Part of the plugin contract (pure Python, importing nothing of ironlm): tool-parser plugins use
it, and so does the server's own scanning of ``tool_choice: "required"`` output.

Positions are absolute indices into the caller's text, which only ever grows.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass

_WS = re.compile(r"[ \t\n\r]*")
_STRING_BODY = re.compile(r'[^"\\\x00-\x1f]*')
_HEX = frozenset("0123456789abcdefABCDEF")
_SIMPLE_ESCAPES = frozenset('"\\/bfnrt')
_LITERAL_TAILS = {"t": "rue", "f": "alse", "n": "ull"}

# scanner modes
_VALUE = 0  # a value must come next
_ARRAY_FIRST = 1  # just after "[": a value or "]"
_KEY_FIRST = 2  # just after "{": a key or "}"
_KEY = 3  # after "," in an object: a key
_COLON = 4  # after a key
_AFTER = 5  # after a value inside a container: "," or the closer
_STRING = 6
_ESCAPE = 7  # after a backslash in a string
_UNICODE = 8  # inside \uXXXX
_NUMBER = 9
_LITERAL = 10  # inside true / false / null

# number sub-states; the accepting ones may end the number
_N_MINUS, _N_ZERO, _N_INT, _N_DOT, _N_FRAC, _N_E, _N_ESIGN, _N_EXP = range(8)
_N_ACCEPTING = frozenset((_N_ZERO, _N_INT, _N_FRAC, _N_EXP))


def skip_ws(text: str, pos: int) -> int:
    """Index of the first non-JSON-whitespace character at or after ``pos``."""
    return _WS.match(text, pos).end()  # type: ignore[union-attr]


def _reject_constant(name: str) -> float:
    raise ValueError(f"{name} is not valid JSON")


def strict_loads(text: str) -> object:
    """``json.loads`` without the NaN / Infinity extension."""
    return json.loads(text, parse_constant=_reject_constant)


@dataclass(frozen=True)
class Member:
    """A completed top-level member ``key: value``; ``text[start:end]`` is the raw value."""

    key: str
    start: int
    end: int


class JsonScanner:
    """Scans one JSON object or array starting at ``start``.

    After each :meth:`feed`, ``pos`` is how far the text is known to be a valid prefix; ``done``
    says the value is complete (it ends at ``pos``); ``error`` says the text is not JSON. For a
    top-level object, ``members`` lists its completed members, ``key`` is the key of the member in
    progress and ``value_start`` where that member's value began (None between members).
    """

    def __init__(self, start: int) -> None:
        self.pos = start
        self.done = False
        self.error = False
        self.members: list[Member] = []
        self.key: str | None = None
        self.value_start: int | None = None
        self._stack: list[str] = []  # "{" or "[" per open container
        self._mode = _VALUE
        self._is_key = False  # the string being scanned is an object key
        self._str_start = 0
        self._hex_left = 0
        self._num = _N_MINUS
        self._literal = ""

    def feed(self, text: str) -> None:
        """Scan as far as ``text`` allows (it is the whole text, grown since the last call)."""
        i, n = self.pos, len(text)
        while i < n and not (self.done or self.error):
            mode, c = self._mode, text[i]
            if mode == _STRING:
                i = _STRING_BODY.match(text, i).end()  # type: ignore[union-attr]
                if i < n:
                    if text[i] == '"':
                        i += 1
                        self._string_end(text, i)
                    elif text[i] == "\\":
                        self._mode, i = _ESCAPE, i + 1
                    else:  # a raw control character
                        self.error = True
            elif mode == _ESCAPE:
                if c == "u":
                    self._mode, self._hex_left = _UNICODE, 4
                elif c in _SIMPLE_ESCAPES:
                    self._mode = _STRING
                else:
                    self.error = True
                i += 1
            elif mode == _UNICODE:
                if c not in _HEX:
                    self.error = True
                    continue
                self._hex_left -= 1
                if not self._hex_left:
                    self._mode = _STRING
                i += 1
            elif mode == _NUMBER:
                if self._number_char(c):
                    i += 1
                elif self._num in _N_ACCEPTING:
                    self._value_end(i)  # c is re-read in _AFTER mode
                else:
                    self.error = True
            elif mode == _LITERAL:
                if c != self._literal[0]:
                    self.error = True
                    continue
                self._literal = self._literal[1:]
                i += 1
                if not self._literal:
                    self._value_end(i)
            elif c in " \t\n\r":
                i = skip_ws(text, i)
            else:
                self._structural(c, i)
                i += 1
        self.pos = i

    # -- structure ---------------------------------------------------------------------------
    def _structural(self, c: str, i: int) -> None:
        mode = self._mode
        if mode == _VALUE or mode == _ARRAY_FIRST:
            if c == "]" and mode == _ARRAY_FIRST:
                self._close(i + 1)
            else:
                self._value_begin(c, i)
        elif mode == _KEY_FIRST or mode == _KEY:
            if c == '"':
                self._mode, self._is_key, self._str_start = _STRING, True, i
            elif c == "}" and mode == _KEY_FIRST:
                self._close(i + 1)
            else:
                self.error = True
        elif mode == _COLON:
            if c == ":":
                self._mode = _VALUE
            else:
                self.error = True
        else:  # _AFTER
            top = self._stack[-1]
            if c == ",":
                self._mode = _KEY if top == "{" else _VALUE
            elif (c == "}" and top == "{") or (c == "]" and top == "["):
                self._close(i + 1)
            else:
                self.error = True

    def _value_begin(self, c: str, i: int) -> None:
        if not self._stack and c not in "{[":
            self.error = True  # the top level must be a container
            return
        if self._stack == ["{"]:
            self.value_start = i
        if c == "{" or c == "[":
            self._stack.append(c)
            self._mode = _KEY_FIRST if c == "{" else _ARRAY_FIRST
        elif c == '"':
            self._mode, self._is_key, self._str_start = _STRING, False, i
        elif c == "-" or "0" <= c <= "9":
            self._mode = _NUMBER
            self._num = _N_MINUS if c == "-" else _N_ZERO if c == "0" else _N_INT
        elif c in _LITERAL_TAILS:
            self._mode, self._literal = _LITERAL, _LITERAL_TAILS[c]
        else:
            self.error = True

    def _string_end(self, text: str, end: int) -> None:
        if not self._is_key:
            self._value_end(end)
            return
        self._mode = _COLON
        if self._stack == ["{"]:
            self.key = json.loads(text[self._str_start : end])

    def _close(self, end: int) -> None:
        self._stack.pop()
        self._value_end(end)

    def _value_end(self, end: int) -> None:
        if not self._stack:
            self.done = True
            return
        self._mode = _AFTER
        if self._stack == ["{"] and self.value_start is not None:
            self.members.append(Member(self.key or "", self.value_start, end))
            self.key, self.value_start = None, None

    def _number_char(self, c: str) -> bool:
        """Advance the number state by ``c``; False when ``c`` cannot continue the number."""
        digit = "0" <= c <= "9"
        state = self._num
        if state == _N_MINUS and digit:
            self._num = _N_ZERO if c == "0" else _N_INT
        elif state in (_N_INT, _N_FRAC, _N_EXP) and digit:
            pass
        elif state in (_N_ZERO, _N_INT) and c == ".":
            self._num = _N_DOT
        elif state in (_N_ZERO, _N_INT, _N_FRAC) and c in "eE":
            self._num = _N_E
        elif state == _N_DOT and digit:
            self._num = _N_FRAC
        elif state == _N_E and c in "+-":
            self._num = _N_ESIGN
        elif state in (_N_E, _N_ESIGN) and digit:
            self._num = _N_EXP
        else:
            return False
        return True
