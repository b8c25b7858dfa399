"""Body and reply of vLLM's /classify (a sequence classifier's class probabilities)."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel

from ironlm.entrypoints.openai.protocol import PromptInput, UsageInfo
from ironlm.entrypoints.openai.request_base import ActivationFields, OpenAIRequest


class ClassificationRequest(OpenAIRequest, ActivationFields):
    """``input`` (the completions form) or ``messages`` (vLLM's chat form, through the
    chat template), as /v1/embeddings takes them; ``use_activation: false`` (or vLLM's older
    ``activation`` / ``softmax``): the head's logits instead of probabilities."""


    model: str | None = None
    input: PromptInput | None = None
    messages: list[dict[str, Any]] | None = None
    user: str | None = None
    request_id: str | None = None
    add_special_tokens: bool | None = None  # default: True for input, False for messages
    add_generation_prompt: bool = False
    continue_final_message: bool = False
    chat_template: str | None = None
    chat_template_kwargs: dict[str, Any] | None = None
    truncate_prompt_tokens: int | None = None
    priority: int = 0
    # an embedding body's fields (/invocations sends one here): refused unless at their default
    encoding_format: str = "float"
    normalize: bool | None = None
    dimensions: int | None = None


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
