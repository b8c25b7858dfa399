"""Packed int32 token bitmasks (bit i of word i // 32 = token i allowed) -> bool masks.

outlines-core, xgrammar and lm-format-enforcer (bitmask mode) produce packed bitmasks; the
Grammar interface hands out a (vocab_size,) bool row. Unpacking uses numpy's single-threaded
``unpackbits`` (about 10 us at vocab 49k): small elementwise torch ops pay thread-pool costs that
dominate at this size on a busy CPU. Never a Python loop over the vocabulary.
"""

from __future__ import annotations

import numpy as np
import torch


def bitmask_words(vocab_size: int) -> int:
    """Number of int32 words that cover ``vocab_size`` bits."""
    return (vocab_size + 31) // 32


class BitmaskUnpacker:
    """Unpacks packed masks of ``vocab_size`` bits (CPU int32 tensors of ``words`` words)."""

    def __init__(self, vocab_size: int) -> None:
        self.vocab_size = vocab_size
        self.words = bitmask_words(vocab_size)

    def unpack(self, packed: torch.Tensor) -> np.ndarray:
        """(words,) int32 -> (vocab_size,) bool array (fresh)."""
        raw = packed.numpy().astype("<i4", copy=False).view(np.uint8)  # little-endian bytes
        bits = np.unpackbits(raw, bitorder="little")[: self.vocab_size]  # token order
        return bits.view(np.bool_)

    def fill(self, packed: torch.Tensor, mask: torch.Tensor) -> None:
        """OR the unpacked ``packed`` into ``mask`` ((vocab_size,) bool, any device)."""
        bits = self.unpack(packed)
        if mask.device.type == "cpu":
            view = mask.numpy()  # shares memory with the mask row
            np.logical_or(view, bits, out=view)
        else:
            mask.logical_or_(torch.from_numpy(bits).to(mask.device))
