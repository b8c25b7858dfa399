"""Input processing: prompt -> validated token ids and a per-request copy of the params."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Union

import torch

from ironlm.engine.prompt_embeds import PLACEHOLDER_ID, checked_embeds
from ironlm.sampling_params import SamplingParams, check_truncate_value

# A prompt: text, token ids, or vLLM's dict forms {"prompt": ...} / {"prompt_token_ids": ...} /
# {"prompt_embeds": (num_tokens, hidden_size) tensor} (with enable_prompt_embeds).
PromptType = Union[str, list[int], dict[str, Any]]


@dataclass
class ProcessedPrompt:
    prompt: str | None
    # the prompt's token ids; for an embedded prompt one PLACEHOLDER_ID per row
    token_ids: list[int]
    cache_salt: str | None = None  # the prompt dict's (vLLM's TextPrompt / TokensPrompt key)
    embeds: torch.Tensor | None = None  # (num_tokens, hidden_size) float32: prompt_embeds

    @property
    def output_token_ids(self) -> list[int] | None:
        """The prompt's ids as outputs report them: None for an embedded prompt (vLLM's)."""
        return None if self.embeds is not None else self.token_ids


def output_room(max_tokens: int | None, pooling: bool = False) -> int:
    """Positions a request's output needs beside its prompt: none for an embedding, at least
    one (the first token) for a generation."""
    return 0 if pooling else max(1, max_tokens or 1)


def check_truncation(
    truncate_prompt_tokens: int | None, max_model_len: int, room: int = 0
) -> int | None:
    """The prompt tokens to keep (the last ones; None: all): -1 is what the context leaves
    beside ``room`` output positions (vLLM's max_input_tokens); a truncation longer than the
    model is refused (ValueError naming the field), and so is a value out of vLLM's range."""
    check_truncate_value(truncate_prompt_tokens)
    if truncate_prompt_tokens == -1:
        if room >= max_model_len:
            raise ValueError(
                f"max_tokens ({room}) leaves no room in max_model_len ({max_model_len}) for a "
                "prompt truncated with truncate_prompt_tokens -1; request fewer tokens"
            )
        return max_model_len - room
    if truncate_prompt_tokens is not None and truncate_prompt_tokens > max_model_len:
        raise ValueError(
            f"truncate_prompt_tokens value ({truncate_prompt_tokens}) is greater than "
            f"max_model_len ({max_model_len}). Please, select a smaller truncation size."
        )
    return truncate_prompt_tokens


class InputProcessor:
    def __init__(
        self, tokenizer: Any, vocab_size: int, max_model_len: int, max_logprobs: int,
        hidden_size: int | None = None,  # set when prompt_embeds are enabled
    ) -> None:  # fmt: skip
        self.tokenizer = tokenizer
        self.vocab_size = vocab_size
        self.max_model_len = max_model_len
        self.max_logprobs = max_logprobs
        self.embeds_hidden_size = hidden_size

    def process(
        self, prompt: PromptType, params: SamplingParams, add_special_tokens: bool = True,
        pooling: bool = False,
    ) -> ProcessedPrompt:
        """Token ids of ``prompt``, checked. A pooling (embedding) prompt may fill the whole
        context; a generating one leaves a position for its first token."""
        text: str | None
        salt = prompt.get("cache_salt") if isinstance(prompt, dict) else None
        if salt is not None and (not isinstance(salt, str) or not salt):
            raise ValueError("cache_salt must be a non-empty string if provided")
        embeds = None
        if isinstance(prompt, dict) and "prompt_embeds" in prompt:
            embeds = self._embeds(prompt["prompt_embeds"], params)
            text, ids = prompt.get("prompt"), [PLACEHOLDER_ID] * len(embeds)
        elif isinstance(prompt, dict):
            if "prompt_token_ids" in prompt:
                text, ids = prompt.get("prompt"), list(prompt["prompt_token_ids"])
            elif "prompt" in prompt:
                text, ids = prompt["prompt"], None
            else:
                raise ValueError(
                    "prompt dict needs 'prompt', 'prompt_token_ids' or 'prompt_embeds'")
        elif isinstance(prompt, str):
            text, ids = prompt, None
        elif isinstance(prompt, (list, tuple)):
            text, ids = None, list(prompt)
        else:
            raise ValueError(f"prompt must be a string or a list of token ids, got {type(prompt)}")
        if ids is None:
            if not isinstance(text, str):
                raise ValueError("prompt must be a string")
            if self.tokenizer is None:
                raise ValueError("You cannot pass text prompts when `skip_tokenizer_init` is "
                                 "True: give the prompt as token ids")
            ids = self.tokenizer(text, add_special_tokens=add_special_tokens).input_ids
        if not all(isinstance(t, int) and not isinstance(t, bool) for t in ids):
            raise ValueError("prompt token ids must be integers")
        keep = check_truncation(params.truncate_prompt_tokens, self.max_model_len,
                                output_room(params.max_tokens, pooling))
        if keep is not None:
            ids = ids[-keep:]
            embeds = embeds[-keep:] if embeds is not None else None
        if not ids:
            raise ValueError("The decoder prompt cannot be empty (prompt has 0 tokens)")
        bad = [t for t in ids if not 0 <= t < self.vocab_size]
        if bad:
            raise ValueError(
                f"Token id {bad[0]} is out of vocabulary (vocabulary size {self.vocab_size})"
            )
        if len(ids) > self.max_model_len - (0 if pooling else 1):
            raise ValueError(
                f"The decoder prompt (length {len(ids)}) is longer than the maximum model "
                f"length of {self.max_model_len}. Make sure that `max_model_len` is no smaller "
                "than the number of text tokens plus one generated token."
            )
        params.verify(self.vocab_size, self.max_logprobs)
        if self.tokenizer is None:
            _check_tokenizer_free(params)
        if params.bad_words:
            params._bad_words_token_ids = self._bad_word_ids(params.bad_words)
        return ProcessedPrompt(text, ids, salt, embeds)

    def _embeds(self, embeds: object, params: SamplingParams) -> torch.Tensor:
        """An embedded prompt's rows, checked; what needs the prompt's token ids is refused."""
        if self.embeds_hidden_size is None:
            raise ValueError("You must set `--enable-prompt-embeds` to input `prompt_embeds`.")
        if params.prompt_logprobs is not None:
            raise ValueError("prompt_logprobs needs the prompt's token ids: it cannot be used "
                             "with prompt_embeds")
        return checked_embeds(embeds, self.embeds_hidden_size)

    def _bad_word_ids(self, words: list[str]) -> list[list[int]]:
        """Each bad word as token ids, with and without a leading space (as vLLM does)."""
        out: list[list[int]] = []
        for word in words:
            for variant in (word.lstrip(), " " + word.lstrip()):
                ids = self.tokenizer(variant, add_special_tokens=False).input_ids
                if ids and ids not in out:
                    out.append(ids)
        return out


def _check_tokenizer_free(params: SamplingParams) -> None:
    """With skip_tokenizer_init, the sampling fields that need the tokenizer are refused."""
    needs = [name for name, given in (
        ("stop", params.stop), ("bad_words", params.bad_words),
        ("guided_decoding", params.guided_decoding),
    ) if given]  # fmt: skip
    if needs:
        raise ValueError(f"{needs[0]} needs the tokenizer, and `skip_tokenizer_init` is True")
