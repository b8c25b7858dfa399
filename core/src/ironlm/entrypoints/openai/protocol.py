"""Pydantic request and response models of the OpenAI API, with vLLM's extra parameters.

Requests accept unknown fields (clients send vendor extras; they are logged) and treat an
explicit ``null`` as "not given" (``request_base``); ranges are checked by SamplingParams,
whose ValueErrors name the field. Defaults of ``None`` mean "not given": the SamplingParams
default then applies.
"""

from __future__ import annotations

import time
from typing import Any, Literal, Union

from pydantic import BaseModel, Field, model_serializer

from ironlm.entrypoints.openai.request_base import ActivationFields, OpenAIRequest

# A prompt: text, token ids, or a batch of either.
PromptInput = Union[list[int], list[list[int]], str, list[str]]


_Request = OpenAIRequest


class StreamOptions(OpenAIRequest):
    include_usage: bool | None = True
    continuous_usage_stats: bool | None = False


class GuidedFields(_Request):
    """Structured output (issue 6): vLLM 0.6 names, OpenAI response_format, newer vLLM form.

    Each field is the parameter of ``ironlm.guided_spec.spec_from_request`` of the same name,
    which turns them into one constraint (request_inputs.guided_spec hands them over).
    """

    response_format: dict[str, Any] | None = None
    guided_json: str | dict[str, Any] | None = None
    guided_regex: str | None = None
    guided_choice: list[str] | None = None
    guided_grammar: str | None = None
    guided_whitespace_pattern: str | None = None
    structured_outputs: dict[str, Any] | None = None


class SamplingFields(GuidedFields):
    """Sampling parameters shared by completions and chat (OpenAI + vLLM extras)."""

    model: str | None = None
    n: int = 1
    best_of: int | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    repetition_penalty: float | None = None
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    min_p: float | None = None
    seed: int | None = None
    stop: str | list[str] | None = None
    stop_token_ids: list[int] | None = None
    include_stop_str_in_output: bool = False
    ignore_eos: bool = False
    min_tokens: int = 0
    skip_special_tokens: bool = True
    spaces_between_special_tokens: bool = True
    truncate_prompt_tokens: int | None = None
    prompt_logprobs: int | None = None
    logit_bias: dict[str, float] | None = None
    allowed_token_ids: list[int] | None = None
    bad_words: list[str] | None = None
    use_beam_search: bool = False
    length_penalty: float | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    user: str | None = None
    priority: int = 0
    # vLLM's: the prompt's prefix-cache blocks are shared only with requests of the same salt
    cache_salt: str | None = None
    guided_decoding_backend: str | None = None  # the backend that enforces the GuidedFields
    return_tokens_as_token_ids: bool | None = None
    # vLLM's: the reply carries the prompt's token ids and each choice's generated ones (in a
    # stream: the prompt's with the first chunk, each chunk's new ids with it)
    return_token_ids: bool | None = None
    # vLLM's: the id the request runs and is logged under and the response carries (with its
    # prefix); an X-Request-Id header takes precedence; unset, a random one
    request_id: str | None = None
    # vLLM's: settings for the custom logits processors (--logits-processors), their
    # SamplingParams.extra_args
    vllm_xargs: dict[str, str | int | float | list[str | int | float]] | None = None


class CompletionRequest(SamplingFields):
    prompt: PromptInput | None = None  # may be left out (or "") when prompt_embeds are given
    # vLLM's (--enable-prompt-embeds): base64 of torch.save's bytes of a (num_tokens,
    # hidden_size) tensor, one per prompt (embeds_prompts.py)
    prompt_embeds: str | list[str] | None = None
    suffix: str | None = None
    max_tokens: int | None = 16
    echo: bool = False
    logprobs: int | None = None
    add_special_tokens: bool = True


class ChatCompletionRequest(SamplingFields):
    UNSUPPORTED = {
        "audio": "audio output is not supported (text only)",
        "prediction": "predicted outputs are not supported",
        "web_search_options": "web search is not supported",
        "functions": "the deprecated functions API is not supported; use tools",
        "function_call": "the deprecated functions API is not supported; use tool_choice",
    }
    # Messages stay plain dicts: custom roles and extra fields are tolerated and passed to the
    # chat template; chat_utils checks the shape.
    messages: list[dict[str, Any]]
    max_tokens: int | None = None
    max_completion_tokens: int | None = None
    logprobs: bool = False
    top_logprobs: int | None = None
    tools: list[dict[str, Any]] | None = None
    tool_choice: str | dict[str, Any] | None = None
    parallel_tool_calls: bool = True
    echo: bool = False
    add_generation_prompt: bool = True
    continue_final_message: bool = False
    add_special_tokens: bool = False
    documents: list[dict[str, Any]] | None = None
    chat_template: str | None = None
    chat_template_kwargs: dict[str, Any] | None = None
    # with --reasoning-parser: false leaves the reasoning out of the response (vLLM's)
    include_reasoning: bool = True
    # handed to the chat template; "none" also sets enable_thinking false (vLLM's)
    reasoning_effort: Literal["none", "minimal", "low", "medium", "high", "xhigh", "max"] \
        | None = None


class EmbeddingRequest(_Request):
    """``input`` (completions form) or ``messages`` (vLLM's chat form, through the template)."""

    model: str | None = None
    input: PromptInput | None = None
    messages: list[dict[str, Any]] | None = None
    encoding_format: Literal["float", "base64"] = "float"
    dimensions: int | None = None
    user: str | None = None
    request_id: str | None = None  # as SamplingFields.request_id
    add_special_tokens: bool | None = None  # default: True for input, False for messages
    add_generation_prompt: bool = False
    continue_final_message: bool = False
    chat_template: str | None = None
    chat_template_kwargs: dict[str, Any] | None = None
    truncate_prompt_tokens: int | None = None
    normalize: bool = False  # True: each vector scaled to unit L2 norm
    priority: int = 0


class PoolingRequest(EmbeddingRequest, ActivationFields):
    """vLLM's /pooling body: an embedding request with the pooling ``task``: "embed" or
    "token_embed" (every token's hidden state) on an embedding model, "classify" or
    "token_classify" (the head on every token) on a sequence classifier; the activation
    fields are a classifier's."""

    task: str | None = None


class TokenizeRequest(_Request):
    """Either ``prompt`` (completions form) or ``messages`` (chat form, through the template)."""

    model: str | None = None
    prompt: str | None = None
    messages: list[dict[str, Any]] | None = None
    add_special_tokens: bool | None = None  # default: True for prompt, False for messages
    add_generation_prompt: bool = True
    continue_final_message: bool = False
    chat_template: str | None = None
    chat_template_kwargs: dict[str, Any] | None = None
    tools: list[dict[str, Any]] | None = None
    return_token_strs: bool = False


class DetokenizeRequest(_Request):
    model: str | None = None
    tokens: list[int]


# -- responses -----------------------------------------------------------------------------
def _now() -> int:
    return int(time.time())


class UsageInfo(BaseModel):
    prompt_tokens: int = 0
    completion_tokens: int | None = 0
    total_tokens: int = 0
    prompt_tokens_details: dict[str, int] | None = None  # {"cached_tokens": N}
    completion_tokens_details: dict[str, int] | None = None  # {"reasoning_tokens": N}

    @classmethod
    def of(cls, prompt_tokens: int, completion_tokens: int,
           cached_tokens: int | None = None, reasoning_tokens: int | None = None) -> UsageInfo:
        """The usage of a generation: the total is the sum of both counts. ``cached_tokens``
        (with --enable-prompt-tokens-details): prompt tokens the prefix cache served, shown
        when there were any (vLLM). ``reasoning_tokens`` (with --reasoning-parser): how many
        completion tokens were thinking, shown even when 0 (vLLM)."""
        details = {"cached_tokens": cached_tokens} if cached_tokens else None
        thinking = {"reasoning_tokens": reasoning_tokens} if reasoning_tokens is not None \
            else None
        return cls(prompt_tokens=prompt_tokens, completion_tokens=completion_tokens,
                   total_tokens=prompt_tokens + completion_tokens,
                   prompt_tokens_details=details, completion_tokens_details=thinking)


class CompletionLogProbs(BaseModel):
    text_offset: list[int] = Field(default_factory=list)
    token_logprobs: list[float | None] = Field(default_factory=list)
    tokens: list[str] = Field(default_factory=list)
    top_logprobs: list[dict[str, float] | None] = Field(default_factory=list)


class CompletionChoice(BaseModel):
    index: int
    text: str
    logprobs: CompletionLogProbs | None = None
    finish_reason: str | None = None
    stop_reason: int | str | None = None
    prompt_logprobs: list[dict[int, dict[str, Any]] | None] | None = None
    # the parameter set's extras: characters of the generated text, and the sum of the
    # generated tokens' log-probabilities
    sentence_length: int | None = None
    cum_log_probs: float | None = None
    prompt_token_ids: list[int] | None = None  # return_token_ids
    token_ids: list[int] | None = None  # return_token_ids: the generated tokens


class CompletionResponse(BaseModel):
    id: str
    object: str = "text_completion"
    created: int = Field(default_factory=_now)
    model: str
    system_fingerprint: str | None = None
    choices: list[CompletionChoice]
    usage: UsageInfo | None = None


class ChatLogProb(BaseModel):
    token: str
    logprob: float
    bytes: list[int] | None = None


class ChatLogProbsContent(ChatLogProb):
    top_logprobs: list[ChatLogProb] = Field(default_factory=list)


class ChatLogProbs(BaseModel):
    content: list[ChatLogProbsContent] | None = None
    refusal: list[ChatLogProbsContent] | None = None


class FunctionCall(BaseModel):
    name: str
    arguments: str  # a JSON object as text


class ToolCall(BaseModel):
    id: str
    type: Literal["function"] = "function"
    function: FunctionCall


class ChatMessage(BaseModel):
    role: str
    # with --reasoning-parser: the model's thinking, apart from its answer (``content``);
    # ``reasoning_content`` is the same text under vLLM's (and DeepSeek's) older name
    reasoning: str | None = None
    reasoning_content: str | None = None
    content: str | None = None
    refusal: str | None = None
    tool_calls: list[ToolCall] = Field(default_factory=list)


class ChatChoice(BaseModel):
    index: int
    message: ChatMessage
    logprobs: ChatLogProbs | None = None
    finish_reason: str | None = None
    stop_reason: int | str | None = None
    sentence_length: int | None = None  # characters of the generated text
    cum_log_probs: float | None = None  # sum of the generated tokens' log-probabilities
    token_ids: list[int] | None = None  # return_token_ids: the generated tokens


class ChatCompletionResponse(BaseModel):
    id: str
    object: str = "chat.completion"
    created: int = Field(default_factory=_now)
    model: str
    system_fingerprint: str | None = None
    choices: list[ChatChoice]
    usage: UsageInfo
    prompt_logprobs: list[dict[int, dict[str, Any]] | None] | None = None
    prompt_token_ids: list[int] | None = None  # return_token_ids


class DeltaFunctionCall(BaseModel):
    name: str | None = None
    arguments: str | None = None

    @model_serializer(mode="wrap")
    def _drop_none(self, handler: Any) -> dict[str, Any]:
        return {k: v for k, v in handler(self).items() if v is not None}


class DeltaToolCall(BaseModel):
    """A streamed tool-call fragment: the first of a call carries id, type and name; later
    ones only argument text to append."""

    index: int
    id: str | None = None
    type: Literal["function"] | None = None
    function: DeltaFunctionCall

    @model_serializer(mode="wrap")
    def _drop_none(self, handler: Any) -> dict[str, Any]:
        return {k: v for k, v in handler(self).items() if v is not None}


class DeltaMessage(BaseModel):
    role: str | None = None
    reasoning: str | None = None
    reasoning_content: str | None = None  # the same text as ``reasoning`` (older name)
    content: str | None = None
    tool_calls: list[DeltaToolCall] | None = None

    @model_serializer(mode="wrap")
    def _drop_none(self, handler: Any) -> dict[str, Any]:
        return {k: v for k, v in handler(self).items() if v is not None}


class ChatStreamChoice(BaseModel):
    index: int
    delta: DeltaMessage
    logprobs: ChatLogProbs | None = None
    finish_reason: str | None = None
    stop_reason: int | str | None = None
    token_ids: list[int] | None = None  # return_token_ids: this chunk's new tokens


class EmbeddingData(BaseModel):
    index: int
    object: str = "embedding"
    embedding: list[float] | str  # floats, or base64 of little-endian float32


class PoolingData(BaseModel):  # vLLM's /pooling item: the same vector as an embedding
    index: int
    object: str = "pooling"
    # a vector, a row per token (token tasks), or base64 of the float32 values (row-major)
    data: list[float] | list[list[float]] | str


class EmbeddingResponse(BaseModel):
    id: str
    object: str = "list"
    created: int
    data: list[EmbeddingData] | list[PoolingData]
    model: str
    usage: UsageInfo


class LoadLoRAAdapterRequest(_Request):
    """POST /v1/load_lora_adapter (vLLM's body)."""

    lora_name: str
    lora_path: str


class UnloadLoRAAdapterRequest(_Request):
    """POST /v1/unload_lora_adapter (vLLM's body: the name, or the adapter's id)."""

    lora_name: str | None = None
    lora_int_id: int | None = None
