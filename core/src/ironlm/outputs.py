"""What generation returns: RequestOutput with one CompletionOutput per returned sequence."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch


@dataclass
class Logprob:
    """Log-probability of one token, its rank in the distribution, and its text."""

    logprob: float
    rank: int | None = None
    decoded_token: str | None = None


# Per position: token id -> Logprob (the sampled/actual token plus the top-k alternatives).
PositionLogprobs = dict[int, Logprob]


@dataclass
class CompletionOutput:
    index: int
    text: str
    token_ids: list[int]
    cumulative_logprob: float | None
    logprobs: list[PositionLogprobs] | None = None
    finish_reason: str | None = None  # "stop" | "length" | "abort" | None while running
    stop_reason: int | str | None = None  # the stop string or token id that ended it

    def finished(self) -> bool:
        return self.finish_reason is not None


@dataclass
class RequestOutput:
    request_id: str
    prompt: str | None
    prompt_token_ids: list[int] | None  # None for a prompt given as embeddings (vLLM's)
    outputs: list[CompletionOutput]
    finished: bool
    prompt_logprobs: list[PositionLogprobs | None] | None = None
    num_cached_tokens: int = 0
    metrics: dict[str, float] = field(default_factory=dict)
    # set for pooling (encode / embeddings) requests: the pooled vector, or for a token task
    # a (num_prompt_tokens, hidden_size | num_labels) float32 tensor, a row per prompt token
    embedding: list[float] | torch.Tensor | None = None
    # Set when the request failed as a whole (a guided-decoding backend's dead end): the
    # outputs then hold what was generated before, finish_reason "abort".
    error: str | None = None
    lora_request: Any = None  # the LoRARequest it ran with (ironlm.lora.request), or None
    num_prompt_embeds: int = 0  # rows of a prompt given as embeddings (no prompt_token_ids)

    @property
    def num_prompt_tokens(self) -> int:
        """The prompt's positions: its tokens, or its embedded rows."""
        ids = self.prompt_token_ids
        return len(ids) if ids is not None else self.num_prompt_embeds


@dataclass
class PoolingOutput:
    # float32: the (hidden_size,) mean-pooled last hidden state, a classifier's (num_labels,)
    # output, or for a token task one such row per prompt token
    data: torch.Tensor


@dataclass
class PoolingRequestOutput:
    """One prompt's pooled state (``LLM.encode``, vLLM's shape)."""

    request_id: str
    prompt_token_ids: list[int]
    outputs: PoolingOutput
    finished: bool = True


@dataclass
class EmbeddingOutput:
    embedding: list[float]  # (hidden_size,)


@dataclass
class EmbeddingRequestOutput:
    """One prompt's embedding (``LLM.embed``, vLLM's shape)."""

    request_id: str
    prompt_token_ids: list[int]
    outputs: EmbeddingOutput
    finished: bool = True


@dataclass
class ClassificationOutput:
    probs: list[float]  # (num_labels,): softmax over the labels, a sigmoid for a single one

    @property
    def num_classes(self) -> int:
        return len(self.probs)


@dataclass
class ClassificationRequestOutput:
    """One prompt's classes (``LLM.classify``, vLLM's shape)."""

    request_id: str
    prompt_token_ids: list[int]
    outputs: ClassificationOutput
    finished: bool = True


@dataclass
class ScoringOutput:
    # an embedding model's: the cosine similarity of the pair's two embeddings, in [-1, 1];
    # a cross-encoder's (a one-label classifier): the sigmoid of the pair's logit, in (0, 1)
    score: float


@dataclass
class ScoringRequestOutput:
    """One pair's score (``LLM.score``, vLLM's shape): ``prompt_token_ids`` are the first text's
    tokens, the pad token where the tokenizer has one, then the second's (vLLM counts usage
    from them); a cross-encoder's, the pair's encoding as the model read it."""

    request_id: str
    prompt_token_ids: list[int]
    outputs: ScoringOutput
    finished: bool = True
