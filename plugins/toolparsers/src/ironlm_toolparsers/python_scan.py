"""CallEndScanner: finds the ``)`` that closes a Python call in a growing text.

Tracks nested brackets, string literals (single, double, triple quoted, with backslash escapes;
prefixes such as ``r``/``b`` are ordinary letters before the quote) and ``#`` comments, so that a
``)`` inside a string does not end the call. It does not validate: ``ast`` does that on the
complete call.
"""

from __future__ import annotations

_OPENERS = {"(": ")", "[": "]", "{": "}"}
_CLOSERS = frozenset(")]}")


class CallEndScanner:
    """Scans from just after a call's ``(`` at ``start``."""

    def __init__(self, start: int) -> None:
        self.pos = start
        self._expect: list[str] = [")"]  # closers of the open brackets, innermost last
        self._quote = ""  # the open string's delimiter: ' " ''' or \"\"\"; "" outside strings
        self._comment = False
        self.error = False  # the brackets do not match

    def feed(self, text: str, final: bool) -> int | None:
        """Index just after the closing ``)``, or None while it has not been seen (or when the
        brackets do not match: ``error`` is then set)."""
        i, n = self.pos, len(text)
        while i < n:
            c = text[i]
            if self._comment:
                self._comment = c != "\n"
                i += 1
            elif self._quote:
                if c == "\\":
                    if i + 1 == n:
                        break  # the escaped character has not arrived
                    i += 2
                elif text.startswith(self._quote, i):
                    i += len(self._quote)
                    self._quote = ""
                elif not final and len(self._quote) > 1 and self._quote.startswith(text[i:]):
                    break  # maybe the start of the closing triple quote
                else:
                    i += 1
            elif c in "'\"":
                if n - i < 3 and not final and text[i:] == c * (n - i):
                    break  # '' could be an empty string or the start of '''
                self._quote = c * 3 if text.startswith(c * 3, i) else c
                i += len(self._quote)
            elif c == "#":
                self._comment, i = True, i + 1
            elif c in _OPENERS:
                self._expect.append(_OPENERS[c])
                i += 1
            elif c in _CLOSERS:
                if c != self._expect[-1]:
                    self.error = True
                    return None
                self._expect.pop()
                i += 1
                if not self._expect:
                    self.pos = i
                    return i
            else:
                i += 1
        self.pos = i
        return None
