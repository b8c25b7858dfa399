"""mistral: Mistral 7B Instruct v0.3, Mistral Small / Nemo and newer (tokenizer v11+) calls.

Two forms after the ``[TOOL_CALLS]`` token (whitespace allowed after it):

- a JSON list (tokenizers before v11)::

      Sure.[TOOL_CALLS] [{"name": "add", "arguments": {"a": 1}}, {"name": ...}]

- one call per token, name then arguments object (v11+; ``[ARGS]`` is present when special
  tokens are kept, absent with Mistral's own detokenizer)::

      [TOOL_CALLS]add[ARGS]{"a": 1}[TOOL_CALLS]mul{"a": 2, "b": 3}

Text before the first marker and after the calls is content. Call ids are nine alphanumeric
characters, the only form Mistral's chat templates and ``mistral_common`` accept back in history.
"""

from __future__ import annotations

import re
import secrets
import string
from typing import Any

from ironlm.json_scan import skip_ws
from ironlm_toolparsers.base import DONE, MORE
from ironlm_toolparsers.call_object import CallObject
from ironlm_toolparsers.json_list import CONTENT, FIRST_FREE_STATE, JsonListToolParser

BOT, ARGS = "[TOOL_CALLS]", "[ARGS]"
_NAME = re.compile(r"[A-Za-z0-9_.\-]*")
_ID_ALPHABET = string.ascii_letters + string.digits

_NAMED_ARGS, _NAMED_OBJECT = FIRST_FREE_STATE, FIRST_FREE_STATE + 1


class MistralToolParser(JsonListToolParser):
    name = "mistral"
    markers = (BOT,)

    def __init__(self, tokenizer: Any) -> None:
        super().__init__(tokenizer)
        self._function = ""  # name of the v11-form call being read

    def new_call_id(self) -> str:
        return "".join(secrets.choice(_ID_ALPHABET) for _ in range(9))

    def _after_marker(self) -> bool:
        text = self._text
        i = skip_ws(text, self._pos)
        if i == len(text):
            return False
        if text[i] == "[":
            self._begin_list(i)
            return True
        j = _NAME.match(text, i).end()  # type: ignore[union-attr]
        if j == len(text):  # the name may go on
            return False
        if j == i:
            self._fail()
            return True
        if text.startswith(ARGS, j):
            k = j + len(ARGS)
        elif text[j] == "{":
            k = j
        elif ARGS.startswith(text[j:]):
            return False
        else:
            self._fail()
            return True
        self._function, self._pos, self._state = text[i:j], k, _NAMED_ARGS
        return True

    def _state_after_object(self) -> int:
        if self._state == _NAMED_OBJECT:
            self._settle()
            return CONTENT
        return super()._state_after_object()

    def _step_more(self, state: int) -> bool:
        if state == _NAMED_ARGS:  # after name[ARGS]: the arguments object
            i = self._opener("{")
            if i is None:
                return self._broken
            self._call = CallObject(i, name=self._function)
            self._pos, self._state = i, _NAMED_OBJECT
            return True
        if state == _NAMED_OBJECT:
            outcome = self._pump(self._call)
            if outcome == DONE:
                self._state = self._state_after_object()
            return outcome != MORE
        return super()._step_more(state)
