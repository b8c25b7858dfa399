"""Incremental scanner for the guided output of ``tool_choice: "required"``.

The guided JSON schema makes the model write ``[{"name": "f", "parameters": {...}}, ...]``.
The scanner walks the array as the text streams in; each element object is read by the contract's
:class:`ironlm.json_scan.JsonScanner`, whose top-level members give, per element, the function
name and the raw text span of its ``parameters`` value. The same spans serve the one-shot
response, so streamed argument fragments always join to exactly the non-streamed ``arguments``.
Text that does not fit the array (a cut-off output, anything after a malformed element) ends the
scan; the calls completed before it stay.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from ironlm.json_scan import JsonScanner, Member, skip_ws


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
        self._pos = 0  # where the array is read on (outside the elements)
        self._expect = "["  # next array token: "[", "{" (an element), "," (or "]"); "" = ended
        self._element: JsonScanner | None = None  # the element object being scanned
        self._seen_members = 0  # members of that element already applied to calls[-1]

    def feed(self, delta: str) -> None:
        self.text += delta
        while self._step():
            pass

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

    # -- the array -------------------------------------------------------------------------
    def _step(self) -> bool:
        """Read one array token or scan the current element; False when the text is used up
        (or the scan has ended)."""
        if self._element is not None:
            return self._scan_element(self._element)
        i = skip_ws(self.text, self._pos)
        if i == len(self.text) or not self._expect:
            return False
        c, self._pos = self.text[i], i + 1
        if c == self._expect == "[" or c == self._expect == ",":
            self._expect = "{"
        elif c == self._expect == "{":
            self.calls.append(ScannedCall())
            self._element, self._seen_members, self._pos = JsonScanner(i), 0, i
        else:  # "]", or text that is not the guided array
            self._expect = ""
        return True

    def _scan_element(self, element: JsonScanner) -> bool:
        element.feed(self.text)
        call = self.calls[-1]
        for member in element.members[self._seen_members:]:
            self._member(call, member)
        self._seen_members = len(element.members)
        if element.key == "parameters" and element.value_start is not None:  # still streaming
            call.args_start = element.value_start
            call.args_composite = self.text[element.value_start] in "{["
        if element.error:
            self._element, self._expect = None, ""
            return False
        if not element.done:
            return False
        self._element, self._pos, self._expect = None, element.pos, ","
        return True

    def _member(self, call: ScannedCall, member: Member) -> None:
        raw = self.text[member.start:member.end]
        if member.key == "name":
            call.name = json.loads(raw) if raw[0] == '"' else None  # a string, or no name
        elif member.key == "parameters":
            call.args_start, call.args_end = member.start, member.end
            call.args_composite = raw[0] in "{["
