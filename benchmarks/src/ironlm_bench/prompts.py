"""Benchmark prompts as token ids: seeded random ids of a fixed length, or a prompts file.

Random ids skip the tokenizer's special tokens, so no prompt holds an EOS or a chat marker.
Every engine gets the same ids, so prompt lengths are exact and identical across engines.
"""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any


def load_tokenizer(model: str, tokenizer: str | None = None) -> Any:
    """The tokenizer of an HF folder (or ``tokenizer``), or of a GGUF file through ironlm."""
    from ironlm.model_loader import resolve_model

    return resolve_model(model, False).load_tokenizer(tokenizer)


def random_token_prompts(
    num_prompts: int, input_len: int, tokenizer: Any, seed: int
) -> list[list[int]]:
    """``num_prompts`` lists of ``input_len`` ids drawn uniformly from the ordinary vocabulary."""
    if num_prompts < 1 or input_len < 1:
        raise ValueError("num_prompts and input_len must be at least 1")
    special = set(tokenizer.all_special_ids)
    vocab = [i for i in range(len(tokenizer)) if i not in special]
    rng = random.Random(seed)
    return [[rng.choice(vocab) for _ in range(input_len)] for _ in range(num_prompts)]


def file_prompts(path: str | Path, num_prompts: int | None, tokenizer: Any) -> list[list[int]]:
    """One prompt per non-empty line of a text file, tokenized; cycled up to ``num_prompts``."""
    lines = [ln.strip() for ln in Path(path).read_text(encoding="utf-8").splitlines()]
    texts = [ln for ln in lines if ln]
    if not texts:
        raise ValueError(f"{path}: no prompts (one prompt per non-empty line)")
    count = num_prompts or len(texts)
    return [tokenizer(texts[i % len(texts)]).input_ids for i in range(count)]


def prompts_text(prompts: list[list[int]], tokenizer: Any) -> list[str]:
    """The prompts decoded back to text, for servers that take text only."""
    return [tokenizer.decode(p) for p in prompts]
