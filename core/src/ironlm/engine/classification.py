"""What the engine knows of a sequence classifier (vLLM's classify task): its labels, the
activation its class logits go through, and what it refuses.

A classifier (``ModelArchitecture.classifies``: HF's ``*ForSequenceClassification``) pools
every request: the runner hands the head the prompt's last row and returns the class logits;
the front ends turn them into probabilities here, as vLLM's classify pooler does: a softmax
over two or more labels, a sigmoid of a single one (a cross-encoder's score)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from ironlm.interfaces.model import ModelArchitecture
from ironlm.models.classifier import num_labels_of


@dataclass(frozen=True)
class Classifier:
    architecture: str  # the HF name it was loaded as, for messages
    labels: tuple[str, ...]  # id2label, in index order

    @property
    def num_labels(self) -> int:
        return len(self.labels)

    def activate(self, logits: torch.Tensor) -> torch.Tensor:
        """(num_labels,) class logits -> probabilities (vLLM's classify activation)."""
        logits = logits.float()
        return torch.sigmoid(logits) if self.num_labels < 2 else torch.softmax(logits, dim=-1)

    def refuse_generation(self) -> ValueError:
        return ValueError(
            f"this model ({self.architecture}) is a sequence classifier: it classifies and "
            "scores (LLM.classify, LLM.score, /classify), it does not generate text"
        )


def classifier_of(
    model_cls: type[ModelArchitecture], architectures: list[str], hf_config: Any,
    speculative: bool,
) -> Classifier | None:  # fmt: skip
    """None for a generative model. A classifier's labels from its config; ValueError for
    what it cannot run with (speculative decoding: nothing is generated)."""
    if not model_cls.classifies:
        return None
    name = next((a for a in architectures if a.endswith("ForSequenceClassification")),
                architectures[0])
    if speculative:
        raise ValueError(f"speculative decoding needs a generative model; {name} is a "
                         "sequence classifier")
    count = num_labels_of(hf_config)
    id2label = {int(k): str(v) for k, v in (getattr(hf_config, "id2label", None) or {}).items()}
    return Classifier(name, tuple(id2label.get(i, f"LABEL_{i}") for i in range(count)))
