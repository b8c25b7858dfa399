"""The ``outlines`` backend: outlines-core regex automata over the model's token bytes.

Every kind becomes one regex (JSON schemas through outlines-core's schema-to-regex builder, after
normal-form rewriting; choices as an alternation of escaped literals), compiled into an
``outlines_core.Index`` over the token-byte vocabulary. Each request walks a ``Guide`` on that
shared, immutable index; masks come from ``Guide.write_mask_into`` as a packed bitmask.
No context-free grammars: outlines-core has none, so "grammar" is not a supported kind.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar

import torch

from ironlm.interfaces.guided import Grammar, GuidedBackend, GuidedSpec, UnsupportedFeatureError
from ironlm.interfaces.platform import Availability
from ironlm_guided.bitmask import BitmaskUnpacker
from ironlm_guided.outlines_schema import (
    any_json,
    check_whitespace_pattern,
    outlines_schema_regex,
)
from ironlm_guided.regex_check import ascii_shorthands, check_python_regex, escape_literal
from ironlm_guided.vocab import TokenTable

_MAX_ROLLBACK = 1 << 30  # the Guide keeps one state per accepted token, unbounded in practice


@dataclass(frozen=True)
class OutlinesCompiled:
    """An immutable compiled spec, shared by every Grammar over it."""

    index: Any  # outlines_core.Index
    regex: str
    eos_token_id: int
    # memo: DFA state -> "is EOS the only token allowed there" (filled lazily, never cleared)
    only_eos: dict[int, bool] = field(default_factory=dict, compare=False, repr=False)

    def ends_here(self, state: int) -> bool:
        known = self.only_eos.get(state)
        if known is None:
            known = self.index.get_allowed_tokens(state) == [self.eos_token_id]
            self.only_eos[state] = known
        return known


class OutlinesBackend(GuidedBackend):
    name: ClassVar[str] = "outlines"
    priority: ClassVar[int] = 20
    supported_kinds: ClassVar[frozenset[str]] = frozenset(
        {"json", "json_object", "regex", "choice"}
    )

    def __init__(self, tokenizer: Any, vocab_size: int) -> None:
        super().__init__(tokenizer, vocab_size)
        from outlines_core import Vocabulary

        self.table = TokenTable.from_tokenizer(tokenizer, vocab_size)
        by_bytes: dict[bytes, list[int]] = {}
        for token_id, raw in enumerate(self.table.token_bytes):
            if raw and token_id != self.table.eos_token_id:
                by_bytes.setdefault(raw, []).append(token_id)
        self.vocabulary = Vocabulary(self.table.eos_token_id, by_bytes)
        self.unpacker = BitmaskUnpacker(vocab_size)

    @classmethod
    def is_available(cls) -> Availability:
        try:
            import outlines_core  # noqa: F401
        except ImportError as e:
            return Availability.no(
                f"outlines-core is not installed ({e}); pip install outlines-core"
            )
        return Availability.yes()

    def compile(self, spec: GuidedSpec) -> OutlinesCompiled:
        # between JSON tokens: nothing (disable_any_whitespace), the request's pattern, or
        # outlines-core's default of at most one space
        whitespace = "" if spec.disable_any_whitespace else spec.whitespace_pattern
        if spec.kind == "json":
            regex = outlines_schema_regex(spec.value, whitespace)
        elif spec.kind == "json_object":
            # nesting bounded to two levels: deeper any-JSON regexes take minutes to index
            regex = any_json(check_whitespace_pattern(whitespace), 2, "object")
        elif spec.kind == "regex":
            check_python_regex(spec.value, "guided regex")
            regex = ascii_shorthands(spec.value)
        elif spec.kind == "choice":
            if not spec.choices:
                raise ValueError("guided choice needs at least one choice")
            regex = "(?:" + "|".join(escape_literal(c) for c in spec.choices) + ")"
        else:
            raise ValueError(f"the outlines backend does not support {spec.kind!r} constraints")
        return OutlinesCompiled(self._index(regex, spec.kind), regex, self.table.eos_token_id)

    def _index(self, regex: str, kind: str) -> Any:
        from outlines_core import Index

        try:
            return Index(regex, self.vocabulary)
        except (ValueError, RuntimeError) as e:
            text = str(e)
            if "DFA" in text or "NFA" in text or "regex" in text.lower():
                raise UnsupportedFeatureError(
                    f"the {kind} constraint needs regex features outlines-core cannot compile "
                    f"(look-around, back-references, ...): {text}"
                ) from None
            raise UnsupportedFeatureError(
                f"outlines-core cannot enforce the {kind} constraint: {text}"
            ) from None

    def new_grammar(self, compiled: OutlinesCompiled) -> OutlinesGrammar:
        return OutlinesGrammar(compiled, self.unpacker)


class OutlinesGrammar(Grammar):
    """One request's position in an OutlinesCompiled automaton."""

    def __init__(self, compiled: OutlinesCompiled, unpacker: BitmaskUnpacker) -> None:
        from outlines_core import Guide

        self.compiled = compiled
        self._guide = Guide(compiled.index, _MAX_ROLLBACK)
        self._unpacker = unpacker  # shared scratch buffers of the backend
        self._packed = torch.zeros(unpacker.words, dtype=torch.int32)  # (ceil(vocab / 32),)
        self._steps = 0  # tokens accepted, EOS included
        self._terminated = False

    def fill_mask(self, mask: torch.Tensor) -> None:
        if self._terminated:
            mask[self.compiled.eos_token_id] = True
            return
        self._guide.write_mask_into(self._packed.data_ptr(), self._packed.numel(), 4)
        self._unpacker.fill(self._packed, mask)

    def accept_token(self, token_id: int) -> bool:
        if self._terminated:
            return False
        if token_id == self.compiled.eos_token_id:
            if not self._guide.is_finished():
                return False
            self._terminated = True
        else:
            if not 0 <= token_id < self._unpacker.vocab_size:
                return False
            if not self._guide.accepts_tokens([token_id]):
                return False
            self._guide.advance(token_id, return_tokens=False)
        self._steps += 1
        return True

    def rollback(self, num_tokens: int) -> None:
        if num_tokens < 0 or num_tokens > self._steps:
            raise ValueError(f"cannot roll back {num_tokens} tokens ({self._steps} accepted)")
        self._steps -= num_tokens
        if num_tokens and self._terminated:
            self._terminated = False
            num_tokens -= 1
        if num_tokens:
            self._guide.rollback_state(num_tokens)

    def is_terminated(self) -> bool:
        if self._terminated:
            return True
        return self._guide.is_finished() and self.compiled.ends_here(self._guide.get_state())
