"""Guided decoding: an engine-level backend compiles a spec; a request-level Grammar masks tokens.

Split as in vLLM's structured-output design: compiling a JSON schema / regex / grammar is costly
and shared (the host caches ``compile`` results per distinct spec), while each request walks its
own Grammar state token by token.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Any, ClassVar, Literal

import torch

from ironlm.interfaces.platform import Availability

GuidedKind = Literal["json", "json_object", "regex", "choice", "grammar"]


@dataclass(frozen=True)
class GuidedSpec:
    """One request's constraint, normalised and hashable (the compile-cache key).

    kind: json (value: the JSON schema as canonical JSON text), json_object (any JSON object;
    value ""), regex (value: the pattern, matched in full), choice (choices: the allowed strings),
    grammar (value: EBNF / Lark text as vLLM accepts).
    """

    kind: GuidedKind
    value: str = ""
    choices: tuple[str, ...] = ()
    whitespace_pattern: str | None = None
    # JSON kinds: no whitespace between JSON tokens at all (vLLM's disable_any_whitespace;
    # the default for tool calls). Otherwise backends bound each whitespace run.
    disable_any_whitespace: bool = False
    # "auto" backend selection: use the first backend by priority or fail, never fall back.
    disable_fallback: bool = False
    # Close the output before max_tokens cuts it: near the end of the budget the host forces
    # the shortest path the grammar accepts to a complete match (tool calls; the engine's
    # guided_closing). Backends need not read it.
    close_at_budget: bool = False


class UnsupportedFeatureError(ValueError):
    """Raised by ``GuidedBackend.compile`` for a valid spec that uses a feature this backend
    cannot enforce (a JSON-schema keyword, a regex construct, a whitespace option). With
    ``guided_decoding_backend="auto"`` the host then tries the next backend by priority; any
    other ValueError means the spec itself is invalid and is answered at once."""


class Grammar(ABC):
    """Request-level matcher state. Not shared between requests."""

    @abstractmethod
    def fill_mask(self, mask: torch.Tensor) -> None:
        """Set True in ``mask`` ((vocab_size,) bool, all False on entry) at every token id the
        grammar allows next. When the text so far is a complete match, the EOS token is allowed
        (and, when nothing else may follow, it is the only one). A Grammar that cannot go on
        (a dead end) may raise, or leave the mask empty: the host then ends only this request,
        with an error naming the backend (the same holds for an exception from any method)."""

    @abstractmethod
    def accept_token(self, token_id: int) -> bool:
        """Advance by one sampled token. Returns False (state unchanged) if it is not allowed."""

    @abstractmethod
    def rollback(self, num_tokens: int) -> None:
        """Undo the last ``num_tokens`` accepted tokens (speculative decoding, preemption)."""

    @abstractmethod
    def is_terminated(self) -> bool:
        """True once EOS was accepted (or the match can only end)."""

    @property
    def constraining(self) -> bool:
        """False while the grammar lets every token through for now (the engine's reasoning
        gate, before the answer starts); the budget closer then leaves the request alone.
        Contract 1.1; backends' grammars keep this default."""
        return True


class GuidedBackend(ABC):
    """An engine-level structured-output backend. Registered through
    ``register_guided_backends``; constructed as ``Backend(tokenizer, vocab_size)`` where
    ``tokenizer`` is the HF tokenizer and ``vocab_size`` the width of the model's logits."""

    name: ClassVar[str]
    # "auto" tries available backends from the highest priority down (vLLM's order puts
    # xgrammar first), falling back per request only on UnsupportedFeatureError.
    priority: ClassVar[int] = 0
    # Which spec kinds this backend can enforce (the host answers 400 for others).
    supported_kinds: ClassVar[frozenset[str]] = frozenset(
        {"json", "json_object", "regex", "choice", "grammar"}
    )

    def __init__(self, tokenizer: Any, vocab_size: int) -> None:
        self.tokenizer = tokenizer
        self.vocab_size = vocab_size

    @classmethod
    def is_available(cls) -> Availability:
        """Whether the backend's library imports here."""
        return Availability.yes()

    @abstractmethod
    def compile(self, spec: GuidedSpec) -> Any:
        """Compile ``spec`` into an immutable, shareable object. Raise UnsupportedFeatureError
        for a feature the backend cannot enforce, ValueError naming the problem for an invalid
        regex / schema / grammar. Honour ``spec.disable_any_whitespace`` (no whitespace between
        JSON tokens) and otherwise keep every whitespace run between JSON tokens bounded, so
        that no model can loop on whitespace. The host caches the result per spec and calls
        this from a worker thread (concurrently with other requests' Grammars): it must not
        touch state those Grammars mutate."""

    @abstractmethod
    def new_grammar(self, compiled: Any) -> Grammar:
        """A fresh request-level Grammar over a ``compile`` result."""
