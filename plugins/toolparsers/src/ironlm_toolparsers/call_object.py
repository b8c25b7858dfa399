"""CallObject: one JSON tool call ``{"name": ..., "arguments": {...}}`` read from a growing text.

Shared by every JSON-based parser. It reports the function name as soon as the ``name`` string is
complete and hands out the arguments as they become known:

- ``"arguments"`` (or ``"parameters"``, as Llama writes it) given as an object: the raw text of
  that object, streamed as it arrives; the final arguments string is exactly that slice of the
  model's output (valid JSON, the model's own spacing and escapes kept);
- given as a JSON-encoded string (``"arguments": "{\\"a\\": 1}"``): decoded once, handed out when
  the string is complete; it must decode to a JSON object;
- ``null`` or absent: ``"{}"``.

Anything else (not JSON, no name, a non-string name, arguments of another type, ``name`` or the
arguments given twice) is an error: the caller reports the whole output as content.
"""

from __future__ import annotations

from ironlm.json_scan import JsonScanner, Member, strict_loads

ARGUMENT_KEYS = ("arguments", "parameters")


class CallObject:
    """Scans the call object that starts (with ``{``) at ``start``.

    :param start: index of the object's ``{`` in the text.
    :param name: when given, the object *is* the arguments (Mistral's ``name[ARGS]{...}`` form)
        and the name is already known.
    """

    def __init__(self, start: int, name: str | None = None) -> None:
        self.start = start
        self.name = name
        self.error = False
        self.done = False
        self.end = start  # index after the closing "}" once done
        self.arguments = ""  # the complete arguments string, once done
        self._scanner = JsonScanner(start)
        self._whole_is_arguments = name is not None
        self._seen_members = 0
        self._has_name = name is not None
        self._has_arguments = False
        self._raw_start: int | None = None  # start of object-valued arguments in the text
        self._raw_end: int | None = None  # their end, once complete
        self._sent = 0  # characters of the arguments already handed out
        self._whole: str | None = None  # arguments known at once (decoded string, "{}")

    def feed(self, text: str) -> None:
        """Advance over the grown ``text``; afterwards check ``error``, ``name`` and ``done``."""
        if self.error or self.done:
            return
        scanner = self._scanner
        scanner.feed(text)
        if self._whole_is_arguments:
            self._raw_start = self.start
        else:
            for member in scanner.members[self._seen_members :]:
                self._member(text, member)
                if self.error:
                    return
            self._seen_members = len(scanner.members)
            if (
                self._raw_start is None
                and scanner.value_start is not None
                and scanner.key in ARGUMENT_KEYS
            ):
                if self._has_arguments:
                    self.error = True  # "arguments" and "parameters" both given
                    return
                if text[scanner.value_start] == "{":
                    self._raw_start = scanner.value_start
        if scanner.error:
            self.error = True
            return
        if scanner.done:
            self._complete(text, scanner.pos)

    def take_arguments(self, text: str) -> str:
        """The argument text that is known and not yet handed out (call once the name is)."""
        if self._whole is not None:
            out = self._whole[self._sent :]
            self._sent = len(self._whole)
            return out
        if self._raw_start is None:
            return ""
        stop = self._raw_end if self._raw_end is not None else self._scanner.pos
        begin = self._raw_start + self._sent
        out = text[begin:stop] if stop > begin else ""
        self._sent += len(out)
        return out

    # -- members -----------------------------------------------------------------------------
    def _member(self, text: str, member: Member) -> None:
        raw = text[member.start : member.end]
        if member.key == "name":
            if self._has_name:
                self.error = True
                return
            self._has_name = True
            value = strict_loads(raw) if raw[0] == '"' else None
            if not isinstance(value, str) or not value:
                self.error = True
                return
            self.name = value
        elif member.key in ARGUMENT_KEYS:
            if self._has_arguments:
                self.error = True
                return
            self._has_arguments = True
            if raw[0] == "{":
                self._raw_start, self._raw_end = member.start, member.end
            elif raw == "null":
                self._whole = "{}"
            elif raw[0] == '"':
                self._whole = self._decode_string_arguments(raw)
            else:
                self.error = True

    def _decode_string_arguments(self, raw: str) -> str | None:
        decoded = strict_loads(raw)
        assert isinstance(decoded, str)
        try:
            value = strict_loads(decoded)
        except (ValueError, RecursionError):
            value = None
        if not isinstance(value, dict):
            self.error = True
            return None
        return decoded

    def _complete(self, text: str, end: int) -> None:
        try:  # the scanner is strict JSON already; json itself is the final word
            strict_loads(text[self.start : end])
        except (ValueError, RecursionError):
            self.error = True
            return
        if self.name is None:
            self.error = True
            return
        if self._whole_is_arguments:
            self._raw_end = end
        elif self._raw_start is None and self._whole is None:
            self._whole = "{}"
        if self._whole is not None:
            self.arguments = self._whole
        else:
            assert self._raw_start is not None and self._raw_end is not None
            self.arguments = text[self._raw_start : self._raw_end]
        self.end = end
        self.done = True
