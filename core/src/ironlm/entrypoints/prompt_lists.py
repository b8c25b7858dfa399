"""The offline API's per-call arguments spread over a batch of prompts."""

from __future__ import annotations

from collections.abc import Sequence

from ironlm.engine.input_processor import PromptType
from ironlm.lora.request import LoRARequest


def as_prompt_list(prompts: PromptType | Sequence[PromptType]) -> list[PromptType]:
    """One prompt (a string, a prompt dict, a token-id list) or several -> a list of them."""
    if isinstance(prompts, (str, dict)):
        return [prompts]
    if isinstance(prompts, (list, tuple)) and prompts and isinstance(prompts[0], int):
        return [list(prompts)]  # one token-id prompt
    return list(prompts)


def per_prompt_lora(
    lora: LoRARequest | Sequence[LoRARequest | None] | None, n: int
) -> list[LoRARequest | None]:
    """One adapter (or None) for every prompt, or one per prompt."""
    if lora is None or isinstance(lora, LoRARequest):
        return [lora] * n
    if len(lora) != n:
        raise ValueError(f"got {len(lora)} LoRA requests for {n} prompts")
    return list(lora)
