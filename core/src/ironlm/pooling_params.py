"""vLLM's ``PoolingParams``, the part an embedding model takes.

The pooled vector is the mean of the prompt's last hidden states (the model's own hidden size).
vLLM's Matryoshka ``dimensions`` and a classifier's ``use_activation`` have nothing to act on
here: given, they are refused rather than ignored.
"""

from __future__ import annotations

from dataclasses import dataclass

from ironlm.sampling_params import check_truncate_value


@dataclass
class PoolingParams:
    truncate_prompt_tokens: int | None = None  # keep the last N tokens (-1: the context)
    normalize: bool | None = None  # scale each embedding to unit L2 length (default: no)
    dimensions: int | None = None  # refused: embeddings have the model's hidden size
    use_activation: bool | None = None  # refused: no classification head

    def __post_init__(self) -> None:
        check_truncate_value(self.truncate_prompt_tokens)
        if self.dimensions is not None:
            raise ValueError("dimensions is not supported: embeddings have the model's hidden "
                             "size (no Matryoshka representation)")
        if self.use_activation is not None:
            raise ValueError("use_activation applies to a classification head; this model "
                             "pools hidden states")
