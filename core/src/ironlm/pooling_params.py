"""vLLM's ``PoolingParams``: the parts an embedding model and a sequence classifier take.

An embedding is the mean of the prompt's last hidden states (the model's own hidden size);
a classifier's output is its head's class logits, through its activation unless
``use_activation`` is False. vLLM's Matryoshka ``dimensions`` has nothing to act on here:
given, it is refused rather than ignored; so are the fields of the other task (the front end
checks them against the model's task).
"""

from __future__ import annotations

from dataclasses import dataclass

from ironlm.sampling_params import check_truncate_value


@dataclass
class PoolingParams:
    truncate_prompt_tokens: int | None = None  # keep the last N tokens (-1: the context)
    # embed / token_embed: scale each embedding (each token's) to unit L2 length (default: no)
    normalize: bool | None = None
    dimensions: int | None = None  # refused: embeddings have the model's hidden size
    use_activation: bool | None = None  # classify / score: softmax or sigmoid (default: yes)

    def __post_init__(self) -> None:
        check_truncate_value(self.truncate_prompt_tokens)
        if self.dimensions is not None:
            raise ValueError("dimensions is not supported: embeddings have the model's hidden "
                             "size (no Matryoshka representation)")

    def check_task(self, task: str) -> None:
        """ValueError naming the field that the pooling ``task`` does not take."""
        embeds = task in ("embed", "token_embed")
        if embeds and self.use_activation is not None:
            raise ValueError("use_activation applies to a classification head; this model "
                             "pools hidden states")
        if not embeds and self.normalize is not None:
            raise ValueError(f"normalize applies to embeddings, not to the {task!r} task of a "
                             "sequence classifier")
