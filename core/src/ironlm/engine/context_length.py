"""The engine's context length: the model's limit (max_position_embeddings, or its sliding
window with disable_sliding_window) against the max_model_len asked for."""

from __future__ import annotations

from ironlm.config import EngineConfig
from ironlm.model_loader import ModelSource
from ironlm.model_loader.source import sliding_window


def model_limit(config: EngineConfig, source: ModelSource) -> tuple[int | None, str]:
    """The longest context the model takes, and what sets it: its max_position_embeddings,
    or with disable_sliding_window its sliding window when shorter (vLLM's cap)."""
    window = sliding_window(source.hf_config) if config.disable_sliding_window else None
    limit = source.max_position_embeddings
    if window is not None and (limit is None or window < limit):
        return window, "sliding window (disable_sliding_window caps the length to it)"
    return limit, "max_position_embeddings"


def max_model_len(config: EngineConfig, model_max: int | None, what: str) -> int:
    if config.max_model_len is None:
        if model_max is None:
            raise ValueError("the model config has no max_position_embeddings; set max_model_len")
        return int(model_max)
    if model_max is not None and config.max_model_len > model_max:
        raise ValueError(
            f"max_model_len ({config.max_model_len}) is greater than the model's {what} "
            f"({model_max})"
        )
    return config.max_model_len
