"""Body and reply of vLLM's /classify (a sequence classifier's class probabilities)."""

from __future__ import annotations

from pydantic import BaseModel

from ironlm.entrypoints.openai.protocol import EmbeddingRequest, UsageInfo
from ironlm.entrypoints.openai.request_base import ActivationFields


class ClassificationRequest(EmbeddingRequest, ActivationFields):
    """The body /v1/embeddings takes (``input``, the completions form, or ``messages``, vLLM's
    chat form through the chat template); ``use_activation: false`` (or vLLM's older
    ``activation`` / ``softmax``): the head's logits instead of probabilities. An embedding's
    own options (``normalize``, ``dimensions``, ``encoding_format``) are accepted at their
    defaults only (/invocations sends an embedding body here)."""


class ClassificationData(BaseModel):
    index: int
    label: str | None  # the label of the highest probability (id2label)
    probs: list[float]
    num_classes: int


class ClassificationResponse(BaseModel):
    id: str
    object: str = "list"
    created: int
    model: str
    data: list[ClassificationData]
    usage: UsageInfo
