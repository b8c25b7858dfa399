"""Packed int32 token bitmasks (bit i of word i // 32 = token i allowed) -> bool masks.

outlines-core and xgrammar write packed bitmasks; the Grammar interface hands out a (vocab_size,)
bool row. Unpacking is a handful of vectorised ops, never a Python loop over the vocabulary.
"""

from __future__ import annotations

import torch


def bitmask_words(vocab_size: int) -> int:
    """Number of int32 words that cover ``vocab_size`` bits."""
    return (vocab_size + 31) // 32


class BitmaskUnpacker:
    """Reusable buffers for unpacking one packed mask of ``vocab_size`` bits on the CPU."""

    def __init__(self, vocab_size: int) -> None:
        self.vocab_size = vocab_size
        self.words = bitmask_words(vocab_size)
        self._shifts = torch.arange(32, dtype=torch.int32)  # (32,)
        self._bits = torch.empty((self.words, 32), dtype=torch.int32)  # (words, 32)
        self._bool = torch.empty((self.words, 32), dtype=torch.bool)

    def unpack(self, packed: torch.Tensor) -> torch.Tensor:
        """(words,) int32 -> (vocab_size,) bool view into an internal buffer (valid until the
        next call)."""
        torch.bitwise_right_shift(packed.unsqueeze(1), self._shifts, out=self._bits)
        torch.bitwise_and(self._bits, 1, out=self._bits)
        torch.ne(self._bits, 0, out=self._bool)
        return self._bool.view(-1)[: self.vocab_size]

    def fill(self, packed: torch.Tensor, mask: torch.Tensor) -> None:
        """OR the unpacked ``packed`` into ``mask`` ((vocab_size,) bool, any device)."""
        bits = self.unpack(packed)
        if mask.device != bits.device:
            bits = bits.to(mask.device)
        mask.logical_or_(bits)
