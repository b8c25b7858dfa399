"""ModelArchitecture: a model family built from core layers, registered by HF architecture name."""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Any, Iterable

import torch

from ironlm.interfaces.attention import AttentionBackend, AttentionLayerSpec
from ironlm.interfaces.platform import LayerOps
from ironlm.interfaces.quantization import QuantizationMethod


@dataclass
class ModelContext:
    """What a model needs from the engine to build its layers."""

    attention: AttentionBackend
    layer_ops: LayerOps
    quantization: QuantizationMethod
    dtype: torch.dtype
    device: torch.device
    tp_rank: int = 0
    tp_size: int = 1
    tp_group: Any = None  # torch.distributed process group when tp_size > 1


class ModelArchitecture(torch.nn.Module, ABC):
    """Registered through ``register_models`` as ``register("LlamaForCausalLM", Class)``.

    Constructed as ``Class(hf_config, ctx)`` on the target device (weights uninitialised), then
    ``load_weights`` receives the checkpoint's tensors under their HF names.
    """

    @abstractmethod
    def attention_layers(self) -> list[AttentionLayerSpec]:
        """One spec per attention layer, in layer order (sizes the KV cache)."""

    @abstractmethod
    def forward(
        self,
        input_ids: torch.Tensor,  # (num_tokens,) int64, the flattened batch
        positions: torch.Tensor,  # (num_tokens,) int64
        kv_caches: list[torch.Tensor],  # one per attention layer
        attn_metadata: Any,  # the backend's build_metadata result
    ) -> torch.Tensor:  # (num_tokens, hidden_size) final hidden states (after the last norm)
        ...

    @abstractmethod
    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """(num_rows, hidden_size) -> (num_rows, vocab_size) float32 logits."""

    @abstractmethod
    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
        """Consume (HF name, tensor) pairs; raise ValueError for a missing or unexpected one."""
