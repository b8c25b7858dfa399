"""Scores of text pairs from an embedding model: vLLM's bi-encoder ``score`` and ``rerank``.

Each text is embedded on its own (the mean-pooled last hidden state, as ``encode`` and
``/v1/embeddings`` give it) and a pair scores the cosine of its two embeddings. Pairs form as
vLLM forms them: one first text against every second (1:N), or the i-th against the i-th (N:N).
A cross-encoder (a one-label sequence classifier reading both texts at once) scores the pair
as one prompt: ``cross_encoder_ids`` is the token ids it reads.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
import torch.nn.functional as F


def pair_indices(n_first: int, n_second: int) -> list[tuple[int, int]]:
    """(first index, second index) of each pair; ValueError with vLLM's messages when the
    counts are not 1:1, 1:N or N:N."""
    if n_first > 1 and n_first != n_second:
        raise ValueError("Input lengths must be either 1:1, 1:N or N:N")
    if n_first == 0:
        raise ValueError("At least one text element must be given")
    if n_second == 0:
        raise ValueError("At least one text_pair element must be given")
    return [(0 if n_first == 1 else i, i) for i in range(n_second)]


def cosine(first: Sequence[float], second: Sequence[float]) -> float:
    """Cosine similarity of two embeddings (float32; torch's eps for a zero vector)."""
    a = torch.as_tensor(first, dtype=torch.float32)
    b = torch.as_tensor(second, dtype=torch.float32)
    return float(F.cosine_similarity(a, b, dim=0))


def pair_token_ids(first: list[int], second: list[int], pad_token_id: int | None) -> list[int]:
    """The token ids a pair is counted by: vLLM joins the two prompts with the pad token."""
    return first + ([] if pad_token_id is None else [pad_token_id]) + second


def cross_encoder_ids(tokenizer: Any, first: str, second: str, keep: int | None) -> list[int]:
    """The pair as a cross-encoder reads it: the tokenizer's pair encoding (its special
    tokens, ``text_pair``); with ``keep``, at most that many tokens, cut as the tokenizer
    cuts a pair (the longer text first, so both stay), as vLLM truncates a pair."""
    cut: dict[str, Any] = {} if keep is None else {"truncation": True, "max_length": keep}
    try:
        return list(tokenizer(first, text_pair=second, **cut)["input_ids"])
    except Exception as exc:  # noqa: BLE001 (a fast tokenizer raises a bare Exception)
        if keep is None:
            raise
        raise ValueError(f"truncate_prompt_tokens {keep} cannot hold the pair: {exc}") from None
