"""Sequence classifiers: HF's ``*ForSequenceClassification`` over a decoder-only stack (vLLM's
classify task).

The checkpoint is the causal LM's ``model.*`` and a ``score.weight`` of (num_labels,
hidden_size) with no bias, in place of the LM head. As HF's, the class logits are the head
applied to the final hidden state (after the last norm) of the prompt's last token; the engine
hands ``classify`` that row only. The head is small (a few labels), so every tensor-parallel
rank holds all of it, on the last pipeline stage, unquantized, and computes in float32.
"""

from __future__ import annotations

from typing import Any

import torch

from ironlm.interfaces.model import ModelContext
from ironlm.models.decoder import StageDecoder, StageModel

SCORE_NAME = "score.weight"


def num_labels_of(hf_config: Any) -> int:
    """The classes the head scores: HF's ``num_labels`` (the length of ``id2label``)."""
    labels = int(getattr(hf_config, "num_labels", 0) or 0)
    if labels < 1:
        raise ValueError("a sequence classifier's config needs num_labels >= 1 (or id2label)")
    return labels


class ClassifierHead(torch.nn.Module):
    """(rows, hidden_size) -> (rows, num_labels) float32: ``x @ weight.T``, HF's ``score``."""

    def __init__(self, hidden_size: int, num_labels: int, ctx: ModelContext) -> None:
        super().__init__()
        self.weight = torch.nn.Parameter(
            torch.empty(num_labels, hidden_size, dtype=ctx.dtype, device=ctx.device),
            requires_grad=False,
        )

    def load_weight(self, name: str, loaded: torch.Tensor, shard_id: str | int | None) -> None:
        if name != "weight" or shard_id is not None:
            raise ValueError(f"the classifier head has no tensor {name!r} (a bias-free score)")
        if tuple(loaded.shape) != tuple(self.weight.shape):
            raise ValueError(f"shape {tuple(loaded.shape)} does not fit the head's "
                             f"{tuple(self.weight.shape)} (num_labels, hidden_size)")
        self.weight.data.copy_(loaded.to(self.weight.dtype))

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.linear(hidden.float(), self.weight.float())


class StageSequenceClassifier(StageModel):
    """A family's decoder stack with HF's ``score`` head on the last stage."""

    classifies = True

    def __init__(self, hf_config: Any, ctx: ModelContext, model: StageDecoder) -> None:
        super().__init__(hf_config, model, tied=False)
        self.num_labels = num_labels_of(hf_config)
        self.score: ClassifierHead | None = (
            ClassifierHead(hf_config.hidden_size, self.num_labels, ctx) if model.is_last else None
        )

    def skip_weight(self, name: str) -> bool:
        return super().skip_weight(name) or (name == SCORE_NAME and self.score is None)

    def classify(self, hidden: torch.Tensor) -> torch.Tensor:
        assert self.score is not None, "only the last pipeline stage classifies"
        return self.score(hidden)  # (rows, num_labels) float32

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        raise ValueError(f"{type(self).__name__} is a sequence classifier: it has no LM head "
                         "and does not generate")
