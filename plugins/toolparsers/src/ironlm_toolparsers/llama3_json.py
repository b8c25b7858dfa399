"""llama3_json: Llama 3.1 / 3.2 / 3.3 (and 4) JSON tool calls.

One or more call objects separated by ``;``, either at the very start of the output (after
whitespace) or after the ``<|python_tag|>`` token (text before the tag is content)::

    {"name": "get_weather", "parameters": {"city": "Paris"}}; {"name": "get_time", ...}
    Let me look.<|python_tag|>{"type": "function", "name": "search", "arguments": {...}}

The arguments key is ``parameters`` (Meta's prompt format) or ``arguments``; other keys such as
``"type": "function"`` are ignored. Text after the last call (not starting with ``;``) is
content. An output that starts with ``{`` is read as a call, so an answer that is a plain JSON
object (no ``name``) is reported as content, as a malformed call.
"""

from __future__ import annotations

from typing import Any

from ironlm.json_scan import skip_ws
from ironlm_toolparsers.base import DONE, MORE, StreamingToolParser
from ironlm_toolparsers.call_object import CallObject

BOT = "<|python_tag|>"

_START, _CONTENT, _OPEN, _OBJECT, _AFTER, _NEXT = range(6)


class Llama3JsonToolParser(StreamingToolParser):
    name = "llama3_json"

    def __init__(self, tokenizer: Any) -> None:
        super().__init__(tokenizer)
        self._state = _START
        self._call: CallObject | None = None

    def _step(self) -> bool:
        text, state = self._text, self._state
        if state == _START:  # does the output begin with a call?
            i = skip_ws(text, 0)
            if i == len(text) and not self._final:
                return False
            if i < len(text) and text[i] == "{":
                self._content_to(i)
                self._open_unit(i)
                self._begin_object(i)
            else:
                self._state = _CONTENT
            return True
        if state == _CONTENT:
            if self._scan_content((BOT,)) is None:
                return False
            self._state = _OPEN
            return True
        if state == _OPEN or state == _NEXT:  # whitespace, then a call object
            i = self._opener("{")
            if i is None:
                return self._broken
            if state == _NEXT:
                self._open_unit(i)
            self._begin_object(i)
            return True
        if state == _OBJECT:
            outcome = self._pump(self._call)
            if outcome == DONE:
                self._state = _AFTER
            return outcome != MORE
        # _AFTER a call: ";" and another call, or the rest is content
        i = skip_ws(text, self._pos)
        if i == len(text):
            return False
        if text[i] == ";":
            self._pos, self._state = i + 1, _NEXT
        else:
            self._state = _CONTENT  # the whitespace before it is content too
        return True

    def _begin_object(self, start: int) -> None:
        self._call, self._pos, self._state = CallObject(start), start, _OBJECT
