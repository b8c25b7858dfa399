"""The ``lm-format-enforcer`` backend: character-level parsers over a token prefix tree.

The tokenizer data (prefix tree of every token's text) is built once per backend instance, in
two flavours (``lmfe_vocab``): regex / choice, and JSON. Each request gets its own
``TokenEnforcer`` (lm-format-enforcer keys its states by the generated token sequence), sharing
the spec's cache of allowed tokens per parser state; masks come as packed bitmasks from the
library's bitmask mode, corrected for what ``JsonLexGuard`` cannot veto through the library's
free-text shortcut.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Any, Callable, ClassVar

import numpy as np
import torch

from ironlm.interfaces.guided import Grammar, GuidedBackend, GuidedSpec, UnsupportedFeatureError
from ironlm.interfaces.platform import Availability
from ironlm_guided.bitmask import BitmaskUnpacker
from ironlm_guided.lmfe_vocab import LmfeVocabulary, build_vocabulary
from ironlm_guided.regex_check import check_python_regex, escape_literal
from ironlm_guided.schema_normalize import normalize_schema
from ironlm_guided.vocab import TokenTable

_PRUNE_AFTER = 256  # token-sequence states kept per request; older ones are replayed if needed


@dataclass(frozen=True)
class LmfeCompiled:
    """A compiled spec: how to build a fresh root parser, and which vocabulary it uses."""

    make_parser: Callable[[], Any]  # () -> lmformatenforcer.CharacterLevelParser
    vocabulary: LmfeVocabulary
    eos_token_id: int
    # parser cache key -> allowed TokenList, shared by every request on this spec (a memo: a
    # key names one parser state of this spec, e.g. a regex automaton state)
    token_cache: dict[Any, Any] = field(default_factory=dict, compare=False, repr=False)


class LMFormatEnforcerBackend(GuidedBackend):
    name: ClassVar[str] = "lm-format-enforcer"
    priority: ClassVar[int] = 10
    supported_kinds: ClassVar[frozenset[str]] = frozenset(
        {"json", "json_object", "regex", "choice"}
    )

    def __init__(self, tokenizer: Any, vocab_size: int) -> None:
        super().__init__(tokenizer, vocab_size)
        self.table = TokenTable.from_tokenizer(tokenizer, vocab_size)
        self.unpacker = BitmaskUnpacker(vocab_size)
        self._vocabularies: dict[str, LmfeVocabulary] = {}  # "full" / "json"

    @classmethod
    def is_available(cls) -> Availability:
        try:
            import lmformatenforcer  # noqa: F401
        except ImportError as e:
            return Availability.no(
                f"lm-format-enforcer is not installed ({e}); pip install lm-format-enforcer"
            )
        return Availability.yes()

    def vocabulary(self, flavour: str) -> LmfeVocabulary:
        """The prefix-tree tokenizer data, built on first use and kept for the instance."""
        if flavour not in self._vocabularies:
            self._vocabularies[flavour] = build_vocabulary(self.table, flavour, self.vocab_size)
        return self._vocabularies[flavour]

    def compile(self, spec: GuidedSpec) -> LmfeCompiled:
        from lmformatenforcer import JsonSchemaParser, RegexParser

        from ironlm_guided.lmfe_schema import (
            LMFE_SUPPORT,
            JsonLexGuard,
            literal_strings,
            lmfe_schema,
        )

        if spec.whitespace_pattern is not None:
            raise UnsupportedFeatureError(
                "guided_whitespace_pattern is not supported by the 'lm-format-enforcer' backend "
                "(use the 'outlines' backend)"
            )
        make: Callable[[], Any]
        if spec.kind in ("json", "json_object"):
            text = spec.value if spec.kind == "json" else '{"type":"object"}'
            schema = lmfe_schema(normalize_schema(text, LMFE_SUPPORT))
            vocabulary = self.vocabulary("json")
            vocabulary.check_spellable(literal_strings(schema), "JSON schema literal")
            config = vocabulary.config
            compact = spec.disable_any_whitespace
            make = lambda: JsonLexGuard(  # noqa: E731
                JsonSchemaParser(schema, config), config, compact=compact
            )
        elif spec.kind in ("regex", "choice"):
            if spec.kind == "regex":
                check_python_regex(spec.value, "guided regex")
                pattern = spec.value
            elif spec.choices:
                self.vocabulary("full").check_spellable(
                    [c for c in spec.choices if c], "choice"
                )
                pattern = "(?:" + "|".join(escape_literal(c) for c in spec.choices) + ")"
            else:
                raise ValueError("guided choice needs at least one choice")
            vocabulary = self.vocabulary("full")
            config = vocabulary.config
            try:  # parsed once, shared by all requests
                context = RegexParser(pattern, config).context
            except Exception as e:  # interegular raises its own exception types
                raise UnsupportedFeatureError(
                    f"the regex {pattern!r} uses syntax lm-format-enforcer cannot parse "
                    f"(anchors, back-references, ...): {type(e).__name__}: {e}"
                ) from None
            make = lambda: RegexParser(context, config)  # noqa: E731
        else:
            raise ValueError(
                f"the lm-format-enforcer backend does not support {spec.kind!r} constraints"
            )
        try:
            make()  # schema problems surface when the root parser is built
        except Exception as e:
            raise UnsupportedFeatureError(
                f"lm-format-enforcer cannot parse the {spec.kind}: {e}") from None
        return LmfeCompiled(make, vocabulary, self.table.eos_token_id)

    def new_grammar(self, compiled: LmfeCompiled) -> LmfeGrammar:
        return LmfeGrammar(compiled, self.unpacker)


class LmfeGrammar(Grammar):
    """One request: the tokens accepted so far, and the TokenEnforcer that maps them to masks."""

    def __init__(self, compiled: LmfeCompiled, unpacker: BitmaskUnpacker) -> None:
        self.compiled = compiled
        self._unpacker = unpacker
        self._tokens: list[int] = []
        self._terminated = False
        self._kept: deque[tuple[int, ...]] = deque()  # enforcer state keys, oldest first
        self._packed: np.ndarray | None = None  # allowed tokens of the current state
        self._new_enforcer()

    def _new_enforcer(self) -> None:
        from lmformatenforcer import TokenEnforcer

        parser = self.compiled.make_parser()
        self._enforcer = TokenEnforcer(self.compiled.vocabulary.data, parser)
        # the enforcer's own per-instance cache, replaced by the spec-wide one: the library
        # only reads and fills it, and its keys are states of this spec's parser
        self._enforcer.allowed_token_cache = self.compiled.token_cache
        self._kept.clear()

    def _state(self) -> Any:
        """The enforcer's state for the current sequence (computed and cached by the library)."""
        key = tuple(self._tokens)
        states = self._enforcer.prefix_states
        if key not in states:
            if self._tokens and key[:-1] not in states:
                self._replay()  # the previous state was pruned (a long rollback)
            self._enforcer.get_allowed_tokens(self._tokens)
            self._kept.append(key)
            while len(self._kept) > _PRUNE_AFTER:
                states.pop(self._kept.popleft(), None)
        return states[key]

    def _replay(self) -> None:
        self._new_enforcer()
        for n in range(len(self._tokens)):
            self._enforcer.get_allowed_tokens(self._tokens[:n])
            self._kept.append(tuple(self._tokens[:n]))

    def _allowed(self) -> np.ndarray:
        """(words,) int32 packed mask of the current state, corrected: no whitespace-led token
        right after a string's opening quote, and EOS only where the parser can end (the
        library falls back to EOS alone when it fails internally)."""
        if self._packed is None:
            state = self._state()
            packed = state.allowed_tokens.allowed_tokens.numpy().copy()
            parser = state.parser
            if getattr(parser, "string_start", False):
                packed &= ~self.compiled.vocabulary.whitespace_led
            eos = self.compiled.eos_token_id
            if not parser.can_end():
                packed[eos >> 5] &= ~np.int32(np.uint32(1 << (eos & 31)).view(np.int32))
            if not packed.any():
                text = self.compiled.vocabulary.data.decoder(self._tokens)
                raise RuntimeError(
                    f"lm-format-enforcer reached a state with no allowed token after {text!r}"
                )
            self._packed = packed
        return self._packed

    def fill_mask(self, mask: torch.Tensor) -> None:
        if self._terminated:
            mask[self.compiled.eos_token_id] = True
            return
        self._unpacker.fill(torch.from_numpy(self._allowed()), mask)

    def accept_token(self, token_id: int) -> bool:
        if self._terminated or not 0 <= token_id < self._unpacker.vocab_size:
            return False
        if not (int(self._allowed()[token_id >> 5]) >> (token_id & 31)) & 1:
            return False
        if token_id == self.compiled.eos_token_id:
            self._terminated = True
        else:
            self._tokens.append(token_id)
            self._packed = None
        return True

    def rollback(self, num_tokens: int) -> None:
        accepted = len(self._tokens) + self._terminated
        if num_tokens < 0 or num_tokens > accepted:
            raise ValueError(f"cannot roll back {num_tokens} tokens ({accepted} accepted)")
        if num_tokens and self._terminated:
            self._terminated = False
            num_tokens -= 1
        if num_tokens:
            del self._tokens[-num_tokens:]
            self._packed = None

    def is_terminated(self) -> bool:
        if self._terminated:
            return True
        packed = self._allowed()
        eos = self.compiled.eos_token_id
        only = np.zeros_like(packed)
        only[eos >> 5] = np.uint32(1 << (eos & 31)).view(np.int32)
        return bool(np.array_equal(packed, only))
