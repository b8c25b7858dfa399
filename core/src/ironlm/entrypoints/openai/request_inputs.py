"""Request -> engine inputs: tokenized prompts, the context-length check, SamplingParams.

Prompts are tokenized once here (with the front end's own tokenizer) and handed to the engine
as ``{"prompt": text, "prompt_token_ids": ids}``, so the vLLM context-length message can be
given before anything is queued.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any

import torch

from ironlm.engine.input_processor import check_truncation
from ironlm.entrypoints.openai.errors import APIError, from_value_error
from ironlm.entrypoints.openai.protocol import (
    ChatCompletionRequest,
    CompletionRequest,
    EmbeddingRequest,
    GuidedFields,
    SamplingFields,
)
from ironlm.entrypoints.openai.state import ServerState
from ironlm.guided_spec import spec_from_request
from ironlm.interfaces.guided import GuidedSpec
from ironlm.sampling_params import SamplingParams

# Names a ValueError message may start with (they become the error's ``param``).
KNOWN_FIELDS = frozenset(
    {f.name for f in fields(SamplingParams)}
    | set(ChatCompletionRequest.model_fields)
    | set(CompletionRequest.model_fields)
    | set(EmbeddingRequest.model_fields)
)

# Request fields that SamplingParams has under the same name, copied as they are; None means
# "not given" (the SamplingParams default applies). The others are set by sampling_params().
_COPIED_FIELDS = tuple(
    name for name in SamplingFields.model_fields
    if name in {f.name for f in fields(SamplingParams)}
    and name not in ("prompt_logprobs", "guided_decoding_backend")
)


@dataclass
class EnginePrompt:
    text: str | None  # None for token-id prompts
    token_ids: list[int]  # empty for a prompt given as embeddings
    cache_salt: str | None = None  # the request's (its prefix-cache blocks are salted)
    embeds: torch.Tensor | None = None  # (num_tokens, hidden_size): the Completions API's

    @property
    def num_tokens(self) -> int:
        return len(self.token_ids) if self.embeds is None else len(self.embeds)

    def as_engine_prompt(self) -> dict[str, Any]:
        prompt: dict[str, Any] = {"prompt": self.text, "prompt_token_ids": self.token_ids} \
            if self.embeds is None else {"prompt_embeds": self.embeds}
        if self.cache_salt is not None:
            prompt["cache_salt"] = self.cache_salt
        return prompt


def tokenize_prompt(
    tokenizer: Any, prompt: str | list[int], add_special_tokens: bool,
    truncate_prompt_tokens: int | None = None, vocab_size: int | None = None,
    field: str = "prompt", max_model_len: int | None = None, room: int = 0,
) -> EnginePrompt:
    """Token ids of a text or token-id prompt (400 naming ``field`` when it is empty or holds
    an id outside the vocabulary; naming truncate_prompt_tokens when that exceeds
    ``max_model_len``, as vLLM)."""
    keep = truncate_prompt_tokens
    if max_model_len is not None:
        try:
            keep = check_truncation(truncate_prompt_tokens, max_model_len, room)
        except ValueError as exc:
            raise APIError(str(exc), 400, param="truncate_prompt_tokens") from None
    if isinstance(prompt, str):
        if tokenizer is None:  # --skip-tokenizer-init
            raise APIError(f"a text {field} needs the tokenizer, and the server runs with "
                           "--skip-tokenizer-init: give token ids", 400, param=field)
        ids = list(tokenizer(prompt, add_special_tokens=add_special_tokens).input_ids)
        text: str | None = prompt
    else:
        ids, text = list(prompt), None
        if vocab_size is not None:
            bad = next((t for t in ids if not 0 <= t < vocab_size), None)
            if bad is not None:
                raise APIError(f"{field} contains token id {bad}, which is out of vocabulary "
                               f"(vocabulary size {vocab_size})", 400, param=field)
    if keep is not None and keep >= 1:  # -1 without max_model_len: kept whole
        ids = ids[-keep:]
    if not ids:
        raise APIError("The prompt is empty (0 tokens).", 400, param=field)
    return EnginePrompt(text, ids)


def split_prompts(prompt: Any, field: str = "prompt") -> list[str | list[int]]:
    """OpenAI's prompt forms (string, strings, token ids, lists of token ids) -> a batch."""
    if isinstance(prompt, str):
        return [prompt]
    if isinstance(prompt, list) and prompt:
        if all(isinstance(p, int) and not isinstance(p, bool) for p in prompt):
            return [list(prompt)]
        if all(isinstance(p, str) for p in prompt):
            return list(prompt)
        if all(isinstance(p, list) and p for p in prompt):
            return [list(p) for p in prompt]
    raise APIError(
        f"{field} must be a string, a list of strings, a list of token ids, or a list of "
        "token-id lists (non-empty)", 400, param=field,
    )


def check_context_length(
    num_prompt: int, max_tokens: int | None, max_model_len: int, cap: int | None = None
) -> int:
    """The effective max_tokens (None: what is left of the context), at most ``cap`` (the
    generation config's max_new_tokens, a server-wide limit); 400 with vLLM's message when
    prompt + completion do not fit."""
    limit = _output_limit(num_prompt, max_tokens, max_model_len)
    return limit if cap is None else min(limit, cap)


def _output_limit(num_prompt: int, max_tokens: int | None, max_model_len: int) -> int:
    if max_tokens is None:
        if num_prompt >= max_model_len:
            raise APIError(
                f"This model's maximum context length is {max_model_len} tokens. However, "
                f"your request has {num_prompt} input tokens. Please reduce the length of "
                "the input messages.", 400, param="messages", code="context_length_exceeded",
            )
        return max_model_len - num_prompt
    if max_tokens >= 1 and num_prompt + max_tokens > max_model_len:
        raise APIError(
            f"This model's maximum context length is {max_model_len} tokens. However, you "
            f"requested {num_prompt + max_tokens} tokens ({num_prompt} in the messages, "
            f"{max_tokens} in the completion). Please reduce the length of the messages or "
            "completion.", 400, param="max_tokens", code="context_length_exceeded",
        )
    return max_tokens


def check_request(req: SamplingFields) -> None:
    """Checks every generating request gets first: fields this server knows and does not
    implement, output modalities, stream_options without stream (400 naming the field)."""
    for name, why in req.unsupported_fields():
        raise APIError(f"{name}: {why}", 400, param=name)
    modalities = (req.model_extra or {}).get("modalities")
    if isinstance(modalities, list) and any(m != "text" for m in modalities):
        raise APIError(f"modalities {modalities}: only text output is supported", 400,
                       param="modalities")
    if req.stream_options is not None and not req.stream:
        raise APIError("Stream options can only be defined when `stream=True`.", 400,
                       param="stream_options")
    if req.cache_salt is not None and not 0 < len(req.cache_salt) <= 1024:  # vLLM's bounds
        raise APIError("Parameter 'cache_salt' must be a non-empty string of at most 1024 "
                       "characters if provided.", 400, param="cache_salt")


def guided_field(req: SamplingFields) -> str:
    """The request field that carries its structured-output constraint (for error params)."""
    for name in GuidedFields.model_fields:
        value = getattr(req, name)
        if name == "response_format" and isinstance(value, dict) \
                and value.get("type") in (None, "text"):
            continue
        if value is not None and name != "guided_whitespace_pattern":
            return name
    return "response_format"


async def compile_guided(state: ServerState, spec: GuidedSpec | None, backend: str | None,
                         field: str) -> None:
    """Compile the request's constraint before queueing it (off the event loop and the engine
    thread); a refusal is a 400 naming the request field that carried it."""
    if spec is None:
        return
    state.need_tokenizer(field)
    try:
        await state.engine.compile_guided(spec, backend)
    except ValueError as exc:
        raise APIError(str(exc), 400, param=field) from None


async def tokenize_prompts(state: ServerState, prompts: list[str | list[int]],
                           add_special_tokens: bool, truncate: int | None,
                           field: str = "prompt", room: int = 0,
                           ) -> list[EnginePrompt]:
    """Every prompt of a request tokenized on the tokenizer pool (off the event loop);
    ``room``: output positions the request needs (truncation -1 leaves them;
    ``input_processor.output_room``)."""
    def run(tok: Any) -> list[EnginePrompt]:
        return [tokenize_prompt(tok, p, add_special_tokens, truncate, state.vocab_size, field,
                                state.max_model_len, room) for p in prompts]

    if state.tokenizer is None:  # --skip-tokenizer-init: token ids only, nothing to run
        return run(None)
    assert state.tokenizers is not None
    return await state.tokenizers.run(run)


def guided_spec(req: SamplingFields) -> GuidedSpec | None:
    """The request's structured-output constraint (400 naming the field when malformed)."""
    try:
        return spec_from_request(**{name: getattr(req, name) for name in GuidedFields.model_fields})
    except ValueError as exc:
        raise from_value_error(exc, KNOWN_FIELDS) from None


def sampling_params(
    req: SamplingFields,
    *,
    max_tokens: int | None,
    logprobs: int | None,
    prompt_logprobs: int | None = None,
    guided: GuidedSpec | None = None,
    defaults: dict[str, Any] | None = None,
) -> SamplingParams:
    """SamplingParams from the request; a field it leaves unset takes ``defaults``' value
    (the generation config's, ``LLMEngine.default_sampling``; its max_tokens is applied by
    ``check_context_length``), else SamplingParams' default. A ValueError becomes a 400
    naming the field."""
    given: dict[str, Any] = {
        k: v for k, v in (defaults or {}).items() if k != "max_tokens"
    }
    given.update({
        name: getattr(req, name) for name in _COPIED_FIELDS
        if getattr(req, name) is not None and name not in ("use_beam_search", "length_penalty")
    })
    try:
        return SamplingParams(
            max_tokens=max_tokens,
            logprobs=logprobs,
            prompt_logprobs=prompt_logprobs if prompt_logprobs is not None
            else req.prompt_logprobs,
            guided_decoding=guided,
            guided_decoding_backend=req.guided_decoding_backend if guided else None,
            extra_args=dict(req.vllm_xargs) if req.vllm_xargs else None,
            **given,
        )
    except ValueError as exc:
        raise from_value_error(exc, KNOWN_FIELDS) from None


def check_max_tokens(value: int | None, field: str = "max_tokens") -> None:
    """max_tokens < 1 is named before the context check (which would hide it)."""
    if value is not None and value < 1:
        raise APIError(f"{field} must be at least 1, got {value}.", 400, param=field)
