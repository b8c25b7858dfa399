"""Token embedding and LM head, vocabulary-parallel.

Each rank holds a contiguous slice of the vocabulary rows (the vocabulary must divide by the
tensor-parallel size). The embedding looks up the ids in its
slice (zeros elsewhere) and all-reduces; the LM head computes its slice of the logits and
all-gathers them. With tp_size 1 both are the plain operations. Tied embeddings share one
parameter between the two.
"""

from __future__ import annotations

import torch

from ironlm.interfaces.model import ModelContext
from ironlm.layers.linear import divide


class VocabParallelEmbedding(torch.nn.Module):
    """(num_tokens,) ids -> (num_tokens, hidden_size) rows of ``weight``."""

    def __init__(
        self, vocab_size: int, hidden_size: int, ctx: ModelContext, allocate: bool = True
    ) -> None:
        super().__init__()
        self.vocab_size = vocab_size
        self.hidden_size = hidden_size
        self.tp_size = ctx.tp_size
        self.tp_group = ctx.tp_group
        self.layer_ops = ctx.layer_ops
        self.rows_per_rank = divide(vocab_size, ctx.tp_size, "vocabulary size")
        self.vocab_start = ctx.tp_rank * self.rows_per_rank
        if allocate:
            self.weight = torch.nn.Parameter(
                torch.empty(self.rows_per_rank, hidden_size, dtype=ctx.dtype), requires_grad=False
            )

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        if self.tp_size == 1:
            return self.layer_ops.embedding(input_ids, self.weight)
        local = input_ids - self.vocab_start
        in_range = (local >= 0) & (local < self.rows_per_rank)
        out = self.layer_ops.embedding(local.clamp(0, self.rows_per_rank - 1), self.weight)
        out = out * in_range.unsqueeze(-1).to(out.dtype)  # (num_tokens, hidden) zeros off-slice
        return self.tp_group.all_reduce(out)

    def load_weight(
        self, name: str, loaded: torch.Tensor, shard_id: str | int | None = None
    ) -> None:
        if name != "weight" or shard_id is not None:
            raise ValueError(f"{type(self).__name__} has only 'weight'; got {name!r}")
        if loaded.shape != (self.vocab_size, self.hidden_size):
            raise ValueError(
                f"embedding: checkpoint shape {tuple(loaded.shape)} != "
                f"({self.vocab_size}, {self.hidden_size})"
            )
        rows = loaded[self.vocab_start : self.vocab_start + self.rows_per_rank]
        with torch.no_grad():
            self.weight.copy_(rows)

    def extra_repr(self) -> str:
        return f"{self.vocab_size}, {self.hidden_size}, tp_size={self.tp_size}"


class ParallelLMHead(VocabParallelEmbedding):
    """Hidden states -> float32 logits over the full vocabulary. ``tie_to`` shares the
    embedding's weight (no parameter of its own)."""

    def __init__(
        self,
        vocab_size: int,
        hidden_size: int,
        ctx: ModelContext,
        tie_to: VocabParallelEmbedding | None = None,
    ) -> None:
        super().__init__(vocab_size, hidden_size, ctx, allocate=tie_to is None)
        if tie_to is not None:
            self.weight = tie_to.weight
        self.tied_to = tie_to
        self.tied = tie_to is not None

    def process_weights_after_loading(self) -> None:
        """Lay the weight out for the platform's matmul; a tied embedding shares the result
        (its lookups go through ``layer_ops.embedding``, which reads that layout)."""
        packed = torch.nn.Parameter(
            self.layer_ops.pack_linear_weight(self.weight.data), requires_grad=False
        )
        self.weight = packed
        if self.tied_to is not None:
            self.tied_to.weight = packed

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        # (num_rows, hidden) -> (num_rows, vocab_size) float32
        logits = self.layer_ops.linear(hidden, self.weight, None)  # (num_rows, rows_per_rank)
        if self.tp_size > 1:
            logits = self.tp_group.all_gather(logits)  # (num_rows, vocab_size), rank order
        return logits.float()
