"""SamplingParams and BeamSearchParams with vLLM's names, defaults and validation."""

from __future__ import annotations

import copy
import math
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

_SAMPLING_EPS = 1e-5
_INT64_MIN, _INT64_MAX = -(2**63), 2**63 - 1


class RequestOutputKind(Enum):
    """What each RequestOutput of a request holds (vLLM's names): CUMULATIVE, everything so
    far (every step); DELTA, what is new since the request's previous output (every step);
    FINAL_ONLY, one output when the request finishes (``LLM.generate`` asks for it)."""

    CUMULATIVE = 0
    DELTA = 1
    FINAL_ONLY = 2


def check_truncate_value(truncate_prompt_tokens: int | None) -> None:
    """vLLM's range of truncate_prompt_tokens: None, -1 (as many as the context leaves), or at
    least 1 (ValueError naming the field)."""
    if truncate_prompt_tokens is not None and truncate_prompt_tokens < 1 \
            and truncate_prompt_tokens != -1:
        raise ValueError("truncate_prompt_tokens must be an integer >= 1 or -1 (as many as the "
                         f"context leaves), got {truncate_prompt_tokens}")


@dataclass
class SamplingParams:
    """Per-request sampling parameters. Field meanings follow vLLM; invalid values raise
    ValueError naming the field when the object is created (and again in ``verify`` against
    the model's vocabulary and the engine's limits)."""

    n: int = 1
    best_of: int | None = None
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1  # -1 or 0 disables (vLLM 0.6 spelt it -1, later versions 0); 0 is stored as -1
    min_p: float = 0.0
    seed: int | None = None
    use_beam_search: bool = False
    length_penalty: float = 1.0
    early_stopping: bool | str = False
    stop: str | list[str] | None = None
    stop_token_ids: list[int] | None = None
    include_stop_str_in_output: bool = False
    ignore_eos: bool = False
    max_tokens: int | None = 16
    min_tokens: int = 0
    logprobs: int | None = None
    prompt_logprobs: int | None = None
    detokenize: bool = True
    skip_special_tokens: bool = True
    spaces_between_special_tokens: bool = True
    logit_bias: dict[int, float] | None = None
    allowed_token_ids: list[int] | None = None
    bad_words: list[str] | None = None
    truncate_prompt_tokens: int | None = None
    # Structured output: GuidedDecodingParams (or an ironlm.interfaces.guided.GuidedSpec) plus
    # an optional backend name (GuidedDecodingParams.backend wins when set).
    guided_decoding: Any = None
    guided_decoding_backend: str | None = None
    # vLLM's newer name of guided_decoding (StructuredOutputsParams); give one of the two
    structured_outputs: Any = None
    output_kind: RequestOutputKind = RequestOutputKind.CUMULATIVE
    # vLLM's: settings for custom logits processors (the server's vllm_xargs); the engine
    # reads nothing in it
    extra_args: dict[str, Any] | None = None
    # Filled by the engine: token-id sequences of bad_words, and the eos id.
    _bad_words_token_ids: list[list[int]] = field(default_factory=list, repr=False)

    def __post_init__(self) -> None:
        if self.best_of is None:
            self.best_of = self.n
        if isinstance(self.stop, str):
            self.stop = [self.stop]
        self.stop = list(self.stop or [])
        self.stop_token_ids = list(self.stop_token_ids or [])
        if self.logit_bias is not None:
            try:
                self.logit_bias = {int(k): float(v) for k, v in self.logit_bias.items()}
            except (TypeError, ValueError):
                raise ValueError("logit_bias must map token ids to numbers") from None
        if self.structured_outputs is not None:
            if self.guided_decoding is not None:
                raise ValueError("structured_outputs and guided_decoding are two names of one "
                                 "constraint: give one")
            self.guided_decoding, self.structured_outputs = self.structured_outputs, None
        if isinstance(self.guided_decoding, GuidedDecodingParams):
            if self.guided_decoding.backend:
                self.guided_decoding_backend = self.guided_decoding.backend
            self.guided_decoding = self.guided_decoding.to_spec()
        elif self.guided_decoding is not None:
            from ironlm.interfaces.guided import GuidedSpec

            if not isinstance(self.guided_decoding, GuidedSpec):  # e.g. a plain dict
                raise ValueError("guided_decoding must be a GuidedDecodingParams (vLLM's "
                                 "StructuredOutputsParams), got "
                                 f"{type(self.guided_decoding).__name__}")
        if self.seed is not None and not isinstance(self.seed, int):
            raise ValueError(f"seed must be an integer, got {self.seed!r}")
        self._validate()
        if self.top_k == 0:  # later vLLM's spelling of "no top-k"; the sampler reads -1
            self.top_k = -1
        if self.temperature < _SAMPLING_EPS and not self.use_beam_search:
            # Greedy: the other sampling knobs have no effect (vLLM resets them too).
            self.top_p, self.top_k, self.min_p = 1.0, -1, 0.0

    @property
    def reports_logprobs(self) -> bool:
        """Whether outputs carry the sampled tokens' log-probabilities (their sum is
        ``cumulative_logprob``): when ``logprobs`` asks for them, or when best_of ranks the
        sequences by that sum. As vLLM, outputs carry None otherwise, and the sampler skips
        the vocabulary-wide log-normaliser it would need."""
        return self.logprobs is not None or (self.best_of or self.n) > self.n

    @property
    def sampling_type_greedy(self) -> bool:
        return self.temperature < _SAMPLING_EPS

    def _validate(self) -> None:
        def bad(field_name: str, msg: str) -> ValueError:
            return ValueError(f"{field_name} {msg}")

        if not isinstance(self.n, int) or self.n < 1:
            raise bad("n", f"must be at least 1, got {self.n}.")
        if not isinstance(self.output_kind, RequestOutputKind):
            raise bad("output_kind", f"must be a RequestOutputKind, got {self.output_kind!r}.")
        if not isinstance(self.best_of, int) or self.best_of < self.n:
            raise bad("best_of", f"must be greater than or equal to n, got n={self.n} and "
                      f"best_of={self.best_of}.")
        if not -2.0 <= self.presence_penalty <= 2.0:
            raise bad("presence_penalty", f"must be in [-2, 2], got {self.presence_penalty}.")
        if not -2.0 <= self.frequency_penalty <= 2.0:
            raise bad("frequency_penalty", f"must be in [-2, 2], got {self.frequency_penalty}.")
        if not (0.0 < self.repetition_penalty and math.isfinite(self.repetition_penalty)):
            raise bad("repetition_penalty", f"must be a positive finite number, got "
                      f"{self.repetition_penalty}.")
        if not self.temperature >= 0.0:  # NaN too: it would run as greedy
            raise bad("temperature", f"must be non-negative, got {self.temperature}.")
        if not 0.0 < self.top_p <= 1.0:
            raise bad("top_p", f"must be in (0, 1], got {self.top_p}.")
        if self.top_k < -1:
            raise bad("top_k", f"must be 0 or -1 (disable), or at least 1, got {self.top_k}.")
        if not 0.0 <= self.min_p <= 1.0:
            raise bad("min_p", f"must be in [0, 1], got {self.min_p}.")
        if self.seed is not None and not _INT64_MIN <= self.seed <= _INT64_MAX:
            raise bad("seed", f"must be within the int64 range, got {self.seed}.")
        if self.max_tokens is not None and self.max_tokens < 1:
            raise bad("max_tokens", f"must be at least 1, got {self.max_tokens}.")
        if self.min_tokens < 0:
            raise bad("min_tokens", f"must be greater than or equal to 0, got {self.min_tokens}.")
        if self.max_tokens is not None and self.min_tokens > self.max_tokens:
            raise bad("min_tokens", f"must be less than or equal to max_tokens="
                      f"{self.max_tokens}, got {self.min_tokens}.")
        if self.logprobs is not None and self.logprobs < 0:
            raise bad("logprobs", f"must be non-negative, got {self.logprobs}.")
        if self.prompt_logprobs is not None and self.prompt_logprobs < 0:
            raise bad("prompt_logprobs", f"must be non-negative, got {self.prompt_logprobs}.")
        check_truncate_value(self.truncate_prompt_tokens)
        if any(not s for s in self.stop or []):
            raise bad("stop", "cannot contain an empty string.")
        if self.stop and not self.detokenize:
            raise bad("stop", "strings are only supported when detokenize is True. Set "
                      "detokenize=True to use stop.")
        if not all(isinstance(t, int) and not isinstance(t, bool) for t in self.stop_token_ids):
            raise bad("stop_token_ids", f"must contain only integers, got "
                      f"{self.stop_token_ids!r}.")
        if self.best_of != self.n and self.output_kind == RequestOutputKind.DELTA:
            raise bad("best_of", "must equal n to use output_kind=DELTA.")
        if self.use_beam_search:
            if self.best_of == 1:
                raise bad("best_of", "must be greater than 1 when using beam search.")
            if self.temperature > _SAMPLING_EPS:
                raise bad("temperature", "must be 0 when using beam search.")
            if self.top_p < 1.0 - _SAMPLING_EPS or self.top_k != -1:
                raise bad("top_p", "must be 1 and top_k must be -1 when using beam search.")
        elif self.early_stopping is not False:
            raise bad("early_stopping", "is not effective and must be False when not using "
                      "beam search.")

    def verify(self, vocab_size: int, max_logprobs: int) -> None:
        """Checks that need the model: token ids inside the vocabulary, logprob limits
        (``max_logprobs`` -1: the vocabulary's size, as vLLM)."""
        if max_logprobs == -1:
            max_logprobs = vocab_size
        for name, n in (("logprobs", self.logprobs), ("prompt_logprobs", self.prompt_logprobs)):
            if n is not None and n > max_logprobs:
                raise ValueError(f"{name} requested {n} logprobs, which is more than "
                                 f"max_logprobs={max_logprobs}.")
        for tid in self.logit_bias or {}:
            if not 0 <= tid < vocab_size:
                raise ValueError(f"logit_bias contains token id {tid} outside the vocabulary "
                                 f"[0, {vocab_size}).")
        if self.allowed_token_ids is not None:
            if not self.allowed_token_ids:
                raise ValueError("allowed_token_ids is not allowed to be empty.")
            if any(not 0 <= t < vocab_size for t in self.allowed_token_ids):
                raise ValueError(f"allowed_token_ids contains out-of-vocab token id "
                                 f"(vocabulary size {vocab_size}).")
        if any(not 0 <= t < vocab_size for t in self.stop_token_ids or []):
            raise ValueError(f"stop_token_ids contains out-of-vocab token id "
                             f"(vocabulary size {vocab_size}).")

    def clone(self) -> SamplingParams:
        return copy.deepcopy(self)


@dataclass
class GuidedDecodingParams:
    """vLLM's offline structured-output parameters: give exactly one of json (schema as a
    dict, JSON text or pydantic model class), regex, choice, grammar, json_object."""

    json: Any = None
    regex: str | None = None
    choice: list[str] | None = None
    grammar: str | None = None
    json_object: bool | None = None
    backend: str | None = None
    whitespace_pattern: str | None = None
    disable_fallback: bool = False
    disable_any_whitespace: bool = False
    disable_additional_properties: bool = False

    def to_spec(self) -> Any:
        """The normalised GuidedSpec (ValueError for none or several constraints)."""
        from ironlm.guided_spec import apply_options, spec_from_request

        spec = spec_from_request(
            guided_json=self.json,
            guided_regex=self.regex,
            guided_choice=self.choice,
            guided_grammar=self.grammar,
            guided_whitespace_pattern=self.whitespace_pattern,
            response_format={"type": "json_object"} if self.json_object else None,
        )
        if spec is None:
            raise ValueError("guided_decoding: give one of json, regex, choice, grammar, "
                             "json_object")
        return apply_options(spec, {
            "disable_fallback": self.disable_fallback,
            "disable_any_whitespace": self.disable_any_whitespace,
            "disable_additional_properties": self.disable_additional_properties,
        })


class StructuredOutputsParams(GuidedDecodingParams):
    """vLLM's newer name of GuidedDecodingParams (``SamplingParams(structured_outputs=...)``):
    the same constraints and options; the backend is the engine's
    (``guided_decoding_backend``) unless ``backend`` names one."""


@dataclass
class BeamSearchParams:
    """Parameters of ``LLM.beam_search`` (vLLM's names)."""

    beam_width: int
    max_tokens: int
    ignore_eos: bool = False
    temperature: float = 0.0
    length_penalty: float = 1.0
    include_stop_str_in_output: bool = False

    def __post_init__(self) -> None:
        if self.beam_width < 1:
            raise ValueError(f"beam_width must be at least 1, got {self.beam_width}.")
        if self.max_tokens < 1:
            raise ValueError(f"max_tokens must be at least 1, got {self.max_tokens}.")
        if self.temperature < 0:
            raise ValueError(f"temperature must be non-negative, got {self.temperature}.")
