"""JsonListToolParser: a marker followed by a JSON list of call objects.

Shared by ``mistral`` (``[TOOL_CALLS][{...}, {...}]``) and ``granite``
(``<|tool_call|>[{...}]``)::

    content  MARKER  ws "[" ws call ( ws "," ws call )* ws "]"  content

The list holds at least one call; each call is ``{"name": ..., "arguments": ...}`` (see
:mod:`ironlm_toolparsers.call_object`). Text before the marker and after the list is content; a
missing ``]`` at the very end is tolerated. A call cut off by the end is content; calls completed
before it in the same list stay calls.
"""

from __future__ import annotations

from typing import Any, ClassVar

from ironlm.json_scan import skip_ws
from ironlm_toolparsers.base import DONE, MORE, StreamingToolParser
from ironlm_toolparsers.call_object import CallObject

CONTENT, AFTER_MARKER, ITEM, OBJECT, AFTER_ITEM = range(5)
FIRST_FREE_STATE = 5  # subclasses number their own states from here


class JsonListToolParser(StreamingToolParser):
    """Subclasses set ``markers`` (the texts that open a list of calls)."""

    markers: ClassVar[tuple[str, ...]]

    def __init__(self, tokenizer: Any) -> None:
        super().__init__(tokenizer)
        self._state = CONTENT
        self._call: CallObject | None = None
        self._first_item = True

    def _step(self) -> bool:
        state = self._state
        if state == CONTENT:
            if self._scan_content(self.markers) is None:
                return False
            self._state = AFTER_MARKER
            return True
        if state == AFTER_MARKER:
            return self._after_marker()
        if state == ITEM:
            return self._item()
        if state == OBJECT:
            outcome = self._pump(self._call)
            if outcome == DONE:
                self._state = self._state_after_object()
            return outcome != MORE
        if state == AFTER_ITEM:
            return self._after_item()
        return self._step_more(state)

    # -- hooks for subclasses ----------------------------------------------------------------
    def _after_marker(self) -> bool:
        """After the marker: whitespace, then the list."""
        i = self._opener("[")
        if i is None:
            return self._broken
        self._begin_list(i)
        return True

    def _state_after_object(self) -> int:
        return AFTER_ITEM

    def _step_more(self, state: int) -> bool:
        """Steps of states a subclass adds."""
        raise AssertionError(f"unknown state {state}")

    # -- the list ----------------------------------------------------------------------------
    def _begin_list(self, bracket: int) -> None:
        self._pos, self._state, self._first_item = bracket + 1, ITEM, True

    def _item(self) -> bool:
        i = self._opener("{")
        if i is None:
            return self._broken
        if not self._first_item:  # the first call's unit began at the marker
            self._open_unit(i)
        self._first_item = False
        self._call, self._pos, self._state = CallObject(i), i, OBJECT
        return True

    def _after_item(self) -> bool:
        text = self._text
        i = skip_ws(text, self._pos)
        if i == len(text):
            return False
        if text[i] == ",":
            self._pos, self._state = i + 1, ITEM
        elif text[i] == "]":
            self._pos, self._state = i + 1, CONTENT
            self._settle()
        else:
            self._fail()
        return True
