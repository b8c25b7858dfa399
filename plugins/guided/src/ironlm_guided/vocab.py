"""TokenTable: the exact bytes each token id appends to the text, built once per backend.

Character-level and byte-level matchers (outlines-core, lm-format-enforcer) need every token's
surface form. ``tokenizer.decode([id])`` is wrong for that (it drops the leading space of
SentencePiece pieces and turns partial UTF-8 sequences into U+FFFD), so the table reads the
tokenizer's decoder kind and maps pieces to bytes the way the decoder does:

- byte-level BPE (GPT-2, Llama 3, SmolLM, Qwen): each char of a piece is one byte through the
  GPT-2 bytes<->unicode table;
- SentencePiece-style (Llama 2, Mistral, Gemma): "▁" is a space, "<0xAB>" is byte 0xAB;
- anything else: the difference of decoding with and without the piece after an anchor token.

Special tokens (chat markers, padding, EOS) have no bytes here: a grammar never emits them as
text. Ids in ``[len(tokenizer), vocab_size)`` (logits padding) have none either.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

_SPIECE_SPACE = "\u2581"


def _gpt2_unicode_to_byte() -> dict[str, int]:
    """Inverse of GPT-2's bytes_to_unicode: printable bytes map to themselves, the rest to
    code points from 256 upwards, in byte order."""
    printable = (
        list(range(ord("!"), ord("~") + 1))
        + list(range(ord("\u00a1"), ord("\u00ac") + 1))
        + list(range(ord("\u00ae"), ord("\u00ff") + 1))
    )
    table: dict[str, int] = {chr(b): b for b in printable}
    extra = 0
    for b in range(256):
        if b not in printable:
            table[chr(256 + extra)] = b
            extra += 1
    return table


def _decoder_kind(tokenizer: Any) -> str:
    """"byte_level", "sentencepiece" or "other", read from the fast tokenizer's decoder."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is None:
        return "other"
    decoder = json.loads(backend.to_str()).get("decoder") or {}
    parts = decoder.get("decoders", [decoder]) if decoder.get("type") == "Sequence" else [decoder]
    types = {p.get("type") for p in parts}
    if "ByteLevel" in types:
        return "byte_level"
    replaces_space = any(
        p.get("type") == "Replace" and p.get("pattern", {}).get("String") == _SPIECE_SPACE
        for p in parts
    )
    if "Metaspace" in types or "ByteFallback" in types or replaces_space:
        return "sentencepiece"
    return "other"


@dataclass(frozen=True)
class TokenTable:
    """Per-id token bytes (None: never emitted as text) plus the ids a sampler must know."""

    token_bytes: tuple[bytes | None, ...]  # indexed by token id, length vocab_size
    eos_token_id: int
    special_ids: frozenset[int]
    vocab_size: int  # the model's logits width

    @classmethod
    def from_tokenizer(cls, tokenizer: Any, vocab_size: int) -> TokenTable:
        eos = tokenizer.eos_token_id
        if eos is None:
            raise ValueError("the tokenizer has no eos_token_id; guided decoding needs one")
        special: set[int] = set(tokenizer.all_special_ids)
        added: dict[int, Any] = dict(getattr(tokenizer, "added_tokens_decoder", {}) or {})
        special.update(i for i, tok in added.items() if getattr(tok, "special", False))
        kind = _decoder_kind(tokenizer)
        n = min(len(tokenizer), vocab_size)
        pieces: list[str | None] = list(tokenizer.convert_ids_to_tokens(list(range(n))))
        table: list[bytes | None] = [None] * vocab_size
        to_byte = _gpt2_unicode_to_byte() if kind == "byte_level" else {}
        anchor = _anchor_id(tokenizer, special) if kind == "other" else -1
        for i, piece in enumerate(pieces):
            if i in special or piece is None:
                continue
            if i in added:  # a non-special added token is literal text
                table[i] = str(getattr(added[i], "content", piece)).encode("utf-8")
            elif kind == "byte_level":
                table[i] = _byte_level_bytes(piece, to_byte)
            elif kind == "sentencepiece":
                table[i] = _sentencepiece_bytes(piece)
            else:
                table[i] = _decoded_bytes(tokenizer, anchor, i)
        return cls(tuple(table), int(eos), frozenset(special), vocab_size)

    def text_of(self, ids: list[int]) -> bytes:
        """Concatenated bytes of ``ids`` (special ids contribute nothing)."""
        return b"".join(self.token_bytes[i] or b"" for i in ids)


def _byte_level_bytes(piece: str, to_byte: dict[str, int]) -> bytes:
    try:
        return bytes(to_byte[c] for c in piece)
    except KeyError:  # not a byte-level piece after all: take it literally
        return piece.encode("utf-8")


def _sentencepiece_bytes(piece: str) -> bytes:
    if len(piece) == 6 and piece.startswith("<0x") and piece.endswith(">"):
        try:
            return bytes([int(piece[3:5], 16)])
        except ValueError:
            pass
    return piece.replace(_SPIECE_SPACE, " ").encode("utf-8")


def _anchor_id(tokenizer: Any, special: set[int]) -> int:
    ids = [i for i in tokenizer.encode("a", add_special_tokens=False) if i not in special]
    return ids[-1] if ids else 0


def _decoded_bytes(tokenizer: Any, anchor: int, token_id: int) -> bytes:
    """Fallback: what decoding ``token_id`` after an anchor adds (keeps leading spaces)."""
    base = tokenizer.decode([anchor], clean_up_tokenization_spaces=False)
    both = tokenizer.decode([anchor, token_id], clean_up_tokenization_spaces=False)
    return both[len(base) :].encode("utf-8") if both.startswith(base) else both.encode("utf-8")
