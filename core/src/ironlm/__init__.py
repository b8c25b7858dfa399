"""IronLM: an LLM serving engine whose hardware- and library-specific parts are plugins.

``from ironlm import LLM, SamplingParams`` for the offline API; ``from ironlm import hookimpl``
to write a plugin (see ``ironlm.hookspecs``). The engine is imported on first use of ``LLM`` so
that plugins importing ``hookimpl`` stay light.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ironlm.hookspecs import hookimpl, hookspec

__version__ = "0.1.0"

if TYPE_CHECKING:
    from ironlm.entrypoints.llm import LLM
    from ironlm.outputs import (
        ClassificationOutput,
        ClassificationRequestOutput,
        CompletionOutput,
        EmbeddingRequestOutput,
        PoolingRequestOutput,
        RequestOutput,
        ScoringRequestOutput,
    )
    from ironlm.pooling_params import PoolingParams
    from ironlm.sampling_params import BeamSearchParams, RequestOutputKind, SamplingParams

_LAZY = {
    "LLM": "ironlm.entrypoints.llm",
    "SamplingParams": "ironlm.sampling_params",
    "BeamSearchParams": "ironlm.sampling_params",
    "GuidedDecodingParams": "ironlm.sampling_params",
    "StructuredOutputsParams": "ironlm.sampling_params",
    "RequestOutputKind": "ironlm.sampling_params",
    "PoolingParams": "ironlm.pooling_params",
    "RequestOutput": "ironlm.outputs",
    "CompletionOutput": "ironlm.outputs",
    "ClassificationOutput": "ironlm.outputs",
    "ClassificationRequestOutput": "ironlm.outputs",
    "EmbeddingRequestOutput": "ironlm.outputs",
    "PoolingRequestOutput": "ironlm.outputs",
    "ScoringRequestOutput": "ironlm.outputs",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'ironlm' has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(module), name)


__all__ = [
    "LLM",
    "BeamSearchParams",
    "GuidedDecodingParams",
    "StructuredOutputsParams",
    "ClassificationOutput",
    "ClassificationRequestOutput",
    "CompletionOutput",
    "EmbeddingRequestOutput",
    "PoolingParams",
    "PoolingRequestOutput",
    "RequestOutput",
    "ScoringRequestOutput",
    "RequestOutputKind",
    "SamplingParams",
    "hookimpl",
    "hookspec",
    "__version__",
]
