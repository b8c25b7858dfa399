"""What the engine knows of a sequence classifier (vLLM's classify task): its labels, the
activations its class logits go through, and what it refuses.

A classifier (``ModelArchitecture.classifies``: HF's ``*ForSequenceClassification``) pools
every request: the runner hands the head the prompt's last row (every row, for vLLM's
token_classify task) and returns the class logits;
the front ends turn them into the task's output here, as vLLM's classifier poolers do:
- classify: by the config's ``problem_type`` (HF's training loss): "regression" the logits as
  they are, "multi_label_classification" a sigmoid per label, otherwise a softmax over two or
  more labels and a sigmoid of a single one;
- score (a cross-encoder's pair): the activation a sentence-transformers cross-encoder
  config names (``sentence_transformers.activation_fn`` or
  ``sbert_ce_default_activation_function``), otherwise as classify's default.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from ironlm.interfaces.model import ModelArchitecture
from ironlm.models.classifier import num_labels_of

# activation name -> what it does to a (num_labels,) float32 row; other names are torch.nn
# module classes a sentence-transformers config named (``_cross_encoder_activation``)
_ACTIVATIONS = {
    "identity": lambda x: x,
    "sigmoid": torch.sigmoid,
    "softmax": lambda x: torch.softmax(x, dim=-1),
}


@dataclass(frozen=True)
class Classifier:
    architecture: str  # the HF name it was loaded as, for messages
    labels: tuple[str, ...]  # id2label, in index order
    classify_activation: str = "softmax"  # a key of _ACTIVATIONS
    score_activation: str = "softmax"

    @property
    def num_labels(self) -> int:
        return len(self.labels)

    def activate(self, logits: torch.Tensor, task: str = "classify") -> torch.Tensor:
        """([num_tokens,] num_labels) class logits -> the ``task``'s output ("classify" or
        "score"), over the last dimension."""
        name = self.classify_activation if task == "classify" else self.score_activation
        fn = _ACTIVATIONS.get(name) or getattr(torch.nn, name)()
        return fn(logits.float())

    def refuse_generation(self) -> ValueError:
        return ValueError(
            f"this model ({self.architecture}) is a sequence classifier: it classifies and "
            "scores (LLM.classify, LLM.score, /classify), it does not generate text"
        )


def classifier_of(
    model_cls: type[ModelArchitecture], architectures: list[str], hf_config: Any,
    speculative: bool,
) -> Classifier | None:  # fmt: skip
    """None for a generative model. A classifier's labels and activations from its config;
    ValueError for what it cannot run with (speculative decoding: nothing is generated)."""
    if not model_cls.classifies:
        return None
    name = next((a for a in architectures if a.endswith("ForSequenceClassification")),
                architectures[0])
    if speculative:
        raise ValueError(f"speculative decoding needs a generative model; {name} is a "
                         "sequence classifier")
    count = num_labels_of(hf_config)
    id2label = {int(k): str(v) for k, v in (getattr(hf_config, "id2label", None) or {}).items()}
    default = "softmax" if count >= 2 else "sigmoid"
    problem = getattr(hf_config, "problem_type", None)
    classify = {"regression": "identity", "multi_label_classification": "sigmoid"}.get(
        problem or "", default)
    return Classifier(name, tuple(id2label.get(i, f"LABEL_{i}") for i in range(count)),
                      classify, _cross_encoder_activation(hf_config) or default)


def _cross_encoder_activation(hf_config: Any) -> str | None:
    """The activation a sentence-transformers cross-encoder config names (a torch.nn module
    class, built without arguments, as vLLM builds it), or None."""
    st = getattr(hf_config, "sentence_transformers", None)
    named = st.get("activation_fn") if isinstance(st, dict) else None
    named = named or getattr(hf_config, "sbert_ce_default_activation_function", None)
    if not named:
        return None
    module, _, cls = str(named).rpartition(".")
    found = getattr(torch.nn, cls, None) if module.startswith("torch.nn.modules") else None
    if not (isinstance(found, type) and issubclass(found, torch.nn.Module)):
        raise ValueError(f"the config's cross-encoder activation {named!r} is not a "
                         "torch.nn.modules class")
    try:
        found()
    except TypeError as exc:
        raise ValueError(f"the config's cross-encoder activation {named!r} cannot be built "
                         f"without arguments: {exc}") from None
    return {"Identity": "identity", "Sigmoid": "sigmoid"}.get(cls, cls)
