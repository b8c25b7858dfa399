"""The interfaces plugins implement. One module per interface; ``hookspecs`` says which hook
registers which interface."""

from ironlm.interfaces.attention import AttentionBackend, AttentionBatch, AttentionLayerSpec
from ironlm.interfaces.executor import Executor
from ironlm.interfaces.guided import Grammar, GuidedBackend, GuidedSpec, UnsupportedFeatureError
from ironlm.interfaces.kv_connector import KVConnector, KVTransferConfig
from ironlm.interfaces.logits_processor import BatchUpdate, LogitsProcessor
from ironlm.interfaces.model import ModelArchitecture, ModelContext
from ironlm.interfaces.platform import Availability, LayerOps, Platform
from ironlm.interfaces.quantization import QuantizationMethod
from ironlm.interfaces.reasoning_parser import ReasoningDelta, ReasoningParser
from ironlm.interfaces.spec_decode import SpeculativeProposer
from ironlm.interfaces.tool_parser import (
    DeltaToolCall,
    ExtractedToolCalls,
    StreamDelta,
    ToolCall,
    ToolParser,
)

__all__ = [
    "AttentionBackend",
    "AttentionBatch",
    "AttentionLayerSpec",
    "Availability",
    "BatchUpdate",
    "DeltaToolCall",
    "Executor",
    "ExtractedToolCalls",
    "Grammar",
    "GuidedBackend",
    "GuidedSpec",
    "KVConnector",
    "KVTransferConfig",
    "LayerOps",
    "LogitsProcessor",
    "ModelArchitecture",
    "ModelContext",
    "Platform",
    "QuantizationMethod",
    "ReasoningDelta",
    "ReasoningParser",
    "SpeculativeProposer",
    "StreamDelta",
    "ToolCall",
    "ToolParser",
    "UnsupportedFeatureError",
]
