"""ReasoningGate: a chat request's structured-output grammar held back while the model reasons.

With a reasoning parser (``--reasoning-parser``) a guided chat request constrains only the
answer, as in vLLM: the grammar starts after the parser's end marker has been generated, or
at once when the chat front end found the reasoning already closed (the prompt's reply holds
a whole think block, Qwen3 without thinking, a guided request with ``include_reasoning:
false``); it tells the engine with ``add_request(..., reasoning_ended=...)``. Requests that carry no such decision
(completions, ``LLM.generate``: nothing splits their reasoning) are constrained from the
first token, as is everything with ``structured_outputs_config: {"enable_in_reasoning":
true}``.

The gate is itself a Grammar wrapping the request's, so the sampler's masks, speculative
drafts, rollback and the budget closer go through it. The marker is text, found in the decoded
tail of the tokens the gate accepted, so it may span several tokens (three in SmolLM2). A token
may complete the marker and carry more text (SmolLM2's ``><``, Gemma 3's ``>{``): that rest is
the answer's beginning, so the gate feeds its tokens to the grammar when it opens, and while
closed it masks the tokens whose rest the grammar would refuse (``MarkerTokens``).
"""

from __future__ import annotations

from typing import Any

import torch

from ironlm.interfaces.guided import Grammar


class MarkerTokens:
    """The vocabulary's tokens that finish ``marker`` with text to spare, found once per
    engine: ``after[r]`` lists (token, rest) for tokens whose text starts with ``r``, a
    nonempty end of the marker, and goes on with ``rest``; ``inside`` the tokens holding the
    whole marker with text after it."""

    def __init__(self, tokenizer: Any, marker: str) -> None:
        self.tokenizer = tokenizer
        self.marker = marker
        self.window = len(marker.encode()) + 2  # a byte-level piece per byte, at most
        texts = tokenizer.batch_decode([[i] for i in range(len(tokenizer))],
                                       skip_special_tokens=False)
        ends = {marker[k:] for k in range(len(marker))}
        self.after: dict[str, list[tuple[int, str]]] = {}
        self.inside: list[tuple[int, str]] = []
        for token, text in enumerate(texts):
            at = text.find(marker)
            if at > 0 and len(text) > at + len(marker):
                self.inside.append((token, text[at + len(marker):]))
            for end in ends:
                if len(text) > len(end) and text.startswith(end):
                    self.after.setdefault(end, []).append((token, text[len(end):]))

    def finishing(self, tail: str) -> list[tuple[int, str]]:
        """(token, rest) that would complete the marker after ``tail`` with ``rest`` left."""
        found = list(self.inside)
        for k in range(min(len(self.marker), len(tail)), 0, -1):
            if tail.endswith(self.marker[:k]):
                found += self.after.get(self.marker[k:], [])
        found += self.after.get(self.marker, [])
        return found

    def rest_tokens(self, rest: str) -> list[int]:
        return self.tokenizer.encode(rest, add_special_tokens=False)


class ReasoningGate(Grammar):
    """``inner`` held back until the marker: every token allowed (but those finishing the
    marker with a rest ``inner`` refuses), none fed to it; then ``inner`` itself."""

    def __init__(self, inner: Grammar, markers: MarkerTokens, opened: bool) -> None:
        self.inner = inner
        self.markers = markers
        self._recent: list[int] = []  # the tokens accepted while closed
        self._tail = ""  # the decoded text of the last ``markers.window`` of them
        # per accepted token: how many tokens the inner grammar took for it (0 while
        # reasoning; the rest of a token that finished the marker may take several)
        self._fed: list[int] = []
        # len(self._fed) when the gate opened (0: from the start), None while reasoning
        self._opened_at: int | None = 0 if opened else None

    @property
    def constraining(self) -> bool:
        """The grammar constrains (the reasoning has ended)."""
        return self._opened_at is not None

    def fill_mask(self, mask: torch.Tensor) -> None:
        if self.constraining:
            self.inner.fill_mask(mask)
            return
        mask[:] = True  # reasoning is free text (EOS included) ...
        for token, rest in self.markers.finishing(self._tail):
            if token < mask.shape[0] and not self._inner_takes(rest):
                mask[token] = False  # ... but no answer may start with a refused rest

    def _inner_takes(self, rest: str) -> bool:
        fed = self._feed(rest)
        if fed:
            self.inner.rollback(fed)
        return fed is not None

    def _feed(self, rest: str) -> int | None:
        """Feed ``rest``'s tokens to the inner grammar: how many it took, or None (and its
        state as found) when it refuses one."""
        fed = 0
        for t in self.markers.rest_tokens(rest) if rest else []:
            if not self.inner.accept_token(t):
                if fed:
                    self.inner.rollback(fed)
                return None
            fed += 1
        return fed

    def accept_token(self, token_id: int) -> bool:
        if self.constraining:
            if not self.inner.accept_token(token_id):
                return False
            self._fed.append(1)
            return True
        recent = self._recent + [token_id]
        tail = self.markers.tokenizer.decode(recent[-self.markers.window:],
                                             skip_special_tokens=False)
        at = tail.find(self.markers.marker)
        fed = 0
        if at >= 0:
            took = self._feed(tail[at + len(self.markers.marker):])
            if took is None:
                return False  # the answer would start with text the grammar refuses
            fed = took
        self._recent, self._tail = recent, tail
        self._fed.append(fed)
        if at >= 0:
            self._opened_at = len(self._fed)
        return True

    def rollback(self, num_tokens: int) -> None:
        if not 0 <= num_tokens <= len(self._fed):
            raise ValueError(f"cannot roll back {num_tokens} of {len(self._fed)} tokens")
        keep = len(self._fed) - num_tokens
        fed = sum(self._fed[keep:])
        if fed:
            self.inner.rollback(fed)
        opened = self._opened_at
        reasoned = num_tokens if opened is None else max(0, opened - keep)
        del self._fed[keep:]
        if reasoned:
            del self._recent[len(self._recent) - reasoned:]
            self._tail = self.markers.tokenizer.decode(
                self._recent[-self.markers.window:], skip_special_tokens=False)
        if opened is not None and opened > keep:
            self._opened_at = None  # the token that closed the reasoning was undone

    def is_terminated(self) -> bool:
        return self.constraining and self.inner.is_terminated()


def gate_grammars(grammars: list[tuple[Any, str | None]], markers: MarkerTokens | None,
                  reasoning_ended: bool | None) -> list[tuple[Any, str | None]]:
    """A guided request's (grammar, backend) pairs, each held back by a gate while the front end
    says the model reasons (``reasoning_ended`` False; True: open from the start). None, or
    no reasoning parser (``markers`` None): the grammars as they are."""
    if markers is None or reasoning_ended is None:
        return grammars
    return [(ReasoningGate(g, markers, reasoning_ended), name) for g, name in grammars]
