"""Calibration token sequences for the offline algorithms, bounded in size.

Either a token-ids file (one sequence per line, ids separated by commas and/or spaces; blank
lines are skipped) or the built-in text sample shipped with the package (``calibration.txt``:
prose, dialogue, instructions, code, in several registers), tokenized and cut into sequences.
At most ``max_tokens`` tokens in sequences of at most ``seq_len``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

import torch

DEFAULT_SEQ_LEN = 512
DEFAULT_MAX_TOKENS = 4096
_SEPARATORS = re.compile(r"[,\s]+")


@dataclass(frozen=True)
class Calibration:
    """Sequences as one flat id tensor with their lengths (each sequence causal on its own)."""

    ids: torch.Tensor  # (total_tokens,) int64
    lengths: list[int]
    source: str  # for messages: the file, or "built-in text"

    @property
    def num_tokens(self) -> int:
        return int(self.ids.numel())


def builtin_text() -> str:
    return resources.files("ironlm.quantization.offline").joinpath("calibration.txt").read_text(
        encoding="utf-8"
    )


def from_text(
    tokenizer: Any, text: str, seq_len: int = DEFAULT_SEQ_LEN,
    max_tokens: int = DEFAULT_MAX_TOKENS,
) -> Calibration:  # fmt: skip
    ids: list[int] = tokenizer(text, add_special_tokens=False).input_ids[:max_tokens]
    sequences = [ids[i : i + seq_len] for i in range(0, len(ids), seq_len)]
    return _calibration([s for s in sequences if len(s) > 1], "built-in text")


def from_token_ids_file(
    path: Path, vocab_size: int, seq_len: int = DEFAULT_SEQ_LEN,
    max_tokens: int = DEFAULT_MAX_TOKENS,
) -> Calibration:  # fmt: skip
    """Read, check and bound a token-ids file. ValueError naming the file and line for a
    token that is not an integer or lies outside [0, vocab_size)."""
    if not path.is_file():
        raise ValueError(f"token ids file {path} does not exist")
    sequences: list[list[int]] = []
    total = 0
    with path.open(encoding="utf-8") as fh:
        for line_no, line in enumerate(fh, start=1):
            fields = [f for f in _SEPARATORS.split(line.strip()) if f]
            if not fields:
                continue
            ids = [_token_id(f, path, line_no, vocab_size) for f in fields]
            if total >= max_tokens:
                continue  # the rest is still checked, not used
            ids = ids[: min(seq_len, max_tokens - total)]
            sequences.append(ids)
            total += len(ids)
    if not sequences:
        raise ValueError(f"token ids file {path} holds no token ids")
    return _calibration(sequences, str(path))


def _token_id(field: str, path: Path, line_no: int, vocab_size: int) -> int:
    try:
        value = int(field)
    except ValueError:
        raise ValueError(f"{path}:{line_no}: {field!r} is not a token id (an integer)") from None
    if not 0 <= value < vocab_size:
        raise ValueError(
            f"{path}:{line_no}: token id {value} is outside the vocabulary (0..{vocab_size - 1})"
        )
    return value


def _calibration(sequences: list[list[int]], source: str) -> Calibration:
    flat = [t for s in sequences for t in s]
    return Calibration(torch.tensor(flat, dtype=torch.int64), [len(s) for s in sequences], source)
