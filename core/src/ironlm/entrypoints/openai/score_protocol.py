"""Bodies of vLLM's /score and /rerank (Jina / Cohere style) endpoints and their replies."""

from __future__ import annotations

from typing import ClassVar

from pydantic import BaseModel

from ironlm.entrypoints.openai.protocol import UsageInfo
from ironlm.entrypoints.openai.request_base import ActivationFields, OpenAIRequest

# Why a bi-encoder (an embedding model) refuses a cross-encoder's field
BI_ENCODER_REFUSAL = ("applies to a cross-encoder's classification score; this model scores by "
                      "the cosine of two embeddings")
# the HF processor's options
_UNSUPPORTED = {"mm_processor_kwargs": "no multimodal processor here"}

Texts = str | list[str]

# vLLM's four spellings of a score request's two sides, first side first
SCORE_SIDES: tuple[tuple[str, str], ...] = (
    ("text_1", "text_2"), ("data_1", "data_2"), ("queries", "documents"), ("queries", "items"),
)


class ScoreRequest(OpenAIRequest, ActivationFields):
    """Exactly one pair of sides (``SCORE_SIDES``): 1:1, 1:N or N:N texts."""

    UNSUPPORTED: ClassVar[dict[str, str]] = _UNSUPPORTED
    model: str | None = None
    text_1: Texts | None = None
    text_2: Texts | None = None
    data_1: Texts | None = None
    data_2: Texts | None = None
    queries: Texts | None = None
    documents: Texts | None = None
    items: Texts | None = None
    truncate_prompt_tokens: int | None = None
    priority: int = 0
    request_id: str | None = None


class RerankRequest(OpenAIRequest, ActivationFields):
    UNSUPPORTED: ClassVar[dict[str, str]] = _UNSUPPORTED
    model: str | None = None
    query: str
    documents: list[str]
    top_n: int = 0  # 0 or more than the documents: all of them
    truncate_prompt_tokens: int | None = None
    priority: int = 0
    request_id: str | None = None


class ScoreData(BaseModel):
    index: int
    object: str = "score"
    score: float


class ScoreResponse(BaseModel):
    id: str
    object: str = "list"
    created: int
    model: str
    data: list[ScoreData]
    usage: UsageInfo


class RerankDocument(BaseModel):
    text: str


class RerankResult(BaseModel):
    index: int
    document: RerankDocument
    relevance_score: float


class RerankUsage(BaseModel):
    prompt_tokens: int
    total_tokens: int


class RerankResponse(BaseModel):
    id: str
    model: str
    usage: RerankUsage
    results: list[RerankResult]
