"""Token embedding and LM head, vocabulary-parallel.

Each rank holds a contiguous slice of the vocabulary rows (the vocabulary must divide by the
tensor-parallel size). The embedding looks up the ids in its
slice (zeros elsewhere) and all-reduces; the LM head computes its slice of the logits and
all-gathers them. With tp_size 1 both are the plain operations. Tied embeddings share one
parameter between the two.

Quantized tables replace the float storage of the same parameter (so a tied head shares them):
- a GGUF file's token embedding and its tied or separate output matrix, in a kept block type:
  the checkpoint announces ``qweight_type`` (0-dim GGMLQuantizationType), then ``weight``
  arrives as uint8 block rows (vocab, row bytes);
- an int8 table (``ironlm quantize --quant-type weight_only_int8 --quantize-lm-head``):
  ``weight`` int8 (vocab, hidden) and ``weight_scale`` (vocab,) float32, W = weight * scale.
Lookups then go through the platform's ``quantized_embedding`` and the head through
``quantized_linear`` on one packed copy.
"""

from __future__ import annotations

from typing import Any

import torch

from ironlm.interfaces.model import ModelContext
from ironlm.interfaces.platform import scaled_rows
from ironlm.interfaces.quant import GGUF, INT8, QuantLayout
from ironlm.layers.linear import divide


class VocabParallelEmbedding(torch.nn.Module):
    """(num_tokens,) ids -> (num_tokens, hidden_size) rows of ``weight``."""

    def __init__(
        self, vocab_size: int, hidden_size: int, ctx: ModelContext, allocate: bool = True,
        scale: float | None = None,
    ) -> None:  # fmt: skip
        super().__init__()
        self.scale = scale  # rows times this, in the model dtype (Gemma: sqrt(hidden_size))
        self.vocab_size = vocab_size
        self.hidden_size = hidden_size
        self.tp_size = ctx.tp_size
        self.tp_group = ctx.tp_group
        self.layer_ops = ctx.layer_ops
        self.dtype = ctx.dtype
        self.rows_per_rank = divide(vocab_size, ctx.tp_size, "vocabulary size")
        self.vocab_start = ctx.tp_rank * self.rows_per_rank
        self.quant_layout: QuantLayout | None = None  # set when the table arrives quantized
        self.quant_packed: dict[str, torch.Tensor] | None = None  # pack_quantized's result
        self._pending_type: int | None = None  # qweight_type announced for the next weight
        self.weight_scale: torch.Tensor | None = None  # (rows_per_rank,) of an int8 table
        if allocate:
            self.weight = torch.nn.Parameter(
                torch.empty(self.rows_per_rank, hidden_size, dtype=ctx.dtype), requires_grad=False
            )

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        if self.tp_size == 1:
            return self._lookup(input_ids)
        local = input_ids - self.vocab_start
        in_range = (local >= 0) & (local < self.rows_per_rank)
        out = self._lookup(local.clamp(0, self.rows_per_rank - 1))
        out = out * in_range.unsqueeze(-1).to(out.dtype)  # (num_tokens, hidden) zeros off-slice
        return self.tp_group.all_reduce(out)

    def _lookup(self, ids: torch.Tensor) -> torch.Tensor:
        if self.quant_layout is None:
            return self.layer_ops.embedding(ids, self.weight, self.scale)
        assert self.quant_packed is not None
        rows = self.layer_ops.quantized_embedding(self.quant_layout, ids, self.quant_packed)
        return scaled_rows(rows.to(self.dtype), self.scale)

    def load_weight(
        self, name: str, loaded: torch.Tensor, shard_id: str | int | None = None
    ) -> None:
        if shard_id is not None or name not in ("weight", "qweight_type", "weight_scale"):
            raise ValueError(f"{type(self).__name__} has only 'weight'; got {name!r}")
        if name == "qweight_type":
            self._pending_type = int(loaded.reshape(()).item())
            return
        if name == "weight_scale":  # an int8 table's per-row scales
            if loaded.shape != (self.vocab_size,):
                raise ValueError(
                    f"embedding: weight_scale shape {tuple(loaded.shape)} != ({self.vocab_size},)"
                )
            rows = loaded[self.vocab_start : self.vocab_start + self.rows_per_rank]
            self.weight_scale = rows.float().contiguous()
            return
        quantized = loaded.dtype in (torch.uint8, torch.int8)
        if loaded.dtype == torch.uint8 and self._pending_type is None:
            raise ValueError(f"{type(self).__name__}: uint8 rows came without a qweight_type")
        if loaded.shape[0] != self.vocab_size or (
            not quantized and loaded.shape != (self.vocab_size, self.hidden_size)
        ):
            raise ValueError(
                f"embedding: checkpoint shape {tuple(loaded.shape)} != "
                f"({self.vocab_size}, {self.hidden_size})"
            )
        rows = loaded[self.vocab_start : self.vocab_start + self.rows_per_rank]
        with torch.no_grad():
            if quantized:
                # the same parameter, now this rank's block (GGUF) or int8 rows
                self.weight.data = rows.contiguous().to(self.weight.device)
                self.quant_layout = (
                    QuantLayout(INT8) if loaded.dtype == torch.int8
                    else QuantLayout(GGUF, ggml_type=self._pending_type)
                )  # fmt: skip
                self._pending_type = None
                return
            self.weight.copy_(rows)

    def process_weights_after_loading(self) -> None:
        """Pack a quantized table once for the platform's kernels (a float table is looked
        up as loaded)."""
        if self.quant_layout is not None:
            rows = self.weight.data
            tensors = {"qweight": rows}
            if self.quant_layout.kind == INT8:
                if self.weight_scale is None:
                    raise ValueError(f"{type(self).__name__}: int8 rows came without weight_scale")
                tensors["scale"] = self.weight_scale.to(rows.device)
            self.quant_packed = self.layer_ops.pack_quantized(self.quant_layout, tensors)
            # the packed copy is the table now (the parameter stays, empty, for tying)
            self.weight.data = rows.new_empty(0)

    def unpack_weights(self) -> Any:
        """Weight updates after loading: a float table is looked up as loaded (nothing to
        undo; a table tied to an LM head is unpacked through the head). A quantized table's
        packing is not undone: ValueError."""
        self._check_updatable()
        return None

    def repack_weights(self, kept: Any) -> None:
        """Nothing to redo for a float table."""

    def _check_updatable(self) -> None:
        if self.quant_layout is not None:
            raise ValueError(
                f"{type(self).__name__}: a quantized ({self.quant_layout.kind}) table cannot "
                "take new weights after loading; weight updates need an unquantized model"
            )

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
        (its lookups go through ``layer_ops.embedding``, which reads that layout). A quantized
        table is packed once and shared the same way."""
        source = self.tied_to if self.tied_to is not None else self
        if source.quant_layout is not None:
            if source.quant_packed is None:  # the embedding packs first when it comes first
                VocabParallelEmbedding.process_weights_after_loading(source)
            self.quant_layout, self.quant_packed = source.quant_layout, source.quant_packed
            return
        pack = (self.layer_ops.pack_tied_weight if self.tied_to is not None
                else self.layer_ops.pack_linear_weight)  # fmt: skip
        packed = torch.nn.Parameter(pack(self.weight.data), requires_grad=False)
        self.weight = packed
        if self.tied_to is not None:
            self.tied_to.weight = packed

    def unpack_weights(self) -> torch.nn.Parameter:
        """The (vocab, hidden) rows back from the platform's layout, as the parameter of the
        head and of the embedding it is tied to; returns the packed parameter."""
        self._check_updatable()  # a tied head holds its table's layout
        stored = self.weight
        self._share(torch.nn.Parameter(self.layer_ops.unpack_linear_weight(stored.data),
                                       requires_grad=False))
        return stored

    def repack_weights(self, kept: torch.nn.Parameter) -> None:
        self.layer_ops.repack_linear_weight(kept.data, self.weight.data)
        self._share(kept)

    def _share(self, weight: torch.nn.Parameter) -> None:
        self.weight = weight
        if self.tied_to is not None:
            self.tied_to.weight = weight

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        # (num_rows, hidden) -> (num_rows, vocab_size) float32
        if self.quant_layout is None:
            logits = self.layer_ops.lm_head(hidden, self.weight)  # (rows, rows_per_rank) f32
        else:
            assert self.quant_packed is not None
            logits = self.layer_ops.quantized_linear(
                self.quant_layout, hidden, self.quant_packed, None
            )
        if self.tp_size > 1:
            logits = self.tp_group.all_gather(logits)  # (num_rows, vocab_size), rank order
        return logits.float()
