"""Fill-in-the-middle prompts for ``suffix`` (completions): the prompt is the text before the
gap, ``suffix`` the text after it, and the model writes the middle.

Works for tokenizers that carry one of the known FIM token families (prefix-suffix-middle
order, as the models were trained); any other model gets a 400 naming it.
"""

from __future__ import annotations

from typing import Any

from ironlm.entrypoints.openai.errors import APIError

# (prefix, suffix, middle) marker tokens of the families known here, in PSM order.
FIM_FAMILIES: tuple[tuple[str, str, str], ...] = (
    ("<fim_prefix>", "<fim_suffix>", "<fim_middle>"),  # StarCoder, SantaCoder, SmolLM
    ("<|fim_prefix|>", "<|fim_suffix|>", "<|fim_middle|>"),  # Qwen2.5-Coder, Gemma-style
    ("▁<PRE>", "▁<SUF>", "▁<MID>"),  # Code Llama
    ("<｜fim▁begin｜>", "<｜fim▁hole｜>", "<｜fim▁end｜>"),  # DeepSeek-Coder
)


def fim_token_ids(tokenizer: Any, vocab_size: int) -> tuple[int, int, int] | None:
    """The (prefix, suffix, middle) token ids of the tokenizer's FIM family, if it has one
    whose ids the model can read."""
    vocab = tokenizer.get_vocab()
    for family in FIM_FAMILIES:
        ids = [vocab.get(tok) for tok in family]
        if all(i is not None and 0 <= i < vocab_size for i in ids):
            return ids[0], ids[1], ids[2]  # type: ignore[return-value]
    return None


def fim_prompt(tokenizer: Any, vocab_size: int, model_name: str, prefix: str | list[int],
               suffix: str, add_special_tokens: bool) -> list[int]:
    """Token ids of the FIM prompt ``<prefix>P<suffix>S<middle>``; 400 when the model has no
    FIM tokens (naming it) or the prompt is not text."""
    ids = fim_token_ids(tokenizer, vocab_size)
    if ids is None:
        raise APIError(
            f"suffix is not supported by the model {model_name!r}: its tokenizer has no "
            "fill-in-the-middle tokens (e.g. <fim_prefix>, <fim_suffix>, <fim_middle>)",
            400, param="suffix",
        )
    if not isinstance(prefix, str):
        raise APIError("suffix needs a text prompt (not token ids)", 400, param="suffix")
    pre, suf, mid = ids
    bos = [tokenizer.bos_token_id] if add_special_tokens and tokenizer.bos_token_id is not None \
        and tokenizer.bos_token_id < vocab_size else []
    text = tokenizer(prefix, add_special_tokens=False).input_ids
    after = tokenizer(suffix, add_special_tokens=False).input_ids
    return [*bos, pre, *text, suf, *after, mid]
