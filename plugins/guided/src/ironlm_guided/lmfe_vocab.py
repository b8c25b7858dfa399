"""The token vocabularies lm-format-enforcer works over, built once per backend instance.

Two flavours: "full" (regex / choice) holds every token that is whole UTF-8 text; "json" the
same without tokens holding control characters or backslashes, so JSON strings are plain text
(raw control characters are invalid JSON, and escapes make the library count lengths wrongly).
Tokens carrying part of a UTF-8 character are left out of both (the library counts their
characters wrongly), and so are tokens with a character that starts no token: the library's
alphabet is the set of first characters, and its free-text path derails on anything else.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from ironlm.interfaces.guided import UnsupportedFeatureError
from ironlm_guided.bitmask import bitmask_words
from ironlm_guided.vocab import TokenTable


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
                raise UnsupportedFeatureError(
                    f"the {what} {text!r} cannot be spelled with the tokens the "
                    "'lm-format-enforcer' backend can use (whole UTF-8 characters only)"
                )


def build_vocabulary(table: TokenTable, flavour: str, vocab_size: int) -> LmfeVocabulary:
    """The ``flavour`` ("full" or "json") vocabulary over ``table``."""
    from lmformatenforcer import TokenEnforcerTokenizerData
    from lmformatenforcer.characterlevelparser import CharacterLevelParserConfig

    texts: dict[int, str] = {}
    for token_id, raw in enumerate(table.token_bytes):
        if not raw or token_id == table.eos_token_id:
            continue
        if flavour == "json" and (b"\\" in raw or any(b < 0x20 for b in raw)):
            continue
        try:
            texts[token_id] = raw.decode("utf-8")
        except UnicodeDecodeError:  # part of a character
            continue
    while True:  # drop tokens with a character outside the alphabet, to a fixpoint
        alphabet = {text[0] for text in texts.values()}
        outside = [i for i, text in texts.items() if not set(text) <= alphabet]
        if not outside:
            break
        for token_id in outside:
            del texts[token_id]
    led = np.zeros(bitmask_words(vocab_size) * 32, dtype=np.bool_)
    for token_id, text in texts.items():
        led[token_id] = text[0].isspace()

    def decode(ids: list[int]) -> str:
        return table.text_of(ids).decode("utf-8", "replace")

    data = TokenEnforcerTokenizerData(
        [(i, t, True) for i, t in texts.items()], decode, table.eos_token_id, True, vocab_size
    )
    return LmfeVocabulary(
        data=data,
        config=CharacterLevelParserConfig(alphabet=data.tokenizer_alphabet),
        whitespace_led=np.packbits(led, bitorder="little").view("<i4").astype(np.int32),
        texts=frozenset(texts.values()),
        longest=max(map(len, texts.values()), default=1),
    )
