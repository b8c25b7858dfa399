"""pythonic: calls written as a Python list of function calls (Llama 3.2, Llama 4, ToolACE).

::

    [get_weather(city='Paris', days=3), search(query="a \\"b\\"", filters={'lang': ['en']})]

A list counts as calls when it opens with ``[`` then a name then ``(``; each element is
``name(keyword=literal, ...)``: keyword arguments only, values Python literals (strings, numbers,
True/False/None, lists, tuples, dicts with string keys, nested), read with ``ast``, never
evaluated. The arguments string is the JSON of those keyword arguments. Text before and after the
list is content; a list that opens like calls but is not valid is a malformed call.

Streaming announces a call (id and name) once the call is complete and valid, together with its
arguments: a bracketed aside in prose that merely looks like a call is then never sent as one.
"""

from __future__ import annotations

import ast
import json
import math
import re
from typing import Any

from ironlm_toolparsers.base import StreamingToolParser
from ironlm_toolparsers.python_scan import CallEndScanner

_LIST_START = re.compile(r"\[\s*([A-Za-z_]\w*)\s*\(")
_LIST_START_PREFIX = re.compile(r"\[\s*(?:[A-Za-z_]\w*\s*)?")  # may still become _LIST_START
_CALL_START = re.compile(r"([A-Za-z_]\w*)\s*\(")
_CALL_START_PREFIX = re.compile(r"(?:[A-Za-z_]\w*\s*)?")

_CONTENT, _CALL, _AFTER, _NEXT = range(4)


def _to_json_value(value: Any) -> Any:
    """A literal as a JSON value; ValueError for what JSON cannot hold."""
    if value is None or isinstance(value, (bool, int, str)):
        return value
    if isinstance(value, float):
        if not math.isfinite(value):
            raise ValueError("non-finite number")
        return value
    if isinstance(value, (list, tuple)):
        return [_to_json_value(v) for v in value]
    if isinstance(value, dict) and all(isinstance(k, str) for k in value):
        return {k: _to_json_value(v) for k, v in value.items()}
    raise ValueError(f"{type(value).__name__} is not a JSON value")


def call_arguments(source: str) -> str | None:
    """The JSON arguments of the call expression ``source``, or None when it is not a call with
    keyword literal arguments only."""
    try:
        node = ast.parse(source.strip(), mode="eval").body
        if not isinstance(node, ast.Call) or not isinstance(node.func, ast.Name) or node.args:
            return None
        arguments: dict[str, Any] = {}
        for keyword in node.keywords:
            if keyword.arg is None or keyword.arg in arguments:  # **kwargs, or repeated
                return None
            arguments[keyword.arg] = _to_json_value(ast.literal_eval(keyword.value))
        return json.dumps(arguments, ensure_ascii=False, allow_nan=False)
    except (SyntaxError, ValueError, TypeError, MemoryError, RecursionError):
        return None


class PythonicToolParser(StreamingToolParser):
    name = "pythonic"
    keeps_special_tokens = False

    def __init__(self, tokenizer: Any) -> None:
        super().__init__(tokenizer)
        self._state = _CONTENT
        self._call_start = 0  # where the current call's name begins
        self._name = ""  # the current call's function name
        self._scanner: CallEndScanner | None = None

    def _step(self) -> bool:
        if self._state == _CONTENT:
            return self._content()
        if self._state == _CALL:
            return self._call()
        if self._state == _AFTER:
            return self._after()
        return self._next()

    def _content(self) -> bool:
        text = self._text
        while True:
            i = text.find("[", self._pos)
            if i < 0:
                self._content_to(len(text))
                return False
            match = _LIST_START.match(text, i)
            if match:
                self._content_to(i)
                self._open_unit(i)
                self._begin_call(match.start(1), match.group(1), match.end())
                return True
            prefix = _LIST_START_PREFIX.match(text, i)
            if not self._final and prefix is not None and prefix.end() == len(text):
                self._content_to(i)  # may still open a call list: hold it
                return False
            self._content_to(i + 1)

    def _begin_call(self, name_start: int, name: str, after_paren: int) -> None:
        self._call_start, self._name = name_start, name
        self._scanner = CallEndScanner(after_paren)
        self._pos, self._state = after_paren, _CALL

    def _call(self) -> bool:
        assert self._scanner is not None
        end = self._scanner.feed(self._text, self._final)
        if end is None:
            if self._scanner.error:
                self._fail()
                return True
            return False
        arguments = call_arguments(self._text[self._call_start : end])
        if arguments is None:
            self._fail()
            return True
        self._pos = end
        self._announce(self._name)
        self._finish_call(arguments)
        self._state = _AFTER
        return True

    def _after(self) -> bool:  # after a call: "," or "]"
        text = self._text
        i = _skip_space(text, self._pos)
        if i == len(text):
            return False
        if text[i] == ",":
            self._pos, self._state = i + 1, _NEXT
        elif text[i] == "]":
            self._pos, self._state = i + 1, _CONTENT
            self._settle()
        else:
            self._fail()
        return True

    def _next(self) -> bool:  # after ",": another call, or "]" (a trailing comma)
        text = self._text
        i = _skip_space(text, self._pos)
        if i == len(text):
            return False
        if text[i] == "]":
            self._pos, self._state = i + 1, _CONTENT
            self._settle()
            return True
        self._open_unit(i)
        match = _CALL_START.match(text, i)
        if match:
            self._begin_call(i, match.group(1), match.end())
            return True
        prefix = _CALL_START_PREFIX.match(text, i)
        if prefix is not None and prefix.end() == len(text):
            return False
        self._fail()
        return True


def _skip_space(text: str, pos: int) -> int:
    while pos < len(text) and text[pos].isspace():
        pos += 1
    return pos
