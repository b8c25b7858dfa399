"""Incremental scanner for the guided output of ``tool_choice: "required"``.

The guided JSON schema makes the model write ``[{"name": "f", "parameters": {...}}, ...]``.
The scanner walks the text as it streams in and records, per array element, the function name
and the raw text span of its ``parameters`` value; the same spans serve the one-shot response,
so streamed argument fragments always join to exactly the non-streamed ``arguments``.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

_WS = " \t\r\n"


@dataclass
class ScannedCall:
    name: str | None = None
    args_start: int | None = None  # index in the text of the parameters value's first char
    args_end: int | None = None  # one past its last char, once the value is complete
    args_composite: bool = False  # an object/array value (its prefix may stream early)


class CallArrayScanner:
    def __init__(self) -> None:
        self.text = ""
        self.calls: list[ScannedCall] = []
        self._pos = 0
        self._depth = 0  # 1: inside the array; 2: inside an element object; 3+: in a value
        self._in_string = False
        self._escape = False
        self._str_start = 0
        self._expect_key = False  # at depth 2, the next string is a key
        self._key: str | None = None  # key whose value comes next (after ':')
        self._in_value = False  # between ':' and the value's end at depth 2
        self._value_start: int | None = None
        self._value_composite = False

    def feed(self, delta: str) -> None:
        self.text += delta
        text = self.text
        for i in range(self._pos, len(text)):
            self._step(i, text[i])
        self._pos = len(text)

    def available_args(self, call: ScannedCall) -> str:
        """The arguments text known so far: the whole value once complete, the prefix of an
        object value while it streams, nothing of a scalar value until it ends."""
        if call.args_start is None:
            return ""
        if call.args_end is not None:
            return self.text[call.args_start:call.args_end]
        if call.args_composite:
            return self.text[call.args_start:]
        return ""

    # -- the state machine -----------------------------------------------------------------
    def _step(self, i: int, c: str) -> None:
        if self._in_string:
            if self._escape:
                self._escape = False
            elif c == "\\":
                self._escape = True
            elif c == '"':
                self._in_string = False
                self._string_done(i)
            return
        if c == '"':
            self._in_string = True
            self._str_start = i
            self._value_begins(i, composite=False)
        elif c in "{[":
            if self._depth == 1 and c == "{":
                self.calls.append(ScannedCall())
                self._expect_key = True
            else:
                self._value_begins(i, composite=True)
            self._depth += 1
        elif c in "}]":
            self._depth -= 1
            if self._depth == 2 and self._in_value and self._value_composite:
                self._value_ends(i + 1)
            elif self._depth == 1:
                self._scalar_ends(i)
        elif self._depth == 2 and c == ":":
            self._in_value = True
            self._value_start = None
        elif self._depth == 2 and c == ",":
            self._scalar_ends(i)
            self._expect_key = True
        elif c not in _WS:
            self._value_begins(i, composite=False)

    def _value_begins(self, i: int, composite: bool) -> None:
        if self._depth == 2 and self._in_value and self._value_start is None:
            self._value_start = i
            self._value_composite = composite
            if self._key == "parameters" and self.calls:
                self.calls[-1].args_start = i
                self.calls[-1].args_composite = composite

    def _string_done(self, i: int) -> None:
        if self._depth != 2:
            return
        raw = self.text[self._str_start:i + 1]
        if self._expect_key:
            self._key = _loads(raw)
            self._expect_key = False
            return
        if self._in_value and self._key == "name" and self.calls:
            value = _loads(raw)
            self.calls[-1].name = value if isinstance(value, str) else None

    def _scalar_ends(self, i: int) -> None:
        """A ',' or '}' at element level ends a scalar value (trailing blanks excluded)."""
        if self._in_value and self._value_start is not None and not self._value_composite:
            end = i
            while end > self._value_start and self.text[end - 1] in _WS:
                end -= 1
            self._value_ends(end)
        self._in_value = False
        self._value_start = None

    def _value_ends(self, end: int) -> None:
        if self._key == "parameters" and self.calls:
            self.calls[-1].args_end = end
        self._in_value = False
        self._value_start = None


def _loads(raw: str) -> str | None:
    try:
        value = json.loads(raw)
    except ValueError:
        return None
    return value if isinstance(value, str) else None
