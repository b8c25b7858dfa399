"""Detokenization and stop-string detection for one sequence: incremental, for outputs read
while the sequence runs or checked for stop strings, or in one decode at the end
(``WholeDetokenizer``) for outputs read only when it finished."""

from __future__ import annotations

from typing import Any

# How many already-emitted tokens to re-decode as left context, so that tokenizers that merge
# across token boundaries (SentencePiece spaces, byte-level BPE) render the new piece correctly.
_CONTEXT_TOKENS = 5


class IncrementalDetokenizer:
    def __init__(
        self,
        tokenizer: Any,
        prompt_token_ids: list[int],
        stop: list[str],
        include_stop_str_in_output: bool,
        skip_special_tokens: bool,
        spaces_between_special_tokens: bool,
    ) -> None:
        self.tokenizer = tokenizer
        self.stop = stop
        self.include_stop = include_stop_str_in_output
        self.decode_kwargs = {
            "skip_special_tokens": skip_special_tokens,
            "spaces_between_special_tokens": spaces_between_special_tokens,
        }
        # A fast (Rust) tokenizer without clean-up decodes to the same text through its backend
        # (what its ``decode`` calls, minus ~1.7 us of argument handling: two decodes a token,
        # ~0.2 ms of a 64-sequence step); spaces_between_special_tokens is a slow-tokenizer
        # option that fast ones ignore either way.
        backend = getattr(tokenizer, "backend_tokenizer", None)
        clean_up = getattr(tokenizer, "clean_up_tokenization_spaces", True)
        self._backend = backend if backend is not None and not clean_up else None
        self._skip_special = skip_special_tokens
        self.token_ids: list[int] = []
        self.prefix_offset = 0  # first token of the re-decoded left context
        self.read_offset = 0  # first token not yet turned into text
        self.text = ""
        # Streaming holds back this many chars: they may be the start of a stop string.
        self.hold_back = max((len(s) for s in stop), default=1) - 1 if stop else 0

    def _decode(self, ids: list[int]) -> str:
        if self._backend is not None:
            return self._backend.decode(ids, skip_special_tokens=self._skip_special)
        return self.tokenizer.decode(ids, **self.decode_kwargs)

    def add_token(self, token_id: int, check_stop: bool = True) -> str | None:
        """Append one token; returns the stop string it completed, if any (and then truncates
        ``text`` at the stop string, unless include_stop_str_in_output). ``check_stop`` False:
        no stop string is looked for in this token's text (tokens within ``min_tokens``)."""
        self.token_ids.append(token_id)
        prefix = self._decode(self.token_ids[self.prefix_offset : self.read_offset])
        full = self._decode(self.token_ids[self.prefix_offset :])
        if full.endswith("\ufffd") or len(full) <= len(prefix):
            return None  # an incomplete UTF-8 sequence: wait for more bytes
        new_text = full[len(prefix) :]
        before = len(self.text)
        self.text += new_text
        self.prefix_offset = max(0, len(self.token_ids) - _CONTEXT_TOKENS)
        self.read_offset = len(self.token_ids)
        return self._check_stop(before) if check_stop else None

    def _check_stop(self, before: int) -> str | None:
        if not self.stop:
            return None
        longest = max(len(s) for s in self.stop)
        search_from = max(0, before - longest + 1)
        best: tuple[int, str] | None = None
        for s in self.stop:
            idx = self.text.find(s, search_from)
            if idx != -1 and (best is None or idx < best[0]):
                best = (idx, s)
        if best is None:
            return None
        idx, s = best
        self.text = self.text[: idx + len(s)] if self.include_stop else self.text[:idx]
        return s

    def flush(self) -> None:
        """The sequence ended: render any held incomplete bytes as-is."""
        if self.read_offset < len(self.token_ids):
            prefix = self._decode(self.token_ids[self.prefix_offset : self.read_offset])
            full = self._decode(self.token_ids[self.prefix_offset :])
            self.text += full[len(prefix) :]
            self.read_offset = len(self.token_ids)

    def visible_text(self, finished: bool) -> str:
        """Text safe to stream now: all of it when finished, else minus the held-back tail."""
        if finished or not self.hold_back:
            return self.text
        return self.text[: max(0, len(self.text) - self.hold_back)]


class WholeDetokenizer(IncrementalDetokenizer):
    """For a sequence whose text is read only once it finished (``RequestOutputKind.FINAL_ONLY``)
    and that has no stop strings: the tokens are kept and decoded once, when the text is first
    asked for. The same text as the incremental path (one decode of all tokens is what the
    stream adds up to, ``tests/test_detokenizer.py``), without its two decodes a token: ~0.3 ms
    of a 64-sequence decode step of SmolLM2 on the 2-core Zen 5."""

    def __init__(self, tokenizer: Any, skip_special_tokens: bool,
                 spaces_between_special_tokens: bool) -> None:  # fmt: skip
        super().__init__(tokenizer, [], [], False, skip_special_tokens,
                         spaces_between_special_tokens)

    def add_token(self, token_id: int, check_stop: bool = True) -> str | None:
        self.token_ids.append(token_id)
        return None  # no stop strings to find

    def flush(self) -> None:
        if self.read_offset < len(self.token_ids):
            self.text = self._decode(self.token_ids)
            self.read_offset = len(self.token_ids)

    def visible_text(self, finished: bool) -> str:
        self.flush()
        return self.text
