"""StreamingToolParser: the machinery every parser of this plugin shares.

One resumable scanner per parser (its ``_step``) drives both modes, so a one-shot ``extract`` and
any chunking of the same text through ``extract_streaming`` agree by construction: ``extract``
runs a fresh instance over the whole text in one piece.

The text is read left to right and every part is, once decided, either *content* (text outside
the calls) or part of a *call*. Rules shared by all parsers:

- text that may still become a tool-call marker is held back until it is decided;
- whitespace-only content is held until non-space content follows (content that is all
  whitespace is reported as none, ``None`` in ``extract``);
- a call's first delta carries index, id and name once the name is known (``pythonic``: once
  the call is complete); argument text follows in fragments as it becomes known (JSON parsers
  stream the model's raw argument text as it arrives); the fragments join to the call's final
  arguments string;
- a call cut off by the end of the text is content in ``extract`` (from its marker, or from its
  own start when calls of the same group completed before it; those stay calls); a missing closer
  after a complete call (``</tool_call>``, ``]``) is tolerated;
- a malformed call makes ``extract`` report the whole text as content with no calls.

Streaming cannot take back what it has sent: when a call whose name was already streamed later
turns out malformed or cut off, the stream keeps that call as sent (with the arguments sent so
far) and sends as content what ``extract`` would: the cut-off call's raw text, or, for a
malformed call, everything from the start of its group (which ``extract`` extends to the whole
text, calls streamed in earlier groups included). From a malformed call on, all is content.
"""

from __future__ import annotations

import uuid
from abc import abstractmethod
from dataclasses import dataclass
from typing import Any, ClassVar

from ironlm.interfaces.tool_parser import (
    DeltaToolCall,
    ExtractedToolCalls,
    StreamDelta,
    ToolCall,
    ToolParser,
)
from ironlm.json_scan import skip_ws

from ironlm_toolparsers.call_object import CallObject

MORE, DONE, FAILED = "more", "done", "failed"  # outcomes of _pump


@dataclass
class StreamedCall:
    """A call as streamed so far."""

    index: int
    id: str
    name: str
    arguments: str = ""
    done: bool = False


def longest_marker_prefix(text: str, pos: int, markers: tuple[str, ...]) -> int:
    """Length of the longest suffix of ``text[pos:]`` that is a proper prefix of a marker."""
    best = 0
    for marker in markers:
        for k in range(min(len(marker) - 1, len(text) - pos), best, -1):
            if text.endswith(marker[:k]):
                best = k
                break
    return best


class StreamingToolParser(ToolParser):
    """Base of this plugin's parsers. Subclasses implement :meth:`_step`."""

    # whether the markers are special tokens that detokenization must keep
    keeps_special_tokens: ClassVar[bool] = True

    def __init__(self, tokenizer: Any) -> None:
        super().__init__(tokenizer)
        self._text = ""
        self._pos = 0  # text before this index is decided
        self._settled = 0  # text before this was sent as content or is a finished call group
        self._unit_open = False  # a call has begun (marker or object seen) and is not finished
        self._unit_start = 0  # where that call began
        self._broken = False  # a malformed call was seen: the rest is content
        self._final = False  # the text is complete (finish_streaming / extract)
        self._calls: list[StreamedCall] = []
        self._current: StreamedCall | None = None  # announced, not finished
        self._delta = StreamDelta()
        self._held_ws = ""  # leading whitespace-only content, not sent yet
        self._content_started = False

    # -- the ToolParser interface ------------------------------------------------------------
    def adjust_request(self, request: dict[str, Any]) -> dict[str, Any]:
        """Keep special tokens in the detokenized text when tools may be called, since the
        markers this parser looks for are special tokens in the models that use them."""
        if self.keeps_special_tokens and request.get("tools") and (
            request.get("tool_choice", "auto") != "none"
        ):
            return {**request, "skip_special_tokens": False}
        return request

    def extract(self, model_output: str) -> ExtractedToolCalls:
        run = type(self)(self.tokenizer)
        first = run.extract_streaming(model_output)
        last = run.finish_streaming()
        if run._broken:
            return ExtractedToolCalls(False, [], model_output if model_output.strip() else None)
        calls = [ToolCall(c.name, c.arguments, c.id) for c in run._calls if c.done]
        content = (first.content or "") + (last.content or "")
        return ExtractedToolCalls(bool(calls), calls, content or None)

    def extract_streaming(self, delta_text: str) -> StreamDelta:
        self._text += delta_text
        self._advance()
        return self._take_delta()

    def finish_streaming(self) -> StreamDelta:
        self._final = True
        self._advance()
        if not self._broken:
            if self._unit_open:  # cut off inside a call: its raw text is content
                self._send_content(self._text[self._unit_start :])
            self._pos = self._settled = len(self._text)
        return self._take_delta()

    # -- for subclasses ----------------------------------------------------------------------
    @abstractmethod
    def _step(self) -> bool:
        """Decide more of ``self._text`` from ``self._pos``; False when more text is needed
        (or, once ``self._final``, when nothing more can be decided)."""

    def new_call_id(self) -> str:
        """A fresh call id, as vLLM makes them."""
        return f"chatcmpl-tool-{uuid.uuid4().hex}"

    def _content_to(self, end: int) -> None:
        """``self._text[self._pos:end]`` is content."""
        self._send_content(self._text[self._pos : end])
        self._pos = self._settled = max(end, self._pos)

    def _open_unit(self, start: int) -> None:
        """A call begins at ``start`` (its marker, or its first character after a separator)."""
        self._unit_open, self._unit_start = True, start

    def _settle(self) -> None:
        """A group of calls ended with its closer at ``self._pos``: all before is decided."""
        self._settled = self._pos

    def _fail(self) -> None:
        """The call being read is malformed: from the start of its group (the marker, or the
        start of the output) on, all is content."""
        self._broken = True
        self._unit_open = False
        self._current = None
        self._pos = self._settled

    def _scan_content(self, markers: tuple[str, ...]) -> str | None:
        """Send content up to the next marker. Returns the marker (``self._pos`` then points
        just after it, and a call unit is open) or None when the text is used up."""
        text, pos = self._text, self._pos
        found: tuple[int, str] | None = None
        for marker in markers:
            i = text.find(marker, pos)
            if i >= 0 and (found is None or i < found[0]):
                found = (i, marker)
        if found is None:
            keep = 0 if self._final else longest_marker_prefix(text, pos, markers)
            self._content_to(len(text) - keep)
            return None
        start, marker = found
        self._content_to(start)
        self._open_unit(start)
        self._pos = start + len(marker)
        return marker

    def _opener(self, char: str) -> int | None:
        """After whitespace from ``self._pos``, ``char`` (``{`` or ``[``) must come: its index.
        None when the text is used up (more is needed) or another character stands there (the
        call is malformed: failed); ``_step`` then returns ``self._broken``."""
        i = skip_ws(self._text, self._pos)
        if i == len(self._text):
            return None
        if self._text[i] != char:
            self._fail()
            return None
        return i

    def _pump(self, call: CallObject | None) -> str:
        """Feed ``call`` (the call object being read) with the grown text; announce it and
        stream its arguments when possible. Returns MORE, DONE (``self._pos`` moves past the
        object) or FAILED; ``_step`` returns ``outcome != MORE``."""
        assert call is not None
        call.feed(self._text)
        if call.error:
            self._fail()
            return FAILED
        if self._current is None and call.name is not None:
            self._announce(call.name)
        if self._current is not None:
            self._send_arguments(call.take_arguments(self._text))
        if not call.done:
            return MORE
        self._pos = call.end
        self._finish_call(call.arguments)
        return DONE

    def _announce(self, name: str) -> None:
        call = StreamedCall(len(self._calls), self.new_call_id(), name)
        self._calls.append(call)
        self._current = call
        self._delta.tool_calls.append(DeltaToolCall(call.index, call.id, name, ""))

    def _send_arguments(self, fragment: str) -> None:
        call = self._current
        if not fragment or call is None:
            return
        call.arguments += fragment
        pending = self._delta.tool_calls
        if pending and pending[-1].index == call.index and pending[-1].name is None:
            pending[-1].arguments += fragment
        else:
            pending.append(DeltaToolCall(call.index, arguments=fragment))

    def _finish_call(self, arguments: str) -> None:
        """The current call is complete; its arguments are ``arguments``."""
        call = self._current
        assert call is not None
        self._send_arguments(arguments[len(call.arguments) :])
        if call.arguments != arguments:  # cannot happen: fragments are slices of the final text
            raise AssertionError(f"streamed arguments {call.arguments!r} != {arguments!r}")
        call.done = True
        self._current = None
        self._unit_open = False

    # -- internals ---------------------------------------------------------------------------
    def _advance(self) -> None:
        while not self._broken:
            if not self._step():
                return
        self._content_to(len(self._text))

    def _send_content(self, text: str) -> None:
        if not text:
            return
        if not self._content_started:
            if not text.strip():
                self._held_ws += text
                return
            text, self._held_ws = self._held_ws + text, ""
            self._content_started = True
        self._delta.content = (self._delta.content or "") + text

    def _take_delta(self) -> StreamDelta:
        delta, self._delta = self._delta, StreamDelta()
        return delta
