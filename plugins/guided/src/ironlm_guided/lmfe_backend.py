"""The ``lm-format-enforcer`` backend: character-level parsers over a token prefix tree.

The tokenizer data (prefix tree of every token's text) is built once per backend instance, in
two flavours: for regex / choice every token that is whole UTF-8 text, and for JSON the same
without tokens holding control characters or backslashes (see ``lmfe_schema``). Tokens carrying
part of a UTF-8 character are left out of both: the library counts their characters wrongly.
Each request gets its own ``TokenEnforcer`` (lm-format-enforcer keys its states by the generated
token sequence); masks come as packed bitmasks from the library's bitmask mode, corrected for
what ``JsonLexGuard`` cannot veto through the library's free-text shortcut.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from typing import Any, Callable, ClassVar

import numpy as np
import torch

from ironlm.interfaces.guided import Grammar, GuidedBackend, GuidedSpec
from ironlm.interfaces.platform import Availability
from ironlm_guided.bitmask import BitmaskUnpacker
from ironlm_guided.regex_check import check_python_regex, escape_literal
from ironlm_guided.schema_normalize import normalize_schema
from ironlm_guided.vocab import TokenTable

_PRUNE_AFTER = 256  # token-sequence states kept per request; older ones are replayed if needed


@dataclass(frozen=True)
class LmfeVocabulary:
    """One flavour of tokenizer data, plus the packed mask of its whitespace-led tokens."""

    data: Any  # lmformatenforcer.TokenEnforcerTokenizerData
    config: Any  # lmformatenforcer CharacterLevelParserConfig with this vocabulary's alphabet
    whitespace_led: np.ndarray  # (words,) int32: tokens whose text starts with whitespace
    texts: frozenset[str]  # every token text of the vocabulary
    longest: int  # characters in the longest token text

    def spells(self, text: str) -> bool:
        """Whether ``text`` is a concatenation of token texts (so it can be generated)."""
        reachable = [True] + [False] * len(text)
        for start in range(len(text)):
            if reachable[start]:
                for end in range(start + 1, min(len(text), start + self.longest) + 1):
                    if text[start:end] in self.texts:
                        reachable[end] = True
        return reachable[-1]

    def check_spellable(self, texts: list[str], what: str) -> None:
        for text in texts:
            if not self.spells(text):
                raise ValueError(
                    f"the {what} {text!r} cannot be spelled with the tokens the "
                    "'lm-format-enforcer' backend can use (whole UTF-8 characters only)"
                )


@dataclass(frozen=True)
class LmfeCompiled:
    """A compiled spec: how to build a fresh root parser, and which vocabulary it uses."""

    make_parser: Callable[[], Any]  # () -> lmformatenforcer.CharacterLevelParser
    vocabulary: LmfeVocabulary
    eos_token_id: int


class LMFormatEnforcerBackend(GuidedBackend):
    name: ClassVar[str] = "lm-format-enforcer"
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
            from lmformatenforcer import TokenEnforcerTokenizerData
            from lmformatenforcer.characterlevelparser import CharacterLevelParserConfig

            texts: dict[int, str] = {}
            for token_id, raw in enumerate(self.table.token_bytes):
                if not raw or token_id == self.table.eos_token_id:
                    continue
                if flavour == "json" and (b"\\" in raw or any(b < 0x20 for b in raw)):
                    continue
                try:
                    texts[token_id] = raw.decode("utf-8")
                except UnicodeDecodeError:  # part of a character
                    continue
            # The library's alphabet is the set of first characters; a token holding any other
            # character derails its free-text path, so such tokens are dropped (to a fixpoint).
            while True:
                alphabet = {text[0] for text in texts.values()}
                outside = [i for i, text in texts.items() if not set(text) <= alphabet]
                if not outside:
                    break
                for token_id in outside:
                    del texts[token_id]
            led = np.zeros(self.unpacker.words * 32, dtype=np.bool_)
            for token_id, text in texts.items():
                led[token_id] = text[0].isspace()
            data = TokenEnforcerTokenizerData(
                [(i, t, True) for i, t in texts.items()], self._decode,
                self.table.eos_token_id, True, self.vocab_size,
            )
            config = CharacterLevelParserConfig(alphabet=data.tokenizer_alphabet)
            packed = np.packbits(led, bitorder="little").view("<i4").astype(np.int32)
            self._vocabularies[flavour] = LmfeVocabulary(
                data, config, packed, frozenset(texts.values()),
                max(map(len, texts.values()), default=1),
            )
        return self._vocabularies[flavour]

    def _decode(self, ids: list[int]) -> str:
        return self.table.text_of(ids).decode("utf-8", "replace")

    def compile(self, spec: GuidedSpec) -> LmfeCompiled:
        from lmformatenforcer import JsonSchemaParser, RegexParser

        from ironlm_guided.lmfe_schema import (
            LMFE_SUPPORT,
            JsonLexGuard,
            literal_strings,
            lmfe_schema,
        )

        if spec.whitespace_pattern is not None:
            raise ValueError(
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
            make = lambda: JsonLexGuard(JsonSchemaParser(schema, config), config)  # noqa: E731
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
                raise ValueError(
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
            raise ValueError(f"lm-format-enforcer cannot parse the {spec.kind}: {e}") from None
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
