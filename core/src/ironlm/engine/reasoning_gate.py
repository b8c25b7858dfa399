"""ReasoningGate: a request's structured-output grammar held back while the model reasons.

With a reasoning parser (``--reasoning-parser``) a guided request constrains only the answer,
as in vLLM: the grammar starts after the parser's end marker has been generated (or at once
when the prompt already closed the reasoning, ``ReasoningParser.prompt_ends_reasoning``).
``structured_outputs_config: {"enable_in_reasoning": true}`` constrains from the first token
instead (then no gate is built).

The gate is itself a Grammar wrapping the request's, so the sampler's masks, speculative
drafts, rollback and the budget closer go through it unchanged. The marker is text: the gate
decodes the last few tokens it accepted (``skip_special_tokens=False``, so a marker that is a
special token is seen) and opens on the first token whose text completes the marker. Text of
that token after the marker (a newline, say) is not checked by the grammar; tokens after it
are.
"""

from __future__ import annotations

from typing import Any

import torch

from ironlm.interfaces.guided import Grammar


class ReasoningGate(Grammar):
    def __init__(self, inner: Grammar, end_marker: str, tokenizer: Any, opened: bool) -> None:
        self.inner = inner
        self.end_marker = end_marker
        self.tokenizer = tokenizer
        # tokens (of the last ``_window`` while closed) that may hold the marker
        self._window = len(end_marker) + 2  # a marker of k characters spans at most k tokens
        self._recent: list[int] = []
        # per accepted token: whether the inner grammar took it (rollback undoes both kinds)
        self._fed: list[bool] = []
        # len(self._fed) when the gate opened: 0 for a prompt that closed the reasoning,
        # None while the model still reasons
        self._opened_at: int | None = 0 if opened else None

    @property
    def open(self) -> bool:
        """The grammar constrains (the reasoning has ended)."""
        return self._opened_at is not None

    def fill_mask(self, mask: torch.Tensor) -> None:
        if self.open:
            self.inner.fill_mask(mask)
        else:
            mask[:] = True  # reasoning is free text (EOS included)

    def accept_token(self, token_id: int) -> bool:
        if self.open:
            if not self.inner.accept_token(token_id):
                return False
            self._fed.append(True)
            return True
        self._fed.append(False)
        self._recent.append(token_id)
        text = self.tokenizer.decode(self._recent[-self._window:], skip_special_tokens=False)
        if self.end_marker in text:
            self._opened_at = len(self._fed)
        return True

    def rollback(self, num_tokens: int) -> None:
        undone = self._fed[len(self._fed) - num_tokens:]
        del self._fed[len(self._fed) - num_tokens:]
        fed = sum(undone)
        if fed:
            self.inner.rollback(fed)
        reasoned = num_tokens - fed
        if reasoned:
            del self._recent[len(self._recent) - reasoned:]
        if self._opened_at is not None and self._opened_at > len(self._fed):
            self._opened_at = None  # the token that closed the reasoning was undone

    def is_terminated(self) -> bool:
        return self.open and self.inner.is_terminated()
