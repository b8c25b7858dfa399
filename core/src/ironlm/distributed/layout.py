"""ParallelLayout: where each global rank sits in the tensor x pipeline grid.

Ranks are laid out stage by stage: rank = pp_rank * tp_size + tp_rank, so the ranks of one
pipeline stage form one tensor-parallel group and consecutive stages hand activations from
rank r to rank r + tp_size. The rank that samples is the first of the last stage.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class ParallelLayout:
    tp_size: int  # tensor_parallel_size: ranks that split every layer
    pp_size: int  # pipeline_parallel_size: stages that split the layers

    @property
    def world_size(self) -> int:
        return self.tp_size * self.pp_size

    def tp_rank(self, rank: int) -> int:
        return rank % self.tp_size

    def pp_rank(self, rank: int) -> int:
        return rank // self.tp_size

    def tp_groups(self) -> list[list[int]]:
        """The ranks of each stage (one tensor-parallel group per stage), in stage order."""
        return [list(range(p * self.tp_size, (p + 1) * self.tp_size)) for p in range(self.pp_size)]

    def next_stage_rank(self, rank: int) -> int | None:
        """Where ``rank`` sends its activations (None on the last stage)."""
        return rank + self.tp_size if self.pp_rank(rank) < self.pp_size - 1 else None

    def prev_stage_rank(self, rank: int) -> int | None:
        """Where ``rank`` receives its activations from (None on the first stage)."""
        return rank - self.tp_size if self.pp_rank(rank) > 0 else None

    @property
    def sampling_rank(self) -> int:
        """The first tensor-parallel rank of the last stage: its output goes to the engine."""
        return (self.pp_size - 1) * self.tp_size


def stage_layers(num_layers: int, pp_rank: int, pp_size: int) -> range:
    """Decoder layers of stage ``pp_rank``: contiguous, as even as possible, earlier stages
    taking one more when ``num_layers`` does not divide."""
    base, extra = divmod(num_layers, pp_size)
    start = pp_rank * base + min(pp_rank, extra)
    return range(start, start + base + (1 if pp_rank < extra else 0))


def check_model_fits(hf_config: Any, tp_size: int, pp_size: int) -> None:
    """ValueError, naming both numbers, when the model cannot be split this way: attention
    heads, KV heads (split, or replicated when fewer than the ranks) and the vocabulary over
    ``tp_size``; the decoder layers over ``pp_size``."""
    heads = int(hf_config.num_attention_heads)
    if heads % tp_size:
        raise ValueError(
            f"the model's {heads} attention heads are not divisible by "
            f"tensor_parallel_size {tp_size}"
        )
    kv_heads = int(getattr(hf_config, "num_key_value_heads", None) or heads)
    if (kv_heads >= tp_size and kv_heads % tp_size) or (kv_heads < tp_size and tp_size % kv_heads):
        raise ValueError(
            f"the model's {kv_heads} key/value heads cannot be split over (nor replicated "
            f"across) tensor_parallel_size {tp_size}"
        )
    vocab = int(hf_config.vocab_size)
    if vocab % tp_size:
        raise ValueError(
            f"the model's vocabulary of {vocab} tokens is not divisible by "
            f"tensor_parallel_size {tp_size}"
        )
    layers = int(hf_config.num_hidden_layers)
    if pp_size > layers:
        raise ValueError(
            f"pipeline_parallel_size {pp_size} is larger than the model's {layers} layers"
        )
