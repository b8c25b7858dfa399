"""ModelArchitecture: a model family built from core layers, registered by HF architecture name."""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Any, ClassVar, Iterable

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
    # The tensor-parallel group when tp_size > 1 (the core's ``ParallelGroup``): the layers
    # call ``tp_group.all_reduce(x)`` (in place) and ``tp_group.all_gather(x)`` (last dim).
    tp_group: Any = None
    pp_rank: int = 0  # pipeline stage of this rank
    pp_size: int = 1  # pipeline stages; a model builds only the layers of its stage

    @property
    def is_first_stage(self) -> bool:
        return self.pp_rank == 0

    @property
    def is_last_stage(self) -> bool:
        return self.pp_rank == self.pp_size - 1


WEIGHTS_ASLEEP = ("the weights are asleep (sleep mode): wake_up(tags=['weights']) before "
                  "loading or reading them")


class ModelArchitecture(torch.nn.Module, ABC):
    """Registered through ``register_models`` as ``register("LlamaForCausalLM", Class)``.

    Constructed as ``Class(hf_config, ctx)`` on the target device (weights uninitialised), then
    ``load_weights`` receives the checkpoint's tensors under their HF names (all of them: a
    tensor-parallel rank slices its shard, a pipeline stage skips what other stages hold).

    Pipeline parallelism (``ctx.pp_size > 1``): the model builds the layers of stage
    ``ctx.pp_rank`` only. The first stage embeds ``input_ids``; every later stage receives the
    previous stage's ``pipeline_tensors`` as ``intermediate`` instead. Every stage but the last
    returns its ``pipeline_tensors`` (each (num_tokens, hidden_size) in the model dtype) for the
    next stage; the last returns the final hidden states and alone computes logits.
    """

    pipeline_tensors: ClassVar[tuple[str, ...]] = ("hidden", "residual")
    # Whether ``forward`` takes ``inputs_embeds`` and the model has ``embed_input_ids``
    # (contract 1.3; vLLM's prompt_embeds): the engine refuses enable_prompt_embeds otherwise
    supports_prompt_embeds: ClassVar[bool] = False
    # A sequence classifier (contract 1.4; HF ``*ForSequenceClassification``, vLLM's classify
    # task): the engine pools its requests through ``classify`` and refuses to generate
    classifies: ClassVar[bool] = False
    # set by the loader once the layers processed their weights for the kernels; from then
    # on ``load_weights`` updates weights in place (any subset of names: RL weight sync)
    weights_processed: bool = False
    # set by the worker while sleep mode has freed the weights (empty storages): nothing may
    # read or load them until they wake
    weights_asleep: bool = False

    @abstractmethod
    def attention_layers(self) -> list[AttentionLayerSpec]:
        """One spec per attention layer of this rank's stage, in layer order (sizes the KV
        cache; ``kv_caches`` in ``forward`` follows this order)."""

    @abstractmethod
    def forward(
        self,
        input_ids: torch.Tensor,  # (num_tokens,) int64, the flattened batch
        positions: torch.Tensor,  # (num_tokens,) int64
        kv_caches: list[torch.Tensor],  # one per attention layer of this stage
        attn_metadata: Any,  # the backend's build_metadata result
        intermediate: dict[str, torch.Tensor] | None = None,  # from the previous stage
        inputs_embeds: torch.Tensor | None = None,  # (num_tokens, hidden_size): see below
    ) -> torch.Tensor | dict[str, torch.Tensor]:
        """Last stage: (num_tokens, hidden_size) final hidden states (after the last norm).
        Other stages: ``{name: (num_tokens, hidden_size)}`` for each of ``pipeline_tensors``.
        ``inputs_embeds`` (passed to the first stage only, and only to a model that declares
        ``supports_prompt_embeds``): the rows to run instead of embedding ``input_ids``."""

    def embed_input_ids(self, input_ids: torch.Tensor) -> torch.Tensor:
        """(num_tokens,) -> (num_tokens, hidden_size) in the model dtype: what the first stage
        runs for these ids (any embedding scale applied), the rows ``inputs_embeds`` replaces.
        Needed with ``supports_prompt_embeds``."""
        raise NotImplementedError(f"{type(self).__name__} does not embed ids on their own "
                                  "(supports_prompt_embeds is False)")

    @abstractmethod
    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """(num_rows, hidden_size) -> (num_rows, vocab_size) float32 logits."""

    def classify(self, hidden: torch.Tensor) -> torch.Tensor:
        """(num_rows, hidden_size) final hidden states -> (num_rows, num_labels) float32
        logits of the classification head, before any activation (last stage only). Needed
        with ``classifies``; the engine passes each prompt's last row (every row of a
        token_classify request)."""
        raise NotImplementedError(f"{type(self).__name__} has no classification head "
                                  "(classifies is False)")

    @abstractmethod
    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
        """Consume (HF name, tensor) pairs; raise ValueError for a missing or unexpected one.
        Once ``weights_processed``: update the named weights in place (a subset is fine;
        ``ironlm.layers.weight_update``)."""
