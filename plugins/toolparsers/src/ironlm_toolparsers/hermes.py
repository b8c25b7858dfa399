"""hermes: Hermes 2 Pro / Qwen 2.5 / Qwen 3 style calls.

Format (any number of calls, text before, between and after them)::

    I'll check.<tool_call>
    {"name": "get_weather", "arguments": {"city": "Paris"}}
    </tool_call>

Each ``<tool_call>`` holds one JSON call object; whitespace may surround it; the closing
``</tool_call>`` may be missing at the very end (a stop string, or a cut just before it).
"""

from __future__ import annotations

from typing import Any

from ironlm.json_scan import skip_ws
from ironlm_toolparsers.base import DONE, MORE, StreamingToolParser
from ironlm_toolparsers.call_object import CallObject

START, END = "<tool_call>", "</tool_call>"

_CONTENT, _OPEN, _OBJECT, _CLOSE = range(4)


class HermesToolParser(StreamingToolParser):
    name = "hermes"

    def __init__(self, tokenizer: Any) -> None:
        super().__init__(tokenizer)
        self._state = _CONTENT
        self._call: CallObject | None = None

    def _step(self) -> bool:
        text = self._text
        if self._state == _CONTENT:
            if self._scan_content((START,)) is None:
                return False
            self._state = _OPEN
            return True
        if self._state == _OPEN:  # after <tool_call>: whitespace, then the object
            i = self._opener("{")
            if i is None:
                return self._broken
            self._call, self._pos, self._state = CallObject(i), i, _OBJECT
            return True
        if self._state == _OBJECT:
            outcome = self._pump(self._call)
            if outcome == DONE:
                self._state = _CLOSE
            return outcome != MORE
        # _CLOSE: after the object: whitespace, then </tool_call>
        i = skip_ws(text, self._pos)
        if text.startswith(END, i):
            self._pos = i + len(END)
            self._settle()
            self._state = _CONTENT
            return True
        if END.startswith(text[i:]):  # nothing yet, or part of the closer
            return False
        self._fail()
        return True
